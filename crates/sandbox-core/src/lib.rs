#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod audit;
mod backend;
mod capability;
pub mod credential;
mod diagnostics;
pub mod dsn;
mod error;
mod error_code;
mod files;
mod fork;
pub mod git_gate;
pub mod image_ref;
mod isolation;
pub mod labels;
pub mod layer;
mod managed;
mod network;
pub mod options;
pub mod policy;
mod pool;
mod process;
mod provenance;
mod resources;
mod result;
mod sandbox;
mod secret;
#[cfg(feature = "serde")]
mod serialization;
mod snapshot;
pub mod ssh_agent;
pub mod teardown;

pub use backend::{Backend, ReapableBackend};
pub use capability::Capability;
pub use credential::{Credential, Placement};
pub use diagnostics::{EngineReport, Problem};
pub use dsn::Dsn;
pub use error::{BoxError, Result, SandboxError};
pub use error_code::{CodeDoc, DOCS_BASE_URL, ErrorCode};
pub use files::{FileInfo, FileSystem, resolve_path};
pub use fork::{ForkOptions, MAX_FORKS};
pub use git_gate::{GitAccess, GitRepo};
pub use image_ref::ImageRef;
pub use isolation::IsolationTier;
pub use managed::{ManagedSandbox, SandboxState};
pub use network::{
    ALWAYS_BLOCKED, BlockedNetwork, BlockedSetOverride, Egress, EgressDefault, EgressRule,
    EgressTarget, EgressTiers, HOST_SANDBOX_NAME, HostPort, MAX_HOST_PORTS, MIN_ALLOWLIST_PREFIX,
    NetworkPolicy, TierVerdict,
};
pub use options::{CodeOptions, Command, CreateOptions, Language, PtySize, PullPolicy, RunOptions};
pub use pool::{Pool, PoolConfig, PoolStats};
pub use process::{
    InputSink, KILLED_EXIT_CODE, Process, ProcessInput, StartFuture, StartedExec, channel_input,
};
pub use provenance::{CLOCK_SLACK, Provenance};
pub use resources::{DEFAULT_CPU, DEFAULT_MEMORY_MB, DEFAULT_PIDS, EffectiveResources, Resources};
pub use result::{ExecResult, OutputChunk, RichResult, StreamKind};
pub use sandbox::{Sandbox, SandboxExt};
pub use secret::Secret;
pub use snapshot::Snapshot;
pub use ssh_agent::{SshAgentOptions, SshKey};

/// Re-exported so adapters implement the traits with the same macro version.
pub use async_trait::async_trait;
