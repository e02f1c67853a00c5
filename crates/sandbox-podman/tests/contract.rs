//! The contract suite against the real Podman service.
//!
//! Probes: base template `sandbox-rs/python:3.11`, `sandbox-rs/busybox:latest` without
//! python3, a canary on the host (bound on all interfaces, dialled through the `podman`
//! network's gateway IP — never an outside address), `Config.Env` from container inspect,
//! and faults through a unix-socket proxy in front of the Podman socket whose kill
//! requests (`DELETE …/containers/…`) can be made to hang or fail.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use sandbox_contract::anyhow::{self, Context as _};
use sandbox_contract::{CanarySpec, Faults, Probes};
use sandbox_core::{Backend, CreateOptions, async_trait};
use sandbox_podman::{PodmanBackend, PodmanConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::OnceCell;

const PASS: u8 = 0;
const HANG: u8 = 1;
const FAIL: u8 = 2;

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

/// A unix-socket proxy in front of the Podman socket, and a backend pointed at it.
struct FaultProxy {
    mode: Arc<AtomicU8>,
    backend: Arc<dyn Backend>,
    _dir: tempfile::TempDir,
}

impl FaultProxy {
    async fn start() -> anyhow::Result<FaultProxy> {
        let upstream = PodmanConfig::from_env()
            .endpoint_str()
            .strip_prefix("unix://")
            .map(PathBuf::from)
            .context("the Podman endpoint is not a unix socket; the fault proxy needs one")?;
        let dir = tempfile::tempdir().context("temp dir for the fault proxy")?;
        let path = dir.path().join("podman-proxy.sock");
        let listener = UnixListener::bind(&path).context("bind the fault proxy socket")?;
        let mode = Arc::new(AtomicU8::new(PASS));
        let m = mode.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, upstream.clone(), m.clone()));
            }
        });
        let backend = PodmanBackend::connect(
            PodmanConfig::from_env()
                .endpoint(format!("unix://{}", path.display()))
                .startup_sweep(false),
        )
        .await
        .map_err(|e| anyhow::anyhow!("connect through the fault proxy: {}", e.render()))?;
        Ok(FaultProxy {
            mode,
            backend: Arc::new(backend),
            _dir: dir,
        })
    }
}

/// Reads the request head, applies the fault mode to container removals, else relays.
async fn serve(mut conn: UnixStream, upstream: PathBuf, mode: Arc<AtomicU8>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 1 << 20 {
            return;
        }
    }
    let line = String::from_utf8_lossy(&head[..head.iter().position(|b| *b == b'\r').unwrap_or(0)])
        .to_string();
    let is_kill = line.starts_with("DELETE ") && line.contains("/containers/");
    match mode.load(Ordering::SeqCst) {
        HANG if is_kill => {
            // Never answer; the client's bounded teardown gives up.
            let _ = conn.read(&mut buf).await;
            std::future::pending::<()>().await;
        }
        FAIL if is_kill => {
            let body = br#"{"cause":"injected fault","message":"injected fault","response":500}"#;
            let resp = format!(
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(resp.as_bytes()).await;
            let _ = conn.write_all(body).await;
            let _ = conn.shutdown().await;
        }
        _ => {
            let Ok(mut up) = UnixStream::connect(&upstream).await else {
                return;
            };
            if up.write_all(&head).await.is_err() {
                return;
            }
            let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
        }
    }
}

#[async_trait]
impl Faults for FaultProxy {
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
