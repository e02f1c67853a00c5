//! `DockerEngine`: [`ContainerEngine`] on bollard, one shared client.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use bollard::Docker;
use bollard::auth::DockerCredentials;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::PortMap;
use bollard::query_parameters::{
    AttachContainerOptions, ContainerArchiveInfoOptions, CreateContainerOptions,
    CreateImageOptions, DownloadFromContainerOptions, ListContainersOptions, ListImagesOptions,
    RemoveContainerOptions, RemoveImageOptions, UploadToContainerOptions,
};
use futures::{StreamExt, TryStreamExt};
use sandbox_container::engine::{ImageConfig, ImageImport, ImageInfo, NetworkInfo, NetworkSpec};
use sandbox_container::{
    ArchiveBody, AttachStream, ContainerEngine, ContainerInfo, ContainerSpec, EngineError,
    EngineErrorKind, EngineFacts, EngineResult, ExecRequest, ExecState, ExecStream, ImageRef,
    PathStat, PullProgress, PullRequest, RegistryAuth, Runtime, parse_rfc3339,
};
use sandbox_core::{Capability, IsolationTier, OutputChunk, Problem, SandboxError, async_trait};

use crate::config::{DockerConfig, redact_endpoint};
use crate::error::{BACKEND, during, engine_error, pull_error, start_hint};
use crate::policy;
use sandbox_container::endpoint::discovery::unavailable_or_missing;
use sandbox_container::engine::state_from_status;
use sandbox_container::engine::transfer::{FIRST_ANSWER_TIMEOUT, bounded_call};
use sandbox_container::time::from_unix_secs;

/// The Docker engine behind a [`DockerBackend`](crate::DockerBackend).
pub struct DockerEngine {
    client: Docker,
    config: DockerConfig,
    endpoint: String,
    /// The runtime is registered with `--network=none` (as `cargo xtask setup` registers
    /// runsc), so no sandbox can get a network: egress `Allow` is refused instead of ignored.
    runtime_forces_no_network: bool,
    /// Where forks with memory work, or why they do not (`checkpoint.rs`), from `/info`
    /// at connect.
    fork: Result<crate::checkpoint::ForkHost, String>,
    /// The ssh tunnel an `ssh://` endpoint goes through; it lives as long as the engine.
    _tunnel: Option<std::sync::Arc<sandbox_container::endpoint::ssh::SshTunnel>>,
}

impl std::fmt::Debug for DockerEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerEngine")
            .field("endpoint", &self.endpoint)
            .field("runtime", &self.config.runtime)
            .finish_non_exhaustive()
    }
}

impl DockerEngine {
    /// Where forks work, or the refusal naming what they need.
    fn fork_host(&self) -> EngineResult<&crate::checkpoint::ForkHost> {
        self.fork
            .as_ref()
            .map_err(|why| EngineError::new(EngineErrorKind::InvalidRequest, why.clone()))
    }

    /// The full id and the overlay2 writable layer (`UpperDir`) of container `id`.
    async fn writable_layer(&self, id: &str) -> EngineResult<(String, std::path::PathBuf)> {
        let c = self
            .client
            .inspect_container(id, None)
            .await
            .map_err(during("inspect container"))?;
        let driver = c.graph_driver.unwrap_or_default();
        match (c.id, driver.name.as_str(), driver.data.get("UpperDir")) {
            (Some(full), "overlay2", Some(upper)) => Ok((full, upper.into())),
            (_, name, _) => Err(EngineError::new(
                EngineErrorKind::InvalidRequest,
                format!("container {id} has no overlay2 writable layer (driver {name:?})"),
            )),
        }
    }

    /// Under a disk limit, the mounts Docker gave the new container `id` must be those the
    /// body asked for. Docker adds an anonymous volume on its own disk for every `VOLUME`
    /// of the image no mount covers; the container layer covered those it read, but the
    /// tag may name another image by now (re-tagged, or a registry that answered a later
    /// pull with a different image). Such a container is removed and the create refused.
    async fn refuse_unplanned_mounts(&self, spec: &ContainerSpec, id: &str) -> EngineResult<()> {
        let inspected = self
            .client
            .inspect_container(id, None)
            .await
            .map_err(during("inspect container"));
        let refusal = match inspected {
            Ok(c) => {
                let unplanned = policy::unplanned_mounts(
                    spec,
                    &self.config.options.mounts,
                    c.mounts.as_deref().unwrap_or(&[]),
                );
                if unplanned.is_empty() {
                    return Ok(());
                }
                EngineError::new(
                    EngineErrorKind::InvalidRequest,
                    format!(
                        "image `{}` gave the container volumes the disk limit does not cover, at {} \
                         (the image changed after its volumes were read): create again, or \
                         leave disk_mb unset",
                        spec.image,
                        unplanned.join(", ")
                    ),
                )
            }
            Err(e) => e,
        };
        if let Err(e) = self.remove(id).await {
            tracing::warn!(sandbox_id = %id, error = %e, "could not remove a refused container");
        }
        Err(refusal)
    }
}

/// Longest a pull may go without a progress message (the daemon reports download
/// progress about every 0.5 s while bytes flow).
const PULL_IDLE: Duration = Duration::from_secs(120);

/// The reference to pull: with an explicit `:latest` when none is given, since a bare
/// name makes the daemon pull every tag of the repository.
fn pull_reference(image: &str) -> String {
    match ImageRef::parse(image) {
        Some(r) if !image.ends_with(&r.reference) => format!("{image}{}", r.reference),
        _ => image.to_string(),
    }
}

/// Credentials as the daemon's `X-Registry-Auth` header carries them.
fn docker_credentials(auth: &RegistryAuth) -> DockerCredentials {
    DockerCredentials {
        username: Some(auth.username.clone()).filter(|u| !u.is_empty()),
        password: Some(auth.password.expose().to_string()).filter(|p| !p.is_empty()),
        serveraddress: Some(auth.server_address.clone()),
        identitytoken: auth.identity_token.as_ref().map(|t| t.expose().to_string()),
        ..Default::default()
    }
}

/// The install command for a machine without Docker.
const INSTALL: &str = "install Docker Engine: `sudo cargo xtask setup` (Debian/Ubuntu), or see https://docs.docker.com/engine/install/";

/// How long the runtime check after the first answers may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

impl DockerEngine {
    /// Connects (`config.endpoint`, else `DOCKER_HOST`, else the default socket), negotiates the
    /// API version, pings, and checks the runtime is registered. An engine that does not
    /// answer is `EngineUnavailable` with the start command as hint.
    pub async fn connect(config: DockerConfig) -> sandbox_core::Result<DockerEngine> {
        let raw_endpoint = config.resolved_endpoint();
        let endpoint = redact_endpoint(&raw_endpoint);
        let unavailable = |e: EngineError| {
            let e = SandboxError::engine_unavailable(BACKEND, &endpoint, start_hint(&endpoint))
                .with_source(e);
            // No socket and no Docker on this machine: say how to install it.
            unavailable_or_missing(e, BACKEND, &raw_endpoint, &["docker", "dockerd"], INSTALL)
        };
        // Insecure or unsupported endpoints are refused here, before any connection.
        let transport = config.transport()?;
        let (transport, tunnel) = match transport {
            crate::config::Transport::Ssh(target) => {
                let t = sandbox_container::endpoint::ssh::SshTunnel::open(BACKEND, &target).await?;
                (
                    crate::config::Transport::Local(t.endpoint()),
                    Some(std::sync::Arc::new(t)),
                )
            }
            other => (other, None),
        };
        let connect = async {
            // A missing socket fails here: the engine is unavailable, not misconfigured.
            let client = transport.client().map_err(during("connect"))?;
            let client = client
                .negotiate_version()
                .await
                .map_err(during("version"))?;
            client.ping().await.map_err(during("ping"))?;
            Ok::<_, EngineError>(client)
        };
        // Version negotiation and the ping are the engine's first answers: a wedged daemon
        // that accepts and never answers fails here within seconds.
        let client = match tokio::time::timeout(FIRST_ANSWER_TIMEOUT, connect).await {
            Ok(r) => r.map_err(unavailable)?,
            Err(_) => {
                return Err(unavailable(EngineError::new(
                    EngineErrorKind::Timeout,
                    format!("no answer within {FIRST_ANSWER_TIMEOUT:?}"),
                )));
            }
        };
        let mut engine = DockerEngine {
            client,
            config,
            endpoint,
            runtime_forces_no_network: false,
            fork: Err(String::new()),
            _tunnel: tunnel,
        };
        let socket = engine
            .config
            .resolved_endpoint()
            .strip_prefix("unix://")
            .map(std::path::PathBuf::from);
        let runtime = engine.config.runtime;
        engine.fork = if runtime != Runtime::Runc {
            // A failed /info fails the connect: forks are never left undeclared because
            // the engine could not be asked.
            let info = engine.check_runtime().await?;
            engine.runtime_forces_no_network = forces_no_network(&info, runtime);
            crate::checkpoint::probe(&info, runtime, socket.as_deref())
        } else {
            crate::checkpoint::probe(&Default::default(), runtime, socket.as_deref())
        };
        if let Err(why) = &engine.fork {
            tracing::debug!(why = %why, "forks with memory are not available");
        }
        Ok(engine)
    }

    /// The shared bollard client. **Outside the semver contract.**
    pub fn client(&self) -> &Docker {
        &self.client
    }

    /// The configuration in effect.
    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    /// The engine-side configured environment of a container (`Config.Env`), for proving
    /// that secrets are not stored there.
    pub async fn engine_env(&self, id: &str) -> EngineResult<Vec<String>> {
        let limit = self.config.layer.call_timeout;
        let c = bounded_call("container inspect", limit, async {
            let c = self.client.inspect_container(id, None).await;
            c.map_err(during("container inspect"))
        });
        Ok(c.await?.config.and_then(|c| c.env).unwrap_or_default())
    }

    /// Checks the runtime is registered; returns the engine's `/info`.
    async fn check_runtime(&self) -> sandbox_core::Result<bollard::models::SystemInfo> {
        let info = tokio::time::timeout(CONNECT_TIMEOUT, self.client.info())
            .await
            .map_err(|_| EngineError::new(EngineErrorKind::Timeout, "info timed out"))
            .and_then(|r| r.map_err(during("info")))
            .map_err(|e| {
                SandboxError::engine_unavailable(
                    BACKEND,
                    self.endpoint.clone(),
                    start_hint(&self.endpoint),
                )
                .with_source(e)
            })?;
        let name = self.config.runtime.as_str();
        match info.runtimes.as_ref().and_then(|r| r.get(name)) {
            Some(_) => Ok(info),
            None => Err(SandboxError::config(
                format!(
                    "the Docker engine at {} has no `{name}` runtime",
                    self.endpoint
                ),
                runtime_fix(self.config.runtime),
            )),
        }
    }
}

/// Whether the engine registers `runtime` with `--network=none`.
fn forces_no_network(info: &bollard::models::SystemInfo, runtime: Runtime) -> bool {
    info.runtimes
        .as_ref()
        .and_then(|r| r.get(runtime.as_str()))
        .and_then(|rt| rt.runtime_args.as_ref())
        .is_some_and(|args| {
            args.iter()
                .any(|a| a == "--network=none" || a == "--network none")
        })
}

/// The fix for a runtime the engine does not have.
pub(crate) fn runtime_fix(runtime: Runtime) -> String {
    match runtime {
        Runtime::Runsc => "install gVisor and register it: `sudo cargo xtask setup` (writes \
             /etc/docker/daemon.json {\"runtimes\":{\"runsc\":{\"path\":\"/usr/bin/runsc\",\
             \"runtimeArgs\":[\"--network=none\"]}}} and reloads dockerd with `sudo kill -HUP \
             $(pidof dockerd)`)"
            .into(),
        Runtime::Runc => "runc ships with Docker; reinstall with `sudo cargo xtask setup`".into(),
        other => format!(
            "register `{other}` under \"runtimes\" in /etc/docker/daemon.json and reload dockerd \
             (`sudo kill -HUP $(pidof dockerd)`)"
        ),
    }
}

/// Published ports as the engine reports them (`"8080/tcp"` → host address).
fn published_ports(ports: Option<PortMap>) -> BTreeMap<u16, SocketAddr> {
    let ports = ports.unwrap_or_default();
    sandbox_container::engine::published_ports(ports.iter().map(|(key, bindings)| {
        let bindings = bindings.iter().flatten();
        let pairs = bindings.map(|b| {
            let port = b.host_port.as_deref().and_then(|p| p.parse().ok());
            (b.host_ip.as_deref(), port)
        });
        (key.as_str(), pairs)
    }))
}

/// Demultiplexed output of an attach or exec as chunks.
fn output_chunks(
    output: std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    what: &'static str,
) -> futures::stream::BoxStream<'static, EngineResult<OutputChunk>> {
    output
        .map_err(during(what))
        .try_filter_map(|item| {
            futures::future::ready(Ok(match item {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    Some(OutputChunk::stdout(message))
                }
                LogOutput::StdErr { message } => Some(OutputChunk::stderr(message)),
                LogOutput::StdIn { .. } => None,
            }))
        })
        .boxed()
}

#[async_trait]
impl ContainerEngine for DockerEngine {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn tier(&self) -> IsolationTier {
        self.config.runtime.tier()
    }

    fn capabilities(&self) -> Capability {
        policy::capabilities(self.runtime_forces_no_network, self.fork.is_ok())
    }

    fn is_local(&self) -> bool {
        self.config.resolved_endpoint().starts_with("unix://")
    }

    fn netfilter_applies(&self) -> bool {
        policy::netfilter_applies(self.config.runtime)
    }

    async fn create_network(&self, spec: &NetworkSpec) -> EngineResult<()> {
        let body = policy::network_body(spec);
        let created = self.client.create_network(body).await;
        created.map(|_| ()).map_err(during("create network"))
    }

    async fn networks(&self) -> EngineResult<Vec<NetworkInfo>> {
        let list = self.client.list_networks(None).await;
        let list = list.map_err(during("list networks"))?;
        Ok(list.into_iter().map(policy::network_info).collect())
    }

    /// `Ok(false)` when missing, `Conflict` while in use (Docker answers 403 "has active
    /// endpoints").
    async fn remove_network(&self, name: &str) -> EngineResult<bool> {
        match self.client.remove_network(name).await {
            Ok(()) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 403, ..
            }) => Err(EngineError::new(
                EngineErrorKind::Conflict,
                format!("network {name} is in use"),
            )),
            Err(e) => match engine_error("remove network", e) {
                e if e.kind == EngineErrorKind::NotFound => Ok(false),
                e => Err(e),
            },
        }
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn unavailable_hint(&self) -> String {
        start_hint(&self.endpoint)
    }

    fn check_spec(&self, spec: &ContainerSpec) -> EngineResult<()> {
        sandbox_container::spec::mounts::check_against_spec(&self.config.options.mounts, spec)
            .map_err(|e| EngineError::new(EngineErrorKind::InvalidRequest, e.to_string()))?;
        policy::check_copies_against_spec(&self.config.options.mounts, spec)?;
        policy::check_spec(spec, self.config.runtime, self.runtime_forces_no_network)
    }

    fn copy_mounts(&self) -> Vec<sandbox_container::spec::mounts::Mount> {
        let copies = self.config.options.mounts.iter();
        copies
            .filter(|m| m.mode == sandbox_container::spec::mounts::MountMode::Copy)
            .cloned()
            .collect()
    }

    fn hooks(&self) -> sandbox_container::spec::hooks::Hooks {
        self.config.options.hooks.clone()
    }

    async fn create(&self, spec: &ContainerSpec) -> EngineResult<String> {
        let opts = CreateContainerOptions {
            name: Some(spec.name.clone()),
            platform: String::new(),
        };
        let body = policy::create_body(spec, self.config.runtime, &self.config.options.mounts)
            .map_err(|e| EngineError::new(EngineErrorKind::InvalidRequest, e.to_string()))?;
        let created = self
            .client
            .create_container(Some(opts), body)
            .await
            .map_err(during("create container"))?;
        for w in created.warnings {
            tracing::debug!(sandbox_id = %created.id, warning = %w, "engine warning on create");
        }
        if spec.scratch_bytes().is_some() {
            self.refuse_unplanned_mounts(spec, &created.id).await?;
        }
        Ok(created.id)
    }

    async fn start(&self, id: &str) -> EngineResult<()> {
        self.client
            .start_container(id, None)
            .await
            .map_err(during("start container"))
    }

    async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo> {
        let c = self
            .client
            .inspect_container(id, None)
            .await
            .map_err(during("inspect container"))?;
        let config = c.config.unwrap_or_default();
        let labels: BTreeMap<String, String> =
            config.labels.unwrap_or_default().into_iter().collect();
        let pid = c
            .state
            .as_ref()
            .and_then(|s| s.pid)
            .and_then(|p| u32::try_from(p).ok());
        let exit_code = c.state.as_ref().and_then(|s| s.exit_code);
        let status = c.state.and_then(|s| s.status).map(|s| s.to_string());
        let state = state_from_status(status.as_deref());
        let name = c.name.unwrap_or_default();
        let mut info =
            ContainerInfo::new(c.id.unwrap_or_else(|| id.to_string()), name, state, labels);
        info.created_at = c.created.as_deref().and_then(parse_rfc3339);
        info.image = config.image.unwrap_or_default();
        info.workdir = config.working_dir.filter(|w| !w.is_empty());
        info.pid = pid.filter(|p| *p > 0);
        info.exit_code = exit_code;
        info.addresses = policy::container_addresses(c.network_settings.as_ref());
        info.published = published_ports(c.network_settings.and_then(|n| n.ports));
        Ok(info)
    }

    fn fork_support(&self) -> Result<(), String> {
        self.fork.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    async fn checkpoint(&self, id: &str, checkpoint: &str) -> EngineResult<()> {
        self.fork_host()?;
        let opts = bollard::container::CreateCheckpointOptions {
            checkpoint_id: checkpoint.to_string(),
            checkpoint_dir: None,
            exit: true,
        };
        self.client
            .create_checkpoint(id, opts)
            .await
            .map_err(|e| engine_error("checkpoint container", e))
    }

    async fn copy_for_fork(&self, from: &str, checkpoint: &str, to: &str) -> EngineResult<()> {
        let host = self.fork_host()?;
        let (from_id, from_layer) = self.writable_layer(from).await?;
        let (to_id, to_layer) = self.writable_layer(to).await?;
        host.copy_layer(from_layer, to_layer).await?;
        host.place_checkpoint(&from_id, checkpoint, &to_id).await
    }

    async fn start_from_checkpoint(&self, id: &str, checkpoint: &str) -> EngineResult<()> {
        let host = self.fork_host()?;
        host.start_from(id, checkpoint, self.config.layer.call_timeout)
            .await
    }

    async fn remove_checkpoint(&self, id: &str, checkpoint: &str) -> EngineResult<()> {
        match self.client.delete_checkpoint(id, checkpoint, None).await {
            Ok(()) => Ok(()),
            Err(e) => match engine_error("remove checkpoint", e) {
                e if e.kind == EngineErrorKind::NotFound => Ok(()),
                e => Err(e),
            },
        }
    }

    async fn pause(&self, id: &str) -> EngineResult<()> {
        self.client
            .pause_container(id)
            .await
            .map_err(|e| engine_error("pause container", e))
    }

    async fn stop(&self, id: &str, grace: Duration) -> EngineResult<()> {
        let t = i32::try_from(grace.as_secs()).unwrap_or(i32::MAX);
        let opts = bollard::query_parameters::StopContainerOptionsBuilder::new()
            .t(t)
            .build();
        self.client
            .stop_container(id, Some(opts))
            .await
            .map_err(|e| engine_error("stop container", e))
    }

    async fn unpause(&self, id: &str) -> EngineResult<()> {
        self.client
            .unpause_container(id)
            .await
            .map_err(|e| engine_error("unpause container", e))
    }

    async fn remove(&self, id: &str) -> EngineResult<bool> {
        let opts = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match self.client.remove_container(id, Some(opts)).await {
            Ok(()) => Ok(true),
            Err(e) => {
                let e = engine_error("remove container", e);
                if e.kind == EngineErrorKind::NotFound {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
        }
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> EngineResult<Vec<ContainerInfo>> {
        let mut filters = HashMap::new();
        filters.insert(
            "label".to_string(),
            labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
        );
        let opts = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = self
            .client
            .list_containers(Some(opts))
            .await
            .map_err(during("list containers"))?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let id = c.id?;
                let name = c.names.and_then(|n| n.into_iter().next());
                let labels: BTreeMap<String, String> =
                    c.labels.unwrap_or_default().into_iter().collect();
                let status = c.state.map(|s| s.to_string());
                let state = state_from_status(status.as_deref());
                let mut info = ContainerInfo::new(id, name.unwrap_or_default(), state, labels);
                info.created_at = c.created.and_then(from_unix_secs);
                info.image = c.image.unwrap_or_default();
                Some(info)
            })
            .collect())
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> EngineResult<ExecStream> {
        let config = CreateExecOptions::<String> {
            cmd: Some(request.argv),
            env: Some(
                request
                    .env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
            ),
            working_dir: Some(request.workdir),
            attach_stdin: Some(request.stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            ..Default::default()
        };
        let created = self
            .client
            .create_exec(id, config)
            .await
            .map_err(during("create exec"))?;
        let started = self
            .client
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(during("start exec"))?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(EngineError::new(
                EngineErrorKind::Other,
                "the engine started the exec detached",
            ));
        };
        Ok(ExecStream {
            exec_id: created.id,
            output: output_chunks(output, "exec output"),
            input: request.stdin.then_some(input),
        })
    }

    fn supports_attach(&self) -> bool {
        true
    }

    /// `OpenStdin: true, StdinOnce: false` (set for every agent-mode container) keeps the
    /// main process's stdin open across attaches (trial
    /// `reattached_handle_takes_the_agent_over`).
    fn attach_survives_detach(&self) -> bool {
        true
    }

    /// A unix-socket engine runs on this host, so it can bind-mount the agent from the
    /// host's cache (when it cannot after all, e.g. a client inside a container, the
    /// container layer falls back to uploading).
    fn supports_agent_mount(&self) -> bool {
        self.is_local()
    }

    async fn attach(&self, id: &str) -> EngineResult<AttachStream> {
        // Stream only, no logs: the agent writes nothing before the host's hello, so
        // nothing is lost by attaching after start. Without a TTY, Docker copies stdin
        // verbatim (detach keys apply to TTY attaches only), so any byte of the protocol
        // may pass.
        let opts = AttachContainerOptions {
            detach_keys: None,
            logs: false,
            stream: true,
            stdin: true,
            stdout: true,
            stderr: true,
        };
        let attached = self
            .client
            .attach_container(id, Some(opts))
            .await
            .map_err(during("attach container"))?;
        Ok(AttachStream {
            output: output_chunks(attached.output, "attach output"),
            input: attached.input,
        })
    }

    async fn exec_state(&self, exec_id: &str) -> EngineResult<ExecState> {
        let i = self
            .client
            .inspect_exec(exec_id)
            .await
            .map_err(during("inspect exec"))?;
        // An absent `Running` is not trusted as finished.
        Ok(ExecState::new(i.running.unwrap_or(true), i.exit_code))
    }

    async fn put_archive(&self, id: &str, dir: &str, body: ArchiveBody) -> EngineResult<()> {
        let opts = UploadToContainerOptions {
            path: dir.to_string(),
            ..Default::default()
        };
        // An engine that stops reading fails the upload (a slow source does not).
        let limit = self.config.layer.call_timeout;
        sandbox_container::engine::transfer::bounded_upload(
            "archive upload",
            body,
            limit,
            |b| async {
                self.client
                    .upload_to_container(id, Some(opts), bollard::body_try_stream(b))
                    .await
                    .map_err(during("archive upload"))
            },
        )
        .await
    }

    async fn get_archive(&self, id: &str, path: &str) -> EngineResult<ArchiveBody> {
        let opts = DownloadFromContainerOptions {
            path: path.to_string(),
        };
        let mut s = self.client.download_from_container(id, Some(opts)).boxed();
        // bollard reports a 404 as the stream's first item: surface it here.
        let first = match s.next().await {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err(engine_error("archive download", e)),
            None => bytes::Bytes::new(),
        };
        let rest = s.map_err(|e| std::io::Error::other(engine_error("archive download", e)));
        Ok(futures::stream::once(async move { Ok(first) })
            .chain(rest)
            .boxed())
    }

    async fn stat_path(&self, id: &str, path: &str) -> EngineResult<PathStat> {
        let opts = ContainerArchiveInfoOptions {
            path: path.to_string(),
        };
        let s = self
            .client
            .get_container_archive_info(id, Some(opts))
            .await
            .map_err(during("archive stat"))?;
        let mut stat = PathStat::from_go_mode(u64::try_from(s.size).unwrap_or(0), s.file_mode);
        stat.modified = s.modification_time.as_deref().and_then(parse_rfc3339);
        stat.link_target = Some(s.link_target).filter(|t| !t.is_empty());
        Ok(stat)
    }

    async fn image_volumes(&self, image: &str) -> EngineResult<Vec<String>> {
        let i = self
            .client
            .inspect_image(image)
            .await
            .map_err(during("inspect image"))?;
        Ok(i.config.and_then(|c| c.volumes).unwrap_or_default())
    }

    async fn image_config(&self, image: &str) -> EngineResult<ImageConfig> {
        let i = self
            .client
            .inspect_image(image)
            .await
            .map_err(during("inspect image"))?;
        let c = i.config.unwrap_or_default();
        let mut config = ImageConfig::default();
        config.env = c.env.unwrap_or_default();
        config.cmd = c.cmd.filter(|c| !c.is_empty());
        config.entrypoint = c.entrypoint.filter(|e| !e.is_empty());
        config.workdir = c.working_dir.filter(|w| !w.is_empty());
        config.user = c.user.filter(|u| !u.is_empty());
        config.labels = c.labels.unwrap_or_default().into_iter().collect();
        Ok(config)
    }

    async fn export(&self, id: &str) -> EngineResult<ArchiveBody> {
        let mut s = self.client.export_container(id).boxed();
        // bollard reports a missing container as the stream's first item.
        let first = match s.next().await {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err(engine_error("export container", e)),
            None => bytes::Bytes::new(),
        };
        let rest = s.map_err(|e| std::io::Error::other(engine_error("export container", e)));
        Ok(futures::stream::once(async move { Ok(first) })
            .chain(rest)
            .boxed())
    }

    async fn import_image(&self, body: ArchiveBody, import: &ImageImport) -> EngineResult<String> {
        let opts = CreateImageOptions {
            from_src: Some("-".to_string()),
            repo: Some(import.repository().to_string()),
            tag: Some(import.tag().to_string()),
            changes: policy::import_changes(&import.config)?,
            message: Some("sandbox-rs snapshot".to_string()),
            ..Default::default()
        };
        let mut last = None;
        // An engine that stops reading fails the import (a slow export does not).
        let limit = self.config.layer.call_timeout;
        sandbox_container::engine::transfer::bounded_upload("image import", body, limit, |b| {
            let mut stream =
                self.client
                    .create_image(Some(opts), Some(bollard::body_try_stream(b)), None);
            let last = &mut last;
            async move {
                while let Some(item) = stream.next().await {
                    let info = item.map_err(during("import image"))?;
                    if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                        return Err(EngineError::new(
                            EngineErrorKind::Other,
                            sandbox_container::engine::engine_text(&format!(
                                "import image: {detail}"
                            )),
                        ));
                    }
                    if info.status.is_some() {
                        *last = info.status;
                    }
                }
                Ok(())
            }
        })
        .await?;
        match last.filter(|s| s.starts_with("sha256:")) {
            Some(id) => Ok(id),
            None => {
                let i = self
                    .client
                    .inspect_image(&import.reference)
                    .await
                    .map_err(during("inspect image"))?;
                Ok(i.id.unwrap_or_default())
            }
        }
    }

    async fn list_images(&self, labels: &BTreeMap<String, String>) -> EngineResult<Vec<ImageInfo>> {
        let filters = HashMap::from([(
            "label".to_string(),
            labels.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        )]);
        let opts = ListImagesOptions {
            filters: Some(filters),
            ..Default::default()
        };
        let list = self
            .client
            .list_images(Some(opts))
            .await
            .map_err(during("list images"))?;
        Ok(list
            .into_iter()
            .map(|i| {
                let created = from_unix_secs(i.created);
                ImageInfo::new(
                    i.id,
                    i.repo_tags
                        .into_iter()
                        .filter(|t| t != "<none>:<none>")
                        .collect(),
                    created,
                    i.labels.into_iter().collect(),
                )
            })
            .collect())
    }

    async fn remove_image(&self, image: &str) -> EngineResult<bool> {
        let opts = RemoveImageOptions {
            force: false,
            ..Default::default()
        };
        match self.client.remove_image(image, Some(opts), None).await {
            Ok(_) => Ok(true),
            Err(e) => {
                let e = engine_error("remove image", e);
                if e.kind == EngineErrorKind::NotFound {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
        }
    }

    async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        match self.client.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) => {
                let e = engine_error("inspect image", e);
                if e.kind == EngineErrorKind::NotFound {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
        }
    }

    async fn pull(&self, request: PullRequest<'_>) -> EngineResult<()> {
        let opts = CreateImageOptions {
            from_image: Some(pull_reference(request.image)),
            ..Default::default()
        };
        let mut stream =
            self.client
                .create_image(Some(opts), None, request.auth.map(docker_credentials));
        loop {
            match sandbox_container::image::next_pull_item(&mut stream, PULL_IDLE).await? {
                None => return Ok(()),
                Some(Err(e)) => return Err(pull_error(e)),
                Some(Ok(info)) => {
                    let mut p = PullProgress::new(request.image, info.status.unwrap_or_default());
                    p.layer = info.id;
                    if let Some(d) = info.progress_detail {
                        p.current = d.current.and_then(|c| u64::try_from(c).ok());
                        p.total = d.total.and_then(|t| u64::try_from(t).ok());
                    }
                    (request.progress)(p);
                }
            }
        }
    }

    async fn ping(&self) -> EngineResult<()> {
        self.client.ping().await.map(|_| ()).map_err(during("ping"))
    }

    async fn facts(&self) -> EngineFacts {
        let mut f = EngineFacts::default();
        let bound = self.config.layer.call_timeout;
        let fix = start_hint(&self.endpoint);
        let version = bounded_call("version", bound, async {
            self.client.version().await.map_err(during("version"))
        });
        f.version = f
            .answer("version", version.await, &fix)
            .and_then(|v| v.version);
        let info = bounded_call("info", bound, async {
            self.client.info().await.map_err(during("info"))
        });
        if let Some(info) = f.answer("info", info.await, &fix) {
            let mut rts: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
            rts.sort();
            if !rts.iter().any(|n| n == self.config.runtime.as_str()) {
                f.problems.push(Problem::new(
                    format!(
                        "runtime `{}` is not registered with the engine",
                        self.config.runtime
                    ),
                    runtime_fix(self.config.runtime),
                ));
            }
            f.runtimes = rts;
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_pull_latest_only() {
        assert_eq!(
            pull_reference("127.0.0.1:5000/a/b"),
            "127.0.0.1:5000/a/b:latest"
        );
        assert_eq!(pull_reference("python:3.12"), "python:3.12");
        assert_eq!(pull_reference("r:1/a@sha256:00"), "r:1/a@sha256:00");
    }

    #[test]
    fn credentials_reach_the_header_but_not_debug() {
        let a = RegistryAuth::new("127.0.0.1:5000", "user", "hunter2");
        let c = docker_credentials(&a);
        assert_eq!(c.password.as_deref(), Some("hunter2"));
        assert!(!format!("{a:?}").contains("hunter2"));
    }
}
