#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod agent;
mod archive;
mod backend;
pub mod cdi;
pub mod copy_in;
pub mod discovery;
pub mod egress;
pub mod engine;
mod error;
mod exec;
mod files;
mod files_agent;
mod forward;
pub mod hooks;
pub mod image;
mod ingress;
mod interpreter;
mod kill;
pub mod linux_capability;
pub mod mounts;
pub mod path_stat;
pub mod runtime;
mod sandbox;
mod settings;
pub mod ssh;
mod stdin_feed;
mod sweep;
pub mod time;
pub mod transfer;

pub use agent::{AGENT_ENV, AGENT_PATH, agent_enabled_in};
pub use backend::{
    ContainerBackend, ContainerConfig, DEFAULT_CALL_TIMEOUT, DEFAULT_CREATE_TIMEOUT,
    DEFAULT_DOWNLOAD_CAP, DEFAULT_DOWNLOAD_ENTRIES, DEFAULT_MAX_CONTEXTS,
    DEFAULT_MAX_INGRESS_CONNECTIONS, DEFAULT_READ_CAP, LAYER_CAPABILITIES, NAME_PREFIX,
    SWEEP_PAST_DEADLINE,
};
pub use engine::{
    ArchiveBody, AttachStream, ContainerEngine, ContainerInfo, ContainerSpec, EngineError,
    EngineErrorKind, EngineFacts, EngineResult, ExecInput, ExecRequest, ExecState, ExecStream,
    NetworkMode, PathStat,
};
pub use exec::EXEC_TOKEN_ENV;
pub use files::{LS_SCRIPT, MKDIR_SCRIPT, REMOVE_SCRIPT};
pub use image::{CredentialStore, ImageRef, PullProgress, PullProgressHook, RegistryAuth};
pub use interpreter::DRIVER;
pub use kill::KILL_SCRIPT;
pub use linux_capability::{GRANTABLE_CAPABILITIES, LinuxCapability, NEVER_GRANTABLE};
pub use runtime::{LABEL_RUNTIME, RUNSC_PIDS_HEADROOM, Runtime};
pub use sandbox::{ContainerNative, ContainerSandbox, ExecPath};
pub use time::parse_rfc3339;

// What `forward_backend!` expands to, reachable from the adapters' crates.
#[doc(hidden)]
pub mod __private {
    pub use sandbox_core::{
        Backend, Capability, CreateOptions, EngineReport, IsolationTier, ManagedSandbox,
        ReapableBackend, Result, Sandbox, async_trait,
    };
}
