//! The contract suite against the real Podman service.
//!
//! Probes: base template `sandbox-rs/python:3.11`, `sandbox-rs/busybox:latest` without
//! python3, a canary on the host (bound on all interfaces, dialled through the `podman`
//! network's gateway IP — never an outside address), `Config.Env` from container inspect,
//! and faults through the adapters' shared unix-socket proxy in front of the Podman socket
//! whose kill requests (`DELETE …/containers/…`) can be made to hang or fail.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use sandbox_container::testing::{self, Fault};
use sandbox_contract::anyhow::{self, Context as _};
use sandbox_contract::{CanarySpec, Faults, Probes};
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

/// The host side of the default `podman` bridge network: its IPAM gateway, or — where a
/// subnet names none — the subnet's first host address (what netavark gives the bridge).
async fn podman_gateway(b: &PodmanBackend) -> anyhow::Result<Ipv4Addr> {
    let net = b
        .client()
        .networks()
        .get("podman")
        .inspect()
        .await
        .map_err(|e| anyhow::anyhow!("inspect the `podman` network: {e}"))?;
    let subnets = net.subnets.unwrap_or_default();
    if let Some(g) = subnets.iter().find_map(|s| {
        s.gateway
            .as_ref()
            .and_then(|g| g.to_string().parse::<Ipv4Addr>().ok())
    }) {
        return Ok(g);
    }
    subnets
        .iter()
        .find_map(|s| {
            let text = s.subnet.as_ref()?.to_string();
            let (net, bits) = text.split_once('/')?;
            let net: Ipv4Addr = net.parse().ok()?;
            let bits: u32 = bits.parse().ok()?;
            if bits >= 31 {
                return None;
            }
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            Some(Ipv4Addr::from((u32::from(net) & mask) + 1))
        })
        .context("the `podman` network has no IPv4 gateway or subnet")
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

    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        let gw = podman_gateway(self.backend().await?).await?;
        Ok(Some(CanarySpec {
            bind: SocketAddr::from(([0, 0, 0, 0], 0)),
            dial_host: gw.to_string(),
        }))
    }

    async fn engine_env(&self, sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        let env = self
            .backend()
            .await?
            .engine_env(sandbox_id)
            .await
            .map_err(|e| anyhow::anyhow!("engine env of {sandbox_id}: {}", e.render()))?;
        Ok(Some(env))
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
            .endpoint_str()
            .strip_prefix("unix://")
            .map(PathBuf::from)
            .context("the Podman endpoint is not a unix socket; the fault proxy needs one")?;
        let proxy = testing::FaultProxy::start(upstream)
            .await
            .context("start the fault proxy")?;
        let backend = PodmanBackend::connect(
            PodmanConfig::from_env()
                .endpoint(proxy.endpoint())
                .startup_sweep(false),
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
