//! The egress decision `nc` applies under the sandbox's network policy — the same
//! semantics as the container engines' allowlist (docs/network.md): a *name* must be
//! listed (exactly, or below a `*.` wildcard) to resolve at all, and then its addresses
//! are reachable; an *address* dialed directly must be inside a listed CIDR, and one in
//! the always-blocked set stays blocked unless an explicit override holds it. Granted host
//! ports are reachable at `host.sandbox.internal` and at the host's address, on those
//! ports only.

use std::net::{IpAddr, Ipv4Addr};

use sandbox_core::{ALWAYS_BLOCKED, Egress, HOST_SANDBOX_NAME, NetworkPolicy};

/// The host's address on a fake sandbox's network: the fake's sandboxes run on this
/// machine, so the host's services are reached through its loopback.
pub(crate) const HOST_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The verdict on dialing `host` at TCP `port`: a granted host port at
/// `host.sandbox.internal` or the host's address is reachable; that name resolves only
/// while a port is granted, and reaches no other port; everything else is
/// [`egress_verdict`]'s.
pub(crate) fn dial_verdict(policy: &NetworkPolicy, host: &str, port: u16) -> Verdict {
    let ports = policy.egress.host_ports();
    let granted = ports.iter().any(|p| p.get() == port);
    if host
        .trim_end_matches('.')
        .eq_ignore_ascii_case(HOST_SANDBOX_NAME)
    {
        return match (ports.is_empty(), granted) {
            (true, _) => Verdict::NameRefused,
            (false, true) => Verdict::Allowed,
            (false, false) => Verdict::Rejected,
        };
    }
    if granted && host.parse::<IpAddr>() == Ok(HOST_ADDRESS) {
        return Verdict::Allowed;
    }
    egress_verdict(policy, host)
}

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
    fn a_host_port_opens_that_port_of_the_host_only() {
        let port = sandbox_core::HostPort::new(8080).unwrap();
        let p = NetworkPolicy::deny().host_port(port);
        assert_eq!(dial_verdict(&p, HOST_SANDBOX_NAME, 8080), Verdict::Allowed);
        assert_eq!(dial_verdict(&p, "127.0.0.1", 8080), Verdict::Allowed);
        assert_eq!(dial_verdict(&p, HOST_SANDBOX_NAME, 8081), Verdict::Rejected);
        assert_eq!(dial_verdict(&p, "127.0.0.1", 8081), Verdict::Rejected);
        assert_eq!(dial_verdict(&p, "172.17.0.1", 8080), Verdict::Rejected);
        assert_eq!(dial_verdict(&p, "169.254.169.254", 8080), Verdict::Rejected);
        let none = NetworkPolicy::tiers(sandbox_core::EgressTiers::deny_by_default());
        assert_eq!(
            dial_verdict(&none, HOST_SANDBOX_NAME, 8080),
            Verdict::NameRefused
        );
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
