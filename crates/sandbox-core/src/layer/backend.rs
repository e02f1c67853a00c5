//! The backend wrapper ([`EnforcedBackend`]): admission before `create` reaches the
//! adapter, the tier check on what it returns, spans and records for create, connect and
//! the reap calls, and the wrapping of every sandbox it hands out.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use tracing::Instrument as _;

use crate::audit::Redactor;
use crate::{
    Backend, Capability, CreateOptions, EngineReport, IsolationTier, ManagedSandbox,
    ReapableBackend, Result, Sandbox, SandboxError, Snapshot, policy,
};

use super::config::Layer;
use super::events::EventReporter;
use super::op::{Op, op_span};
use super::sandbox::EnforcedSandbox;
use super::shared::Shared;

/// The backend `b` points at, when it is itself an `EnforcedBackend` (not merely a
/// decorator forwarding `as_enforced` of one it wraps, whose own behaviour the layer
/// would then not cover).
pub(super) fn enforced_self(b: &Arc<dyn Backend>) -> Option<&EnforcedBackend> {
    let e = b.as_enforced()?;
    let same = std::ptr::eq(
        e as *const EnforcedBackend as *const (),
        Arc::as_ptr(b) as *const (),
    );
    same.then_some(e)
}

/// A backend wrapped in the enforcement layer. Built by [`enforce`](super::enforce) or
/// [`Layer::wrap`].
pub struct EnforcedBackend {
    inner: Arc<dyn Backend>,
    layer: Arc<Layer>,
}

impl fmt::Debug for EnforcedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnforcedBackend")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl EnforcedBackend {
    /// The adapter's backend, unwrapped (calls on it bypass every check).
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    /// The layer's configuration.
    pub fn layer(&self) -> &Layer {
        &self.layer
    }

    /// `inner` behind `layer`.
    pub(super) fn new(inner: Arc<dyn Backend>, layer: Layer) -> Self {
        EnforcedBackend {
            inner,
            layer: Arc::new(layer),
        }
    }

    fn wrap_sandbox(
        &self,
        sb: Box<dyn Sandbox>,
        redactor: Redactor,
        deadline: Option<tokio::time::Instant>,
    ) -> EnforcedSandbox {
        let shared = Arc::new(Shared {
            id: sb.id().to_string(),
            backend: self.inner.name().to_string(),
            tier: self.inner.isolation(),
            inner: sb,
            layer: self.layer.clone(),
            redactor,
            deadline: std::sync::Mutex::new(deadline),
            killed: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            kill_lock: tokio::sync::Mutex::new(()),
        });
        EnforcedSandbox::new(shared)
    }

    /// Refuses a new sandbox whose tier differs from its backend's (and kills it, since no
    /// caller will hold it): a weaker sandbox behind a stronger backend tier would silently
    /// defeat `require_isolation`. (`connect` refuses a mismatch too, but never kills a
    /// sandbox it did not create; the adapter's handle decides what its drop does.)
    async fn check_tier(&self, sb: Box<dyn Sandbox>) -> Result<Box<dyn Sandbox>> {
        let want = self.inner.isolation();
        let got = sb.isolation();
        if got == want {
            return Ok(sb);
        }
        let id = sb.id().to_string();
        let _ = sb.kill().await;
        Err(SandboxError::creation(
            self.inner.name(),
            format!(
                "sandbox `{id}` reports isolation tier `{got}` but its backend declares `{want}`; it was killed"
            ),
        ))
    }
}

#[async_trait]
impl Backend for EnforcedBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capability {
        self.inner.capabilities()
    }
    fn isolation(&self) -> IsolationTier {
        self.inner.isolation()
    }

    async fn create(&self, options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.create", name, tier);
        let op = Op::new(span.clone(), "sandbox.create", name, tier);
        let mut redactor = Redactor::default();
        redactor.extend(options.secrets.values().map(|s| s.expose()));
        redactor.extend(options.env.values().map(String::as_str));
        redactor.extend(options.credentials.iter().map(|c| c.secret.expose()));
        let events = EventReporter::for_create(&self.layer, &redactor, name, tier);
        async move {
            let checked =
                policy::check_create(name, self.inner.capabilities(), tier, &options).map(|_| ());
            if let Err(e) = checked {
                return op.end(&self.layer, &redactor, Err(e));
            }
            // The lifetime starts no later than now, so a deadline counted from here is
            // never past the adapter's.
            let deadline = tokio::time::Instant::now() + options.timeout;
            let created = match events.scope(self.inner.create(options)).await {
                Ok(sb) => self.check_tier(sb).await,
                Err(e) => Err(e),
            };
            let sb = match created {
                Ok(sb) => sb,
                Err(e) => return op.end(&self.layer, &redactor, Err(e)),
            };
            let op = op.sandbox(sb.id());
            let wrapped = self.wrap_sandbox(sb, redactor.clone(), Some(deadline));
            match op.finish(&self.layer, &redactor, Ok(())) {
                (_, Ok(())) => Ok(Box::new(wrapped) as Box<dyn Sandbox>),
                (_, Err(audit)) => {
                    // Nobody will hold the handle: kill the sandbox rather than leak it.
                    let _ = wrapped.shared.inner.kill().await;
                    wrapped.shared.killed.store(true, Ordering::SeqCst);
                    Err(audit)
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.connect", name, tier);
        let op = Op::new(span.clone(), "sandbox.connect", name, tier).sandbox(id);
        let redactor = Redactor::default();
        async move {
            let connected = match self.inner.connect(id).await {
                Ok(sb) if sb.isolation() != tier => Err(SandboxError::connect(
                    id,
                    format!(
                        "sandbox reports isolation tier `{}` but this backend declares `{tier}`; connect through a backend configured for its runtime",
                        sb.isolation()
                    ),
                )),
                other => other,
            };
            let sb = match connected {
                Ok(sb) => sb,
                Err(e) => return op.end(&self.layer, &redactor, Err(e)),
            };
            // The lifetime of a sandbox created elsewhere is unknown here; the adapter's
            // own remaining lifetime bounds it when it reports one.
            let wrapped = self.wrap_sandbox(sb, redactor.clone(), None);
            op.end(&self.layer, &redactor, Ok(()))?;
            Ok(Box::new(wrapped) as Box<dyn Sandbox>)
        }
        .instrument(span)
        .await
    }

    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        self.inner
            .as_reapable()
            .map(|_| self as &dyn ReapableBackend)
    }

    async fn diagnose(&self) -> EngineReport {
        self.inner.diagnose().await
    }

    fn as_enforced(&self) -> Option<&EnforcedBackend> {
        Some(self)
    }
}

#[async_trait]
impl ReapableBackend for EnforcedBackend {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.list_managed", name, tier);
        let op = Op::new(span.clone(), "sandbox.list_managed", name, tier);
        let redactor = Redactor::default();
        async move {
            let r = match self.inner.as_reapable() {
                Some(r) => r.list_managed(labels).await,
                None => Err(SandboxError::configuration(format!(
                    "backend `{name}` cannot list managed sandboxes"
                ))),
            };
            op.end(&self.layer, &redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn kill_managed(&self, id: &str) -> Result<bool> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.kill_managed", name, tier);
        let op = Op::new(span.clone(), "sandbox.kill_managed", name, tier).sandbox(id);
        let redactor = Redactor::default();
        async move {
            let r = match self.inner.as_reapable() {
                Some(r) => r.kill_managed(id).await,
                None => Err(SandboxError::configuration(format!(
                    "backend `{name}` cannot kill managed sandboxes"
                ))),
            };
            op.end(&self.layer, &redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.list_snapshots", name, tier);
        let op = Op::new(span.clone(), "sandbox.list_snapshots", name, tier);
        let redactor = Redactor::default();
        async move {
            let r = match self.inner.as_reapable() {
                Some(r) => r.list_snapshots().await,
                None => Err(SandboxError::configuration(format!(
                    "backend `{name}` cannot list snapshots"
                ))),
            };
            op.end(&self.layer, &redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn remove_snapshot(&self, template: &str) -> Result<bool> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.remove_snapshot", name, tier);
        let op = Op::new(span.clone(), "sandbox.remove_snapshot", name, tier).sandbox(template);
        let redactor = Redactor::default();
        async move {
            let r = match self.inner.as_reapable() {
                Some(r) => r.remove_snapshot(template).await,
                None => Err(SandboxError::configuration(format!(
                    "backend `{name}` cannot remove snapshots"
                ))),
            };
            op.end(&self.layer, &redactor, r)
        }
        .instrument(span)
        .await
    }
}
