//! Removing a container for good: a forced removal that counts one already gone as
//! removed and waits, bounded, for a removal someone else started; and the [`Killer`]
//! every teardown guard and sandbox handle holds.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::Result;
use sandbox_core::teardown::Killer;

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

/// A killer that force-removes the container.
pub(crate) fn container_killer<E: ContainerEngine>(
    engine: Arc<E>,
    call_timeout: Duration,
    id: String,
) -> Killer {
    Arc::new(move || {
        let engine = engine.clone();
        let id = id.clone();
        Box::pin(async move { remove_container(&*engine, call_timeout, &id).await })
    })
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
