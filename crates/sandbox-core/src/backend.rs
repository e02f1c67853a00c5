//! The `Backend` and `ReapableBackend` ports.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::{
    Capability, CreateOptions, EngineReport, IsolationTier, ManagedSandbox, Result, Sandbox,
    Snapshot,
};

/// A sandbox provider (Docker, Podman, the fake, a third-party adapter).
///
/// Dyn-compatible: the facade selects backends at run time as `Arc<dyn Backend>`.
#[async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Stable backend name (`"docker"`), also the DSN scheme.
    fn name(&self) -> &str;
    /// Capabilities of sandboxes created with default options.
    fn capabilities(&self) -> Capability;
    /// Isolation tier of sandboxes created with default options.
    fn isolation(&self) -> IsolationTier;
    /// Creates a sandbox and returns once it is usable, with network and resource policy
    /// applied before any user code can run. A policy it cannot apply is refused with
    /// `CapabilityNotSupported` before anything is provisioned.
    async fn create(&self, options: CreateOptions) -> Result<Box<dyn Sandbox>>;
    /// Reattaches to a live sandbox. Unknown or dead id → `Connect`; never creates.
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>>;
    /// This backend as a [`ReapableBackend`], when it is one.
    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        None
    }
    /// Health of the engine for `sandbox doctor`. The default reports only the tier;
    /// adapters override it with reachability, version, runtimes and images.
    async fn diagnose(&self) -> EngineReport {
        let mut r = EngineReport::new(self.name(), "in-process");
        r.reachable = true;
        r.tier = self.isolation();
        r
    }
    /// This backend as the core enforcement layer, when it is one. Only
    /// [`EnforcedBackend`](crate::layer::EnforcedBackend) returns `Some`; adapters keep the
    /// default. [`layer::enforce`](crate::layer::enforce) uses it to wrap a backend once.
    fn as_enforced(&self) -> Option<&crate::layer::EnforcedBackend> {
        None
    }
}

/// A backend that can list and kill the sandboxes it manages (for `sandbox reap`).
#[async_trait]
pub trait ReapableBackend: Backend {
    /// Sandboxes the engine holds under sandbox-rs's label, including stopped ones;
    /// `labels` narrows by metadata (`key` means `io.sandbox-rs.meta.key`; keys already
    /// under `io.sandbox-rs.` are matched as given).
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>>;
    /// Kills and removes one. `Ok(false)` when the id is already gone (never an error).
    async fn kill_managed(&self, id: &str) -> Result<bool>;
    /// Snapshots (`Sandbox::snapshot`) the engine holds under sandbox-rs's label. The
    /// default lists none: a backend without `SNAPSHOT` makes none.
    async fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        Ok(Vec::new())
    }
    /// Removes one snapshot by its template. `Ok(false)` when it is already gone; a
    /// template that is not a sandbox-rs snapshot is refused. The default knows none.
    async fn remove_snapshot(&self, template: &str) -> Result<bool> {
        let _ = template;
        Ok(false)
    }
}

#[async_trait]
impl<B: ReapableBackend + ?Sized> ReapableBackend for Arc<B> {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        (**self).list_managed(labels).await
    }
    async fn kill_managed(&self, id: &str) -> Result<bool> {
        (**self).kill_managed(id).await
    }
    async fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        (**self).list_snapshots().await
    }
    async fn remove_snapshot(&self, template: &str) -> Result<bool> {
        (**self).remove_snapshot(template).await
    }
}

#[async_trait]
impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn capabilities(&self) -> Capability {
        (**self).capabilities()
    }
    fn isolation(&self) -> IsolationTier {
        (**self).isolation()
    }
    async fn create(&self, options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        (**self).create(options).await
    }
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        (**self).connect(id).await
    }
    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        (**self).as_reapable()
    }
    async fn diagnose(&self) -> EngineReport {
        (**self).diagnose().await
    }
    fn as_enforced(&self) -> Option<&crate::layer::EnforcedBackend> {
        (**self).as_enforced()
    }
}
