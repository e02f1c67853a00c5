//! `ContainerBackend`: create, connect, list and kill managed sandboxes on any engine.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sandbox_core::labels::{LABEL_BACKEND, LABEL_MANAGED, metadata_filter};
use sandbox_core::teardown::{OrphanInfo, TeardownGuard};
use sandbox_core::{
    Backend, Capability, CreateOptions, EngineReport, IsolationTier, ManagedSandbox, Problem,
    ReapableBackend, Result, Sandbox, SandboxError, Snapshot, async_trait,
};

use crate::engine::transfer::bounded;
use crate::engine::{ContainerEngine, ContainerInfo, EngineErrorKind};
use crate::error;
use crate::provision::config::ContainerConfig;
use crate::provision::expiry::{Expiry, Upkeep};
use crate::provision::sweep::Sweep;
use crate::provision::teardown::{container_killer, remove_in_state};
use crate::sandbox::ContainerSandbox;
use crate::sandbox::ingress::Ingress;
use crate::sandbox::shared::Shared;
use crate::spec::runtime::{LABEL_RUNTIME, Runtime};

/// What the container layer implements; a sandbox declares this intersected with the
/// engine's [`ContainerEngine::capabilities`].
pub const LAYER_CAPABILITIES: Capability = Capability::RUN_COMMAND
    .union(Capability::RUN_CODE)
    .union(Capability::STATEFUL_CODE)
    .union(Capability::STREAMING)
    .union(Capability::FILESYSTEM)
    .union(Capability::UPLOAD_DOWNLOAD)
    .union(Capability::NETWORK_POLICY)
    .union(Capability::INGRESS_PORTS)
    .union(Capability::STDIN);

/// The container backend on engine `E`. Cheap to clone (one shared engine).
pub struct ContainerBackend<E: ContainerEngine> {
    pub(super) engine: Arc<E>,
    pub(super) config: Arc<ContainerConfig>,
    /// Set once a create with the agent bind-mounted failed where the same create with
    /// the agent uploaded worked (the engine does not see this host's files): from then
    /// on this backend uploads.
    pub(super) agent_mount_failed: Arc<AtomicBool>,
    /// The deadline timers and the periodic sweep; they end when the last clone drops.
    pub(super) upkeep: Arc<Upkeep>,
}

impl<E: ContainerEngine> Clone for ContainerBackend<E> {
    fn clone(&self) -> Self {
        ContainerBackend {
            engine: self.engine.clone(),
            config: self.config.clone(),
            agent_mount_failed: self.agent_mount_failed.clone(),
            upkeep: self.upkeep.clone(),
        }
    }
}

impl<E: ContainerEngine> std::fmt::Debug for ContainerBackend<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerBackend")
            .field("engine", &self.engine)
            .field("default_template", &self.config.default_template)
            .finish()
    }
}

impl<E: ContainerEngine> ContainerBackend<E> {
    /// A backend on `engine`. Runs the startup sweep when the config asks for it (its
    /// failures are logged, never fatal), then starts the periodic sweep
    /// ([`ContainerConfig::sweep_interval`]) on the current tokio runtime; it and every
    /// sandbox's deadline timer end when the last clone of this backend drops.
    pub async fn new(engine: E, config: ContainerConfig) -> Self {
        let b = ContainerBackend {
            engine: Arc::new(engine),
            config: Arc::new(config),
            agent_mount_failed: Arc::new(AtomicBool::new(false)),
            upkeep: Arc::new(Upkeep::default()),
        };
        if b.config.startup_sweep {
            b.sweep().await;
        }
        b.upkeep
            .start_sweeps(&b.engine, b.config.call_timeout, b.config.sweep_interval);
        b
    }

    /// A backend on another value of the engine (one carrying per-create options) that
    /// shares this one's configuration, deadline timers and periodic sweep: its sandboxes'
    /// timers end with this backend, and it starts no sweep of its own.
    pub fn sibling(&self, engine: E) -> Self {
        ContainerBackend {
            engine: Arc::new(engine),
            config: self.config.clone(),
            agent_mount_failed: self.agent_mount_failed.clone(),
            upkeep: self.upkeep.clone(),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<E> {
        &self.engine
    }

    /// The configuration in effect.
    pub fn config(&self) -> &ContainerConfig {
        &self.config
    }

    pub(super) fn caps(&self) -> Capability {
        // GPU is the engine's alone (devices in its create body, e.g. Podman's CDI names):
        // passed through when the engine declares it.
        // So is DISK_LIMIT (a read-only root and sized scratch mounts in its create body).
        // And PAUSE_RESUME (the engine's freezer, see `ContainerEngine::pause`),
        // SNAPSHOT (its export and import, see `crate::snapshot`), STOP_START (its stop
        // and start, see `crate::sandbox::restart`), and SNAPSHOT_FORK (its checkpoints,
        // see `crate::sandbox::fork`; declared only beside the agent).
        let mut caps = (LAYER_CAPABILITIES
            | Capability::GPU
            | Capability::PAUSE_RESUME
            | Capability::STOP_START
            | Capability::SNAPSHOT
            | Capability::SNAPSHOT_FORK
            | Capability::EGRESS_ALLOWLIST
            | Capability::LIVE_EGRESS
            | Capability::HOST_PORTS
            | Capability::CREDENTIALS
            | Capability::DISK_LIMIT)
            & self.engine.capabilities();
        // Declared only where the rules can really be loaded (see egress/mod.rs); a live
        // change replaces those rules, so it goes with them, and so do host ports (a rule
        // of the same table), and brokered credentials (the redirect to the proxy).
        if !crate::egress::allowlist_available(&*self.engine) {
            caps.remove(
                Capability::EGRESS_ALLOWLIST
                    | Capability::LIVE_EGRESS
                    | Capability::HOST_PORTS
                    | Capability::CREDENTIALS,
            );
        }
        caps
    }

    pub(super) async fn call<T>(
        &self,
        op: &str,
        fut: impl std::future::Future<Output = crate::engine::EngineResult<T>>,
    ) -> crate::engine::EngineResult<T> {
        bounded(self.config.call_timeout, op, fut).await
    }

    /// Removes managed containers this backend's engine holds whose owner is proven gone,
    /// or that are past their deadline by more than [`SWEEP_PAST_DEADLINE`] (owner alive
    /// or not: the stricter of the two behaviours the adapters had). Only containers with
    /// this crate's provenance (our name prefix and this backend's label) are touched.
    pub async fn sweep(&self) -> usize {
        crate::provision::sweep::sweep(&*self.engine, self.config.call_timeout, Sweep::Startup)
            .await
    }

    /// Arms the host-side deadline timer of container `id` ([`DEADLINE_GRACE`] after
    /// `deadline`, the labelled one where it parses; a deadline recorded on this host
    /// later, up to `max`, moves it).
    ///
    /// [`DEADLINE_GRACE`]: crate::provision::expiry::DEADLINE_GRACE
    pub(crate) fn arm_expiry(&self, id: &str, deadline: SystemTime, max: SystemTime) -> Expiry {
        self.upkeep
            .arm(&self.engine, self.config.call_timeout, id, deadline, max)
    }

    pub(crate) async fn list_raw(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<ContainerInfo>> {
        let mut filter = metadata_filter(labels);
        filter.insert(LABEL_MANAGED.to_string(), "true".to_string());
        self.call("list", self.engine.list(&filter))
            .await
            .map_err(|e| error::engine(&*self.engine, "list containers", e))
    }

    /// Removes a managed container (`kill_managed`), thawing it first when paused.
    pub(crate) async fn remove(&self, id: &str) -> Result<()> {
        let state = match self.call("inspect", self.engine.inspect(id)).await {
            Ok(c) => c.state,
            Err(_) => sandbox_core::SandboxState::Unknown,
        };
        remove_in_state(&*self.engine, self.config.call_timeout, id, state).await
    }

    async fn connect_sandbox(&self, id: &str) -> Result<ContainerSandbox<E>> {
        let eng = &*self.engine;
        if id.is_empty() || id.len() > 256 || id.contains('/') || id.chars().any(|c| c.is_control())
        {
            return Err(error::connect(id, "not a container id", None));
        }
        let c = match self.call("inspect", eng.inspect(id)).await {
            Ok(c) => c,
            Err(e)
                if matches!(
                    e.kind,
                    EngineErrorKind::Unavailable | EngineErrorKind::Timeout
                ) =>
            {
                return Err(error::unavailable(eng, e));
            }
            Err(e) if e.kind == EngineErrorKind::NotFound => {
                return Err(error::connect(id, "no such sandbox", Some(e)));
            }
            Err(e) => return Err(error::connect(id, "inspecting the sandbox failed", Some(e))),
        };
        if c.labels.get(LABEL_MANAGED).map(String::as_str) != Some("true") {
            return Err(error::connect(
                id,
                "not a sandbox managed by sandbox-rs",
                None,
            ));
        }
        if c.labels
            .get(LABEL_BACKEND)
            .is_some_and(|b| b != eng.backend())
        {
            return Err(error::connect(id, "a sandbox of another backend", None));
        }
        // Engine labels cannot follow a moved deadline: every extension records it on
        // this host (`deadlines.rs`), so this handle's checks, inherited timeouts and
        // extensions count from the deadline in force. Without a record (never
        // extended, or by a build that did not record) the labelled one is all there is
        // for those, while the host-side timer and the check below count from the latest
        // deadline the sandbox can reach: a reattached handle never removes a sandbox its
        // creator may have extended.
        let latest = sandbox_core::labels::latest_deadline(&c.labels)
            .map(|d| SystemTime::UNIX_EPOCH + Duration::from_secs(d))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let recorded = self.upkeep.deadlines().recorded(&c.id, latest);
        let deadline = recorded
            .or_else(|| labelled_unix(&c.labels, sandbox_core::labels::LABEL_DEADLINE))
            .unwrap_or(latest)
            .min(latest);
        // A paused or stopped sandbox is reattached too: its handle can resume, start or
        // kill it.
        let stopped = c.state == sandbox_core::SandboxState::Stopped;
        let up = c.is_running() || c.state == sandbox_core::SandboxState::Paused || stopped;
        if !up || recorded.unwrap_or(latest) <= SystemTime::now() {
            return Err(error::connect(
                id,
                "the sandbox is not running (stopped or past its lifetime)",
                None,
            ));
        }
        let tier = c
            .labels
            .get(LABEL_RUNTIME)
            .and_then(|r| Runtime::parse(r))
            .map(Runtime::tier)
            .unwrap_or_else(|| eng.tier());
        // Refused before the agent is taken over: a takeover ends the owner's session, and
        // under gVisor the handle dropped after a refusal would end the agent with it.
        if tier != eng.tier() {
            return Err(error::connect(
                id,
                format!(
                    "sandbox reports isolation tier `{tier}` but this backend declares `{}`; \
                     connect through a backend configured for its runtime ({})",
                    eng.tier(),
                    c.labels
                        .get(LABEL_RUNTIME)
                        .map_or("unknown", String::as_str),
                ),
                None,
            ));
        }
        let agent = if stopped {
            None
        } else {
            self.take_agent_over(&c).await
        };
        // A stopped sandbox has no agent to greet yet: the capabilities are those its
        // agent brings where `start` will take it over (this build's takeover version has
        // them all).
        let agent_caps = if stopped && self.takes_agent_over(&c.labels) {
            crate::sandbox::agent::restarted_capabilities(tier)
        } else {
            crate::sandbox::agent::capabilities(agent.as_ref(), tier)
        };
        let info = OrphanInfo::new(c.id.clone(), eng.backend(), c.labels.clone());
        let expiry = self.arm_expiry(&c.id, recorded.unwrap_or(latest), latest);
        let guard = TeardownGuard::new(
            info,
            expiry.cancelled_by(container_killer(
                self.engine.clone(),
                self.config.call_timeout,
                c.id.clone(),
            )),
        );
        let shared = Arc::new(Shared {
            engine: self.engine.clone(),
            config: self.config.clone(),
            id: c.id.clone(),
            template: c.image.clone(),
            workdir: c
                .workdir
                .clone()
                .filter(|w| !w.is_empty())
                .unwrap_or_else(|| sandbox_core::options::DEFAULT_WORKDIR.into()),
            labels: c.labels.clone(),
            deadline: Mutex::new(deadline),
            max_deadline: latest,
            tier,
            // No fork base: a reattached handle does not know the secrets a fork needs.
            caps: crate::sandbox::fork::instance_caps(
                crate::snapshot::instance_caps(
                    self.caps() | agent_caps,
                    c.labels.contains_key(crate::snapshot::LABEL_DISK_LIMITED),
                ),
                agent.as_ref(),
                None,
            ),
            // Secrets are never stored engine-side, so a reattached handle has none.
            secrets: Vec::new(),
            interpreters: Mutex::new(HashMap::new()),
            contexts: Mutex::new(HashMap::new()),
            agent: Mutex::new(agent.inspect(|a| expiry.watch_session(a))),
            // Paused by another handle: kill must thaw it first.
            paused: AtomicBool::new(c.state == sandbox_core::SandboxState::Paused),
            stopped: AtomicBool::new(stopped),
            // The policy is not kept engine-side: `start` re-applies what it can know.
            network: None,
            expiry,
            fork_base: None,
            restored: AtomicBool::new(false),
            ssh_agent: Mutex::new(None),
            git_gate: Mutex::new(None),
            credentials: Mutex::new(None),
        });
        tracing::debug!(
            sandbox_id = %shared.id,
            backend = eng.backend(),
            exec_path = %shared.exec_path(),
            "sandbox reattached"
        );
        Ok(ContainerSandbox::new(shared, guard, Ingress::default()))
    }

    /// A new host session on the agent of the running container `c`, taking it over from
    /// whichever host had it (the creator, an earlier `connect`, a process that died
    /// mid-frame); `None` — the engine's exec path — where the sandbox has no agent that
    /// takes a session over (created without it, or by an older build), the engine cannot
    /// attach or ends the sandbox when an attach ends (Podman), the sandbox is paused (a frozen agent cannot answer), or the agent did not
    /// answer its bounded hello.
    async fn take_agent_over(
        &self,
        c: &ContainerInfo,
    ) -> Option<sandbox_agent::client::AgentClient> {
        if !self.takes_agent_over(&c.labels) {
            return None;
        }
        if c.state == sandbox_core::SandboxState::Paused {
            tracing::info!(
                sandbox_id = %c.id,
                "sandbox is paused: the reattached handle takes the engine's exec path"
            );
            return None;
        }
        match crate::sandbox::agent::connect(
            &*self.engine,
            &c.id,
            self.config.call_timeout,
            crate::sandbox::agent::Session::TakeOver,
        )
        .await
        {
            Ok(client) => Some(client),
            Err(reason) => {
                tracing::warn!(
                    sandbox_id = %c.id,
                    reason = %reason,
                    exec_path = "engine",
                    "the sandbox's agent did not take the new session; the reattached \
                     handle takes the engine's exec path"
                );
                None
            }
        }
    }

    /// Whether a reattached handle talks to the agent of a sandbox with these labels: one
    /// that takes a new session over, on an engine whose attach survives this process.
    fn takes_agent_over(&self, labels: &BTreeMap<String, String>) -> bool {
        crate::sandbox::agent::takes_over(labels)
            && self.engine.supports_attach()
            && self.engine.attach_survives_detach()
    }

    /// [`Backend::create`], returning the concrete sandbox type.
    pub async fn create_container(&self, options: CreateOptions) -> Result<ContainerSandbox<E>> {
        self.create_sandbox(options).await
    }

    /// [`Backend::connect`], returning the concrete sandbox type.
    pub async fn connect_container(&self, id: &str) -> Result<ContainerSandbox<E>> {
        self.connect_sandbox(id).await
    }
}

#[async_trait]
impl<E: ContainerEngine> Backend for ContainerBackend<E> {
    fn name(&self) -> &str {
        self.engine.backend()
    }

    fn capabilities(&self) -> Capability {
        // The agent and terminals are the agent's: declared when new sandboxes start with
        // it (one that falls back to the exec path declares neither itself).
        if self.wants_agent() && crate::sandbox::agent::terminals_work(self.engine.tier()) {
            self.declared_caps() | Capability::PTY
        } else {
            self.declared_caps()
        }
    }

    fn isolation(&self) -> IsolationTier {
        self.engine.tier()
    }

    async fn create(&self, options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        Ok(Box::new(self.create_sandbox(options).await?))
    }

    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        Ok(Box::new(self.connect_sandbox(id).await?))
    }

    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        Some(self)
    }

    /// Reachability, the engine's facts, and the images a user needs (the default
    /// template and the busybox test image), each bounded by the call timeout.
    async fn diagnose(&self) -> EngineReport {
        let eng = &*self.engine;
        let mut r = EngineReport::new(eng.backend(), eng.endpoint());
        r.tier = eng.tier();
        if let Err(e) = self.call("ping", eng.ping()).await {
            r.problems.push(Problem::new(
                format!(
                    "engine `{}` unavailable at {}: {e}",
                    eng.backend(),
                    eng.endpoint()
                ),
                eng.unavailable_hint(),
            ));
            return r;
        }
        r.reachable = true;
        match tokio::time::timeout(self.config.call_timeout * 2, eng.facts()).await {
            Ok(facts) => {
                r.version = facts.version;
                r.runtimes = facts.runtimes;
                r.problems.extend(facts.problems);
            }
            Err(_) => r.problems.push(Problem::new(
                format!(
                    "the {} engine did not describe itself in time",
                    eng.backend()
                ),
                eng.unavailable_hint(),
            )),
        }
        let mut images = vec![self.config.default_template.clone()];
        if images[0] != crate::image::TEST_BUSYBOX {
            images.push(crate::image::TEST_BUSYBOX.to_string());
        }
        for image in images {
            let present = match self.call("image exists", eng.image_exists(&image)).await {
                Ok(present) => present,
                Err(e) => {
                    r.problems.push(Problem::new(
                        format!("could not check image `{image}`: {e}"),
                        eng.unavailable_hint(),
                    ));
                    false
                }
            };
            if !present {
                r.problems.push(Problem::new(
                    format!("image `{image}` is missing"),
                    format!("build the test images: `{}`", eng.images_hint()),
                ));
            }
            r.images.push((image, present));
        }
        r
    }
}

#[async_trait]
impl<E: ContainerEngine> ReapableBackend for ContainerBackend<E> {
    /// Each with the deadline in force: the one recorded on this host when an extension
    /// moved it, else the labelled one.
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        let backend = self.engine.backend();
        Ok(self
            .list_raw(labels)
            .await?
            .into_iter()
            .map(|c| {
                let latest = sandbox_core::labels::latest_deadline(&c.labels)
                    .map(|d| SystemTime::UNIX_EPOCH + Duration::from_secs(d));
                let deadline = latest
                    .and_then(|max| self.upkeep.deadlines().recorded(&c.id, max))
                    .or_else(|| labelled_unix(&c.labels, sandbox_core::labels::LABEL_DEADLINE));
                ManagedSandbox::new(c.id, backend, c.state, c.created_at, c.labels)
                    .with_deadline(deadline)
            })
            .collect())
    }

    /// Kills and removes one managed sandbox. A container that is not managed by
    /// sandbox-rs is refused with `Configuration` on every engine (the stricter of the two
    /// behaviours the adapters had: a typo never looks like success).
    async fn kill_managed(&self, id: &str) -> Result<bool> {
        let eng = &*self.engine;
        let c = match self.call("inspect", eng.inspect(id)).await {
            Ok(c) => c,
            Err(e) if e.kind == EngineErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(error::engine(eng, "inspect container", e)),
        };
        if c.labels.get(LABEL_MANAGED).map(String::as_str) != Some("true") {
            return Err(SandboxError::config(
                format!("container `{id}` is not managed by sandbox-rs"),
                "only containers labelled io.sandbox-rs.managed=true can be reaped",
            ));
        }
        let removed = match self.call("remove", eng.remove(&c.id)).await {
            Ok(removed) => removed,
            Err(e) if e.kind == EngineErrorKind::NotFound => false,
            Err(e) if e.kind == EngineErrorKind::Conflict => {
                self.remove(&c.id).await.map(|()| true)?
            }
            Err(e) => return Err(error::engine(eng, "remove container", e)),
        };
        crate::egress::forget(&c.id);
        crate::provision::deadlines::Deadlines::default().forget(&c.id);
        // A networked sandbox may have been the library network's last user: the network
        // goes with it (the engine refuses while another container uses it), so
        // `reap --kill` leaves nothing of ours behind.
        if removed && !c.addresses.is_empty() {
            crate::egress::remove_network_if_unused(eng).await;
        }
        Ok(removed)
    }

    async fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        let eng = &*self.engine;
        let filter = crate::snapshot::snapshot_filter(eng.backend());
        let images = self
            .call("list images", eng.list_images(&filter))
            .await
            .map_err(|e| error::engine(eng, "list images", e))?;
        Ok(images
            .into_iter()
            .filter(|i| crate::snapshot::is_snapshot(&i.labels))
            .map(|i| crate::snapshot::listed(eng.backend(), i))
            .collect())
    }

    /// Removes one snapshot image; an image that is not a sandbox-rs snapshot is refused
    /// with `Configuration`, one a sandbox still uses too (kill it first).
    async fn remove_snapshot(&self, template: &str) -> Result<bool> {
        let eng = &*self.engine;
        let config = match self.call("inspect image", eng.image_config(template)).await {
            Ok(c) => c,
            Err(e) if e.kind == EngineErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(error::engine(eng, "inspect image", e)),
        };
        if !crate::snapshot::is_snapshot(&config.labels) {
            return Err(SandboxError::config(
                format!("image `{template}` is not a sandbox-rs snapshot"),
                "only images labelled io.sandbox-rs.managed=true and io.sandbox-rs.snapshot-of are removed; list them with `sandbox reap`",
            ));
        }
        match self.call("remove image", eng.remove_image(template)).await {
            Ok(removed) => Ok(removed),
            Err(e) if e.kind == EngineErrorKind::NotFound => Ok(false),
            Err(e) if e.kind == EngineErrorKind::Conflict => Err(SandboxError::config(
                format!("snapshot `{template}` is in use by a sandbox"),
                "kill the sandboxes created from it first (`sandbox reap --kill` removes sandboxes before snapshots)",
            )
            .with_source(e)),
            Err(e) => Err(error::engine(eng, "remove image", e)),
        }
    }
}

/// A Unix-seconds label, if it parses.
fn labelled_unix(labels: &BTreeMap<String, String>, key: &str) -> Option<SystemTime> {
    let secs = labels.get(key)?.parse::<u64>().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}
