//! A third-party container engine for sandbox-rs, written against the published API only.
//!
//! [`JournaledEngine`] implements [`ContainerEngine`] by decorating another engine (here the
//! Docker one): it stamps every container it creates with [`LABEL_ENGINE`], keeps a
//! [`Journal`] of the engine calls it served, and can inject faults into container removal
//! ([`RemovalFault`]) so the contract suite's teardown trials have something to break.
//!
//! Everything else — exec wrapper and process-tree kill, interpreter, files, ingress,
//! lifetime, sweep, capability gating, tracing, audit — comes from `sandbox-container`
//! and core's enforcement layer: `ContainerBackend::new(engine, config)` is a complete
//! `Backend`, and `tests/contract.rs` runs the whole contract suite on it with one call.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_container::{
    ArchiveBody, ContainerConfig, ContainerEngine, ContainerInfo, ContainerSpec, EngineError,
    EngineErrorKind, EngineFacts, EngineResult, ExecRequest, ExecState, ExecStream, PathStat,
};
use sandbox_core::{Capability, IsolationTier};

/// Label this engine puts on every container it creates (value [`LABEL_VALUE`]).
pub const LABEL_ENGINE: &str = "io.example.third-party-engine";
/// Value of [`LABEL_ENGINE`].
pub const LABEL_VALUE: &str = "journaled";
/// The backend name (also what the `io.sandbox-rs.backend` label says), distinct from the
/// inner engine's so the two never sweep or reattach each other's containers.
pub const BACKEND: &str = "journaled";

/// How [`ContainerEngine::remove`] behaves: for proving teardown paths, never set in
/// production.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovalFault {
    /// Removals reach the inner engine.
    None,
    /// Removals wait until the fault is cleared (a wedged engine).
    Hang,
    /// Removals fail with an engine error (`EngineErrorKind::Other`).
    Fail,
}

impl RemovalFault {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => RemovalFault::Hang,
            2 => RemovalFault::Fail,
            _ => RemovalFault::None,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            RemovalFault::None => 0,
            RemovalFault::Hang => 1,
            RemovalFault::Fail => 2,
        }
    }
}

/// The engine calls a [`JournaledEngine`] served, counted per method. Shared: clone the
/// `Arc` from [`JournaledEngine::journal`] before handing the engine to a backend.
#[derive(Debug, Default)]
pub struct Journal {
    calls: Mutex<BTreeMap<&'static str, u64>>,
}

impl Journal {
    fn record(&self, method: &'static str) {
        // A poisoned lock only means another thread panicked mid-increment; the counts
        // are still meaningful, so keep counting.
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        *calls.entry(method).or_default() += 1;
    }

    /// How many times `method` (a [`ContainerEngine`] method name, e.g. `"create"`) was
    /// called.
    pub fn count(&self, method: &str) -> u64 {
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.get(method).copied().unwrap_or(0)
    }

    /// Every method called so far with its count.
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A [`ContainerEngine`] that decorates `E`: labels, journal, removal faults.
#[derive(Debug)]
pub struct JournaledEngine<E> {
    inner: E,
    journal: Arc<Journal>,
    fault: Arc<AtomicU8>,
}

impl<E: ContainerEngine> JournaledEngine<E> {
    /// Decorates `inner`.
    pub fn new(inner: E) -> Self {
        JournaledEngine {
            inner,
            journal: Arc::new(Journal::default()),
            fault: Arc::new(AtomicU8::new(RemovalFault::None.as_u8())),
        }
    }

    /// The inner engine.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// The journal of calls (shared with the engine).
    pub fn journal(&self) -> Arc<Journal> {
        self.journal.clone()
    }

    /// A handle that sets the removal fault of this engine from outside (the engine
    /// itself moves into a backend).
    pub fn fault_switch(&self) -> FaultSwitch {
        FaultSwitch(self.fault.clone())
    }

    fn fault(&self) -> RemovalFault {
        RemovalFault::from_u8(self.fault.load(Ordering::SeqCst))
    }
}

/// Sets a [`JournaledEngine`]'s [`RemovalFault`].
#[derive(Debug, Clone)]
pub struct FaultSwitch(Arc<AtomicU8>);

impl FaultSwitch {
    /// Makes removals behave as `fault` from now on (a hanging removal resumes when the
    /// fault is cleared).
    pub fn set(&self, fault: RemovalFault) {
        self.0.store(fault.as_u8(), Ordering::SeqCst);
    }
}

/// The engine-independent settings this example uses: the image, egress `Allow` without
/// the always-blocked set, and everything else at the container layer's defaults.
///
/// This engine implements no networks of its own, so an `Allow` sandbox joins the inner
/// engine's default bridge with no egress rules: it can reach the cloud metadata service,
/// this host's services and other containers. The container layer refuses that unless
/// the configuration opts in, as this example does; an engine that implements
/// `create_network` and `networks` gets the blocked set instead.
pub fn container_config(image: &str, startup_sweep: bool) -> ContainerConfig {
    ContainerConfig::new(image)
        .startup_sweep(startup_sweep)
        .allow_unfiltered_egress(true)
}

#[async_trait]
impl<E: ContainerEngine> ContainerEngine for JournaledEngine<E> {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn tier(&self) -> IsolationTier {
        self.inner.tier()
    }

    fn capabilities(&self) -> Capability {
        self.inner.capabilities()
    }

    fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }

    fn unavailable_hint(&self) -> String {
        self.inner.unavailable_hint()
    }

    fn check_spec(&self, spec: &ContainerSpec) -> EngineResult<()> {
        // The inner engine refuses what it cannot enforce; this engine adds a label, which
        // cannot make a spec unenforceable.
        self.inner.check_spec(spec)
    }

    async fn create(&self, spec: &ContainerSpec) -> EngineResult<String> {
        self.journal.record("create");
        if spec.labels.contains_key(LABEL_ENGINE) {
            // The caller's metadata must not pass for this engine's stamp.
            return Err(EngineError::new(
                EngineErrorKind::InvalidRequest,
                format!("label `{LABEL_ENGINE}` is reserved for the engine"),
            ));
        }
        let mut spec = spec.clone();
        spec.labels.insert(LABEL_ENGINE.into(), LABEL_VALUE.into());
        self.inner.create(&spec).await
    }

    async fn start(&self, id: &str) -> EngineResult<()> {
        self.journal.record("start");
        self.inner.start(id).await
    }

    async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo> {
        self.journal.record("inspect");
        self.inner.inspect(id).await
    }

    async fn pause(&self, id: &str) -> EngineResult<()> {
        self.inner.pause(id).await
    }
    async fn unpause(&self, id: &str) -> EngineResult<()> {
        self.inner.unpause(id).await
    }
    async fn stop(&self, id: &str, grace: std::time::Duration) -> EngineResult<()> {
        self.inner.stop(id, grace).await
    }

    fn fork_support(&self) -> Result<(), String> {
        self.inner.fork_support()
    }
    async fn checkpoint(&self, id: &str, checkpoint: &str) -> EngineResult<()> {
        self.inner.checkpoint(id, checkpoint).await
    }
    async fn copy_for_fork(&self, from: &str, checkpoint: &str, to: &str) -> EngineResult<()> {
        self.inner.copy_for_fork(from, checkpoint, to).await
    }
    async fn start_from_checkpoint(&self, id: &str, checkpoint: &str) -> EngineResult<()> {
        self.inner.start_from_checkpoint(id, checkpoint).await
    }
    async fn remove_checkpoint(&self, id: &str, checkpoint: &str) -> EngineResult<()> {
        self.inner.remove_checkpoint(id, checkpoint).await
    }
    async fn image_config(&self, image: &str) -> EngineResult<sandbox_container::engine::ImageConfig> {
        self.inner.image_config(image).await
    }
    async fn export(&self, id: &str) -> EngineResult<ArchiveBody> {
        self.inner.export(id).await
    }
    async fn import_image(
        &self,
        body: ArchiveBody,
        import: &sandbox_container::engine::ImageImport,
    ) -> EngineResult<String> {
        self.inner.import_image(body, import).await
    }
    async fn list_images(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> EngineResult<Vec<sandbox_container::engine::ImageInfo>> {
        self.inner.list_images(labels).await
    }
    async fn remove_image(&self, image: &str) -> EngineResult<bool> {
        self.inner.remove_image(image).await
    }
    async fn remove(&self, id: &str) -> EngineResult<bool> {
        self.journal.record("remove");
        loop {
            match self.fault() {
                RemovalFault::None => break,
                // The container layer bounds every engine call, so a hang here ends as
                // a timeout there, exactly as a wedged engine would.
                RemovalFault::Hang => tokio::time::sleep(Duration::from_millis(20)).await,
                RemovalFault::Fail => {
                    return Err(EngineError::new(
                        EngineErrorKind::Other,
                        "injected fault: removal failed",
                    ));
                }
            }
        }
        self.inner.remove(id).await
    }

    async fn list(&self, labels: &BTreeMap<String, String>) -> EngineResult<Vec<ContainerInfo>> {
        self.journal.record("list");
        self.inner.list(labels).await
    }

    async fn exec(&self, id: &str, request: ExecRequest) -> EngineResult<ExecStream> {
        self.journal.record("exec");
        self.inner.exec(id, request).await
    }

    async fn exec_state(&self, exec_id: &str) -> EngineResult<ExecState> {
        self.journal.record("exec_state");
        self.inner.exec_state(exec_id).await
    }

    async fn put_archive(&self, id: &str, dir: &str, body: ArchiveBody) -> EngineResult<()> {
        self.journal.record("put_archive");
        self.inner.put_archive(id, dir, body).await
    }

    async fn get_archive(&self, id: &str, path: &str) -> EngineResult<ArchiveBody> {
        self.journal.record("get_archive");
        self.inner.get_archive(id, path).await
    }

    async fn stat_path(&self, id: &str, path: &str) -> EngineResult<PathStat> {
        self.journal.record("stat_path");
        self.inner.stat_path(id, path).await
    }

    // A disk limit (which the inner engine declares) needs the volumes an image declares:
    // without this the container layer refuses `disk_mb` on this engine.
    async fn image_volumes(&self, image: &str) -> EngineResult<Vec<String>> {
        self.journal.record("image_volumes");
        self.inner.image_volumes(image).await
    }

    async fn ping(&self) -> EngineResult<()> {
        self.journal.record("ping");
        self.inner.ping().await
    }

    async fn facts(&self) -> EngineFacts {
        self.journal.record("facts");
        self.inner.facts().await
    }
}
