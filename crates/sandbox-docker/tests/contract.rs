//! The sandbox-rs contract suite against the real Docker engine.
//!
//! `SBX_DOCKER_RUNTIME=runsc` runs the same suite under gVisor. Fault trials go through
//! the adapters' shared unix-socket proxy (`sandbox_testkit::FaultProxy`) in front of the
//! engine socket, which can make container removals hang or fail with HTTP 500. The
//! egress canary lives in the egress lab's namespace on this host (removed when the run
//! ends); nothing leaves the machine.

use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use sandbox_contract::anyhow::{self, Context as _};
use sandbox_contract::{CanarySpec, EngineLimits, Faults, Injection, Probes};
use sandbox_core::{Backend, CreateOptions, async_trait};
use sandbox_docker::{DockerBackend, DockerConfig, Runtime};
use sandbox_testkit::FaultProxy;
use sandbox_testkit::contract::{ProxyFaults, bind_lab_canary, lab_canary, lab_egress_names};
use sandbox_testkit::egress_lab;

const PY: &str = "sandbox-rs/python:3.11";
const BUSYBOX: &str = "sandbox-rs/busybox:latest";

fn runtime() -> Runtime {
    match std::env::var("SBX_DOCKER_RUNTIME").as_deref() {
        Ok(r) => {
            Runtime::parse(r).unwrap_or_else(|| panic!("SBX_DOCKER_RUNTIME={r}: use runc or runsc"))
        }
        Err(_) => Runtime::Runc,
    }
}

struct DockerProbes {
    runtime: Runtime,
    backend: OnceLock<DockerBackend>,
    /// Whether the engine registers the runtime under test with `--network=none` (set in
    /// the factory from `GET /info`): egress `Allow` is then refused by the adapter.
    network_none: OnceLock<bool>,
}

#[async_trait]
impl Probes for DockerProbes {
    fn base_options(&self) -> CreateOptions {
        CreateOptions::new(PY)
    }

    fn template_without_python(&self) -> Option<String> {
        Some(BUSYBOX.to_string())
    }

    /// `false` on a runtime the engine registers with `--network=none` (how `cargo xtask
    /// setup` registers `runsc`): the adapter refuses egress `Allow` there.
    fn egress_allow(&self) -> bool {
        !self.network_none.get().copied().unwrap_or(false)
    }

    fn extra_templates(&self) -> Vec<String> {
        vec![BUSYBOX.to_string()]
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
        let b = self.backend()?;
        let c = b
            .client()
            .inspect_container(sandbox_id, None)
            .await
            .with_context(|| format!("inspect container {sandbox_id}"))?;
        let config = c.config.context("container inspect has no Config")?;
        Ok(Some(config.env.unwrap_or_default()))
    }

    /// `docker inspect` `HostConfig`: used by the limit trials only for a gVisor sandbox,
    /// which has no cgroup view inside. The headroom is the adapter's documented runsc
    /// pids headroom (`Runtime::pids_headroom`) for the runtime the engine stored for the
    /// container (`HostConfig.Runtime`), not for this process's configuration.
    async fn engine_limits(&self, sandbox_id: &str) -> anyhow::Result<Option<EngineLimits>> {
        let b = self.backend()?;
        let c = b
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

    /// Kills the sandbox's container through the engine (as a crashed init would end
    /// it). The engine keeps a stopped sandbox (for `Sandbox::start`), so it stays listed.
    async fn stop_sandbox(&self, sandbox_id: &str) -> anyhow::Result<Injection> {
        let client = self.backend()?.client();
        client
            .kill_container(sandbox_id, None)
            .await
            .with_context(|| format!("kill container {sandbox_id}"))?;
        Ok(Injection::Injected)
    }

    /// The checkpoints Docker lists for the container, and the copies containerd
    /// unpacked in /tmp to restore it (a `ctrd-checkpoint*` directory whose restore marker
    /// names the container), which containerd itself never removes.
    async fn checkpoints(&self, sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        let list = self
            .backend()?
            .client()
            .list_checkpoints(sandbox_id, None)
            .await
            .with_context(|| format!("list the checkpoints of {sandbox_id}"))?;
        let mut left: Vec<String> = list.into_iter().map(|c| c.name).collect();
        for e in std::fs::read_dir("/tmp").into_iter().flatten().flatten() {
            let path = e.path();
            let named = e
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("ctrd-checkpoint"));
            let marker = std::fs::read_to_string(path.join("sandbox-rs-restore"));
            if named && marker.is_ok_and(|m| m.starts_with(&format!("{sandbox_id} "))) {
                left.push(format!("containerd's copy {}", path.display()));
            }
        }
        Ok(Some(left))
    }

    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        let proxy = FaultProxy::start(engine_socket())
            .await
            .context("start the fault proxy")?;
        let backend = DockerBackend::connect(
            DockerConfig::default()
                .endpoint(proxy.endpoint())
                .runtime(self.runtime)
                .startup_sweep(false)
                // The stalled-create trial waits this out.
                .create_timeout(std::time::Duration::from_secs(3)),
        )
        .await
        .map_err(|e| anyhow::anyhow!("connect through the fault proxy: {}", e.render()))?;
        Ok(Some(Arc::new(ProxyFaults::new(
            proxy,
            Arc::new(backend),
            "docker",
        ))))
    }
}

impl DockerProbes {
    fn backend(&self) -> anyhow::Result<&DockerBackend> {
        self.backend
            .get()
            .context("the Docker backend was not created before its probes ran")
    }
}

/// The engine socket the fault proxy relays to.
fn engine_socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".to_string())
}

fn main() -> ExitCode {
    // Dropped after the suite's summary: removes the egress lab unless another test
    // process still uses it, and says so in the run's last line.
    let _lab = egress_lab::Teardown::at_end_of_run();
    let runtime = runtime();
    let probes = Arc::new(DockerProbes {
        runtime,
        backend: OnceLock::new(),
        network_none: OnceLock::new(),
    });
    let p = probes.clone();
    sandbox_contract::run(
        Box::new(move || {
            Box::pin(async move {
                let b = DockerBackend::connect(DockerConfig::from_env().runtime(runtime)).await?;
                let _ = p.backend.set(b.clone());
                // A failed /info is not "no --network=none": the trials then expect Allow
                // to work and fail loudly if the adapter refuses it.
                if let Ok(info) = b.client().info().await {
                    let none = info
                        .runtimes
                        .and_then(|r| r.get(runtime.as_str()).cloned())
                        .and_then(|r| r.runtime_args)
                        .is_some_and(|args| args.iter().any(|a| a == "--network=none"));
                    let _ = p.network_none.set(none);
                }
                Ok(Arc::new(b) as Arc<dyn Backend>)
            })
        }),
        probes,
    )
}
