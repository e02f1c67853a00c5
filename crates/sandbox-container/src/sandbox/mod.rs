//! `ContainerSandbox`: one container, its lifetime, its teardown, and the `Sandbox` port.

pub(crate) mod agent;
pub(crate) mod exec;
pub(crate) mod ingress;
pub(crate) mod interpreter;
pub(crate) mod kill;
pub(crate) mod stdin;

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sandbox_core::options::DEFAULT_OUTPUT_CAP;

use crate::sandbox::stdin::Stdin;
use sandbox_core::teardown::{Killer, OrphanInfo, TeardownGuard, shielded_kill};
use sandbox_core::{
    Capability, CodeOptions, Command, ExecResult, FileSystem, IsolationTier, Process, Result,
    RunOptions, Sandbox, SandboxError, Secret, async_trait,
};

use crate::engine::{ContainerEngine, EngineError, EngineErrorKind, EngineResult};
use crate::error;
use crate::files::ContainerFiles;
use crate::provision::backend::ContainerConfig;
use crate::sandbox::ingress::Ingress;
use crate::sandbox::interpreter::ContextSlot;
use sandbox_agent::client::AgentClient;

pub use crate::sandbox::agent::ExecPath;

/// The engine and container id behind a [`ContainerSandbox`].
///
/// **Outside the semver contract**: returned by [`Sandbox::native`] for escape hatches; its
/// fields and their types (including the engine crate's version) may change in any release.
#[non_exhaustive]
pub struct ContainerNative<E> {
    /// The backend's shared engine (e.g. `DockerEngine::client()` gives the bollard client).
    pub engine: Arc<E>,
    /// The container id.
    pub container_id: String,
    /// Host loopback address of each ingress port (container port → `127.0.0.1:<port>`).
    pub ingress: BTreeMap<u16, SocketAddr>,
    /// Whether the sandbox's operations (`run`, `stream`, `run_code` and files alike) go
    /// through the in-sandbox agent or the engine's exec path.
    pub exec_path: ExecPath,
}

impl<E> std::fmt::Debug for ContainerNative<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerNative")
            .field("container_id", &self.container_id)
            .field("ingress", &self.ingress)
            .field("exec_path", &self.exec_path)
            .finish_non_exhaustive()
    }
}

/// State shared by a sandbox handle, its processes, files, contexts and teardown.
pub(crate) struct Shared<E> {
    pub engine: Arc<E>,
    pub config: Arc<ContainerConfig>,
    pub id: String,
    pub template: String,
    pub workdir: String,
    pub labels: BTreeMap<String, String>,
    pub deadline: SystemTime,
    pub tier: IsolationTier,
    pub caps: Capability,
    /// Injected into every user exec's environment, never into the container config.
    pub secrets: Vec<(String, Secret)>,
    /// Whether the template has the interpreter, by interpreter name (checked once).
    pub interpreters: Mutex<HashMap<String, bool>>,
    /// Persistent interpreters by context id.
    pub contexts: Mutex<HashMap<String, ContextSlot>>,
    /// The in-sandbox agent, when it is this container's PID 1 and answered its hello;
    /// `None` on the engine's exec path.
    pub agent: Option<AgentClient>,
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

    /// Which path user commands take.
    pub(crate) fn exec_path(&self) -> ExecPath {
        if self.agent.is_some() {
            ExecPath::Agent
        } else {
            ExecPath::Engine
        }
    }

    /// A user command as a [`Process`], through the agent when there is one.
    pub(crate) fn user_process(
        self: &Arc<Self>,
        argv: Vec<String>,
        options: &RunOptions,
        timeout: Duration,
    ) -> Result<Process> {
        let workdir = options.workdir.as_deref();
        let stdin = Stdin::of(options);
        if matches!(stdin, Stdin::Terminal(_)) && !self.caps.contains(Capability::PTY) {
            // Terminals come from the agent; the engine's exec path does not declare them.
            return Err(SandboxError::unsupported(
                Capability::PTY,
                self.engine.backend(),
            ));
        }
        self.process(argv, &options.env, workdir, timeout, stdin)
    }

    /// A process of `argv` reading `stdin`, through the agent when there is one, else the
    /// engine's exec path.
    pub(crate) fn process(
        self: &Arc<Self>,
        argv: Vec<String>,
        env: &BTreeMap<String, String>,
        workdir: Option<&str>,
        timeout: Duration,
        stdin: Stdin,
    ) -> Result<Process> {
        match &self.agent {
            Some(client) => {
                crate::sandbox::agent::process(self, client, argv, env, workdir, timeout, stdin)
            }
            None => crate::sandbox::exec::process(self, argv, env, workdir, timeout, stdin),
        }
    }

    /// What orphan warnings name.
    pub(crate) fn info(&self) -> OrphanInfo {
        OrphanInfo::new(self.id.clone(), self.engine.backend(), self.labels.clone())
    }

    /// Time left before the lifetime backstop; `SandboxGone` once it passed.
    pub(crate) fn remaining(&self) -> Result<Duration> {
        match self.deadline.duration_since(SystemTime::now()) {
            Ok(d) if !d.is_zero() => Ok(d),
            _ => Err(error::gone(&self.id)),
        }
    }

    /// Secrets plus per-call env (the container's own env is inherited by every exec).
    pub(crate) fn exec_env(&self, extra: &BTreeMap<String, String>) -> Vec<(String, String)> {
        self.secrets
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string()))
            .chain(extra.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect()
    }

    /// Whether the container still runs (a failed inspect counts as not running).
    pub(crate) async fn container_running(&self) -> bool {
        match self.call("inspect", self.engine.inspect(&self.id)).await {
            Ok(c) => c.is_running(),
            Err(e) => {
                tracing::debug!(sandbox_id = %self.id, error = %e, "container check failed");
                false
            }
        }
    }
}

/// Bounds one engine call by `limit`.
pub(crate) async fn bounded<T>(
    limit: Duration,
    op: &str,
    fut: impl Future<Output = EngineResult<T>>,
) -> EngineResult<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(EngineError::new(
            EngineErrorKind::Timeout,
            format!("{op} did not answer within {limit:?}"),
        )),
    }
}

/// Force-removes a container; one already gone counts as removed. A removal someone else
/// started (a concurrent kill, reap or sweep) is waited for, bounded.
pub(crate) async fn remove_container<E: ContainerEngine>(
    engine: &E,
    call_timeout: Duration,
    id: &str,
) -> Result<()> {
    match bounded(call_timeout, "remove", engine.remove(id)).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind == EngineErrorKind::NotFound => Ok(()),
        Err(e) if e.kind == EngineErrorKind::Conflict => {
            let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
            loop {
                match bounded(call_timeout, "inspect", engine.inspect(id)).await {
                    Err(e) if e.kind == EngineErrorKind::NotFound => return Ok(()),
                    Err(e) if e.kind != EngineErrorKind::Conflict => {
                        return Err(error::engine(engine, "inspect during removal", e));
                    }
                    _ => {}
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(error::connect(
                        id,
                        format!("container still being removed after {REMOVAL_WAIT:?}"),
                        None,
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Err(e) => Err(error::engine(engine, "remove container", e)),
    }
}

/// Longest [`remove_container`] waits for a removal someone else started.
const REMOVAL_WAIT: Duration = Duration::from_secs(10);

/// A killer that force-removes the container.
pub(crate) fn container_killer<E: ContainerEngine>(
    engine: Arc<E>,
    call_timeout: Duration,
    id: String,
) -> Killer {
    Arc::new(move || {
        let engine = engine.clone();
        let id = id.clone();
        Box::pin(async move { remove_container(&*engine, call_timeout, &id).await })
    })
}

/// A container sandbox on any [`ContainerEngine`].
///
/// Dropping it without [`Sandbox::kill`] removes the container in the background, bounded
/// by the teardown grace.
pub struct ContainerSandbox<E: ContainerEngine> {
    pub(crate) shared: Arc<Shared<E>>,
    native: ContainerNative<E>,
    files: ContainerFiles<E>,
    killer: Killer,
    teardown: tokio::sync::Mutex<TeardownGuard>,
    killed: AtomicBool,
    ingress: Mutex<Ingress>,
}

impl<E: ContainerEngine> std::fmt::Debug for ContainerSandbox<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerSandbox")
            .field("backend", &self.shared.engine.backend())
            .field("id", &self.shared.id)
            .field("template", &self.shared.template)
            .field("tier", &self.shared.tier)
            .field("workdir", &self.shared.workdir)
            .field(
                "secret_keys",
                &self
                    .shared
                    .secrets
                    .iter()
                    .map(|(k, _)| k)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<E: ContainerEngine> ContainerSandbox<E> {
    /// Wraps a started container; `guard` owns its teardown from now on.
    pub(crate) fn new(shared: Arc<Shared<E>>, guard: TeardownGuard, ingress: Ingress) -> Self {
        let killer = container_killer(
            shared.engine.clone(),
            shared.config.call_timeout,
            shared.id.clone(),
        );
        ContainerSandbox {
            native: ContainerNative {
                engine: shared.engine.clone(),
                container_id: shared.id.clone(),
                ingress: ingress.addrs.clone(),
                exec_path: shared.exec_path(),
            },
            ingress: Mutex::new(ingress),
            files: ContainerFiles::new(shared.clone()),
            shared,
            killer,
            teardown: tokio::sync::Mutex::new(guard),
            killed: AtomicBool::new(false),
        }
    }

    /// Whether `run` and `stream` go through the in-sandbox agent or the engine's exec
    /// path.
    pub fn exec_path(&self) -> ExecPath {
        self.shared.exec_path()
    }

    /// The template (image) this sandbox runs.
    pub fn template(&self) -> &str {
        &self.shared.template
    }

    /// The working directory of `run`, `run_code` and relative file paths.
    pub fn workdir(&self) -> &str {
        &self.shared.workdir
    }

    /// The host loopback address where container port `port` is reachable, for ports
    /// requested in `NetworkPolicy::ingress_ports`.
    pub fn ingress_addr(&self, port: u16) -> Option<SocketAddr> {
        self.native.ingress.get(&port).copied()
    }
}

#[async_trait]
impl<E: ContainerEngine> Sandbox for ContainerSandbox<E> {
    fn id(&self) -> &str {
        &self.shared.id
    }

    fn backend(&self) -> &str {
        self.shared.engine.backend()
    }

    fn capabilities(&self) -> Capability {
        self.shared.caps
    }

    fn isolation(&self) -> IsolationTier {
        self.shared.tier
    }

    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult> {
        sandbox_core::policy::require(self.shared.caps, Capability::RUN_COMMAND, self.backend())?;
        cmd.validate()?;
        let timeout = options.validate(self.shared.remaining()?)?;
        let cap = options.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
        let p = self.shared.user_process(cmd.to_argv(), &options, timeout)?;
        p.collect(cap).await
    }

    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        crate::sandbox::interpreter::run_code(&self.shared, code, options).await
    }

    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        sandbox_core::policy::require(self.shared.caps, Capability::STREAMING, self.backend())?;
        cmd.validate()?;
        let timeout = options.validate(self.shared.remaining()?)?;
        self.shared.user_process(cmd.to_argv(), &options, timeout)
    }

    fn files(&self) -> Result<&dyn FileSystem> {
        sandbox_core::policy::require(self.shared.caps, Capability::FILESYSTEM, self.backend())?;
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
        // On failure the guard stays armed: a later kill or the drop retries, and the
        // lifetime backstop bounds the container regardless.
        shielded_kill(self.shared.info(), (self.killer)()).await?;
        guard.disarm();
        self.killed.store(true, Ordering::SeqCst);
        let forwarders = self
            .ingress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop();
        // Once `kill` returns, the ingress ports refuse connections: wait until each
        // aborted forwarder has dropped its listener (immediate, they only await accept).
        for t in forwarders {
            let _ = t.await;
        }
        Ok(())
    }

    fn ingress_address(&self, port: u16) -> Result<SocketAddr> {
        sandbox_core::policy::require(self.shared.caps, Capability::INGRESS_PORTS, self.backend())?;
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
