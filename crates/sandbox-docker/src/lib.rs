#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod code;
mod config;
mod error;
mod exec;
mod files;
mod ingress;
mod policy;
mod sandbox;

pub use backend::DockerBackend;
pub use config::{
    DEFAULT_DOCKER_HOST, DEFAULT_TEMPLATE, DOCKER_HOST_ENV, DockerConfig, RUNSC_PIDS_HEADROOM,
    Runtime,
};
pub use sandbox::{DockerNative, DockerSandbox};
