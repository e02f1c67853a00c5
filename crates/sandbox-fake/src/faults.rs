//! Failure injection, switchable at run time.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sandbox_core::{Result, SandboxError};

/// The faults currently injected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultState {
    /// Every `create` takes this long (virtual time) before returning.
    pub create_delay: Duration,
    /// Sandbox kills (`kill`, drop teardown, `kill_managed`) never complete.
    pub kill_hang: bool,
    /// Sandbox kills fail with an `Engine` error.
    pub kill_failure: bool,
    /// `create` fails with a `Creation` error (the provider is broken).
    pub provider_failure: bool,
    /// `create` fails with `Auth { env_var }` naming this variable.
    pub missing_credential: Option<String>,
    /// `create` never gets an answer: it ends with `CreateTimeout` after the configured
    /// create bound (`FakeConfig::create_timeout`).
    pub create_stall: bool,
}

/// Runtime fault toggles of one [`FakeBackend`](crate::FakeBackend) handle, shared by every
/// sandbox it creates. Cloning shares the toggles.
///
/// ```
/// # use sandbox_fake::FakeBackend;
/// let backend = FakeBackend::new();
/// backend.faults().set_kill_hang(true);
/// assert!(backend.faults().state().kill_hang);
/// backend.faults().heal();
/// ```
#[derive(Clone, Default)]
pub struct FaultInjector {
    state: Arc<Mutex<FaultState>>,
}

impl std::fmt::Debug for FaultInjector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.lock().fmt(f)
    }
}

impl FaultInjector {
    fn lock(&self) -> MutexGuard<'_, FaultState> {
        crate::lock(&self.state)
    }

    /// A snapshot of the injected faults.
    pub fn state(&self) -> FaultState {
        self.lock().clone()
    }
    /// Slow create: every `create` waits `delay` (virtual time) while "starting".
    pub fn set_create_delay(&self, delay: Duration) {
        self.lock().create_delay = delay;
    }
    /// Kill hang: sandbox kills never complete (the teardown grace expires, the orphan
    /// warning fires).
    pub fn set_kill_hang(&self, on: bool) {
        self.lock().kill_hang = on;
    }
    /// Kill failure: sandbox kills return an `Engine` error.
    pub fn set_kill_failure(&self, on: bool) {
        self.lock().kill_failure = on;
    }
    /// Provider failure: `create` fails with `Creation`.
    pub fn set_provider_failure(&self, on: bool) {
        self.lock().provider_failure = on;
    }
    /// Missing credential: `create` fails with `Auth { env_var }`; `None` heals it.
    pub fn set_missing_credential(&self, env_var: Option<&str>) {
        self.lock().missing_credential = env_var.map(str::to_string);
    }
    /// Stalled creates: `create` waits out its bound, then fails with `CreateTimeout`.
    pub fn set_create_stall(&self, on: bool) {
        self.lock().create_stall = on;
    }
    /// Removes every fault (the create delay back to zero).
    pub fn heal(&self) {
        *self.lock() = FaultState::default();
    }

    /// Applies the create-time faults.
    pub(crate) fn before_create(&self, backend: &str) -> Result<Duration> {
        let s = self.state();
        if let Some(env_var) = s.missing_credential {
            return Err(SandboxError::auth(env_var));
        }
        if s.provider_failure {
            return Err(
                SandboxError::creation(backend, "the provider refused the create")
                    .with_source(std::io::Error::other("injected provider failure")),
            );
        }
        Ok(s.create_delay)
    }

    /// Applies the kill-time faults: hangs forever or fails.
    pub(crate) async fn before_kill(&self, backend: &str) -> Result<()> {
        let s = self.state();
        if s.kill_hang {
            futures::future::pending::<()>().await;
        }
        if s.kill_failure {
            return Err(SandboxError::engine(backend, "injected kill failure"));
        }
        Ok(())
    }
}
