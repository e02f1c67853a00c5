#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod calls;
mod clock;
mod commands;
mod config;
mod exec;
mod faults;
mod files;
mod memfs;
mod netcat;
mod policy;
mod processes;
mod sandbox;
mod script;
mod shell;
mod snippets;
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
