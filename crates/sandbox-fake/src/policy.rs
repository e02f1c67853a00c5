//! The policy in effect, as seen from inside a fake sandbox: pseudo-files synthesized from
//! it (`/proc/1/status`, `/proc/net/dev`, cgroup limits) and the egress decision `nc`
//! applies.

use std::net::IpAddr;

use sandbox_core::{Egress, NetworkPolicy};

use crate::memfs::Pseudo;
use crate::sandbox::SandboxInner;

/// Content of a pseudo-file for this sandbox.
pub(crate) fn pseudo_content(p: Pseudo, sb: &SandboxInner) -> String {
    let r = &sb.resources;
    match p {
        Pseudo::ProcStatus => format!(
            "Name:\tinit\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t1\nPid:\t1\nPPid:\t0\n\
             Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n\
             CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
             CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n\
             Seccomp:\t2\nSeccomp_filters:\t1\n",
            uid = sb.uid
        ),
        Pseudo::NetDev => {
            let mut s = String::from(
                "Inter-|   Receive                                                |  Transmit\n \
                 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n",
            );
            for iface in interfaces(&sb.policy) {
                s.push_str(&format!(
                    "{iface:>6}:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n"
                ));
            }
            s
        }
        Pseudo::MemoryMax => format!("{}\n", r.memory_mb * 1024 * 1024),
        Pseudo::SwapMax => "0\n".to_string(),
        Pseudo::PidsMax => format!("{}\n", r.pids),
        Pseudo::CpuMax => format!("{} 100000\n", (r.cpu * 100_000.0).round() as u64),
        Pseudo::Hostname => format!("{}\n", sb.hostname()),
    }
}

/// Network interfaces a sandbox has: only loopback when egress is denied.
pub(crate) fn interfaces(policy: &NetworkPolicy) -> Vec<&'static str> {
    match policy.egress {
        Egress::Deny => vec!["lo"],
        _ => vec!["lo", "eth0"],
    }
}

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

    #[test]
    fn interfaces_follow_egress() {
        assert_eq!(interfaces(&NetworkPolicy::deny()), ["lo"]);
        assert_eq!(interfaces(&NetworkPolicy::allow()), ["lo", "eth0"]);
    }
}
