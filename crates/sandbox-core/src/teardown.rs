//! Bounded, cancellation-proof teardown.
//!
//! Dropping a future never runs async code, so every cleanup that must survive a drop is
//! *spawned* on the current tokio runtime and bounded by [`teardown_grace`]. When it cannot
//! finish, an "orphaned sandbox" warning event is emitted through `tracing` naming the id,
//! backend and labels, and the kill goes on in the background (bounded by
//! [`BACKGROUND_KILL_LIMIT`]) instead of being dropped; the sandbox's lifetime timeout
//! remains the backstop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::{Result, SandboxError};

/// Default teardown grace.
pub const DEFAULT_TEARDOWN_GRACE: Duration = Duration::from_secs(5);
/// Environment variable overriding the grace (seconds, may be fractional).
pub const TEARDOWN_GRACE_ENV: &str = "SBX_TEARDOWN_GRACE";
/// `tracing` target of teardown events.
pub const TEARDOWN_TARGET: &str = "sandbox::teardown";
/// Message of the orphan warning event.
pub const ORPHAN_MESSAGE: &str = "orphaned sandbox";

/// The grace every teardown is bounded by: `SBX_TEARDOWN_GRACE` seconds, default 5 s.
/// Unparseable or non-positive values fall back to the default.
pub fn teardown_grace() -> Duration {
    std::env::var(TEARDOWN_GRACE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 3600.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_TEARDOWN_GRACE)
}

/// A future that kills remote work. `'static` so it can outlive the handle that made it.
pub type KillFuture = BoxFuture<'static, Result<()>>;

/// A factory of kill futures, shared by a handle and its guard.
pub type Killer = Arc<dyn Fn() -> KillFuture + Send + Sync>;

/// What the orphan warning names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanInfo {
    /// Sandbox id (or `<sandbox>/<exec>` for a process).
    pub id: String,
    /// Backend name.
    pub backend: String,
    /// Engine labels of the sandbox.
    pub labels: BTreeMap<String, String>,
}

impl OrphanInfo {
    /// An orphan description.
    pub fn new(
        id: impl Into<String>,
        backend: impl Into<String>,
        labels: BTreeMap<String, String>,
    ) -> Self {
        OrphanInfo {
            id: id.into(),
            backend: backend.into(),
            labels,
        }
    }
}

static PENDING: AtomicUsize = AtomicUsize::new(0);

/// Number of background teardowns still running in this process.
pub fn pending_teardowns() -> usize {
    PENDING.load(Ordering::SeqCst)
}

/// Waits until no background teardown is running, or `max` elapsed. Returns whether idle.
pub async fn wait_for_teardowns(max: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + max;
    while pending_teardowns() > 0 {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

struct PendingGuard;
impl PendingGuard {
    fn new() -> Self {
        PENDING.fetch_add(1, Ordering::SeqCst);
        PendingGuard
    }
}
impl Drop for PendingGuard {
    fn drop(&mut self) {
        PENDING.fetch_sub(1, Ordering::SeqCst);
    }
}

fn warn_orphan(info: &OrphanInfo, reason: &str) {
    tracing::warn!(
        target: TEARDOWN_TARGET,
        sandbox_id = %info.id,
        backend = %info.backend,
        labels = ?info.labels,
        reason,
        "{ORPHAN_MESSAGE}"
    );
}

/// Longest a kill goes on in the background once its grace has expired. The caller
/// stops waiting at the grace; the removal itself is not abandoned there (dropping it
/// could leave a request unsent on a busy engine, and the sandbox running until its
/// lifetime ends), but it is not kept forever either.
pub const BACKGROUND_KILL_LIMIT: Duration = Duration::from_secs(120);

/// Runs `kill` bounded by the grace. `SandboxGone` counts as success (kill is
/// idempotent). When the grace expires, the orphan warning is emitted and the error
/// returned, while the kill goes on in a task of its own (bounded by
/// [`BACKGROUND_KILL_LIMIT`], not counted by [`pending_teardowns`]).
async fn run_bounded(info: &OrphanInfo, mut kill: KillFuture, grace: Duration) -> Result<()> {
    match tokio::time::timeout(grace, &mut kill).await {
        Ok(Ok(())) | Ok(Err(SandboxError::SandboxGone { .. })) => Ok(()),
        Ok(Err(e)) => {
            warn_orphan(info, "kill failed");
            Err(SandboxError::Connect {
                id: info.id.clone(),
                message: "kill failed; the sandbox may still be running".into(),
                source: Some(Box::new(e)),
            })
        }
        Err(_) => {
            // Only a kill that outlived the grace is moved to a task: the fast path
            // spawns nothing.
            tokio::spawn(tokio::time::timeout(BACKGROUND_KILL_LIMIT, kill));
            warn_orphan(info, "teardown grace expired");
            Err(SandboxError::Connect {
                id: info.id.clone(),
                message: format!(
                    "kill did not finish within the teardown grace ({grace:?}); it goes on in \
                     the background for up to {BACKGROUND_KILL_LIMIT:?}"
                ),
                source: None,
            })
        }
    }
}

/// Kills remote work in a task of its own, so that dropping the caller's future does not
/// abort the kill (the Rust form of a shielded scope). Bounded by the grace; a failure or
/// expiry emits the orphan warning and returns [`SandboxError::Connect`] with a `reap` hint.
pub async fn shielded_kill(info: OrphanInfo, kill: KillFuture) -> Result<()> {
    let grace = teardown_grace();
    let pending = PendingGuard::new();
    let task = tokio::spawn(async move {
        let _pending = pending;
        run_bounded(&info, kill, grace).await
    });
    match task.await {
        Ok(r) => r,
        Err(join) => Err(SandboxError::Engine {
            backend: "core".into(),
            message: "teardown task failed".into(),
            source: Some(Box::new(join)),
        }),
    }
}

/// Schedules a bounded kill in the background (for `Drop`). Without a tokio runtime to run
/// it on, the orphan warning is emitted at once.
pub fn spawn_bounded_kill(info: OrphanInfo, kill: KillFuture) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            let grace = teardown_grace();
            let pending = PendingGuard::new();
            handle.spawn(async move {
                let _pending = pending;
                let _ = run_bounded(&info, kill, grace).await;
            });
        }
        Err(_) => warn_orphan(&info, "dropped outside a tokio runtime"),
    }
}

/// Owns remote work: when dropped while armed, it schedules the bounded kill. Adapters
/// create one as soon as the engine returns an id, so a dropped `create` or a dropped
/// handle never leaks.
pub struct TeardownGuard {
    info: OrphanInfo,
    killer: Option<Killer>,
}

impl TeardownGuard {
    /// An armed guard.
    pub fn new(info: OrphanInfo, killer: Killer) -> Self {
        TeardownGuard {
            info,
            killer: Some(killer),
        }
    }

    /// What this guard would name in an orphan warning.
    pub fn info(&self) -> &OrphanInfo {
        &self.info
    }

    /// Whether the guard still owns the remote work.
    pub fn is_armed(&self) -> bool {
        self.killer.is_some()
    }

    /// Gives up ownership without killing.
    pub fn disarm(&mut self) {
        self.killer = None;
    }

    /// Kills now, shielded and bounded, and disarms. Idempotent: a disarmed guard returns
    /// `Ok(())`. When the kill fails the guard stays armed, so a later `kill_now` or the
    /// drop retries instead of leaking the remote work.
    pub async fn kill_now(&mut self) -> Result<()> {
        let Some(k) = self.killer.clone() else {
            return Ok(());
        };
        let result = shielded_kill(self.info.clone(), k()).await;
        if result.is_ok() {
            self.killer = None;
        }
        result
    }
}

impl Drop for TeardownGuard {
    fn drop(&mut self) {
        if let Some(k) = self.killer.take() {
            spawn_bounded_kill(self.info.clone(), k());
        }
    }
}

impl std::fmt::Debug for TeardownGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeardownGuard")
            .field("id", &self.info.id)
            .field("armed", &self.is_armed())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn info() -> OrphanInfo {
        OrphanInfo::new("sb-1", "test", BTreeMap::new())
    }

    #[tokio::test]
    async fn drop_schedules_kill() {
        let killed = Arc::new(AtomicBool::new(false));
        let k = killed.clone();
        let g = TeardownGuard::new(
            info(),
            Arc::new(move || {
                let k = k.clone();
                Box::pin(async move {
                    k.store(true, Ordering::SeqCst);
                    Ok(())
                })
            }),
        );
        drop(g);
        assert!(wait_for_teardowns(Duration::from_secs(2)).await);
        assert!(killed.load(Ordering::SeqCst));
    }

    /// A kill slower than the grace is reported, but not abandoned: it finishes in the
    /// background (a busy engine's removal would otherwise never be sent).
    #[tokio::test]
    async fn a_kill_past_the_grace_goes_on_in_the_background() {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let kill: KillFuture = Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            d.store(true, Ordering::SeqCst);
            Ok(())
        });
        let r = run_bounded(&info(), kill, Duration::from_millis(50)).await;
        let e = r.unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Connect);
        assert!(e.to_string().contains("goes on in the background"), "{e}");
        assert!(!done.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(done.load(Ordering::SeqCst), "the kill was abandoned");
    }

    #[tokio::test]
    async fn failing_kill_is_connect_error() {
        let mut g = TeardownGuard::new(
            info(),
            Arc::new(|| {
                Box::pin(async {
                    Err(SandboxError::Engine {
                        backend: "t".into(),
                        message: "boom".into(),
                        source: None,
                    })
                })
            }),
        );
        let e = g.kill_now().await.unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Connect);
        assert!(e.hint().contains("sandbox reap"));
        assert!(g.is_armed(), "a failed kill keeps ownership for a retry");
        g.disarm();
        assert!(g.kill_now().await.is_ok(), "a disarmed guard is a no-op");
    }

    #[tokio::test]
    async fn gone_counts_as_killed() {
        let mut g = TeardownGuard::new(
            info(),
            Arc::new(|| Box::pin(async { Err(SandboxError::gone("x")) })),
        );
        assert!(g.kill_now().await.is_ok());
    }
}
