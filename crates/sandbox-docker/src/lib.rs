#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod checkpoint;
mod config;
mod engine;
mod error;
mod policy;

pub use backend::{DockerBackend, DockerNative, DockerSandbox};
pub use config::{
    DEFAULT_ENDPOINT, DEFAULT_TEMPLATE, DOCKER_CERT_PATH_ENV, DOCKER_TLS_VERIFY_ENV, DockerConfig,
    DockerOptions, ENDPOINT_ENV, HookEvent, HookFn, Hooks, Mount, MountMode, Sharing, TEST_IMAGES,
    Transport,
};
pub use engine::DockerEngine;
pub use policy::CAPABILITIES;
pub use sandbox_container::egress::recorded_policy;
pub use sandbox_container::endpoint::discovery::{EndpointSource, EnvSnapshot};
pub use sandbox_container::{RUNSC_PIDS_HEADROOM, Runtime};
