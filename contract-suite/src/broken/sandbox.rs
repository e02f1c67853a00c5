//! The broken sandbox handle: routes each call to the flaw that changes it (runs and
//! streams to `exec`, kernel evidence to `evidence`, files to `files`) and holds the
//! flaws of the handle itself — a kill that leaks its error or poisons later calls, a drop
//! that tears nothing down, a `Debug` that shows secrets, a wrong tier, pretended ingress,
//! a pause that freezes nothing, a resume that thaws nothing, an extension that moves
//! nothing or too much, a snapshot that ends its sandbox, a stop or start that does not
//! do what it says, and forks that forget, share, lose or leave behind what a fork must
//! carry or remove.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::teardown::OrphanInfo;
use sandbox_core::{
    Capability, CodeOptions, Command, ErrorCode, ExecResult, FileSystem, IsolationTier, Process,
    Result, RichResult, RunOptions, Sandbox, SandboxError,
};

use super::abandoned::abandon;
use super::evidence::rewrite_evidence;
use super::exec::{
    buffer_eagerly, orphaning_stream, rewrap, run_killing_every_group, run_killing_only_the_pid,
    swallow,
};
use super::flaw::{Flaw, adjust_caps};

/// A sandbox with a flaw.
pub(super) struct BrokenSandbox {
    pub(super) inner: Arc<dyn Sandbox>,
    pub(super) flaw: Flaw,
    secrets: Vec<String>,
    /// Ingress ports asked for (and silently dropped) under `PretendIngress`.
    ingress: Vec<u16>,
    /// Under `PoisonAfterFailedKill`: the failed kill every later call reports.
    poisoned: Mutex<Option<String>>,
    /// Under `StartWithoutEgressRules`: the backend the open sandbox comes from, and,
    /// once started, that sandbox (egress `Allow`), where `run` goes from then on.
    open_backend: Option<Arc<dyn sandbox_core::Backend>>,
    restarted_open: tokio::sync::Mutex<Option<Box<dyn Sandbox>>>,
    /// For a fork: the sandbox it was forked from (the fork flaws reach it).
    fork_of: Option<Arc<dyn Sandbox>>,
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

impl Drop for BrokenSandbox {
    fn drop(&mut self) {
        // The handle's own teardown never runs: the sandbox is neither killed nor, when
        // that matters (a hanging engine), reported as orphaned.
        if matches!(self.flaw, Flaw::LeakOnDrop | Flaw::NoOrphanWarning) {
            abandon(self.inner.clone());
        }
    }
}

impl BrokenSandbox {
    /// `inner` with `flaw`; `secrets` are the values it was created with (what
    /// `LeakSecrets` shows), `ingress` the ports `PretendIngress` dropped.
    pub(super) fn new(
        inner: Box<dyn Sandbox>,
        flaw: Flaw,
        secrets: Vec<String>,
        ingress: Vec<u16>,
    ) -> Self {
        BrokenSandbox {
            inner: Arc::from(inner),
            flaw,
            secrets,
            ingress,
            poisoned: Mutex::new(None),
            open_backend: None,
            restarted_open: tokio::sync::Mutex::new(None),
            fork_of: None,
        }
    }

    /// Under `StartWithoutEgressRules`: after a start, commands run in a sandbox of
    /// `backend` with egress `Allow`.
    pub(super) fn restarting_open_on(mut self, backend: Arc<dyn sandbox_core::Backend>) -> Self {
        self.open_backend = Some(backend);
        self
    }

    /// Wipes the workdir, as a start from the template would have it.
    async fn lose_files(&self) -> Result<()> {
        let files = self.inner.files()?;
        for entry in files.ls(".").await? {
            files.remove(&entry.path).await?;
        }
        Ok(())
    }

    fn info(&self) -> OrphanInfo {
        OrphanInfo::new(self.inner.id(), self.inner.backend(), BTreeMap::new())
    }

    fn poison(&self) -> Result<()> {
        match self.poisoned.lock().ok().and_then(|p| p.clone()) {
            Some(msg) => Err(SandboxError::connect(self.inner.id(), msg)),
            None => Ok(()),
        }
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
        adjust_caps(self.flaw, self.inner.capabilities())
    }
    fn isolation(&self) -> IsolationTier {
        match (self.flaw, self.inner.isolation()) {
            (Flaw::TierMismatch, IsolationTier::Gvisor) => IsolationTier::Container,
            (Flaw::TierMismatch, _) => IsolationTier::Gvisor,
            (_, tier) => tier,
        }
    }
    async fn run(&self, cmd: Command, mut options: RunOptions) -> Result<ExecResult> {
        self.poison()?;
        if let Some(open) = &*self.restarted_open.lock().await {
            return open.run(cmd, options).await;
        }
        match self.flaw {
            Flaw::SwallowTimeouts => {
                options.timeout = None;
                swallow(self.inner.run(cmd, options).await)
            }
            Flaw::OrphanProcesses => {
                let cap = options.output_cap.unwrap_or(64 << 20);
                orphaning_stream(&*self.inner, cmd, options, self.info())?
                    .collect(cap)
                    .await
            }
            Flaw::TimeoutKillsSandbox => {
                let r = self.inner.run(cmd, options).await;
                if matches!(&r, Err(e) if e.code() == ErrorCode::ExecutionTimeout) {
                    self.inner.kill().await?;
                }
                r
            }
            Flaw::TimeoutKillsStrays => run_killing_every_group(&*self.inner, cmd, options).await,
            Flaw::KillOnlyExecPid => match cmd {
                Command::Shell(script) => {
                    run_killing_only_the_pid(&*self.inner, &script, options).await
                }
                cmd => self.inner.run(cmd, options).await,
            },
            Flaw::ArgvViaShell => {
                let cmd = match cmd {
                    Command::Argv(v) => Command::Shell(v.join(" ")),
                    cmd => cmd,
                };
                self.inner.run(cmd, options).await
            }
            Flaw::DropStdin => {
                options.stdin = None;
                self.inner.run(cmd, options).await
            }
            Flaw::MissingBinary126 => {
                let mut r = self.inner.run(cmd, options).await?;
                if r.exit_code == 127 {
                    r.exit_code = 126;
                    r.stdout = std::mem::take(&mut r.stderr);
                }
                Ok(r)
            }
            Flaw::PidsAsExitCode => match self.inner.run(cmd, options).await {
                Err(e)
                    if e.code() == ErrorCode::ResourceLimitExceeded
                        && e.to_string().contains("pids") =>
                {
                    Ok(ExecResult::new(
                        126,
                        "",
                        "sh: Resource temporarily unavailable\n",
                    ))
                }
                r => r,
            },
            Flaw::TruncateSilently => {
                // The cap asked for, or the documented 64 MiB default, applied by cutting
                // the output instead of refusing it.
                let cap = options.output_cap.take().unwrap_or(64 << 20);
                options.output_cap = Some(1 << 30);
                let mut r = self.inner.run(cmd, options).await?;
                r.stdout.truncate(cap);
                r.stderr.truncate(cap.saturating_sub(r.stdout.len()));
                Ok(r)
            }
            Flaw::KeepCapabilities
            | Flaw::UnlimitedDefaults
            | Flaw::NoInit
            | Flaw::SwapEnabled
            | Flaw::NoCpuQuota => {
                let r = self.inner.run(cmd.clone(), options).await?;
                Ok(rewrite_evidence(self.flaw, &cmd, r))
            }
            _ => self.inner.run(cmd, options).await,
        }
    }
    async fn run_code(&self, code: &str, mut options: CodeOptions) -> Result<ExecResult> {
        self.poison()?;
        match (self.flaw, &self.fork_of) {
            (Flaw::ForkForgetsContexts, Some(_)) => {
                options.context_id = options.context_id.map(|c| format!("{c}-after-the-fork"));
                return self.inner.run_code(code, options).await;
            }
            (Flaw::ForksShareContexts, Some(original)) => {
                return original.run_code(code, options).await;
            }
            _ => {}
        }
        match self.flaw {
            Flaw::SwallowTimeouts => {
                options.timeout = None;
                swallow(self.inner.run_code(code, options).await)
            }
            Flaw::UntypedRichResults => {
                let mut r = self.inner.run_code(code, options).await?;
                let out = r.stdout.clone();
                r.results.push(RichResult::new("", out));
                Ok(r)
            }
            _ => self.inner.run_code(code, options).await,
        }
    }
    fn stream(&self, cmd: Command, mut options: RunOptions) -> Result<Process> {
        self.poison()?;
        match self.flaw {
            Flaw::OrphanProcesses => orphaning_stream(&*self.inner, cmd, options, self.info()),
            Flaw::StreamEndsOnPause => {
                let timeout = options.timeout.unwrap_or(Duration::from_secs(300));
                let p = self.inner.stream(cmd, options)?;
                Ok(rewrap(p, timeout, self.info(), true))
            }
            Flaw::IgnoreStreamTimeout => {
                options.timeout = Some(Duration::from_secs(300));
                self.inner.stream(cmd, options)
            }
            Flaw::UnboundedStreamBuffer => {
                let timeout = options.timeout.unwrap_or(Duration::from_secs(300));
                let p = self.inner.stream(cmd, options)?;
                Ok(buffer_eagerly(p, timeout, self.info()))
            }
            Flaw::EagerStream => {
                // Starts a copy at once, whether or not the process is ever polled.
                let inner = self.inner.clone();
                let (c, o) = (cmd.clone(), options.clone());
                tokio::spawn(async move {
                    let _ = inner.run(c, o).await;
                });
                self.inner.stream(cmd, options)
            }
            Flaw::DropStdin => {
                options.stdin = None;
                options.interactive = false;
                self.inner.stream(cmd, options)
            }
            _ => self.inner.stream(cmd, options),
        }
    }
    fn files(&self) -> Result<&dyn FileSystem> {
        self.inner.files()?;
        Ok(self)
    }
    fn ingress_address(&self, port: u16) -> Result<std::net::SocketAddr> {
        if self.flaw == Flaw::PretendIngress && self.ingress.contains(&port) {
            return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        }
        self.inner.ingress_address(port)
    }
    async fn kill(&self) -> Result<()> {
        if let Some(open) = self.restarted_open.lock().await.take() {
            let _ = open.kill().await;
        }

        if self.flaw == Flaw::ForksLeftBehind && self.fork_of.is_some() {
            abandon(self.inner.clone());
            return Ok(());
        }
        match self.inner.kill().await {
            Err(e) if self.flaw == Flaw::LeakKillError && e.code() == ErrorCode::Connect => Err(
                SandboxError::engine(self.inner.backend(), format!("raw engine error: {e}")),
            ),
            Err(e) if self.flaw == Flaw::PoisonAfterFailedKill => {
                if let Ok(mut p) = self.poisoned.lock() {
                    *p = Some(format!("kill failed: {e}"));
                }
                Err(e)
            }
            r => r,
        }
    }
    async fn reset_processes(&self) -> Result<u32> {
        self.inner.reset_processes().await
    }
    async fn pause(&self) -> Result<()> {
        if self.flaw == Flaw::PauseDoesNotFreeze {
            return Ok(());
        }
        self.inner.pause().await
    }

    async fn resume(&self) -> Result<()> {
        if self.flaw == Flaw::ResumeDoesNotThaw {
            return Ok(());
        }
        self.inner.resume().await
    }

    async fn extend(&self, by: Duration) -> Result<std::time::SystemTime> {
        const OVERRUN: Duration = Duration::from_secs(30);
        match self.flaw {
            // What a caller would expect after a real extension, with nothing moved.
            Flaw::ExtendMovesNothing => Ok(std::time::SystemTime::now() + by),
            Flaw::ExtendOverruns => Ok(self.inner.extend(by + OVERRUN).await? - OVERRUN),
            _ => self.inner.extend(by).await,
        }
    }

    async fn set_egress(&self, egress: sandbox_core::Egress) -> Result<()> {
        use sandbox_core::{Egress, EgressDefault, EgressTiers};
        // The tiers as set, with one of them left out.
        let without = |keep_deny: bool, keep_except: bool| -> Egress {
            let Egress::Tiers(t) = &egress else {
                return egress.clone();
            };
            let mut out = match t.default {
                EgressDefault::Allow => EgressTiers::allow_by_default(),
                _ => EgressTiers::deny_by_default(),
            };
            for r in &t.allow {
                out = out.allow(r.clone());
            }
            for r in t.deny.iter().filter(|_| keep_deny) {
                out = out.deny(r.clone());
            }
            for r in t.except.iter().filter(|_| keep_except) {
                out = out.except(r.clone());
            }
            Egress::Tiers(out)
        };
        match self.flaw {
            Flaw::SetEgressIgnored => Ok(()),
            Flaw::EgressChangeLate => {
                let inner = self.inner.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let _ = inner.set_egress(egress).await;
                });
                Ok(())
            }
            Flaw::HostPortOpensWholeHost => self.inner.set_egress(whole_host(egress)).await,
            Flaw::DenyTierIgnored => self.inner.set_egress(without(false, true)).await,
            Flaw::ExceptionTierIgnored => self.inner.set_egress(without(true, false)).await,
            _ => self.inner.set_egress(egress).await,
        }
    }

    async fn egress(&self) -> Result<sandbox_core::Egress> {
        let now = self.inner.egress().await?;
        if self.flaw == Flaw::EgressReadBackStale {
            // What a sandbox created closed started with, whatever is in force.
            return Ok(sandbox_core::Egress::Tiers(
                sandbox_core::EgressTiers::deny_by_default(),
            ));
        }
        Ok(now)
    }

    async fn stop(&self) -> Result<()> {
        if self.flaw == Flaw::StopLeavesItRunning {
            return Ok(());
        }
        self.inner.stop().await
    }

    async fn start(&self) -> Result<()> {
        match self.flaw {
            Flaw::StartLeavesItStopped => Ok(()),
            Flaw::StartLosesFiles => {
                self.inner.start().await?;
                self.lose_files().await
            }
            Flaw::StartWithoutEgressRules => {
                self.inner.start().await?;
                if let Some(backend) = &self.open_backend {
                    let opts = sandbox_core::CreateOptions::default()
                        .network(sandbox_core::NetworkPolicy::allow());
                    let open = backend.create(opts).await?;
                    *self.restarted_open.lock().await = Some(open);
                }
                Ok(())
            }
            _ => self.inner.start().await,
        }
    }

    async fn snapshot(&self) -> Result<sandbox_core::Snapshot> {
        let snap = self.inner.snapshot().await?;
        if self.flaw == Flaw::SnapshotEndsTheSource {
            self.inner.kill().await?;
        }
        Ok(snap)
    }

    async fn fork(&self, options: sandbox_core::ForkOptions) -> Result<Vec<Box<dyn Sandbox>>> {
        let forks = self.inner.fork(options).await?;
        let mut out: Vec<Box<dyn Sandbox>> = Vec::with_capacity(forks.len());
        for f in forks {
            if self.flaw == Flaw::ForkLosesFiles {
                let files = f.files()?;
                let workdir = "/work";
                files.remove(workdir).await?;
                files.mkdir(workdir, true).await?;
            }
            let mut fork = BrokenSandbox::new(f, self.flaw, self.secrets.clone(), Vec::new());
            fork.fork_of = Some(self.inner.clone());
            out.push(Box::new(fork));
        }
        if self.flaw == Flaw::ForkEndsTheOriginal {
            self.inner.kill().await?;
        }
        Ok(out)
    }

    fn native(&self) -> &dyn Any {
        self.inner.native()
    }
}

/// Under `HostPortOpensWholeHost`: `egress` with the host's address (the fake's, loopback)
/// allowed on every port whenever a host port is granted.
pub(super) fn whole_host(egress: sandbox_core::Egress) -> sandbox_core::Egress {
    use sandbox_core::{Egress, EgressRule};
    let Egress::Tiers(t) = &egress else {
        return egress;
    };
    match EgressRule::parse("127.0.0.1") {
        Ok(host) if !t.host_ports.is_empty() => Egress::Tiers(t.clone().allow(host)),
        _ => egress,
    }
}
