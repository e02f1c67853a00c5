//! `DockerBackend`: one shared bollard client, `create`/`connect`, reaping and the
//! startup sweep.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bollard::Docker;
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::ListContainersOptions;
use sandbox_core::labels::{LABEL_DEADLINE, LABEL_MANAGED, LABEL_OWNER, Owner, metadata_filter};
use sandbox_core::teardown::TeardownGuard;
use sandbox_core::{
    Backend, Capability, CreateOptions, EngineReport, IsolationTier, ManagedSandbox, Problem,
    ReapableBackend, Result, Sandbox, SandboxError, SandboxState, async_trait,
};
use tracing::Instrument;

use crate::config::{DockerConfig, Runtime, TEST_IMAGES, redact_endpoint};
use crate::error::{self, BACKEND, Kind};
use crate::ingress::Ingress;
use crate::policy::{self, LABEL_RUNTIME};
use crate::sandbox::{DockerSandbox, SandboxInner, container_killer, remove_container};

/// What every Docker sandbox declares.
pub(crate) const CAPABILITIES: Capability = Capability::RUN_COMMAND
    .union(Capability::RUN_CODE)
    .union(Capability::STATEFUL_CODE)
    .union(Capability::STREAMING)
    .union(Capability::FILESYSTEM)
    .union(Capability::UPLOAD_DOWNLOAD)
    .union(Capability::NETWORK_POLICY)
    .union(Capability::INGRESS_PORTS);

/// Leftovers past their deadline by more than this are swept regardless of owner.
const SWEEP_PAST_DEADLINE: Duration = Duration::from_secs(60);

/// The Docker backend. Cheap to clone (one shared bollard client).
#[derive(Clone)]
pub struct DockerBackend {
    client: Docker,
    config: DockerConfig,
    endpoint: String,
    /// The runtime is registered with `--network=none` (as SPEC §12 configures runsc), so
    /// no sandbox can get a network: egress `Allow` is refused instead of ignored.
    runtime_forces_no_network: bool,
}

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("endpoint", &self.endpoint)
            .field("runtime", &self.config.runtime)
            .field("default_template", &self.config.default_template)
            .finish()
    }
}

impl DockerBackend {
    /// Connects to the engine (`config.host`, else `DOCKER_HOST`, else the default socket),
    /// negotiates the API version, pings it, checks the runtime is registered, and sweeps
    /// this host's sandboxes whose owning process is proven gone.
    ///
    /// An engine that does not answer is `EngineUnavailable` with the start command as hint.
    pub async fn connect(config: DockerConfig) -> Result<DockerBackend> {
        let raw_endpoint = config.endpoint();
        let endpoint = redact_endpoint(&raw_endpoint);
        let client = Docker::connect_with_host(&raw_endpoint)
            .map_err(|e| error::unavailable(&endpoint, e))?;
        let client = client
            .negotiate_version()
            .await
            .map_err(|e| error::unavailable(&endpoint, e))?;
        client
            .ping()
            .await
            .map_err(|e| error::unavailable(&endpoint, e))?;
        let mut backend = DockerBackend {
            client,
            config,
            endpoint,
            runtime_forces_no_network: false,
        };
        if backend.config.runtime != Runtime::Runc {
            backend.runtime_forces_no_network = backend.check_runtime().await?;
        }
        if backend.config.startup_sweep {
            backend.sweep().await;
        }
        Ok(backend)
    }

    /// The configuration in effect.
    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    /// The engine endpoint (credentials removed).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The shared bollard client. **Outside the semver contract.**
    pub fn client(&self) -> &Docker {
        &self.client
    }

    /// Checks the runtime is registered; returns whether it forces `--network=none`.
    async fn check_runtime(&self) -> Result<bool> {
        let info = self
            .client
            .info()
            .await
            .map_err(|e| error::unavailable(&self.endpoint, e))?;
        let name = self.config.runtime.as_str();
        if let Some(rt) = info.runtimes.unwrap_or_default().get(name) {
            Ok(rt
                .runtime_args
                .iter()
                .flatten()
                .any(|a| a == "--network=none" || a == "--network none"))
        } else {
            Err(SandboxError::config(
                format!(
                    "the Docker engine at {} has no `{name}` runtime",
                    self.endpoint
                ),
                runtime_fix(self.config.runtime),
            ))
        }
    }

    /// Removes this host's managed containers whose owner is proven gone, and leftovers
    /// long past their deadline. Failures are logged, never fatal.
    async fn sweep(&self) {
        let list = match self.list(&BTreeMap::new()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "startup sweep could not list sandboxes");
                return;
            }
        };
        let now = sandbox_core::labels::unix_now();
        for s in list {
            let owner_gone = s
                .labels
                .get(LABEL_OWNER)
                .and_then(|o| Owner::parse(o))
                .is_some_and(|o| o.is_proven_gone());
            let expired = s
                .labels
                .get(LABEL_DEADLINE)
                .and_then(|d| d.parse::<u64>().ok())
                .is_some_and(|d| d + SWEEP_PAST_DEADLINE.as_secs() < now);
            if owner_gone || expired {
                match remove_container(&self.client, &s.id).await {
                    Ok(()) => tracing::info!(
                        sandbox_id = %s.id,
                        owner_gone,
                        expired,
                        "startup sweep removed a sandbox"
                    ),
                    Err(e) => {
                        tracing::warn!(sandbox_id = %s.id, error = %e, "startup sweep failed")
                    }
                }
            }
        }
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        let mut label_filters = vec![format!("{LABEL_MANAGED}=true")];
        label_filters.extend(
            metadata_filter(labels)
                .into_iter()
                .map(|(k, v)| format!("{k}={v}")),
        );
        let mut filters = HashMap::new();
        filters.insert("label".to_string(), label_filters);
        let opts = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = self
            .client
            .list_containers(Some(opts))
            .await
            .map_err(|e| self.map_engine("list containers", e))?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let id = c.id?;
                let state = match c.state {
                    Some(ContainerSummaryStateEnum::RUNNING) => SandboxState::Running,
                    Some(ContainerSummaryStateEnum::CREATED) => SandboxState::Creating,
                    Some(ContainerSummaryStateEnum::PAUSED) => SandboxState::Paused,
                    Some(
                        ContainerSummaryStateEnum::EXITED
                        | ContainerSummaryStateEnum::DEAD
                        | ContainerSummaryStateEnum::REMOVING
                        | ContainerSummaryStateEnum::STOPPING,
                    ) => SandboxState::Stopped,
                    _ => SandboxState::Unknown,
                };
                let created = c
                    .created
                    .and_then(|s| u64::try_from(s).ok())
                    .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
                let labels: BTreeMap<String, String> =
                    c.labels.unwrap_or_default().into_iter().collect();
                Some(ManagedSandbox::new(id, BACKEND, state, created, labels))
            })
            .collect())
    }

    fn map_engine(&self, op: &str, e: error::EngineError) -> SandboxError {
        if error::kind(&e) == Kind::Unreachable {
            error::unavailable(&self.endpoint, e)
        } else {
            error::engine(op, e)
        }
    }

    async fn create_inner(&self, options: CreateOptions) -> Result<DockerSandbox> {
        let tier = self.config.runtime.tier();
        let resources = sandbox_core::policy::check_create(BACKEND, CAPABILITIES, tier, &options)?;
        policy::refuse_unenforceable(&resources)?;
        if self.runtime_forces_no_network && options.network.egress != sandbox_core::Egress::Deny {
            return Err(SandboxError::config(
                format!(
                    "the engine registers runtime `{}` with `--network=none`, so egress Allow \
                     cannot be applied",
                    self.config.runtime
                ),
                "use egress Deny with this runtime, or register runsc without `--network=none` \
                 in /etc/docker/daemon.json and reload dockerd (`sudo kill -HUP $(pidof dockerd)`)",
            ));
        }
        let now = SystemTime::now();
        let plan = policy::plan_container(
            &self.config,
            &options,
            &resources,
            sandbox_core::labels::unix_now(),
        );
        // Named before the request, so a create dropped while the engine works on it can
        // still be found and removed (by name) by the guard.
        let name = container_name();
        let info =
            sandbox_core::teardown::OrphanInfo::new(name.clone(), BACKEND, plan.labels.clone());
        let mut guard = TeardownGuard::new(info, name_killer(self.client.clone(), name.clone()));
        let create_opts = bollard::query_parameters::CreateContainerOptions {
            name: Some(name.clone()),
            platform: String::new(),
        };
        let created = match self
            .client
            .create_container(Some(create_opts), plan.body.clone())
            .await
        {
            Ok(c) => c,
            Err(e) => {
                if error::kind(&e) == Kind::Unreachable {
                    // The container may exist: the guard removes it in the background.
                    drop(guard);
                    return Err(error::unavailable(&self.endpoint, e));
                }
                guard.disarm();
                return Err(error::for_create(&plan.template, "create container", e));
            }
        };
        guard.disarm();
        let id = created.id;
        // From here the container exists: a dropped or failed create removes it.
        let info =
            sandbox_core::teardown::OrphanInfo::new(id.clone(), BACKEND, plan.labels.clone());
        let mut guard = TeardownGuard::new(info, container_killer(self.client.clone(), id.clone()));
        for w in created.warnings {
            tracing::debug!(sandbox_id = %id, warning = %w, "engine warning on create");
        }
        if let Err(e) = self.client.start_container(&id, None).await {
            let err = error::for_create(&plan.template, "start container", e);
            let _ = guard.kill_now().await;
            return Err(err);
        }
        let secrets = options
            .secrets
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let inner = Arc::new(SandboxInner::new(
            self.client.clone(),
            id,
            plan.template,
            plan.workdir,
            plan.labels,
            now + options.timeout,
            tier,
            secrets,
        ));
        let ports = &options.network.ingress_ports;
        let ingress = if ports.is_empty() {
            Ok(Ingress::default())
        } else if policy::engine_published(&options).is_empty() {
            crate::ingress::forward(&inner, ports).await
        } else {
            crate::ingress::published(&inner, ports).await
        };
        match ingress {
            Ok(ingress) => Ok(DockerSandbox::new(inner, guard, ingress)),
            Err(e) => {
                let _ = guard.kill_now().await;
                Err(e)
            }
        }
    }
}

fn container_name() -> String {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("sbx-{}-{n}", sandbox_core::labels::session_id())
}

/// Removes a container by name, for the window where a create request is in flight. A
/// removal can overtake the create on the engine, so "no such container" is retried
/// briefly (the guard's grace bounds it).
fn name_killer(client: Docker, name: String) -> sandbox_core::teardown::Killer {
    std::sync::Arc::new(move || {
        let client = client.clone();
        let name = name.clone();
        Box::pin(async move {
            let opts = bollard::query_parameters::RemoveContainerOptions {
                force: true,
                v: true,
                link: false,
            };
            for _ in 0..15 {
                match client.remove_container(&name, Some(opts.clone())).await {
                    Ok(()) => return Ok(()),
                    Err(e) if error::kind(&e) == Kind::NotFound => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) if error::kind(&e) == Kind::NotRunning => return Ok(()),
                    Err(e) => return Err(error::engine("remove container", e)),
                }
            }
            Ok(())
        })
    })
}

fn runtime_fix(runtime: Runtime) -> String {
    match runtime {
        Runtime::Runc => "runc ships with Docker; reinstall with `sudo cargo xtask setup`".into(),
        Runtime::Runsc => "install gVisor and register it: `sudo cargo xtask setup` (writes \
             /etc/docker/daemon.json {\"runtimes\":{\"runsc\":{\"path\":\"/usr/bin/runsc\",\
             \"runtimeArgs\":[\"--network=none\"]}}} and reloads dockerd with `sudo kill -HUP \
             $(pidof dockerd)`)"
            .into(),
    }
}

#[async_trait]
impl Backend for DockerBackend {
    fn name(&self) -> &str {
        BACKEND
    }

    fn capabilities(&self) -> Capability {
        CAPABILITIES
    }

    fn isolation(&self) -> IsolationTier {
        self.config.runtime.tier()
    }

    async fn create(&self, options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        let span = tracing::info_span!(
            "sandbox.create",
            backend = BACKEND,
            tier = %self.config.runtime.tier(),
            sandbox_id = tracing::field::Empty
        );
        let s = self.create_inner(options).instrument(span.clone()).await?;
        span.record("sandbox_id", s.inner.id.as_str());
        Ok(Box::new(s))
    }

    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        if id.is_empty() || id.contains('/') || id.chars().any(|c| c.is_control()) {
            return Err(SandboxError::Connect {
                id: id.to_string(),
                message: "not a container id".into(),
                source: None,
            });
        }
        let c =
            self.client
                .inspect_container(id, None)
                .await
                .map_err(|e| match error::kind(&e) {
                    Kind::Unreachable => error::unavailable(&self.endpoint, e),
                    _ => error::for_connect(id, e),
                })?;
        let config = c.config.unwrap_or_default();
        let labels: BTreeMap<String, String> =
            config.labels.unwrap_or_default().into_iter().collect();
        if labels.get(LABEL_MANAGED).map(String::as_str) != Some("true") {
            return Err(SandboxError::Connect {
                id: id.to_string(),
                message: "not a sandbox managed by sandbox-rs".into(),
                source: None,
            });
        }
        let running = c.state.and_then(|s| s.running).unwrap_or(false);
        let deadline = labels
            .get(LABEL_DEADLINE)
            .and_then(|d| d.parse::<u64>().ok())
            .map(|d| SystemTime::UNIX_EPOCH + Duration::from_secs(d))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        if !running || deadline <= SystemTime::now() {
            return Err(SandboxError::Connect {
                id: id.to_string(),
                message: "the sandbox is not running (stopped or past its lifetime)".into(),
                source: None,
            });
        }
        let full_id = c.id.unwrap_or_else(|| id.to_string());
        let tier = labels
            .get(LABEL_RUNTIME)
            .and_then(|r| Runtime::parse(r))
            .unwrap_or(self.config.runtime)
            .tier();
        let info =
            sandbox_core::teardown::OrphanInfo::new(full_id.clone(), BACKEND, labels.clone());
        let guard =
            TeardownGuard::new(info, container_killer(self.client.clone(), full_id.clone()));
        let inner = Arc::new(SandboxInner::new(
            self.client.clone(),
            full_id,
            config.image.unwrap_or_default(),
            config
                .working_dir
                .filter(|w| !w.is_empty())
                .unwrap_or_else(|| "/work".into()),
            labels,
            deadline,
            tier,
            // Secrets are never stored engine-side, so a reattached handle has none.
            Vec::new(),
        ));
        Ok(Box::new(DockerSandbox::new(
            inner,
            guard,
            Ingress::default(),
        )))
    }

    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        Some(self)
    }

    async fn diagnose(&self) -> EngineReport {
        let mut r = EngineReport::new(BACKEND, self.endpoint.clone());
        r.tier = self.config.runtime.tier();
        if let Err(e) = self.client.ping().await {
            let err = error::unavailable(&self.endpoint, e);
            r.problems.push(Problem::new(err.to_string(), err.hint()));
            return r;
        }
        r.reachable = true;
        match self.client.version().await {
            Ok(v) => r.version = v.version,
            Err(e) => r.problems.push(Problem::new(
                format!(
                    "engine version unavailable: {}",
                    error::engine("version", e)
                ),
                "check `docker version`",
            )),
        }
        match self.client.info().await {
            Ok(info) => {
                let mut rts: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
                rts.sort();
                if !rts.iter().any(|n| n == self.config.runtime.as_str()) {
                    r.problems.push(Problem::new(
                        format!(
                            "runtime `{}` is not registered with the engine",
                            self.config.runtime
                        ),
                        runtime_fix(self.config.runtime),
                    ));
                }
                r.runtimes = rts;
            }
            Err(e) => r.problems.push(Problem::new(
                format!("engine info unavailable: {}", error::engine("info", e)),
                "check `docker info`",
            )),
        }
        for image in TEST_IMAGES {
            let present = self.client.inspect_image(image).await.is_ok();
            if !present {
                r.problems.push(Problem::new(
                    format!("image `{image}` is missing"),
                    "build the test images: `sudo cargo xtask setup`",
                ));
            }
            r.images.push((image.to_string(), present));
        }
        r
    }
}

#[async_trait]
impl ReapableBackend for DockerBackend {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        self.list(labels).await
    }

    async fn kill_managed(&self, id: &str) -> Result<bool> {
        let c = match self.client.inspect_container(id, None).await {
            Ok(c) => c,
            Err(e) if error::kind(&e) == Kind::NotFound => return Ok(false),
            Err(e) => return Err(self.map_engine("inspect container", e)),
        };
        let managed = c
            .config
            .and_then(|c| c.labels)
            .and_then(|l| l.get(LABEL_MANAGED).cloned())
            .is_some_and(|v| v == "true");
        if !managed {
            return Err(SandboxError::config(
                format!("container `{id}` is not managed by sandbox-rs"),
                "only containers labelled io.sandbox-rs.managed=true can be reaped",
            ));
        }
        let opts = bollard::query_parameters::RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match self.client.remove_container(id, Some(opts)).await {
            Ok(()) => Ok(true),
            Err(e) if matches!(error::kind(&e), Kind::NotFound) => Ok(false),
            Err(e) if matches!(error::kind(&e), Kind::NotRunning) => Ok(true),
            Err(e) => Err(self.map_engine("remove container", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_capabilities() {
        assert!(CAPABILITIES.contains(Capability::STATEFUL_CODE | Capability::INGRESS_PORTS));
        assert!(!CAPABILITIES.contains(Capability::GPU));
        assert!(!CAPABILITIES.contains(Capability::EGRESS_ALLOWLIST));
        assert!(!CAPABILITIES.contains(Capability::PTY));
    }
}
