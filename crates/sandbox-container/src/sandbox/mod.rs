//! `ContainerSandbox`: one container, its lifetime, its teardown, and the `Sandbox` port.

use crate::provision::teardown::container_killer;
use crate::sandbox::shared::Shared;

pub(crate) mod agent;
pub(crate) mod context;
pub(crate) mod exec;
pub(crate) mod fork;
mod freeze;
pub(crate) mod ingress;
pub(crate) mod interpreter;
pub(crate) mod kill;
mod lifetime;
mod pids;
mod process;
mod reset;
pub(crate) mod restart;
pub(crate) mod shared;
pub(crate) mod stdin;

use std::any::Any;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sandbox_core::options::DEFAULT_OUTPUT_CAP;

use sandbox_core::teardown::{Killer, TeardownGuard, shielded_kill};
use sandbox_core::{
    Capability, CodeOptions, Command, ExecResult, FileSystem, IsolationTier, Process, Result,
    RunOptions, Sandbox, SandboxError, async_trait,
};

use crate::engine::ContainerEngine;
use crate::files::ContainerFiles;
use crate::sandbox::ingress::Ingress;

pub use crate::sandbox::agent::ExecPath;

/// The engine and container id behind a [`ContainerSandbox`].
///
/// **Outside the semver contract**: returned by [`Sandbox::native`] for escape hatches; its
/// fields and their types (including the engine crate's version) may change in any release.
#[non_exhaustive]
pub struct ContainerNative<E> {
    /// The backend's shared engine (e.g. `DockerEngine::client()` gives the bollard client).
    pub engine: Arc<E>,
    /// The container id.
    pub container_id: String,
    /// Host loopback address of each ingress port (container port → `127.0.0.1:<port>`).
    pub ingress: BTreeMap<u16, SocketAddr>,
    /// Whether the sandbox's operations (`run`, `stream`, `run_code` and files alike) go
    /// through the in-sandbox agent or the engine's exec path.
    pub exec_path: ExecPath,
}

impl<E> std::fmt::Debug for ContainerNative<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerNative")
            .field("container_id", &self.container_id)
            .field("ingress", &self.ingress)
            .field("exec_path", &self.exec_path)
            .finish_non_exhaustive()
    }
}

/// A container sandbox on any [`ContainerEngine`].
///
/// Dropping it without [`Sandbox::kill`] removes the container in the background, bounded
/// by the teardown grace.
pub struct ContainerSandbox<E: ContainerEngine> {
    pub(crate) shared: Arc<Shared<E>>,
    native: ContainerNative<E>,
    files: ContainerFiles<E>,
    killer: Killer,
    teardown: tokio::sync::Mutex<TeardownGuard>,
    killed: AtomicBool,
    ingress: Mutex<Ingress>,
}

impl<E: ContainerEngine> std::fmt::Debug for ContainerSandbox<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerSandbox")
            .field("backend", &self.shared.engine.backend())
            .field("id", &self.shared.id)
            .field("template", &self.shared.template)
            .field("tier", &self.shared.tier)
            .field("workdir", &self.shared.workdir)
            .field(
                "secret_keys",
                &self
                    .shared
                    .secrets
                    .iter()
                    .map(|(k, _)| k)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<E: ContainerEngine> ContainerSandbox<E> {
    /// Wraps a started container; `guard` owns its teardown from now on.
    pub(crate) fn new(shared: Arc<Shared<E>>, mut guard: TeardownGuard, ingress: Ingress) -> Self {
        let killer = shared.expiry.cancelled_by(freeze::thawing(
            &shared,
            crate::provision::teardown::then_post_stop(
                container_killer(
                    shared.engine.clone(),
                    shared.config.call_timeout,
                    shared.id.clone(),
                ),
                shared.engine.hooks(),
                crate::spec::hooks::HookEvent::new(&shared.id, &shared.template),
            ),
        ));
        // The same removal, thawing a paused container first and cancelling the deadline
        // timer (no await in between: the container is never without an armed guard).
        guard.disarm();
        let guard = TeardownGuard::new(shared.info(), killer.clone());
        ContainerSandbox {
            native: ContainerNative {
                engine: shared.engine.clone(),
                container_id: shared.id.clone(),
                ingress: ingress.addrs.clone(),
                exec_path: shared.exec_path(),
            },
            ingress: Mutex::new(ingress),
            files: ContainerFiles::new(shared.clone()),
            shared,
            killer,
            teardown: tokio::sync::Mutex::new(guard),
            killed: AtomicBool::new(false),
        }
    }

    /// Whether `run` and `stream` go through the in-sandbox agent or the engine's exec
    /// path.
    pub fn exec_path(&self) -> ExecPath {
        self.shared.exec_path()
    }

    /// The template (image) this sandbox runs.
    pub fn template(&self) -> &str {
        &self.shared.template
    }

    /// The working directory of `run`, `run_code` and relative file paths.
    pub fn workdir(&self) -> &str {
        &self.shared.workdir
    }

    /// The host loopback address where container port `port` is reachable, for ports
    /// requested in `NetworkPolicy::ingress_ports`.
    pub fn ingress_addr(&self, port: u16) -> Option<SocketAddr> {
        self.ingress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .addrs
            .get(&port)
            .copied()
    }

    /// After a start, the host addresses the engine published the ingress ports at again
    /// (it may pick other host ports for a restarted container). Loopback forwarders (a
    /// sandbox without network) keep their listeners and need nothing.
    async fn refresh_published_ingress(&self) -> Result<()> {
        let Some(plan) = &self.shared.network else {
            return Ok(());
        };
        let ports = &plan.policy.ingress_ports;
        if ports.is_empty() || plan.policy.egress == sandbox_core::Egress::Deny {
            return Ok(());
        }
        let fresh = crate::sandbox::ingress::published(&self.shared, ports).await?;
        let mut ingress = self.ingress.lock().unwrap_or_else(|p| p.into_inner());
        ingress.addrs = fresh.addrs.clone();
        Ok(())
    }
}

#[async_trait]
impl<E: ContainerEngine> Sandbox for ContainerSandbox<E> {
    fn id(&self) -> &str {
        &self.shared.id
    }

    fn backend(&self) -> &str {
        self.shared.engine.backend()
    }

    fn capabilities(&self) -> Capability {
        self.shared.caps()
    }

    fn isolation(&self) -> IsolationTier {
        self.shared.tier
    }

    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult> {
        sandbox_core::policy::require(self.shared.caps, Capability::RUN_COMMAND, self.backend())?;
        self.shared.refuse_unless_running()?;
        cmd.validate()?;
        let timeout = options.validate(self.shared.remaining()?)?;
        let cap = options.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
        let p = self.shared.user_process(cmd.to_argv(), &options, timeout)?;
        p.collect(cap).await
    }

    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        self.shared.refuse_unless_running()?;
        crate::sandbox::interpreter::run_code(&self.shared, code, options).await
    }

    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        sandbox_core::policy::require(self.shared.caps, Capability::STREAMING, self.backend())?;
        self.shared.refuse_unless_running()?;
        cmd.validate()?;
        let timeout = options.validate(self.shared.remaining()?)?;
        self.shared.user_process(cmd.to_argv(), &options, timeout)
    }

    fn files(&self) -> Result<&dyn FileSystem> {
        sandbox_core::policy::require(self.shared.caps, Capability::FILESYSTEM, self.backend())?;
        Ok(&self.files)
    }

    async fn kill(&self) -> Result<()> {
        if self.killed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut guard = self.teardown.lock().await;
        if self.killed.load(Ordering::SeqCst) || !guard.is_armed() {
            return Ok(());
        }
        // The ssh agent answers nothing from here on, whatever the removal takes.
        drop(
            self.shared
                .ssh_agent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        // The gate's port closes and its token is forgotten before the removal.
        drop(
            self.shared
                .git_gate
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        // The credentials proxy too: its port closes and its connections end.
        drop(
            self.shared
                .credentials
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        // On failure the guard stays armed: a later kill or the drop retries, and the
        // lifetime backstop bounds the container regardless.
        shielded_kill(self.shared.info(), (self.killer)()).await?;
        guard.disarm();
        self.killed.store(true, Ordering::SeqCst);
        // The policy in force goes with the sandbox (the rules went with its namespace).
        crate::egress::forget(&self.shared.id);
        crate::provision::deadlines::Deadlines::default().forget(&self.shared.id);
        let forwarders = self
            .ingress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop();
        // Once `kill` returns, the ingress ports refuse connections: wait until each
        // aborted forwarder has dropped its listener (immediate, they only await accept).
        for t in forwarders {
            let _ = t.await;
        }
        Ok(())
    }

    async fn pause(&self) -> Result<()> {
        freeze::set_paused(&self.shared, true).await
    }

    async fn set_egress(&self, egress: sandbox_core::Egress) -> Result<()> {
        sandbox_core::policy::require(self.shared.caps, Capability::LIVE_EGRESS, self.backend())?;
        crate::egress::set_live(&*self.shared.engine, &self.shared.id, &egress).await
    }

    async fn egress(&self) -> Result<sandbox_core::Egress> {
        sandbox_core::policy::require(self.shared.caps, Capability::LIVE_EGRESS, self.backend())?;
        crate::egress::current(self.backend(), &self.shared.id)
    }

    async fn resume(&self) -> Result<()> {
        freeze::set_paused(&self.shared, false).await
    }

    async fn stop(&self) -> Result<()> {
        restart::stop(&self.shared).await
    }

    async fn start(&self) -> Result<()> {
        restart::start(&self.shared).await?;
        self.refresh_published_ingress().await
    }

    async fn extend(&self, by: std::time::Duration) -> Result<std::time::SystemTime> {
        lifetime::extend(&self.shared, by).await
    }

    async fn reset_processes(&self) -> Result<u32> {
        reset::reset_processes(&self.shared).await
    }

    async fn snapshot(&self) -> Result<sandbox_core::Snapshot> {
        crate::snapshot::take(&self.shared).await
    }

    async fn fork(&self, options: sandbox_core::ForkOptions) -> Result<Vec<Box<dyn Sandbox>>> {
        let forks = fork::fork(&self.shared, options).await?;
        Ok(forks
            .into_iter()
            .map(|f| Box::new(f) as Box<dyn Sandbox>)
            .collect())
    }

    fn ingress_address(&self, port: u16) -> Result<SocketAddr> {
        sandbox_core::policy::require(self.shared.caps, Capability::INGRESS_PORTS, self.backend())?;
        self.ingress_addr(port).ok_or_else(|| {
            SandboxError::config(
                format!("port {port} was not requested as an ingress port of this sandbox"),
                "list it in NetworkPolicy::ingress_ports when creating the sandbox",
            )
        })
    }

    fn native(&self) -> &dyn Any {
        &self.native
    }
}
