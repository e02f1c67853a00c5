//! Pausing and resuming a sandbox through the engine's freezer: every process of the
//! container, the agent (PID 1) included, stops at once and continues where it was.
//!
//! An engine answers a pause of a container that is already paused (or a resume of one
//! that runs) with an error (Docker: a conflict; Podman: an improper state); someone else
//! may have done it (`docker pause` by hand, another handle). What counts is the state
//! afterwards, so any such answer is checked against the container's state: the state
//! asked for is success, a container that is gone is `SandboxGone`.
//!
//! A paused container is thawed before it is removed: gVisor's runtime does not finish
//! removing a frozen sandbox (Docker's delete waits past any teardown grace).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sandbox_core::teardown::Killer;
use sandbox_core::{Capability, Result, SandboxState};

use crate::engine::{ContainerEngine, EngineErrorKind};
use crate::error;
use crate::sandbox::shared::Shared;

/// Pauses (`pause` true) or resumes the sandbox's container.
pub(crate) async fn set_paused<E: ContainerEngine>(shared: &Shared<E>, pause: bool) -> Result<()> {
    let backend = shared.engine.backend();
    sandbox_core::policy::require(shared.caps, Capability::PAUSE_RESUME, backend)?;
    if shared.stopped.load(Ordering::SeqCst) {
        return Err(sandbox_core::SandboxError::stopped(&shared.id));
    }
    let (op, wanted) = if pause {
        ("pause", SandboxState::Paused)
    } else {
        ("unpause", SandboxState::Running)
    };
    let id = shared.id.as_str();
    let r = if pause {
        shared.call(op, shared.engine.pause(id)).await
    } else {
        shared.call(op, shared.engine.unpause(id)).await
    };
    let e = match r {
        Ok(()) => {
            shared.paused.store(pause, Ordering::SeqCst);
            return Ok(());
        }
        Err(e) => e,
    };
    if e.kind == EngineErrorKind::NotFound {
        return Err(error::gone(id).with_source(e));
    }
    // Docker answers a repeat with a conflict, Podman with "container state improper":
    // what counts is the state now.
    match shared.call("inspect", shared.engine.inspect(id)).await {
        Ok(info) if info.state == wanted => {
            shared.paused.store(pause, Ordering::SeqCst);
            Ok(())
        }
        Ok(_) => Err(error::on_sandbox(&*shared.engine, id, op, e)),
        Err(i) if i.kind == EngineErrorKind::NotFound => Err(error::gone(id).with_source(e)),
        Err(_) => Err(error::engine(&*shared.engine, op, e)),
    }
}

/// `killer`, preceded by a thaw (bounded, its failure ignored: the removal decides) when
/// the sandbox is paused.
pub(crate) fn thawing<E: ContainerEngine>(shared: &Arc<Shared<E>>, killer: Killer) -> Killer {
    let shared = shared.clone();
    Arc::new(move || {
        let shared = shared.clone();
        let killer = killer.clone();
        Box::pin(async move {
            if shared.paused.load(Ordering::SeqCst) {
                let thawed = shared
                    .call("unpause", shared.engine.unpause(&shared.id))
                    .await;
                if let Err(e) = thawed {
                    tracing::debug!(sandbox_id = %shared.id, error = %e, "thaw before removal failed");
                }
            }
            killer().await
        })
    })
}
