//! Network policy: egress deny by default, ingress ports published only when asked.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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
    /// Tiers, most specific first: exceptions, then the deny list, then the allow list,
    /// then the default (needs `EGRESS_ALLOWLIST`). See [`EgressTiers`].
    Tiers(EgressTiers),
}

impl Egress {
    /// The allow entries parsed: an allowlist's entries, the allow tier of `Tiers`, empty
    /// for `Deny` and `Allow`. The first entry that is not a hostname, wildcard or CIDR is
    /// a `Configuration` error.
    pub fn rules(&self) -> Result<Vec<EgressRule>> {
        match self {
            Egress::AllowList(entries) => entries.iter().map(|e| e.parse()).collect(),
            Egress::Tiers(t) => Ok(t.allow.clone()),
            Egress::Deny | Egress::Allow => Ok(Vec::new()),
        }
    }

    /// The policy as tiers: `Deny` is a default of deny with nothing listed, `Allow` a
    /// default of allow with nothing listed, an allowlist the allow tier over a default of
    /// deny. A `Configuration` error for an allowlist entry that does not parse.
    pub fn tiers(&self) -> Result<EgressTiers> {
        Ok(match self {
            Egress::Deny => EgressTiers::deny_by_default(),
            Egress::Allow => EgressTiers::allow_by_default(),
            Egress::AllowList(_) => EgressTiers {
                allow: self.rules()?,
                ..EgressTiers::deny_by_default()
            },
            Egress::Tiers(t) => t.clone(),
        })
    }

    /// The host ports the policy grants (only tiers grant any).
    pub fn host_ports(&self) -> &[HostPort] {
        match self {
            Egress::Tiers(t) => &t.host_ports,
            _ => &[],
        }
    }

    /// The policy with the host's TCP port `port` granted as well: `Deny`, `Allow` and an
    /// allowlist become the tiers they stand for, plus the port. (A sandbox needs a
    /// network for it: from `Deny` this is a default of deny where the host port is the
    /// only way out.)
    pub fn with_host_port(self, port: HostPort) -> Result<Egress> {
        Ok(Egress::Tiers(self.tiers()?.host_port(port)))
    }

    /// Whether the policy names hosts or networks or grants host ports (an allowlist, or
    /// tiers with an entry): enforcing it needs `EGRESS_ALLOWLIST`.
    pub fn lists_entries(&self) -> bool {
        match self {
            Egress::Deny | Egress::Allow => false,
            Egress::AllowList(_) => true,
            Egress::Tiers(t) => !t.is_empty(),
        }
    }
}

impl fmt::Display for Egress {
    /// `deny`, `allow`, `allow-list a,b`, or the tiers (`default deny; allow a,b; deny c;
    /// except d`): the form audit records and listings show.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Egress::Deny => f.write_str("deny"),
            Egress::Allow => f.write_str("allow"),
            Egress::AllowList(e) => write!(f, "allow-list {}", e.join(",")),
            Egress::Tiers(t) => t.fmt(f),
        }
    }
}

/// What a destination that no tier names gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum EgressDefault {
    /// Rejected (the default).
    #[default]
    Deny,
    /// Reached, except the always-blocked set.
    Allow,
}

/// Which tier of an [`EgressTiers`] decides for a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TierVerdict {
    /// An exception names it: reachable, whatever the deny list says.
    Exception,
    /// The deny list names it (and no exception does): rejected.
    Denied,
    /// The allow list names it (and no deny entry does): reachable.
    Allowed,
    /// No tier names it: the default decides.
    Default(EgressDefault),
}

impl TierVerdict {
    /// Whether the destination is reachable (the always-blocked set aside, which no tier
    /// opens).
    pub fn reachable(self) -> bool {
        matches!(
            self,
            TierVerdict::Exception
                | TierVerdict::Allowed
                | TierVerdict::Default(EgressDefault::Allow)
        )
    }
}

/// Egress tiers, evaluated most specific first: an **exception** overrides the deny list;
/// the **deny** list (hosts, `*.` wildcards, CIDRs) overrides the allow list; the
/// **allow** list; then the **default**. Below all of them sits the always-blocked set
/// (link-local and metadata, the host's own addresses, the engine's networks), which no
/// entry of any tier opens.
///
/// "Everything except these": [`EgressTiers::allow_by_default`] with deny entries. "This
/// domain but not that host under it": allow `*.example.com`, deny `build.example.com`.
/// "Not this network, but that host in it": deny `10.0.0.0/8`, except `10.1.2.3`.
///
/// A name is judged by its name (the library's resolver answers it or says NXDOMAIN, and
/// pins the addresses it answers into the tier that granted it); an address by the CIDR
/// entries. A denied name therefore does not resolve inside, but a workload that knows
/// its address by other means reaches it under a default of allow unless a CIDR denies
/// that address too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default)
)]
#[non_exhaustive]
pub struct EgressTiers {
    /// Exceptions: reachable although a deny entry covers them.
    pub except: Vec<EgressRule>,
    /// Denied, although the allow list or the default would let them through.
    pub deny: Vec<EgressRule>,
    /// Allowed when no deny entry covers them.
    pub allow: Vec<EgressRule>,
    /// What the rest gets.
    pub default: EgressDefault,
    /// TCP ports of services on the host, reachable at [`HOST_SANDBOX_NAME`] (the host's
    /// address on the sandbox's network) and nowhere else: no other port of the host,
    /// none of its other addresses, nothing else of the always-blocked set. Needs
    /// `HOST_PORTS`. Part of the policy, so a live change replaces them with the rest.
    pub host_ports: Vec<HostPort>,
}

/// The name a sandbox reaches its granted host ports at (resolved inside the sandbox to
/// the host's address on its network, only while the policy grants a host port).
pub const HOST_SANDBOX_NAME: &str = "host.sandbox.internal";

/// The most host ports one policy may grant: each is a service of the host's opened to
/// hostile code, and a list past this is a range, which is what no rule should open.
pub const MAX_HOST_PORTS: usize = 16;

/// One TCP port of a service on the host a sandbox may reach (1..=65535; see
/// [`EgressTiers::host_ports`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPort(std::num::NonZeroU16);

impl HostPort {
    /// The port `port`; 0 is a `Configuration` error.
    pub fn new(port: u16) -> Result<Self> {
        std::num::NonZeroU16::new(port)
            .map(HostPort)
            .ok_or_else(|| {
                SandboxError::config("host port 0 is not a port", "grant host ports in 1..=65535")
            })
    }

    /// The port number.
    pub fn get(self) -> u16 {
        self.0.get()
    }
}

impl TryFrom<u16> for HostPort {
    type Error = SandboxError;
    fn try_from(port: u16) -> Result<Self> {
        HostPort::new(port)
    }
}

impl FromStr for HostPort {
    type Err = SandboxError;
    fn from_str(s: &str) -> Result<Self> {
        let port: u16 = s.parse().map_err(|_| {
            SandboxError::config(
                format!("host port {s:?} is not a port number"),
                "grant host ports in 1..=65535",
            )
        })?;
        HostPort::new(port)
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A host port serialises as its number and deserialises through [`HostPort::new`], so
/// no serialized policy carries port 0.
#[cfg(feature = "serde")]
impl serde::Serialize for HostPort {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u16(self.get())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for HostPort {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let port = u16::deserialize(d)?;
        HostPort::new(port).map_err(|e| serde::de::Error::custom(e.to_string()))
    }
}

impl EgressTiers {
    /// Nothing listed, everything rejected: the start of an allowlist.
    pub fn deny_by_default() -> Self {
        Self::default()
    }

    /// Nothing listed, everything reachable but the always-blocked set: the start of
    /// "everything except these".
    pub fn allow_by_default() -> Self {
        EgressTiers {
            default: EgressDefault::Allow,
            ..Self::default()
        }
    }

    /// Adds an allow entry.
    pub fn allow(mut self, rule: EgressRule) -> Self {
        self.allow.push(rule);
        self
    }

    /// Adds a deny entry.
    pub fn deny(mut self, rule: EgressRule) -> Self {
        self.deny.push(rule);
        self
    }

    /// Adds an exception (overrides the deny list).
    pub fn except(mut self, rule: EgressRule) -> Self {
        self.except.push(rule);
        self
    }

    /// Grants the host's TCP port `port` (at [`HOST_SANDBOX_NAME`]); a port granted
    /// already is not listed twice.
    pub fn host_port(mut self, port: HostPort) -> Self {
        if !self.host_ports.contains(&port) {
            self.host_ports.push(port);
        }
        self
    }

    /// Whether no tier lists anything and no host port is granted.
    pub fn is_empty(&self) -> bool {
        self.except.is_empty()
            && self.deny.is_empty()
            && self.allow.is_empty()
            && self.host_ports.is_empty()
    }

    /// Every entry of every tier.
    pub fn entries(&self) -> impl Iterator<Item = &EgressRule> {
        self.except.iter().chain(&self.deny).chain(&self.allow)
    }

    /// The tier that decides for the host name `host`.
    pub fn verdict_for_host(&self, host: &str) -> TierVerdict {
        let any = |list: &[EgressRule]| list.iter().any(|r| r.matches_host(host));
        self.first_match(any)
    }

    /// The tier that decides for the address `ip`.
    pub fn verdict_for_ip(&self, ip: IpAddr) -> TierVerdict {
        let any = |list: &[EgressRule]| list.iter().any(|r| r.matches_ip(ip));
        self.first_match(any)
    }

    fn first_match(&self, any: impl Fn(&[EgressRule]) -> bool) -> TierVerdict {
        if any(&self.except) {
            TierVerdict::Exception
        } else if any(&self.deny) {
            TierVerdict::Denied
        } else if any(&self.allow) {
            TierVerdict::Allowed
        } else {
            TierVerdict::Default(self.default)
        }
    }
}

impl fmt::Display for EgressTiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |l: &[EgressRule]| {
            l.iter()
                .map(EgressRule::as_str)
                .collect::<Vec<_>>()
                .join(",")
        };
        match self.default {
            EgressDefault::Deny => f.write_str("default deny")?,
            EgressDefault::Allow => f.write_str("default allow")?,
        }
        for (name, list) in [
            ("allow", &self.allow),
            ("deny", &self.deny),
            ("except", &self.except),
        ] {
            if !list.is_empty() {
                write!(f, "; {name} {}", join(list))?;
            }
        }
        if !self.host_ports.is_empty() {
            let ports: Vec<String> = self.host_ports.iter().map(ToString::to_string).collect();
            write!(f, "; host-ports {}", ports.join(","))?;
        }
        Ok(())
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
            // The labels in front of the domain are the sandbox's choice and reach the
            // host's resolver: only host-name labels pass, so no byte a resolver might
            // treat specially (NUL, `%`, spaces, `_`) ever leaves the sandbox that way.
            EgressTarget::Subdomains(d) => host
                .strip_suffix(d.as_str())
                .and_then(|rest| rest.strip_suffix('.'))
                .is_some_and(|labels| labels.split('.').all(host_label_check)),
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

/// An entry serialises as its canonical text and deserialises through
/// [`EgressRule::parse`], so no serialized policy carries an entry that does not parse.
#[cfg(feature = "serde")]
impl serde::Serialize for EgressRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for EgressRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        EgressRule::parse(&text).map_err(|e| serde::de::Error::custom(e.to_string()))
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
        host_label(label)?;
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

/// Checks one host-name label (lowercase): 1 to 63 characters of `[a-z0-9-]`, not starting
/// or ending with `-`.
fn host_label(label: &str) -> std::result::Result<(), String> {
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
    Ok(())
}

/// Whether `label` is a host-name label ([`host_label`]).
fn host_label_check(label: &str) -> bool {
    host_label(label).is_ok()
}

/// A network every sandbox with egress is kept from, whatever its policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockedNetwork {
    /// The network address (host bits zero).
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// What lives there, for error messages.
    pub what: &'static str,
}

impl BlockedNetwork {
    /// Whether every address of `addr/prefix` is in this network.
    pub fn holds(&self, addr: IpAddr, prefix: u8) -> bool {
        prefix >= self.prefix && same_network(self.addr, addr, self.prefix)
    }
}

impl fmt::Display for BlockedNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

const fn blocked(addr: IpAddr, prefix: u8, what: &'static str) -> BlockedNetwork {
    BlockedNetwork { addr, prefix, what }
}

/// The statically known part of the always-blocked set: engines that load egress rules
/// reject these under `Allow` and `AllowList` alike, ahead of any allowlist rule, and
/// [`NetworkPolicy::validate`] refuses an allowlist network that lies inside one. (The rest of the set, the host's own
/// addresses and the engine's networks, is only known where the engine runs.)
pub const ALWAYS_BLOCKED: &[BlockedNetwork] = &[
    blocked(
        IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)),
        16,
        "IPv4 link-local, where clouds serve instance metadata and credentials (169.254.169.254)",
    ),
    blocked(
        IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)),
        10,
        "IPv6 link-local",
    ),
    blocked(
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
        128,
        "the AWS IPv6 instance metadata service",
    ),
    blocked(
        IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
        32,
        "the Alibaba Cloud instance metadata service",
    ),
];

/// Addresses that are no destination a sandbox could mean: an allowlist network inside
/// one is refused. They need no rule (traffic to them never leaves the sandbox's own
/// namespace, or leaves as IPv4), so they are not part of [`ALWAYS_BLOCKED`].
const NOT_DESTINATIONS: &[BlockedNetwork] = &[
    blocked(
        IpAddr::V4(Ipv4Addr::new(0, 0, 0, 0)),
        8,
        "the unspecified address and \"this network\" (a connect there reaches the sandbox itself)",
    ),
    blocked(
        IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0)),
        128,
        "the unspecified address (a connect there reaches the sandbox itself)",
    ),
    blocked(
        IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0)),
        96,
        "IPv4-mapped IPv6 addresses (their packets leave as IPv4, judged by the IPv4 rules)",
    ),
];

/// The shortest prefix an allowlist network may have, IPv4 and IPv6 alike. A /8 is the
/// widest range one owner holds as a whole (`10.0.0.0/8`; `fd00::/8`, IPv6's unique local
/// addresses): anything wider spans unrelated owners' address space and means "most of
/// the internet", which is what egress `Allow` is for (and `Allow` keeps the blocked
/// set).
pub const MIN_ALLOWLIST_PREFIX: u8 = 8;

/// Whether `a` and `b` agree on their first `prefix` bits (same family only).
fn same_network(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    let common = u32::from(prefix);
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - common).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - common).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// **Dangerous.** A network an allowlist sandbox may reach *through* the always-blocked
/// set: its rule is evaluated before the blocked set, so it opens whatever part of that
/// set it covers — the cloud metadata service (and the instance's credentials), the
/// host's own addresses and every service the host runs on them, other sandboxes and
/// containers on the engine's networks.
///
/// Only for library callers who mean exactly that (a sandbox that must reach one service
/// on the host, say). Only a network, never a name: what a name resolves to is decided by
/// whoever answers DNS, and it never opens the blocked set. It exists only in Rust: it is
/// not part of [`NetworkPolicy`]'s serialized form, so no configuration file, DSN, CLI
/// flag or MCP argument can carry it. The MCP server never offers it.
///
/// The network is reachable by itself (it need not be on the allowlist as well), and an
/// allowlist entry inside it is not refused for overlapping the blocked set.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockedSetOverride {
    rule: EgressRule,
}

impl BlockedSetOverride {
    /// The network `cidr` (`10.0.0.5/32`, `fd00::/64`; a bare address is a /32 or /128).
    /// A hostname or wildcard, a network wider than [`MIN_ALLOWLIST_PREFIX`] and one of
    /// the addresses that are no destination (unspecified, IPv4-mapped) are
    /// `Configuration` errors.
    pub fn network(cidr: &str) -> Result<Self> {
        let rule = EgressRule::parse(cidr)?;
        let EgressTarget::Network { addr, prefix } = *rule.target() else {
            return Err(SandboxError::config(
                format!(
                    "{cidr:?} is a name: only a network can be reached through the blocked set"
                ),
                "give the address or CIDR (`10.0.0.5/32`); a name's answers never open the blocked set",
            ));
        };
        check_destination(&rule, addr, prefix)?;
        Ok(BlockedSetOverride { rule })
    }

    /// The network as an allowlist rule.
    pub fn rule(&self) -> &EgressRule {
        &self.rule
    }
}

impl fmt::Display for BlockedSetOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.rule.fmt(f)
    }
}

/// Refuses a network that is too wide or is no destination (checked for overrides too).
fn check_destination(rule: &EgressRule, addr: IpAddr, prefix: u8) -> Result<()> {
    if prefix < MIN_ALLOWLIST_PREFIX {
        return Err(SandboxError::config(
            format!(
                "allowlist entry `{rule}` is wider than /{MIN_ALLOWLIST_PREFIX}: it spans most of the internet and the always-blocked set"
            ),
            format!(
                "list the networks you need (at most /{MIN_ALLOWLIST_PREFIX} each), or use egress `Allow`, which keeps link-local, metadata, the host and other sandboxes blocked"
            ),
        ));
    }
    if let Some(n) = NOT_DESTINATIONS.iter().find(|n| n.holds(addr, prefix)) {
        return Err(SandboxError::config(
            format!("allowlist entry `{rule}` lies inside {n}: {}", n.what),
            "list the real destination's address or CIDR (an IPv4 address in its IPv4 form)",
        ));
    }
    Ok(())
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
    /// **Dangerous**: networks an `AllowList` sandbox reaches through the always-blocked
    /// set (see [`BlockedSetOverride`]). Empty by default; never serialized.
    #[cfg_attr(feature = "serde", serde(skip))]
    pub blocked_set_overrides: Vec<BlockedSetOverride>,
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
            ..Self::default()
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
            ..Self::default()
        }
    }
    /// Egress by tiers (see [`EgressTiers`]).
    pub fn tiers(tiers: EgressTiers) -> Self {
        NetworkPolicy {
            egress: Egress::Tiers(tiers),
            ..Self::default()
        }
    }
    /// Grants the host's TCP port `port`, reachable inside at [`HOST_SANDBOX_NAME`] (needs
    /// `HOST_PORTS`; see [`EgressTiers::host_ports`]). The egress becomes the tiers it
    /// stands for, plus the port: `NetworkPolicy::deny().host_port(p)` is a sandbox whose
    /// only way out is that port. An allowlist entry that does not parse is refused later,
    /// by [`NetworkPolicy::validate`], as it would be without the port.
    pub fn host_port(mut self, port: HostPort) -> Self {
        let tiers = match self.egress.tiers() {
            Ok(t) => t,
            // Kept as given so validation names the entry that does not parse.
            Err(_) => return self,
        };
        self.egress = Egress::Tiers(tiers.host_port(port));
        self
    }

    /// Adds a port to publish on the host's loopback.
    pub fn ingress_port(mut self, port: u16) -> Self {
        self.ingress_ports.push(port);
        self
    }

    /// **Dangerous**: lets this allowlist sandbox reach `network` although it lies in the
    /// always-blocked set (link-local and cloud metadata, the host's own addresses, the
    /// engine's networks). Read [`BlockedSetOverride`] first.
    pub fn through_blocked_set(mut self, network: BlockedSetOverride) -> Self {
        self.blocked_set_overrides.push(network);
        self
    }

    /// The override whose network holds all of `addr/prefix`, if any.
    pub fn override_for(&self, addr: IpAddr, prefix: u8) -> Option<&BlockedSetOverride> {
        self.blocked_set_overrides.iter().find(|o| {
            matches!(*o.rule.target(), EgressTarget::Network { prefix: p, .. }
                if p <= prefix && o.rule.matches_ip(addr))
        })
    }

    /// Validates ports and allowlist entries. A port listed twice is refused: it would be
    /// published twice, or silently once, depending on the engine.
    ///
    /// An allowlist network wider than [`MIN_ALLOWLIST_PREFIX`] is refused; so is one that
    /// lies inside the statically known always-blocked set ([`ALWAYS_BLOCKED`]:
    /// link-local, cloud metadata; unless a [`BlockedSetOverride`] holds it) or inside the
    /// addresses that are no destination (unspecified, IPv4-mapped). A network that merely
    /// *contains* blocked addresses (`fd00::/8` holds AWS's `fd00:ec2::254`) is accepted:
    /// the blocked set is evaluated before the allowlist, so those addresses stay blocked
    /// inside it. Container engines check the rest of the set (the host's addresses, the
    /// engine's networks) the same way before they create the container.
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
        if !self.blocked_set_overrides.is_empty()
            && !matches!(self.egress, Egress::AllowList(_) | Egress::Tiers(_))
        {
            return Err(SandboxError::config(
                "blocked-set overrides only go with an egress allowlist or tiers",
                "use NetworkPolicy::allow_list(..).through_blocked_set(..), or drop the overrides",
            ));
        }
        self.validate_egress()
    }

    /// Validates the egress entries alone (what a live change of egress checks): every
    /// network entry of every tier must be a destination no wider than
    /// [`MIN_ALLOWLIST_PREFIX`]; an allow or exception network must not lie inside the
    /// statically known always-blocked set (unless an override of this policy holds it). A
    /// deny network may: denying what is blocked anyway changes nothing.
    pub fn validate_egress(&self) -> Result<()> {
        let tiers = self.egress.tiers()?;
        if tiers.host_ports.len() > MAX_HOST_PORTS {
            return Err(SandboxError::config(
                format!(
                    "{} host ports are granted, at most {MAX_HOST_PORTS} may be",
                    tiers.host_ports.len()
                ),
                "grant only the ports of the services the sandbox needs",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for p in &tiers.host_ports {
            if !seen.insert(*p) {
                return Err(SandboxError::config(
                    format!("host port {p} is granted twice"),
                    "list each host port once (EgressTiers::host_port merges repeats)",
                ));
            }
        }
        for rule in &tiers.deny {
            if let EgressTarget::Network { addr, prefix } = *rule.target() {
                check_destination(rule, addr, prefix)?;
            }
        }
        let opening: Vec<&EgressRule> = tiers.allow.iter().chain(&tiers.except).collect();
        for rule in opening {
            let EgressTarget::Network { addr, prefix } = *rule.target() else {
                continue;
            };
            check_destination(rule, addr, prefix)?;
            if self.override_for(addr, prefix).is_some() {
                continue;
            }
            if let Some(b) = ALWAYS_BLOCKED.iter().find(|b| b.holds(addr, prefix)) {
                return Err(SandboxError::config(
                    format!(
                        "allowlist entry `{rule}` lies inside {b}, which every sandbox is kept from: {}",
                        b.what
                    ),
                    "remove it: nothing there is reachable from a sandbox. To reach it anyway \
                     from Rust, read the dangers of BlockedSetOverride first \
                     (NetworkPolicy::through_blocked_set)",
                ));
            }
        }
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

    fn rule(s: &str) -> EgressRule {
        EgressRule::parse(s).unwrap()
    }

    /// Most specific first: an exception beats the deny list, which beats the allow
    /// list, which beats the default.
    #[test]
    fn tiers_decide_most_specific_first() {
        let t = EgressTiers::deny_by_default()
            .allow(rule("*.example.com"))
            .deny(rule("build.example.com"))
            .deny(rule("10.0.0.0/8"))
            .except(rule("10.1.2.3"))
            .allow(rule("10.9.0.0/16"));
        assert_eq!(t.verdict_for_host("api.example.com"), TierVerdict::Allowed);
        assert_eq!(t.verdict_for_host("build.example.com"), TierVerdict::Denied);
        assert_eq!(
            t.verdict_for_host("pypi.org"),
            TierVerdict::Default(EgressDefault::Deny)
        );
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(t.verdict_for_ip(ip("10.1.2.3")), TierVerdict::Exception);
        assert_eq!(
            t.verdict_for_ip(ip("10.9.0.1")),
            TierVerdict::Denied,
            "deny beats allow"
        );
        assert!(!t.verdict_for_ip(ip("192.0.2.1")).reachable());
        let all_but = EgressTiers::allow_by_default().deny(rule("pypi.org"));
        assert!(!all_but.verdict_for_host("pypi.org").reachable());
        assert!(
            all_but
                .verdict_for_host("files.pythonhosted.org")
                .reachable()
        );
        assert_eq!(
            Egress::Tiers(all_but).to_string(),
            "default allow; deny pypi.org"
        );
    }

    /// Every variant reads as tiers; an allow or exception network inside the blocked
    /// set is refused, a deny network there is not.
    #[test]
    fn egress_as_tiers_and_their_validation() {
        assert_eq!(
            Egress::Deny.tiers().unwrap(),
            EgressTiers::deny_by_default()
        );
        assert_eq!(
            Egress::Allow.tiers().unwrap(),
            EgressTiers::allow_by_default()
        );
        assert_eq!(
            Egress::AllowList(vec!["pypi.org".into()]).tiers().unwrap(),
            EgressTiers::deny_by_default().allow(rule("pypi.org"))
        );
        assert!(!Egress::Tiers(EgressTiers::allow_by_default()).lists_entries());
        let deny_meta = EgressTiers::allow_by_default().deny(rule("169.254.169.254"));
        assert!(NetworkPolicy::tiers(deny_meta).validate().is_ok());
        for opening in [
            EgressTiers::deny_by_default().allow(rule("169.254.0.0/16")),
            EgressTiers::deny_by_default().except(rule("169.254.169.254")),
            EgressTiers::deny_by_default().deny(rule("0.0.0.0/8")),
        ] {
            let e = NetworkPolicy::tiers(opening.clone())
                .validate()
                .unwrap_err();
            assert_eq!(e.code(), ErrorCode::Configuration, "{opening}");
        }
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

    /// Each entry would open, or stand for, what every sandbox is kept from.
    #[test]
    fn allowlist_cannot_open_the_blocked_set() {
        for bad in [
            "169.254.169.254/32",
            "169.254.169.254",
            "169.254.0.0/16",
            "169.254.128.0/17",
            "fe80::1",
            "fe80::/10",
            "fd00:ec2::254",
            "100.100.100.200",
            "0.0.0.0/0",
            "::/0",
            "128.0.0.0/1",
            "2000::/3",
            "0.0.0.0",
            "0.0.0.0/8",
            "::",
            "::ffff:169.254.169.254",
            "::ffff:0:0/96",
        ] {
            let e = NetworkPolicy::allow_list(["pypi.org", bad])
                .validate()
                .expect_err(bad);
            assert_eq!(e.code(), ErrorCode::Configuration, "{bad}");
            assert!(e.hint().len() > 10, "{bad}: a hint says what to do instead");
        }
    }

    #[test]
    fn ordinary_entries_pass_validation() {
        let ok = NetworkPolicy::allow_list([
            "pypi.org",
            "*.example.com",
            "10.0.0.0/8",
            "fd00::/8",
            "fd00:ec2::/32",
            "100.64.0.0/10",
            "169.0.0.0/8",
            "198.18.0.0/24",
            "192.0.2.1",
            "2001:db8::1",
            "169.253.255.255",
            "169.255.0.0/16",
            "100.100.100.199",
            // The sandbox's own loopback on every engine: reachable whatever the policy,
            // and nothing of the host's.
            "127.0.0.1",
        ]);
        // Those containing blocked addresses (169.254/16, fd00:ec2::254, 100.100.100.200)
        // are accepted: the blocked set is evaluated before them.
        assert!(ok.validate().is_ok(), "{:?}", ok.validate());
        // A name that resolves into the blocked set is not known here; the rules keep
        // its answers below the blocked set.
        assert!(
            NetworkPolicy::allow_list(["metadata.google.internal"])
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn an_explicit_override_opens_its_network_only() {
        let metadata = BlockedSetOverride::network("169.254.169.254").unwrap();
        assert_eq!(metadata.to_string(), "169.254.169.254/32");
        let p = NetworkPolicy::allow_list(["pypi.org"]).through_blocked_set(metadata.clone());
        assert!(p.validate().is_ok());
        // An entry inside the override is covered by it; one beside it is still refused.
        let p =
            NetworkPolicy::allow_list(["169.254.169.254/32"]).through_blocked_set(metadata.clone());
        assert!(p.validate().is_ok());
        let p = NetworkPolicy::allow_list(["169.254.0.0/16"]).through_blocked_set(metadata.clone());
        assert_eq!(p.validate().unwrap_err().code(), ErrorCode::Configuration);
        assert!(
            p.override_for("169.254.169.254".parse().unwrap(), 32)
                .is_some()
        );
        assert!(p.override_for("169.254.0.0".parse().unwrap(), 16).is_none());
        // Only with an allowlist, only a network, never too wide or no destination.
        for bad in [
            NetworkPolicy::allow().through_blocked_set(metadata.clone()),
            NetworkPolicy::deny().through_blocked_set(metadata),
        ] {
            assert_eq!(bad.validate().unwrap_err().code(), ErrorCode::Configuration);
        }
        for bad in [
            "metadata.google.internal",
            "*.internal",
            "0.0.0.0/0",
            "::",
            "x y",
        ] {
            let e = BlockedSetOverride::network(bad).expect_err(bad);
            assert_eq!(e.code(), ErrorCode::Configuration, "{bad}");
        }
    }

    /// Names below a wildcard are the sandbox's choice and go to the host's resolver: only
    /// host-name labels may pass.
    #[test]
    fn a_wildcard_passes_only_host_name_labels() {
        let w = EgressRule::parse("*.example.com").unwrap();
        assert!(w.matches_host("a-1.b2.example.com"));
        for forged in [
            "a_b.example.com",
            "a b.example.com",
            "a\0.example.com",
            "%00.example.com",
            "a..example.com",
            ".example.com",
            "-a.example.com",
            "a\\.example.com",
            &format!("{}.example.com", "a".repeat(64)),
        ] {
            assert!(!w.matches_host(forged), "{forged:?} passed the wildcard");
        }
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
