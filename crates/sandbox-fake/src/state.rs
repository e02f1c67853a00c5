//! The fake's shared state: the in-memory engine ([`Engine`]: every sandbox, the recorded
//! calls, the scripted rules) and each sandbox's state ([`SandboxInner`]: what it was
//! created with, its lifecycle, files, processes and interpreter contexts), shared by every
//! handle and task. Everything that acts on a sandbox reads and changes it through here;
//! this module runs nothing itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use sandbox_core::{
    Capability, EffectiveResources, IsolationTier, NetworkPolicy, Result, SandboxError, Secret,
};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::calls::Call;
use crate::clock::Clock;
use crate::memfs::MemFs;
use crate::processes::ProcTable;
use crate::script::{Response, Script};
use crate::{BACKEND_NAME, lock};

/// The in-memory "engine": every sandbox, the recorded calls and the scripted rules.
/// Sandboxes point back at it weakly, so nothing is recorded or scripted once every
/// backend handle is gone.
pub(crate) struct Engine {
    sandboxes: Mutex<BTreeMap<String, Arc<SandboxInner>>>,
    calls: Mutex<Vec<Call>>,
    scripts: Mutex<Script>,
    next_id: AtomicU64,
    clock: Clock,
    pub(crate) snapshots: crate::snapshots::Snapshots,
}

impl Engine {
    pub(crate) fn new() -> Self {
        Engine {
            sandboxes: Mutex::new(BTreeMap::new()),
            calls: Mutex::new(Vec::new()),
            scripts: Mutex::new(Script::default()),
            next_id: AtomicU64::new(1),
            clock: Clock::new(),
            snapshots: crate::snapshots::Snapshots::default(),
        }
    }

    pub(crate) fn clock(&self) -> Clock {
        self.clock
    }

    /// A fresh sandbox id (`fake-0001`, `fake-0002`, …).
    pub(crate) fn new_id(&self) -> String {
        format!("fake-{:04}", self.next_id.fetch_add(1, Ordering::SeqCst))
    }

    pub(crate) fn record(&self, call: Call) {
        lock(&self.calls).push(call);
    }

    /// Every call recorded so far, in order.
    pub(crate) fn calls(&self) -> MutexGuard<'_, Vec<Call>> {
        lock(&self.calls)
    }

    pub(crate) fn scripts(&self) -> MutexGuard<'_, Script> {
        lock(&self.scripts)
    }

    pub(crate) fn insert(&self, sb: Arc<SandboxInner>) {
        lock(&self.sandboxes).insert(sb.id.clone(), sb);
    }

    pub(crate) fn forget(&self, id: &str) {
        lock(&self.sandboxes).remove(id);
    }

    /// How many sandboxes the engine holds, expired ones not yet swept included.
    pub(crate) fn sandbox_count(&self) -> usize {
        lock(&self.sandboxes).len()
    }

    pub(crate) fn get(&self, id: &str) -> Option<Arc<SandboxInner>> {
        let sb = lock(&self.sandboxes).get(id).cloned()?;
        // Applies the deadline lazily (the lifetime task may not have run yet).
        sb.held().then_some(sb)
    }

    pub(crate) fn all(&self) -> Vec<Arc<SandboxInner>> {
        let all: Vec<_> = lock(&self.sandboxes).values().cloned().collect();
        all.into_iter().filter(|sb| sb.held()).collect()
    }
}

/// The variables of one persistent interpreter context.
pub(crate) type Vars = Arc<Mutex<BTreeMap<String, i64>>>;

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
    /// The latest deadline `extend` may set.
    max_deadline: Instant,
    /// The last API call (or the last moment anything ran), for the idle limit.
    last_use: Mutex<Instant>,
    life: Mutex<Life>,
    fs: Mutex<MemFs>,
    procs: Mutex<ProcTable>,
    contexts: Mutex<BTreeMap<String, Vars>>,
    /// `true` while paused: every program waits before its next output or start.
    frozen: tokio::sync::watch::Sender<bool>,
    /// The egress policy in force (the create's, until `set_egress` replaces it).
    egress: Mutex<sandbox_core::Egress>,
    /// `true` while stopped with `Sandbox::stop` (not by a crash): calls are refused with
    /// `SandboxStopped` and `start` brings it back.
    stopped_by_call: std::sync::atomic::AtomicBool,
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
    /// `CreateOptions::max_lifetime` in effect (at least `lifetime`).
    pub(crate) max_lifetime: Duration,
    /// `CreateOptions::idle_timeout`.
    pub(crate) idle: Option<Duration>,
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
            max_deadline: Instant::now() + spec.max_lifetime.max(spec.lifetime),
            last_use: Mutex::new(Instant::now()),
            life: Mutex::new(Life::Creating),
            contexts: Mutex::new(BTreeMap::new()),
            frozen: tokio::sync::watch::channel(false).0,
            egress: Mutex::new(spec.policy.egress.clone()),
            stopped_by_call: std::sync::atomic::AtomicBool::new(false),
            created_at: now,
            spec,
            engine,
        }
    }

    /// The network policy in force: the create's, with the egress `set_egress` set last.
    pub(crate) fn network_now(&self) -> NetworkPolicy {
        let mut p = self.spec.policy.clone();
        p.egress = lock(&self.egress).clone();
        p
    }

    /// Replaces the egress policy in force.
    pub(crate) fn set_egress(&self, egress: sandbox_core::Egress) {
        *lock(&self.egress) = egress;
    }

    pub(crate) fn fs(&self) -> MutexGuard<'_, MemFs> {
        lock(&self.fs)
    }

    /// Starts from a snapshot's filesystem (with the workdir made, as at every create).
    pub(crate) fn seed_fs(&self, mut fs: MemFs) {
        let _ = fs.mkdir(&self.spec.workdir, true, self.now());
        *lock(&self.fs) = fs;
    }

    /// Copies the filesystem into a new snapshot template the engine holds.
    pub(crate) fn snapshot(&self) -> Result<sandbox_core::Snapshot> {
        let engine = self.engine.upgrade().ok_or_else(|| self.gone())?;
        let template = engine.snapshots.name(&self.id);
        let now = self.now();
        let created = now
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let record = sandbox_core::Snapshot::new(
            template,
            crate::BACKEND_NAME,
            self.id.clone(),
            Some(now),
            sandbox_core::labels::snapshot_labels(crate::BACKEND_NAME, &self.id, created),
        );
        engine.snapshots.insert(crate::snapshots::Held {
            fs: self.fs().clone(),
            has_python: self.has_python,
            record: record.clone(),
        });
        Ok(record)
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

    /// `Ok` while the sandbox is creating or running; `SandboxStopped` while stopped with
    /// `Sandbox::stop`; past its deadline it is torn down here.
    pub(crate) fn alive(&self) -> Result<()> {
        match self.life() {
            Life::Creating | Life::Running if self.held() => Ok(()),
            Life::Stopped if self.is_stopped_by_call() && self.held() => {
                Err(SandboxError::stopped(self.id.clone()))
            }
            _ => Err(self.gone()),
        }
    }

    /// Whether it is stopped with `Sandbox::stop` (and may be started again).
    pub(crate) fn is_stopped_by_call(&self) -> bool {
        self.life() == Life::Stopped
            && self
                .stopped_by_call
                .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `Sandbox::stop`: thawed, every process and context ended, kept (`Stopped`) until
    /// [`SandboxInner::restart`] or its deadline.
    pub(crate) fn stop_by_call(&self) -> Result<()> {
        if self.is_stopped_by_call() {
            return Ok(());
        }
        self.alive()?;
        self.set_frozen(false);
        self.stopped_by_call
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop();
        Ok(())
    }

    /// `Sandbox::start` of a sandbox stopped with `Sandbox::stop`: running again, with its
    /// files, policy and labels; its contexts start afresh. A running one is left alone.
    pub(crate) fn restart(&self) -> Result<()> {
        if !self.is_stopped_by_call() {
            return self.alive();
        }
        if !self.held() {
            return Err(self.gone());
        }
        {
            let mut l = lock(&self.life);
            if *l != Life::Stopped {
                return Err(self.gone());
            }
            *l = Life::Running;
        }
        self.stopped_by_call
            .store(false, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Pauses (`true`) or resumes every program of the sandbox, as the cgroup freezer
    /// does: what runs stops before its next output or program and goes on from there.
    pub(crate) fn set_frozen(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// `SandboxPaused` while paused: a handle reattached to a paused sandbox (its layer
    /// does not know) refuses at once instead of waiting.
    pub(crate) fn refuse_if_frozen(&self) -> Result<()> {
        if *self.frozen.borrow() {
            Err(SandboxError::paused(self.id.clone()))
        } else {
            Ok(())
        }
    }

    /// Waits while the sandbox is paused.
    pub(crate) async fn thawed(&self) {
        let mut rx = self.frozen.subscribe();
        // The sender lives as long as `self`, so the wait cannot fail while awaited.
        let _ = rx.wait_for(|frozen| !*frozen).await;
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

    /// The engine holding this sandbox, while a backend handle lives.
    pub(crate) fn engine(&self) -> Option<Arc<Engine>> {
        self.engine.upgrade()
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

    /// An API call: the idle clock starts again.
    pub(crate) fn touch(&self) {
        *lock(&self.last_use) = Instant::now();
    }

    /// When the idle limit ends the sandbox unless something happens first.
    pub(crate) fn idle_end(&self) -> Option<Instant> {
        self.idle.map(|idle| *lock(&self.last_use) + idle)
    }

    /// Whether anything runs (a program, a stateful context's interpreter) or the
    /// sandbox is paused (its programs wait, frozen) or stopped with `Sandbox::stop`: not
    /// idle, as in a container, where those are processes below the agent and a frozen or
    /// stopped agent counts no time (a started one counts afresh).
    pub(crate) fn busy(&self) -> bool {
        !self.procs().list().is_empty()
            || !lock(&self.contexts).is_empty()
            || *self.frozen.borrow()
            || self.is_stopped_by_call()
    }

    /// The virtual wall-clock time of a moment on tokio's clock.
    fn wall_of(&self, at: Instant) -> SystemTime {
        let now = Instant::now();
        if at >= now {
            self.now() + (at - now)
        } else {
            self.now() - (now - at)
        }
    }

    /// Moves the deadline `by` later, up to the maximum; returns the new one (virtual
    /// wall-clock time). The lifetime task re-reads the deadline after each wake-up.
    pub(crate) fn extend(&self, by: Duration) -> Result<SystemTime> {
        let mut deadline = lock(&self.deadline);
        let to = sandbox_core::options::extended_deadline(
            self.wall_of(*deadline),
            self.wall_of(self.max_deadline),
            by,
            false,
        )?;
        *deadline += by;
        Ok(to)
    }

    /// A fork of this sandbox as a new one the engine holds, with id `id`, ending
    /// `lifetime` from now and labelled with `metadata` too: this one's spec, a copy of its
    /// files and of its contexts' variables. Its programs are not copied: the fake runs
    /// them as tasks of this process, which cannot be duplicated (a container engine's
    /// fork restores them). Past the maximum lifetime: `ResourceLimitExceeded`.
    pub(crate) fn fork_copy(
        &self,
        id: String,
        lifetime: Duration,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Arc<SandboxInner>> {
        let engine = self.engine.upgrade().ok_or_else(|| self.gone())?;
        let max_left = self.max_deadline.saturating_duration_since(Instant::now());
        if lifetime > max_left + Duration::from_secs(1) {
            return Err(SandboxError::resource_limit(
                "the original sandbox's maximum lifetime (a fork cannot outlive it)",
                Some(
                    "ask for a shorter ForkOptions::timeout, or create the original with a \
                     longer CreateOptions::max_lifetime"
                        .into(),
                ),
            ));
        }
        let mut labels = self.labels.clone();
        labels.insert(
            sandbox_core::labels::LABEL_DEADLINE.to_string(),
            self.clock.unix_after(lifetime).to_string(),
        );
        labels.insert(
            sandbox_core::labels::LABEL_FORK_OF.to_string(),
            self.id.clone(),
        );
        for (k, v) in metadata {
            labels.insert(
                format!("{}{k}", sandbox_core::labels::LABEL_META_PREFIX),
                v.clone(),
            );
        }
        let spec = Spec {
            id,
            template: self.template.clone(),
            labels,
            policy: self.policy.clone(),
            resources: self.resources,
            env: self.env.clone(),
            secrets: self.secrets.clone(),
            workdir: self.workdir.clone(),
            lifetime,
            max_lifetime: max_left.max(lifetime),
            idle: self.idle,
            capabilities: self.capabilities,
            isolation: self.isolation,
            has_python: self.has_python,
            clock: self.clock,
        };
        let fork = Arc::new(SandboxInner::new(spec, self.engine.clone()));
        *lock(&fork.fs) = self.fs().clone();
        *lock(&fork.contexts) = lock(&self.contexts)
            .iter()
            .map(|(k, vars)| (k.clone(), Arc::new(Mutex::new(lock(vars).clone()))))
            .collect();
        engine.insert(fork.clone());
        fork.set_running();
        Ok(fork)
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

    /// Ids of the persistent interpreter contexts.
    pub(crate) fn context_ids(&self) -> Vec<String> {
        lock(&self.contexts).keys().cloned().collect()
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
