//! The state one sandbox's handle, processes, files, contexts and teardown share
//! ([`Shared`]), and the small questions every part asks of it: bounded engine calls,
//! time left, the environment of an exec, whether the container still runs.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use std::time::SystemTime;

use sandbox_agent::client::AgentClient;
use sandbox_core::teardown::OrphanInfo;
use sandbox_core::{Capability, IsolationTier, Result, Secret};

use crate::engine::ContainerEngine;
use crate::engine::EngineResult;
use crate::engine::transfer::bounded;
use crate::error;
use crate::provision::config::ContainerConfig;
use crate::provision::expiry::Expiry;
use crate::sandbox::context::ContextSlot;

/// State shared by a sandbox handle, its processes, files, contexts and teardown.
pub(crate) struct Shared<E> {
    pub engine: Arc<E>,
    pub config: Arc<ContainerConfig>,
    pub id: String,
    pub template: String,
    pub workdir: String,
    pub labels: BTreeMap<String, String>,
    /// The deadline in force: set at create, moved by `extend`.
    pub deadline: Mutex<SystemTime>,
    /// The latest deadline `extend` may set (`CreateOptions::max_lifetime` from create).
    pub max_deadline: SystemTime,
    pub tier: IsolationTier,
    pub caps: Capability,
    /// Injected into every user exec's environment, never into the container config.
    pub secrets: Vec<(String, Secret)>,
    /// Whether the template has the interpreter, by interpreter name (checked once).
    pub interpreters: Mutex<HashMap<String, bool>>,
    /// Persistent interpreters by context id.
    pub contexts: Mutex<HashMap<String, ContextSlot>>,
    /// The in-sandbox agent, when it is this container's PID 1 and answered its hello;
    /// `None` on the engine's exec path. Replaced by `start` (a restarted container has a
    /// new agent).
    pub agent: Mutex<Option<AgentClient>>,
    /// Paused (the engine's freezer) and not resumed since, as far as this handle knows:
    /// its teardown thaws the container before removing it.
    pub paused: AtomicBool,
    /// Stopped (`Sandbox::stop`, or found stopped by `connect`) and not started since.
    pub stopped: AtomicBool,
    /// What `start` re-applies into the restarted container's new network namespace;
    /// `None` on a reattached handle, which does not know the policy (it is not kept
    /// engine-side).
    pub network: Option<crate::sandbox::restart::NetworkPlan>,
    /// The host-side deadline timer; every removal through the handle cancels it.
    pub expiry: Expiry,
    /// How the sandbox was made, for its forks; `None` for a reattached handle (which
    /// does not know its secrets or spec, and so cannot fork).
    pub fork_base: Option<crate::sandbox::fork::ForkBase>,
    /// The container was started from a checkpoint (it was forked, or is a fork): it
    /// cannot be forked again (see `sandbox/fork.rs`), so it no longer declares
    /// `SNAPSHOT_FORK`.
    pub restored: AtomicBool,
    /// The ssh-agent forwarding of a sandbox created with `CreateOptions::ssh_agent`;
    /// taken (which ends its relay) at kill. Only the creating handle has one: the host
    /// agent and the selection are not kept engine-side.
    pub ssh_agent: Mutex<Option<crate::ssh_agent::Forwarding>>,
    /// The git gate of a sandbox created with `CreateOptions::git_repo`; taken (which
    /// closes it and forgets its token) at kill. Only the creating handle has one: the
    /// token is not kept engine-side.
    pub git_gate: Mutex<Option<crate::git_gate::Forwarding>>,
    /// The credentials proxy of a sandbox created with `CreateOptions::credential`;
    /// taken (which ends it, its listener and its connections) at kill. Only the
    /// creating handle has one: the secrets never leave that process.
    pub credentials: Mutex<Option<crate::credentials::Broker>>,
}

impl<E: ContainerEngine> Shared<E> {
    /// One engine call, bounded by the configured call timeout: a wedged engine fails the
    /// call instead of hanging it.
    pub(crate) async fn call<T>(
        &self,
        op: &str,
        fut: impl Future<Output = EngineResult<T>>,
    ) -> EngineResult<T> {
        bounded(self.config.call_timeout, op, fut).await
    }

    /// The capabilities this sandbox declares now: those it was made with, without
    /// `SNAPSHOT_FORK` once it was restored from a checkpoint.
    pub(crate) fn caps(&self) -> Capability {
        if self.restored.load(std::sync::atomic::Ordering::SeqCst) {
            self.caps.difference(Capability::SNAPSHOT_FORK)
        } else {
            self.caps
        }
    }

    /// What orphan warnings name.
    pub(crate) fn info(&self) -> OrphanInfo {
        OrphanInfo::new(self.id.clone(), self.engine.backend(), self.labels.clone())
    }

    /// The deadline in force: this handle's, or a later one another process's extension
    /// recorded on this host (never past the maximum).
    pub(crate) fn deadline(&self) -> SystemTime {
        let mut own = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(later) = crate::provision::deadlines::Deadlines::default()
            .recorded(&self.id, self.max_deadline)
            .filter(|r| *r > *own)
        {
            *own = later;
        }
        *own
    }

    /// Time left before the lifetime backstop; `SandboxGone` once it passed.
    pub(crate) fn remaining(&self) -> Result<Duration> {
        match self.deadline().duration_since(SystemTime::now()) {
            Ok(d) if !d.is_zero() => Ok(d),
            _ => Err(error::gone(&self.id)),
        }
    }

    /// The agent of the running container, if this handle talks to one.
    pub(crate) fn agent(&self) -> Option<AgentClient> {
        self.agent.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `SandboxStopped` or `SandboxPaused` while the container is known stopped or
    /// paused: a handle reattached to such a sandbox (its enforcement layer does not
    /// know) refuses at once instead of waiting on processes that are frozen or gone.
    pub(crate) fn refuse_unless_running(&self) -> Result<()> {
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            Err(sandbox_core::SandboxError::stopped(&self.id))
        } else if self.paused.load(std::sync::atomic::Ordering::SeqCst) {
            Err(sandbox_core::SandboxError::paused(&self.id))
        } else {
            Ok(())
        }
    }

    /// Secrets, the git gate's URLs (they hold its token, so they are never in the
    /// container's configuration either), plus per-call env (the container's own env is
    /// inherited by every exec).
    pub(crate) fn exec_env(&self, extra: &BTreeMap<String, String>) -> Vec<(String, String)> {
        let gate = self
            .git_gate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|g| g.env())
            .unwrap_or_default();
        self.secrets
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string()))
            .chain(gate)
            .chain(extra.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect()
    }

    /// Whether the container still runs or is paused, i.e. is not gone (a failed inspect
    /// counts as gone).
    pub(crate) async fn container_running(&self) -> bool {
        match self.call("inspect", self.engine.inspect(&self.id)).await {
            Ok(c) => c.is_running() || c.state == sandbox_core::SandboxState::Paused,
            Err(e) => {
                tracing::debug!(sandbox_id = %self.id, error = %e, "container check failed");
                false
            }
        }
    }
}
