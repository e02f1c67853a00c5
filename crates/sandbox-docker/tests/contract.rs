//! The sandbox-rs contract suite against the real Docker engine.
//!
//! `SBX_DOCKER_RUNTIME=runsc` runs the same suite under gVisor. Fault trials go through
//! a unix-socket proxy in front of the engine socket that can make container removals
//! hang or fail with HTTP 500. The egress canary binds on the docker0 bridge gateway of
//! this host; nothing leaves the machine.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use std::net::{Ipv4Addr, SocketAddr};

use sandbox_contract::anyhow::{self, Context as _};
use sandbox_contract::{CanarySpec, EngineLimits, Faults, Probes};
use sandbox_core::{Backend, CreateOptions, async_trait};
use sandbox_docker::{DockerBackend, DockerConfig, Runtime};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

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
    /// setup` registers `runsc`, SPEC §7): the adapter refuses egress `Allow` there.
    fn egress_allow(&self) -> bool {
        !self.network_none.get().copied().unwrap_or(false)
    }

    fn extra_templates(&self) -> Vec<String> {
        vec![BUSYBOX.to_string()]
    }

    /// The canary binds on the `bridge` network's gateway, the host side of every
    /// egress-`Allow` sandbox's network (never an outside address). A fresh dockerd's
    /// IPAM config has a Subnet but no Gateway: the gateway is then the subnet's first
    /// host address, which is what dockerd gives `docker0`.
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        let b = self.backend()?;
        let net = b
            .client()
            .inspect_network("bridge", None)
            .await
            .context("inspect the `bridge` network")?;
        let configs = net.ipam.and_then(|i| i.config).unwrap_or_default();
        let gateway = bridge_gateway(
            configs
                .iter()
                .map(|c| (c.gateway.as_deref(), c.subnet.as_deref())),
        )
        .with_context(|| {
            format!("the `bridge` network has no IPv4 gateway or subnet: {configs:?}")
        })?;
        Ok(Some(CanarySpec {
            bind: SocketAddr::from((gateway, 0)),
            dial_host: gateway.to_string(),
        }))
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

    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        let proxy = FaultProxy::start().await.context("start the fault proxy")?;
        let backend = DockerBackend::connect(
            DockerConfig::default()
                .host(format!("unix://{}", proxy.path.display()))
                .runtime(self.runtime)
                .startup_sweep(false),
        )
        .await
        .map_err(|e| anyhow::anyhow!("connect through the fault proxy: {}", e.render()))?;
        Ok(Some(Arc::new(DockerFaults {
            backend: Arc::new(backend),
            mode: proxy.mode,
        })))
    }
}

impl DockerProbes {
    fn backend(&self) -> anyhow::Result<&DockerBackend> {
        self.backend
            .get()
            .context("the Docker backend was not created before its probes ran")
    }
}

/// The first IPv4 gateway among `(gateway, subnet)` pairs; where IPAM names none, the
/// first host address of the IPv4 subnet (dockerd's choice for `docker0`).
fn bridge_gateway<'a>(
    configs: impl Iterator<Item = (Option<&'a str>, Option<&'a str>)>,
) -> Option<Ipv4Addr> {
    let configs: Vec<_> = configs.collect();
    if let Some(g) = configs
        .iter()
        .find_map(|(g, _)| g.and_then(|g| g.parse::<Ipv4Addr>().ok()))
    {
        return Some(g);
    }
    configs.iter().find_map(|(_, subnet)| {
        let (net, bits) = (*subnet)?.split_once('/')?;
        let net: Ipv4Addr = net.parse().ok()?;
        let bits: u32 = bits.parse().ok()?;
        if bits >= 31 {
            return None;
        }
        let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
        Some(Ipv4Addr::from((u32::from(net) & mask) + 1))
    })
}

const PASS: u8 = 0;
const HANG: u8 = 1;
const FAIL: u8 = 2;

struct DockerFaults {
    backend: Arc<dyn Backend>,
    mode: Arc<AtomicU8>,
}

#[async_trait]
impl Faults for DockerFaults {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn hang_kills(&self) {
        self.mode.store(HANG, Ordering::SeqCst);
    }
    async fn fail_kills(&self) {
        self.mode.store(FAIL, Ordering::SeqCst);
    }
    async fn heal(&self) {
        self.mode.store(PASS, Ordering::SeqCst);
    }
}

/// A unix-socket HTTP/1.1 proxy to the engine socket that can intercept container
/// removals (`DELETE /…/containers/<id>`). Everything else passes through, including
/// chunked bodies and upgraded (exec attach) connections.
struct FaultProxy {
    path: std::path::PathBuf,
    mode: Arc<AtomicU8>,
}

fn engine_socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".to_string())
}

impl FaultProxy {
    async fn start() -> std::io::Result<FaultProxy> {
        let path =
            std::env::temp_dir().join(format!("sbx-docker-faults-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let mode = Arc::new(AtomicU8::new(PASS));
        let m = mode.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let m = m.clone();
                tokio::spawn(async move {
                    let _ = proxy_connection(conn, m).await;
                });
            }
        });
        Ok(FaultProxy { path, mode })
    }
}

async fn proxy_connection(client: UnixStream, mode: Arc<AtomicU8>) -> std::io::Result<()> {
    let upstream = UnixStream::connect(engine_socket()).await?;
    let (cr, cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let cw = Arc::new(tokio::sync::Mutex::new(cw));
    let down_cw = cw.clone();
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match ur.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if down_cw.lock().await.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = down_cw.lock().await.shutdown().await;
    });
    let mut reader = BufReader::new(cr);
    loop {
        let mut head = Vec::new();
        loop {
            let n = reader.read_until(b'\n', &mut head).await?;
            if n == 0 {
                let _ = uw.shutdown().await;
                return Ok(());
            }
            if head.ends_with(b"\r\n\r\n") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&head).to_string();
        let mut lines = text.split("\r\n");
        let first = lines.next().unwrap_or_default().to_string();
        let mut content_length = None;
        let mut chunked = false;
        let mut upgrade = false;
        for l in lines {
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
            match k.as_str() {
                "content-length" => content_length = v.parse::<u64>().ok(),
                "transfer-encoding" => chunked = v.contains("chunked"),
                "upgrade" => upgrade = true,
                _ => {}
            }
        }
        let is_removal = first.starts_with("DELETE ") && first.contains("/containers/");
        if is_removal {
            while mode.load(Ordering::SeqCst) == HANG {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if mode.load(Ordering::SeqCst) == FAIL {
                let body = br#"{"message":"injected fault: removal failed"}"#;
                let resp = format!(
                    "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                down.abort();
                let mut w = cw.lock().await;
                w.write_all(resp.as_bytes()).await?;
                w.write_all(body).await?;
                w.shutdown().await?;
                return Ok(());
            }
        }
        uw.write_all(&head).await?;
        if upgrade {
            tokio::io::copy(&mut reader, &mut uw).await?;
            let _ = uw.shutdown().await;
            return Ok(());
        }
        if let Some(n) = content_length {
            let mut body = (&mut reader).take(n);
            tokio::io::copy(&mut body, &mut uw).await?;
        } else if chunked {
            loop {
                let mut line = Vec::new();
                reader.read_until(b'\n', &mut line).await?;
                uw.write_all(&line).await?;
                let size_text = String::from_utf8_lossy(&line);
                let size_hex = size_text.trim().split(';').next().unwrap_or("0");
                let size = u64::from_str_radix(size_hex, 16).unwrap_or(0);
                if size == 0 {
                    // Trailers, then the final empty line.
                    loop {
                        let mut t = Vec::new();
                        if reader.read_until(b'\n', &mut t).await? == 0 {
                            return Ok(());
                        }
                        uw.write_all(&t).await?;
                        if t == b"\r\n" {
                            break;
                        }
                    }
                    break;
                }
                let mut chunk = (&mut reader).take(size + 2);
                tokio::io::copy(&mut chunk, &mut uw).await?;
            }
        }
    }
}

fn main() -> ExitCode {
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
