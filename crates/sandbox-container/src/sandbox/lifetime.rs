//! Moving a sandbox's deadline (`Sandbox::extend`): the agent first, which enforces the
//! deadline from inside and refuses anything past the maximum it was started with, then
//! the host side (the handle's deadline, which bounds inherited timeouts, the host-side
//! deadline timer, and the host's record of it that every other process reads:
//! `provision/deadlines.rs`). The engine's labels keep the deadline set at create; the
//! latest one an extension can reach is labelled at create for cleanups that find no
//! record (`provision/sweep.rs`, `sandbox reap`).
//!
//! The engine's exec path has no agent: its lifetime backstop is the container's main
//! `sleep`, whose end cannot move, so such a sandbox does not declare `EXTEND_LIFETIME`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_core::{Capability, Result, SandboxError};

use crate::engine::ContainerEngine;
use crate::provision::deadlines::Deadlines;
use crate::sandbox::shared::Shared;

/// Moves the deadline `by` later; returns the new one.
pub(crate) async fn extend<E: ContainerEngine>(
    shared: &Shared<E>,
    by: Duration,
) -> Result<SystemTime> {
    let backend = shared.engine.backend();
    sandbox_core::policy::require(shared.caps, Capability::EXTEND_LIFETIME, backend)?;
    // Stopped: no agent runs to move the deadline in.
    shared.refuse_unless_running()?;
    // Another handle took the agent over (`sandbox exec` beside a session's holder):
    // the owner takes it back to move the deadline, as a fork does.
    crate::sandbox::agent::reclaim(shared).await?;
    let Some(agent) = shared.agent() else {
        return Err(SandboxError::unsupported(
            Capability::EXTEND_LIFETIME,
            backend,
        ));
    };
    // Past its deadline the sandbox is over, whatever the agent has yet to notice.
    shared.remaining()?;
    let to =
        sandbox_core::options::extended_deadline(shared.deadline(), shared.max_deadline, by, true)?;
    let secs = to.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let set = UNIX_EPOCH + Duration::from_secs(agent.set_deadline(secs).await?);
    *shared.deadline.lock().unwrap_or_else(|e| e.into_inner()) = set;
    shared.expiry.move_to(set);
    // For every other process on this host: the creator's timer (when this handle was
    // reattached), other reattached handles, a start that must hand it to a new agent.
    if let Err(e) = Deadlines::default().record(&shared.id, set) {
        if shared.network.is_none() {
            // Reattached: the creator's timer would end the sandbox at the old deadline.
            return Err(SandboxError::config(
                format!(
                    "the agent moved the deadline, but other processes on this host cannot learn it ({e}): the creating process would still end the sandbox at its old deadline"
                ),
                "run as a user that can write /run/sandbox-rs (root), or extend through the handle that created the sandbox",
            ));
        }
        tracing::warn!(sandbox_id = %shared.id, error = %e, "a moved deadline could not be recorded for other processes");
    }
    tracing::debug!(sandbox_id = %shared.id, deadline_unix = secs, "deadline moved");
    Ok(set)
}
