//! Ending every process in a sandbox but its first one: the way back from a fork bomb's
//! leftovers or a stuck background job without losing the sandbox's files.
//!
//! Only the in-sandbox agent can do it: it is already running when the pids limit is
//! exhausted, while an engine exec would need a new process to start. Interpreter contexts
//! die with their processes, so the handle forgets them (the next `run_code` on one starts
//! a fresh interpreter).

use sandbox_core::{Capability, Result, SandboxError};

use crate::engine::ContainerEngine;
use crate::sandbox::shared::Shared;

/// Kills every process but the agent; returns how many were killed.
pub(crate) async fn reset_processes<E: ContainerEngine>(shared: &Shared<E>) -> Result<u32> {
    let backend = shared.engine.backend();
    sandbox_core::policy::require(shared.caps, Capability::RESET_PROCESSES, backend)?;
    shared.refuse_unless_running()?;
    let Some(agent) = shared.agent() else {
        return Err(SandboxError::unsupported(
            Capability::RESET_PROCESSES,
            backend,
        ));
    };
    let killed = agent.reset_processes().await?;
    let forgotten = std::mem::take(&mut *shared.contexts.lock().unwrap_or_else(|e| e.into_inner()));
    tracing::info!(
        sandbox_id = %shared.id,
        processes = killed,
        contexts = forgotten.len(),
        "every process but the agent ended"
    );
    Ok(killed)
}
