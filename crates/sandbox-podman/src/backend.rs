//! `PodmanBackend`: connect, create (with the refusals first), connect-by-id, reaping,
//! the startup sweep and `diagnose`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use podman_api::Podman;
use podman_api::opts::{ContainerListFilter, ContainerListOpts};
use sandbox_core::labels::{
    LABEL_DEADLINE, LABEL_MANAGED, LABEL_OWNER, Owner, metadata_filter, sandbox_labels,
};
use sandbox_core::teardown::{OrphanInfo, TeardownGuard};
use sandbox_core::{
    Backend, Capability, CreateOptions, EngineReport, IsolationTier, ManagedSandbox, Problem,
    ReapableBackend, Result, Sandbox, SandboxError, SandboxState,
};
use tokio::sync::mpsc;

use crate::config::{HookEvent, HookFn, MountMode, PodmanConfig, PodmanOptions};
use crate::error::{BACKEND, START_HINT, engine, engine_msg, guard, is_not_found, is_transport};
use crate::exec::ExecTarget;
use crate::interpreter::Contexts;
use crate::policy::{capabilities_for, check, container_spec};
use crate::rest::{Rest, RestError};
use crate::sandbox::{PodmanSandbox, Shared, container_killer};
use crate::tar_stream::{ChannelWriter, DEPTH};

/// The Podman backend: one shared podman-api client (plus the small REST bypass).
#[derive(Clone)]
pub struct PodmanBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Podman,
    rest: Rest,
    config: PodmanConfig,
}

impl std::fmt::Debug for PodmanBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodmanBackend")
            .field("endpoint", &self.inner.config.endpoint)
            .field("default_template", &self.inner.config.default_template)
            .finish()
    }
}

fn unavailable(endpoint: &str, source: Option<sandbox_core::BoxError>) -> SandboxError {
    SandboxError::EngineUnavailable {
        backend: BACKEND.into(),
        endpoint: endpoint.to_string(),
        hint: START_HINT.into(),
        source,
    }
}

fn podman_installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join("podman").is_file()))
}

impl PodmanBackend {
    /// Connects to the engine (a ping), checks the backend-wide [`PodmanOptions`], and
    /// runs the startup sweep (containers whose owner process is proven gone).
    pub async fn connect(config: PodmanConfig) -> Result<PodmanBackend> {
        let rest = Rest::new(&config.endpoint)?;
        let client = Podman::new(&config.endpoint).map_err(|e| {
            SandboxError::config(
                format!("invalid Podman endpoint {:?}: {e}", config.endpoint),
                "use unix:///run/podman/podman.sock or tcp://host:port",
            )
        })?;
        config.options.validate()?;
        let c = client.clone();
        let ping = guard("ping", async {
            tokio::time::timeout(Duration::from_secs(10), c.ping())
                .await
                .map_err(|_| unavailable(&config.endpoint, None))?
                .map_err(|e| {
                    if is_transport(&e) {
                        unavailable(&config.endpoint, Some(crate::error::boxed(e)))
                    } else {
                        engine("ping", e)
                    }
                })
        })
        .await;
        if let Err(e) = ping {
            if matches!(e, SandboxError::EngineUnavailable { .. }) && !podman_installed() {
                let local_socket = config
                    .endpoint
                    .strip_prefix("unix://")
                    .is_some_and(|p| !Path::new(p).exists());
                if local_socket {
                    return Err(SandboxError::BackendNotInstalled {
                        backend: BACKEND.into(),
                        hint: "sudo apt-get install -y podman && sudo cargo xtask setup podman"
                            .into(),
                    });
                }
            }
            return Err(e);
        }
        let backend = PodmanBackend {
            inner: Arc::new(Inner {
                client,
                rest,
                config,
            }),
        };
        if backend.inner.config.startup_sweep {
            match backend.sweep().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    backend = BACKEND,
                    removed = n,
                    "startup sweep removed orphaned sandboxes"
                ),
                Err(e) => tracing::warn!(backend = BACKEND, error = %e, "startup sweep failed"),
            }
        }
        Ok(backend)
    }

    /// The podman-api client (outside semver).
    pub fn client(&self) -> &Podman {
        &self.inner.client
    }

    /// The configuration in effect.
    pub fn config(&self) -> &PodmanConfig {
        &self.inner.config
    }

    /// Creates a sandbox with explicit [`PodmanOptions`] (outside the portable contract)
    /// instead of the backend's defaults.
    pub async fn create_with(
        &self,
        options: CreateOptions,
        podman: PodmanOptions,
    ) -> Result<PodmanSandbox> {
        let caps = capabilities_for(&podman);
        let tier = podman.tier();
        let res = check(&options, &podman, caps, tier)?;
        let template = options
            .template
            .clone()
            .unwrap_or_else(|| self.inner.config.default_template.clone());
        let deadline = SystemTime::now() + options.timeout;
        let deadline_unix = deadline
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() + 1)
            .unwrap_or(0);
        let labels = sandbox_labels(BACKEND, deadline_unix, &options.metadata);
        let spec = container_spec(&options, &res, &podman, &template, &labels)?;
        let span = tracing::info_span!("sandbox.create", backend = BACKEND, template = %template, tier = %tier);
        let _e = span.enter();
        drop(_e);

        let listeners = if options.network.egress == sandbox_core::Egress::Deny {
            crate::ingress::bind(&options.network.ingress_ports).await?
        } else {
            vec![]
        };
        let id = self
            .create_detached(spec, labels.clone(), &template)
            .await?;
        // From here on the container is owned: a dropped create removes it.
        let info = OrphanInfo::new(id.clone(), BACKEND, labels.clone());
        let killer = container_killer(
            self.inner.client.clone(),
            self.inner.config.endpoint.clone(),
            id.clone(),
        );
        let mut teardown = TeardownGuard::new(info.clone(), killer.clone());
        match self.provision(&id, &template, &podman).await {
            Ok(()) => {}
            Err(e) => {
                // Teardown failure never hides the caller's error.
                let _ = teardown.kill_now().await;
                return Err(e);
            }
        }
        tracing::debug!(backend = BACKEND, sandbox_id = %id, "sandbox created");
        let target = ExecTarget {
            client: self.inner.client.clone(),
            id: id.clone(),
            workdir: options.effective_workdir().to_string(),
            secrets: Arc::new(
                options
                    .secrets
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            info,
        };
        let mut ingress = crate::ingress::addresses(&listeners);
        if options.network.egress != sandbox_core::Egress::Deny {
            // Podman's own port mappings: same port on the host's loopback.
            ingress = options
                .network
                .ingress_ports
                .iter()
                .map(|p| (*p, std::net::SocketAddr::from(([127, 0, 0, 1], *p))))
                .collect();
        }
        let forwarders = crate::ingress::spawn(&target, listeners);
        let shared = Shared {
            target,
            rest: self.inner.rest.clone(),
            template,
            deadline,
            caps,
            tier,
            contexts: Contexts::default(),
            forwarders: std::sync::Mutex::new(forwarders),
            ingress,
        };
        Ok(PodmanSandbox::new(shared, teardown, killer))
    }

    /// Creates the container in a task of its own: if the caller drops `create` while the
    /// engine is still creating, the task removes the container once its id arrives.
    async fn create_detached(
        &self,
        spec: serde_json::Value,
        labels: BTreeMap<String, String>,
        template: &str,
    ) -> Result<String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let rest = self.inner.rest.clone();
        let client = self.inner.client.clone();
        let endpoint = self.inner.config.endpoint.clone();
        tokio::spawn(async move {
            let r = rest.create_container(&spec).await;
            if let Err(Ok(id)) = tx.send(r) {
                let killer = container_killer(client, endpoint, id.clone());
                sandbox_core::teardown::spawn_bounded_kill(
                    OrphanInfo::new(id, BACKEND, labels),
                    killer(),
                );
            }
        });
        match rx.await {
            Ok(r) => r.map_err(|e| self.creation_error(template, e)),
            Err(_) => Err(engine_msg("container create task ended unexpectedly")),
        }
    }

    /// Copy mounts, `pre_start`, start, `post_start`.
    async fn provision(&self, id: &str, template: &str, podman: &PodmanOptions) -> Result<()> {
        for m in podman.mounts.iter().filter(|m| m.mode == MountMode::Copy) {
            self.inject(id, &m.host, &m.container).await?;
        }
        let event = HookEvent {
            container_id: id.to_string(),
            template: template.to_string(),
        };
        run_hook("pre_start", &podman.hooks.pre_start, &event).await?;
        let c = self.inner.client.containers().get(id);
        guard("container start", async {
            c.start(None).await.map_err(|e| SandboxError::Creation {
                backend: BACKEND.into(),
                message: "starting the container failed".into(),
                source: Some(crate::error::boxed(e)),
            })
        })
        .await?;
        run_hook("post_start", &podman.hooks.post_start, &event).await?;
        Ok(())
    }

    /// Injects a host tree into a created (not yet started) container: missing parents are
    /// created as directories, and the host tree's contents land at `target`.
    async fn inject(&self, id: &str, host: &Path, target: &str) -> Result<()> {
        let target = target.trim_end_matches('/').to_string();
        // Deepest existing ancestor: only missing components get directory entries, so
        // existing directories keep their modes.
        let mut missing: Vec<String> = Vec::new();
        let mut anchor = target.clone();
        loop {
            let st = self
                .inner
                .rest
                .stat_path(id, if anchor.is_empty() { "/" } else { &anchor })
                .await
                .map_err(|e| self.inject_error(&target, e))?;
            if st.is_some() || anchor.is_empty() {
                break;
            }
            let (parent, name) = match anchor.rsplit_once('/') {
                Some((p, n)) => (p.to_string(), n.to_string()),
                None => break,
            };
            missing.insert(0, name);
            anchor = parent;
        }
        let anchor = if anchor.is_empty() {
            "/".to_string()
        } else {
            anchor
        };
        let host_is_dir = std::fs::metadata(host).map(|m| m.is_dir()).unwrap_or(false);
        let (tx, mut rx) = mpsc::channel::<std::io::Result<bytes::Bytes>>(DEPTH);
        let host = host.to_path_buf();
        let producer = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let w = ChannelWriter::new(tx.clone());
            let mut b = tar::Builder::new(w);
            b.follow_symlinks(false);
            // Build inside a closure so a host read error poisons the writer: otherwise
            // the builder's drop would still send the end-of-archive marker and the engine
            // would accept a truncated tree as complete.
            let mut build = || -> std::io::Result<()> {
                let mut prefix = std::path::PathBuf::new();
                let dirs = if host_is_dir {
                    missing.len()
                } else {
                    missing.len().saturating_sub(1)
                };
                for name in missing.iter().take(dirs) {
                    prefix.push(name);
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    h.set_mtime(sandbox_core::labels::unix_now());
                    b.append_data(&mut h, &prefix, std::io::empty())?;
                }
                if host_is_dir {
                    let at = if prefix.as_os_str().is_empty() {
                        std::path::PathBuf::from(".")
                    } else {
                        prefix.clone()
                    };
                    b.append_dir_all(at, &host)?;
                } else {
                    let name = missing.last().cloned().unwrap_or_default();
                    if name.is_empty() {
                        return Err(std::io::Error::other(
                            "copy target of a file already exists",
                        ));
                    }
                    prefix.push(name);
                    let mut f = std::fs::File::open(&host)?;
                    b.append_file(&prefix, &mut f)?;
                }
                Ok(())
            };
            match build() {
                Ok(()) => {
                    let mut w = b.into_inner()?;
                    std::io::Write::flush(&mut w)
                }
                Err(e) => {
                    b.get_mut()
                        .fail(std::io::Error::new(e.kind(), e.to_string()));
                    Err(e)
                }
            }
        });
        let body = hyper::Body::wrap_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
        let c = self.inner.client.containers().get(id);
        let put = guard("archive upload", async {
            c.copy_to(&anchor, body)
                .await
                .map_err(|e| SandboxError::Creation {
                    backend: BACKEND.into(),
                    message: format!("copying a mount into {target} failed"),
                    source: Some(crate::error::boxed(e)),
                })
        })
        .await;
        let produced = producer
            .await
            .map_err(|_| engine_msg("copy mount task failed"))?;
        produced.map_err(|e| SandboxError::Creation {
            backend: BACKEND.into(),
            message: format!("reading the host tree for {target} failed"),
            source: Some(Box::new(e)),
        })?;
        put
    }

    fn inject_error(&self, target: &str, e: RestError) -> SandboxError {
        SandboxError::Creation {
            backend: BACKEND.into(),
            message: format!("preparing the copy mount {target} failed"),
            source: Some(Box::new(e)),
        }
    }

    fn creation_error(&self, template: &str, e: RestError) -> SandboxError {
        match &e {
            RestError::Transport(_) => unavailable(&self.inner.config.endpoint, Some(Box::new(e))),
            RestError::Status { status: 404, .. } => SandboxError::Creation {
                backend: BACKEND.into(),
                message: format!(
                    "template image `{template}` is not present in the engine (build it: sudo cargo xtask setup podman)"
                ),
                source: Some(Box::new(e)),
            },
            _ => SandboxError::Creation {
                backend: BACKEND.into(),
                message: "the engine refused the container spec".into(),
                source: Some(Box::new(e)),
            },
        }
    }

    async fn list_raw(
        &self,
        filters: Vec<ContainerListFilter>,
    ) -> Result<Vec<podman_api::models::ListContainer>> {
        let opts = ContainerListOpts::builder()
            .all(true)
            .filter(filters)
            .build();
        let c = self.inner.client.containers();
        guard("container list", async {
            c.list(&opts).await.map_err(|e| {
                if is_transport(&e) {
                    unavailable(&self.inner.config.endpoint, Some(crate::error::boxed(e)))
                } else {
                    engine("container list", e)
                }
            })
        })
        .await
    }

    /// Removes running managed containers whose owner (host, pid, start time) is proven
    /// gone. Foreign-host and unverifiable owners are kept for `reap` and the lifetime
    /// backstop; stopped (retained) containers are kept for `reap`. Returns how many were
    /// removed.
    pub async fn sweep(&self) -> Result<usize> {
        let list = self
            .list_raw(vec![ContainerListFilter::LabelKeyVal(
                LABEL_MANAGED.into(),
                "true".into(),
            )])
            .await?;
        let mut removed = 0;
        for c in list {
            let running = c.state.as_deref() == Some("running");
            let owner = c
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_OWNER))
                .and_then(|o| Owner::parse(o));
            let (Some(id), Some(owner)) = (c.id, owner) else {
                continue;
            };
            if running && owner.is_proven_gone() {
                let killer = container_killer(
                    self.inner.client.clone(),
                    self.inner.config.endpoint.clone(),
                    id.clone(),
                );
                if killer().await.is_ok() {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    async fn connect_id(&self, id: &str) -> Result<PodmanSandbox> {
        let connect_err = |m: &str| SandboxError::Connect {
            id: id.to_string(),
            message: m.to_string(),
            source: None,
        };
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            return Err(connect_err("not a container id"));
        }
        let list = self
            .list_raw(vec![
                ContainerListFilter::Id(id.into()),
                ContainerListFilter::LabelKeyVal(LABEL_MANAGED.into(), "true".into()),
            ])
            .await?;
        let Some(c) = list
            .into_iter()
            .find(|c| c.id.as_deref().is_some_and(|cid| cid.starts_with(id)))
        else {
            return Err(connect_err("no managed sandbox with this id"));
        };
        if c.state.as_deref() != Some("running") {
            return Err(connect_err("the sandbox is not running"));
        }
        let full_id = c.id.clone().unwrap_or_else(|| id.to_string());
        let labels: BTreeMap<String, String> =
            c.labels.clone().unwrap_or_default().into_iter().collect();
        let deadline = labels
            .get(LABEL_DEADLINE)
            .and_then(|d| d.parse::<u64>().ok())
            .map(|s| UNIX_EPOCH + Duration::from_secs(s))
            .unwrap_or_else(SystemTime::now);
        if deadline <= SystemTime::now() {
            return Err(connect_err("the sandbox is past its lifetime"));
        }
        let template = c.image.clone().unwrap_or_default();
        let workdir = self.workdir_of(&full_id).await;
        let info = OrphanInfo::new(full_id.clone(), BACKEND, labels);
        let killer = container_killer(
            self.inner.client.clone(),
            self.inner.config.endpoint.clone(),
            full_id.clone(),
        );
        let teardown = TeardownGuard::new(info.clone(), killer.clone());
        let shared = Shared {
            target: ExecTarget {
                client: self.inner.client.clone(),
                id: full_id,
                workdir,
                secrets: Arc::new(vec![]),
                info,
            },
            rest: self.inner.rest.clone(),
            template,
            deadline,
            caps: crate::policy::base_capabilities(),
            tier: self.inner.config.options.tier(),
            contexts: Contexts::default(),
            forwarders: std::sync::Mutex::new(vec![]),
            ingress: vec![],
        };
        Ok(PodmanSandbox::new(shared, teardown, killer))
    }

    async fn workdir_of(&self, id: &str) -> String {
        let c = self.inner.client.containers().get(id);
        let r = guard("container inspect", async {
            c.inspect()
                .await
                .map_err(|e| engine("container inspect", e))
        })
        .await;
        r.ok()
            .and_then(|i| i.config)
            .and_then(|c| c.working_dir)
            .filter(|w| w.starts_with('/'))
            .unwrap_or_else(|| sandbox_core::options::DEFAULT_WORKDIR.to_string())
    }

    /// The engine-side configured environment of a container (`Config.Env`), for proving
    /// that secrets are not stored there.
    pub async fn engine_env(&self, id: &str) -> Result<Vec<String>> {
        let c = self.inner.client.containers().get(id);
        let i = guard("container inspect", async {
            c.inspect()
                .await
                .map_err(|e| engine("container inspect", e))
        })
        .await?;
        Ok(i.config.and_then(|c| c.env).unwrap_or_default())
    }
}

async fn run_hook(name: &str, hook: &Option<HookFn>, event: &HookEvent) -> Result<()> {
    let Some(h) = hook else {
        return Ok(());
    };
    let fut = h(event.clone());
    guard(name, async {
        fut.await.map_err(|e| SandboxError::Creation {
            backend: BACKEND.into(),
            message: format!("the {name} hook failed"),
            source: Some(e),
        })
    })
    .await
}

fn state_of(s: Option<&str>) -> SandboxState {
    match s {
        Some("running") => SandboxState::Running,
        Some("created") | Some("configured") | Some("initialized") => SandboxState::Creating,
        Some("paused") => SandboxState::Paused,
        Some("exited") | Some("stopped") | Some("stopping") => SandboxState::Stopped,
        _ => SandboxState::Unknown,
    }
}

#[sandbox_core::async_trait]
impl Backend for PodmanBackend {
    fn name(&self) -> &str {
        BACKEND
    }

    fn capabilities(&self) -> Capability {
        capabilities_for(&self.inner.config.options)
    }

    fn isolation(&self) -> IsolationTier {
        self.inner.config.options.tier()
    }

    async fn create(&self, options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        let s = self
            .create_with(options, self.inner.config.options.clone())
            .await?;
        Ok(Box::new(s))
    }

    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        Ok(Box::new(self.connect_id(id).await?))
    }

    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        Some(self)
    }

    async fn diagnose(&self) -> EngineReport {
        let mut r = EngineReport::new(BACKEND, self.inner.config.endpoint.clone());
        r.tier = self.isolation();
        let c = self.inner.client.clone();
        let version = guard("version", async {
            c.version().await.map_err(|e| engine("version", e))
        })
        .await;
        match version {
            Ok(v) => {
                r.reachable = true;
                r.version = v.version;
            }
            Err(e) => {
                r.problems.push(Problem::new(
                    format!("the Podman API did not answer: {e}"),
                    START_HINT,
                ));
                return r;
            }
        }
        let info = guard("info", async {
            c.info().await.map_err(|e| engine("info", e))
        })
        .await;
        if let Ok(info) = info {
            if let Some(rt) = info.host.and_then(|h| h.oci_runtime).and_then(|o| o.name) {
                r.runtimes.push(rt);
            }
        }
        if let Some(rt) = self.inner.config.options.runtime {
            if !r.runtimes.iter().any(|x| x == rt.as_str()) {
                r.runtimes.push(format!("{rt} (configured)"));
            }
        }
        for image in [
            self.inner.config.default_template.clone(),
            "sandbox-rs/busybox:latest".to_string(),
        ] {
            let present = c.images().get(&image).exists().await.unwrap_or(false);
            if !present {
                r.problems.push(Problem::new(
                    format!("image `{image}` is missing"),
                    "sudo cargo xtask setup podman",
                ));
            }
            r.images.push((image, present));
        }
        if let Ok(conf) = std::fs::read_to_string("/etc/containers/containers.conf") {
            let delay = conf
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("exit_command_delay"))
                .and_then(|l| l.split('=').nth(1))
                .and_then(|v| v.trim().parse::<u64>().ok());
            match delay {
                Some(d) if d <= 30 => {}
                _ => r.problems.push(Problem::new(
                    "each Podman exec leaves a conmon process for `exit_command_delay` (default 300 s); exec-heavy use accumulates them",
                    "set `exit_command_delay = 5` under [engine] in /etc/containers/containers.conf and restart the Podman service (sudo cargo xtask setup podman)",
                )),
            }
        }
        r
    }
}

#[sandbox_core::async_trait]
impl ReapableBackend for PodmanBackend {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        let mut filters = vec![ContainerListFilter::LabelKeyVal(
            LABEL_MANAGED.into(),
            "true".into(),
        )];
        for (k, v) in metadata_filter(labels) {
            filters.push(ContainerListFilter::LabelKeyVal(k, v));
        }
        let list = self.list_raw(filters).await?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let id = c.id?;
                let labels: BTreeMap<String, String> =
                    c.labels.unwrap_or_default().into_iter().collect();
                let created = c
                    .created
                    .map(|t| UNIX_EPOCH + Duration::from_secs(t.timestamp().max(0) as u64));
                Some(ManagedSandbox::new(
                    id,
                    BACKEND,
                    state_of(c.state.as_deref()),
                    created,
                    labels,
                ))
            })
            .collect())
    }

    async fn kill_managed(&self, id: &str) -> Result<bool> {
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            return Ok(false);
        }
        let list = self
            .list_raw(vec![
                ContainerListFilter::Id(id.into()),
                ContainerListFilter::LabelKeyVal(LABEL_MANAGED.into(), "true".into()),
            ])
            .await?;
        let Some(full) = list
            .into_iter()
            .filter_map(|c| c.id)
            .find(|c| c.starts_with(id))
        else {
            return Ok(false);
        };
        let opts = podman_api::opts::ContainerDeleteOpts::builder()
            .force(true)
            .timeout(0)
            .build();
        let c = self.inner.client.containers().get(&full);
        guard("container delete", async {
            match c.delete(&opts).await {
                Ok(()) => Ok(true),
                Err(e) if is_not_found(&e) => Ok(false),
                Err(e) => Err(engine("container delete", e)),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_map() {
        assert_eq!(state_of(Some("running")), SandboxState::Running);
        assert_eq!(state_of(Some("exited")), SandboxState::Stopped);
        assert_eq!(state_of(Some("created")), SandboxState::Creating);
        assert_eq!(state_of(None), SandboxState::Unknown);
    }
}
