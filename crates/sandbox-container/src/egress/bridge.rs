//! Keeps the egress network's bridge on one MAC address for its whole life.
//!
//! A Linux bridge whose address nobody set takes the lowest MAC of its ports and changes
//! it whenever a port comes or goes. Netavark (Podman 4) creates its bridges that way;
//! Docker sets an address on its own. Every sandbox on the network learned the gateway's
//! MAC when it first sent a packet and keeps it for up to a minute, so when another
//! sandbox starts or ends and the bridge's MAC moves, its packets go to an address the
//! bridge no longer owns: they are flooded to the other sandboxes' ports (and
//! masqueraded there) instead of reaching the host, and a connect stalls for seconds.
//! Measured here under the Podman contract suite: about one run in eight lost an allowed
//! connect this way. Setting the address the bridge already has marks it as chosen
//! (`addr_assign_type` 3), after which the kernel never recalculates it; the sandboxes
//! already on the network see no change.

use std::collections::HashMap;
use std::net::IpAddr;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

/// Longest one `ip` call may take.
const IP_TIMEOUT: Duration = Duration::from_secs(10);

/// `addr_assign_type` of an address someone set (`NET_ADDR_SET`).
const NET_ADDR_SET: &str = "3";

/// Gateway → name of the host interface that held it last time (the bridge is deleted
/// and recreated under the same name when its last sandbox ends).
fn names() -> &'static Mutex<HashMap<IpAddr, String>> {
    static N: std::sync::OnceLock<Mutex<HashMap<IpAddr, String>>> = std::sync::OnceLock::new();
    N.get_or_init(Mutex::default)
}

/// Runs `ip ARGS` on the host; its stdout, or a message naming the command.
pub(super) async fn ip(args: &[&str]) -> Result<String, String> {
    let run = tokio::process::Command::new(super::host::ip_path())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(IP_TIMEOUT, run)
        .await
        .map_err(|_| {
            format!(
                "`ip {}` did not finish within {IP_TIMEOUT:?}",
                args.join(" ")
            )
        })?
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .chars()
                .take(500)
                .collect::<String>()
                .trim()
        ))
    }
}

fn sys(ifname: &str, attr: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/{attr}"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The interface named on the first line of `ip -o addr show to ADDR/32` (`7: podman1
/// inet 10.89.0.1/24 …`), if any.
fn first_interface(listing: &str) -> Option<String> {
    let name = listing.lines().next()?.split_whitespace().nth(1)?;
    // `ip` prints `name@peer` for some links; the peer is not part of the name.
    let name = name.split('@').next()?.trim_end_matches(':');
    (!name.is_empty() && !name.contains('/')).then(|| name.to_string())
}

async fn interface_of(gateway: IpAddr) -> Result<Option<String>, String> {
    let cached = names()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&gateway)
        .cloned();
    if let Some(name) = cached
        && sys(&name, "address").is_some()
    {
        return Ok(Some(name));
    }
    let prefix = if gateway.is_ipv4() { 32 } else { 128 };
    let listing = ip(&["-o", "addr", "show", "to", &format!("{gateway}/{prefix}")]).await?;
    let found = first_interface(&listing);
    if let Some(name) = &found {
        names()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(gateway, name.clone());
    }
    Ok(found)
}

/// Makes the bridge holding `gateway` on this host keep its current MAC from now on.
/// Nothing to do when the address is on no host interface (the engine's network lives
/// elsewhere), the interface is not a bridge, or its address was already chosen.
/// Returns the interface it pinned, if it had to.
pub(crate) async fn pin_mac(gateway: IpAddr) -> Result<Option<String>, String> {
    let Some(name) = interface_of(gateway).await? else {
        return Ok(None);
    };
    if sys(&name, "bridge/bridge_id").is_none()
        || sys(&name, "addr_assign_type").as_deref() == Some(NET_ADDR_SET)
    {
        return Ok(None);
    }
    let mac = sys(&name, "address").ok_or_else(|| format!("{name} has no MAC address"))?;
    ip(&["link", "set", "dev", &name, "address", &mac]).await?;
    match sys(&name, "addr_assign_type") {
        Some(t) if t == NET_ADDR_SET => Ok(Some(name)),
        other => Err(format!(
            "the MAC address of {name} is still not fixed after setting it (addr_assign_type {other:?})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interface_comes_from_the_first_listing_line() {
        let l = "7: podman1    inet 10.89.0.1/24 brd 10.89.0.255 scope global podman1\\       valid_lft forever preferred_lft forever\n";
        assert_eq!(first_interface(l).as_deref(), Some("podman1"));
        assert_eq!(
            first_interface("12: br-1a2b@if3    inet 172.18.0.1/16").as_deref(),
            Some("br-1a2b")
        );
        assert_eq!(first_interface(""), None);
    }
}
