//! The state a wrapped sandbox and its file system share, and the checks every call on
//! them makes before the adapter is called: the capability it needs, that the sandbox was
//! not killed, valid options — and the timeout, resolved so the adapter always receives a
//! bounded one (an inherited timeout becomes the remaining lifetime).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::audit::Redactor;
use crate::options::MAX_SANDBOX_TIMEOUT;
use crate::{
    Capability, CodeOptions, Command, IsolationTier, Result, RunOptions, Sandbox, SandboxError,
    policy,
};

use super::config::Layer;
use super::op::Op;

/// The shortest timeout an inherited (`None`) timeout resolves to, even when the layer's
/// own estimate of the remaining lifetime is zero: it leaves the adapter time to answer
/// `SandboxGone` for an expired sandbox instead of a spurious `ExecutionTimeout`.
pub const MIN_INHERITED_TIMEOUT: Duration = Duration::from_secs(1);

/// State shared by a wrapped sandbox and its file system.
pub(super) struct Shared {
    pub(super) inner: Box<dyn Sandbox>,
    pub(super) id: String,
    pub(super) backend: String,
    pub(super) tier: IsolationTier,
    pub(super) layer: Arc<Layer>,
    pub(super) redactor: Redactor,
    /// End of the lifetime as the layer knows it (`None` after `connect`); moved by
    /// each successful `extend`.
    pub(super) deadline: std::sync::Mutex<Option<tokio::time::Instant>>,
    pub(super) killed: AtomicBool,
    /// Paused through this handle and not resumed since.
    pub(super) paused: AtomicBool,
    /// Stopped through this handle and not started since.
    pub(super) stopped: AtomicBool,
    /// Serialises kills, pauses, resumes and extensions, so two concurrent kills call
    /// the adapter once and a pause or an extension never races a kill.
    pub(super) kill_lock: tokio::sync::Mutex<()>,
}

impl Shared {
    /// The shared state of `fork`, a fork of this sandbox: the same backend, layer and
    /// secrets to redact, its own id, deadline and kill state.
    pub(super) fn forked(
        &self,
        fork: Box<dyn Sandbox>,
        deadline: Option<tokio::time::Instant>,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            id: fork.id().to_string(),
            backend: self.backend.clone(),
            tier: self.tier,
            inner: fork,
            layer: self.layer.clone(),
            redactor: self.redactor.clone(),
            deadline: std::sync::Mutex::new(deadline),
            killed: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            kill_lock: tokio::sync::Mutex::new(()),
        })
    }

    pub(super) fn op(&self, span: tracing::Span, operation: &'static str) -> Op {
        Op::new(span, operation, &self.backend, self.tier).sandbox(&self.id)
    }

    pub(super) fn require(&self, needed: Capability) -> Result<()> {
        policy::require(self.inner.capabilities(), needed, &self.backend)
    }

    /// Not killed, not stopped and not paused: a paused sandbox's processes are frozen,
    /// so a call would wait for a resume that may never come; a stopped one has none.
    pub(super) fn alive(&self) -> Result<()> {
        if self.killed.load(Ordering::SeqCst) {
            Err(SandboxError::gone(&self.id))
        } else if self.stopped.load(Ordering::SeqCst) {
            Err(SandboxError::stopped(&self.id))
        } else if self.paused.load(Ordering::SeqCst) {
            Err(SandboxError::paused(&self.id))
        } else {
            Ok(())
        }
    }

    /// What `timeout: None` resolves to: the remaining lifetime (never unbounded), at
    /// least [`MIN_INHERITED_TIMEOUT`].
    fn remaining(&self) -> Duration {
        let deadline = *self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        let left = match deadline {
            Some(d) => d.saturating_duration_since(tokio::time::Instant::now()),
            None => MAX_SANDBOX_TIMEOUT,
        };
        left.max(MIN_INHERITED_TIMEOUT)
    }

    /// Records a deadline the adapter moved to (`extend`'s answer). A deadline counted
    /// from after the call is never earlier than the adapter's, like the one at create.
    pub(super) fn moved_deadline(&self, to: std::time::SystemTime) {
        let left = to
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        let at = tokio::time::Instant::now() + left;
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }

    pub(super) fn run_options(&self, cmd: &Command, mut options: RunOptions) -> Result<RunOptions> {
        cmd.validate()?;
        if options.stdin.is_some() || options.interactive {
            self.require(Capability::STDIN)?;
        }
        if options.pty.is_some() {
            self.require(Capability::PTY)?;
        }
        let timeout = options.validate(self.remaining())?;
        options.timeout = Some(timeout);
        Ok(options)
    }

    pub(super) fn code_options(&self, mut options: CodeOptions) -> Result<CodeOptions> {
        // The most specific missing capability is named: a context needs STATEFUL_CODE
        // (which implies code), so that refusal names it even when RUN_CODE is missing too.
        if options.context_id.is_some() {
            self.require(Capability::STATEFUL_CODE)?;
        }
        self.require(Capability::RUN_CODE)?;
        let timeout = options.validate(self.remaining())?;
        options.timeout = Some(timeout);
        Ok(options)
    }
}
