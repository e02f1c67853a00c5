//! The one enforcement layer every backend is wrapped in.
//!
//! Like OpenDAL's layers around its services, [`enforce`] (or a configured [`Layer`])
//! wraps any [`Backend`] — first- or third-party — and every [`Sandbox`] it returns, so
//! adapters do not repeat what must behave the same everywhere:
//!
//! - **create**: options validated, `require_isolation` checked and the capabilities the
//!   requested policy needs checked ([`policy::check_create`])
//!   *before* the adapter is called; the new sandbox's tier must equal its backend's tier
//!   (else it is killed and `Creation` is returned).
//! - **run / run_code / stream / files**: undeclared capabilities are refused with
//!   `CapabilityNotSupported` naming the capability before the adapter is called
//!   (`RUN_COMMAND`, `RUN_CODE`, `STATEFUL_CODE` for a context, `STREAMING`, `FILESYSTEM`,
//!   `UPLOAD_DOWNLOAD`, `INGRESS_PORTS`); commands and options are validated; a zero
//!   timeout is refused and `timeout: None` is resolved against the sandbox's remaining
//!   lifetime, so the adapter always receives a bounded `Some(timeout)`.
//! - **kill**: idempotent — a second `kill` returns `Ok` without calling the adapter; any
//!   operation after a successful kill is `SandboxGone` without calling the adapter.
//! - **observability**: one `tracing` span per operation and one [`AuditRecord`] per
//!   operation to every [`AuditSink`], redacted once. Span names and fields are listed in
//!   `docs/observability.md`.
//!
//! # Where admission runs, and why adapters run it too
//!
//! Admission — [`policy::check_create`] before a create (valid options, the required
//! isolation, the capabilities the requested policy needs) and [`policy::require`] before
//! each later call — runs here, in the layer, before the adapter is called. The layer is
//! the one place every user's call passes (the facade wraps every backend it hands out),
//! so whoever wrote the adapter, nothing is provisioned for a request that must be
//! refused, and the refusal looks the same everywhere.
//!
//! The first-party adapters (the container backend, the fake) run the same checks again
//! at their own entry points, on purpose:
//!
//! - a backend is reachable without the layer — through [`EnforcedBackend::inner`], by
//!   constructing an adapter and using it directly, and in the contract suite's unlayered
//!   self-test, which proves each trial catches a broken adapter by itself — and it must
//!   still refuse rather than provision what it cannot honour;
//! - [`policy::check_create`] returns the effective resources (defaults filled in), which
//!   the adapter needs to build its sandbox anyway.
//!
//! The checks are pure and cheap, and a second run gives the first run's answer, so
//! running them twice changes no result. Third-party adapters may rely on the layer and
//! skip them; the layer never relies on an adapter to have run them.
//!
//! # Why `Arc<dyn Backend>` in, `Arc<dyn Backend>` out
//!
//! The facade and the contract suite hold backends as `Arc<dyn Backend>` (selected at run
//! time), so the layer takes and returns exactly that rather than a typed `Layered<B>`:
//! no caller has to change type, and a typed wrapper would not help callers who only have
//! a trait object. The concrete type is still reachable: [`Backend::as_enforced`] returns
//! the [`EnforcedBackend`], and [`Sandbox::native`] of a wrapped sandbox is the adapter's
//! own native object.
//!
//! # Wrapping twice
//!
//! [`Layer::wrap`] of a backend that already is an [`EnforcedBackend`] does not add a
//! second layer: the existing one is returned, or, when the new [`Layer`] adds sinks or
//! stricter settings, one layer with both configurations merged replaces it. So the facade
//! can apply the layer unconditionally to a backend the user already wrapped with their
//! own audit sinks.
//!
//! ```
//! use std::sync::Arc;
//! use sandbox_core::layer::{Layer, MemorySink};
//! # use sandbox_core::*;
//! # #[derive(Debug)] struct Mine;
//! # #[async_trait]
//! # impl Backend for Mine {
//! #     fn name(&self) -> &str { "mine" }
//! #     fn capabilities(&self) -> Capability { Capability::empty() }
//! #     fn isolation(&self) -> IsolationTier { IsolationTier::Container }
//! #     async fn create(&self, _: CreateOptions) -> Result<Box<dyn Sandbox>> { Err(SandboxError::configuration("x")) }
//! #     async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> { Err(SandboxError::connect(id, "x")) }
//! # }
//! let audit = Arc::new(MemorySink::new());
//! let backend = Layer::new().audit(audit.clone()).strict(true).wrap(Arc::new(Mine));
//! let again = sandbox_core::layer::enforce(backend.clone());
//! assert!(Arc::ptr_eq(&backend, &again), "wrapping twice is detected");
//! ```
//!
//! # Where each job lives
//!
//! - `config`: the [`Layer`] configuration and the writing of audit records to its sinks;
//! - `op`: one operation's span, timing and audit record;
//! - `events`: [`EventReporter`] — the sinks a backend reports a sandbox's out-of-call
//!   events to (the requests of its credentials proxy, git gate and SSH agent relay),
//!   taken during create;
//! - `backend`: [`EnforcedBackend`] — admission, the tier check, create, connect, reaping;
//! - `shared`: a wrapped sandbox's state and the gate every call on it passes first
//!   (capability, liveness, options, the resolved timeout);
//! - `sandbox`: [`EnforcedSandbox`] — run, run_code, stream, files, kill, ingress;
//! - `files`: the wrapped sandbox's file system.
//!
//! [`Sandbox`]: crate::Sandbox
//! [`Sandbox::native`]: crate::Sandbox::native
//! [`policy::check_create`]: crate::policy::check_create
//! [`policy::require`]: crate::policy::require

mod backend;
mod config;
mod events;
mod files;
mod op;
mod sandbox;
mod shared;

use std::sync::Arc;

use crate::Backend;

pub use self::backend::EnforcedBackend;
pub use self::config::{Layer, SupportDirectory, TARGET};
pub use self::events::EventReporter;
pub use self::sandbox::EnforcedSandbox;
pub use self::shared::MIN_INHERITED_TIMEOUT;
pub use crate::audit::{AuditRecord, AuditSink, JsonLinesSink, MemorySink, NoopSink, Outcome};

/// Wraps `backend` in the enforcement layer with the default configuration (no audit
/// sink). Wrapping an already wrapped backend returns it unchanged.
pub fn enforce(backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
    Layer::new().wrap(backend)
}

impl Layer {
    /// Wraps `backend`. When it is already an [`EnforcedBackend`], no second layer is
    /// added: it is returned as is when this layer adds nothing, else one layer with both
    /// configurations merged (sinks of both, strict if either is) replaces it.
    pub fn wrap(self, backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
        if let Some(existing) = backend::enforced_self(&backend) {
            if self.adds_nothing_to(existing.layer()) {
                return backend;
            }
            let merged = self.merged_into(existing.layer());
            return Arc::new(EnforcedBackend::new(existing.inner().clone(), merged));
        }
        Arc::new(EnforcedBackend::new(backend, self))
    }
}

#[cfg(test)]
pub(crate) mod tests;
