//! The demo's egress-denied proof. It never sends traffic off this machine: the only
//! address dialed is one of this host's own (e.g. the Docker bridge gateway), where the demo
//! itself listens.
//!
//! Under a deny policy the sandbox has no interface but `lo`, so (a) `/proc/net/dev` inside
//! lists only `lo`, and (b) dialing the host's listener fails with "Network is unreachable"
//! (the right reason — not a missing tool, not a refused connection), and the listener sees
//! no connection.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use sandbox::{Command, RunOptions, Sandbox, SandboxError};
use serde::Serialize;
use tokio::net::TcpListener;

/// What the proof found.
#[derive(Debug, Serialize)]
pub struct EgressProof {
    /// Interfaces listed in the sandbox's `/proc/net/dev`; `null` on the fake, an
    /// in-process model whose `/proc` is no kernel evidence (it has none).
    pub interfaces: Option<Vec<String>>,
    /// The host address and port dialed (this machine's own listener).
    pub dialed: String,
    /// Exit code of the dial (`nc`).
    pub dial_exit_code: i64,
    /// The dial's error message.
    pub dial_error: String,
    /// Whether the host listener received a connection.
    pub listener_connected: bool,
    /// Whether all of the above show egress denied for the right reason.
    pub denied: bool,
}

pub async fn prove_denied(sb: &dyn Sandbox) -> sandbox::Result<EgressProof> {
    let run = |cmd: Vec<&str>| {
        sb.run(
            Command::from(cmd),
            RunOptions::default().timeout(Duration::from_secs(10)),
        )
    };
    let in_process = sb.backend() == "fake";
    let interfaces = if in_process {
        None
    } else {
        let dev = run(vec!["cat", "/proc/net/dev"]).await?;
        // An unreadable file proves nothing: an empty list must not pass as "only lo".
        Some(if dev.exit_code == 0 {
            parse_interfaces(&dev.stdout_text())
        } else {
            Vec::new()
        })
    };
    let only_loopback = match &interfaces {
        None => true,
        Some(list) => !list.is_empty() && list.iter().all(|i| i == "lo"),
    };

    let host = host_address();
    let listener = TcpListener::bind((IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
        .await
        .map_err(|e| {
            SandboxError::engine("cli", format!("cannot open the host listener: {e}"))
                .with_source(e)
        })?;
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let dialed = format!("{host}:{port}");
    let host_s = host.to_string();
    let port_s = port.to_string();
    let dial = run(vec!["nc", "-w", "2", &host_s, &port_s]).await?;
    let listener_connected = tokio::time::timeout(Duration::from_millis(50), listener.accept())
        .await
        .is_ok();
    let dial_error = dial
        .stderr_text()
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string();
    let lower = dial_error.to_ascii_lowercase();
    let right_reason = lower.contains("unreachable") || lower.contains("bad address");
    let denied = only_loopback
        && dial.exit_code != 0
        && dial.exit_code != 127
        && right_reason
        && !listener_connected
        && !host.is_loopback();
    Ok(EgressProof {
        interfaces,
        dialed,
        dial_exit_code: dial.exit_code,
        dial_error,
        listener_connected,
        denied,
    })
}

/// Interface names from `/proc/net/dev` (lines `  name: counters…` after two headers).
pub fn parse_interfaces(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim().to_string())
        .filter(|n| !n.is_empty() && !n.contains('|') && !n.contains(' '))
        .collect()
}

/// A non-loopback IPv4 address of this host, preferring the Docker/Podman bridge gateways
/// (`docker0`, `podman0`, `cni-podman0`), from `/proc/net/fib_trie` (no traffic sent).
/// Falls back to 127.0.0.1, which makes the proof inconclusive (reported as such).
pub fn host_address() -> IpAddr {
    let locals = std::fs::read_to_string("/proc/net/fib_trie")
        .map(|t| parse_local_addresses(&t))
        .unwrap_or_default();
    let bridges = bridge_addresses();
    locals
        .iter()
        .find(|a| bridges.contains(a))
        .or_else(|| locals.iter().find(|a| !a.is_loopback()))
        .map(|a| IpAddr::V4(*a))
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// `/32 host LOCAL` entries of `/proc/net/fib_trie`.
pub fn parse_local_addresses(fib_trie: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in fib_trie.lines() {
        let t = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(a) = t.parse::<Ipv4Addr>() {
            last = Some(a);
        } else if t.starts_with("/32 host LOCAL")
            && let Some(a) = last
            && !out.contains(&a)
        {
            out.push(a);
        }
    }
    out
}

/// Addresses whose `/proc/net/route` interface is a container bridge (gateway candidates):
/// approximated by the network of each bridge route, matched against local addresses.
fn bridge_addresses() -> Vec<Ipv4Addr> {
    let Ok(routes) = std::fs::read_to_string("/proc/net/route") else {
        return vec![];
    };
    let Ok(trie) = std::fs::read_to_string("/proc/net/fib_trie") else {
        return vec![];
    };
    let locals = parse_local_addresses(&trie);
    let mut out = Vec::new();
    for line in routes.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || !["docker0", "podman0", "cni-podman0"].contains(&f[0]) {
            continue;
        }
        let (Ok(dest), Ok(mask)) = (u32::from_str_radix(f[1], 16), u32::from_str_radix(f[7], 16))
        else {
            continue;
        };
        // /proc/net/route prints the network-order address as a native u32.
        let dest = u32::from(Ipv4Addr::from(dest.to_ne_bytes()));
        let mask = u32::from(Ipv4Addr::from(mask.to_ne_bytes()));
        for a in &locals {
            if u32::from(*a) & mask == dest & mask && !a.is_loopback() {
                out.push(*a);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_from_proc_net_dev() {
        let text = "Inter-|   Receive                            |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes\n    lo:       0       0    0    0    0     0          0         0        0\n";
        assert_eq!(parse_interfaces(text), vec!["lo"]);
    }

    #[test]
    fn local_addresses_from_fib_trie() {
        let t = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 127.0.0.1\n        /32 host LOCAL\n     |-- 172.17.0.0\n        /16 link UNICAST\n     |-- 172.17.0.1\n        /32 host LOCAL\nLocal:\n     |-- 172.17.0.1\n        /32 host LOCAL\n";
        assert_eq!(
            parse_local_addresses(t),
            vec![Ipv4Addr::LOCALHOST, Ipv4Addr::new(172, 17, 0, 1)]
        );
    }
}
