//! Removing a container for good: a forced removal that counts one already gone as
//! removed and waits, bounded, for a removal someone else started; and the [`Killer`]
//! every teardown guard and sandbox handle holds.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::Result;
use sandbox_core::teardown::{Killer, teardown_grace};

use crate::engine::transfer::bounded;
use crate::engine::{ContainerEngine, EngineErrorKind};
use crate::error;

/// Force-removes a container; one already gone counts as removed. A removal someone else
/// started (a concurrent kill, reap or sweep) is waited for, bounded. Its recorded egress
/// policy and deadline go with it.
pub(crate) async fn remove_container<E: ContainerEngine>(
    engine: &E,
    call_timeout: Duration,
    id: &str,
) -> Result<()> {
    let r = remove_only(engine, call_timeout, id).await;
    if r.is_ok() {
        crate::egress::forget(id);
        crate::provision::deadlines::Deadlines::default().forget(id);
    }
    r
}

async fn remove_only<E: ContainerEngine>(
    engine: &E,
    call_timeout: Duration,
    id: &str,
) -> Result<()> {
    match bounded(call_timeout, "remove", engine.remove(id)).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind == EngineErrorKind::NotFound => Ok(()),
        Err(e) if e.kind == EngineErrorKind::Conflict => {
            let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
            loop {
                match bounded(call_timeout, "inspect", engine.inspect(id)).await {
                    Err(e) if e.kind == EngineErrorKind::NotFound => return Ok(()),
                    Err(e) if e.kind != EngineErrorKind::Conflict => {
                        return Err(error::engine(engine, "inspect during removal", e));
                    }
                    _ => {}
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(error::connect(
                        id,
                        format!("container still being removed after {REMOVAL_WAIT:?}"),
                        None,
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Err(e) => Err(error::engine(engine, "remove container", e)),
    }
}

/// [`remove_container`] of a container last seen in `state`: a paused one is thawed first
/// (bounded, a failure ignored: the removal decides), since gVisor's runtime does not
/// finish removing a frozen sandbox.
pub(crate) async fn remove_in_state<E: ContainerEngine>(
    engine: &E,
    call_timeout: Duration,
    id: &str,
    state: sandbox_core::SandboxState,
) -> Result<()> {
    if state == sandbox_core::SandboxState::Paused
        && let Err(e) = bounded(call_timeout, "unpause", engine.unpause(id)).await
    {
        tracing::debug!(sandbox_id = %id, error = %e, "thaw before removal failed");
    }
    remove_container(engine, call_timeout, id).await
}

/// Longest [`remove_container`] waits for a removal someone else started.
const REMOVAL_WAIT: Duration = Duration::from_secs(10);

/// A killer that force-removes the container (see [`kill_and_remove`]).
pub(crate) fn container_killer<E: ContainerEngine>(
    engine: Arc<E>,
    call_timeout: Duration,
    id: String,
) -> Killer {
    Arc::new(move || {
        let engine = engine.clone();
        let id = id.clone();
        Box::pin(async move {
            kill_and_remove(engine, call_timeout, id, removal_budget(teardown_grace())).await
        })
    })
}

/// How long a kill waits for the engine's whole removal before it settles for the
/// container's processes being dead: most of the grace, leaving time to check them.
fn removal_budget(grace: Duration) -> Duration {
    grace.mul_f64(0.6)
}

/// Force-removes the container; when the removal is not done within `budget`, the kill
/// still succeeds once the engine reports the container stopped with no process, and the
/// removal goes on.
///
/// Why: a forced removal is a kill (done in milliseconds) followed by the engine's own
/// cleanup — the network endpoint, the mounts, the writable layer — which on a loaded
/// two-core machine took longer than the whole teardown grace (Docker 20.10, seen in CI).
/// What a kill must guarantee within the grace is that nothing runs any more; the removal
/// request is already with the engine, which completes it without us (Docker's removal
/// does not depend on the client staying connected), and this process keeps awaiting it
/// in the background too. The sweeps, the deadline timer and `reap` remove any stopped
/// container that is left.
async fn kill_and_remove<E: ContainerEngine>(
    engine: Arc<E>,
    call_timeout: Duration,
    id: String,
    budget: Duration,
) -> Result<()> {
    let mut removal = {
        let (engine, id) = (engine.clone(), id.clone());
        tokio::spawn(async move {
            let r = remove_container(&*engine, call_timeout, &id).await;
            if let Err(e) = &r {
                tracing::debug!(sandbox_id = %id, error = %e, "container removal failed");
            }
            r
        })
    };
    let joined = |r: std::result::Result<Result<()>, tokio::task::JoinError>| {
        r.unwrap_or_else(|join| {
            Err(error::connect(
                &id,
                format!("the removal task failed: {join}"),
                None,
            ))
        })
    };
    if let Ok(r) = tokio::time::timeout(budget, &mut removal).await {
        return joined(r);
    }
    // Still removing: a container the engine reports stopped with no process is dead.
    loop {
        match bounded(call_timeout, "inspect", engine.inspect(&id)).await {
            Err(e) if e.kind == EngineErrorKind::NotFound => return Ok(()),
            Ok(c) if c.state == sandbox_core::SandboxState::Stopped && c.pid.is_none() => {
                tracing::debug!(
                    sandbox_id = %id,
                    "the container is dead; the engine is still removing it"
                );
                return Ok(());
            }
            // Running, or the engine is busy: the removal's own result, or the next look,
            // decides (the caller's grace bounds both).
            _ => {}
        }
        if removal.is_finished() {
            return joined(removal.await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `killer`, then the engine's `post_stop` hook once a removal succeeded — once, however
/// often the killer runs (a kill is idempotent). The hook runs inside the teardown's
/// bound, so it should be short.
pub(crate) fn then_post_stop(
    killer: Killer,
    hooks: crate::spec::hooks::Hooks,
    event: crate::spec::hooks::HookEvent,
) -> Killer {
    if !hooks.has_post_stop() {
        return killer;
    }
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    Arc::new(move || {
        let (kill, hooks, event, fired) =
            (killer.clone(), hooks.clone(), event.clone(), fired.clone());
        Box::pin(async move {
            kill().await?;
            if !fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                hooks.run_post_stop(&event).await;
            }
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Instant;

    use sandbox_core::{Capability, IsolationTier, SandboxState};

    use super::*;
    use crate::engine::{
        ArchiveBody, ContainerInfo, ContainerSpec, EngineError, EngineFacts, EngineResult,
        ExecRequest, ExecState, ExecStream, PathStat,
    };

    /// An engine whose forced removal kills at once and then cleans up for `cleanup`, the
    /// container reading as stopped (or, with `stays_running`, running) meanwhile.
    #[derive(Debug)]
    struct SlowRemoval {
        cleanup: Duration,
        stays_running: bool,
        removing: Mutex<bool>,
    }

    fn no<T>() -> EngineResult<T> {
        Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
    }

    #[async_trait::async_trait]
    impl ContainerEngine for SlowRemoval {
        fn backend(&self) -> &'static str {
            "slow-removal"
        }
        fn tier(&self) -> IsolationTier {
            IsolationTier::Container
        }
        fn capabilities(&self) -> Capability {
            Capability::all()
        }
        fn endpoint(&self) -> &str {
            "memory://slow-removal"
        }
        async fn create(&self, _: &ContainerSpec) -> EngineResult<String> {
            no()
        }
        async fn start(&self, _: &str) -> EngineResult<()> {
            no()
        }
        async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo> {
            let removing = *self.removing.lock().unwrap();
            let state = if removing && !self.stays_running {
                SandboxState::Stopped
            } else {
                SandboxState::Running
            };
            let mut info = ContainerInfo::new(id, id, state, BTreeMap::new());
            info.pid = (state == SandboxState::Running).then_some(42);
            Ok(info)
        }
        async fn remove(&self, _: &str) -> EngineResult<bool> {
            *self.removing.lock().unwrap() = true;
            tokio::time::sleep(self.cleanup).await;
            Ok(true)
        }
        async fn list(&self, _: &BTreeMap<String, String>) -> EngineResult<Vec<ContainerInfo>> {
            no()
        }
        async fn exec(&self, _: &str, _: ExecRequest) -> EngineResult<ExecStream> {
            no()
        }
        async fn exec_state(&self, _: &str) -> EngineResult<ExecState> {
            no()
        }
        async fn put_archive(&self, _: &str, _: &str, _: ArchiveBody) -> EngineResult<()> {
            no()
        }
        async fn get_archive(&self, _: &str, _: &str) -> EngineResult<ArchiveBody> {
            no()
        }
        async fn stat_path(&self, _: &str, _: &str) -> EngineResult<PathStat> {
            no()
        }
        async fn ping(&self) -> EngineResult<()> {
            Ok(())
        }
        async fn facts(&self) -> EngineFacts {
            EngineFacts::default()
        }
    }

    fn engine(cleanup_ms: u64, stays_running: bool) -> Arc<SlowRemoval> {
        Arc::new(SlowRemoval {
            cleanup: Duration::from_millis(cleanup_ms),
            stays_running,
            removing: Mutex::new(false),
        })
    }

    #[tokio::test]
    async fn a_dead_container_still_being_removed_is_killed() {
        let start = Instant::now();
        let r = kill_and_remove(
            engine(30_000, false),
            Duration::from_secs(60),
            "c1".into(),
            Duration::from_millis(200),
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn a_container_still_running_is_not_called_killed() {
        // The removal takes 1.5 s and the container reads as running throughout: the kill
        // may only end when the removal does.
        let start = Instant::now();
        let r = kill_and_remove(
            engine(1_500, true),
            Duration::from_secs(60),
            "c2".into(),
            Duration::from_millis(200),
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        assert!(
            start.elapsed() >= Duration::from_millis(1_400),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn a_quick_removal_is_awaited_whole() {
        let e = engine(50, false);
        let r = kill_and_remove(
            e.clone(),
            Duration::from_secs(60),
            "c3".into(),
            Duration::from_secs(5),
        )
        .await;
        assert!(r.is_ok(), "{r:?}");
        assert!(*e.removing.lock().unwrap());
    }

    #[test]
    fn the_budget_leaves_time_to_look() {
        assert_eq!(
            removal_budget(Duration::from_secs(5)),
            Duration::from_secs(3)
        );
    }
}
