//! Deliberately broken backend decorators (feature `broken`), to prove the suite catches
//! broken adapters.
//!
//! [`wrap`] puts one [`Flaw`] around any backend; [`BrokenProbes`] forwards an adapter's
//! probes and wraps its fault backend the same way. `tests/broken_adapters.rs` runs the
//! named trial that must catch each flaw against the wrapped fake and asserts it fails.
//! Never use these outside tests.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use sandbox_core::teardown::OrphanInfo;
use sandbox_core::{
    Backend, Capability, CodeOptions, Command, CreateOptions, Egress, ErrorCode, ExecResult,
    FileSystem, IsolationTier, ManagedSandbox, Process, ReapableBackend, Result, RunOptions,
    Sandbox, SandboxError, StartedExec,
};

use crate::probes::{CanarySpec, EngineLimits, Faults, Probes};

/// One way an adapter can be broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// `run`/`run_code` ignore the timeout (they inherit the lifetime instead) and turn
    /// `ExecutionTimeout` into a successful exit 0.
    SwallowTimeouts,
    /// Declares `NETWORK_POLICY` but creates with egress `Allow` when `Deny` was asked.
    PretendNetworkPolicy,
    /// `Debug` of a sandbox prints the secret values it was created with.
    LeakSecrets,
    /// A failing kill surfaces as a raw `Engine` error instead of `Connect` (no reap hint).
    LeakKillError,
    /// Processes are never killed: a dropped `run` future or `Process` leaves the remote
    /// process running.
    OrphanProcesses,
    /// Declares `INGRESS_PORTS` and accepts ingress ports at create, but publishes nothing:
    /// `ingress_address` names a loopback port where no sandbox program answers.
    PretendIngress,
}

impl Flaw {
    /// Every flaw.
    pub const ALL: [Flaw; 6] = [
        Flaw::SwallowTimeouts,
        Flaw::PretendNetworkPolicy,
        Flaw::LeakSecrets,
        Flaw::LeakKillError,
        Flaw::OrphanProcesses,
        Flaw::PretendIngress,
    ];
}

/// Wraps `inner` so that it has `flaw`.
pub fn wrap(inner: Arc<dyn Backend>, flaw: Flaw) -> Arc<dyn Backend> {
    Arc::new(BrokenBackend { inner, flaw })
}

/// A backend with a flaw.
#[derive(Debug)]
pub struct BrokenBackend {
    inner: Arc<dyn Backend>,
    flaw: Flaw,
}

#[async_trait]
impl Backend for BrokenBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capability {
        match self.flaw {
            Flaw::PretendIngress => self.inner.capabilities() | Capability::INGRESS_PORTS,
            _ => self.inner.capabilities(),
        }
    }
    fn isolation(&self) -> IsolationTier {
        self.inner.isolation()
    }
    async fn create(&self, mut options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        if self.flaw == Flaw::PretendNetworkPolicy && options.network.egress == Egress::Deny {
            options.network.egress = Egress::Allow;
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
        let inner = self.inner.create(options).await?;
        Ok(Box::new(BrokenSandbox {
            inner,
            flaw: self.flaw,
            secrets,
            ingress,
        }))
    }
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        let inner = self.inner.connect(id).await?;
        Ok(Box::new(BrokenSandbox {
            inner,
            flaw: self.flaw,
            secrets: vec![],
            ingress: vec![],
        }))
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
}

struct BrokenSandbox {
    inner: Box<dyn Sandbox>,
    flaw: Flaw,
    secrets: Vec<String>,
    /// Ingress ports asked for (and silently dropped) under `PretendIngress`.
    ingress: Vec<u16>,
}

impl std::fmt::Debug for BrokenSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("BrokenSandbox");
        d.field("inner", &self.inner);
        if self.flaw == Flaw::LeakSecrets {
            d.field("secrets", &self.secrets);
        }
        d.finish()
    }
}

impl BrokenSandbox {
    /// A process whose killer does nothing and whose real process is never dropped (so
    /// its own drop-kill never runs).
    fn orphaning_stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        let timeout = options.timeout;
        let mut inner = self.inner.stream(cmd, options)?;
        let start = async move {
            inner.start().await?;
            let held: &'static Mutex<Process> = Box::leak(Box::new(Mutex::new(inner)));
            let output = futures::stream::poll_fn(move |cx| match held.lock() {
                Ok(mut p) => p.poll_next_unpin(cx),
                Err(_) => std::task::Poll::Ready(None),
            })
            .boxed();
            let exit_code = Box::pin(async move {
                held.lock()
                    .ok()
                    .and_then(|p| p.returncode())
                    .ok_or_else(|| SandboxError::Engine {
                        backend: "broken".into(),
                        message: "no exit code".into(),
                        source: None,
                    })
            });
            Ok(StartedExec {
                output,
                exit_code,
                killer: Arc::new(|| Box::pin(async { Ok(()) })),
            })
        };
        Ok(Process::new(
            Box::pin(start),
            timeout.unwrap_or(std::time::Duration::from_secs(300)),
            OrphanInfo::new(self.inner.id(), self.inner.backend(), BTreeMap::new()),
        ))
    }
}

fn swallow(r: Result<ExecResult>) -> Result<ExecResult> {
    match r {
        Err(e) if e.code() == ErrorCode::ExecutionTimeout => Ok(ExecResult::new(0, "", "")),
        r => r,
    }
}

#[async_trait]
impl Sandbox for BrokenSandbox {
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
    async fn run(&self, cmd: Command, mut options: RunOptions) -> Result<ExecResult> {
        match self.flaw {
            Flaw::SwallowTimeouts => {
                options.timeout = None;
                swallow(self.inner.run(cmd, options).await)
            }
            Flaw::OrphanProcesses => {
                let cap = options.output_cap.unwrap_or(64 << 20);
                self.orphaning_stream(cmd, options)?.collect(cap).await
            }
            _ => self.inner.run(cmd, options).await,
        }
    }
    async fn run_code(&self, code: &str, mut options: CodeOptions) -> Result<ExecResult> {
        if self.flaw == Flaw::SwallowTimeouts {
            options.timeout = None;
            return swallow(self.inner.run_code(code, options).await);
        }
        self.inner.run_code(code, options).await
    }
    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        if self.flaw == Flaw::OrphanProcesses {
            return self.orphaning_stream(cmd, options);
        }
        self.inner.stream(cmd, options)
    }
    fn files(&self) -> Result<&dyn FileSystem> {
        self.inner.files()
    }
    fn ingress_address(&self, port: u16) -> Result<std::net::SocketAddr> {
        if self.flaw == Flaw::PretendIngress && self.ingress.contains(&port) {
            return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        }
        self.inner.ingress_address(port)
    }
    async fn kill(&self) -> Result<()> {
        match self.inner.kill().await {
            Err(e) if self.flaw == Flaw::LeakKillError && e.code() == ErrorCode::Connect => {
                Err(SandboxError::Engine {
                    backend: self.inner.backend().to_string(),
                    message: format!("raw engine error: {e}"),
                    source: None,
                })
            }
            r => r,
        }
    }
    fn native(&self) -> &dyn Any {
        self.inner.native()
    }
}

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
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        self.inner.canary().await
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
}
