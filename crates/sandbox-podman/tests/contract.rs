//! The contract suite against the real Podman service.
//!
//! Probes: base template `sandbox-rs/python:3.11`, `sandbox-rs/busybox:latest` without
//! python3, a canary on the host (bound on all interfaces, dialled through the `podman`
//! network's gateway IP — never an outside address), `Config.Env` from container inspect,
//! and faults through the adapters' shared unix-socket proxy in front of the Podman socket
//! whose kill requests (`DELETE …/containers/…`) can be made to hang or fail.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use sandbox_container::testing::{self, Fault};
use sandbox_contract::anyhow::{self, Context as _};
use sandbox_contract::{CanarySpec, Faults, Injection, Probes};
use sandbox_core::{Backend, CreateOptions, async_trait};
use sandbox_podman::{PodmanBackend, PodmanConfig};
use tokio::sync::OnceCell;

struct PodmanProbes {
    backend: OnceCell<PodmanBackend>,
    faults: OnceCell<Arc<dyn Faults>>,
}

impl PodmanProbes {
    async fn backend(&self) -> anyhow::Result<&PodmanBackend> {
        self.backend
            .get_or_try_init(|| async {
                PodmanBackend::connect(PodmanConfig::from_env().startup_sweep(false))
                    .await
                    .map_err(|e| anyhow::anyhow!("connect for the probes: {}", e.render()))
            })
            .await
    }
}

#[async_trait]
impl Probes for PodmanProbes {
    fn base_options(&self) -> CreateOptions {
        CreateOptions::new("sandbox-rs/python:3.11")
    }

    fn template_without_python(&self) -> Option<String> {
        Some("sandbox-rs/busybox:latest".into())
    }

    fn extra_templates(&self) -> Vec<String> {
        vec!["sandbox-rs/busybox:latest".into()]
    }

    /// The canary binds on the egress lab address (a dummy interface on this host,
    /// `sandbox_container::egress::lab`): reachable from every sandbox with a network,
    /// never leaving the machine, and not an engine network's address (those — the host's
    /// bridge addresses — are blocked by the egress rules, issue 13).
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        let ip = sandbox_container::egress::lab::install().map_err(anyhow::Error::msg)?;
        Ok(Some(CanarySpec {
            bind: SocketAddr::new(ip, 0),
            dial_host: ip.to_string(),
        }))
    }

    /// Inside the lab's namespace: the canary is not one of this host's addresses.
    async fn bind_canary(&self, spec: &CanarySpec) -> anyhow::Result<std::net::TcpListener> {
        sandbox_container::egress::lab::bind(spec.bind).map_err(anyhow::Error::msg)
    }

    fn egress_names(&self) -> Option<sandbox_contract::EgressNames> {
        Some(sandbox_contract::EgressNames {
            listed: sandbox_container::egress::lab::LISTED.into(),
            unlisted: sandbox_container::egress::lab::UNLISTED.into(),
        })
    }

    async fn engine_env(&self, sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        let env = self
            .backend()
            .await?
            .engine()
            .engine_env(sandbox_id)
            .await
            .map_err(|e| anyhow::anyhow!("engine env of {sandbox_id}: {e}"))?;
        Ok(Some(env))
    }

    /// Kills the sandbox's container through the engine (as a crashed init would end
    /// it). Podman sandboxes are created with `--rm` (`PodmanOptions::ephemeral`, the
    /// default the suite runs with), so the engine then deletes it.
    async fn stop_sandbox(&self, sandbox_id: &str) -> anyhow::Result<Injection> {
        self.backend()
            .await?
            .client()
            .containers()
            .get(sandbox_id)
            .kill()
            .await
            .with_context(|| format!("kill container {sandbox_id}"))?;
        Ok(Injection::Removed(
            "Podman sandboxes are created with --rm (PodmanOptions::ephemeral): the engine \
             deletes a stopped one itself"
                .into(),
        ))
    }

    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        let f = self
            .faults
            .get_or_try_init(|| async {
                FaultProxy::start()
                    .await
                    .map(|f| Arc::new(f) as Arc<dyn Faults>)
            })
            .await?;
        Ok(Some(f.clone()))
    }
}

/// The adapters' shared fault proxy (`sandbox_container::testing::FaultProxy`) in front of
/// the Podman socket, and a backend pointed at it.
struct FaultProxy {
    proxy: testing::FaultProxy,
    backend: Arc<dyn Backend>,
}

impl FaultProxy {
    async fn start() -> anyhow::Result<FaultProxy> {
        let upstream = PodmanConfig::from_env()
            .resolved_endpoint()
            .strip_prefix("unix://")
            .map(PathBuf::from)
            .context("the Podman endpoint is not a unix socket; the fault proxy needs one")?;
        let proxy = testing::FaultProxy::start(upstream)
            .await
            .context("start the fault proxy")?;
        let backend = PodmanBackend::connect(
            PodmanConfig::from_env()
                .endpoint(proxy.endpoint())
                .startup_sweep(false)
                // The stalled-create trial waits this out.
                .create_timeout(std::time::Duration::from_secs(3)),
        )
        .await
        .map_err(|e| anyhow::anyhow!("connect through the fault proxy: {}", e.render()))?;
        Ok(FaultProxy {
            proxy,
            backend: Arc::new(backend),
        })
    }
}

#[async_trait]
impl Faults for FaultProxy {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn hang_kills(&self) {
        self.proxy.set(Fault::Hang);
    }
    async fn fail_kills(&self) {
        self.proxy.set(Fault::Fail);
    }
    async fn heal(&self) {
        self.proxy.set(Fault::Pass);
        self.proxy.set_create(Fault::Pass);
        self.proxy.redirect_pulls(None);
    }
    async fn fail_creates(&self) -> Injection {
        self.proxy.set_create(Fault::Fail);
        Injection::Injected
    }
    async fn stall_creates(&self) -> Injection {
        self.proxy.set_create(Fault::Hang);
        Injection::Injected
    }
    /// Every pull goes to a loopback registry that demands a credential this backend is
    /// not given, and every image reads as missing (`FaultProxy::lock_pulls`), so the
    /// create pulls and the real engine meets a real registry refusal.
    async fn withhold_credential(&self) -> Injection {
        match self.proxy.lock_pulls("podman").await {
            Ok(()) => Injection::Injected,
            Err(e) => {
                eprintln!("withhold_credential: {e}");
                Injection::NotProvided
            }
        }
    }
}

fn main() -> ExitCode {
    sandbox_contract::run(
        Box::new(|| {
            Box::pin(async {
                let b = PodmanBackend::connect(PodmanConfig::from_env()).await?;
                Ok(Arc::new(b) as Arc<dyn Backend>)
            })
        }),
        Arc::new(PodmanProbes {
            backend: OnceCell::new(),
            faults: OnceCell::new(),
        }),
    )
}
