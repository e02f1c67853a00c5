//! Stopping and starting a sandbox (`Sandbox::stop` / `Sandbox::start`): the engine ends
//! every process of the container and keeps the container (its files, id, labels), then
//! runs it again.
//!
//! An engine gives a restarted container a new network namespace (measured on Docker and
//! Podman), so nothing of the egress rules, the resolver's pinning or the loopback
//! forwarding survives a stop. `start` therefore re-establishes everything `create` did
//! after the engine's start, in the same order and before anything of the user's can run:
//! the `pre_start` and `post_start` hooks around the engine's start, the sandbox's network
//! policy loaded into the new namespace ([`apply_network_policy`]), a new host session with
//! the new agent (PID 1 again), and the engine's published ingress ports read again. Any
//! failure stops the container again: a sandbox never runs without its policy.
//!
//! What a stop loses: running commands (their streams end with `SandboxGone`) and the
//! interpreter contexts of `run_code` (their processes are gone; a later call starts a
//! fresh one). The lifetime keeps running while stopped (the host removes a stopped
//! sandbox past its deadline, see `provision/expiry.rs`).
//!
//! A handle reattached with `connect` does not know the egress policy (it is not kept
//! engine-side, only whether there is one: [`LABEL_EGRESS`]); it starts a sandbox without
//! network and refuses to start one whose rules it could not re-apply.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_core::{Capability, Egress, NetworkPolicy, Result, SandboxError, SandboxState};

use crate::engine::{ContainerEngine, EngineErrorKind, NetworkInfo};
use crate::error;
use crate::sandbox::shared::Shared;

/// Label saying whether a sandbox runs without network (`none`, egress `Deny`) or with
/// rules the container layer loads after every start (`rules`): what a reattached handle
/// needs to know before it may start the sandbox.
pub const LABEL_EGRESS: &str = "io.sandbox-rs.egress";

/// [`LABEL_EGRESS`] of a sandbox without network.
pub(crate) const EGRESS_NONE: &str = "none";
/// [`LABEL_EGRESS`] of a sandbox on the library network.
pub(crate) const EGRESS_RULES: &str = "rules";

/// The [`LABEL_EGRESS`] value for `policy`.
pub(crate) fn egress_label(policy: &NetworkPolicy) -> &'static str {
    if policy.egress == Egress::Deny {
        EGRESS_NONE
    } else {
        EGRESS_RULES
    }
}

/// How long the engine waits for the agent to end before it kills it: none. The agent does
/// not handle SIGTERM (as PID 1 it would not even receive it from inside), so any wait
/// would only delay the kill; what the processes wrote is on disk either way.
const STOP_GRACE: Duration = Duration::ZERO;

/// What the handle that created a sandbox re-applies after every start.
#[derive(Debug, Clone)]
pub(crate) struct NetworkPlan {
    /// The policy the sandbox was created with.
    pub policy: NetworkPolicy,
    /// The library network it runs on (egress `Allow`/`AllowList`), whose rules go into
    /// each new namespace.
    pub net: Option<NetworkInfo>,
}

/// Ends every process of the sandbox and keeps the container. A paused sandbox is thawed
/// first (a frozen container cannot be stopped under gVisor, and the freezer would hold
/// the kill). Stopping a stopped sandbox does nothing.
pub(crate) async fn stop<E: ContainerEngine>(shared: &Shared<E>) -> Result<()> {
    let eng = &*shared.engine;
    sandbox_core::policy::require(shared.caps, Capability::STOP_START, eng.backend())?;
    let id = shared.id.as_str();
    let state = state_of(shared).await?;
    if state == SandboxState::Stopped {
        forget_processes(shared);
        return Ok(());
    }
    if state == SandboxState::Paused || shared.paused.load(Ordering::SeqCst) {
        crate::sandbox::freeze::set_paused(shared, false).await?;
    }
    match shared.call("stop", eng.stop(id, STOP_GRACE)).await {
        Ok(()) => {}
        Err(e) if e.kind == EngineErrorKind::NotFound => return Err(error::gone(id).with_source(e)),
        // Stopped meanwhile (by its deadline, by hand): what counts is the state now.
        Err(e) => {
            if state_of(shared).await? != SandboxState::Stopped {
                return Err(error::on_sandbox(eng, id, "stop", e));
            }
        }
    }
    forget_processes(shared);
    tracing::debug!(sandbox_id = %id, "sandbox stopped");
    Ok(())
}

/// Runs a stopped sandbox again and re-establishes what `create` established after the
/// engine's start. Starting a running sandbox does nothing.
pub(crate) async fn start<E: ContainerEngine>(shared: &Shared<E>) -> Result<()> {
    let eng = &*shared.engine;
    sandbox_core::policy::require(shared.caps, Capability::STOP_START, eng.backend())?;
    let id = shared.id.as_str();
    // Past its deadline the sandbox is over (the host removes it), stopped or not.
    shared.remaining()?;
    match state_of(shared).await? {
        SandboxState::Stopped => {}
        SandboxState::Paused => return Err(SandboxError::paused(id)),
        _ if !shared.stopped.load(Ordering::SeqCst) => return Ok(()),
        // Started by another handle, which re-applied what it knows; this one only needs a
        // way in again.
        _ => {
            shared.stopped.store(false, Ordering::SeqCst);
            return Ok(());
        }
    }
    refuse_unknown_policy(shared)?;
    let hooks = eng.hooks();
    let event = crate::spec::hooks::HookEvent::new(id, &shared.template);
    if let Err(e) = hooks.run_pre_start(&event).await {
        return Err(error::on_sandbox(eng, id, "pre_start hook", e));
    }
    if let Err(e) = shared.call("start", eng.start(id)).await {
        return Err(match e.kind {
            EngineErrorKind::NotFound => error::gone(id).with_source(e),
            _ => error::on_sandbox(eng, id, "start", e),
        });
    }
    let established = async {
        hooks
            .run_post_start(&event)
            .await
            .map_err(|e| error::on_sandbox(eng, id, "post_start hook", e))?;
        apply_network_policy(shared).await?;
        follow_credentials_proxy(shared).await?;
        reconnect_agent(shared).await
    };
    if let Err(e) = established.await {
        // Never left running without its policy or its agent: stopped again, as it was.
        if let Err(s) = shared.call("stop", eng.stop(id, STOP_GRACE)).await {
            tracing::warn!(sandbox_id = %id, error = %s, "stopping a sandbox whose start failed failed");
        }
        return Err(e);
    }
    shared.stopped.store(false, Ordering::SeqCst);
    tracing::debug!(sandbox_id = %id, exec_path = %shared.exec_path(), "sandbox started");
    Ok(())
}

/// The creating handle's credentials proxy answers the addresses the container has now
/// (the engine may give a started container new ones); the rules loaded again already
/// redirect to its port, which outlives a stop.
async fn follow_credentials_proxy<E: ContainerEngine>(shared: &Shared<E>) -> Result<()> {
    if shared
        .credentials
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_none()
    {
        return Ok(());
    }
    let eng = &*shared.engine;
    let info = shared
        .call("inspect", eng.inspect(&shared.id))
        .await
        .map_err(|e| error::on_sandbox(eng, &shared.id, "inspect", e))?;
    if let Some(b) = shared
        .credentials
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
    {
        b.set_sources(info.addresses);
    }
    Ok(())
}

/// Loads the sandbox's egress policy into the network namespace the container runs in
/// now. Without network (egress `Deny`) there is nothing to load: the engine gives the new
/// namespace only a loopback interface, as at create.
pub(crate) async fn apply_network_policy<E: ContainerEngine>(shared: &Shared<E>) -> Result<()> {
    // The policy in force now, as this host records it: the one of create, or the last
    // `set_egress` from any handle or process.
    if crate::egress::recorded(&shared.id) {
        return crate::egress::apply_current(&*shared.engine, &shared.id).await;
    }
    let Some(plan) = &shared.network else {
        // A reattached handle: only a sandbox without network gets here.
        return Ok(());
    };
    match &plan.net {
        Some(net) => {
            crate::egress::apply(&*shared.engine, &shared.id, &plan.policy, net, None).await
        }
        None => Ok(()),
    }
}

/// A reattached handle (no [`NetworkPlan`]) starts only a sandbox labelled as running
/// without network: the rules of any other could not be re-applied.
fn refuse_unknown_policy<E: ContainerEngine>(shared: &Shared<E>) -> Result<()> {
    if shared.network.is_some()
        || crate::egress::recorded(&shared.id)
        || shared.labels.get(LABEL_EGRESS).map(String::as_str) == Some(EGRESS_NONE)
    {
        return Ok(());
    }
    Err(SandboxError::config(
        format!(
            "sandbox `{}` runs with egress rules this reattached handle does not know, so it cannot re-apply them after a start",
            shared.id
        ),
        "start it through the handle that created it (the process holding the session), or kill it and create a new one",
    ))
}

/// A new host session with the agent the engine just started, when this handle had one:
/// it is PID 1 again. The agent starts with the deadline of create (its command line), so
/// it is given the deadline in force when an extension moved it (by this handle, or by
/// any process on this host: `provision/deadlines.rs`).
async fn reconnect_agent<E: ContainerEngine>(shared: &Shared<E>) -> Result<()> {
    if !shared.caps.contains(Capability::AGENT) {
        return Ok(());
    }
    let client = crate::sandbox::agent::connect(
        &*shared.engine,
        &shared.id,
        shared.config.call_timeout,
        crate::sandbox::agent::Session::First,
    )
    .await
    .map_err(|reason| {
        SandboxError::creation(
            shared.engine.backend(),
            format!("the restarted sandbox's agent did not answer: {reason}"),
        )
    })?;
    // Whichever handle starts it, the creating one or one reattached in another process:
    // the deadline in force includes an extension recorded on this host by any of them.
    let deadline = shared.deadline();
    if labelled_deadline(&shared.labels).is_some_and(|d| deadline > d) {
        let secs = deadline
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        client.set_deadline(secs).await?;
    }
    // The socket went with the old agent: the new one opens it again.
    crate::ssh_agent::Forwarding::resume(&shared.ssh_agent, &client, &shared.id).await?;
    crate::git_gate::Forwarding::resume(&shared.git_gate, &client).await?;
    shared.expiry.watch_session(&client);
    *shared.agent.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
    Ok(())
}

fn labelled_deadline(labels: &BTreeMap<String, String>) -> Option<SystemTime> {
    let secs: u64 = labels
        .get(sandbox_core::labels::LABEL_DEADLINE)?
        .parse()
        .ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

/// The container's state; `SandboxGone` when the engine no longer has it.
async fn state_of<E: ContainerEngine>(shared: &Shared<E>) -> Result<SandboxState> {
    match shared
        .call("inspect", shared.engine.inspect(&shared.id))
        .await
    {
        Ok(c) => Ok(c.state),
        Err(e) if e.kind == EngineErrorKind::NotFound => {
            Err(error::gone(&shared.id).with_source(e))
        }
        Err(e) => Err(error::on_sandbox(&*shared.engine, &shared.id, "inspect", e)),
    }
}

/// The stopped container's processes are gone: its agent session and interpreter
/// contexts with them.
fn forget_processes<E: ContainerEngine>(shared: &Shared<E>) {
    shared.stopped.store(true, Ordering::SeqCst);
    shared.paused.store(false, Ordering::SeqCst);
    *shared.agent.lock().unwrap_or_else(|e| e.into_inner()) = None;
    shared
        .contexts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
}
