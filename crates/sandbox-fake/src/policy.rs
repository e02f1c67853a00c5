//! The egress decision `nc` applies under the sandbox's network policy.

use std::net::IpAddr;

use sandbox_core::{Egress, NetworkPolicy};

/// Whether egress to `host` (a name or an IP) is allowed, given the addresses it resolved
/// to (empty when not resolved).
pub(crate) fn egress_allowed(policy: &NetworkPolicy, host: &str, addrs: &[IpAddr]) -> bool {
    match &policy.egress {
        Egress::Deny => false,
        Egress::Allow => true,
        Egress::AllowList(list) => list.iter().any(|entry| {
            entry.eq_ignore_ascii_case(host)
                || addrs.iter().any(|ip| entry_matches_ip(entry, *ip))
                || host
                    .parse::<IpAddr>()
                    .is_ok_and(|ip| entry_matches_ip(entry, ip))
        }),
        // `Egress` is non-exhaustive: an unknown policy allows nothing.
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// `entry` is an IP (`10.0.0.1`) or a CIDR (`10.0.0.0/8`, `fd00::/8`) containing `ip`.
fn entry_matches_ip(entry: &str, ip: IpAddr) -> bool {
    let (addr, bits) = match entry.split_once('/') {
        Some((a, b)) => match b.parse::<u32>() {
            Ok(bits) => (a, Some(bits)),
            Err(_) => return false,
        },
        None => (entry, None),
    };
    let Ok(net) = addr.parse::<IpAddr>() else {
        return false;
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let bits = bits.unwrap_or(32).min(32);
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let bits = bits.unwrap_or(128).min(128);
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_by_host_ip_and_cidr() {
        let p = NetworkPolicy::allow_list(["example.org", "10.0.0.0/8", "127.0.0.1"]);
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(egress_allowed(&p, "example.org", &[]));
        assert!(egress_allowed(&p, "10.1.2.3", &[]));
        assert!(egress_allowed(&p, "localhost", &[lo]));
        assert!(!egress_allowed(&p, "11.0.0.1", &[]));
        assert!(!egress_allowed(
            &p,
            "evil.org",
            &["11.0.0.1".parse().unwrap()]
        ));
        assert!(!egress_allowed(&NetworkPolicy::deny(), "127.0.0.1", &[lo]));
        assert!(egress_allowed(&NetworkPolicy::allow(), "anything", &[]));
        assert!(entry_matches_ip("0.0.0.0/0", lo));
        assert!(entry_matches_ip("::1/128", "::1".parse().unwrap()));
    }
}
