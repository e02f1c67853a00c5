//! The host's own addresses, blocked under every egress policy.
//!
//! A service the host runs on all of its addresses (`0.0.0.0`) answers on its LAN
//! address as well as on its bridge addresses; blocking only the engine networks would
//! leave it reachable from a sandbox with egress `Allow`. So every address the host holds
//! when a sandbox starts joins the always-blocked set (a listed CIDR that contains one
//! leaves it blocked; only an explicit `BlockedSetOverride` opens it). Loopback needs
//! nothing: a sandbox's 127.0.0.1 is its own namespace's.

use std::net::IpAddr;

use super::Cidr;

/// Every non-loopback address of this host, as `ip -o addr show` lists them, each as a
/// host route (/32 or /128).
pub(crate) async fn addresses() -> Result<Vec<Cidr>, String> {
    let listing = super::bridge::ip(&["-o", "addr", "show"]).await?;
    Ok(parse(&listing))
}

/// The addresses of an `ip -o addr show` listing (`4: eth0    inet 192.0.2.2/24 brd …`).
fn parse(listing: &str) -> Vec<Cidr> {
    let mut out: Vec<Cidr> = Vec::new();
    for line in listing.lines() {
        let mut words = line
            .split_whitespace()
            .skip_while(|w| *w != "inet" && *w != "inet6");
        let (Some(_), Some(addr)) = (words.next(), words.next()) else {
            continue;
        };
        let Some(ip) = addr
            .split('/')
            .next()
            .and_then(|a| a.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let c = Cidr::new(ip, if ip.is_ipv4() { 32 } else { 128 });
        if !ip.is_loopback() && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_address_but_loopback_is_listed() {
        let listing = "\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever
4: eth0    inet6 fd00::2/64 scope global nodad \\       valid_lft forever preferred_lft forever
5: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft
7: weird    inet garbage/24 scope global
";
        let got: Vec<String> = parse(listing).iter().map(Cidr::to_string).collect();
        assert_eq!(got, ["192.0.2.2/32", "fd00::2/128", "172.17.0.1/32"]);
    }
}
