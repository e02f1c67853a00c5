//! Network policy: egress deny by default, ingress ports published only when asked.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::{Result, SandboxError};

/// What outbound traffic a sandbox may send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Egress {
    /// No network at all (only loopback). The default.
    #[default]
    Deny,
    /// Unrestricted outbound traffic.
    Allow,
    /// Only these hostnames or CIDRs (needs `EGRESS_ALLOWLIST`). Each entry must parse as
    /// an [`EgressRule`]; [`NetworkPolicy::validate`] (run before anything is provisioned)
    /// refuses one that does not, and [`Egress::rules`] gives adapters the parsed form.
    AllowList(Vec<String>),
}

impl Egress {
    /// The allowlist entries parsed (empty for `Deny` and `Allow`). The first entry that
    /// is not a hostname, wildcard or CIDR is a `Configuration` error.
    pub fn rules(&self) -> Result<Vec<EgressRule>> {
        match self {
            Egress::AllowList(entries) => entries.iter().map(|e| e.parse()).collect(),
            Egress::Deny | Egress::Allow => Ok(Vec::new()),
        }
    }
}

/// What one allowlist entry names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EgressTarget {
    /// One host name, lower-cased, without a trailing dot (`pypi.org`).
    Host(String),
    /// Every host strictly below a domain (`*.example.com` → `example.com`).
    Subdomains(String),
    /// An IP network; a bare address is a /32 or /128.
    Network {
        /// The network address (host bits zero).
        addr: IpAddr,
        /// Prefix length (≤ 32 for IPv4, ≤ 128 for IPv6).
        prefix: u8,
    },
}

/// One parsed egress allowlist entry: a hostname, a `*.` wildcard or an IPv4/IPv6 CIDR.
///
/// Refused (as `Configuration` errors): empty entries, whitespace, empty labels (`a..b`,
/// `.a`), labels over 63 or names over 253 characters, characters outside `[a-z0-9-]`,
/// labels starting or ending with `-`, an all-numeric last label (`10.0.0.999` is not a
/// host), a wildcard anywhere but as the whole first label, a prefix longer than the
/// address (`10.0.0.0/99`), and a network with host bits set (`10.0.0.1/8`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EgressRule {
    target: EgressTarget,
    text: String,
}

impl EgressRule {
    /// Parses one entry.
    pub fn parse(entry: &str) -> Result<Self> {
        let target = parse_target(entry).map_err(|why| {
            SandboxError::config(
                format!("allowlist entry {entry:?} is not a hostname or CIDR: {why}"),
                "use hostnames like `pypi.org`, wildcards like `*.example.com`, or CIDRs like `10.0.0.0/8` / `fd00::/8`",
            )
        })?;
        let text = match &target {
            EgressTarget::Host(h) => h.clone(),
            EgressTarget::Subdomains(d) => format!("*.{d}"),
            EgressTarget::Network { addr, prefix } => format!("{addr}/{prefix}"),
        };
        Ok(EgressRule { target, text })
    }

    /// What the entry names.
    pub fn target(&self) -> &EgressTarget {
        &self.target
    }

    /// The canonical form (`pypi.org`, `*.example.com`, `10.0.0.0/8`).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `host` (a name, compared case-insensitively) is allowed by this entry.
    pub fn matches_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        match &self.target {
            EgressTarget::Host(h) => *h == host,
            EgressTarget::Subdomains(d) => host
                .strip_suffix(d.as_str())
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
            EgressTarget::Network { .. } => {
                host.parse::<IpAddr>().is_ok_and(|ip| self.matches_ip(ip))
            }
        }
    }

    /// Whether the address `ip` is inside this entry's network.
    pub fn matches_ip(&self, ip: IpAddr) -> bool {
        let EgressTarget::Network { addr, prefix } = self.target else {
            return false;
        };
        match (addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(i) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(i) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for EgressRule {
    type Err = SandboxError;
    fn from_str(s: &str) -> Result<Self> {
        EgressRule::parse(s)
    }
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn parse_target(entry: &str) -> std::result::Result<EgressTarget, String> {
    if entry.is_empty() {
        return Err("empty".into());
    }
    if entry.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains whitespace or control characters".into());
    }
    if let Some((addr, prefix)) = entry.split_once('/') {
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("`{addr}` is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("prefix `/{prefix}` is not in 0..={max}"))?;
        let host_bits_clear = match addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                u32::from(v4) & !mask == 0
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                u128::from(v6) & !mask == 0
            }
        };
        if !host_bits_clear {
            return Err(format!("host bits are set below /{prefix}"));
        }
        return Ok(EgressTarget::Network { addr, prefix });
    }
    if let Ok(addr) = entry.parse::<IpAddr>() {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        return Ok(EgressTarget::Network { addr, prefix });
    }
    let lower = entry.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    let (wildcard, name) = match name.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, name),
    };
    if name.len() > 253 {
        return Err("longer than 253 characters".into());
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() {
            return Err("empty label".into());
        }
        if label.len() > 63 {
            return Err("a label is longer than 63 characters".into());
        }
        if !label
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(format!(
                "label `{label}` has characters outside [a-z0-9-] (a wildcard is only `*.` in front)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label `{label}` starts or ends with `-`"));
        }
    }
    if labels
        .last()
        .is_some_and(|l| l.chars().all(|c| c.is_ascii_digit()))
    {
        return Err("the last label is all digits (not a host name, not an IP)".into());
    }
    if wildcard {
        if labels.len() < 2 {
            return Err(
                "a wildcard needs a domain of at least two labels (`*.example.com`)".into(),
            );
        }
        return Ok(EgressTarget::Subdomains(name.to_string()));
    }
    Ok(EgressTarget::Host(name.to_string()))
}

/// Network policy of a sandbox. Default: deny all egress, no ingress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default)
)]
#[non_exhaustive]
pub struct NetworkPolicy {
    /// Outbound policy.
    pub egress: Egress,
    /// Container ports to publish on the host's loopback (needs `INGRESS_PORTS`).
    pub ingress_ports: Vec<u16>,
}

impl NetworkPolicy {
    /// Deny all egress (the default).
    pub fn deny() -> Self {
        Self::default()
    }
    /// Allow all egress.
    pub fn allow() -> Self {
        NetworkPolicy {
            egress: Egress::Allow,
            ingress_ports: vec![],
        }
    }
    /// Allow only the given hosts / CIDRs.
    pub fn allow_list<I, S>(hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        NetworkPolicy {
            egress: Egress::AllowList(hosts.into_iter().map(Into::into).collect()),
            ingress_ports: vec![],
        }
    }
    /// Adds a port to publish on the host's loopback.
    pub fn ingress_port(mut self, port: u16) -> Self {
        self.ingress_ports.push(port);
        self
    }

    /// Validates ports and allowlist entries. A port listed twice is refused: it would be
    /// published twice, or silently once, depending on the engine.
    pub fn validate(&self) -> Result<()> {
        let mut seen = std::collections::BTreeSet::new();
        for p in &self.ingress_ports {
            if *p == 0 {
                return Err(SandboxError::config(
                    "ingress port 0 is not a port",
                    "publish ports in 1..=65535",
                ));
            }
            if !seen.insert(*p) {
                return Err(SandboxError::config(
                    format!("ingress port {p} is listed twice"),
                    "list each container port once in NetworkPolicy::ingress_ports",
                ));
            }
        }
        self.egress.rules()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    fn refused(entry: &str) {
        let e = EgressRule::parse(entry).expect_err(entry);
        assert_eq!(e.code(), ErrorCode::Configuration, "{entry}");
    }

    #[test]
    fn zero_and_repeated_ingress_ports_are_refused() {
        assert!(
            NetworkPolicy::deny()
                .ingress_port(80)
                .ingress_port(8080)
                .validate()
                .is_ok()
        );
        for bad in [
            NetworkPolicy::deny().ingress_port(0),
            NetworkPolicy::allow().ingress_port(80).ingress_port(80),
        ] {
            let e = bad.validate().unwrap_err();
            assert_eq!(e.code(), ErrorCode::Configuration, "{bad:?}");
        }
    }

    #[test]
    fn bad_entries_are_configuration_errors() {
        let long_label = format!("{}.com", "a".repeat(64));
        let long_name = format!("{}.com", ["abcdefghij"; 25].join("."));
        for bad in [
            "",
            " ",
            "a b.com",
            "..",
            "a..b",
            ".example.com",
            "10.0.0.0/99",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "::/129",
            "10.0.0.1/8",
            "10.0.0.999",
            "300.1.1.1",
            "exa_mple.com",
            "-a.com",
            "a-.com",
            "a.*.com",
            "*",
            "*.com",
            "example.com/8",
            &long_label,
            &long_name,
        ] {
            refused(bad);
        }
        let policy = NetworkPolicy::allow_list(["pypi.org", "10.0.0.0/99"]);
        assert_eq!(
            policy.validate().unwrap_err().code(),
            ErrorCode::Configuration
        );
    }

    #[test]
    fn hosts_wildcards_and_networks_parse() {
        let r = EgressRule::parse("PyPI.org.").unwrap();
        assert_eq!(r.target(), &EgressTarget::Host("pypi.org".into()));
        assert!(r.matches_host("pypi.org") && !r.matches_host("x.pypi.org"));
        let w = EgressRule::parse("*.example.com").unwrap();
        assert_eq!(w.as_str(), "*.example.com");
        assert!(w.matches_host("a.example.com") && w.matches_host("A.B.Example.com"));
        assert!(!w.matches_host("example.com") && !w.matches_host("badexample.com"));
        let n = EgressRule::parse("10.0.0.0/8").unwrap();
        assert!(n.matches_ip("10.200.1.1".parse().unwrap()));
        assert!(!n.matches_ip("11.0.0.1".parse().unwrap()));
        assert!(n.matches_host("10.1.2.3"));
        let six = EgressRule::parse("fd00::/8").unwrap();
        assert!(six.matches_ip("fd12::1".parse().unwrap()));
        assert!(!six.matches_ip("10.0.0.1".parse().unwrap()));
        let one = EgressRule::parse("192.0.2.1").unwrap();
        assert_eq!(one.to_string(), "192.0.2.1/32");
        assert!(one.matches_ip("192.0.2.1".parse().unwrap()));
        assert!(!one.matches_ip("192.0.2.2".parse().unwrap()));
        let all = EgressRule::parse("0.0.0.0/0").unwrap();
        assert!(all.matches_ip("8.8.8.8".parse().unwrap()));
        assert_eq!(EgressRule::parse("::1").unwrap().as_str(), "::1/128");
        let max_label = format!("{}.com", "a".repeat(63));
        assert!(EgressRule::parse(&max_label).is_ok());
        let rules = Egress::AllowList(vec!["a.org".into(), "10.0.0.0/8".into()])
            .rules()
            .unwrap();
        assert_eq!(rules.len(), 2);
    }
}
