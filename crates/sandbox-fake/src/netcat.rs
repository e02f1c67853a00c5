//! `nc -w SECONDS HOST PORT`: the egress probe. The fake honours the sandbox's network policy
//! and, where egress is allowed, really connects over TCP (tests point it at a loopback
//! canary) and prints what the server sends.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::{Egress, Result};
use tokio::io::AsyncReadExt;

use crate::exec::{BROKEN_PIPE_EXIT, Proc};
use crate::policy::{Verdict, egress_verdict};

async fn fail(p: &Proc, msg: String) -> Result<i64> {
    p.err(format!("{msg}\n")).await;
    Ok(1)
}

fn unreachable(host: &str) -> String {
    format!("nc: can't connect to remote host ({host}): Network is unreachable")
}

pub(crate) async fn nc(p: Proc, a: Vec<String>) -> Result<i64> {
    let [_, w, secs, host, port] = a.as_slice() else {
        let msg = format!("fake: form not in vocabulary: {}\n", a.join(" "));
        p.sb.outside_vocabulary(msg.trim_end());
        p.err(msg).await;
        return Ok(crate::vocabulary::FORM_NOT_IN_VOCABULARY_EXIT);
    };
    let secs = secs
        .parse::<f64>()
        .ok()
        .filter(|s| w == "-w" && s.is_finite());
    let Some(secs) = secs else {
        return fail(&p, "nc: usage: nc -w SECONDS HOST PORT".into()).await;
    };
    let wait = Duration::from_secs_f64(secs.clamp(0.0, 1e6));
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
    // The allowlist's resolver refuses an unlisted name before any lookup.
    if egress_verdict(policy, host) == Verdict::NameRefused {
        return fail(&p, format!("nc: bad address '{host}'")).await;
    }
    let deadline = wait;
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
    if egress_verdict(policy, host) != Verdict::Allowed {
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
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = match tokio::time::timeout(wait, stream.read(&mut buf)).await {
            Ok(r) => r,
            // Idle for -w seconds: done.
            Err(_) => return Ok(0),
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
