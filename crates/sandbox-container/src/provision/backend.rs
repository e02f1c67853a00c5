//! `ContainerBackend`: create, connect, list and kill managed sandboxes on any engine.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sandbox_core::labels::{
    LABEL_BACKEND, LABEL_DEADLINE, LABEL_MANAGED, metadata_filter, sandbox_labels,
};
use sandbox_core::teardown::{Killer, OrphanInfo, TeardownGuard};
use sandbox_core::{
    Backend, Capability, CreateOptions, EngineReport, IsolationTier, ManagedSandbox, Problem,
    ReapableBackend, Result, Sandbox, SandboxError, async_trait,
};

use crate::engine::transfer::bounded;
use crate::engine::{ContainerEngine, ContainerInfo, ContainerSpec, EngineErrorKind, NetworkMode};
use crate::error;
use crate::provision::config::ContainerConfig;
use crate::provision::config::NAME_PREFIX;
use crate::provision::teardown::{container_killer, remove_container};
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

/// What a sandbox gains from its agent: terminals, where the agent speaks the protocol
/// version that has them and the runtime's terminals are whole (see [`terminals_work`]).
fn agent_capabilities(
    agent: Option<&sandbox_agent::client::AgentClient>,
    tier: IsolationTier,
) -> Capability {
    match agent {
        Some(a) if a.version() >= sandbox_agent::protocol::PTY_VERSION && terminals_work(tier) => {
            Capability::PTY
        }
        _ => Capability::empty(),
    }
}

/// gVisor's own terminals (runsc 2022-12, what Debian 12 ships) ignore `^D`, so a
/// line-mode reader never sees end of input (gVisor issue 9333): `PTY` is not declared
/// there rather than declared half-working.
fn terminals_work(tier: IsolationTier) -> bool {
    tier != IsolationTier::Gvisor
}

/// A disk limit makes the root filesystem read-only and mounts the workdir as a sized
/// scratch filesystem (ContainerSpec::scratch_paths): that cannot be `/` itself.
fn refuse_root_scratch(
    options: &CreateOptions,
    resources: sandbox_core::EffectiveResources,
) -> Result<()> {
    if resources.disk_mb.is_some() && options.effective_workdir().trim_end_matches('/').is_empty() {
        return Err(SandboxError::config(
            "resources.disk_mb makes the root filesystem read-only, so the workdir cannot be `/`",
            "set CreateOptions::workdir to a directory such as /work, or leave disk_mb unset",
        ));
    }
    Ok(())
}

/// The container backend on engine `E`. Cheap to clone (one shared engine).
pub struct ContainerBackend<E: ContainerEngine> {
    engine: Arc<E>,
    config: Arc<ContainerConfig>,
    /// Set once a create with the agent bind-mounted failed where the same create with
    /// the agent uploaded worked (the engine does not see this host's files): from then
    /// on this backend uploads.
    agent_mount_failed: Arc<AtomicBool>,
}

impl<E: ContainerEngine> Clone for ContainerBackend<E> {
    fn clone(&self) -> Self {
        ContainerBackend {
            engine: self.engine.clone(),
            config: self.config.clone(),
            agent_mount_failed: self.agent_mount_failed.clone(),
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
    /// failures are logged, never fatal).
    pub async fn new(engine: E, config: ContainerConfig) -> Self {
        let b = ContainerBackend {
            engine: Arc::new(engine),
            config: Arc::new(config),
            agent_mount_failed: Arc::new(AtomicBool::new(false)),
        };
        if b.config.startup_sweep {
            b.sweep().await;
        }
        b
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<E> {
        &self.engine
    }

    /// The configuration in effect.
    pub fn config(&self) -> &ContainerConfig {
        &self.config
    }

    fn caps(&self) -> Capability {
        // GPU is the engine's alone (devices in its create body, e.g. Podman's CDI names):
        // passed through when the engine declares it.
        // So is DISK_LIMIT (a read-only root and sized scratch mounts in its create body).
        let mut caps = (LAYER_CAPABILITIES
            | Capability::GPU
            | Capability::EGRESS_ALLOWLIST
            | Capability::DISK_LIMIT)
            & self.engine.capabilities();
        // Declared only where the rules can really be loaded (see egress/mod.rs).
        if !crate::egress::allowlist_available(&*self.engine) {
            caps.remove(Capability::EGRESS_ALLOWLIST);
        }
        caps
    }

    async fn call<T>(
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
        crate::provision::sweep::sweep(self).await
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

    pub(crate) async fn remove(&self, id: &str) -> Result<()> {
        remove_container(&*self.engine, self.config.call_timeout, id).await
    }

    fn spec(
        &self,
        options: &CreateOptions,
        resources: sandbox_core::EffectiveResources,
        egress_net: Option<&crate::engine::NetworkInfo>,
        agent: bool,
    ) -> ContainerSpec {
        let image = options
            .template
            .clone()
            .unwrap_or_else(|| self.config.default_template.clone());
        let lifetime = options.timeout;
        // Rounded up from the exact end: the agent ends at this second, and a sandbox
        // must never end before its lifetime (the old `floor(now) + ceil(lifetime)` could
        // cut up to a second off).
        let deadline = deadline_secs(SystemTime::now(), lifetime);
        // Allow and AllowList run on the library's network (egress/mod.rs).
        let network = crate::egress::network_mode(&options.network, egress_net);
        // The main process is the lifetime backstop: it ends at the deadline, which ends
        // the container. The agent cannot be stopped from inside; `sleep` can (kill -STOP),
        // so on the exec path the sweep past the deadline is the last resort.
        let command = if agent {
            crate::sandbox::agent::command(deadline)
        } else {
            vec!["sleep".into(), format!("{:.3}", lifetime.as_secs_f64())]
        };
        ContainerSpec {
            name: container_name(),
            image,
            command,
            // The agent reaps zombies itself and must be PID 1 (an init in front of it
            // would hold signals the agent relies on the kernel to drop).
            init: !agent,
            // Secrets are deliberately absent: they are injected per exec, never stored in
            // the container configuration.
            env: options
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            workdir: options.effective_workdir().to_string(),
            labels: sandbox_labels(self.engine.backend(), deadline, &options.metadata),
            resources,
            network,
            lifetime,
            attach_stdin: agent,
            agent_mount: None,
        }
    }

    /// Whether new sandboxes start with the agent: configured, the engine can attach, and
    /// a binary ships for this architecture.
    fn wants_agent(&self) -> bool {
        self.config.agent
            && self.engine.supports_attach()
            && crate::sandbox::agent::binary().is_some()
    }

    async fn create_sandbox(&self, options: CreateOptions) -> Result<ContainerSandbox<E>> {
        let backend = self.engine.backend();
        let tier = self.engine.tier();
        let resources = sandbox_core::policy::check_create(backend, self.caps(), tier, &options)?;
        refuse_root_scratch(&options, resources)?;
        // The library network is ensured before the spec is checked, so a refusal still
        // provisions no container (a network is not a sandbox; the sweep removes it).
        let egress_net = crate::egress::network_for(&*self.engine, &options.network).await?;
        let first = self
            .create_on(&options, resources, tier, egress_net.as_ref())
            .await;
        let Some(used) = egress_net.filter(|_| first.is_err()) else {
            return first;
        };
        // Another process's sweep may have removed the library network (unused at that
        // moment) between ensuring it and creating on it: the create then fails with a
        // network the engine no longer has. Ensured afresh under another id, one retry
        // (with its own create bound: this race is rare, and the first attempt left
        // nothing behind).
        let fresh = crate::egress::network_for(&*self.engine, &options.network).await?;
        match fresh {
            Some(net) if net.id != used.id => {
                tracing::debug!(
                    backend,
                    network = %net.name,
                    "the library network was re-created during create; retrying once"
                );
                self.create_on(&options, resources, tier, Some(&net)).await
            }
            _ => first,
        }
    }

    /// One provisioning attempt on `egress_net`, bounded by the create timeout (after any
    /// pull, which has its own bound).
    async fn create_on(
        &self,
        options: &CreateOptions,
        resources: sandbox_core::EffectiveResources,
        tier: IsolationTier,
        egress_net: Option<&crate::engine::NetworkInfo>,
    ) -> Result<ContainerSandbox<E>> {
        if let Some(net) = egress_net {
            crate::egress::check_allowlist(&*self.engine, &options.network, net).await?;
        }
        let agent = self.wants_agent();
        let spec = self.spec(options, resources, egress_net, agent);
        self.engine.check_spec(&spec).map_err(error::refused_spec)?;
        // Before the create bound: a first pull may take minutes (it has its own bound).
        let ensure = || {
            crate::image::ensure(
                &self.engine,
                &spec.image,
                options.pull,
                self.config.pull_progress.as_ref(),
                self.config.call_timeout,
            )
        };
        let ensured = ensure().await?;
        let first = self
            .provision_bounded(spec.clone(), options, resources, tier, egress_net)
            .await;
        match first {
            // The image was only remembered, and the engine no longer has it (removed
            // since): forgotten, ensured as the pull policy says, one more attempt.
            Err(e) if ensured == crate::image::Ensured::Remembered && error::says_not_found(&e) => {
                crate::image::forget(&*self.engine, &spec.image);
                ensure().await?;
                self.provision_bounded(spec, options, resources, tier, egress_net)
                    .await
            }
            r => r,
        }
    }

    /// Provisions `spec` (after its image is ensured), bounded by the create timeout: the
    /// agent mounted or uploaded, falling back to the engine's exec path.
    async fn provision_bounded(
        &self,
        spec: ContainerSpec,
        options: &CreateOptions,
        resources: sandbox_core::EffectiveResources,
        tier: IsolationTier,
        egress_net: Option<&crate::engine::NetworkInfo>,
    ) -> Result<ContainerSandbox<E>> {
        let backend = self.engine.backend();
        // The agent bind-mounted from a host file where the engine can (no 1.5 MiB upload
        // into every container), else uploaded.
        let mut spec = spec;
        if spec.attach_stdin
            && self.engine.supports_agent_mount()
            && !self.agent_mount_failed.load(Ordering::Relaxed)
        {
            spec.agent_mount = crate::sandbox::agent::host_copy().await;
        }
        let limit = self.config.create_timeout;
        let provision = async {
            let mounted = spec.agent_mount.is_some();
            let first = self
                .provision(spec.clone(), options, tier, egress_net)
                .await;
            let first = match first {
                Ok(Provisioned::Ready(s)) => Ok(Provisioned::Ready(s)),
                // The mount may be what failed (an engine that does not see this host's
                // files): the same create with the agent uploaded decides.
                failed @ Ok(Provisioned::AgentFailed(_)) if mounted => {
                    let mut uploaded = spec.clone();
                    uploaded.agent_mount = None;
                    let retry = self.provision(uploaded, options, tier, egress_net).await;
                    if matches!(retry, Ok(Provisioned::Ready(_))) {
                        self.agent_mount_failed.store(true, Ordering::Relaxed);
                        tracing::warn!(
                            backend,
                            first = %match &failed {
                                Ok(Provisioned::AgentFailed(reason)) => reason.as_str(),
                                _ => "",
                            },
                            "the engine could not bind-mount the agent from this host; uploading it into every sandbox instead"
                        );
                    }
                    retry
                }
                other => other,
            };
            match first? {
                Provisioned::Ready(s) => Ok(*s),
                Provisioned::AgentFailed(reason) => {
                    // That container is already removed: a new one on the exec path.
                    tracing::warn!(
                        backend,
                        reason = %reason,
                        exec_path = "engine",
                        "the in-sandbox agent did not start; falling back to the engine's exec path"
                    );
                    let spec = self.spec(options, resources, egress_net, false);
                    match self.provision(spec, options, tier, egress_net).await? {
                        Provisioned::Ready(s) => Ok(*s),
                        Provisioned::AgentFailed(reason) => Err(error::internal(backend, reason)),
                    }
                }
            }
        };
        match tokio::time::timeout(limit, provision).await {
            Ok(r) => r,
            // Dropping `provision` dropped its armed guard: the container is removed in
            // the background.
            Err(_) => Err(error::create_timeout(backend, limit)),
        }
    }

    async fn provision(
        &self,
        spec: ContainerSpec,
        options: &CreateOptions,
        tier: IsolationTier,
        egress_net: Option<&crate::engine::NetworkInfo>,
    ) -> Result<Provisioned<E>> {
        let eng = &*self.engine;
        let backend = eng.backend();
        let limit = self.config.create_timeout;
        let create_err = |op: &str, e: crate::engine::EngineError| {
            if e.kind == EngineErrorKind::Timeout {
                error::create_timeout(backend, limit)
            } else {
                error::on_create(eng, &spec.image, op, e)
            }
        };
        // Named before the request, so a create dropped while the engine works on it can
        // still be found and removed (by name) by the guard.
        let info = OrphanInfo::new(spec.name.clone(), backend, spec.labels.clone());
        let mut guard = TeardownGuard::new(info, self.name_killer(spec.name.clone()));
        let id = match self.call("create", eng.create(&spec)).await {
            Ok(id) => id,
            Err(e) => {
                if !matches!(
                    e.kind,
                    EngineErrorKind::Unavailable | EngineErrorKind::Timeout
                ) {
                    // The engine answered: nothing was created.
                    guard.disarm();
                    if spec.agent_mount.is_some() {
                        // Perhaps the mount (an engine that cannot see this host's file):
                        // the caller retries with the agent uploaded.
                        return Ok(Provisioned::AgentFailed(format!(
                            "create with the agent mounted failed: {e}"
                        )));
                    }
                }
                return Err(create_err("create container", e));
            }
        };
        guard.disarm();
        // From here the container exists: a dropped or failed create removes it.
        let info = OrphanInfo::new(id.clone(), backend, spec.labels.clone());
        let mut guard = TeardownGuard::new(
            info,
            container_killer(self.engine.clone(), self.config.call_timeout, id.clone()),
        );
        // Copy mounts and the pre_start hook see the created, not yet started, container.
        let hooks = eng.hooks();
        let event = crate::spec::hooks::HookEvent::new(&id, &spec.image);
        let prepared = async {
            for m in eng.copy_mounts() {
                crate::provision::copy_in::copy_in(eng, &id, &m).await?;
            }
            hooks.run_pre_start(&event).await
        };
        if let Err(e) = prepared.await {
            let _ = guard.kill_now().await;
            return Err(create_err("provision container", e));
        }
        // The agent goes in before start: it is the container's main process (unless the
        // engine bind-mounts it).
        if spec.attach_stdin && spec.agent_mount.is_none() {
            let put = match crate::sandbox::agent::binary().map(crate::sandbox::agent::archive) {
                Some(Ok(tar)) => self
                    .call("agent upload", eng.put_archive(&id, "/", tar))
                    .await
                    .map_err(|e| format!("uploading the agent failed: {e}")),
                Some(Err(e)) => Err(format!("packing the agent failed: {e}")),
                None => Err("no agent binary for this architecture".to_string()),
            };
            if let Err(reason) = put {
                let _ = guard.kill_now().await;
                return Ok(Provisioned::AgentFailed(reason));
            }
        }
        if let Err(e) = self.call("start", eng.start(&id)).await {
            let timed_out = e.kind == EngineErrorKind::Timeout;
            let err = create_err("start container", e);
            let _ = guard.kill_now().await;
            if spec.agent_mount.is_some() && !timed_out {
                return Ok(Provisioned::AgentFailed(format!(
                    "start with the agent mounted failed: {}",
                    err.render()
                )));
            }
            return Err(err);
        }
        if let Err(e) = hooks.run_post_start(&event).await {
            let _ = guard.kill_now().await;
            return Err(create_err("post_start hook", e));
        }
        // Egress rules before anything of the user's runs; a failure removes the container.
        if let Some(net) = egress_net
            && let Err(e) = crate::egress::apply(eng, &id, &options.network, net).await
        {
            let _ = guard.kill_now().await;
            return Err(e);
        }
        // Nothing of the user's runs before the hello: the agent only spawns on request.
        let agent = if spec.attach_stdin {
            match crate::sandbox::agent::connect(eng, &id, self.config.call_timeout).await {
                Ok(client) => Some(client),
                Err(reason) => {
                    let _ = guard.kill_now().await;
                    return Ok(Provisioned::AgentFailed(reason));
                }
            }
        } else {
            None
        };
        let shared = Arc::new(Shared {
            engine: self.engine.clone(),
            config: self.config.clone(),
            id,
            template: spec.image.clone(),
            workdir: spec.workdir.clone(),
            labels: spec.labels.clone(),
            deadline: match (&agent, spec.labels.get(LABEL_DEADLINE)) {
                // The agent ends at exactly the labelled second.
                (Some(_), Some(d)) => d
                    .parse::<u64>()
                    .map(|d| SystemTime::UNIX_EPOCH + Duration::from_secs(d))
                    .unwrap_or_else(|_| SystemTime::now() + options.timeout),
                _ => SystemTime::now() + options.timeout,
            },
            tier,
            caps: self.caps() | agent_capabilities(agent.as_ref(), tier),
            secrets: options
                .secrets
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            interpreters: Mutex::new(HashMap::new()),
            contexts: Mutex::new(HashMap::new()),
            agent,
        });
        tracing::debug!(
            sandbox_id = %shared.id,
            backend,
            exec_path = %shared.exec_path(),
            "sandbox ready"
        );
        let ports = &options.network.ingress_ports;
        let ingress = match &spec.network {
            _ if ports.is_empty() => Ok(Ingress::default()),
            NetworkMode::None => crate::sandbox::ingress::forward(&shared, ports).await,
            _ => crate::sandbox::ingress::published(&shared, ports).await,
        };
        match ingress {
            Ok(ingress) => Ok(Provisioned::Ready(Box::new(ContainerSandbox::new(
                shared, guard, ingress,
            )))),
            Err(e) => {
                let _ = guard.kill_now().await;
                Err(e)
            }
        }
    }

    /// Removes a container by name, for the window where a create request is in flight. A
    /// removal can overtake the create on the engine, so "not found" is retried briefly
    /// (the guard's grace bounds it).
    fn name_killer(&self, name: String) -> Killer {
        let engine = self.engine.clone();
        let limit = self.config.call_timeout;
        Arc::new(move || {
            let engine = engine.clone();
            let name = name.clone();
            Box::pin(async move {
                for _ in 0..15 {
                    match bounded(limit, "remove", engine.remove(&name)).await {
                        Ok(true) => return Ok(()),
                        Ok(false) => tokio::time::sleep(Duration::from_millis(200)).await,
                        Err(e) if e.kind == EngineErrorKind::NotFound => {
                            tokio::time::sleep(Duration::from_millis(200)).await
                        }
                        Err(e) if e.kind == EngineErrorKind::Conflict => return Ok(()),
                        Err(e) => return Err(error::engine(&*engine, "remove container", e)),
                    }
                }
                Ok(())
            })
        })
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
        let deadline = c
            .labels
            .get(LABEL_DEADLINE)
            .and_then(|d| d.parse::<u64>().ok())
            .map(|d| SystemTime::UNIX_EPOCH + Duration::from_secs(d))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        if !c.is_running() || deadline <= SystemTime::now() {
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
        let info = OrphanInfo::new(c.id.clone(), eng.backend(), c.labels.clone());
        let guard = TeardownGuard::new(
            info,
            container_killer(self.engine.clone(), self.config.call_timeout, c.id.clone()),
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
            deadline,
            tier,
            caps: self.caps(),
            // Secrets are never stored engine-side, so a reattached handle has none.
            secrets: Vec::new(),
            interpreters: Mutex::new(HashMap::new()),
            contexts: Mutex::new(HashMap::new()),
            // The agent serves one host session (its creator's); a reattached handle
            // uses the engine's exec path, which works beside it.
            agent: None,
        });
        Ok(ContainerSandbox::new(shared, guard, Ingress::default()))
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

/// What one provisioning attempt gave.
enum Provisioned<E: ContainerEngine> {
    /// A usable sandbox.
    Ready(Box<ContainerSandbox<E>>),
    /// The agent could not be put in place or did not answer; its container is removed.
    AgentFailed(String),
}

/// The deadline as whole Unix seconds, rounded up from `now + lifetime`.
fn deadline_secs(now: SystemTime, lifetime: Duration) -> u64 {
    let end = (now + lifetime)
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    end.as_secs() + u64::from(end.subsec_nanos() > 0)
}

fn container_name() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{NAME_PREFIX}{}-{n}", sandbox_core::labels::session_id())
}

#[async_trait]
impl<E: ContainerEngine> Backend for ContainerBackend<E> {
    fn name(&self) -> &str {
        self.engine.backend()
    }

    fn capabilities(&self) -> Capability {
        // Terminals are the agent's: declared when new sandboxes start with it (one that
        // falls back to the exec path does not declare PTY itself).
        if self.wants_agent() && terminals_work(self.engine.tier()) {
            self.caps() | Capability::PTY
        } else {
            self.caps()
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
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        let backend = self.engine.backend();
        Ok(self
            .list_raw(labels)
            .await?
            .into_iter()
            .map(|c| ManagedSandbox::new(c.id, backend, c.state, c.created_at, c.labels))
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
        // A networked sandbox may have been the library network's last user: the network
        // goes with it (the engine refuses while another container uses it), so
        // `reap --kill` leaves nothing of ours behind.
        if removed && !c.addresses.is_empty() {
            crate::egress::remove_network_if_unused(eng).await;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetime_rounds_up() {
        let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(deadline_secs(at(100_900), Duration::from_secs(2)), 103);
        assert_eq!(deadline_secs(at(100_000), Duration::from_secs(2)), 102);
        assert_eq!(deadline_secs(at(100_000), Duration::from_millis(2500)), 103);
    }

    #[test]
    fn names_carry_the_provenance_prefix() {
        assert!(container_name().starts_with(NAME_PREFIX));
        assert_ne!(container_name(), container_name());
    }
}
