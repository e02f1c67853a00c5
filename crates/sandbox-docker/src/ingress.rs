//! Ingress ports: published on the host's loopback only.
//!
//! With egress `Allow` the engine publishes the port on `127.0.0.1` (a random host port).
//! With egress `Deny` the container has no interface but `lo`, so the engine cannot
//! publish anything; instead this process listens on `127.0.0.1:<random>` and carries
//! each accepted connection into the sandbox through an exec of `nc 127.0.0.1 <port>`
//! (busybox `nc`), so ingress works without giving the sandbox any network. Such a
//! forwarder lives as long as the [`DockerSandbox`](crate::DockerSandbox) handle.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use sandbox_core::{Result, SandboxError, StreamKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::error::{self, BACKEND};
use crate::exec::{ExecSpec, start_exec};
use crate::sandbox::SandboxInner;

/// Host addresses of a sandbox's ingress ports, and the forwarders behind them.
#[derive(Default)]
pub(crate) struct Ingress {
    pub addrs: BTreeMap<u16, SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Ingress {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Ingress {
    /// Stops the forwarders (engine-published ports go away with the container).
    pub(crate) fn stop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

/// Reads the host ports the engine published on loopback.
pub(crate) async fn published(inner: &SandboxInner, ports: &[u16]) -> Result<Ingress> {
    let c = inner
        .client
        .inspect_container(&inner.id, None)
        .await
        .map_err(|e| error::for_sandbox(&inner.id, "inspect container", e))?;
    let map = c.network_settings.and_then(|n| n.ports).unwrap_or_default();
    let mut ingress = Ingress::default();
    for p in ports {
        let addr = map
            .get(&format!("{p}/tcp"))
            .and_then(|b| b.as_ref())
            .and_then(|b| {
                b.iter().find_map(|b| {
                    let ip = b.host_ip.as_deref().unwrap_or("127.0.0.1");
                    let port = b.host_port.as_deref()?.parse::<u16>().ok()?;
                    format!("{ip}:{port}").parse::<SocketAddr>().ok()
                })
            })
            .ok_or_else(|| SandboxError::Creation {
                backend: BACKEND.into(),
                message: format!("the engine did not publish port {p}"),
                source: None,
            })?;
        ingress.addrs.insert(*p, addr);
    }
    Ok(ingress)
}

/// Starts loopback forwarders into a sandbox without network.
pub(crate) async fn forward(inner: &Arc<SandboxInner>, ports: &[u16]) -> Result<Ingress> {
    let mut ingress = Ingress::default();
    for &port in ports {
        let listener =
            TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| SandboxError::Creation {
                    backend: BACKEND.into(),
                    message: format!("cannot listen on 127.0.0.1 for ingress port {port}"),
                    source: Some(Box::new(e)),
                })?;
        let addr = listener.local_addr().map_err(|e| SandboxError::Creation {
            backend: BACKEND.into(),
            message: "ingress listener has no address".into(),
            source: Some(Box::new(e)),
        })?;
        let weak = Arc::downgrade(inner);
        ingress.tasks.push(tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let Some(inner) = weak.upgrade() else { break };
                tokio::spawn(async move {
                    if let Err(e) = carry(&inner, sock, port).await {
                        tracing::debug!(sandbox_id = %inner.id, port, error = %e, "ingress connection failed");
                    }
                });
            }
        }));
        ingress.addrs.insert(port, addr);
    }
    Ok(ingress)
}

/// Carries one TCP connection into the sandbox's `127.0.0.1:<port>`.
async fn carry(inner: &Arc<SandboxInner>, sock: TcpStream, port: u16) -> Result<()> {
    let raw = start_exec(
        inner,
        ExecSpec {
            argv: vec!["nc".into(), "127.0.0.1".into(), port.to_string()],
            env: vec![],
            workdir: "/".into(),
            stdin: true,
            feed: None,
            wrapped: true,
        },
    )
    .await?;
    let (mut sr, mut sw) = sock.into_split();
    let mut input = raw.input;
    let mut output = raw.output;
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if input.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = input.shutdown().await;
    };
    let down = async move {
        while let Some(Ok(chunk)) = output.next().await {
            if chunk.stream == StreamKind::Stdout && sw.write_all(&chunk.data).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    tokio::select! {
        _ = down => {}
        _ = async { up.await; futures::future::pending::<()>().await } => {}
    }
    // The exec ends with the connection; make sure its process does too.
    (raw.killer)().await
}
