//! `PodmanSandbox`: one container, its execs, interpreters and files.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use podman_api::Podman;
use podman_api::opts::ContainerDeleteOpts;
use sandbox_core::options::DEFAULT_OUTPUT_CAP;
use sandbox_core::teardown::{Killer, OrphanInfo, TeardownGuard};
use sandbox_core::{
    Capability, CodeOptions, Command, ExecResult, FileSystem, IsolationTier, Process, Result,
    RunOptions, Sandbox, SandboxError, resolve_path,
};

use crate::error::{BACKEND, START_HINT, guard, is_not_found, status_of};
use crate::exec::{ExecSpec, ExecTarget, start_process};
use crate::files::PodmanFiles;
use crate::interpreter::{Contexts, Interpreter, says_interpreter_missing};
use crate::rest::Rest;

/// Code longer than this is not passed as an argv element (kernel `MAX_ARG_STRLEN` is
/// 128 KiB); it goes through a one-shot interpreter's stdin instead.
const MAX_ARGV_CODE: usize = 64 * 1024;

/// The engine client and container id behind a [`PodmanSandbox`].
///
/// **Outside the semver contract**: fields and types may change in any release.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PodmanNative {
    /// The podman-api client this sandbox uses.
    pub client: Podman,
    /// Full container id.
    pub container_id: String,
}

/// What a sandbox's operations share.
pub(crate) struct Shared {
    pub target: ExecTarget,
    pub rest: Rest,
    pub template: String,
    pub deadline: SystemTime,
    pub caps: Capability,
    pub tier: IsolationTier,
    pub contexts: Contexts,
    /// Ingress forwarders (egress Deny), aborted on kill and drop.
    pub forwarders: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// `(container port, host address)` of published ingress ports.
    pub ingress: Vec<(u16, std::net::SocketAddr)>,
}

impl Shared {
    pub(crate) fn id(&self) -> &str {
        &self.target.id
    }

    /// Remaining lifetime; past the deadline the sandbox is gone.
    pub(crate) fn remaining(&self) -> Result<Duration> {
        match self.deadline.duration_since(SystemTime::now()) {
            Ok(d) if !d.is_zero() => Ok(d),
            _ => Err(SandboxError::SandboxGone {
                id: self.id().to_string(),
            }),
        }
    }

    pub(crate) fn workdir(&self) -> &str {
        &self.target.workdir
    }

    fn stop_forwarders(&self) {
        let mut f = self.forwarders.lock().unwrap_or_else(|p| p.into_inner());
        for h in f.drain(..) {
            h.abort();
        }
    }
}

/// The bounded, idempotent container removal every teardown path uses.
pub(crate) fn container_killer(client: Podman, rest_endpoint: String, id: String) -> Killer {
    Arc::new(move || {
        let client = client.clone();
        let id = id.clone();
        let endpoint = rest_endpoint.clone();
        Box::pin(async move {
            let opts = ContainerDeleteOpts::builder()
                .force(true)
                .timeout(0)
                .build();
            let c = client.containers().get(&id);
            guard("container delete", async {
                match c.delete(&opts).await {
                    Ok(()) => Ok(()),
                    Err(e) if is_not_found(&e) => Ok(()),
                    Err(e)
                        if status_of(&e) == Some(409)
                            || e.to_string().contains("already being removed") =>
                    {
                        Ok(())
                    }
                    Err(e) if crate::error::is_transport(&e) => {
                        Err(SandboxError::EngineUnavailable {
                            backend: BACKEND.into(),
                            endpoint: endpoint.clone(),
                            hint: START_HINT.into(),
                            source: Some(crate::error::boxed(e)),
                        })
                    }
                    Err(e) => Err(crate::error::engine("container delete", e)),
                }
            })
            .await
        }) as sandbox_core::teardown::KillFuture
    })
}

/// One Podman sandbox (a container). Dropping it without [`Sandbox::kill`] removes the
/// container in the background, bounded by the teardown grace.
pub struct PodmanSandbox {
    pub(crate) shared: Arc<Shared>,
    files: PodmanFiles,
    guard: tokio::sync::Mutex<TeardownGuard>,
    killer: Killer,
    native: PodmanNative,
}

impl std::fmt::Debug for PodmanSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodmanSandbox")
            .field("id", &self.shared.target.id)
            .field("template", &self.shared.template)
            .field("tier", &self.shared.tier)
            .field(
                "secret_keys",
                &self
                    .shared
                    .target
                    .secrets
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl PodmanSandbox {
    pub(crate) fn new(shared: Shared, guard: TeardownGuard, killer: Killer) -> Self {
        let shared = Arc::new(shared);
        let native = PodmanNative {
            client: shared.target.client.clone(),
            container_id: shared.target.id.clone(),
        };
        PodmanSandbox {
            files: PodmanFiles::new(shared.clone()),
            shared,
            guard: tokio::sync::Mutex::new(guard),
            killer,
            native,
        }
    }

    /// The engine client and container id (outside semver; see [`PodmanNative`]).
    pub fn podman_native(&self) -> &PodmanNative {
        &self.native
    }

    fn info(&self) -> OrphanInfo {
        self.shared.target.info.clone()
    }

    fn exec_spec(&self, cmd: &Command, options: &RunOptions) -> Result<ExecSpec> {
        let workdir = match &options.workdir {
            Some(w) => Some(resolve_path(self.shared.workdir(), w)?),
            None => None,
        };
        Ok(ExecSpec {
            argv: cmd.to_argv(),
            env: options
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            workdir,
            stdin: false,
        })
    }

    async fn run_code_stateless(
        &self,
        code: &str,
        timeout: Duration,
        cap: usize,
    ) -> Result<ExecResult> {
        if code.len() > MAX_ARGV_CODE {
            let work = async {
                let mut i = Interpreter::start(&self.shared.target, &self.shared.template).await?;
                let r = i.request(code, cap).await;
                let _ = i.kill().await;
                r
            };
            return match tokio::time::timeout(timeout, work).await {
                Ok(r) => r,
                Err(_) => Err(SandboxError::ExecutionTimeout { after: timeout }),
            };
        }
        let spec = ExecSpec {
            argv: vec!["python3".into(), "-c".into(), code.to_string()],
            env: vec![],
            workdir: None,
            stdin: false,
        };
        let p = Process::new(
            Box::pin(start_process(self.shared.target.clone(), spec)),
            timeout,
            self.info(),
        );
        let r = p.collect(cap).await?;
        if says_interpreter_missing(r.exit_code, &r.stderr) {
            return Err(SandboxError::InterpreterMissing {
                interpreter: "python3".into(),
                template: self.shared.template.clone(),
            });
        }
        Ok(r)
    }
}

#[sandbox_core::async_trait]
impl Sandbox for PodmanSandbox {
    fn id(&self) -> &str {
        self.shared.id()
    }

    fn backend(&self) -> &str {
        BACKEND
    }

    fn capabilities(&self) -> Capability {
        self.shared.caps
    }

    fn isolation(&self) -> IsolationTier {
        self.shared.tier
    }

    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult> {
        let cap = options.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
        let p = self.stream_unchecked(cmd, options)?;
        p.collect(cap).await
    }

    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        let remaining = self.shared.remaining()?;
        let timeout = options.validate(remaining)?;
        let cap = options.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
        // Only Python exists today; `interpreter()` names the binary.
        debug_assert_eq!(options.language.interpreter(), "python3");
        match &options.context_id {
            Some(ctx) => {
                sandbox_core::policy::require(
                    self.shared.caps,
                    Capability::STATEFUL_CODE,
                    BACKEND,
                )?;
                self.shared
                    .contexts
                    .run(
                        &self.shared.target,
                        &self.shared.template,
                        ctx,
                        code,
                        timeout,
                        cap,
                    )
                    .await
            }
            None => self.run_code_stateless(code, timeout, cap).await,
        }
    }

    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        sandbox_core::policy::require(self.shared.caps, Capability::STREAMING, BACKEND)?;
        self.stream_unchecked(cmd, options)
    }

    fn files(&self) -> Result<&dyn FileSystem> {
        sandbox_core::policy::require(self.shared.caps, Capability::FILESYSTEM, BACKEND)?;
        Ok(&self.files)
    }

    async fn kill(&self) -> Result<()> {
        // Interpreters die with the container: no per-context kill execs.
        self.shared.contexts.forget();
        self.shared.stop_forwarders();
        let mut g = self.guard.lock().await;
        let r = g.kill_now().await;
        if r.is_err() {
            // `kill_now` disarms even when the kill failed: re-arm, so a later kill (or
            // the drop) retries instead of leaving the container behind.
            *g = TeardownGuard::new(self.info(), self.killer.clone());
        }
        r
    }

    /// Where a published ingress port is reachable on the host: `127.0.0.1:<port>`, or an
    /// ephemeral loopback port when that one was taken under egress `Deny` (the adapter
    /// forwards it itself, since a `none` network cannot publish). A port that was not
    /// requested, or a handle from `connect` (which does not know the forwards), is a
    /// `Configuration` error.
    fn ingress_address(&self, container_port: u16) -> Result<std::net::SocketAddr> {
        self.shared
            .ingress
            .iter()
            .find(|(p, _)| *p == container_port)
            .map(|(_, a)| *a)
            .ok_or_else(|| {
                SandboxError::config(
                    format!("container port {container_port} is not published by this handle"),
                    "list the port in NetworkPolicy::ingress_ports at create, and use the handle create returned",
                )
            })
    }

    fn native(&self) -> &dyn Any {
        &self.native
    }
}

impl PodmanSandbox {
    fn stream_unchecked(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        cmd.validate()?;
        let remaining = self.shared.remaining()?;
        let timeout = options.validate(remaining)?;
        let spec = self.exec_spec(&cmd, &options)?;
        Ok(Process::new(
            Box::pin(start_process(self.shared.target.clone(), spec)),
            timeout,
            self.info(),
        ))
    }
}

impl Drop for PodmanSandbox {
    fn drop(&mut self) {
        self.shared.contexts.forget();
        self.shared.stop_forwarders();
        // The TeardownGuard's own Drop schedules the bounded removal when still armed.
    }
}
