#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod contract;
pub mod egress_lab;
pub mod engine_cli;
pub mod fault_proxy;
pub mod registry;
pub mod skip;
pub mod sshd;
pub mod tagged;
pub mod trial_engine;
pub mod trials;
pub mod wedged;

pub use fault_proxy::{Fault, FaultProxy};
pub use tagged::{managed_ids, test_options};
pub use trial_engine::TrialEngine;
