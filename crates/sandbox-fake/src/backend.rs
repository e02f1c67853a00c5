//! [`FakeBackend`], the fake's `Backend` / `ReapableBackend`: admission, create (with its
//! injected delays and stalls), connect, the lifetime backstop, and the scripting and
//! call-inspection API tests drive. The engine it stands on is in `state`.

use std::collections::BTreeMap;
use std::sync::Arc;

use sandbox_core::labels::{metadata_filter, sandbox_labels};
use sandbox_core::teardown::shielded_kill;
use sandbox_core::{
    Backend, Capability, CreateOptions, IsolationTier, ManagedSandbox, ReapableBackend, Result,
    Sandbox, SandboxError, SandboxState,
};
use tokio::time::Instant;

use crate::BACKEND_NAME;
use crate::calls::{Call, redact};
use crate::config::{FakeBuilder, FakeConfig};
use crate::faults::FaultInjector;
use crate::sandbox::{FakeSandbox, SandboxHandle};
use crate::script::{CodeMatch, Response, RunMatch, Script};
use crate::state::{Engine, Life, SandboxInner, Spec};

/// The in-memory, deterministic backend (name `"fake"`).
///
/// Cloning gives another handle on the same engine *and* the same fault toggles; see
/// [`FakeBackend::with_own_faults`] for a handle with separate toggles.
#[derive(Clone)]
pub struct FakeBackend {
    engine: Arc<Engine>,
    config: Arc<FakeConfig>,
    faults: FaultInjector,
}

impl std::fmt::Debug for FakeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBackend")
            .field("capabilities", &self.config.capabilities)
            .field("isolation", &self.config.isolation)
            .field("sandboxes", &self.engine.sandbox_count())
            .field("faults", &self.faults)
            .finish()
    }
}

impl Default for FakeBackend {
    fn default() -> Self {
        FakeBackend::new()
    }
}

impl FakeBackend {
    /// A backend with the default [`FakeConfig`].
    pub fn new() -> Self {
        FakeBackend::with_config(FakeConfig::default())
    }

    /// A builder for a configured backend.
    pub fn builder() -> FakeBuilder {
        FakeBuilder::default()
    }

    /// A backend with this configuration.
    pub fn with_config(config: FakeConfig) -> Self {
        FakeBackend::on_engine(Arc::new(Engine::new()), Arc::new(config))
    }

    /// A handle on `engine` with fault toggles of its own.
    fn on_engine(engine: Arc<Engine>, config: Arc<FakeConfig>) -> Self {
        let faults = FaultInjector::default();
        faults.set_create_delay(config.create_delay);
        FakeBackend {
            engine,
            config,
            faults,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FakeConfig {
        &self.config
    }

    /// The fault toggles of this handle (shared by the sandboxes it creates).
    pub fn faults(&self) -> &FaultInjector {
        &self.faults
    }

    /// Another handle on the same engine (same sandboxes, calls and scripts) with fault
    /// toggles of its own, so faults can be injected for one client without disturbing
    /// others.
    pub fn with_own_faults(&self) -> FakeBackend {
        FakeBackend::on_engine(self.engine.clone(), self.config.clone())
    }

    /// Scripts every command matching `matcher` (until cleared). Scripted rules take
    /// precedence over built-in commands; the most recent matching rule wins.
    pub fn on_run(&self, matcher: impl Into<RunMatch>, response: Response) -> &Self {
        self.script(|s| s.add_run(matcher.into(), response, None))
    }

    /// Scripts the next command matching `matcher` only.
    pub fn on_run_once(&self, matcher: impl Into<RunMatch>, response: Response) -> &Self {
        self.script(|s| s.add_run(matcher.into(), response, Some(1)))
    }

    /// Scripts every `run_code` snippet matching `matcher`.
    pub fn on_run_code(&self, matcher: impl Into<CodeMatch>, response: Response) -> &Self {
        self.script(|s| s.add_code(matcher.into(), response, None))
    }

    /// Scripts the next `run_code` snippet matching `matcher` only.
    pub fn on_run_code_once(&self, matcher: impl Into<CodeMatch>, response: Response) -> &Self {
        self.script(|s| s.add_code(matcher.into(), response, Some(1)))
    }

    fn script(&self, add: impl FnOnce(&mut Script)) -> &Self {
        add(&mut self.engine.scripts());
        self
    }

    /// Removes every scripted rule.
    pub fn clear_scripts(&self) {
        self.engine.scripts().clear();
    }

    /// Every call received so far, in order (secrets redacted).
    pub fn calls(&self) -> Vec<Call> {
        self.engine.calls().clone()
    }

    /// The calls concerning one sandbox.
    pub fn calls_for(&self, sandbox_id: &str) -> Vec<Call> {
        self.engine
            .calls()
            .iter()
            .filter(|c| c.sandbox_id() == Some(sandbox_id))
            .cloned()
            .collect()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.engine.calls().clear();
    }

    /// The inspection handle of a live sandbox.
    pub fn sandbox(&self, id: &str) -> Option<SandboxHandle> {
        self.engine.get(id).map(SandboxHandle)
    }

    /// Every live sandbox.
    pub fn sandboxes(&self) -> Vec<SandboxHandle> {
        self.engine.all().into_iter().map(SandboxHandle).collect()
    }

    /// Fault injection: sandbox `id` reaches its deadline now. Returns whether it existed.
    pub fn expire(&self, id: &str) -> bool {
        self.engine.get(id).map(|sb| sb.expire_now()).is_some()
    }

    fn record_create(
        &self,
        options: &CreateOptions,
        resources: Option<sandbox_core::EffectiveResources>,
        outcome: std::result::Result<String, sandbox_core::ErrorCode>,
    ) {
        self.engine.record(Call::Create {
            options: redact(options),
            policy: options.network.clone(),
            resources,
            isolation: self.config.isolation,
            outcome,
        });
    }

    fn base_env(id: &str, workdir: &str, uid: u32) -> BTreeMap<String, String> {
        let home = if uid == 0 { "/root" } else { "/home/sandbox" };
        let path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        BTreeMap::from([
            ("PATH".to_string(), path.to_string()),
            ("HOME".to_string(), home.to_string()),
            ("HOSTNAME".to_string(), id.chars().take(12).collect()),
            ("PWD".to_string(), workdir.to_string()),
        ])
    }
}

/// Watches the deadline: at the lifetime's end every process dies and the sandbox is
/// removed (the provider-side backstop). Holds the sandbox weakly.
pub(crate) fn spawn_lifetime(sb: &Arc<SandboxInner>) {
    let weak = Arc::downgrade(sb);
    tokio::spawn(async move {
        // The deadline may move (`expire_now`): re-read it after every wake-up.
        while let Some(deadline) = weak
            .upgrade()
            .filter(|sb| sb.life() != Life::Gone)
            .map(|sb| sb.deadline())
        {
            tokio::time::sleep_until(deadline).await;
            if let Some(sb) = weak.upgrade()
                && Instant::now() >= sb.deadline()
            {
                sb.terminate();
            }
        }
    });
}

/// How often a busy sandbox with an idle limit is looked at again (virtual time).
const IDLE_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Watches the idle limit, when there is one: a sandbox with no call and nothing running
/// for that long is removed. Holds the sandbox weakly.
pub(crate) fn spawn_idle(sb: &Arc<SandboxInner>) {
    if sb.idle.is_none() {
        return;
    }
    let weak = Arc::downgrade(sb);
    tokio::spawn(async move {
        while let Some(end) = weak
            .upgrade()
            .filter(|sb| sb.life() != Life::Gone)
            .and_then(|sb| sb.idle_end())
        {
            tokio::time::sleep_until(end).await;
            let Some(sb) = weak.upgrade() else {
                return;
            };
            if sb.busy() {
                // Running (or paused): idle starts counting once nothing runs.
                sb.touch();
                tokio::time::sleep(IDLE_POLL).await;
                continue;
            }
            if sb.idle_end().is_some_and(|end| Instant::now() >= end) {
                tracing::debug!(sandbox_id = %sb.id, "fake sandbox idle: removed");
                sb.terminate();
            }
        }
    });
}

#[sandbox_core::async_trait]
impl Backend for FakeBackend {
    fn name(&self) -> &str {
        BACKEND_NAME
    }

    fn capabilities(&self) -> Capability {
        self.config.capabilities
    }

    fn isolation(&self) -> IsolationTier {
        self.config.isolation
    }

    async fn create(&self, options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        let config = &self.config;
        let resources = sandbox_core::policy::check_create(
            BACKEND_NAME,
            config.capabilities,
            config.isolation,
            &options,
        )
        .inspect_err(|e| self.record_create(&options, None, Err(e.code())))?;
        let refused =
            |e: &SandboxError| self.record_create(&options, Some(resources), Err(e.code()));
        let template = options
            .template
            .clone()
            .unwrap_or_else(|| config.default_template.clone());
        let snapshot = self.engine.snapshots.get(&template);
        let exists = match &snapshot {
            Some(_) => true,
            None if template.starts_with(crate::snapshots::SNAPSHOT_PREFIX) => false,
            None => config.template_exists(&template),
        };
        let delay = self
            .faults
            .before_create(BACKEND_NAME)
            .and_then(|d| match exists {
                true => Ok(d),
                false => Err(SandboxError::creation(
                    BACKEND_NAME,
                    format!("template `{template}` does not exist"),
                )),
            })
            .inspect_err(refused)?;
        let bound = config.create_timeout;
        if self.faults.state().create_stall {
            // The engine never answers: the create bound is what ends the wait, and
            // nothing was provisioned.
            tokio::time::sleep(bound).await;
            return Err(SandboxError::create_timeout(BACKEND_NAME, bound)).inspect_err(refused);
        }
        let id = self.engine.new_id();
        let workdir = options.effective_workdir().to_string();
        let mut env = Self::base_env(&id, &workdir, config.uid);
        if let Some(h) = &options.hostname {
            env.insert("HOSTNAME".into(), h.clone());
        }
        env.extend(options.env.clone());
        let clock = self.engine.clock();
        let inner = Arc::new(SandboxInner::new(
            Spec {
                labels: {
                    let mut labels = sandbox_labels(
                        BACKEND_NAME,
                        clock.unix_after(options.timeout),
                        &options.metadata,
                    );
                    sandbox_core::labels::add_lifetime_limits(
                        &mut labels,
                        clock.unix_after(options.effective_max_lifetime()),
                        options.idle_timeout,
                    );
                    labels
                },
                id: id.clone(),
                has_python: snapshot
                    .as_ref()
                    .map_or_else(|| config.template_has_python(&template), |s| s.has_python),
                template,
                policy: options.network.clone(),
                resources,
                env,
                secrets: options.secrets.clone(),
                workdir,
                lifetime: options.timeout,
                max_lifetime: options.effective_max_lifetime(),
                idle: options.idle_timeout,
                capabilities: config.capabilities,
                isolation: config.isolation,
                clock,
            },
            Arc::downgrade(&self.engine),
        ));
        if let Some(s) = snapshot {
            inner.seed_fs(s.fs);
        }
        // What an engine gives every container: `/etc/hostname` naming it.
        let hostname = options
            .hostname
            .clone()
            .unwrap_or_else(|| id.chars().take(12).collect());
        let _ = inner.fs().write(
            "/etc/hostname",
            format!("{hostname}\n").into_bytes(),
            true,
            inner.now(),
        );
        self.engine.insert(inner.clone());
        // From here on the sandbox exists: the handle's guard kills it if this future is
        // dropped while it is "starting".
        let sandbox = FakeSandbox::new(inner.clone(), self.faults.clone());
        spawn_lifetime(&inner);
        spawn_idle(&inner);
        self.record_create(&options, Some(resources), Ok(id));
        if !delay.is_zero() {
            if delay >= bound {
                tokio::time::sleep(bound).await;
                // Dropping the handle tears the half-started sandbox down.
                drop(sandbox);
                return Err(SandboxError::create_timeout(BACKEND_NAME, bound));
            }
            tokio::time::sleep(delay).await;
        }
        inner.alive()?;
        inner.set_running();
        tracing::debug!(sandbox_id = %inner.id, backend = BACKEND_NAME, "fake sandbox created");
        Ok(Box::new(sandbox))
    }

    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        let found = self.engine.get(id);
        self.engine.record(Call::Connect {
            sandbox_id: id.to_string(),
            found: found.is_some(),
        });
        match found {
            // A sandbox stopped with `Sandbox::stop` is reattached too: its handle can
            // start or kill it.
            Some(sb) if sb.life() == Life::Running || sb.is_stopped_by_call() => {
                Ok(Box::new(FakeSandbox::new(sb, self.faults.clone())))
            }
            _ => Err(SandboxError::connect(
                id,
                "no live fake sandbox with this id (never created, killed or expired)",
            )),
        }
    }

    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        Some(self)
    }
}

#[sandbox_core::async_trait]
impl ReapableBackend for FakeBackend {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        self.engine.record(Call::ListManaged);
        let filter = metadata_filter(labels);
        Ok(self
            .engine
            .all()
            .into_iter()
            .filter(|sb| filter.iter().all(|(k, v)| sb.labels.get(k) == Some(v)))
            .map(|sb| {
                let state = match sb.life() {
                    Life::Creating => SandboxState::Creating,
                    Life::Running => SandboxState::Running,
                    Life::Stopped | Life::Gone => SandboxState::Stopped,
                };
                ManagedSandbox::new(
                    sb.id.clone(),
                    BACKEND_NAME,
                    state,
                    Some(sb.created_at),
                    sb.labels.clone(),
                )
            })
            .collect())
    }

    async fn kill_managed(&self, id: &str) -> Result<bool> {
        self.engine.record(Call::KillManaged {
            sandbox_id: id.to_string(),
        });
        let Some(sb) = self.engine.get(id) else {
            return Ok(false);
        };
        let info = sandbox_core::teardown::OrphanInfo::new(id, BACKEND_NAME, sb.labels.clone());
        let faults = self.faults.clone();
        shielded_kill(
            info,
            Box::pin(async move {
                faults.before_kill(BACKEND_NAME).await?;
                sb.terminate();
                Ok(())
            }),
        )
        .await?;
        Ok(true)
    }

    async fn list_snapshots(&self) -> Result<Vec<sandbox_core::Snapshot>> {
        Ok(self.engine.snapshots.list())
    }

    async fn remove_snapshot(&self, template: &str) -> Result<bool> {
        if !template.starts_with(crate::snapshots::SNAPSHOT_PREFIX) {
            return Err(SandboxError::config(
                format!("template `{template}` is not a fake snapshot"),
                "only templates returned by `Sandbox::snapshot` are removed",
            ));
        }
        Ok(self.engine.snapshots.remove(template))
    }
}
