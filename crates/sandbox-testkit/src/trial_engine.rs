//! [`TrialEngine`]: the real engine, decorated with what a trial arms around it. Faults are
//! injected here, in the test, at the trait the container layer drives
//! ([`ContainerEngine`]), never through a switch inside the library: the library under
//! test runs exactly as in production, and only what the engine tells it changes.
//!
//! What a trial can arm: a container whose network namespace cannot be entered (the
//! egress setup then fails the create as a failing `nft` would), the library network
//! removed right before the next create that joins it (another process's sweep at the
//! worst moment), and a library network of the trial's own name (so a trial about that
//! network never disturbs the shared one). It also records the agent mounts it was asked
//! for.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sandbox_container::egress::NETWORK_NAME;
use sandbox_container::engine::{NetworkInfo, NetworkSpec};
use sandbox_container::image::{CredentialStore, PullProgress, RegistryAuth};
use sandbox_container::{
    ArchiveBody, AttachStream, ContainerEngine, ContainerInfo, ContainerSpec, EngineErrorKind,
    EngineFacts, EngineResult, ExecRequest, ExecState, ExecStream, NetworkMode,
};
use sandbox_core::{Capability, IsolationTier};

/// A pid no process can have (Linux caps pids at 2^22), so `/proc/<pid>/ns/net` does not
/// exist and nothing can enter that namespace.
pub const UNENTERABLE_PID: u32 = u32::MAX;

/// The engine `inner`, delegated to call by call, plus the faults a trial arms (none until
/// armed) and a record of the agent mounts it was asked for.
#[derive(Debug)]
pub struct TrialEngine<E> {
    inner: E,
    /// Set: the next container started reports [`UNENTERABLE_PID`] on its next inspect.
    unenterable_next: AtomicBool,
    /// The started container whose next inspect reports [`UNENTERABLE_PID`].
    unenterable: Mutex<Option<String>>,
    /// Set: the next create that joins a network first removes the library network.
    steal_next: AtomicBool,
    stolen: AtomicU64,
    /// The engine-side name of the library network, when the trial has its own.
    network_name: Option<String>,
    agent_mounts: Mutex<Vec<PathBuf>>,
}

impl<E: ContainerEngine> TrialEngine<E> {
    /// `inner`, nothing armed.
    pub fn new(inner: E) -> Self {
        TrialEngine {
            inner,
            unenterable_next: AtomicBool::new(false),
            unenterable: Mutex::new(None),
            steal_next: AtomicBool::new(false),
            stolen: AtomicU64::new(0),
            network_name: None,
            agent_mounts: Mutex::new(Vec::new()),
        }
    }

    /// The engine under the decoration.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// The next container started reports a pid whose network namespace cannot be
    /// entered ([`UNENTERABLE_PID`]) on its next inspect: the egress setup, which enters
    /// it from the host right after the start, fails.
    pub fn unenterable_namespace_once(&self) {
        self.unenterable_next.store(true, Ordering::SeqCst);
    }

    /// The next create of a container that joins a network first removes the library
    /// network ([`NETWORK_NAME`]), waiting up to 20 s for another sandbox on it to go.
    pub fn steal_network_once(&self) {
        self.steal_next.store(true, Ordering::SeqCst);
    }

    /// How many library networks the trial engine removed.
    pub fn stolen_networks(&self) -> u64 {
        self.stolen.load(Ordering::SeqCst)
    }

    /// The library network is `name` on the engine: the library's network calls for
    /// [`NETWORK_NAME`] go to `name`, and the engine's own network of that name is
    /// listed under a name the library never asks for.
    pub fn with_network_name(mut self, name: impl Into<String>) -> Self {
        self.network_name = Some(name.into());
        self
    }

    /// The agent mounts ([`ContainerSpec::agent_mount`]) of every create so far.
    pub fn agent_mounts(&self) -> Vec<PathBuf> {
        self.agent_mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The engine-side name of the library network `name`.
    fn engine_network<'a>(&'a self, name: &'a str) -> &'a str {
        match &self.network_name {
            Some(own) if name == NETWORK_NAME => own,
            _ => name,
        }
    }

    async fn steal_network(&self) -> EngineResult<()> {
        // Another test's sandbox may still be on the network for a moment.
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match self
                .inner
                .remove_network(self.engine_network(NETWORK_NAME))
                .await
            {
                Ok(_) => {
                    self.stolen.fetch_add(1, Ordering::SeqCst);
                    return Ok(());
                }
                Err(e) if e.kind == EngineErrorKind::Conflict && Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[async_trait::async_trait]
impl<E: ContainerEngine> ContainerEngine for TrialEngine<E> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
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
        self.inner.check_spec(spec)
    }
    async fn create(&self, spec: &ContainerSpec) -> EngineResult<String> {
        if let Some(m) = &spec.agent_mount {
            self.agent_mounts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(m.clone());
        }
        let joins = !matches!(spec.network, NetworkMode::None);
        if joins && self.steal_next.swap(false, Ordering::SeqCst) {
            self.steal_network().await?;
        }
        self.inner.create(spec).await
    }
    fn copy_mounts(&self) -> Vec<sandbox_container::mounts::Mount> {
        self.inner.copy_mounts()
    }
    fn hooks(&self) -> sandbox_container::hooks::Hooks {
        self.inner.hooks()
    }
    async fn start(&self, id: &str) -> EngineResult<()> {
        self.inner.start(id).await?;
        if self.unenterable_next.swap(false, Ordering::SeqCst) {
            *self.unenterable.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.to_string());
        }
        Ok(())
    }
    async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo> {
        let mut info = self.inner.inspect(id).await?;
        let mut armed = self.unenterable.lock().unwrap_or_else(|p| p.into_inner());
        if armed.as_deref() == Some(id) {
            *armed = None;
            info.pid = Some(UNENTERABLE_PID);
        }
        Ok(info)
    }
    async fn remove(&self, id: &str) -> EngineResult<bool> {
        self.inner.remove(id).await
    }
    async fn list(&self, labels: &BTreeMap<String, String>) -> EngineResult<Vec<ContainerInfo>> {
        self.inner.list(labels).await
    }
    async fn exec(&self, id: &str, request: ExecRequest) -> EngineResult<ExecStream> {
        self.inner.exec(id, request).await
    }
    fn supports_attach(&self) -> bool {
        self.inner.supports_attach()
    }
    fn supports_agent_mount(&self) -> bool {
        self.inner.supports_agent_mount()
    }
    async fn attach(&self, id: &str) -> EngineResult<AttachStream> {
        self.inner.attach(id).await
    }
    async fn exec_state(&self, exec_id: &str) -> EngineResult<ExecState> {
        self.inner.exec_state(exec_id).await
    }
    async fn put_archive(&self, id: &str, dir: &str, body: ArchiveBody) -> EngineResult<()> {
        self.inner.put_archive(id, dir, body).await
    }
    async fn get_archive(&self, id: &str, path: &str) -> EngineResult<ArchiveBody> {
        self.inner.get_archive(id, path).await
    }
    async fn stat_path(&self, id: &str, path: &str) -> EngineResult<sandbox_container::PathStat> {
        self.inner.stat_path(id, path).await
    }
    fn is_local(&self) -> bool {
        self.inner.is_local()
    }
    fn netfilter_applies(&self) -> bool {
        self.inner.netfilter_applies()
    }
    async fn create_network(&self, spec: &NetworkSpec) -> EngineResult<()> {
        let mut spec = spec.clone();
        spec.name = self.engine_network(&spec.name).to_string();
        self.inner.create_network(&spec).await
    }
    async fn networks(&self) -> EngineResult<Vec<NetworkInfo>> {
        let mut all = self.inner.networks().await?;
        if let Some(own) = &self.network_name {
            for n in &mut all {
                if n.name == *own {
                    n.name = NETWORK_NAME.to_string();
                } else if n.name == NETWORK_NAME {
                    n.name = format!("{NETWORK_NAME} (not this trial's)");
                }
            }
        }
        Ok(all)
    }
    async fn remove_network(&self, name: &str) -> EngineResult<bool> {
        self.inner.remove_network(self.engine_network(name)).await
    }
    fn credential_store(&self) -> CredentialStore {
        self.inner.credential_store()
    }
    async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        self.inner.image_exists(image).await
    }
    async fn pull(
        &self,
        image: &str,
        auth: Option<&RegistryAuth>,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> EngineResult<()> {
        self.inner.pull(image, auth, progress).await
    }
    async fn ping(&self) -> EngineResult<()> {
        self.inner.ping().await
    }
    async fn facts(&self) -> EngineFacts {
        self.inner.facts().await
    }
    fn images_hint(&self) -> String {
        self.inner.images_hint()
    }
}
