#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod config;
mod error;
mod exec;
mod files;
mod ingress;
mod interpreter;
mod policy;
mod rest;
mod sandbox;
mod tar_stream;

pub use backend::PodmanBackend;
pub use config::{
    ANNOTATION_ALLOWLIST, CDI_SPEC_DIRS, CONTAINER_HOST_ENV, DEFAULT_ENDPOINT, DEFAULT_TEMPLATE,
    GRANTABLE_CAPABILITIES, HookEvent, HookFn, Hooks, Mount, MountMode, NEVER_GRANTABLE,
    PodmanConfig, PodmanOptions, PodmanRuntime, Sharing,
};
pub use sandbox::{PodmanNative, PodmanSandbox};
