//! The handles of one live fake sandbox: the public inspection handle ([`SandboxHandle`],
//! what `native()` returns) and the [`FakeSandbox`] that implements `Sandbox` (capability
//! checks, recorded calls, the start of each exec). The state they share is
//! [`SandboxInner`]; running the work is `exec`'s job, files are `files`'s.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sandbox_core::options::DEFAULT_OUTPUT_CAP;
use sandbox_core::policy::require;
use sandbox_core::teardown::{Killer, OrphanInfo, TeardownGuard};
use sandbox_core::{
    Capability, CodeOptions, Command, EffectiveResources, ExecResult, FileSystem, IsolationTier,
    Language, NetworkPolicy, Process, Result, RunOptions, Sandbox, SandboxError,
};

use crate::BACKEND_NAME;
use crate::calls::Call;
use crate::exec::{self, Job};
use crate::faults::FaultInjector;
use crate::processes::ProcessInfo;
use crate::state::{Life, SandboxInner};

/// Inspection handle of one fake sandbox: what `Sandbox::native()` returns (downcast it with
/// `sandbox.native().downcast_ref::<SandboxHandle>()`) and what
/// [`FakeBackend::sandbox`](crate::FakeBackend::sandbox) gives. Cloning shares the sandbox.
///
/// Like every adapter's `native()` value it is **outside the semver contract**: methods may
/// change in any release.
#[derive(Clone)]
pub struct SandboxHandle(pub(crate) Arc<SandboxInner>);

impl std::fmt::Debug for SandboxHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxHandle")
            .field("id", &self.0.id)
            .field("template", &self.0.template)
            .field("life", &self.0.life())
            .finish()
    }
}

impl SandboxHandle {
    /// Sandbox id.
    pub fn id(&self) -> &str {
        &self.0.id
    }
    /// Template it was created from.
    pub fn template(&self) -> &str {
        &self.0.template
    }
    /// Its labels (`io.sandbox-rs.*`, metadata under `io.sandbox-rs.meta.`).
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.0.labels
    }
    /// The network policy in effect.
    pub fn policy(&self) -> &NetworkPolicy {
        &self.0.policy
    }
    /// The resources in effect.
    pub fn resources(&self) -> EffectiveResources {
        self.0.resources
    }
    /// Working directory.
    pub fn workdir(&self) -> &str {
        &self.0.workdir
    }
    /// Creation time (virtual wall clock).
    pub fn created_at(&self) -> SystemTime {
        self.0.created_at
    }
    /// Lifetime left (zero once expired).
    pub fn remaining(&self) -> Duration {
        self.0.remaining()
    }
    /// Whether it still exists (neither killed nor expired).
    pub fn is_alive(&self) -> bool {
        self.0.alive().is_ok()
    }
    /// Processes still running in it (init excluded): empty when nothing leaked.
    pub fn running_processes(&self) -> Vec<ProcessInfo> {
        self.0.procs().list()
    }
    /// Whether `pid` runs (like `kill -0`).
    pub fn is_running(&self, pid: u32) -> bool {
        !matches!(self.0.life(), Life::Gone | Life::Stopped) && self.0.procs().alive(pid)
    }
    /// Ids of the persistent interpreter contexts.
    pub fn contexts(&self) -> Vec<String> {
        self.0.context_ids()
    }
    /// The environment as stored engine-side (`KEY=VALUE`), like `docker inspect`
    /// `Config.Env`: secrets are not in it.
    pub fn engine_env(&self) -> Vec<String> {
        self.0.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }
    /// Reads a sandbox file directly (no call is recorded).
    pub fn read_file(&self, path: &str) -> Result<Bytes> {
        let p = sandbox_core::resolve_path(&self.0.workdir, path)?;
        self.0.fs_op(&p, |fs, _| fs.read(&p))
    }
    /// Writes a sandbox file directly, creating parents (no call is recorded).
    pub fn write_file(&self, path: &str, data: impl Into<Bytes>) -> Result<()> {
        let p = sandbox_core::resolve_path(&self.0.workdir, path)?;
        let data = data.into().to_vec();
        self.0.fs_op(&p, |fs, now| fs.write(&p, data, true, now))
    }
    /// Fault injection: the sandbox reaches its deadline now (everything in it dies; later
    /// use returns `SandboxGone`; it disappears from `list_managed`).
    pub fn expire_now(&self) {
        self.0.expire_now();
    }
    /// Fault injection: the sandbox stops without being removed, like a container whose
    /// init exited: its processes end, later use returns `SandboxGone`, and
    /// `list_managed` shows it `Stopped` until `kill_managed` (or its deadline) removes
    /// it.
    pub fn stop(&self) {
        self.0.stop();
    }
}

/// A fake sandbox handle (what `FakeBackend::create` returns, boxed).
///
/// Dropping it without [`Sandbox::kill`] kills the sandbox in the background through a
/// [`TeardownGuard`]. `Debug` shows the id and template, never env values or secrets.
pub struct FakeSandbox {
    handle: SandboxHandle,
    /// The backend's faults, which its forks share.
    faults: FaultInjector,
    killer: Killer,
    info: OrphanInfo,
    guard: tokio::sync::Mutex<TeardownGuard>,
}

impl std::fmt::Debug for FakeSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeSandbox")
            .field("id", &self.handle.0.id)
            .field("template", &self.handle.0.template)
            .field("isolation", &self.handle.0.isolation)
            .finish()
    }
}

/// The kill of a whole sandbox, with the kill faults of the backend handle that made it.
fn sandbox_killer(inner: Arc<SandboxInner>, faults: FaultInjector) -> Killer {
    Arc::new(move || {
        let inner = inner.clone();
        let faults = faults.clone();
        Box::pin(async move {
            // A stopped sandbox is still held, and killed like a running one.
            if !inner.is_stopped_by_call() {
                inner.alive()?;
            }
            inner.record(Call::Kill {
                sandbox_id: inner.id.clone(),
            });
            faults.before_kill(BACKEND_NAME).await?;
            inner.terminate();
            Ok(())
        })
    })
}

impl FakeSandbox {
    /// Pauses or resumes every program of the sandbox (`PAUSE_RESUME`).
    fn set_paused(&self, paused: bool) -> Result<()> {
        let inner = self.inner();
        sandbox_core::policy::require(inner.capabilities, Capability::PAUSE_RESUME, BACKEND_NAME)?;
        inner.alive()?;
        inner.touch();
        inner.set_frozen(paused);
        Ok(())
    }

    pub(crate) fn new(inner: Arc<SandboxInner>, faults: FaultInjector) -> Self {
        let info = OrphanInfo::new(inner.id.clone(), BACKEND_NAME, inner.labels.clone());
        let killer = sandbox_killer(inner.clone(), faults.clone());
        FakeSandbox {
            faults,
            guard: tokio::sync::Mutex::new(TeardownGuard::new(info.clone(), killer.clone())),
            handle: SandboxHandle(inner),
            killer,
            info,
        }
    }

    /// The inspection handle (same as `native()`).
    pub fn handle(&self) -> &SandboxHandle {
        &self.handle
    }

    pub(crate) fn inner(&self) -> &Arc<SandboxInner> {
        &self.handle.0
    }

    fn require(&self, cap: Capability) -> Result<()> {
        require(self.inner().capabilities, cap, BACKEND_NAME)
    }

    fn resolve_workdir(&self, w: Option<&str>) -> Result<String> {
        let sb = self.inner();
        let cwd = match w {
            Some(w) => sandbox_core::resolve_path(&sb.workdir, w)?,
            None => sb.workdir.clone(),
        };
        match sb.fs().get(&cwd) {
            Some(n) if n.is_dir() => Ok(cwd),
            _ => Err(SandboxError::path_not_found(cwd)),
        }
    }

    fn command_process(
        &self,
        cmd: Command,
        options: RunOptions,
        streamed: bool,
    ) -> Result<Process> {
        self.require(Capability::RUN_COMMAND)?;
        if streamed {
            self.require(Capability::STREAMING)?;
        }
        if options.stdin.is_some() || options.interactive {
            self.require(Capability::STDIN)?;
        }
        if options.pty.is_some() {
            // The fake models no terminals (never declared, so always refused).
            self.require(Capability::PTY)?;
        }
        cmd.validate()?;
        let sb = self.inner();
        sb.alive()?;
        sb.refuse_if_frozen()?;
        sb.touch();
        let timeout = options.validate(sb.remaining())?;
        let cwd = self.resolve_workdir(options.workdir.as_deref())?;
        let argv = cmd.to_argv();
        sb.record(Call::Run {
            sandbox_id: sb.id.clone(),
            argv: argv.clone(),
            streamed,
            env_keys: options.env.keys().cloned().collect(),
            workdir: cwd.clone(),
            timeout: options.timeout,
            policy: sb.policy.clone(),
        });
        let env = sb.command_env(&options.env);
        Ok(Process::new(
            exec::start(
                sb.clone(),
                Job::Argv(argv),
                env,
                cwd,
                options.stdin,
                options.interactive,
            ),
            timeout,
            exec::orphan_info(sb, "exec"),
        ))
    }
}

#[sandbox_core::async_trait]
impl Sandbox for FakeSandbox {
    fn id(&self) -> &str {
        &self.inner().id
    }

    fn backend(&self) -> &str {
        BACKEND_NAME
    }

    fn capabilities(&self) -> Capability {
        self.inner().capabilities
    }

    fn isolation(&self) -> IsolationTier {
        self.inner().isolation
    }

    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult> {
        let cap = options.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
        self.command_process(cmd, options, false)?
            .collect(cap)
            .await
    }

    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        self.require(Capability::RUN_CODE)?;
        if options.context_id.is_some() {
            self.require(Capability::STATEFUL_CODE)?;
        }
        let sb = self.inner();
        sb.alive()?;
        sb.refuse_if_frozen()?;
        sb.touch();
        let timeout = options.validate(sb.remaining())?;
        let interpreter = match options.language {
            Language::Python => "python3",
            #[allow(unreachable_patterns)]
            other => {
                return Err(SandboxError::config(
                    format!("language {other:?} is not supported by the fake backend"),
                    "use Language::Python",
                ));
            }
        };
        sb.record(Call::RunCode {
            sandbox_id: sb.id.clone(),
            code: code.to_string(),
            context_id: options.context_id.clone(),
            timeout: options.timeout,
            policy: sb.policy.clone(),
        });
        let scripted = sb.scripted_code(code);
        if scripted.is_none() && !sb.has_python {
            return Err(SandboxError::interpreter_missing(
                interpreter,
                sb.template.clone(),
            ));
        }
        let cap = options.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
        let job = Job::Code {
            code: code.to_string(),
            vars: sb.context(options.context_id.as_deref()),
            scripted,
        };
        let env = sb.command_env(&BTreeMap::new());
        Process::new(
            exec::start(sb.clone(), job, env, sb.workdir.clone(), None, false),
            timeout,
            exec::orphan_info(sb, "code"),
        )
        .collect(cap)
        .await
    }

    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        self.command_process(cmd, options, true)
    }

    fn files(&self) -> Result<&dyn FileSystem> {
        self.require(Capability::FILESYSTEM)?;
        Ok(self)
    }

    async fn kill(&self) -> Result<()> {
        let mut guard = self.guard.lock().await;
        // On failure it still runs: a fresh guard lets a later kill (or the drop) retry.
        guard.kill_now().await.inspect_err(|_| {
            *guard = TeardownGuard::new(self.info.clone(), self.killer.clone());
        })
    }

    async fn pause(&self) -> Result<()> {
        self.set_paused(true)
    }

    async fn set_egress(&self, egress: sandbox_core::Egress) -> Result<()> {
        self.require(Capability::LIVE_EGRESS)?;
        if !egress.host_ports().is_empty() {
            self.require(Capability::HOST_PORTS)?;
        }
        let mut checked = sandbox_core::NetworkPolicy::deny();
        checked.egress = egress.clone();
        checked.validate_egress()?;
        let sb = self.inner();
        sb.alive()?;
        sb.touch();
        // As on the engines: a sandbox created with egress Deny has no interface to open.
        if sb.policy.egress == sandbox_core::Egress::Deny && egress != sandbox_core::Egress::Deny {
            return Err(sandbox_core::SandboxError::config(
                "this sandbox was created with egress Deny: it has no network interface, so \
                 no other policy can be set on it",
                "create it with egress tiers that deny everything \
                 (NetworkPolicy::tiers(EgressTiers::deny_by_default())) to open it later",
            ));
        }
        sb.set_egress(egress);
        Ok(())
    }

    async fn egress(&self) -> Result<sandbox_core::Egress> {
        self.require(Capability::LIVE_EGRESS)?;
        let sb = self.inner();
        sb.alive()?;
        Ok(sb.network_now().egress)
    }

    async fn resume(&self) -> Result<()> {
        self.set_paused(false)
    }

    async fn stop(&self) -> Result<()> {
        self.require(Capability::STOP_START)?;
        let sb = self.inner();
        sb.touch();
        sb.stop_by_call()
    }

    async fn start(&self) -> Result<()> {
        self.require(Capability::STOP_START)?;
        let sb = self.inner();
        sb.touch();
        sb.restart()
    }

    async fn extend(&self, by: std::time::Duration) -> Result<std::time::SystemTime> {
        self.require(Capability::EXTEND_LIFETIME)?;
        let sb = self.inner();
        sb.alive()?;
        sb.touch();
        sb.extend(by)
    }

    async fn snapshot(&self) -> Result<sandbox_core::Snapshot> {
        let inner = self.inner();
        sandbox_core::policy::require(inner.capabilities, Capability::SNAPSHOT, BACKEND_NAME)?;
        inner.alive()?;
        inner.snapshot()
    }

    async fn fork(&self, options: sandbox_core::ForkOptions) -> Result<Vec<Box<dyn Sandbox>>> {
        self.require(Capability::SNAPSHOT_FORK)?;
        options.validate()?;
        let sb = self.inner();
        sb.alive()?;
        sb.touch();
        let lifetime = options.timeout.unwrap_or_else(|| {
            sb.deadline()
                .saturating_duration_since(tokio::time::Instant::now())
        });
        let engine = sb.engine().ok_or_else(|| sb.gone())?;
        let mut forks: Vec<Box<dyn Sandbox>> = Vec::with_capacity(options.count);
        for _ in 0..options.count {
            let fork = sb.fork_copy(engine.new_id(), lifetime, &options.metadata)?;
            crate::backend::spawn_lifetime(&fork);
            crate::backend::spawn_idle(&fork);
            forks.push(Box::new(FakeSandbox::new(fork, self.faults.clone())));
        }
        Ok(forks)
    }

    fn native(&self) -> &dyn Any {
        &self.handle
    }
}
