//! One fake sandbox: its state ([`SandboxInner`], shared by every handle), the public
//! inspection handle ([`SandboxHandle`], what `native()` returns) and the [`FakeSandbox`]
//! that implements `Sandbox`.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sandbox_core::options::DEFAULT_OUTPUT_CAP;
use sandbox_core::policy::require;
use sandbox_core::teardown::{Killer, OrphanInfo, TeardownGuard};
use sandbox_core::{
    Capability, CodeOptions, Command, EffectiveResources, ExecResult, FileSystem, IsolationTier,
    Language, NetworkPolicy, Process, Result, RunOptions, Sandbox, SandboxError, Secret,
};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::backend::Engine;
use crate::calls::Call;
use crate::clock::Clock;
use crate::exec::{self, Job};
use crate::faults::FaultInjector;
use crate::memfs::MemFs;
use crate::processes::{ProcTable, ProcessInfo};
use crate::script::Response;
use crate::snippets::Vars;
use crate::{BACKEND_NAME, lock};

/// Lifecycle of a fake sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Life {
    Creating,
    Running,
    /// Its processes ended but the engine still holds it (listed as `Stopped` until it
    /// is killed or its deadline passes), like an exited container.
    Stopped,
    Gone,
}

/// Everything that makes up one sandbox, shared by all its handles and tasks: what it
/// was created with (its [`Spec`], reached through `Deref`) and its live state.
pub(crate) struct SandboxInner {
    spec: Spec,
    pub(crate) created_at: SystemTime,
    deadline: Mutex<Instant>,
    life: Mutex<Life>,
    fs: Mutex<MemFs>,
    procs: Mutex<ProcTable>,
    contexts: Mutex<BTreeMap<String, Vars>>,
    engine: Weak<Engine>,
}

impl std::ops::Deref for SandboxInner {
    type Target = Spec;
    fn deref(&self) -> &Spec {
        &self.spec
    }
}

/// What [`SandboxInner::new`] needs.
pub(crate) struct Spec {
    pub(crate) id: String,
    pub(crate) template: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) policy: NetworkPolicy,
    pub(crate) resources: EffectiveResources,
    /// The environment as "stored by the engine" (no secrets).
    pub(crate) env: BTreeMap<String, String>,
    /// Secrets: injected into each command's environment, stored nowhere else.
    pub(crate) secrets: BTreeMap<String, Secret>,
    pub(crate) workdir: String,
    pub(crate) lifetime: Duration,
    pub(crate) capabilities: Capability,
    pub(crate) isolation: IsolationTier,
    pub(crate) has_python: bool,
    pub(crate) clock: Clock,
}

impl SandboxInner {
    pub(crate) fn new(spec: Spec, engine: Weak<Engine>) -> Self {
        let now = spec.clock.now();
        SandboxInner {
            fs: Mutex::new(MemFs::skeleton(&spec.workdir, now)),
            procs: Mutex::new(ProcTable::new(spec.resources.pids)),
            deadline: Mutex::new(Instant::now() + spec.lifetime),
            life: Mutex::new(Life::Creating),
            contexts: Mutex::new(BTreeMap::new()),
            created_at: now,
            spec,
            engine,
        }
    }

    pub(crate) fn fs(&self) -> MutexGuard<'_, MemFs> {
        lock(&self.fs)
    }

    pub(crate) fn procs(&self) -> MutexGuard<'_, ProcTable> {
        lock(&self.procs)
    }

    /// Virtual wall time.
    pub(crate) fn now(&self) -> SystemTime {
        self.clock.now()
    }

    pub(crate) fn deadline(&self) -> Instant {
        *lock(&self.deadline)
    }

    pub(crate) fn life(&self) -> Life {
        *lock(&self.life)
    }

    pub(crate) fn set_running(&self) {
        let mut l = lock(&self.life);
        if *l == Life::Creating {
            *l = Life::Running;
        }
    }

    /// `Ok` while the sandbox is creating or running; past its deadline it is torn down here.
    pub(crate) fn alive(&self) -> Result<()> {
        match self.life() {
            Life::Creating | Life::Running if self.held() => Ok(()),
            _ => Err(self.gone()),
        }
    }

    /// Whether the engine still holds it (creating, running or stopped); past its
    /// deadline it is torn down here.
    pub(crate) fn held(&self) -> bool {
        if self.life() == Life::Gone {
            return false;
        }
        if Instant::now() >= self.deadline() {
            self.terminate();
            return false;
        }
        true
    }

    pub(crate) fn gone(&self) -> SandboxError {
        SandboxError::gone(self.id.clone())
    }

    /// Lifetime left.
    pub(crate) fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// Kills every process and context and removes the sandbox from its engine.
    /// Idempotent.
    pub(crate) fn terminate(&self) {
        if !self.end(Life::Gone) {
            return;
        }
        // Free the memory of the files; nothing can read them any more.
        *self.fs() = MemFs::skeleton("/", self.now());
        if let Some(engine) = self.engine.upgrade() {
            engine.forget(&self.id);
        }
        tracing::debug!(sandbox_id = %self.id, backend = BACKEND_NAME, "fake sandbox terminated");
    }

    /// Ends every process and context but keeps the sandbox in its engine (`Stopped`).
    pub(crate) fn stop(&self) {
        self.end(Life::Stopped);
    }

    /// Moves to `to` (`Gone`, or `Stopped` from a live state) and ends every process and
    /// context; `false` when it was already there (or gone).
    fn end(&self, to: Life) -> bool {
        {
            let mut l = lock(&self.life);
            if *l == Life::Gone || *l == to {
                return false;
            }
            *l = to;
        }
        self.procs().kill_all().iter().for_each(AbortHandle::abort);
        lock(&self.contexts).clear();
        true
    }

    /// Moves the deadline to now and tears the sandbox down.
    pub(crate) fn expire_now(&self) {
        *lock(&self.deadline) = Instant::now();
        self.terminate();
    }

    /// Records that something outside the vocabulary was refused (see
    /// [`Call::OutsideVocabulary`]).
    pub(crate) fn outside_vocabulary(&self, what: impl Into<String>) {
        self.record(Call::OutsideVocabulary {
            sandbox_id: self.id.clone(),
            what: what.into(),
        });
    }

    pub(crate) fn record(&self, call: Call) {
        if let Some(engine) = self.engine.upgrade() {
            engine.record(call);
        }
    }

    pub(crate) fn scripted_run(&self, argv: &[String]) -> Option<Response> {
        self.engine.upgrade()?.scripts().match_run(argv)
    }

    pub(crate) fn scripted_code(&self, code: &str) -> Option<Response> {
        self.engine.upgrade()?.scripts().match_code(code)
    }

    /// The environment a command sees: base env, secrets, then per-call env.
    pub(crate) fn command_env(&self, extra: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut env = self.env.clone();
        for (k, v) in &self.secrets {
            env.insert(k.clone(), v.expose().to_string());
        }
        env.extend(extra.clone());
        env
    }

    /// The variables of context `context_id` (created on first use), or a fresh set for
    /// a context-less run.
    pub(crate) fn context(&self, context_id: Option<&str>) -> Vars {
        match context_id {
            Some(id) => lock(&self.contexts)
                .entry(id.to_string())
                .or_default()
                .clone(),
            None => Vars::default(),
        }
    }
}

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
        lock(&self.0.contexts).keys().cloned().collect()
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
            inner.alive()?;
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
    pub(crate) fn new(inner: Arc<SandboxInner>, faults: FaultInjector) -> Self {
        let info = OrphanInfo::new(inner.id.clone(), BACKEND_NAME, inner.labels.clone());
        let killer = sandbox_killer(inner.clone(), faults);
        FakeSandbox {
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

    fn native(&self) -> &dyn Any {
        &self.handle
    }
}
