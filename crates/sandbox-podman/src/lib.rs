#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod config;
mod conmon;
mod engine;
mod error;
mod policy;
mod rest;

pub use backend::{PodmanBackend, PodmanNative, PodmanSandbox};
pub use config::{
    ANNOTATION_ALLOWLIST, CDI_SPEC_DIRS, DEFAULT_CALL_TIMEOUT, DEFAULT_ENDPOINT, DEFAULT_TEMPLATE,
    ENDPOINT_ENV, ENGINE_PATHS, GRANTABLE_CAPABILITIES, HookEvent, HookFn, Hooks, LinuxCapability,
    Mount, MountMode, NEVER_GRANTABLE, PodmanConfig, PodmanOptions, REFUSED_HOST_PATHS, Sharing,
};
pub use engine::PodmanEngine;
pub use policy::CAPABILITIES;
pub use sandbox_container::Runtime;
pub use sandbox_container::egress::recorded_policy;
pub use sandbox_container::endpoint::discovery::{EndpointSource, EnvSnapshot};
