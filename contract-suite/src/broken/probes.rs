//! An adapter's probes for a broken backend: forwarded as they are, except that the
//! fault backend they hand the fault trials gets the same flaw.

use std::sync::Arc;

use async_trait::async_trait;
use sandbox_core::{Backend, CreateOptions};

use crate::probes::{CanarySpec, EngineLimits, Faults, Injection, Probes};

use super::backend::wrap;
use super::flaw::Flaw;

/// Forwards an adapter's probes; the fault backend gets the same flaw.
pub struct BrokenProbes {
    inner: Arc<dyn Probes>,
    flaw: Flaw,
}

impl BrokenProbes {
    /// Wraps `inner`'s probes for a backend with `flaw`.
    pub fn new(inner: Arc<dyn Probes>, flaw: Flaw) -> Self {
        BrokenProbes { inner, flaw }
    }
}

#[async_trait]
impl Probes for BrokenProbes {
    fn base_options(&self) -> CreateOptions {
        self.inner.base_options()
    }
    fn template_without_python(&self) -> Option<String> {
        self.inner.template_without_python()
    }
    fn extra_templates(&self) -> Vec<String> {
        self.inner.extra_templates()
    }
    fn in_process(&self) -> bool {
        self.inner.in_process()
    }
    fn egress_allow(&self) -> bool {
        self.inner.egress_allow()
    }
    fn egress_names(&self) -> Option<crate::EgressNames> {
        self.inner.egress_names()
    }
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        self.inner.canary().await
    }
    async fn bind_canary(&self, spec: &CanarySpec) -> anyhow::Result<std::net::TcpListener> {
        self.inner.bind_canary(spec).await
    }
    async fn engine_env(&self, sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        self.inner.engine_env(sandbox_id).await
    }
    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        let Some(inner) = self.inner.faults().await? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(BrokenFaults {
            backend: wrap(inner.backend(), self.flaw),
            inner,
        })))
    }
    fn symlinks(&self) -> bool {
        self.inner.symlinks()
    }
    fn in_process_storage(&self) -> bool {
        self.inner.in_process_storage()
    }
    async fn engine_limits(&self, sandbox_id: &str) -> anyhow::Result<Option<EngineLimits>> {
        self.inner.engine_limits(sandbox_id).await
    }
    async fn stop_sandbox(&self, sandbox_id: &str) -> anyhow::Result<Injection> {
        self.inner.stop_sandbox(sandbox_id).await
    }
}

struct BrokenFaults {
    inner: Arc<dyn Faults>,
    backend: Arc<dyn Backend>,
}

#[async_trait]
impl Faults for BrokenFaults {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn hang_kills(&self) {
        self.inner.hang_kills().await
    }
    async fn fail_kills(&self) {
        self.inner.fail_kills().await
    }
    async fn heal(&self) {
        self.inner.heal().await
    }
    async fn fail_creates(&self) -> Injection {
        self.inner.fail_creates().await
    }
    async fn stall_creates(&self) -> Injection {
        self.inner.stall_creates().await
    }
    async fn withhold_credential(&self) -> Injection {
        self.inner.withhold_credential().await
    }
}
