//! The sandbox-rs contract suite on the third-party engine, with one call.
//!
//! Needs a Docker engine (the engine this example decorates) and the local test images
//! (`sandbox-rs/python:3.11`, `sandbox-rs/busybox:latest`). Run it with
//! `cargo test --manifest-path examples/third-party-engine/Cargo.toml --test contract`.
//! Every probe is provided, so no trial is ignored. Fault trials use the engine's own
//! removal fault injection (no proxy needed: the engine is ours). The egress canary binds
//! on the docker0 bridge gateway of this host; nothing leaves the machine.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use sandbox_container::{ContainerBackend, ContainerEngine};
use sandbox_contract::anyhow::{self, Context as _};
use sandbox_contract::{CanarySpec, EngineLimits, Faults, Probes};
use sandbox_core::{Backend, CreateOptions, async_trait};
use sandbox_docker::{DockerConfig, DockerEngine, Runtime};
use third_party_engine::{
    FaultSwitch, JournaledEngine, LABEL_ENGINE, LABEL_VALUE, RemovalFault, container_config,
};

const PY: &str = "sandbox-rs/python:3.11";
const BUSYBOX: &str = "sandbox-rs/busybox:latest";

type Journaled = ContainerBackend<JournaledEngine<DockerEngine>>;

#[derive(Default)]
struct JournaledProbes {
    backend: OnceLock<Journaled>,
}

impl JournaledProbes {
    fn docker(&self) -> anyhow::Result<&DockerEngine> {
        Ok(self
            .backend
            .get()
            .context("the backend was not created before its probes ran")?
            .engine()
            .inner())
    }
}

#[async_trait]
impl Probes for JournaledProbes {
    fn base_options(&self) -> CreateOptions {
        CreateOptions::new(PY)
    }

    fn template_without_python(&self) -> Option<String> {
        Some(BUSYBOX.to_string())
    }

    fn extra_templates(&self) -> Vec<String> {
        vec![BUSYBOX.to_string()]
    }

    /// The `bridge` network's gateway (the host side of every egress-`Allow` sandbox's
    /// network); where IPAM names none, the subnet's first host address.
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        let net = self
            .docker()?
            .client()
            .inspect_network("bridge", None)
            .await
            .context("inspect the `bridge` network")?;
        let configs = net.ipam.and_then(|i| i.config).unwrap_or_default();
        let gateway = configs
            .iter()
            .find_map(|c| c.gateway.as_deref()?.parse::<Ipv4Addr>().ok())
            .or_else(|| {
                configs
                    .iter()
                    .find_map(|c| first_host(c.subnet.as_deref()?))
            })
            .with_context(|| format!("the `bridge` network has no IPv4 gateway: {configs:?}"))?;
        Ok(Some(CanarySpec {
            bind: SocketAddr::from((gateway, 0)),
            dial_host: gateway.to_string(),
        }))
    }

    /// The stored env; also checks this engine's stamp is on the container (the suite
    /// calls this on sandboxes it created, so a missing label fails those trials).
    async fn engine_env(&self, sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        let c = self
            .docker()?
            .client()
            .inspect_container(sandbox_id, None)
            .await
            .with_context(|| format!("inspect container {sandbox_id}"))?;
        let config = c.config.context("container inspect has no Config")?;
        let stamped = config
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_ENGINE))
            .is_some_and(|v| v == LABEL_VALUE);
        anyhow::ensure!(stamped, "container {sandbox_id} lacks {LABEL_ENGINE}");
        Ok(Some(config.env.unwrap_or_default()))
    }

    async fn engine_limits(&self, sandbox_id: &str) -> anyhow::Result<Option<EngineLimits>> {
        let c = self
            .docker()?
            .client()
            .inspect_container(sandbox_id, None)
            .await
            .with_context(|| format!("inspect container {sandbox_id}"))?;
        let hc = c
            .host_config
            .context("container inspect has no HostConfig")?;
        let positive = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0);
        let stored = hc.runtime.as_deref().context("HostConfig has no Runtime")?;
        let runtime = Runtime::parse(stored)
            .with_context(|| format!("HostConfig.Runtime {stored:?} is not a known runtime"))?;
        Ok(Some(EngineLimits {
            memory_bytes: positive(hc.memory),
            memory_swap_bytes: positive(hc.memory_swap),
            pids: positive(hc.pids_limit),
            nano_cpus: match (
                positive(hc.nano_cpus),
                positive(hc.cpu_quota),
                positive(hc.cpu_period),
            ) {
                (n, _, _) if n > 0 => n,
                (0, q, p) if q > 0 && p > 0 => q * 1_000_000_000 / p,
                _ => 0,
            },
            pids_headroom: runtime.pids_headroom(),
        }))
    }

    /// A second backend on its own engine instance, whose removals can hang or fail.
    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        let docker = DockerEngine::connect(DockerConfig::from_env().startup_sweep(false))
            .await
            .map_err(|e| anyhow::anyhow!("connect to Docker: {}", e.render()))?;
        let engine = JournaledEngine::new(docker);
        let switch = engine.fault_switch();
        let backend = ContainerBackend::new(engine, container_config(PY, false)).await;
        Ok(Some(Arc::new(JournaledFaults {
            backend: Arc::new(backend),
            switch,
        })))
    }
}

/// The first host address of an IPv4 `a.b.c.d/n` subnet (dockerd's choice for `docker0`).
fn first_host(subnet: &str) -> Option<Ipv4Addr> {
    let (net, bits) = subnet.split_once('/')?;
    let net: Ipv4Addr = net.parse().ok()?;
    let bits: u32 = bits.parse().ok()?;
    if bits >= 31 {
        return None;
    }
    let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
    Some(Ipv4Addr::from((u32::from(net) & mask) + 1))
}

struct JournaledFaults {
    backend: Arc<dyn Backend>,
    switch: FaultSwitch,
}

#[async_trait]
impl Faults for JournaledFaults {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn hang_kills(&self) {
        self.switch.set(RemovalFault::Hang);
    }
    async fn fail_kills(&self) {
        self.switch.set(RemovalFault::Fail);
    }
    async fn heal(&self) {
        self.switch.set(RemovalFault::None);
    }
}

fn main() -> ExitCode {
    let probes = Arc::new(JournaledProbes::default());
    let p = probes.clone();
    let code = sandbox_contract::run(
        Box::new(move || {
            Box::pin(async move {
                let docker = DockerEngine::connect(DockerConfig::from_env()).await?;
                let backend =
                    ContainerBackend::new(JournaledEngine::new(docker), container_config(PY, true))
                        .await;
                let _ = p.backend.set(backend.clone());
                Ok(Arc::new(backend) as Arc<dyn Backend>)
            })
        }),
        probes.clone(),
    );
    // The suite must really have gone through this engine: a run that never created,
    // exec'd in or removed a container proves nothing about it.
    if let Some(b) = probes.backend.get() {
        let journal = b.engine().journal();
        let missing: Vec<_> = ["create", "start", "exec", "exec_state", "remove"]
            .into_iter()
            .filter(|m| journal.count(m) == 0)
            .collect();
        eprintln!(
            "third-party-engine: {} engine call(s): {:?}",
            b.engine().backend(),
            journal.snapshot()
        );
        if !missing.is_empty() {
            eprintln!("third-party-engine: FAILED: never called {missing:?}");
            return ExitCode::FAILURE;
        }
    }
    code
}
