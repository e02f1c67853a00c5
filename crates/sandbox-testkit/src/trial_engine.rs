//! [`TrialEngine`]: the real engine, decorated with what a trial arms around it. Faults are
//! injected here, in the test, at the trait the container layer drives
//! ([`ContainerEngine`]), never through a switch inside the library: the library under
//! test runs exactly as in production, and only what the engine tells it changes.
//!
//! What a trial can arm: a container whose network namespace cannot be entered (the
//! egress setup then fails the create as a failing `nft` would) or whose reported pid is
//! another process's (as where the engine's pids are not this host's), the library network
//! removed right before the next create that joins it (another process's sweep at the
//! worst moment), and a library network of the trial's own name (so a trial about that
//! network never disturbs the shared one), and an agent mount the engine cannot see (as
//! an engine on another machine sees this host's paths), and attaches that fail (so the
//! agent never answers). It also records the agent mounts it was asked for.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sandbox_container::egress::NETWORK_NAME;
use sandbox_container::engine::{NetworkInfo, NetworkSpec};
use sandbox_container::image::{CredentialStore, PullRequest};
use sandbox_container::{
    ArchiveBody, AttachStream, ContainerEngine, ContainerInfo, ContainerSpec, EngineErrorKind,
    EngineFacts, EngineResult, ExecRequest, ExecState, ExecStream, NetworkMode,
};
use sandbox_core::{Capability, IsolationTier};

/// A pid no process can have (Linux caps pids at 2^22), so `/proc/<pid>/ns/net` does not
/// exist and nothing can enter that namespace.
pub const UNENTERABLE_PID: u32 = u32::MAX;

/// The host path [`TrialEngine::agent_mount_unseen_once`] hands the engine: no such file.
pub const UNSEEN_AGENT_MOUNT: &str = "/nonexistent/sandbox-rs-trial/sandbox-agent";

/// The engine `inner`, delegated to call by call, plus the faults a trial arms (none until
/// armed) and a record of the agent mounts it was asked for.
#[derive(Debug)]
pub struct TrialEngine<E> {
    inner: E,
    /// Set: the next container started reports this pid on its next inspect.
    pid_next: Mutex<Option<u32>>,
    /// The started container whose next inspect reports another pid, and that pid.
    pid_armed: Mutex<Option<(String, u32)>>,
    /// Set: the next create that joins a network first removes the library network.
    steal_next: AtomicBool,
    stolen: AtomicU64,
    /// The engine-side name of the library network, when the trial has its own.
    network_name: Option<String>,
    agent_mounts: Mutex<Vec<PathBuf>>,
    /// Set: the next create with an agent mount names a host file that does not exist.
    unseen_mount_next: AtomicBool,
    /// Set: the engine says it is not on this machine.
    remote: bool,
    /// How many of the next attaches fail.
    attach_refusals: AtomicU64,
}

impl<E: ContainerEngine> TrialEngine<E> {
    /// `inner`, nothing armed.
    pub fn new(inner: E) -> Self {
        TrialEngine {
            inner,
            pid_next: Mutex::new(None),
            pid_armed: Mutex::new(None),
            steal_next: AtomicBool::new(false),
            stolen: AtomicU64::new(0),
            network_name: None,
            agent_mounts: Mutex::new(Vec::new()),
            unseen_mount_next: AtomicBool::new(false),
            remote: false,
            attach_refusals: AtomicU64::new(0),
        }
    }

    /// The next `n` attaches fail as an engine's refusal would: the agent of each of those
    /// containers never gets its hello, so the create gives up on it.
    pub fn refuse_attaches(&self, n: u64) {
        self.attach_refusals.store(n, Ordering::SeqCst);
    }

    /// The engine under the decoration.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// The next container started reports a pid whose network namespace cannot be
    /// entered ([`UNENTERABLE_PID`]) on its next inspect: the egress setup, which enters
    /// it from the host right after the start, fails.
    pub fn unenterable_namespace_once(&self) {
        self.foreign_pid_once(UNENTERABLE_PID);
    }

    /// The next container started reports `pid` as its first process on its next
    /// inspect, as an engine whose pids are not this host's does (a library in a container
    /// talking to the host's socket, an engine in a VM): the pid names some other process
    /// here.
    pub fn foreign_pid_once(&self, pid: u32) {
        *self.pid_next.lock().unwrap_or_else(|p| p.into_inner()) = Some(pid);
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

    /// The engine says it is not on this machine ([`ContainerEngine::is_local`] false),
    /// as one reached over TCP or SSH: the library cannot enter its containers'
    /// namespaces, so it can load no egress rules there.
    pub fn as_remote(mut self) -> Self {
        self.remote = true;
        self
    }

    /// The next create with an agent mount hands the engine [`UNSEEN_AGENT_MOUNT`]
    /// instead of the library's host copy: the engine cannot find the file, as an engine
    /// that does not share this host's files (a client in a container talking to the
    /// host's socket). The host copy itself is left alone.
    pub fn agent_mount_unseen_once(&self) {
        self.unseen_mount_next.store(true, Ordering::SeqCst);
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
        let unseen;
        let spec = match &spec.agent_mount {
            Some(_) if self.unseen_mount_next.swap(false, Ordering::SeqCst) => {
                let mut s = spec.clone();
                s.agent_mount = Some(PathBuf::from(UNSEEN_AGENT_MOUNT));
                unseen = s;
                &unseen
            }
            _ => spec,
        };
        let joins = !matches!(spec.network, NetworkMode::None);
        if joins && self.steal_next.swap(false, Ordering::SeqCst) {
            self.steal_network().await?;
        }
        self.inner.create(spec).await
    }
    fn copy_mounts(&self) -> Vec<sandbox_container::spec::mounts::Mount> {
        self.inner.copy_mounts()
    }
    fn hooks(&self) -> sandbox_container::spec::hooks::Hooks {
        self.inner.hooks()
    }
    async fn start(&self, id: &str) -> EngineResult<()> {
        self.inner.start(id).await?;
        if let Some(pid) = self
            .pid_next
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            *self.pid_armed.lock().unwrap_or_else(|p| p.into_inner()) = Some((id.to_string(), pid));
        }
        Ok(())
    }
    async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo> {
        let mut info = self.inner.inspect(id).await?;
        let mut armed = self.pid_armed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((armed_id, pid)) = armed.as_ref()
            && armed_id == id
        {
            info.pid = Some(*pid);
            *armed = None;
        }
        Ok(info)
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
    async fn image_config(
        &self,
        image: &str,
    ) -> EngineResult<sandbox_container::engine::ImageConfig> {
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
    fn attach_survives_detach(&self) -> bool {
        self.inner.attach_survives_detach()
    }
    fn supports_agent_mount(&self) -> bool {
        self.inner.supports_agent_mount()
    }
    async fn attach(&self, id: &str) -> EngineResult<AttachStream> {
        let refused = self
            .attach_refusals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refused {
            return Err(sandbox_container::EngineError::new(
                EngineErrorKind::Other,
                "attach refused (trial fault)",
            ));
        }
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
        !self.remote && self.inner.is_local()
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
    async fn image_volumes(&self, image: &str) -> EngineResult<Vec<String>> {
        self.inner.image_volumes(image).await
    }
    async fn pull(&self, request: PullRequest<'_>) -> EngineResult<()> {
        self.inner.pull(request).await
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

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_container::EngineError;
    use sandbox_core::{Resources, SandboxState};

    /// An engine that runs nothing: it reports pid 7 for every container, lists the
    /// networks it was told about, and records the network calls it got.
    #[derive(Debug, Default)]
    struct Stub {
        networks: Mutex<Vec<String>>,
        calls: Mutex<Vec<String>>,
        mounts: Mutex<Vec<Option<PathBuf>>>,
    }

    impl Stub {
        fn log(&self, call: String) {
            self.calls.lock().unwrap().push(call);
        }
    }

    fn unsupported<T>() -> EngineResult<T> {
        Err(EngineError::new(EngineErrorKind::Other, "not in the stub"))
    }

    #[async_trait::async_trait]
    impl ContainerEngine for Stub {
        fn backend(&self) -> &'static str {
            "stub"
        }
        fn tier(&self) -> IsolationTier {
            IsolationTier::Container
        }
        fn capabilities(&self) -> Capability {
            Capability::empty()
        }
        fn endpoint(&self) -> &str {
            "stub://"
        }
        async fn create(&self, spec: &ContainerSpec) -> EngineResult<String> {
            self.log(format!("create {}", spec.name));
            self.mounts.lock().unwrap().push(spec.agent_mount.clone());
            Ok(spec.name.clone())
        }
        async fn start(&self, _id: &str) -> EngineResult<()> {
            Ok(())
        }
        async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo> {
            let mut info = ContainerInfo::new(id, id, SandboxState::Running, BTreeMap::new());
            info.pid = Some(7);
            Ok(info)
        }
        async fn remove(&self, _id: &str) -> EngineResult<bool> {
            Ok(true)
        }
        async fn list(&self, _: &BTreeMap<String, String>) -> EngineResult<Vec<ContainerInfo>> {
            Ok(Vec::new())
        }
        async fn exec(&self, _id: &str, _request: ExecRequest) -> EngineResult<ExecStream> {
            unsupported()
        }
        async fn exec_state(&self, _exec_id: &str) -> EngineResult<ExecState> {
            unsupported()
        }
        async fn put_archive(&self, _id: &str, _dir: &str, _body: ArchiveBody) -> EngineResult<()> {
            unsupported()
        }
        async fn get_archive(&self, _id: &str, _path: &str) -> EngineResult<ArchiveBody> {
            unsupported()
        }
        async fn stat_path(
            &self,
            _id: &str,
            _path: &str,
        ) -> EngineResult<sandbox_container::PathStat> {
            unsupported()
        }
        async fn create_network(&self, spec: &NetworkSpec) -> EngineResult<()> {
            self.log(format!("create_network {}", spec.name));
            self.networks.lock().unwrap().push(spec.name.clone());
            Ok(())
        }
        async fn networks(&self) -> EngineResult<Vec<NetworkInfo>> {
            let names = self.networks.lock().unwrap().clone();
            Ok(names
                .into_iter()
                .map(|n| NetworkInfo::new(n, Vec::new(), BTreeMap::new()))
                .collect())
        }
        async fn remove_network(&self, name: &str) -> EngineResult<bool> {
            self.log(format!("remove_network {name}"));
            Ok(true)
        }
        async fn ping(&self) -> EngineResult<()> {
            Ok(())
        }
        async fn facts(&self) -> EngineFacts {
            EngineFacts::default()
        }
    }

    fn spec(name: &str, network: NetworkMode) -> ContainerSpec {
        let resources = Resources::default().effective().unwrap();
        let mut s = ContainerSpec::new(name, "img", Vec::new(), resources, Duration::from_secs(1));
        s.network = network;
        s
    }

    async fn pid(e: &TrialEngine<Stub>, id: &str) -> Option<u32> {
        e.inspect(id).await.unwrap().pid
    }

    #[tokio::test]
    async fn an_unenterable_namespace_is_reported_once_for_the_next_started_container() {
        let e = TrialEngine::new(Stub::default());
        e.start("before").await.unwrap();
        e.unenterable_namespace_once();
        assert_eq!(pid(&e, "before").await, Some(7), "armed after its start");
        e.start("target").await.unwrap();
        e.start("later").await.unwrap();
        assert_eq!(pid(&e, "later").await, Some(7));
        assert_eq!(pid(&e, "target").await, Some(UNENTERABLE_PID));
        assert_eq!(pid(&e, "target").await, Some(7), "once");
    }

    #[tokio::test]
    async fn the_library_network_is_stolen_before_the_next_create_that_joins_one() {
        let e = TrialEngine::new(Stub::default());
        e.steal_network_once();
        e.create(&spec("offline", NetworkMode::None)).await.unwrap();
        assert_eq!(
            e.stolen_networks(),
            0,
            "a create without a network is left alone"
        );
        let joins = NetworkMode::Bridge {
            publish: Vec::new(),
        };
        e.create(&spec("online", joins.clone())).await.unwrap();
        e.create(&spec("again", joins)).await.unwrap();
        assert_eq!(e.stolen_networks(), 1);
        let calls = e.inner().calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            [
                "create offline".to_string(),
                format!("remove_network {NETWORK_NAME}"),
                "create online".into(),
                "create again".into(),
            ]
        );
    }

    #[tokio::test]
    async fn a_trial_network_name_stands_in_for_the_library_network() {
        let e = TrialEngine::new(Stub::default()).with_network_name("sbx-egress-trial");
        e.inner()
            .networks
            .lock()
            .unwrap()
            .push(NETWORK_NAME.to_string());
        e.create_network(&NetworkSpec::new(NETWORK_NAME, BTreeMap::new()))
            .await
            .unwrap();
        let seen: Vec<String> = e
            .networks()
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.name)
            .collect();
        assert_eq!(
            seen,
            [
                format!("{NETWORK_NAME} (not this trial's)"),
                NETWORK_NAME.to_string()
            ]
        );
        assert!(e.remove_network(NETWORK_NAME).await.unwrap());
        assert!(e.remove_network("other").await.unwrap());
        let calls = e.inner().calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            [
                "create_network sbx-egress-trial",
                "remove_network sbx-egress-trial",
                "remove_network other",
            ]
        );
    }

    #[tokio::test]
    async fn agent_mounts_are_recorded() {
        let e = TrialEngine::new(Stub::default());
        let mut s = spec("a", NetworkMode::None);
        s.agent_mount = Some(PathBuf::from("/cache/sandbox-agent-1"));
        e.create(&s).await.unwrap();
        e.create(&spec("b", NetworkMode::None)).await.unwrap();
        assert_eq!(e.agent_mounts(), [PathBuf::from("/cache/sandbox-agent-1")]);
    }

    #[tokio::test]
    async fn an_unseen_agent_mount_reaches_the_engine_once() {
        let e = TrialEngine::new(Stub::default());
        e.agent_mount_unseen_once();
        let mut s = spec("a", NetworkMode::None);
        s.agent_mount = Some(PathBuf::from("/cache/sandbox-agent-1"));
        e.create(&s).await.unwrap();
        e.create(&s).await.unwrap();
        let mounts = e.inner().mounts.lock().unwrap().clone();
        assert_eq!(
            mounts,
            [
                Some(PathBuf::from(UNSEEN_AGENT_MOUNT)),
                Some(PathBuf::from("/cache/sandbox-agent-1"))
            ]
        );
    }
}
