//! Ingress ports: reachable on the host's loopback only, at an ephemeral port.
//!
//! With a network (egress `Allow`) the engine publishes each port on `127.0.0.1` at a port
//! it picks. Without one (egress `Deny`: only `lo` inside) nothing can be published;
//! instead this process listens on `127.0.0.1:<ephemeral>` and carries each accepted
//! connection into the sandbox through an exec of `nc 127.0.0.1 <port>` (busybox `nc`),
//! so ingress works without giving the sandbox any network. At most
//! `ContainerConfig::max_ingress_connections` connections are carried at once; the
//! forwarders end with the sandbox handle's `kill` or drop.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use sandbox_core::{Result, SandboxError, StreamKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::engine::ContainerEngine;
use crate::error;
use crate::sandbox::exec::{ExecPlan, launch};
use crate::sandbox::shared::Shared;

/// Host addresses of a sandbox's ingress ports, and the forwarders behind them.
#[derive(Default)]
pub(crate) struct Ingress {
    pub addrs: BTreeMap<u16, SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Ingress {
    fn drop(&mut self) {
        // Dropping cannot wait; the aborted tasks close their listeners on their own.
        drop(self.stop());
    }
}

impl Ingress {
    /// Stops the forwarders (engine-published ports go away with the container).
    ///
    /// Aborting only asks: a listener is closed when its task is dropped, on a worker
    /// thread, later. Until then the kernel still completes connections into its backlog,
    /// so callers that must promise "closed" await the returned handles.
    pub(crate) fn stop(&mut self) -> Vec<JoinHandle<()>> {
        let tasks: Vec<_> = self.tasks.drain(..).collect();
        for t in &tasks {
            t.abort();
        }
        tasks
    }
}

fn creation(backend: &str, message: String, source: Option<std::io::Error>) -> SandboxError {
    let err = SandboxError::creation(backend, message);
    match source {
        Some(e) => err.with_source(e),
        None => err,
    }
}

/// Reads the host addresses the engine published (loopback only, or refused).
pub(crate) async fn published<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    ports: &[u16],
) -> Result<Ingress> {
    let backend = sh.engine.backend();
    let c = sh
        .call("inspect", sh.engine.inspect(&sh.id))
        .await
        .map_err(|e| error::on_sandbox(&*sh.engine, &sh.id, "inspect container", e))?;
    let mut ingress = Ingress::default();
    for p in ports {
        let addr = c.published.get(p).copied().ok_or_else(|| {
            creation(
                backend,
                format!("the engine did not publish port {p}"),
                None,
            )
        })?;
        if !addr.ip().is_loopback() {
            return Err(creation(
                backend,
                format!("the engine published port {p} on {addr}, not on loopback"),
                None,
            ));
        }
        ingress.addrs.insert(*p, addr);
    }
    Ok(ingress)
}

/// Starts loopback forwarders into a sandbox without network.
pub(crate) async fn forward<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    ports: &[u16],
) -> Result<Ingress> {
    let backend = sh.engine.backend();
    let mut ingress = Ingress::default();
    let slots = Arc::new(tokio::sync::Semaphore::new(
        sh.config.max_ingress_connections.max(1),
    ));
    for &port in ports {
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| {
            creation(
                backend,
                format!("cannot listen on 127.0.0.1 for ingress port {port}"),
                Some(e),
            )
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| creation(backend, "ingress listener has no address".into(), Some(e)))?;
        let weak = Arc::downgrade(sh);
        let slots = slots.clone();
        ingress.tasks.push(tokio::spawn(async move {
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else { break };
                let Ok((sock, _)) = listener.accept().await else { break };
                let Some(sh) = weak.upgrade() else { break };
                tokio::spawn(async move {
                    let _permit = permit;
                    if let Err(e) = carry(&sh, sock, port).await {
                        tracing::debug!(sandbox_id = %sh.id, port, error = %e, "ingress connection failed");
                    }
                });
            }
        }));
        ingress.addrs.insert(port, addr);
    }
    Ok(ingress)
}

/// Carries one TCP connection into the sandbox's `127.0.0.1:<port>`.
async fn carry<E: ContainerEngine>(sh: &Arc<Shared<E>>, sock: TcpStream, port: u16) -> Result<()> {
    let mut l = launch(
        sh,
        ExecPlan {
            argv: vec!["nc".into(), "127.0.0.1".into(), port.to_string()],
            env: Vec::new(),
            workdir: "/".into(),
            stdin: true,
            wrapped: true,
            guarded: true,
        },
    )
    .await?;
    let (mut sr, mut sw) = sock.into_split();
    let Some(mut input) = l.input.take() else {
        return Err(error::internal(
            sh.engine.backend(),
            "the engine attached no stdin",
        ));
    };
    let mut output = std::mem::replace(&mut l.output, futures::stream::empty().boxed());
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
    // The exec ends with the connection; make sure what it started does too.
    l.guard.disarm();
    (l.killer)().await
}
