//! A model of the kernel evidence an in-process backend cannot give (`/proc`, cgroup
//! files, the hostile trials' programs), answered from the options each sandbox was
//! created with, so the self-test can prove the kernel-evidence trials judge what they
//! read.

use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use sandbox_core::{
    Backend, Capability, CodeOptions, Command, CreateOptions, Egress, ExecResult, FileInfo,
    FileSystem, IsolationTier, ManagedSandbox, Process, ReapableBackend, Result, RunOptions,
    Sandbox, SandboxError,
};

/// A model of the kernel's view of a sandbox (`/proc/<pid>/status`, `/proc/net/dev`,
/// cgroup v2 files, `/proc/1/comm`), answered from the options the sandbox was created
/// with, in front of an in-process backend. The real suite reports kernel-evidence
/// trials "not applicable" on such a backend; the self-test puts this model in front of
/// the fake so those trials have evidence to judge, and a flaw that changes the options
/// (or the evidence) must make them fail. Not evidence of anything else.
pub fn kernel_model(inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
    Arc::new(ModelBackend { inner })
}

#[derive(Debug)]
struct ModelBackend {
    inner: Arc<dyn Backend>,
}

/// What a hardened container of these options shows its processes.
#[derive(Debug, Clone)]
struct KernelView {
    memory_bytes: u64,
    pids: u64,
    cpu_quota_us: u64,
    egress: bool,
    hostname: String,
}

impl KernelView {
    fn of(options: &CreateOptions) -> KernelView {
        let r = &options.resources;
        KernelView {
            memory_bytes: r.memory_mb.unwrap_or(sandbox_core::DEFAULT_MEMORY_MB) << 20,
            pids: r.pids.unwrap_or(sandbox_core::DEFAULT_PIDS),
            cpu_quota_us: (r.cpu.unwrap_or(sandbox_core::DEFAULT_CPU) * 100_000.0) as u64,
            egress: options.network.egress != Egress::Deny,
            // An engine names a container after its id without one; the model's is fixed.
            hostname: options
                .hostname
                .clone()
                .unwrap_or_else(|| "model-host".into()),
        }
    }

    fn file(&self, path: &str) -> Option<String> {
        const STATUS: &str = "Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nCapInh:\t0000000000000000\n\
             CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n\
             CapAmb:\t0000000000000000\nNoNewPrivs:\t1\n";
        let net = |ifs: &[&str]| {
            let mut s = String::from(
                "Inter-|   Receive                |  Transmit\n face |bytes    packets|bytes    packets\n",
            );
            for i in ifs {
                s.push_str(&format!("{i:>6}: 0 0 0 0\n"));
            }
            s
        };
        Some(match path {
            "/proc/1/status" | "/proc/self/status" => STATUS.to_string(),
            "/proc/1/comm" => "docker-init\n".to_string(),
            "/proc/sys/kernel/hostname" => format!("{}\n", self.hostname),
            "/proc/net/dev" if self.egress => net(&["lo", "eth0"]),
            // The default route through the host's address on the sandbox's network; the
            // fake's host is this machine, reached through loopback.
            "/proc/net/route" if self.egress => {
                "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
                 eth0\t00000000\t0100007F\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
                    .to_string()
            }
            "/proc/net/dev" => net(&["lo"]),
            "/sys/fs/cgroup/memory.max" => format!("{}\n", self.memory_bytes),
            "/sys/fs/cgroup/memory.swap.max" => "0\n".to_string(),
            "/sys/fs/cgroup/pids.max" => format!("{}\n", self.pids),
            "/sys/fs/cgroup/cpu.max" => format!("{} 100000\n", self.cpu_quota_us),
            _ => return None,
        })
    }
}

#[async_trait]
impl Backend for ModelBackend {
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
        let view = KernelView::of(&options);
        let inner = self.inner.create(options).await?;
        Ok(Box::new(ModelSandbox::new(inner, view)))
    }
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        let inner = self.inner.connect(id).await?;
        Ok(Box::new(ModelSandbox::new(
            inner,
            KernelView::of(&CreateOptions::default()),
        )))
    }
    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        self.inner
            .as_reapable()
            .map(|_| self as &dyn ReapableBackend)
    }
}

#[async_trait]
impl ReapableBackend for ModelBackend {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        match self.inner.as_reapable() {
            Some(r) => r.list_managed(labels).await,
            None => Err(SandboxError::unsupported(Capability::empty(), self.name())),
        }
    }
    async fn kill_managed(&self, id: &str) -> Result<bool> {
        match self.inner.as_reapable() {
            Some(r) => r.kill_managed(id).await,
            None => Err(SandboxError::unsupported(Capability::empty(), self.name())),
        }
    }
    async fn list_snapshots(&self) -> Result<Vec<sandbox_core::Snapshot>> {
        match self.inner.as_reapable() {
            Some(r) => r.list_snapshots().await,
            None => Err(SandboxError::unsupported(Capability::empty(), self.name())),
        }
    }
    async fn remove_snapshot(&self, template: &str) -> Result<bool> {
        match self.inner.as_reapable() {
            Some(r) => r.remove_snapshot(template).await,
            None => Err(SandboxError::unsupported(Capability::empty(), self.name())),
        }
    }
}

#[derive(Debug)]
struct ModelSandbox {
    inner: Box<dyn Sandbox>,
    view: KernelView,
    /// Paths `truncate -s` made sparse and huge (the fake stores files densely).
    sparse: Mutex<Vec<String>>,
    /// The pids holder ran: every pid of the limit is taken, nothing new starts.
    pids_held: std::sync::atomic::AtomicBool,
}

impl ModelSandbox {
    fn new(inner: Box<dyn Sandbox>, view: KernelView) -> Self {
        ModelSandbox {
            inner,
            view,
            sparse: Mutex::new(Vec::new()),
            pids_held: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn is_sparse(&self, path: &str) -> bool {
        self.sparse
            .lock()
            .is_ok_and(|s| s.iter().any(|p| p == path))
    }

    /// The hostile trials' programs, answered from the configured limits the way a
    /// kernel enforcing them would.
    fn hostile_program(&self, argv: &[String]) -> Option<ExecResult> {
        let [prog, flag, code] = argv else {
            return None;
        };
        if prog != "python3" || flag != "-c" {
            return None;
        }
        if code.contains(crate::hostile::FORK_BOMB_MARK) {
            // Forks succeed until the pids limit (the program itself is one process).
            let attempts: u64 = code
                .split("range(")
                .nth(1)
                .and_then(|r| r.split(')').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let forked = attempts.min(self.view.pids.saturating_sub(1));
            return Some(ExecResult::new(0, format!("{forked}\n"), ""));
        }
        if code.contains(crate::hostile::PIDS_HOLDER_MARK) {
            self.pids_held
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Some(ExecResult::new(0, "", ""));
        }
        if code.contains(crate::hostile::MEMORY_HOG_MARK) {
            return Some(
                if self.view.memory_bytes < crate::hostile::MEMORY_HOG_MB << 20 {
                    ExecResult::new(137, "", "Killed\n")
                } else {
                    ExecResult::new(0, "survived\n", "")
                },
            );
        }
        None
    }
}

#[async_trait]
impl Sandbox for ModelSandbox {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn backend(&self) -> &str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capability {
        self.inner.capabilities()
    }
    fn isolation(&self) -> IsolationTier {
        self.inner.isolation()
    }
    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult> {
        if self.pids_held.load(std::sync::atomic::Ordering::SeqCst) {
            // What an adapter reports when no process can start: the limit, typed.
            return Err(SandboxError::resource_limit(
                format!(
                    "pids: the sandbox's pids limit is exhausted ({0} of {0} in use)",
                    self.view.pids
                ),
                None,
            ));
        }
        if let Command::Argv(argv) = &cmd {
            if let [cat, path] = argv.as_slice()
                && cat == "cat"
                && let Some(text) = self.view.file(path)
            {
                return Ok(ExecResult::new(0, text, ""));
            }
            if let [truncate, flag, size, path] = argv.as_slice()
                && truncate == "truncate"
                && flag == "-s"
                && size == crate::hostile::SPARSE_FILE
            {
                if let Ok(mut s) = self.sparse.lock() {
                    s.push(path.clone());
                }
                return Ok(ExecResult::new(0, "", ""));
            }
            if let Some(r) = self.hostile_program(argv) {
                return Ok(r);
            }
        }
        if let Command::Shell(script) = &cmd
            && script.contains(crate::hostile::JUNK_MARK)
        {
            // No /dev/shm, /tmp or /run bookkeeping to overwrite in the fake: what
            // is left of the attack is its pid file and its sleep.
            let rest = "echo $$ > /work/junk-pid; exec sleep 300".to_string();
            return self.inner.run(Command::Shell(rest), options).await;
        }
        self.inner.run(cmd, options).await
    }
    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        self.inner.run_code(code, options).await
    }
    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        self.inner.stream(cmd, options)
    }
    fn files(&self) -> Result<&dyn FileSystem> {
        self.inner.files()?;
        Ok(self)
    }
    fn ingress_address(&self, port: u16) -> Result<std::net::SocketAddr> {
        self.inner.ingress_address(port)
    }
    async fn kill(&self) -> Result<()> {
        self.inner.kill().await
    }
    async fn reset_processes(&self) -> Result<u32> {
        self.inner.reset_processes().await
    }
    async fn pause(&self) -> Result<()> {
        self.inner.pause().await
    }
    async fn set_egress(&self, egress: sandbox_core::Egress) -> Result<()> {
        self.inner.set_egress(egress).await
    }
    async fn egress(&self) -> Result<sandbox_core::Egress> {
        self.inner.egress().await
    }
    async fn resume(&self) -> Result<()> {
        self.inner.resume().await
    }
    async fn extend(&self, by: std::time::Duration) -> Result<std::time::SystemTime> {
        self.inner.extend(by).await
    }
    async fn snapshot(&self) -> Result<sandbox_core::Snapshot> {
        self.inner.snapshot().await
    }
    async fn stop(&self) -> Result<()> {
        self.inner.stop().await
    }
    async fn start(&self) -> Result<()> {
        self.inner.start().await
    }

    async fn fork(&self, options: sandbox_core::ForkOptions) -> Result<Vec<Box<dyn Sandbox>>> {
        let forks = self.inner.fork(options).await?;
        Ok(forks
            .into_iter()
            .map(|f| Box::new(ModelSandbox::new(f, self.view.clone())) as Box<dyn Sandbox>)
            .collect())
    }
    fn native(&self) -> &dyn Any {
        self.inner.native()
    }
}

/// Files of the model: a sparse 4 GiB file is refused as a capped adapter refuses it;
/// everything else is the inner backend's.
#[async_trait]
impl FileSystem for ModelSandbox {
    async fn read(&self, path: &str) -> Result<Bytes> {
        if self.is_sparse(path) {
            return Err(SandboxError::resource_limit(
                "the model's read cap",
                Some("stream it with download".into()),
            ));
        }
        self.inner.files()?.read(path).await
    }
    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        self.inner.files()?.write(path, data).await
    }
    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        self.inner.files()?.upload(local, remote).await
    }
    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        if self.is_sparse(remote) {
            return Err(SandboxError::resource_limit(
                "the model's download cap",
                Some("download less".into()),
            ));
        }
        self.inner.files()?.download(remote, local).await
    }
    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        self.inner.files()?.ls(path).await
    }
    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        self.inner.files()?.mkdir(path, parents).await
    }
    async fn remove(&self, path: &str) -> Result<()> {
        self.inner.files()?.remove(path).await
    }
    async fn stat(&self, path: &str) -> Result<FileInfo> {
        self.inner.files()?.stat(path).await
    }
}
