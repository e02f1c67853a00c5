//! Ingress ports for sandboxes without a network interface (egress `Deny`).
//!
//! A `none` network namespace cannot have published ports, yet deny must leave only `lo`.
//! So under `Deny` the adapter publishes each port itself, like `kubectl port-forward`: a
//! listener on the host's `127.0.0.1:<port>` whose every connection is bridged through an
//! exec of `nc 127.0.0.1 <port>` inside the sandbox (busybox `nc`). The sandbox gains no
//! interface and no route. Under `Allow`, Podman's own port mappings are used instead.

use std::net::SocketAddr;

use futures::StreamExt;
use futures::io::AsyncWriteExt;
use sandbox_core::{Result, SandboxError, StreamKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::error::BACKEND;
use crate::exec::{ExecSpec, ExecTarget, kill_group, launch_detached};

/// Binds `127.0.0.1:<port>` for every port, before anything is provisioned. When the
/// port is taken on the host, an ephemeral port is used instead; the address in effect is
/// reported by `PodmanSandbox::ingress_address`.
pub(crate) async fn bind(ports: &[u16]) -> Result<Vec<(u16, TcpListener)>> {
    let mut out = Vec::new();
    for p in ports {
        let l = match TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], *p))).await {
            Ok(l) => Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await
            }
            Err(e) => Err(e),
        }
        .map_err(|e| SandboxError::Creation {
            backend: BACKEND.into(),
            message: format!("cannot publish ingress port {p} on 127.0.0.1"),
            source: Some(Box::new(e)),
        })?;
        out.push((*p, l));
    }
    Ok(out)
}

/// `(container port, host address)` of bound listeners.
pub(crate) fn addresses(listeners: &[(u16, TcpListener)]) -> Vec<(u16, SocketAddr)> {
    listeners
        .iter()
        .filter_map(|(p, l)| l.local_addr().ok().map(|a| (*p, a)))
        .collect()
}

/// Starts forwarding; the returned tasks are aborted when the sandbox is killed or dropped.
pub(crate) fn spawn(
    target: &ExecTarget,
    listeners: Vec<(u16, TcpListener)>,
) -> Vec<JoinHandle<()>> {
    listeners
        .into_iter()
        .map(|(port, l)| {
            let target = target.clone();
            tokio::spawn(async move {
                while let Ok((conn, _)) = l.accept().await {
                    tokio::spawn(forward(target.clone(), port, conn));
                }
            })
        })
        .collect()
}

async fn forward(target: ExecTarget, port: u16, conn: TcpStream) {
    let spec = ExecSpec {
        argv: vec!["nc".into(), "127.0.0.1".into(), port.to_string()],
        env: vec![],
        workdir: Some("/".into()),
        stdin: true,
    };
    let Ok(l) = launch_detached(target.clone(), spec).await else {
        return;
    };
    let (mut rd, mut wr) = conn.into_split();
    let Some(mut stdin) = l.stdin else {
        return;
    };
    let mut output = l.output;
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if stdin.write_all(&buf[..n]).await.is_err() || stdin.flush().await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    let down = async move {
        while let Some(Ok(c)) = output.next().await {
            if c.stream == StreamKind::Stdout && wr.write_all(&c.data).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    };
    tokio::pin!(up);
    tokio::pin!(down);
    tokio::select! {
        _ = &mut down => {}
        _ = &mut up => { down.await; }
    }
    let _ = kill_group(&target, &l.exec, l.pgid).await;
}
