//! `nc -w SECONDS HOST PORT`: the egress probe. The fake honours the sandbox's network policy
//! and, where egress is allowed, really connects over TCP (tests point it at a loopback
//! canary) and prints what the server sends.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::{Egress, Result};
use tokio::io::AsyncReadExt;

use crate::commands::refusal::form_not_in_vocabulary;
use crate::policy::{HOST_ADDRESS, Verdict, dial_verdict};
use crate::program::{BROKEN_PIPE_EXIT, Proc};

/// Writes an error line to stderr and exits 1.
async fn fail(p: &Proc, msg: String) -> Result<i64> {
    crate::program::fail(p, msg, 1).await
}

fn unreachable(host: &str) -> String {
    format!("nc: can't connect to remote host ({host}): Network is unreachable")
}

pub(crate) async fn nc(p: Proc, a: Vec<String>) -> Result<i64> {
    let [_, w, secs, host, port] = a.as_slice() else {
        return form_not_in_vocabulary(&p, &a).await;
    };
    let wait = match secs.parse::<f64>() {
        Ok(s) if w == "-w" && s.is_finite() => Duration::from_secs_f64(s.clamp(0.0, 1e6)),
        _ => return fail(&p, "nc: usage: nc -w SECONDS HOST PORT".into()).await,
    };
    let Ok(port) = port.parse::<u16>() else {
        return fail(&p, format!("nc: bad port '{port}'")).await;
    };
    let bad_address = || format!("nc: bad address '{host}'");
    let policy = &p.sb.network_now();
    let literal = host.parse::<IpAddr>().ok();
    if policy.egress == Egress::Deny {
        // No interface but loopback: names do not resolve, addresses are unreachable.
        let msg = literal.map_or_else(bad_address, |_| unreachable(host));
        return fail(&p, msg).await;
    }
    // The allowlist's resolver refuses an unlisted name before any lookup.
    if dial_verdict(policy, host, port) == Verdict::NameRefused {
        return fail(&p, bad_address()).await;
    }
    let addrs: Vec<SocketAddr> = match literal {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        // The name of the host's services: the host's address on the sandbox's network.
        None if host
            .trim_end_matches('.')
            .eq_ignore_ascii_case(sandbox_core::HOST_SANDBOX_NAME) =>
        {
            vec![SocketAddr::new(HOST_ADDRESS, port)]
        }
        None => {
            match tokio::time::timeout(wait, tokio::net::lookup_host((host.as_str(), port))).await {
                Ok(Ok(it)) => it.collect(),
                _ => return fail(&p, bad_address()).await,
            }
        }
    };
    if dial_verdict(policy, host, port) != Verdict::Allowed {
        let shown = addrs
            .first()
            .map_or_else(|| host.clone(), |a| a.ip().to_string());
        return fail(&p, unreachable(&shown)).await;
    }
    let Some(addr) = addrs.first().copied() else {
        return fail(&p, bad_address()).await;
    };
    let mut stream = match tokio::time::timeout(wait, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let why = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => "Connection refused".to_string(),
                other => other.to_string(),
            };
            let msg = format!("nc: can't connect to remote host ({}): {why}", addr.ip());
            return fail(&p, msg).await;
        }
        Err(_) => return fail(&p, "nc: timeout".into()).await,
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match tokio::time::timeout(wait, stream.read(&mut buf)).await {
            // Idle for -w seconds, or the server closed: done.
            Err(_) | Ok(Ok(0)) => return Ok(0),
            Ok(Ok(n)) => {
                // A live change that forbids the host cuts the open connection, as the
                // engines' rules refuse its next packet.
                if dial_verdict(&p.sb.network_now(), host, port) != Verdict::Allowed {
                    return fail(&p, "nc: read error: connection reset".into()).await;
                }
                if !p.out(Bytes::copy_from_slice(&buf[..n])).await {
                    return Ok(BROKEN_PIPE_EXIT);
                }
            }
            Ok(Err(e)) => return fail(&p, format!("nc: read error: {}", e.kind())).await,
        }
    }
}
