//! The egress decision `nc` applies under the sandbox's network policy — the same
//! semantics as the container engines' allowlist (docs/network.md): a *name* must be
//! listed (exactly, or below a `*.` wildcard) to resolve at all, and then its addresses
//! are reachable; an *address* dialed directly must be inside a listed CIDR, and one in
//! the always-blocked set stays blocked unless an explicit override holds it.

use std::net::IpAddr;

use sandbox_core::{ALWAYS_BLOCKED, Egress, NetworkPolicy};

/// The verdict on one dial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Allowed.
    Allowed,
    /// A name the policy's resolver refuses (it does not resolve: "bad address").
    NameRefused,
    /// An address the rules reject.
    Rejected,
}

/// The verdict on dialing `host` (a name or an IP literal): the tiers most specific
/// first (an exception, the deny list, the allow list, the default), the always-blocked
/// set below them all unless an explicit override holds the address.
pub(crate) fn egress_verdict(policy: &NetworkPolicy, host: &str) -> Verdict {
    match &policy.egress {
        Egress::Deny => Verdict::Rejected,
        Egress::Allow => Verdict::Allowed,
        other => {
            // Entries were validated before they were set; a policy that does not parse
            // allows nothing.
            let Ok(tiers) = other.tiers() else {
                return Verdict::Rejected;
            };
            match host.parse::<IpAddr>() {
                Ok(ip)
                    if policy
                        .override_for(ip, if ip.is_ipv4() { 32 } else { 128 })
                        .is_some() =>
                {
                    Verdict::Allowed
                }
                // Evaluated before the tiers, as the engines' rules do.
                Ok(ip)
                    if ALWAYS_BLOCKED
                        .iter()
                        .any(|b| b.holds(ip, if ip.is_ipv4() { 32 } else { 128 })) =>
                {
                    Verdict::Rejected
                }
                Ok(ip) if tiers.verdict_for_ip(ip).reachable() => Verdict::Allowed,
                Ok(_) => Verdict::Rejected,
                Err(_) if tiers.verdict_for_host(host).reachable() => Verdict::Allowed,
                Err(_) => Verdict::NameRefused,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_listed_and_addresses_inside_a_cidr() {
        let p =
            NetworkPolicy::allow_list(["example.org", "*.wild.test", "10.0.0.0/8", "127.0.0.1"]);
        assert_eq!(egress_verdict(&p, "example.org"), Verdict::Allowed);
        assert_eq!(egress_verdict(&p, "EXAMPLE.org."), Verdict::Allowed);
        assert_eq!(egress_verdict(&p, "a.wild.test"), Verdict::Allowed);
        assert_eq!(egress_verdict(&p, "wild.test"), Verdict::NameRefused);
        assert_eq!(egress_verdict(&p, "10.1.2.3"), Verdict::Allowed);
        assert_eq!(egress_verdict(&p, "127.0.0.1"), Verdict::Allowed);
        assert_eq!(egress_verdict(&p, "11.0.0.1"), Verdict::Rejected);
        // A CIDR grants addresses, not names (the engines' resolver refuses the name).
        assert_eq!(egress_verdict(&p, "localhost"), Verdict::NameRefused);
        assert_eq!(egress_verdict(&p, "evil.org"), Verdict::NameRefused);
        assert_eq!(
            egress_verdict(&NetworkPolicy::deny(), "127.0.0.1"),
            Verdict::Rejected
        );
        assert_eq!(
            egress_verdict(&NetworkPolicy::allow(), "anything"),
            Verdict::Allowed
        );
    }

    #[test]
    fn a_listed_network_leaves_the_blocked_set_blocked() {
        let p = NetworkPolicy::allow_list(["169.0.0.0/8", "fd00::/8"]);
        assert_eq!(egress_verdict(&p, "169.1.2.3"), Verdict::Allowed);
        assert_eq!(egress_verdict(&p, "169.254.169.254"), Verdict::Rejected);
        assert_eq!(egress_verdict(&p, "fd00:ec2::254"), Verdict::Rejected);
        let o = sandbox_core::BlockedSetOverride::network("169.254.169.254").unwrap();
        let p = p.through_blocked_set(o);
        assert_eq!(egress_verdict(&p, "169.254.169.254"), Verdict::Allowed);
        assert_eq!(egress_verdict(&p, "169.254.169.253"), Verdict::Rejected);
    }

    #[test]
    fn tiers_decide_most_specific_first() {
        let r = |s: &str| sandbox_core::EgressRule::parse(s).unwrap();
        let p = NetworkPolicy::tiers(
            sandbox_core::EgressTiers::allow_by_default()
                .deny(r("*.example.com"))
                .except(r("api.example.com")),
        );
        assert_eq!(egress_verdict(&p, "pypi.org"), Verdict::Allowed);
        assert_eq!(egress_verdict(&p, "x.example.com"), Verdict::NameRefused);
        assert_eq!(egress_verdict(&p, "api.example.com"), Verdict::Allowed);
        assert_eq!(egress_verdict(&p, "169.254.169.254"), Verdict::Rejected);
    }
}
