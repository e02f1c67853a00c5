//! Forks with memory (`Sandbox::fork`): new sandboxes that continue the processes,
//! interpreter contexts and files of a running one from one instant, each a container of
//! its own; the original goes on.
//!
//! The order, and why:
//! 1. The interpreters are held (their slots locked, so no `run_code` is in flight) and
//!    the agent is asked to keep them across the next takeover (protocol 4).
//! 2. The fork containers are created from the original's spec, each with its own name,
//!    deadline label, metadata and teardown guard — before the original stops, so its
//!    pause is as short as possible.
//! 3. The engine checkpoints the original, which stops it (an engine cannot leave it
//!    running here: see the Docker adapter's `checkpoint.rs`), and gives each fork the
//!    original's files and the checkpoint while nothing writes to them.
//! 4. The original starts again from the checkpoint; its handle takes the restored agent
//!    over (the checkpoint ended the old attach), adopts its interpreters and sets its
//!    deadline again (the restored agent's clock for it is the monotonic one, which did
//!    not run while the container was down).
//! 5. Each fork starts from the checkpoint; a new session takes its agent over, adopts
//!    the same interpreters and sets the fork's own deadline. Steps 4 and 5 run
//!    concurrently: each is a restore of its own from the same checkpoint.
//!
//! Nothing is left behind: a fork container is owned by its guard until its sandbox
//! exists (any failure or a dropped call removes it), and the checkpoint lives in the
//! original's container (removed here in every outcome, and with the container by the
//! engine); each fork's copy is removed once it started, and with it otherwise.
//!
//! Only where the agent runs (it is the host's way back into a restored sandbox) and on
//! an engine that can checkpoint; not on the library's network, whose rules a restored
//! fork's processes would run before they could be loaded; and once per sandbox: a
//! container started from a checkpoint (the original after its fork, each fork) cannot
//! be checkpointed again without leaking host state under runsc 2022-12 (measured:
//! `invalid state transition: paused => stopped`, its runsc state, cgroups and task
//! directory left behind, the next restore refused with "id already in use"), so it no
//! longer declares `SNAPSHOT_FORK`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_agent::client::AgentClient;
use sandbox_core::labels::{LABEL_DEADLINE, LABEL_FORK_OF, LABEL_META_PREFIX};
use sandbox_core::teardown::{OrphanInfo, TeardownGuard};
use sandbox_core::{Capability, ForkOptions, Result, SandboxError};

use crate::engine::{ContainerEngine, ContainerSpec, EngineErrorKind, NetworkMode};
use crate::error;
use crate::provision::expiry::Upkeep;
use crate::provision::teardown::container_killer;
use crate::sandbox::ContainerSandbox;
use crate::sandbox::agent::Session;
use crate::sandbox::context::{CodeContext, ContextSlot};
use crate::sandbox::ingress::Ingress;
use crate::sandbox::shared::Shared;

/// Why a sandbox restored from a checkpoint cannot be forked again.
const RESTORED_ONCE: &str = "this sandbox was started from a checkpoint (it was forked, or is a \
     fork): gVisor (runsc 2022-12) cannot checkpoint a restored sandbox cleanly — it fails with \
     'invalid state transition: paused => stopped' and leaves its state, cgroups and task \
     directory on the host, and the next start is refused ('id already in use'). Fork a \
     sandbox once, asking for every fork needed at once (ForkOptions::new(n))";

/// What a sandbox keeps so it can be forked: how it was made.
#[derive(Clone)]
pub(crate) struct ForkBase {
    /// The spec its container was created from.
    pub spec: ContainerSpec,
    /// The ingress ports it was asked for (each fork gets its own).
    pub ingress_ports: Vec<u16>,
    /// The backend's timers: each fork gets a deadline timer of its own.
    pub upkeep: Arc<Upkeep>,
}

/// `caps` as a sandbox with (or without) `agent` and a `base` can declare them:
/// `SNAPSHOT_FORK` only with an agent that keeps processes across a takeover, a base to
/// fork from, and no library network.
pub(crate) fn instance_caps(
    caps: Capability,
    agent: Option<&AgentClient>,
    base: Option<&ForkBase>,
) -> Capability {
    let can = agent.is_some_and(|a| a.version() >= sandbox_agent::protocol::FORK_VERSION)
        && base.is_some_and(|b| b.spec.network == NetworkMode::None);
    if can {
        caps
    } else {
        caps.difference(Capability::SNAPSHOT_FORK)
    }
}

/// A checkpoint name no other fork of this process uses.
fn checkpoint_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "sbx-fork-{}-{}",
        sandbox_core::labels::session_id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whole Unix seconds of `t`, rounded up (a deadline is never earlier than asked).
pub(crate) fn unix_secs_up(t: SystemTime) -> u64 {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Forks the sandbox of `sh` `options.count` times.
pub(crate) async fn fork<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    options: ForkOptions,
) -> Result<Vec<ContainerSandbox<E>>> {
    let backend = sh.engine.backend();
    if sh.restored.load(Ordering::SeqCst) && sh.caps.contains(Capability::SNAPSHOT_FORK) {
        return Err(
            SandboxError::unsupported(Capability::SNAPSHOT_FORK, backend).with_source(
                crate::engine::EngineError::new(EngineErrorKind::InvalidRequest, RESTORED_ONCE),
            ),
        );
    }
    sandbox_core::policy::require(sh.caps(), Capability::SNAPSHOT_FORK, backend)?;
    if sh.fork_base.is_some() {
        crate::sandbox::agent::reclaim(sh).await?;
    }
    let (Some(base), Some(agent)) = (sh.fork_base.as_ref(), sh.agent()) else {
        return Err(SandboxError::unsupported(
            Capability::SNAPSHOT_FORK,
            backend,
        ));
    };
    if let Err(why) = sh.engine.fork_support() {
        return Err(
            SandboxError::unsupported(Capability::SNAPSHOT_FORK, backend).with_source(
                crate::engine::EngineError::new(EngineErrorKind::InvalidRequest, why),
            ),
        );
    }
    options.validate()?;
    sh.refuse_unless_running()?;
    sh.remaining()?;
    let deadline = match options.timeout {
        Some(t) => UNIX_EPOCH + Duration::from_secs(unix_secs_up(SystemTime::now() + t)),
        None => sh.deadline(),
    };
    if deadline > sh.max_deadline {
        return Err(error::limit(
            format!(
                "the original sandbox's maximum lifetime (a fork's deadline cannot pass {} \
                 Unix seconds)",
                unix_secs_up(sh.max_deadline)
            ),
            "ask for a shorter ForkOptions::timeout, or create the original with a longer \
             CreateOptions::max_lifetime",
        ));
    }
    // 1. No interpreter is mid-request while the original is checkpointed; the agent
    // keeps each one for the sessions that take the restored copies over.
    let slots: Vec<(String, ContextSlot)> = sh
        .contexts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut held = Vec::with_capacity(slots.len());
    for (name, slot) in &slots {
        held.push((name.clone(), slot.clone().lock_owned().await));
    }
    let kept: Vec<(String, u32)> = held
        .iter()
        .filter_map(|(name, g)| {
            g.as_ref()
                .and_then(|c| c.agent_id)
                .map(|id| (name.clone(), id))
        })
        .collect();
    agent.keep(kept.iter().map(|(_, id)| *id).collect()).await?;
    // 2. The fork containers, each owned by its guard from the moment it exists.
    let mut forks = Vec::with_capacity(options.count);
    for _ in 0..options.count {
        let spec = fork_spec(&base.spec, &sh.id, deadline, &options.metadata);
        let info = OrphanInfo::new(spec.name.clone(), backend, spec.labels.clone());
        let id = sh
            .call("create", sh.engine.create(&spec))
            .await
            .map_err(|e| error::on_create(&*sh.engine, &spec.image, "create fork container", e))?;
        let guard = TeardownGuard::new(
            info,
            container_killer(sh.engine.clone(), sh.config.call_timeout, id.clone()),
        );
        forks.push((id, spec, guard));
    }
    let checkpoint = checkpoint_name();
    let made = restore_all(sh, &agent, &checkpoint, &forks, &kept, deadline).await;
    // The original's checkpoint, whatever happened (the engine also removes it with the
    // container).
    if let Err(e) = sh
        .call(
            "remove checkpoint",
            sh.engine.remove_checkpoint(&sh.id, &checkpoint),
        )
        .await
    {
        tracing::warn!(sandbox_id = %sh.id, error = %e, "could not remove the fork's checkpoint");
    }
    let clients = match made {
        Ok(c) => c,
        Err(e) => {
            // The checkpoint may not have been taken: the old session must not carry its
            // interpreters over to a later reattach that would not adopt them.
            if !agent.is_gone() {
                let _ = agent.keep(Vec::new()).await;
            }
            return Err(e);
        }
    };
    // 4 (the original's side). Its interpreters continue on the new session. The old
    // session's handles are dropped only once it is over (its attach ended with the
    // checkpoint, or the new session's marker shut it out): a kill their drop sends must
    // never reach the agent, where the adopted interpreter now has the same id.
    let until = tokio::time::Instant::now() + sh.config.call_timeout;
    while !agent.is_gone() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (client, adopted) = clients.original;
    for (name, mut g) in held {
        let Some(ctx) = g.take() else { continue };
        match adopted.iter().find(|(n, _)| n == &name) {
            Some((_, c)) => {
                drop(ctx);
                *g = Some(c.take_for(backend, &client).await?);
            }
            // Started on the engine's exec path: it did not survive the checkpoint.
            None => drop(ctx),
        }
    }
    // The takeover closed the socket the old session had opened; the original's goes on.
    crate::ssh_agent::Forwarding::resume(&sh.ssh_agent, &client, &sh.id).await?;
    crate::git_gate::Forwarding::resume(&sh.git_gate, &client).await?;
    sh.expiry.watch_session(&client);
    *sh.agent.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
    sh.restored.store(true, Ordering::SeqCst);
    // 5 (the forks' side). Each becomes a sandbox of its own.
    let mut out = Vec::with_capacity(forks.len());
    for ((id, spec, guard), client) in forks.into_iter().zip(clients.forks) {
        out.push(sandbox_of(sh, base, id, spec, guard, client, &kept, deadline).await?);
    }
    Ok(out)
}

/// The new sessions of a fork: the original's and each fork's, after their restore.
struct Restored {
    original: (AgentClient, Vec<(String, Adoptable)>),
    forks: Vec<AgentClient>,
}

/// An interpreter a new session can adopt.
struct Adoptable(u32);

impl Adoptable {
    async fn take_for(&self, backend: &str, client: &AgentClient) -> Result<CodeContext> {
        let p = client.adopt(self.0, true).await?;
        CodeContext::of_agent(backend, p, client)
    }
}

/// Steps 3 to 5's engine work: checkpoint, copies, the original's restore and takeover,
/// each fork's start and takeover.
async fn restore_all<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    agent: &AgentClient,
    checkpoint: &str,
    forks: &[(String, ContainerSpec, TeardownGuard)],
    kept: &[(String, u32)],
    fork_deadline: SystemTime,
) -> Result<Restored> {
    let eng = &*sh.engine;
    let id = sh.id.as_str();
    let on = |op: &str, e| error::on_sandbox(eng, id, op, e);
    sh.call("checkpoint", eng.checkpoint(id, checkpoint))
        .await
        .map_err(|e| on("checkpoint the sandbox", e))?;
    // The engine finishes the stop after it answered (Docker: the runtime's exit event);
    // a restore before that is refused ("id already in use").
    stopped(sh, id).await?;
    // From here the original is stopped: it is started again whatever else fails.
    let mut copied = Ok(());
    for (fork, _, _) in forks {
        copied = sh
            .call("copy for fork", eng.copy_for_fork(id, checkpoint, fork))
            .await
            .map_err(|e| on("give a fork the sandbox's files and checkpoint", e));
        if copied.is_err() {
            break;
        }
    }
    // The original's restore and the forks' starts are independent runtime work (each
    // a restore from the same checkpoint): done concurrently, a fork costs one restore's
    // time instead of one per sandbox. The original is restored whatever the forks do.
    let original = async {
        sh.call("restore", eng.start_from_checkpoint(id, checkpoint))
            .await
            .map_err(|e| on("start the sandbox again from its checkpoint", e))?;
        resume_session(sh, id, agent, kept, sh.deadline()).await
    };
    let started = async {
        copied?;
        let starts = forks.iter().map(|(fork, _, _)| async move {
            let on = |op: &str, e| error::on_sandbox(eng, fork, op, e);
            sh.call("start fork", eng.start_from_checkpoint(fork, checkpoint))
                .await
                .map_err(|e| on("start a fork from the checkpoint", e))?;
            let (client, _) = resume_session(sh, fork, agent, kept, fork_deadline).await?;
            if let Err(e) = sh
                .call("remove checkpoint", eng.remove_checkpoint(fork, checkpoint))
                .await
            {
                tracing::debug!(sandbox_id = %fork, error = %e, "a fork's checkpoint copy stays until it is removed");
            }
            Ok::<_, SandboxError>(client)
        });
        futures::future::join_all(starts)
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()
    };
    let (original, clients) = tokio::join!(original, started);
    let (original, clients) = (original?, clients?);
    Ok(Restored {
        original,
        forks: clients,
    })
}

/// Waits (bounded by the call timeout) until the engine reports container `id` stopped.
async fn stopped<E: ContainerEngine>(sh: &Shared<E>, id: &str) -> Result<()> {
    let until = tokio::time::Instant::now() + sh.config.call_timeout;
    loop {
        let info = sh
            .call("inspect", sh.engine.inspect(id))
            .await
            .map_err(|e| {
                error::on_sandbox(&*sh.engine, id, "inspect the checkpointed sandbox", e)
            })?;
        if info.state == sandbox_core::SandboxState::Stopped {
            return Ok(());
        }
        if tokio::time::Instant::now() >= until {
            return Err(error::internal(
                sh.engine.backend(),
                format!("the checkpointed sandbox {id} did not stop within the call timeout"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes over the restored agent of container `id`, which ends at `deadline` from now on;
/// the kept interpreters, ready to adopt.
async fn resume_session<E: ContainerEngine>(
    sh: &Shared<E>,
    id: &str,
    old: &AgentClient,
    kept: &[(String, u32)],
    deadline: SystemTime,
) -> Result<(AgentClient, Vec<(String, Adoptable)>)> {
    let client =
        crate::sandbox::agent::connect(&*sh.engine, id, sh.config.call_timeout, Session::TakeOver)
            .await
            .map_err(|reason| {
                error::internal(
                    sh.engine.backend(),
                    format!(
                        "the restored sandbox {id}'s agent did not take a new session: {reason}"
                    ),
                )
            })?;
    if client.version() < old.version() {
        return Err(error::internal(
            sh.engine.backend(),
            "the restored agent speaks an older protocol than before the checkpoint",
        ));
    }
    let secs = unix_secs_up(deadline);
    client.set_deadline(secs).await?;
    let adoptable = kept
        .iter()
        .map(|(name, id)| (name.clone(), Adoptable(*id)))
        .collect();
    Ok((client, adoptable))
}

/// The spec of a fork of `original`: its own name, deadline and metadata, the original's
/// everything else (image, command, limits, mounts, network, agent).
fn fork_spec(
    base: &ContainerSpec,
    original: &str,
    deadline: SystemTime,
    metadata: &BTreeMap<String, String>,
) -> ContainerSpec {
    let mut spec = base.clone();
    spec.name = crate::provision::create::container_name();
    spec.labels.insert(
        LABEL_DEADLINE.to_string(),
        unix_secs_up(deadline).to_string(),
    );
    spec.labels
        .insert(LABEL_FORK_OF.to_string(), original.to_string());
    for (k, v) in metadata {
        spec.labels
            .insert(format!("{LABEL_META_PREFIX}{k}"), v.clone());
    }
    spec
}

/// A started, taken-over fork as a sandbox: the original's secrets, limits and
/// capabilities, its own id, labels, deadline timer, ingress and interpreters.
#[allow(clippy::too_many_arguments)]
async fn sandbox_of<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    base: &ForkBase,
    id: String,
    spec: ContainerSpec,
    guard: TeardownGuard,
    client: AgentClient,
    kept: &[(String, u32)],
    deadline: SystemTime,
) -> Result<ContainerSandbox<E>> {
    let backend = sh.engine.backend();
    let mut contexts = HashMap::new();
    for (name, agent_id) in kept {
        let ctx = Adoptable(*agent_id).take_for(backend, &client).await?;
        contexts.insert(
            name.clone(),
            Arc::new(tokio::sync::Mutex::new(Some(ctx))) as ContextSlot,
        );
    }
    let expiry = base.upkeep.arm(
        &sh.engine,
        sh.config.call_timeout,
        &id,
        deadline,
        sh.max_deadline,
    );
    let fork_base = ForkBase {
        spec: spec.clone(),
        ..base.clone()
    };
    let shared = Arc::new(Shared {
        engine: sh.engine.clone(),
        config: sh.config.clone(),
        id,
        template: sh.template.clone(),
        workdir: sh.workdir.clone(),
        labels: spec.labels.clone(),
        deadline: Mutex::new(deadline),
        max_deadline: sh.max_deadline,
        tier: sh.tier,
        caps: sh.caps,
        secrets: sh.secrets.clone(),
        interpreters: Mutex::new(
            sh.interpreters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        ),
        contexts: Mutex::new(contexts),
        agent: Mutex::new(Some(client).inspect(|a| expiry.watch_session(a))),
        paused: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        // Forks run without the library's network (refused above), as their original.
        network: sh.network.clone(),
        expiry,
        fork_base: Some(fork_base),
        restored: AtomicBool::new(true),
        ssh_agent: Mutex::new(None),
        git_gate: Mutex::new(None),
        credentials: Mutex::new(None),
    });
    let ports = &base.ingress_ports;
    let ingress = if ports.is_empty() {
        Ingress::default()
    } else {
        crate::sandbox::ingress::forward(&shared, ports).await?
    };
    Ok(ContainerSandbox::new(shared, guard, ingress))
}
