#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

// Layout, from the bottom up: the leaves (`config`, `faults`, `calls`, `clock`, `script`,
// and `policy` for egress verdicts), the state everything shares (`state`, holding
// `memfs` trees and `processes` tables), one running program (`program`) and the programs
// themselves (`commands/`, listed in the public `vocabulary`), an exec (`exec`), the
// sandbox handles (`sandbox`, `files`), and the backend that provisions them (`backend`).
mod backend;
mod calls;
mod clock;
mod commands;
mod config;
mod exec;
mod faults;
mod files;
mod memfs;
mod policy;
mod processes;
mod program;
mod sandbox;
mod script;
mod snapshots;
mod state;
pub mod vocabulary;

pub use backend::FakeBackend;
pub use calls::{Call, FileOp, REDACTED};
pub use config::{DEFAULT_TEMPLATE, FakeBuilder, FakeConfig, full_capabilities};
pub use faults::{FaultInjector, FaultState};
pub use processes::{INIT_PID, ProcessInfo};
pub use sandbox::{FakeSandbox, SandboxHandle};
pub use script::{CodeMatch, Response, RunMatch, Step};

/// The backend name (and DSN scheme) of the fake.
pub const BACKEND_NAME: &str = "fake";

/// Locks `m`, ignoring poisoning: a panicking test must not cascade into every later use
/// of the fake.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
