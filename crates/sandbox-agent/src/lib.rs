#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

#[cfg(target_os = "linux")]
pub mod agent;
#[cfg(feature = "client")]
pub mod client;
pub mod protocol;
