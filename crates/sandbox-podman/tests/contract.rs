//! The contract suite against the real Podman service.
//!
//! Probes: base template `sandbox-rs/python:3.11`, `sandbox-rs/busybox:latest` without
//! python3, the egress lab's canary (in a namespace of its own on this host, removed when
//! the run ends; never an outside address), `Config.Env` from container inspect, and
//! faults through the adapters' shared unix-socket proxy (`sandbox_testkit::FaultProxy`)
//! in front of the Podman socket whose kill requests (`DELETE …/containers/…`) can be
//! made to hang or fail.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use sandbox_contract::anyhow::{self, Context as _};
use sandbox_contract::{CanarySpec, Faults, Injection, Probes};
use sandbox_core::{Backend, CreateOptions, async_trait};
use sandbox_podman::{PodmanBackend, PodmanConfig};
use sandbox_testkit::FaultProxy;
use sandbox_testkit::contract::{ProxyFaults, bind_lab_canary, lab_canary, lab_egress_names};
use sandbox_testkit::egress_lab;
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

    /// The egress lab's canary (`sandbox_testkit::contract::lab_canary`).
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        lab_canary()
    }

    async fn bind_canary(&self, spec: &CanarySpec) -> anyhow::Result<std::net::TcpListener> {
        bind_lab_canary(spec)
    }

    fn egress_names(&self) -> Option<sandbox_contract::EgressNames> {
        lab_egress_names()
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
    /// it). The engine keeps a stopped sandbox (for `Sandbox::start`), so it stays listed.
    async fn stop_sandbox(&self, sandbox_id: &str) -> anyhow::Result<Injection> {
        self.backend()
            .await?
            .client()
            .containers()
            .get(sandbox_id)
            .kill()
            .await
            .with_context(|| format!("kill container {sandbox_id}"))?;
        Ok(Injection::Injected)
    }

    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        let f = self
            .faults
            .get_or_try_init(|| async {
                proxy_faults().await.map(|f| Arc::new(f) as Arc<dyn Faults>)
            })
            .await?;
        Ok(Some(f.clone()))
    }
}

/// The adapters' shared fault proxy in front of the Podman socket, and a backend pointed
/// at it.
async fn proxy_faults() -> anyhow::Result<ProxyFaults> {
    let upstream = PodmanConfig::from_env()
        .resolved_endpoint()
        .strip_prefix("unix://")
        .map(PathBuf::from)
        .context("the Podman endpoint is not a unix socket; the fault proxy needs one")?;
    let proxy = FaultProxy::start(upstream)
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
    Ok(ProxyFaults::new(proxy, Arc::new(backend), "podman"))
}

fn main() -> ExitCode {
    // Dropped after the suite's summary: removes the egress lab unless another test
    // process still uses it, and says so in the run's last line.
    let _lab = egress_lab::Teardown::at_end_of_run();
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
