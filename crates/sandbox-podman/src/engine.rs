//! [`PodmanEngine`]: the container-engine trait of `sandbox-container` on podman-api 0.11
//! and the small REST bypass in `rest.rs`.
//!
//! Every call is bounded by [`PodmanConfig::call_timeout`] (a wedged service fails a call
//! instead of hanging it) and runs under `sandbox_container::engine::transfer::bounded_call`, which
//! also turns a panic inside podman-api into an error. An upload fails once the engine
//! stops reading for that long. Archive downloads and exec output are bounded by the
//! container layer, as for every engine.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use podman_api::Podman;
use podman_api::opts::{ContainerListFilter, ContainerListOpts, ExecCreateOpts, PullOpts};
use sandbox_container::endpoint::discovery::unavailable_or_missing;
use sandbox_container::engine::transfer::{
    FIRST_ANSWER_TIMEOUT, bounded_call, bounded_upload, demultiplex, panicked,
};
use sandbox_container::engine::{
    ImageConfig, ImageImport, ImageInfo, NetworkInfo, NetworkSpec, engine_text as bounded,
    published_ports, state_from_status,
};
use sandbox_container::image::classify_pull_failure;
use sandbox_container::time::from_unix_secs;
use sandbox_container::{
    ArchiveBody, AttachStream, ContainerEngine, ContainerInfo, ContainerSpec, CredentialStore,
    EngineError, EngineErrorKind, EngineFacts, EngineResult, ExecInput, ExecRequest, ExecState,
    ExecStream, ImageRef, NetworkMode, PathStat, PullProgress, PullRequest, RegistryAuth,
};
use sandbox_core::{Capability, IsolationTier, Problem, SandboxError};

use crate::config::{PodmanConfig, PodmanOptions};
use crate::error::{BACKEND, during, engine_error, refused, start_hint, to_sandbox_error};
use crate::policy;
use crate::rest::Rest;
use sandbox_container::spec::hooks::Hooks;
use sandbox_container::spec::mounts::{Mount, MountMode};

/// The Podman engine: one shared podman-api client plus the REST bypass, and the Podman
/// options (mounts, runtime, capabilities, hooks…) every container it creates gets.
#[derive(Clone)]
pub struct PodmanEngine {
    client: Podman,
    rest: Rest,
    endpoint: String,
    options: PodmanOptions,
    limit: Duration,
    /// The ssh tunnel an `ssh://` endpoint goes through; it lives as long as the last
    /// clone of this engine.
    _tunnel: Option<Arc<sandbox_container::endpoint::ssh::SshTunnel>>,
}

impl std::fmt::Debug for PodmanEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodmanEngine")
            .field("endpoint", &self.endpoint)
            .field("options", &self.options)
            .field("call_timeout", &self.limit)
            .finish()
    }
}

impl PodmanEngine {
    /// An engine for `config` (no engine call is made; see [`ContainerEngine::ping`]).
    /// Refuses an endpoint that is neither `unix://` nor `tcp://`, `ssh://`, and `tcp://`
    /// unless [`PodmanConfig::allow_plain_tcp`].
    pub fn new(config: &PodmanConfig) -> sandbox_core::Result<PodmanEngine> {
        config.check_endpoint()?;
        if config.ssh_target()?.is_some() {
            return Err(SandboxError::config(
                "an ssh:// endpoint needs its tunnel opened first",
                "use PodmanEngine::connect (or PodmanBackend::connect), which opens it",
            ));
        }
        Self::on(config, &config.endpoint, None)
    }

    /// An engine for `config`, opening the ssh tunnel first for an `ssh://` endpoint
    /// (see `sandbox_container::endpoint::ssh`), then pinging it (bounded by the call timeout). An
    /// engine that does not answer is `EngineUnavailable` with the start command as hint
    /// (`BackendNotInstalled` where Podman is missing from this machine).
    pub async fn connect(config: &PodmanConfig) -> sandbox_core::Result<PodmanEngine> {
        config.check_endpoint()?;
        let engine = match config.ssh_target()? {
            Some(target) => {
                let tunnel =
                    sandbox_container::endpoint::ssh::SshTunnel::open(BACKEND, &target).await?;
                let local = tunnel.endpoint();
                Self::on(config, &local, Some(Arc::new(tunnel)))
            }
            None => Self::on(config, &config.endpoint, None),
        }?;
        // The engine's first answer: a wedged service that accepts and never answers fails
        // here within seconds, not after the full per-call bound.
        let first = tokio::time::timeout(FIRST_ANSWER_TIMEOUT, engine.ping())
            .await
            .unwrap_or_else(|_| {
                Err(EngineError::new(
                    EngineErrorKind::Timeout,
                    format!("no answer within {FIRST_ANSWER_TIMEOUT:?}"),
                ))
            });
        if let Err(e) = first {
            let e = to_sandbox_error(&config.endpoint, "ping", e);
            let e = unavailable_or_missing(e, BACKEND, &config.endpoint, &["podman"], INSTALL);
            return Err(e);
        }
        Ok(engine)
    }

    /// An engine speaking to `address` (the endpoint itself, or a tunnel's local end).
    fn on(
        config: &PodmanConfig,
        address: &str,
        tunnel: Option<Arc<sandbox_container::endpoint::ssh::SshTunnel>>,
    ) -> sandbox_core::Result<PodmanEngine> {
        let rest = Rest::new(address)?;
        let client = Podman::new(address).map_err(|e| {
            SandboxError::config(
                format!("invalid Podman endpoint {:?}: {e}", config.endpoint),
                "use unix:///run/podman/podman.sock or tcp://host:port",
            )
        })?;
        Ok(PodmanEngine {
            client,
            rest,
            endpoint: config.endpoint.clone(),
            options: config.options.clone(),
            limit: config.layer.call_timeout,
            _tunnel: tunnel,
        })
    }

    /// The same engine (same client) creating containers with other Podman options.
    pub fn with_options(&self, options: PodmanOptions) -> PodmanEngine {
        PodmanEngine {
            options,
            ..self.clone()
        }
    }

    /// The podman-api client (outside semver).
    pub fn client(&self) -> &Podman {
        &self.client
    }

    /// The Podman options containers of this engine get.
    pub fn options(&self) -> &PodmanOptions {
        &self.options
    }

    /// The engine-side configured environment of a container (`Config.Env`), for proving
    /// that secrets are not stored there.
    pub async fn engine_env(&self, id: &str) -> EngineResult<Vec<String>> {
        let c = self.client.containers().get(id);
        let i = self.api("container inspect", c.inspect()).await?;
        Ok(i.config.and_then(|c| c.env).unwrap_or_default())
    }

    /// One podman-api call, bounded and panic-safe (`transfer::bounded_call`).
    async fn api<T>(
        &self,
        what: &'static str,
        fut: impl std::future::Future<Output = Result<T, podman_api::Error>>,
    ) -> EngineResult<T> {
        let call = async move { fut.await.map_err(during(what)) };
        bounded_call(what, self.limit, call).await
    }

    /// The names of the volumes mounted into container `id` (none when it cannot be
    /// inspected). This library mounts no volume of its own on Podman (scratch is tmpfs,
    /// user mounts are binds), so each is an anonymous volume of this container.
    async fn own_volumes(&self, id: &str) -> Vec<String> {
        let c = self.client.containers().get(id);
        match self.api("container inspect", c.inspect()).await {
            Ok(i) => i
                .mounts
                .unwrap_or_default()
                .into_iter()
                .filter(|m| m.type_.as_deref() == Some("volume"))
                .filter_map(|m| m.name)
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// One REST bypass call, bounded.
    async fn rest_call<T>(
        &self,
        what: &'static str,
        fut: impl std::future::Future<Output = EngineResult<T>>,
    ) -> EngineResult<T> {
        bounded_call(what, self.limit, fut).await
    }
}

/// The install command for a machine without Podman.
const INSTALL: &str = "sudo apt-get install -y podman && sudo cargo xtask setup podman";

/// Longest a pull may go without a message. Podman reports per blob, not per byte, so a
/// large layer on a slow link is silent for a while.
const PULL_IDLE: Duration = Duration::from_secs(300);

/// The pull request: credentials as the `X-Registry-Auth` header, and TLS verification
/// off only for a registry on this machine (what Docker allows for 127.0.0.0/8 without
/// configuration; Podman otherwise needs a registries.conf `insecure` entry).
fn pull_opts(image: &str, auth: Option<&RegistryAuth>) -> PullOpts {
    let mut b = PullOpts::builder().reference(image).quiet(false);
    if ImageRef::parse(image).is_some_and(|r| r.registry_is_loopback()) {
        b = b.tls_verify(false);
    }
    if let Some(a) = auth {
        let header = match &a.identity_token {
            Some(t) => podman_api::opts::RegistryAuth::token(t.expose()),
            None => podman_api::opts::RegistryAuth::builder()
                .username(a.username.clone())
                .password(a.password.expose())
                .server_address(a.server_address.clone())
                .build(),
        };
        b.auth(header);
    }
    // Never `Debug`-printed: podman-api's options show the password.
    b.build()
}

#[sandbox_core::async_trait]
impl ContainerEngine for PodmanEngine {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn tier(&self) -> IsolationTier {
        self.options.tier()
    }

    fn capabilities(&self) -> Capability {
        policy::capabilities(&self.options)
    }

    fn is_local(&self) -> bool {
        self.endpoint.starts_with("unix://")
    }

    fn netfilter_applies(&self) -> bool {
        policy::netfilter_applies(&self.options)
    }

    async fn create_network(&self, spec: &NetworkSpec) -> EngineResult<()> {
        let opts = policy::network_body(spec);
        self.api("network create", self.client.networks().create(&opts))
            .await
            .map(|_| ())
    }

    async fn networks(&self) -> EngineResult<Vec<NetworkInfo>> {
        let opts = podman_api::opts::NetworkListOpts::builder().build();
        let list = self
            .api("network list", self.client.networks().list(&opts))
            .await?;
        Ok(list.into_iter().map(policy::network_info).collect())
    }

    async fn remove_network(&self, name: &str) -> EngineResult<bool> {
        // `delete`, never podman-api's `remove`: that one passes `force=true`, which makes
        // Podman remove every container on the network with it — running sandboxes and
        // stopped ones waiting to be started included. Unforced, a network in use is
        // refused, and the caller leaves it.
        match self
            .api("network remove", self.client.networks().get(name).delete())
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.kind == EngineErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn unavailable_hint(&self) -> String {
        start_hint(&self.endpoint)
    }

    fn check_spec(&self, spec: &ContainerSpec) -> EngineResult<()> {
        policy::check_spec(spec, &self.options).map_err(|e| refused("podman options", e))
    }

    async fn create(&self, spec: &ContainerSpec) -> EngineResult<String> {
        let body = policy::create_body(spec, &self.options).map_err(|e| refused("create", e))?;
        if matches!(spec.network, NetworkMode::Isolated { .. }) {
            sandbox_container::egress::ensure_hosts_file().map_err(|e| {
                EngineError::new(
                    EngineErrorKind::Other,
                    format!(
                        "cannot write the sandbox's hosts file {}: {e}",
                        sandbox_container::egress::HOSTS_FILE
                    ),
                )
            })?;
        }
        // The create runs in a task of its own: if the caller drops `create` while the
        // engine is still creating (a cancelled create, a create timeout), the task removes
        // the container once its id arrives, however long the engine took. A removal by
        // name from outside can miss a container the engine registers only later.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let engine = self.clone();
        tokio::spawn(async move {
            let r = engine
                .rest_call("container create", engine.rest.create_container(&body))
                .await;
            if let Err(Ok(id)) = tx.send(r) {
                let _ = engine.remove(&id).await;
            }
        });
        rx.await.map_err(|_| {
            EngineError::new(EngineErrorKind::Other, "the container create task ended")
        })?
    }

    fn copy_mounts(&self) -> Vec<Mount> {
        let copies = self.options.mounts.iter();
        copies
            .filter(|m| m.mode == MountMode::Copy)
            .cloned()
            .collect()
    }

    fn hooks(&self) -> Hooks {
        self.options.hooks.clone()
    }

    async fn start(&self, id: &str) -> EngineResult<()> {
        let c = self.client.containers().get(id);
        self.api("container start", c.start(None)).await
    }

    async fn pause(&self, id: &str) -> EngineResult<()> {
        let c = self.client.containers().get(id);
        self.api("container pause", c.pause()).await
    }

    async fn stop(&self, id: &str, grace: Duration) -> EngineResult<()> {
        let c = self.client.containers().get(id);
        let opts = podman_api::opts::ContainerStopOpts::builder()
            .timeout(usize::try_from(grace.as_secs()).unwrap_or(usize::MAX))
            .build();
        self.api("container stop", c.stop(&opts)).await
    }

    async fn unpause(&self, id: &str) -> EngineResult<()> {
        let c = self.client.containers().get(id);
        self.api("container unpause", c.unpause()).await
    }

    async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo> {
        let c = self.client.containers().get(id);
        let i = self.api("container inspect", c.inspect()).await?;
        let (labels, image, workdir) = match i.config {
            Some(c) => (c.labels.unwrap_or_default(), c.image, c.working_dir),
            None => (HashMap::new(), None, None),
        };
        let labels: BTreeMap<String, String> = labels.into_iter().collect();
        let name = i.name.unwrap_or_default();
        let state = state_from_status(i.state.as_ref().and_then(|s| s.status.as_deref()));
        let pid = i
            .state
            .as_ref()
            .and_then(|s| s.pid)
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0);
        let exit_code = i.state.as_ref().and_then(|s| s.exit_code).map(i64::from);
        let addresses = policy::container_addresses(i.network_settings.as_ref());
        let mut info =
            ContainerInfo::new(i.id.unwrap_or_else(|| id.to_string()), name, state, labels);
        info.created_at = i.created.and_then(|t| from_unix_secs(t.timestamp()));
        info.image = i.image_name.or(image).unwrap_or_default();
        info.workdir = workdir.filter(|w| w.starts_with('/'));
        info.pid = pid;
        info.exit_code = exit_code;
        info.addresses = addresses;
        let ports = i.network_settings.and_then(|n| n.ports).unwrap_or_default();
        info.published = published_ports(ports.iter().map(|(key, hosts)| {
            let hosts = hosts.iter().flatten().map(|h| {
                let port = h.host_port.as_deref().and_then(|p| p.parse().ok());
                (h.host_ip.as_deref(), port)
            });
            (key.as_str(), hosts)
        }));
        Ok(info)
    }

    async fn remove(&self, id: &str) -> EngineResult<bool> {
        // The container's own volumes (an image's declared `VOLUME`s) are learned first:
        // when Podman's exit cleanup of an ephemeral container wins the race with this
        // delete, it removes the container and leaves those volumes behind.
        let volumes = self.own_volumes(id).await;
        // A removal already in flight (409) is waited for by the container layer.
        let removed = match self
            .rest_call("container delete", self.rest.remove_container(id))
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.kind == EngineErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        };
        for name in volumes {
            // Not forced: a volume still in use (the container's removal not finished)
            // stays rather than taking anything with it; gone already is the usual case.
            let _ = self
                .api("volume delete", self.client.volumes().get(&name).delete())
                .await;
        }
        removed
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> EngineResult<Vec<ContainerInfo>> {
        let filters: Vec<ContainerListFilter> = labels
            .iter()
            .map(|(k, v)| ContainerListFilter::LabelKeyVal(k.clone(), v.clone()))
            .collect();
        let opts = ContainerListOpts::builder()
            .all(true)
            .filter(filters)
            .build();
        let c = self.client.containers();
        let list = self.api("container list", c.list(&opts)).await?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let name = c.names.and_then(|n| n.into_iter().next());
                let labels = c.labels.unwrap_or_default().into_iter().collect();
                let state = state_from_status(c.state.as_deref());
                let mut info = ContainerInfo::new(c.id?, name.unwrap_or_default(), state, labels);
                info.created_at = c.created.and_then(|t| from_unix_secs(t.timestamp()));
                info.image = c.image.unwrap_or_default();
                Some(info)
            })
            .collect())
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> EngineResult<ExecStream> {
        let mut b = ExecCreateOpts::builder()
            .command(request.argv)
            .attach_stdout(true)
            .attach_stderr(true)
            .attach_stdin(request.stdin)
            .working_dir(request.workdir);
        if !request.env.is_empty() {
            b = b.env(request.env);
        }
        let opts = b.build();
        let container = self.client.containers().get(id);
        let exec = self
            .api("exec create", container.create_exec(&opts))
            .await?;
        let exec_id = exec.id().to_string();
        let upgraded = self
            .rest_call("exec start", self.rest.start_exec(&exec_id))
            .await?;
        let (reader, writer) = tokio::io::split(upgraded);
        Ok(ExecStream {
            exec_id,
            output: demultiplex(reader),
            input: request.stdin.then(|| Box::pin(writer) as ExecInput),
        })
    }

    fn supports_attach(&self) -> bool {
        true
    }

    /// No: measured on Podman 4.3 (libpod attach API), the end of any attach session
    /// closes the container's stdin (Podman has no `StdinOnce: false`), so the agent —
    /// PID 1 — sees the end of its channel and the sandbox ends. Reattached handles keep
    /// to the exec path (trial `reattached_handle_takes_the_agent_over`).
    fn attach_survives_detach(&self) -> bool {
        false
    }

    /// A unix-socket engine runs on this host, so it can bind-mount the agent from the
    /// host's cache (when it cannot after all, the container layer uploads instead).
    fn supports_agent_mount(&self) -> bool {
        self.is_local()
    }

    /// On a local engine, straight through the container's conmon attach socket
    /// (`conmon.rs`: the service would otherwise relay every live sandbox's channel,
    /// holding a connection's buffers for each); through the service's attach endpoint
    /// when that socket cannot be reached (a remote engine, a path this process cannot
    /// open).
    async fn attach(&self, id: &str) -> EngineResult<AttachStream> {
        if self.is_local() {
            let bundle = self
                .rest_call("container inspect", self.rest.static_dir(id))
                .await?
                .filter(|d| d.starts_with('/'));
            if let Some(bundle) = bundle {
                match bounded_call("conmon attach", self.limit, crate::conmon::attach(bundle)).await
                {
                    Ok(stream) => return Ok(stream),
                    Err(e) => tracing::debug!(
                        container = %id,
                        error = %e,
                        "conmon's attach socket is out of reach; attaching through the service"
                    ),
                }
            }
        }
        let upgraded = self
            .rest_call("container attach", self.rest.attach(id))
            .await?;
        let (reader, writer) = tokio::io::split(upgraded);
        Ok(AttachStream {
            output: demultiplex(reader),
            input: Box::pin(writer),
        })
    }

    async fn exec_state(&self, exec_id: &str) -> EngineResult<ExecState> {
        let exec = self.client.execs().get(exec_id);
        let v = self.api("exec inspect", exec.inspect()).await?;
        // A missing `Running` is not taken as "finished": Podman reports exit 0 while an
        // exec still runs, so only an explicit `false` releases the exit code.
        let running = v.get("Running").and_then(|r| r.as_bool()).unwrap_or(true);
        let exit_code = v.get("ExitCode").and_then(|c| c.as_i64());
        Ok(ExecState::new(
            running,
            if running { None } else { exit_code },
        ))
    }

    /// An engine that stops reading fails the upload within the call timeout (as the
    /// container layer also bounds every engine's uploads); a slow source does not.
    async fn put_archive(&self, id: &str, dir: &str, body: ArchiveBody) -> EngineResult<()> {
        let c = self.client.containers().get(id);
        bounded_upload("archive upload", body, self.limit, |body| async move {
            c.copy_to(dir, hyper::Body::wrap_stream(body))
                .await
                .map_err(during("archive upload"))
        })
        .await
    }

    async fn get_archive(&self, id: &str, path: &str) -> EngineResult<ArchiveBody> {
        let body = self
            .rest_call("archive download", self.rest.get_archive(id, path))
            .await?;
        Ok(body.map_err(std::io::Error::other).boxed())
    }

    async fn stat_path(&self, id: &str, path: &str) -> EngineResult<PathStat> {
        self.rest_call("archive stat", self.rest.stat_path(id, path))
            .await
    }

    fn credential_store(&self) -> CredentialStore {
        CredentialStore::Containers
    }

    async fn image_volumes(&self, image: &str) -> EngineResult<Vec<String>> {
        self.rest_call("image inspect", self.rest.image_volumes(image))
            .await
    }

    async fn image_config(&self, image: &str) -> EngineResult<ImageConfig> {
        self.rest_call("image inspect", self.rest.image_config(image))
            .await
    }

    async fn export(&self, id: &str) -> EngineResult<ArchiveBody> {
        let body = self
            .rest_call("container export", self.rest.export(id))
            .await?;
        Ok(body.map_err(std::io::Error::other).boxed())
    }

    async fn import_image(&self, body: ArchiveBody, import: &ImageImport) -> EngineResult<String> {
        let changes = policy::import_changes(&import.config)?;
        let mut id = String::new();
        // An engine that stops reading fails the import (a slow export does not).
        bounded_upload("image import", body, self.limit, |body| async {
            id = self
                .rest
                .import(hyper::Body::wrap_stream(body), &import.reference, &changes)
                .await?;
            Ok(())
        })
        .await?;
        Ok(id)
    }

    async fn list_images(&self, labels: &BTreeMap<String, String>) -> EngineResult<Vec<ImageInfo>> {
        self.rest_call("image list", self.rest.list_images(labels))
            .await
    }

    async fn remove_image(&self, image: &str) -> EngineResult<bool> {
        self.rest_call("image delete", self.rest.remove_image(image))
            .await
    }

    async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        let img = self.client.images().get(image);
        self.api("image exists", img.exists()).await
    }

    async fn pull(&self, request: PullRequest<'_>) -> EngineResult<()> {
        let opts = pull_opts(request.image, request.auth);
        let images = self.client.images();
        // A panic in podman-api's decoding becomes an error item (it borrows `images`,
        // so not through `unwind_safe`, which needs an owned stream).
        let mut stream = futures::stream::StreamExt::catch_unwind(std::panic::AssertUnwindSafe(
            images.pull(&opts),
        ))
        .map(|item| match item {
            Ok(r) => r.map_err(|e| engine_error("image pull", e)),
            Err(_) => Err(panicked("image pull")),
        })
        .boxed();
        let mut pulled = false;
        loop {
            let next = sandbox_container::image::next_pull_item(&mut stream, PULL_IDLE).await?;
            let report = match next {
                None => break,
                Some(Err(e)) => return Err(classify_pull_failure(e)),
                Some(Ok(r)) => r,
            };
            if let Some(err) = report.error.filter(|e| !e.is_empty()) {
                return Err(classify_pull_failure(EngineError::new(
                    EngineErrorKind::Other,
                    bounded(&format!("image pull: {err}")),
                )));
            }
            if let Some(line) = report
                .stream
                .as_deref()
                .map(str::trim)
                .filter(|l| !l.is_empty())
            {
                let mut p = PullProgress::new(request.image, line);
                // "Copying blob sha256:…" names the blob.
                p.layer = line
                    .split_whitespace()
                    .find(|w| w.starts_with("sha256:"))
                    .map(str::to_string);
                (request.progress)(p);
            }
            pulled |= report.images.is_some_and(|i| !i.is_empty()) || report.id.is_some();
        }
        if pulled {
            Ok(())
        } else {
            Err(EngineError::new(
                EngineErrorKind::Other,
                "image pull: the engine ended the pull without an image",
            ))
        }
    }

    async fn ping(&self) -> EngineResult<()> {
        self.api("ping", self.client.ping()).await.map(|_| ())
    }

    async fn facts(&self) -> EngineFacts {
        let mut f = EngineFacts::default();
        let fix = start_hint(&self.endpoint);
        let c = self.client.clone();
        let version = self.api("version", c.version()).await;
        f.version = f.answer("version", version, &fix).and_then(|v| v.version);
        let info = self.api("info", c.info()).await;
        let runtime = f
            .answer("info", info, &fix)
            .and_then(|i| i.host?.oci_runtime);
        f.runtimes.extend(runtime.and_then(|o| o.name));
        if let Some(rt) = self.options.runtime
            && !f.runtimes.iter().any(|x| x == rt.as_str())
        {
            f.runtimes.push(format!("{rt} (configured)"));
        }
        if let Ok(conf) = tokio::fs::read_to_string("/etc/containers/containers.conf").await {
            let delay = conf
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("exit_command_delay"))
                .and_then(|l| l.split('=').nth(1))
                .and_then(|v| v.trim().parse::<u64>().ok());
            match delay {
                Some(d) if d <= 30 => {}
                _ => f.problems.push(Problem::new(
                    "each Podman exec leaves a conmon process for `exit_command_delay` (default 300 s); exec-heavy use accumulates them",
                    "set `exit_command_delay = 5` under [engine] in /etc/containers/containers.conf and restart the Podman service (sudo cargo xtask setup podman)",
                )),
            }
        }
        f
    }

    fn images_hint(&self) -> String {
        "sudo cargo xtask setup podman".to_string()
    }
}
