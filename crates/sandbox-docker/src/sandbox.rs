//! `DockerSandbox`: one container, its lifetime and its teardown.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bollard::Docker;
use bollard::query_parameters::RemoveContainerOptions;
use sandbox_core::teardown::{Killer, OrphanInfo, TeardownGuard, shielded_kill};
use sandbox_core::{
    Capability, CodeOptions, Command, ExecResult, FileSystem, IsolationTier, Process, Result,
    RunOptions, Sandbox, SandboxError, Secret, async_trait,
};
use tracing::Instrument;

use crate::code::ContextSlot;
use crate::error::{self, BACKEND, Kind};
use crate::files::DockerFiles;
use crate::ingress::Ingress;

/// The engine client and container id behind a [`DockerSandbox`].
///
/// **Outside the semver contract**: returned by [`Sandbox::native`] for escape hatches; its
/// fields and their types (including the `bollard` version) may change in any release.
#[derive(Clone)]
#[non_exhaustive]
pub struct DockerNative {
    /// The backend's shared bollard client.
    pub client: Docker,
    /// The container id.
    pub container_id: String,
    /// Host loopback address of each ingress port (container port → `127.0.0.1:<port>`).
    pub ingress: BTreeMap<u16, std::net::SocketAddr>,
}

impl std::fmt::Debug for DockerNative {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerNative")
            .field("container_id", &self.container_id)
            .field("ingress", &self.ingress)
            .finish_non_exhaustive()
    }
}

/// State shared by a sandbox handle, its processes, its files and its teardown.
pub(crate) struct SandboxInner {
    pub client: Docker,
    pub id: String,
    pub template: String,
    pub workdir: String,
    pub labels: BTreeMap<String, String>,
    pub deadline: SystemTime,
    pub caps: Capability,
    pub tier: IsolationTier,
    /// Secrets, injected into every exec's environment (never into the container config).
    pub secrets: Vec<(String, Secret)>,
    /// Whether the template has `python3` (checked once).
    pub python: tokio::sync::OnceCell<bool>,
    /// Persistent interpreters by context id.
    pub contexts: Mutex<HashMap<String, ContextSlot>>,
    exec_seq: AtomicU64,
}

impl SandboxInner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        client: Docker,
        id: String,
        template: String,
        workdir: String,
        labels: BTreeMap<String, String>,
        deadline: SystemTime,
        tier: IsolationTier,
        secrets: Vec<(String, Secret)>,
    ) -> Self {
        SandboxInner {
            client,
            id,
            template,
            workdir,
            labels,
            deadline,
            caps: crate::backend::CAPABILITIES,
            tier,
            secrets,
            python: tokio::sync::OnceCell::new(),
            contexts: Mutex::new(HashMap::new()),
            exec_seq: AtomicU64::new(0),
        }
    }

    /// What orphan warnings name.
    pub(crate) fn info(&self) -> OrphanInfo {
        OrphanInfo::new(self.id.clone(), BACKEND, self.labels.clone())
    }

    /// Time left before the lifetime backstop; `SandboxGone` once it passed.
    pub(crate) fn remaining(&self) -> Result<Duration> {
        match self.deadline.duration_since(SystemTime::now()) {
            Ok(d) if !d.is_zero() => Ok(d),
            _ => Err(self.gone()),
        }
    }

    pub(crate) fn gone(&self) -> SandboxError {
        SandboxError::SandboxGone {
            id: self.id.clone(),
        }
    }

    /// A token unique within this process, naming one exec's pid file.
    pub(crate) fn next_token(&self) -> String {
        let n = self.exec_seq.fetch_add(1, Ordering::Relaxed);
        format!(
            "{}-{}-{n}",
            sandbox_core::labels::session_id(),
            &self.id[..self.id.len().min(12)]
        )
    }

    /// The environment of one exec: secrets plus per-call env (container env is inherited).
    pub(crate) fn exec_env(&self, extra: &BTreeMap<String, String>) -> Vec<String> {
        self.secrets
            .iter()
            .map(|(k, v)| format!("{k}={}", v.expose()))
            .chain(extra.iter().map(|(k, v)| format!("{k}={v}")))
            .collect()
    }
}

/// Force-removes a container; an already removed one counts as success.
pub(crate) async fn remove_container(client: &Docker, id: &str) -> Result<()> {
    let opts = RemoveContainerOptions {
        force: true,
        v: true,
        link: false,
    };
    match client.remove_container(id, Some(opts)).await {
        Ok(()) => Ok(()),
        Err(e) if matches!(error::kind(&e), Kind::NotFound) => Ok(()),
        // Another remove (a concurrent kill, reap or startup sweep) is in flight: the
        // container still exists, so "removed" is only true once the engine says 404.
        Err(e) if matches!(error::kind(&e), Kind::NotRunning) => wait_until_gone(client, id).await,
        Err(e) => Err(error::engine("remove container", e)),
    }
}

/// Polls until the engine no longer knows `id`. Bounded: callers run under the teardown
/// grace, and this gives up after [`REMOVAL_WAIT`] on its own.
async fn wait_until_gone(client: &Docker, id: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
    loop {
        match client.inspect_container(id, None).await {
            Err(e) if matches!(error::kind(&e), Kind::NotFound) => return Ok(()),
            Err(e) if !matches!(error::kind(&e), Kind::NotRunning) => {
                return Err(error::engine("inspect container during removal", e));
            }
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(SandboxError::Connect {
                id: id.to_string(),
                message: format!("container still being removed after {REMOVAL_WAIT:?}"),
                source: None,
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Longest [`remove_container`] waits for a removal someone else started.
const REMOVAL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A killer that force-removes the container.
pub(crate) fn container_killer(client: Docker, id: String) -> Killer {
    Arc::new(move || {
        let client = client.clone();
        let id = id.clone();
        Box::pin(async move { remove_container(&client, &id).await })
    })
}

/// A Docker container sandbox.
///
/// Dropping it without [`Sandbox::kill`] removes the container in the background, bounded
/// by the teardown grace.
pub struct DockerSandbox {
    pub(crate) inner: Arc<SandboxInner>,
    native: DockerNative,
    files: DockerFiles,
    killer: Killer,
    teardown: tokio::sync::Mutex<TeardownGuard>,
    killed: AtomicBool,
    ingress: Mutex<Ingress>,
}

impl std::fmt::Debug for DockerSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerSandbox")
            .field("id", &self.inner.id)
            .field("template", &self.inner.template)
            .field("tier", &self.inner.tier)
            .field("workdir", &self.inner.workdir)
            .field(
                "secret_keys",
                &self
                    .inner
                    .secrets
                    .iter()
                    .map(|(k, _)| k)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl DockerSandbox {
    /// Wraps a started container; `guard` owns its teardown from now on.
    pub(crate) fn new(inner: Arc<SandboxInner>, guard: TeardownGuard, ingress: Ingress) -> Self {
        let killer = container_killer(inner.client.clone(), inner.id.clone());
        DockerSandbox {
            native: DockerNative {
                client: inner.client.clone(),
                container_id: inner.id.clone(),
                ingress: ingress.addrs.clone(),
            },
            ingress: Mutex::new(ingress),
            files: DockerFiles::new(inner.clone()),
            inner,
            killer,
            teardown: tokio::sync::Mutex::new(guard),
            killed: AtomicBool::new(false),
        }
    }

    /// The template (image) this sandbox runs.
    pub fn template(&self) -> &str {
        &self.inner.template
    }

    /// The host loopback address (`127.0.0.1:<port>`) where container port `port` is
    /// reachable, for ports requested in `NetworkPolicy::ingress_ports`.
    pub fn ingress_addr(&self, port: u16) -> Option<std::net::SocketAddr> {
        self.native.ingress.get(&port).copied()
    }

    /// The working directory of `run`, `run_code` and relative file paths.
    pub fn workdir(&self) -> &str {
        &self.inner.workdir
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn id(&self) -> &str {
        &self.inner.id
    }

    fn backend(&self) -> &str {
        BACKEND
    }

    fn capabilities(&self) -> Capability {
        self.inner.caps
    }

    fn isolation(&self) -> IsolationTier {
        self.inner.tier
    }

    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult> {
        crate::exec::run(&self.inner, cmd, options).await
    }

    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        crate::exec::run_code(&self.inner, code, options).await
    }

    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        crate::exec::stream(&self.inner, cmd, options)
    }

    fn files(&self) -> Result<&dyn FileSystem> {
        Ok(&self.files)
    }

    async fn kill(&self) -> Result<()> {
        if self.killed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut guard = self.teardown.lock().await;
        if self.killed.load(Ordering::SeqCst) || !guard.is_armed() {
            return Ok(());
        }
        let span =
            tracing::info_span!("sandbox.kill", backend = BACKEND, sandbox_id = %self.inner.id);
        // On failure the guard stays armed: a later kill or the drop retries, and the
        // lifetime backstop bounds the container regardless.
        shielded_kill(self.inner.info(), (self.killer)())
            .instrument(span)
            .await?;
        guard.disarm();
        self.killed.store(true, Ordering::SeqCst);
        self.ingress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop();
        Ok(())
    }

    fn ingress_address(&self, port: u16) -> Result<std::net::SocketAddr> {
        self.ingress_addr(port).ok_or_else(|| {
            SandboxError::config(
                format!("port {port} was not requested as an ingress port of this sandbox"),
                "list it in NetworkPolicy::ingress_ports when creating the sandbox",
            )
        })
    }

    fn native(&self) -> &dyn Any {
        &self.native
    }
}
