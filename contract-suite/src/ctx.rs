//! The shared context of a suite run and the helpers every trial uses.

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use libtest_mimic::{Completion, Failed, Trial};
use sandbox_core::labels::{LABEL_SESSION, session_id};
use sandbox_core::teardown::teardown_grace;
use sandbox_core::{
    Backend, Capability, Command, CreateOptions, ErrorCode, ExecResult, IsolationTier,
    ManagedSandbox, ReapableBackend, RunOptions, Sandbox, SandboxError,
};

use crate::probes::{CanarySpec, Faults, Probes};

tokio::task_local! {
    /// The template the running trial's sandboxes use instead of the base one.
    static TEMPLATE: String;
}

thread_local! {
    /// The template trials being built now run on (see [`Ctx::on_template`]).
    static BUILDING_ON: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// The short name of a template in trial names: `sandbox-rs/busybox:latest` → `busybox`.
pub fn template_label(template: &str) -> String {
    let name = template.rsplit('/').next().unwrap_or(template);
    name.split(':').next().unwrap_or(name).to_string()
}

/// Metadata key every trial sandbox carries (`contract=<area>::<case>`).
pub const CASE_LABEL: &str = "contract";

/// Longest a single trial may take before it is failed (a hung adapter must not hang the
/// suite).
pub const TRIAL_BUDGET: Duration = Duration::from_secs(180);

/// State shared by every trial of one suite run.
pub struct Ctx {
    /// The one multi-thread runtime all trials run on (engine clients are tied to it).
    pub rt: tokio::runtime::Runtime,
    /// The backend under test.
    pub backend: Arc<dyn Backend>,
    /// The adapter's probes.
    pub probes: Arc<dyn Probes>,
    /// `backend.capabilities()`, read once.
    pub caps: Capability,
    /// `backend.isolation()`, read once.
    pub tier: IsolationTier,
    /// The running canary server, when the adapter provides a canary probe.
    pub canary: Option<Canary>,
    /// Why the canary server could not start (the canary trials then fail with it).
    pub canary_error: Option<String>,
    /// Fault injection, when provided.
    pub faults: Option<Arc<dyn Faults>>,
    /// Why the faults probe failed (the fault trials then fail with it).
    pub faults_error: Option<String>,
    /// Why no trial can run (the backend factory failed), and whether that fails them.
    pub unavailable: Option<Unavailable>,
    /// Serialises trials that use [`Faults`] (fault state is global to the fault backend).
    pub fault_lock: tokio::sync::Mutex<()>,
    /// Serialises trials that measure this process's memory or allocate a lot.
    pub heavy_lock: tokio::sync::Mutex<()>,
    pub(crate) background_kills: Arc<AtomicUsize>,
    /// How many trials reported "not applicable" in this run (counted apart from passes).
    pub(crate) not_applicable: Arc<AtomicUsize>,
}

/// The backend could not be created.
#[derive(Debug, Clone)]
pub struct Unavailable {
    /// The error, rendered.
    pub reason: String,
    /// `true` with `CI=true` or `SBX_CONTRACT_REQUIRED=1`: trials fail instead of being
    /// ignored.
    pub fail: bool,
}

/// The suite's canary TCP server: every connection receives `<token>\n`.
#[derive(Debug, Clone)]
pub struct Canary {
    /// The spec the adapter gave.
    pub spec: CanarySpec,
    /// The port actually bound.
    pub port: u16,
    /// The random token the server sends.
    pub token: String,
}

impl Canary {
    /// The in-sandbox egress probe command: `nc -w 3 <dial_host> <port>`.
    pub fn probe_command(&self) -> Command {
        Command::Argv(vec![
            "nc".into(),
            "-w".into(),
            "3".into(),
            self.spec.dial_host.clone(),
            self.port.to_string(),
        ])
    }
}

/// A precondition of a trial. Unmet preconditions mark the trial ignored with the reason
/// in its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The backend declares these capabilities (positive trial).
    Cap(Capability),
    /// The backend does not declare this capability (negative trial).
    Lacks(Capability),
    /// A canary probe.
    Canary,
    /// A fault-injection probe.
    Faults,
    /// A template without python3.
    TemplateWithoutPython,
    /// The backend is a `ReapableBackend`.
    Reapable,
    /// The adapter can create symlinks inside a sandbox (`Probes::symlinks`).
    Symlinks,
    /// Evidence read from the kernel inside the sandbox (capabilities, cgroups,
    /// `/proc/net/dev`) means something: false for an in-process backend
    /// (`Probes::in_process`), whose trials then report "not applicable", counted apart.
    KernelEvidence,
}

/// The reason a kernel-evidence trial gives on an in-process backend.
pub const NOT_APPLICABLE_IN_PROCESS: &str = "not applicable: in-process backend";

impl Ctx {
    /// The reason a trial with these needs cannot run, if any.
    pub fn unmet(&self, needs: &[Need]) -> Option<String> {
        for n in needs {
            let missing = match n {
                Need::Cap(c) if !self.caps.contains(*c) => {
                    Some(format!("{} not declared", (*c - self.caps).names()))
                }
                Need::Lacks(c) if self.caps.contains(*c) => {
                    Some(format!("{} declared; positive trials cover it", c.names()))
                }
                Need::Canary if self.canary.is_none() && self.canary_error.is_none() => {
                    Some("no canary probe".into())
                }
                Need::Faults if self.faults.is_none() && self.faults_error.is_none() => {
                    Some("no faults probe".into())
                }
                Need::TemplateWithoutPython if self.probes.template_without_python().is_none() => {
                    Some("no template_without_python probe".into())
                }
                Need::Reapable if self.backend.as_reapable().is_none() => {
                    Some("backend is not a ReapableBackend".into())
                }
                Need::Symlinks if !self.probes.symlinks() => {
                    Some("adapter declares no symlink support (Probes::symlinks)".into())
                }
                _ => None,
            };
            if missing.is_some() {
                return missing;
            }
        }
        None
    }

    /// Builds the trial `contract::<area>::<case>` running `case` on the shared runtime,
    /// or an ignored / failing trial with the reason in its name.
    pub fn trial<F, Fut>(self: &Arc<Self>, area: &str, case: &str, needs: &[Need], f: F) -> Trial
    where
        F: FnOnce(Arc<Ctx>) -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let template = BUILDING_ON.with(|b| b.borrow().clone());
        let name = match &template {
            Some(t) => format!("contract::{area}::{case}@{}", template_label(t)),
            None => format!("contract::{area}::{case}"),
        };
        let f = move |ctx: Arc<Ctx>| {
            let fut = f(ctx);
            async move {
                match template {
                    Some(t) => TEMPLATE.scope(t, fut).await,
                    None => fut.await,
                }
            }
        };
        if let Some(u) = &self.unavailable {
            if u.fail {
                let reason = u.reason.clone();
                return Trial::test(name, move || {
                    Err(Failed::from(format!("backend unavailable: {reason}")))
                });
            }
            let why = format!("ignored: {}", u.reason);
            return Trial::test(format!("{name} [ignored: {}]", u.reason), move || {
                Err(Failed::from(why))
            })
            .with_ignored_flag(true);
        }
        if let Some(reason) = self.unmet(needs) {
            // Run with `--include-ignored`, an ignored trial still proves nothing: it fails
            // instead of passing.
            let why = format!("ignored: {reason}");
            return Trial::test(format!("{name} [ignored: {reason}]"), move || {
                Err(Failed::from(why))
            })
            .with_ignored_flag(true);
        }
        if needs.contains(&Need::KernelEvidence) && self.probes.in_process() {
            let counter = self.not_applicable.clone();
            return Trial::ignorable_test(
                format!("{name} [{NOT_APPLICABLE_IN_PROCESS}]"),
                move || {
                    counter.fetch_add(1, Ordering::SeqCst);
                    Ok(Completion::ignored_with(NOT_APPLICABLE_IN_PROCESS))
                },
            );
        }
        let ctx = self.clone();
        Trial::ignorable_test(name, move || {
            let fut = f(ctx.clone());
            let outcome = ctx
                .rt
                .block_on(async { tokio::time::timeout(TRIAL_BUDGET, fut).await });
            match outcome {
                Ok(Ok(())) => Ok(Completion::Completed),
                Ok(Err(e)) => {
                    if let Some(skip) = e.downcast_ref::<Skip>() {
                        return Ok(Completion::ignored_with(skip.0.clone()));
                    }
                    if let Some(na) = e.downcast_ref::<NotApplicable>() {
                        ctx.not_applicable.fetch_add(1, Ordering::SeqCst);
                        return Ok(Completion::ignored_with(format!(
                            "not applicable: {}",
                            na.0
                        )));
                    }
                    Err(Failed::from(format!("{e:#}")))
                }
                Err(_) => Err(Failed::from(format!(
                    "trial did not finish within {TRIAL_BUDGET:?}"
                ))),
            }
        })
    }

    /// The running canary server (trials that call this declare `Need::Canary`).
    pub fn canary(&self) -> anyhow::Result<&Canary> {
        match (&self.canary, &self.canary_error) {
            (Some(c), _) => Ok(c),
            (None, Some(e)) => bail!("{e}"),
            (None, None) => bail!("no canary probe"),
        }
    }

    /// The fault probe (trials that call this declare `Need::Faults`).
    pub fn faults(&self) -> anyhow::Result<Arc<dyn Faults>> {
        match (&self.faults, &self.faults_error) {
            (Some(f), _) => Ok(f.clone()),
            (None, Some(e)) => bail!("{e}"),
            (None, None) => bail!("no faults probe"),
        }
    }

    /// The options a trial starts from: the adapter's base options (on the template the
    /// trial runs on, see [`Ctx::on_template`]) plus `contract=<case>` metadata.
    pub fn opts(&self, case: &str) -> CreateOptions {
        let base = self.probes.base_options();
        let base = match TEMPLATE.try_with(Clone::clone) {
            Ok(t) => base.template(t),
            Err(_) => base,
        };
        base.metadata(CASE_LABEL, case)
    }

    /// Builds trials with `build` once more on `template`: each is named
    /// `contract::<area>::<case>@<image name>` and creates its sandboxes from `template`.
    pub fn on_template(&self, template: &str, build: impl FnOnce() -> Vec<Trial>) -> Vec<Trial> {
        BUILDING_ON.with(|b| *b.borrow_mut() = Some(template.to_string()));
        let trials = build();
        BUILDING_ON.with(|b| *b.borrow_mut() = None);
        trials
    }

    /// Creates a sandbox from `opts` (adding `contract=<case>`), wrapped in a guard that
    /// always kills it.
    pub async fn create(&self, case: &str, opts: CreateOptions) -> anyhow::Result<Sbx> {
        self.create_on(&self.backend, case, opts).await
    }

    /// [`Self::create`] through `backend` (the suite's backend with more in front of it:
    /// an audit sink).
    pub async fn create_on(
        &self,
        backend: &Arc<dyn Backend>,
        case: &str,
        opts: CreateOptions,
    ) -> anyhow::Result<Sbx> {
        let opts = opts.metadata(CASE_LABEL, case);
        let sb = backend
            .create(opts)
            .await
            .map_err(|e| anyhow!("create failed: {}", e.render()))?;
        Ok(Sbx::new(sb, self.background_kills.clone()))
    }

    /// Creates a sandbox with the base options.
    pub async fn sandbox(&self, case: &str) -> anyhow::Result<Sbx> {
        self.create(case, self.opts(case)).await
    }

    /// The backend as a `ReapableBackend` (trials that call this declare `Need::Reapable`).
    pub fn reaper(&self) -> anyhow::Result<&dyn ReapableBackend> {
        self.backend
            .as_reapable()
            .ok_or_else(|| anyhow!("backend is not a ReapableBackend"))
    }

    /// Sandboxes of this session carrying `contract=<case>`.
    pub async fn listed(&self, case: &str) -> anyhow::Result<Vec<ManagedSandbox>> {
        let mut filter = BTreeMap::new();
        filter.insert(CASE_LABEL.to_string(), case.to_string());
        filter.insert(LABEL_SESSION.to_string(), session_id().to_string());
        self.reaper()?
            .list_managed(&filter)
            .await
            .map_err(|e| anyhow!("list_managed failed: {}", e.render()))
    }

    /// Waits until no sandbox of this session carries `contract=<case>` (within the
    /// teardown grace plus `margin`).
    pub async fn wait_unlisted(&self, case: &str, margin: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + teardown_grace() + margin;
        loop {
            let left = self.listed(case).await?;
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let ids: Vec<_> = left.iter().map(|m| (m.id.clone(), m.state)).collect();
                bail!(
                    "sandboxes of case `{case}` still listed {:?} after the grace: {ids:?}",
                    teardown_grace() + margin
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until sandbox `id` is no longer listed (within grace plus `margin`).
    pub async fn wait_id_unlisted(
        &self,
        case: &str,
        id: &str,
        margin: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + teardown_grace() + margin;
        loop {
            let left = self.listed(case).await?;
            if !left.iter().any(|m| m.id == id) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "sandbox {id} still listed {:?} after it should be gone",
                    teardown_grace() + margin
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The counter of the suite's background kills, for guarding sandboxes a trial did not
    /// create itself (forks).
    pub fn background_counter(&self) -> Arc<AtomicUsize> {
        self.background_kills.clone()
    }

    /// Waits for the suite's own background kills (guards dropped in failing trials).
    pub async fn wait_background_kills(&self, max: Duration) {
        let deadline = Instant::now() + max;
        while self.background_kills.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The records of `operation` for sandbox `id` in `sink`, once `done` holds for them
/// or after five seconds (a relay may write a request's record a moment after the
/// sandbox got its answer).
pub async fn records_when(
    sink: &sandbox_core::layer::MemorySink,
    operation: &str,
    id: &str,
    done: impl Fn(&[sandbox_core::layer::AuditRecord]) -> bool,
) -> Vec<sandbox_core::layer::AuditRecord> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let records: Vec<_> = sink
            .records()
            .into_iter()
            .filter(|r| r.operation == operation && r.sandbox_id.as_deref() == Some(id))
            .collect();
        if done(&records) || Instant::now() > deadline {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A trial's sandbox: derefs to the `Sandbox`; dropping it without [`Sbx::kill`] kills the
/// sandbox explicitly in the background (so failing trials clean up too).
pub struct Sbx {
    inner: Option<Box<dyn Sandbox>>,
    background: Arc<AtomicUsize>,
}

impl Sbx {
    /// Wraps a sandbox.
    pub fn new(sb: Box<dyn Sandbox>, background: Arc<AtomicUsize>) -> Self {
        Sbx {
            inner: Some(sb),
            background,
        }
    }

    /// Kills the sandbox and returns the kill result.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        let sb = self.inner.take().context("sandbox already taken")?;
        sb.kill()
            .await
            .map_err(|e| anyhow!("kill failed: {}", e.render()))
    }

    /// Gives up the guard: the caller owns the raw handle (and its drop behaviour).
    pub fn into_inner(mut self) -> Box<dyn Sandbox> {
        self.inner.take().expect("sandbox present until taken")
    }
}

impl Deref for Sbx {
    type Target = dyn Sandbox;
    fn deref(&self) -> &Self::Target {
        self.inner.as_deref().expect("sandbox present until taken")
    }
}

impl Drop for Sbx {
    fn drop(&mut self) {
        if let Some(sb) = self.inner.take()
            && let Ok(h) = tokio::runtime::Handle::try_current()
        {
            let counter = self.background.clone();
            counter.fetch_add(1, Ordering::SeqCst);
            h.spawn(async move {
                let _ = tokio::time::timeout(teardown_grace() * 2, sb.kill()).await;
                counter.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }
}

/// Marks a trial ignored at run time with a reason (return `Err(Skip(..).into())`).
#[derive(Debug)]
pub struct Skip(pub String);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ignored: {}", self.0)
    }
}

impl std::error::Error for Skip {}

/// Marks a trial "not applicable" at run time, with the adapter's reason (return
/// `Err(NotApplicable(..).into())`): the backend cannot be in the state the trial needs
/// ([`Injection::Impossible`](crate::Injection::Impossible)). Counted apart from passes
/// and from ignored trials, like the kernel-evidence trials on an in-process backend.
#[derive(Debug)]
pub struct NotApplicable(pub String);

impl std::fmt::Display for NotApplicable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not applicable: {}", self.0)
    }
}

impl std::error::Error for NotApplicable {}

/// Turns what a probe did into "go on", or the trial's not-applicable / ignored outcome.
pub fn injected(what: &str, i: crate::probes::Injection) -> anyhow::Result<()> {
    match i {
        crate::probes::Injection::Injected => Ok(()),
        crate::probes::Injection::Impossible(why) => Err(NotApplicable(why).into()),
        crate::probes::Injection::NotProvided => {
            Err(Skip(format!("the adapter's probes do not provide {what}")).into())
        }
        crate::probes::Injection::Removed(why) => Err(anyhow::anyhow!(
            "the probe for {what} answered Removed ({why}), which only stop_sandbox may"
        )),
    }
}

/// Asserts `result` is an error with `code`; returns the error.
pub fn must_code<T: std::fmt::Debug>(
    result: sandbox_core::Result<T>,
    code: ErrorCode,
) -> anyhow::Result<SandboxError> {
    match result {
        Ok(v) => bail!("expected {code:?} ({}), got Ok({v:?})", code.as_str()),
        Err(e) if e.code() == code => Ok(e),
        Err(e) => bail!(
            "expected {code:?} ({}), got {:?}: {}",
            code.as_str(),
            e.code(),
            e.render()
        ),
    }
}

/// Turns a `SandboxError` into an `anyhow` error carrying its rendering.
pub fn sbx<T>(result: sandbox_core::Result<T>, what: &str) -> anyhow::Result<T> {
    result.map_err(|e| anyhow!("{what}: {}", e.render()))
}

/// Runs a command with default options, failing the trial on a `SandboxError`.
pub async fn run(sb: &dyn Sandbox, cmd: impl Into<Command>) -> anyhow::Result<ExecResult> {
    let cmd = cmd.into();
    let what = format!("run {cmd:?}");
    sbx(sb.run(cmd, RunOptions::default()).await, &what)
}

/// Runs a command and requires exit 0; returns stdout as text.
pub async fn run_ok(sb: &dyn Sandbox, cmd: impl Into<Command>) -> anyhow::Result<String> {
    let cmd = cmd.into();
    let r = run(sb, cmd.clone()).await?;
    ensure!(
        r.exit_code == 0,
        "{cmd:?} exited {} (stderr: {:?})",
        r.exit_code,
        r.stderr_text()
    );
    Ok(r.stdout_text())
}

/// Polls until `path` exists in the sandbox (via `test -e`), at most `max`.
pub async fn wait_for_file(sb: &dyn Sandbox, path: &str, max: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + max;
    loop {
        let r = run(sb, ["test", "-e", path]).await?;
        if r.exit_code == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{path} did not appear within {max:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads a pid written by `echo $$ > FILE` inside the sandbox.
pub async fn read_pid(sb: &dyn Sandbox, path: &str) -> anyhow::Result<String> {
    let out = run_ok(sb, ["cat", path]).await?;
    let pid = out.trim().to_string();
    ensure!(
        !pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit()),
        "pid file {path} holds {out:?}"
    );
    Ok(pid)
}

/// Polls until `path` holds a pid (digits; a writer may have created it empty first), at
/// most `max`; returns it.
pub async fn wait_for_pid(sb: &dyn Sandbox, path: &str, max: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + max;
    loop {
        let r = run(sb, ["cat", path]).await?;
        let out = r.stdout_text();
        let pid = out.trim();
        if r.exit_code == 0 && !pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit()) {
            return Ok(pid.to_string());
        }
        if Instant::now() >= deadline {
            bail!(
                "{path} held no pid within {max:?} (last: exit {}, {out:?})",
                r.exit_code
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether a process is alive inside the sandbox (`kill -0 PID`).
pub async fn pid_alive(sb: &dyn Sandbox, pid: &str) -> anyhow::Result<bool> {
    Ok(run(sb, ["kill", "-0", pid]).await?.exit_code == 0)
}

/// Waits until the process is gone (teardown grace + 2 s), else fails naming the orphan.
pub async fn assert_pid_gone(sb: &dyn Sandbox, pid: &str, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + teardown_grace() + Duration::from_secs(2);
    loop {
        if !pid_alive(sb, pid).await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "orphan process: pid {pid} ({what}) still alive {:?} after it should have been killed",
                teardown_grace() + Duration::from_secs(2)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A random token (hex) for secrets, canaries and unique paths.
pub fn token(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::SeqCst));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    let a = h.finish();
    h.write_u64(a);
    format!("{prefix}{a:016x}{:08x}", h.finish() as u32)
}

/// The grace every bounded wait in the suite is derived from, plus a margin.
pub fn grace_plus(margin: Duration) -> Duration {
    teardown_grace() + margin
}
