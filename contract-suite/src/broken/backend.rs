//! The broken backend: the flaws of create (options silently changed, refusals that
//! provision first, errors mistyped), of connect (a dead id revived) and of the reap
//! listing (stopped sandboxes hidden). Every sandbox it hands out is a broken sandbox with
//! the same flaw.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    Backend, Capability, CreateOptions, Egress, ErrorCode, IsolationTier, ManagedSandbox,
    NetworkPolicy, ReapableBackend, Resources, Result, Sandbox, SandboxError,
};

use super::abandoned::abandon;
use super::flaw::{Flaw, adjust_caps};
use super::sandbox::BrokenSandbox;

/// Wraps `inner` so that it has `flaw`.
pub fn wrap(inner: Arc<dyn Backend>, flaw: Flaw) -> Arc<dyn Backend> {
    Arc::new(BrokenBackend::new(inner, flaw))
}

/// A backend with a flaw.
#[derive(Debug)]
pub struct BrokenBackend {
    inner: Arc<dyn Backend>,
    flaw: Flaw,
    /// The last options a create succeeded with (`ConnectRevives` creates from them).
    last_options: Mutex<Option<CreateOptions>>,
    /// Each created sandbox's secrets (`SnapshotKeepsSecrets` hands them on).
    secrets_of: Mutex<BTreeMap<String, BTreeMap<String, sandbox_core::Secret>>>,
    /// Sandboxes created with an idle limit, as first listed (`IdleLeavesItStopped`
    /// lists them stopped once the inner backend removed them).
    kept_stopped: Mutex<BTreeMap<String, ManagedSandbox>>,
}

impl BrokenBackend {
    /// `inner` with `flaw`, as its concrete type (for trials written against
    /// `Backend + ReapableBackend`, such as the engine trials of
    /// [`Flaw::ON_AN_ENGINE`]).
    pub fn new(inner: Arc<dyn Backend>, flaw: Flaw) -> BrokenBackend {
        BrokenBackend {
            inner,
            flaw,
            last_options: Mutex::new(None),
            secrets_of: Mutex::new(BTreeMap::new()),
            kept_stopped: Mutex::new(BTreeMap::new()),
        }
    }

    fn sandbox(
        &self,
        inner: Box<dyn Sandbox>,
        secrets: Vec<String>,
        ingress: Vec<u16>,
    ) -> Box<dyn Sandbox> {
        let sb = BrokenSandbox::new(inner, self.flaw, secrets, ingress);
        if self.flaw == Flaw::StartWithoutEgressRules {
            Box::new(sb.restarting_open_on(self.inner.clone()))
        } else {
            Box::new(sb)
        }
    }

    /// The snapshot `template` names, when the inner backend lists one.
    async fn snapshot_named(&self, template: Option<&str>) -> Option<sandbox_core::Snapshot> {
        let template = template?;
        let listed = self.inner.as_reapable()?.list_snapshots().await.ok()?;
        listed.into_iter().find(|s| s.template == template)
    }

    /// Options with the same metadata that the inner backend accepts.
    fn plain(options: &CreateOptions) -> CreateOptions {
        let mut plain = CreateOptions::default();
        plain.template = options.template.clone();
        plain.metadata = options.metadata.clone();
        plain
    }
}

#[async_trait]
impl Backend for BrokenBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capability {
        let caps = adjust_caps(self.flaw, self.inner.capabilities());
        if self.flaw == Flaw::FallBackSilently {
            // Declared by the backend only: its sandboxes do not run the agent.
            caps | Capability::AGENT
        } else {
            caps
        }
    }
    fn isolation(&self) -> IsolationTier {
        self.inner.isolation()
    }
    async fn create(&self, mut options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        let from_snapshot = match self.flaw {
            Flaw::SnapshotFilesLost | Flaw::SnapshotKeepsSecrets => {
                self.snapshot_named(options.template.as_deref()).await
            }
            _ => None,
        };
        match self.flaw {
            Flaw::PretendNetworkPolicy if options.network.egress == Egress::Deny => {
                options.network.egress = Egress::Allow;
            }
            Flaw::SilentlyDenyAllow if options.network.egress == Egress::Allow => {
                options.network = NetworkPolicy::deny();
            }
            Flaw::DeclareUnhonoured if matches!(options.network.egress, Egress::AllowList(_)) => {
                // Says it filters, gives full egress.
                options.network.egress = Egress::Allow;
            }
            Flaw::UncheckedAllowlist
                if matches!(options.network.egress, Egress::AllowList(_))
                    && options.network.validate().is_err() =>
            {
                options.network = NetworkPolicy::allow();
            }
            Flaw::HostPortOpensWholeHost => {
                options.network.egress = super::sandbox::whole_host(options.network.egress);
            }
            Flaw::CredentialInEnvironment => {
                for c in std::mem::take(&mut options.credentials) {
                    options.env.insert(c.env_var, c.secret.expose().to_string());
                }
            }
            Flaw::CredentialForEveryHost => {
                let names: Vec<String> = options
                    .network
                    .egress
                    .rules()
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|r| match r.target() {
                        sandbox_core::EgressTarget::Host(h) => Some(h.clone()),
                        _ => None,
                    })
                    .collect();
                for c in &mut options.credentials {
                    for n in &names {
                        if !c.hosts.contains(n) {
                            c.hosts.push(n.clone());
                        }
                    }
                }
            }
            Flaw::GitPushAnywhere => {
                for r in &mut options.git_repos {
                    r.push_prefix = Some("refs/heads/".to_string());
                }
            }
            Flaw::SshAgentEveryKey => {
                if let Some(agent) = options.ssh_agent.as_mut() {
                    agent.keys.clear();
                    agent.all_keys = true;
                }
            }
            Flaw::IgnoreLimits => {
                options.resources = Resources::default();
            }
            Flaw::IgnoreHostname => {
                options.hostname = None;
            }
            Flaw::IgnoreLifetime => {
                options.timeout = Duration::from_secs(3600);
                options.max_lifetime = options.max_lifetime.map(|m| m.max(options.timeout));
            }
            Flaw::ForgetMaximumLifetime => {
                options.max_lifetime =
                    Some(options.effective_max_lifetime() + Duration::from_secs(3600));
            }
            Flaw::IgnoreIdleLimit => {
                options.idle_timeout = None;
            }
            Flaw::IdleEndsBusySandboxes => {
                if let Some(idle) = options.idle_timeout {
                    options.timeout = idle;
                    options.max_lifetime = None;
                }
            }
            Flaw::SecretsInEngineEnv => {
                for (k, v) in std::mem::take(&mut options.secrets) {
                    options.env.insert(k, v.expose().to_string());
                }
            }
            Flaw::IgnoreWorkdir => {
                options.workdir = None;
            }
            Flaw::FallBackSilently => {
                options.require_agent = false;
            }
            Flaw::UncheckedLabelKeys => {
                // The keys the engine would receive, control characters and all: the
                // inner backend only sees them cleaned, as if the engine took them.
                let bad = options
                    .metadata
                    .keys()
                    .any(|k| k.chars().any(char::is_control));
                if bad {
                    options.metadata = options
                        .metadata
                        .into_iter()
                        .map(|(k, v)| (k.chars().filter(|c| !c.is_control()).collect(), v))
                        .collect();
                }
            }
            Flaw::SnapshotFilesLost if from_snapshot.is_some() => {
                options.template = None;
            }
            Flaw::SnapshotKeepsSecrets if from_snapshot.is_some() => {
                let source = from_snapshot.map(|s| s.source).unwrap_or_default();
                let kept = self
                    .secrets_of
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&source).cloned())
                    .unwrap_or_default();
                options.secrets.extend(kept);
            }
            _ => {}
        }
        let ingress = if self.flaw == Flaw::PretendIngress {
            std::mem::take(&mut options.network.ingress_ports)
        } else {
            vec![]
        };
        let secrets: Vec<String> = options
            .secrets
            .values()
            .map(|s| s.expose().to_string())
            .collect();
        let created = self.inner.create(options.clone()).await;
        let inner = match created {
            Ok(inner) => inner,
            Err(e) if self.flaw == Flaw::RefuseAfterProvisioning => {
                // Provisions first, then refuses, and leaves what it provisioned.
                if let Ok(provisioned) = self.inner.create(Self::plain(&options)).await {
                    abandon(provisioned);
                }
                return Err(e);
            }
            Err(e) if self.flaw == Flaw::RawEngineErrors => {
                return Err(SandboxError::engine(
                    self.inner.name(),
                    format!("raw engine error: {e}"),
                ));
            }
            Err(e)
                if (self.flaw == Flaw::CauselessCreationError
                    && e.code() == ErrorCode::Creation)
                    || (self.flaw == Flaw::CreateTimeoutAsCreation
                        && e.code() == ErrorCode::CreateTimeout)
                    || (self.flaw == Flaw::AuthAsCreation && e.code() == ErrorCode::Auth) =>
            {
                return Err(SandboxError::creation(self.inner.name(), "create failed"));
            }
            Err(e) => return Err(e),
        };
        if let Ok(mut last) = self.last_options.lock() {
            *last = Some(Self::plain(&options));
        }
        if let Ok(mut m) = self.secrets_of.lock() {
            m.insert(inner.id().to_string(), options.secrets.clone());
        }
        if self.flaw == Flaw::IdleLeavesItStopped && options.idle_timeout.is_some() {
            let listed = match self.inner.as_reapable() {
                Some(r) => r.list_managed(&BTreeMap::new()).await.unwrap_or_default(),
                None => Vec::new(),
            };
            if let Some(mut m) = listed.into_iter().find(|m| m.id == inner.id())
                && let Ok(mut kept) = self.kept_stopped.lock()
            {
                m.state = sandbox_core::SandboxState::Stopped;
                kept.insert(m.id.clone(), m);
            }
        }
        Ok(self.sandbox(inner, secrets, ingress))
    }
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        match self.inner.connect(id).await {
            Ok(inner) => Ok(self.sandbox(inner, vec![], vec![])),
            Err(e) if self.flaw == Flaw::ConnectRevives && e.code() == ErrorCode::Connect => {
                let options = self
                    .last_options
                    .lock()
                    .ok()
                    .and_then(|o| o.clone())
                    .unwrap_or_default();
                let inner = self.inner.create(options).await?;
                Ok(self.sandbox(inner, vec![], vec![]))
            }
            Err(e) => Err(e),
        }
    }
    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        self.inner
            .as_reapable()
            .map(|_| self as &dyn ReapableBackend)
    }
}

#[async_trait]
impl ReapableBackend for BrokenBackend {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        let mut listed = match self.inner.as_reapable() {
            Some(r) => r.list_managed(labels).await?,
            None => return Err(SandboxError::unsupported(Capability::empty(), self.name())),
        };
        if self.flaw == Flaw::HideStopped {
            listed.retain(|m| m.state != sandbox_core::SandboxState::Stopped);
        }
        if let Ok(kept) = self.kept_stopped.lock() {
            let filter = sandbox_core::labels::metadata_filter(labels);
            let ended: Vec<ManagedSandbox> = kept
                .values()
                .filter(|k| !listed.iter().any(|m| m.id == k.id))
                .filter(|k| filter.iter().all(|(l, v)| k.labels.get(l) == Some(v)))
                .cloned()
                .collect();
            listed.extend(ended);
        }
        Ok(listed)
    }
    async fn kill_managed(&self, id: &str) -> Result<bool> {
        if let Ok(mut kept) = self.kept_stopped.lock() {
            kept.remove(id);
        }
        match self.inner.as_reapable() {
            Some(r) => r.kill_managed(id).await,
            None => Err(SandboxError::unsupported(Capability::empty(), self.name())),
        }
    }
    async fn list_snapshots(&self) -> Result<Vec<sandbox_core::Snapshot>> {
        let listed = match self.inner.as_reapable() {
            Some(r) => r.list_snapshots().await?,
            None => return Err(SandboxError::unsupported(Capability::empty(), self.name())),
        };
        if self.flaw == Flaw::SnapshotsUnlisted {
            return Ok(Vec::new());
        }
        Ok(listed)
    }
    async fn remove_snapshot(&self, template: &str) -> Result<bool> {
        match self.inner.as_reapable() {
            Some(r) => r.remove_snapshot(template).await,
            None => Err(SandboxError::unsupported(Capability::empty(), self.name())),
        }
    }
}
