#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod credentials;
pub mod egress;
pub mod endpoint;
pub mod engine;
mod error;
mod files;
mod forward;
mod git_gate;
pub mod image;
pub mod provision;
mod sandbox;
mod settings;
pub mod snapshot;
pub mod spec;
mod ssh_agent;
#[cfg(test)]
mod test_events;
pub mod time;

pub use engine::{
    ArchiveBody, AttachStream, ContainerEngine, ContainerInfo, ContainerSpec, EngineError,
    EngineErrorKind, EngineFacts, EngineResult, ExecInput, ExecRequest, ExecState, ExecStream,
    NetworkMode, PathStat,
};
pub use files::{LS_SCRIPT, MKDIR_SCRIPT, REMOVE_SCRIPT};
pub use image::{
    CredentialStore, ImageRef, PullProgress, PullProgressHook, PullRequest, RegistryAuth,
};
pub use provision::backend::{ContainerBackend, LAYER_CAPABILITIES};
pub use provision::config::{
    ContainerConfig, DEFAULT_CALL_TIMEOUT, DEFAULT_CREATE_TIMEOUT, DEFAULT_DOWNLOAD_CAP,
    DEFAULT_DOWNLOAD_ENTRIES, DEFAULT_MAX_CONTEXTS, DEFAULT_MAX_INGRESS_CONNECTIONS,
    DEFAULT_READ_CAP, NAME_PREFIX, SWEEP_PAST_DEADLINE,
};
pub use provision::expiry::{
    DEADLINE_GRACE, DEFAULT_SWEEP_INTERVAL, LABEL_RETAINED, MIN_SWEEP_INTERVAL,
};
pub use sandbox::agent::{AGENT_ENV, AGENT_PATH, agent_enabled_in};
pub use sandbox::exec::EXEC_TOKEN_ENV;
pub use sandbox::interpreter::DRIVER;
pub use sandbox::kill::KILL_SCRIPT;
pub use sandbox::restart::LABEL_EGRESS;
pub use sandbox::{ContainerNative, ContainerSandbox, ExecPath};
pub use spec::linux_capability::{GRANTABLE_CAPABILITIES, LinuxCapability, NEVER_GRANTABLE};
pub use spec::runtime::{LABEL_RUNTIME, RUNSC_PIDS_HEADROOM, Runtime};
pub use time::parse_rfc3339;

// What `forward_backend!` expands to, reachable from the adapters' crates.
#[doc(hidden)]
pub mod __private {
    pub use sandbox_core::{
        Backend, Capability, CreateOptions, EngineReport, IsolationTier, ManagedSandbox,
        ReapableBackend, Result, Sandbox, Snapshot, async_trait,
    };
}
