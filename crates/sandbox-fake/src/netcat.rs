//! `nc -w SECS HOST PORT`: the egress probe. The fake honours the sandbox's network policy
//! and, where egress is allowed, really connects over TCP (tests point it at a loopback
//! canary) and prints what the server sends.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::{Egress, Result};
use tokio::io::AsyncReadExt;

use crate::exec::{BROKEN_PIPE_EXIT, Proc};
use crate::policy::egress_allowed;

async fn fail(p: &Proc, msg: String) -> Result<i64> {
    p.err(format!("{msg}\n")).await;
    Ok(1)
}

fn unreachable(host: &str) -> String {
    format!("nc: can't connect to remote host ({host}): Network is unreachable")
}

pub(crate) async fn nc(p: Proc, a: Vec<String>) -> Result<i64> {
    let mut wait: Option<Duration> = None;
    let mut scan = false;
    let mut operands = Vec::new();
    let mut i = 1;
    while i < a.len() {
        match a[i].as_str() {
            "-w" => {
                let Some(secs) = a.get(i + 1).and_then(|s| s.parse::<f64>().ok()) else {
                    return fail(&p, "nc: invalid number for -w".into()).await;
                };
                wait = Some(Duration::from_secs_f64(secs.clamp(0.0, 1e6)));
                i += 2;
                continue;
            }
            "-z" => scan = true,
            "-v" | "-n" => {}
            s if s.starts_with('-') && s.len() > 1 => {
                return fail(&p, format!("nc: option {s} not supported by sandbox-fake")).await;
            }
            s => operands.push(s.to_string()),
        }
        i += 1;
    }
    let [host, port] = operands.as_slice() else {
        return fail(&p, "nc: usage: nc [-w SECS] [-z] HOST PORT".into()).await;
    };
    let Ok(port) = port.parse::<u16>() else {
        return fail(&p, format!("nc: bad port '{port}'")).await;
    };
    let policy = &p.sb.policy;
    let literal = host.parse::<IpAddr>().ok();
    if policy.egress == Egress::Deny {
        // No interface but loopback: names do not resolve, addresses are unreachable.
        return fail(
            &p,
            match literal {
                Some(_) => unreachable(host),
                None => format!("nc: bad address '{host}'"),
            },
        )
        .await;
    }
    let deadline = wait.unwrap_or(Duration::from_secs(60));
    let addrs: Vec<SocketAddr> = match literal {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => {
            match tokio::time::timeout(deadline, tokio::net::lookup_host((host.as_str(), port)))
                .await
            {
                Ok(Ok(it)) => it.collect(),
                _ => return fail(&p, format!("nc: bad address '{host}'")).await,
            }
        }
    };
    let ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    if !egress_allowed(policy, host, &ips) {
        let shown = ips
            .first()
            .map(|ip| ip.to_string())
            .unwrap_or_else(|| host.clone());
        return fail(&p, unreachable(&shown)).await;
    }
    let Some(addr) = addrs.first().copied() else {
        return fail(&p, format!("nc: bad address '{host}'")).await;
    };
    let mut stream =
        match tokio::time::timeout(deadline, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                let why = match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => "Connection refused".to_string(),
                    other => other.to_string(),
                };
                return fail(
                    &p,
                    format!("nc: can't connect to remote host ({}): {why}", addr.ip()),
                )
                .await;
            }
            Err(_) => return fail(&p, "nc: timeout".into()).await,
        };
    if scan {
        return Ok(0);
    }
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = match wait {
            Some(w) => match tokio::time::timeout(w, stream.read(&mut buf)).await {
                Ok(r) => r,
                // Idle for -w seconds: done.
                Err(_) => return Ok(0),
            },
            None => stream.read(&mut buf).await,
        };
        match read {
            Ok(0) => return Ok(0),
            Ok(n) => {
                if !p.out(Bytes::copy_from_slice(&buf[..n])).await {
                    return Ok(BROKEN_PIPE_EXIT);
                }
            }
            Err(e) => return fail(&p, format!("nc: read error: {}", e.kind())).await,
        }
    }
}
