//! Egress `AllowList` and `Allow` on container engines, written once for every engine.
//!
//! A sandbox with egress `Allow` or `AllowList` runs on the library's own network
//! ([`NETWORK_NAME`], created by the engine with inter-container traffic off and
//! labelled). On a local engine, after the container starts and before `create` returns
//! (nothing of the user's has run yet), the library enters the container's network
//! namespace from the host (`nsenter --net=/proc/<pid>/ns/net nft -f -`) and loads one
//! `inet` table (see `nft.rs`): output policy drop; loopback and the sandbox's answers on
//! connections that came in accepted; DNS redirected to the library's resolver (see
//! `resolver.rs`); the networks of explicit blocked-set overrides accepted; link-local,
//! cloud metadata, every engine network (the host's bridge addresses and other
//! sandboxes) and every address of the host itself rejected; then the tiers: exception
//! networks and addresses pinned for exception names accepted, deny networks rejected,
//! allow networks and addresses pinned for allowed names accepted; then the default
//! (rejected, a fast failure, not a timeout; or accepted). Every packet of a connection
//! the sandbox opened is judged, not only its first. The table is read back and checked;
//! any failure fails `create` and removes the container. The workload never holds
//! `NET_ADMIN` or `NET_RAW`, so it cannot change the rules.
//!
//! The policy in force lives on the host (`state.rs`), where the resolver reads it for
//! every query and [`set_live`] replaces it together with the rules, in one nft
//! transaction, from any process on the host.
//!
//! docs/network.md describes the mechanism, its limits and how to verify it.

mod bridge;
mod dns;
mod hosts;
mod local;
mod netns;
mod nft;
mod resolver;
mod state;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use sandbox_core::labels::{LABEL_BACKEND, LABEL_MANAGED};
use sandbox_core::{
    ALWAYS_BLOCKED, Egress, EgressDefault, EgressRule, EgressTarget, EgressTiers, NetworkPolicy,
    Result, SandboxError, TierVerdict,
};

use crate::engine::{
    ContainerEngine, EngineError, EngineErrorKind, EngineResult, NetworkInfo, NetworkMode,
    NetworkSpec,
};

/// Name of the network egress `Allow` and `AllowList` sandboxes run on (one per engine,
/// shared by every process using the library; inter-container traffic is off on it).
pub const NETWORK_NAME: &str = "sbx-egress";

/// Label marking a network the library created (value: `egress`).
pub const LABEL_NETWORK: &str = "io.sandbox-rs.network";

/// Name of the nftables table loaded into each sandbox's network namespace.
pub const TABLE: &str = nft::TABLE;

pub use hosts::{HOSTS_FILE, HOSTS_TEXT, ensure_hosts_file};
pub(crate) use state::Proxied;

/// How the egress resolver turns a name into addresses. The default is the host's
/// resolver (getaddrinfo: `/etc/hosts` first, then the host's configured DNS), so a name
/// the user's machine knows is a name an allowlist can grant.
pub trait Lookup: Send + Sync + 'static {
    /// The addresses of `name` (lower-case, no trailing dot). An error of kind
    /// `NotFound` is answered NXDOMAIN.
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>>;
}

/// The host's resolver (getaddrinfo through `tokio::net::lookup_host`).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostLookup;

impl Lookup for HostLookup {
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let mut out: Vec<IpAddr> = Vec::new();
            for a in tokio::net::lookup_host((name, 0)).await? {
                if !out.contains(&a.ip()) {
                    out.push(a.ip());
                }
            }
            Ok(out)
        })
    }
}

/// Replaces, for this whole process, how the egress resolver resolves allowed names
/// (tests teach it names no public DNS knows; an embedder can resolve through its own
/// directory). Fails only when the resolver cannot start.
pub fn set_lookup(lookup: Arc<dyn Lookup>) -> Result<()> {
    let r = resolver::resolver()
        .map_err(|e| SandboxError::config(e, "check that threads can be started"))?;
    r.set_lookup(lookup);
    Ok(())
}

/// An IP network (`10.0.0.0/8`, `fd00::/8`; a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The address as given.
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// A network; the prefix is clamped to the address family's width.
    pub fn new(addr: IpAddr, prefix: u8) -> Self {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        Cidr {
            addr,
            prefix: prefix.min(max),
        }
    }

    /// Whether every address of `other` is in this network.
    pub fn holds(self, other: Cidr) -> bool {
        self.addr.is_ipv4() == other.addr.is_ipv4()
            && other.prefix >= self.prefix
            && Cidr::new(other.addr, self.prefix).network() == self.network()
    }

    /// The network with host bits cleared (what nft sets accept).
    pub fn network(self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Cidr { addr, ..self }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.network();
        write!(f, "{}/{}", n.addr, n.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| format!("`{a}` is not an address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`/{p}` is not a prefix"))?,
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }
}

/// Always blocked, whatever the engine: core's [`ALWAYS_BLOCKED`] (IPv4 and IPv6
/// link-local, with the cloud metadata service at 169.254.169.254, and the metadata
/// addresses outside it).
pub fn always_blocked() -> Vec<Cidr> {
    ALWAYS_BLOCKED
        .iter()
        .map(|b| Cidr::new(b.addr, b.prefix))
        .collect()
}

pub(crate) mod host {
    //! The host tools the rules are loaded with.

    use super::*;

    fn find(name: &str) -> Option<PathBuf> {
        find_in(&std::env::var_os("PATH").unwrap_or_default(), name)
    }

    /// `name` in the absolute directories of `path` (a `PATH` value), then in the system
    /// directories. Relative entries (`.`, an empty one, `bin`) are skipped: these tools run
    /// as root, and a relative entry would run whatever the current directory holds under
    /// that name.
    pub(crate) fn find_in(path: &std::ffi::OsStr, name: &str) -> Option<PathBuf> {
        std::env::split_paths(path)
            .filter(|d| d.is_absolute())
            .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    }

    fn tools() -> &'static std::result::Result<(PathBuf, PathBuf), String> {
        static T: OnceLock<std::result::Result<(PathBuf, PathBuf), String>> = OnceLock::new();
        T.get_or_init(|| {
            let nft = find("nft").ok_or("`nft` is not installed on this host")?;
            let nsenter = find("nsenter").ok_or("`nsenter` is not installed on this host")?;
            Ok((nft, nsenter))
        })
    }

    pub(crate) fn nft_path() -> &'static Path {
        match tools() {
            Ok((n, _)) => n,
            // Never a bare name, which the spawn would look up in PATH.
            Err(_) => Path::new("/usr/sbin/nft"),
        }
    }

    /// iproute2's `ip` (every engine host has it; a missing one fails the call that
    /// needs it, naming the command).
    pub(crate) fn ip_path() -> &'static Path {
        static IP: OnceLock<PathBuf> = OnceLock::new();
        IP.get_or_init(|| find("ip").unwrap_or_else(|| PathBuf::from("/usr/sbin/ip")))
    }

    pub(crate) fn nsenter_path() -> &'static Path {
        match tools() {
            Ok((_, n)) => n,
            Err(_) => Path::new("/usr/bin/nsenter"),
        }
    }

    /// Whether this process can load rules into other network namespaces: the tools are
    /// installed and `nft list tables` works here (it needs the privileges that entering
    /// a namespace needs, and the kernel's nf_tables). Checked once per process.
    pub(crate) fn support() -> &'static std::result::Result<(), String> {
        static S: OnceLock<std::result::Result<(), String>> = OnceLock::new();
        S.get_or_init(|| {
            tools().as_ref().map_err(Clone::clone)?;
            let out = std::process::Command::new(nft_path())
                .args(["list", "tables"])
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("cannot run nft: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "nft cannot talk to the kernel's nf_tables (needs root and the nf_tables module): {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(())
        })
    }
}

/// Whether egress allowlists can be enforced from this process, and if not, why and the
/// fix (for `sandbox doctor`).
pub fn host_support() -> std::result::Result<(), (String, String)> {
    host::support().clone().map_err(|why| {
        (
            why,
            "install nftables and util-linux (`sudo apt-get install -y nftables util-linux`) \
             and run as root, with the engine on this machine"
                .to_string(),
        )
    })
}

/// Whether sandboxes of `engine` can have an egress allowlist (declares
/// `EGRESS_ALLOWLIST`): a local engine whose containers' traffic goes through their
/// namespace's netfilter hooks, on a host with nft.
pub(crate) fn allowlist_available<E: ContainerEngine + ?Sized>(engine: &E) -> bool {
    engine.is_local() && engine.netfilter_applies() && host::support().is_ok()
}

/// Why egress `Allow` on `engine` would run without the always-blocked set, if it would:
/// the rules that carry the set cannot be loaded into its containers' namespaces from
/// here.
fn unfiltered_because<E: ContainerEngine + ?Sized>(engine: &E) -> Option<String> {
    if !engine.is_local() {
        return Some(format!(
            "the engine at {} is not on this machine, so its containers' network \
             namespaces cannot be entered from here",
            engine.endpoint()
        ));
    }
    if !engine.netfilter_applies() {
        return Some(
            "this runtime's network stack (gVisor's netstack) bypasses the rules a \
             namespace's netfilter holds"
                .to_string(),
        );
    }
    host::support().as_ref().err().cloned()
}

/// Refuses egress `Allow` where it would run without the always-blocked set (link-local
/// and cloud metadata, the host's own addresses, other containers' networks) — a remote
/// engine, gVisor's netstack, a host without nft, or an engine without networks of its
/// own (`has_network` false: the library network could not be created) — unless the backend's configuration opts in
/// ([`ContainerConfig::allow_unfiltered_egress`](crate::ContainerConfig::allow_unfiltered_egress)).
/// Called before anything is provisioned.
pub(crate) fn check_allow<E: ContainerEngine + ?Sized>(
    engine: &E,
    policy: &NetworkPolicy,
    has_network: bool,
    opted_in: bool,
) -> Result<()> {
    if !allows_by_default(&policy.egress) || opted_in {
        return Ok(());
    }
    let why = match has_network {
        false => Some(format!(
            "the {} engine adapter has no networks of its own, so the sandbox would join \
             the engine's default bridge with no rules",
            engine.backend()
        )),
        true => unfiltered_because(engine),
    };
    match why {
        None => Ok(()),
        Some(why) => Err(SandboxError::config(
            format!(
                "egress Allow would reach the cloud metadata service, this host's own \
                 services and other containers' networks here: {why}"
            ),
            "use egress Deny, or run the library on the engine's machine as root with \
             nftables and util-linux installed; if reaching those is acceptable, opt in \
             from Rust with `allow_unfiltered_egress(true)` on the backend's configuration",
        )),
    }
}

/// Whether `egress` lets through what it does not name (`Allow`, or tiers that default to
/// allow).
fn allows_by_default(egress: &Egress) -> bool {
    egress
        .tiers()
        .is_ok_and(|t| t.default == EgressDefault::Allow)
}

/// The library network's spec for `backend`.
pub(crate) fn network_spec(backend: &str) -> NetworkSpec {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_MANAGED.to_string(), "true".to_string());
    labels.insert(LABEL_BACKEND.to_string(), backend.to_string());
    labels.insert(LABEL_NETWORK.to_string(), "egress".to_string());
    NetworkSpec::new(NETWORK_NAME, labels)
}

/// Held while this process ensures the library network or removes it.
static ENSURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Creates of this process that need the library network and have not yet finished (the
/// network is theirs to join: this process's sweeps and reaps leave it alone meanwhile).
static JOINING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A create that will join the library network, from [`joining`] until dropped.
pub(crate) struct Joining(());

impl Drop for Joining {
    fn drop(&mut self) {
        JOINING.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Marks a create of `policy` as about to join the library network (`None` when the
/// policy needs none): until the mark is dropped, this process does not remove it.
pub(crate) fn joining(policy: &NetworkPolicy) -> Option<Joining> {
    needs_network(policy).then(|| {
        JOINING.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Joining(())
    })
}

/// Whether `policy` needs the library network.
pub(crate) fn needs_network(policy: &NetworkPolicy) -> bool {
    !matches!(policy.egress, Egress::Deny)
}

/// The host's address on the network (where the resolver listens): the first IPv4
/// gateway, else the first gateway.
fn gateway(net: &NetworkInfo) -> Option<IpAddr> {
    let gws: Vec<IpAddr> = net.subnets.iter().filter_map(|s| s.gateway).collect();
    gws.iter().find(|g| g.is_ipv4()).or(gws.first()).copied()
}

/// The network mode for `policy` on the library network `net`.
pub(crate) fn network_mode(policy: &NetworkPolicy, net: Option<&NetworkInfo>) -> NetworkMode {
    match (&policy.egress, net) {
        (Egress::Deny, _) => NetworkMode::None,
        // An engine without networks of its own (a third-party engine that does not
        // implement them): Allow keeps the engine's default bridge.
        (e, None) if allows_by_default(e) && !e.lists_entries() => NetworkMode::Bridge {
            publish: policy.ingress_ports.clone(),
        },
        (_, None) => NetworkMode::None,
        (_, Some(net)) => NetworkMode::Isolated {
            network: if net.id.is_empty() {
                net.name.clone()
            } else {
                net.id.clone()
            },
            publish: policy.ingress_ports.clone(),
            dns: gateway(net).into_iter().collect(),
        },
    }
}

/// Creates the library network unless it exists, when `policy` needs it. `None` for
/// `Deny`, and for `Allow` on an engine that cannot create networks (a third-party engine
/// without [`ContainerEngine::create_network`]: it keeps the engine's bridge, without the
/// always-blocked set; logged once).
pub(crate) async fn network_for<E: ContainerEngine + ?Sized>(
    engine: &E,
    policy: &NetworkPolicy,
) -> Result<Option<NetworkInfo>> {
    if !needs_network(policy) {
        return Ok(None);
    }
    // One at a time in this process: concurrent creates must not each create the network
    // (Docker accepts duplicate names), and this process's sweeps do not remove it meanwhile.
    let _one = ENSURING.lock().await;
    match ensure_network(engine, &network_spec(engine.backend())).await {
        Ok(n) => Ok(Some(n)),
        Err(e)
            if e.kind == EngineErrorKind::InvalidRequest
                && allows_by_default(&policy.egress)
                && !policy.egress.lists_entries() =>
        {
            warn_once(engine);
            Ok(None)
        }
        Err(e) => Err(crate::error::engine(
            engine,
            &format!("create the network {NETWORK_NAME}"),
            e,
        )),
    }
}

/// The network `spec` names, created unless it exists. One that exists must be ours
/// (our labels) and isolated, else it is refused: a foreign network of that name could
/// join sandboxes to other containers. Docker accepts two networks of one name (two
/// processes creating it at once): every process then picks the same one, the lowest id,
/// and containers join by id.
pub(crate) async fn ensure_network<E: ContainerEngine + ?Sized>(
    engine: &E,
    spec: &NetworkSpec,
) -> EngineResult<NetworkInfo> {
    for _ in 0..2 {
        let mut named: Vec<NetworkInfo> = engine
            .networks()
            .await?
            .into_iter()
            .filter(|n| n.name == spec.name)
            .collect();
        named.sort_by(|a, b| a.id.cmp(&b.id));
        if let Some(n) = named.into_iter().next() {
            let ours = spec.labels.iter().all(|(k, v)| n.labels.get(k) == Some(v));
            if !ours || !n.isolated {
                return Err(EngineError::new(
                    EngineErrorKind::Conflict,
                    format!(
                        "a network named {} exists that sandbox-rs did not create (its \
                         containers are not kept apart, or labels are missing); remove it \
                         with `{} network rm {}`",
                        spec.name,
                        engine.backend(),
                        spec.name
                    ),
                ));
            }
            return Ok(n);
        }
        match engine.create_network(spec).await {
            // Created meanwhile by another process: listed on the next round.
            Ok(()) => {}
            Err(e) if e.kind == EngineErrorKind::Conflict => {}
            Err(e) => return Err(e),
        }
    }
    Err(EngineError::new(
        EngineErrorKind::Other,
        format!(
            "the network {} vanished while it was being created",
            spec.name
        ),
    ))
}

fn creation(backend: &str, why: String) -> SandboxError {
    SandboxError::creation(backend, format!("egress rules could not be applied: {why}"))
}

/// The network an allowlist rule names, if it names one.
fn network_of(rule: &EgressRule) -> Option<Cidr> {
    match rule.target() {
        EgressTarget::Network { addr, prefix } => Some(Cidr::new(*addr, *prefix)),
        _ => None,
    }
}

/// Listed CIDRs of an allowlist.
fn listed_networks(rules: &[EgressRule]) -> Vec<Cidr> {
    rules.iter().filter_map(network_of).collect()
}

/// The networks a policy's tiers list: (exceptions, deny, allow).
fn tier_networks(t: &EgressTiers) -> (Vec<Cidr>, Vec<Cidr>, Vec<Cidr>) {
    (
        listed_networks(&t.except),
        listed_networks(&t.deny),
        listed_networks(&t.allow),
    )
}

/// The networks of the policy's blocked-set overrides (accepted ahead of the blocked set).
fn override_networks(policy: &NetworkPolicy) -> Vec<Cidr> {
    policy
        .blocked_set_overrides
        .iter()
        .filter_map(|o| network_of(o.rule()))
        .collect()
}

/// The entries that open something (allow and exceptions): these must not lie inside the
/// blocked set.
fn opening_rules(egress: &Egress) -> Result<Vec<EgressRule>> {
    let t = egress.tiers()?;
    Ok(t.allow.into_iter().chain(t.except).collect())
}

/// One part of the always-blocked set, and what it is (for refusals).
#[derive(Debug, Clone)]
struct Blocked {
    cidr: Cidr,
    what: String,
}

/// The always-blocked set of a sandbox on `net`: core's static part, every subnet and
/// gateway of every engine network (other containers, the host's bridge addresses), and
/// every address of this host.
async fn blocked_set<E: ContainerEngine + ?Sized>(
    engine: &E,
    net: &NetworkInfo,
) -> Result<Vec<Blocked>> {
    let backend = engine.backend();
    let networks = engine
        .networks()
        .await
        .map_err(|e| crate::error::engine(engine, "list networks", e))?;
    let mut block: Vec<Blocked> = ALWAYS_BLOCKED
        .iter()
        .map(|b| Blocked {
            cidr: Cidr::new(b.addr, b.prefix),
            what: b.what.to_string(),
        })
        .collect();
    for n in networks.iter().chain(std::iter::once(net)) {
        for s in &n.subnets {
            block.push(Blocked {
                cidr: Cidr::new(s.addr, s.prefix),
                what: format!("the {backend} network `{}` (other containers)", n.name),
            });
            if let Some(g) = s.gateway {
                block.push(Blocked {
                    cidr: Cidr::new(g, if g.is_ipv4() { 32 } else { 128 }),
                    what: format!("the host's address on the {backend} network `{}`", n.name),
                });
            }
        }
    }
    // The host's other addresses (its LAN address above all): a service it runs on all
    // of them must be as far out of reach as on its bridge addresses.
    let host = local::addresses()
        .await
        .map_err(|e| creation(backend, format!("listing the host's addresses: {e}")))?;
    block.extend(host.into_iter().map(|cidr| Blocked {
        cidr,
        what: "an address of this host (every service it runs there)".to_string(),
    }));
    Ok(block)
}

/// The first allowlist network that lies inside `block` without an override holding it:
/// an entry that could only be meant to open the blocked set. A network that merely
/// contains blocked addresses is not refused: the rules evaluate the blocked set first,
/// so those stay blocked inside it (a LAN holds the host's own address, `fd00::/8`
/// holds a metadata address).
fn refused_entry(policy: &NetworkPolicy, rules: &[EgressRule], block: &[Blocked]) -> Result<()> {
    let overrides = override_networks(policy);
    for rule in rules {
        let Some(entry) = network_of(rule) else {
            continue;
        };
        if overrides.iter().any(|o| o.holds(entry)) {
            continue;
        }
        if let Some(b) = block.iter().find(|b| b.cidr.holds(entry)) {
            return Err(SandboxError::config(
                format!(
                    "allowlist entry `{rule}` lies inside {}, {}, which every sandbox is kept from",
                    b.cidr, b.what
                ),
                "remove it: nothing there is reachable from a sandbox (a wider network \
                 that contains it is accepted, with it still blocked). To reach it anyway \
                 from Rust, read the dangers of BlockedSetOverride first \
                 (NetworkPolicy::through_blocked_set)",
            ));
        }
    }
    Ok(())
}

/// Refuses, before the container is created, an allowlist network that lies inside the
/// part of the always-blocked set only known here (the host's addresses, the engine's
/// networks; core refused the static part). Nothing to check without an allowlist, and
/// where the rules cannot be loaded (`apply` refuses there).
pub(crate) async fn check_allowlist<E: ContainerEngine + ?Sized>(
    engine: &E,
    policy: &NetworkPolicy,
    net: &NetworkInfo,
) -> Result<()> {
    if !policy.egress.lists_entries() || !allowlist_available(engine) {
        return Ok(());
    }
    refused_entry(
        policy,
        &opening_rules(&policy.egress)?,
        &blocked_set(engine, net).await?,
    )
}

/// Loads the egress rules of `policy` into the running container `id`, registers it with
/// the resolver, records the policy as the one in force, and checks the rules read back.
/// Called after start, before `create` returns; an error fails `create` (the caller
/// removes the container).
pub(crate) async fn apply<E: ContainerEngine + ?Sized>(
    engine: &E,
    id: &str,
    policy: &NetworkPolicy,
    net: &NetworkInfo,
    proxy: Option<Proxied>,
) -> Result<()> {
    let backend = engine.backend();
    if matches!(policy.egress, Egress::Deny) {
        return Ok(());
    }
    if !engine.is_local() || !engine.netfilter_applies() || host::support().is_err() {
        if allows_by_default(&policy.egress) && !policy.egress.lists_entries() {
            // Reached only when the configuration opted in (`check_allow` refused it
            // otherwise before anything was provisioned): Allow runs without the set.
            warn_once(engine);
            return Ok(());
        }
        return Err(creation(
            backend,
            "this engine's sandboxes cannot get nftables rules from this host".into(),
        ));
    }
    prune_gone(engine, id).await;
    let files = state::Files::of(id);
    let _held = files
        .lock_exclusive()
        .await
        .map_err(|e| creation(backend, e))?;
    // A fresh sandbox starts with no pins (a reused id must not inherit any).
    files.remove();
    let exempt: Vec<String> = override_networks(policy)
        .iter()
        .map(ToString::to_string)
        .collect();
    load_current(
        engine,
        id,
        net,
        &files,
        Some((&policy.egress, exempt, proxy)),
    )
    .await
    .map_err(|e| match e {
        Loaded::Refused(e) => e,
        Loaded::Failed(why) => creation(backend, why),
    })
}

/// Why loading a sandbox's policy failed: a refusal of the policy itself (an entry inside
/// the blocked set), or a failure to load it.
enum Loaded {
    Refused(SandboxError),
    Failed(String),
}

impl From<String> for Loaded {
    fn from(why: String) -> Self {
        Loaded::Failed(why)
    }
}

/// Applies this sandbox's current policy into its network namespace: the one recorded in
/// its state (`fresh`: the create's policy and overrides, recorded now), loaded into the
/// namespace of the container's current first process, with the names pinned since the
/// last change re-pinned; registers the sandbox with this process's resolver and records
/// the namespace. The caller holds the state's exclusive lock.
///
/// What a (re)start calls once the container runs again, before anything of the user's
/// does: the rules of a namespace die with it, the policy in force does not.
async fn load_current<E: ContainerEngine + ?Sized>(
    engine: &E,
    id: &str,
    net: &NetworkInfo,
    files: &state::Files,
    fresh: Option<(&Egress, Vec<String>, Option<Proxied>)>,
) -> std::result::Result<(), Loaded> {
    let info = engine
        .inspect(id)
        .await
        .map_err(|e| Loaded::Refused(crate::error::engine(engine, "inspect container", e)))?;
    let pid = info
        .pid
        .filter(|p| *p > 0)
        .ok_or_else(|| "the engine reports no pid for the container".to_string())?;
    if info.addresses.is_empty() {
        return Err("the engine reports no address for the container"
            .to_string()
            .into());
    }
    // Held from here to the read-back: the rules go into this namespace and no other.
    let ns = netns::of_container(pid, &info.id)?;
    let gw = gateway(net).ok_or_else(|| format!("the network {} has no gateway", net.name))?;
    // Before the workload's first packet: the gateway MAC it learns must stay valid.
    match bridge::pin_mac(gw).await {
        Ok(Some(name)) => tracing::debug!(bridge = %name, "egress bridge MAC pinned"),
        Ok(None) => {}
        Err(e) => return Err(format!("pinning the egress bridge: {e}").into()),
    }
    let resolver = resolver::resolver()?;
    let dns = resolver.listen(gw).await?;
    let mut st = match (fresh, files.read()?) {
        (Some((egress, exempt, proxy)), _) => {
            let mut st = state::State::new(egress, exempt, dns, pid, ns.inode())?;
            st.proxy = proxy;
            st
        }
        (None, Some(mut st)) => {
            st.resolver = dns;
            st.pid = pid;
            st.ns_inode = ns.inode();
            st
        }
        (None, None) => {
            return Err(format!(
                "no egress policy is recorded for {id} on this host (created without rules, \
                 or by a version of the library that did not record it)"
            )
            .into());
        }
    };
    let egress = st.egress()?;
    let block = blocked_set(engine, net).await.map_err(Loaded::Refused)?;
    let exempt = exempt_of(&st);
    let ruleset = ruleset_for(&egress, &exempt, block, &policy_for_overrides(&st), files)
        .map_err(Loaded::Refused)?;
    let ruleset = nft::Ruleset {
        resolver: Some(dns),
        proxy: proxy_rules(&st),
        ..ruleset
    };
    nft::load(&ns.path(), &ruleset).await?;
    st.pid = pid;
    st.ns_inode = ns.inode();
    st.resolver = dns;
    files.write(&st)?;
    resolver.register(&info.addresses, pid, ns.inode(), files.clone())?;
    tracing::debug!(sandbox_id = %id, pid, %dns, %egress, "egress rules applied");
    Ok(())
}

/// The redirect a state's credentials proxy needs in the rules.
fn proxy_rules(st: &state::State) -> Option<nft::Proxy> {
    st.proxy.as_ref().map(|p| nft::Proxy {
        port: p.port,
        addrs: p.addrs.clone(),
    })
}

/// The IPv4 addresses of a bound host, resolved the way the resolver resolves names for
/// sandboxes (the process's [`Lookup`]).
pub(crate) async fn resolve_bound(name: &str) -> std::result::Result<Vec<Ipv4Addr>, String> {
    let r = resolver::resolver()?;
    r.lookup_v4(name).await
}

/// Refuses bound-host addresses the proxy must never connect to from the host: the
/// always-blocked set, this host's own addresses and every engine network. The proxy
/// runs on the host, outside the sandbox's rules, so this is the check that keeps a
/// name resolving to the metadata service from being reached through it.
pub(crate) async fn check_bound<E: ContainerEngine + ?Sized>(
    engine: &E,
    net: &NetworkInfo,
    name: &str,
    addrs: &[Ipv4Addr],
) -> Result<()> {
    let block = blocked_set(engine, net).await?;
    for a in addrs {
        let ip = IpAddr::V4(*a);
        let cidr = Cidr::new(ip, 32);
        let what = if a.is_loopback() || a.is_unspecified() || a.is_broadcast() {
            Some("this host's loopback or no address at all".to_string())
        } else {
            block
                .iter()
                .find(|b| b.cidr.holds(cidr))
                .map(|b| format!("{}, {}", b.cidr, b.what))
        };
        if let Some(what) = what {
            return Err(SandboxError::config(
                format!("credential host {name} resolves to {a}, inside {what}"),
                "bind credentials to hosts outside this machine and its engine networks",
            ));
        }
    }
    Ok(())
}

/// The overrides recorded in a state, as networks.
fn exempt_of(st: &state::State) -> Vec<Cidr> {
    st.exempt.iter().filter_map(|c| c.parse().ok()).collect()
}

/// A policy holding only the recorded overrides (to check entries against them).
fn policy_for_overrides(st: &state::State) -> NetworkPolicy {
    let mut p = NetworkPolicy::deny();
    for c in &st.exempt {
        if let Ok(o) = sandbox_core::BlockedSetOverride::network(c) {
            p = p.through_blocked_set(o);
        }
    }
    p
}

/// The ruleset of `egress` with the recorded pins that the policy still lets through
/// re-pinned into the set of the tier that now grants them (the pins file is rewritten to
/// those kept). An opening entry inside the blocked set is refused.
fn ruleset_for(
    egress: &Egress,
    exempt: &[Cidr],
    block: Vec<Blocked>,
    overrides: &NetworkPolicy,
    files: &state::Files,
) -> Result<nft::Ruleset> {
    let tiers = egress.tiers()?;
    refused_entry(overrides, &opening_rules(egress)?, &block)?;
    let (except, deny, allow) = tier_networks(&tiers);
    let mut pinned_except = Vec::new();
    let mut pinned_allow = Vec::new();
    let mut kept = Vec::new();
    for (_, pin) in files.pins() {
        let tier = match tiers.verdict_for_host(&pin.name) {
            TierVerdict::Exception => state::PinTier::Except,
            TierVerdict::Allowed => state::PinTier::Allow,
            // No longer granted by name: its addresses leave the pinned sets (a default
            // of allow still reaches them, unless denied by network).
            _ => continue,
        };
        match tier {
            state::PinTier::Except => pinned_except.extend(pin.addrs.iter().copied()),
            state::PinTier::Allow => pinned_allow.extend(pin.addrs.iter().copied()),
        }
        kept.push((tier, pin));
    }
    if let Err(e) = files.set_pins(&kept) {
        tracing::debug!(error = %e, "egress: the kept pins could not be recorded");
    }
    pinned_except.sort();
    pinned_except.dedup();
    pinned_allow.sort();
    pinned_allow.dedup();
    Ok(nft::Ruleset {
        allow_all: tiers.default == EgressDefault::Allow,
        exempt: exempt.to_vec(),
        except,
        deny,
        allow,
        block: block.into_iter().map(|b| b.cidr).collect(),
        resolver: None,
        pinned_except,
        pinned_allow,
        host_ports: tiers.host_ports.iter().map(|p| p.get()).collect(),
        proxy: None,
    })
}

/// The library network as the engine lists it now.
async fn library_network<E: ContainerEngine + ?Sized>(engine: &E) -> Result<NetworkInfo> {
    let nets = engine
        .networks()
        .await
        .map_err(|e| crate::error::engine(engine, "list networks", e))?;
    let mut ours: Vec<NetworkInfo> = nets
        .into_iter()
        .filter(|n| n.name == NETWORK_NAME)
        .collect();
    ours.sort_by(|a, b| a.id.cmp(&b.id));
    ours.into_iter().next().ok_or_else(|| {
        SandboxError::config(
            format!("the network {NETWORK_NAME} of this sandbox is gone"),
            "create the sandbox again",
        )
    })
}

/// Applies sandbox `id`'s current policy into its network namespace again (a container
/// that was stopped and started has a new one): what a restart calls before the user's
/// code runs. A sandbox created with egress `Deny` (no network) has none to apply.
pub(crate) async fn apply_current<E: ContainerEngine + ?Sized>(engine: &E, id: &str) -> Result<()> {
    let backend = engine.backend();
    let files = state::Files::of(id);
    if files.read().map_err(|e| creation(backend, e))?.is_none() {
        return Ok(());
    }
    let net = library_network(engine).await?;
    let _held = files
        .lock_exclusive()
        .await
        .map_err(|e| creation(backend, e))?;
    load_current(engine, id, &net, &files, None)
        .await
        .map_err(|e| match e {
            Loaded::Refused(e) => e,
            Loaded::Failed(why) => creation(backend, why),
        })
}

/// Whether this host records a policy for sandbox `id` (it runs on the library's network
/// and any process here can re-apply its current policy).
pub(crate) fn recorded(id: &str) -> bool {
    matches!(state::Files::of(id).read(), Ok(Some(_)))
}

/// The egress policy in force for sandbox `id`, as recorded on this host; a sandbox with
/// no record was created with egress `Deny` (no network; rules were never needed).
pub(crate) fn current(backend: &str, id: &str) -> Result<Egress> {
    match state::Files::of(id).read() {
        Ok(Some(st)) => st.egress().map_err(|e| live_error(backend, e)),
        Ok(None) => Ok(Egress::Deny),
        Err(e) => Err(live_error(backend, e)),
    }
}

/// The egress policy in force for sandbox `id` on `backend`, as this host records it,
/// read without a sandbox handle. Tools that only list (the CLI's `sandbox ls`) use this:
/// reattaching to read would take the in-sandbox agent over from the program that holds
/// the sandbox and end that program's session.
pub fn recorded_policy(backend: &str, id: &str) -> Result<Egress> {
    current(backend, id)
}

fn live_error(backend: &str, why: String) -> SandboxError {
    SandboxError::engine(
        backend,
        format!("changing or reading the egress policy failed: {why}"),
    )
}

/// Replaces the egress policy of the running sandbox `id`: the new ruleset (the blocked
/// set computed afresh, the names pinned so far and still let through re-pinned) goes
/// into its namespace in one nft transaction and is read back, and the state records it,
/// all under the state's exclusive lock, so the resolver judges the next query by it.
/// Connections the new rules forbid are cut by the rules themselves (every packet of an
/// outgoing connection is judged).
pub(crate) async fn set_live<E: ContainerEngine + ?Sized>(
    engine: &E,
    id: &str,
    egress: &Egress,
) -> Result<()> {
    let backend = engine.backend();
    let files = state::Files::of(id);
    let _held = files
        .lock_exclusive()
        .await
        .map_err(|e| live_error(backend, e))?;
    let Some(mut st) = files.read().map_err(|e| live_error(backend, e))? else {
        if matches!(egress, Egress::Deny) {
            return Ok(());
        }
        return Err(SandboxError::config(
            "this sandbox was created with egress Deny: it has no network interface, so no \
             other policy can be set on it",
            "create it with egress tiers that deny everything \
             (NetworkPolicy::tiers(EgressTiers::deny_by_default()), CLI `--network closed`) \
             to open it later",
        ));
    };
    if !allowlist_available(engine) {
        return Err(SandboxError::unsupported(
            sandbox_core::Capability::LIVE_EGRESS,
            backend,
        ));
    }
    let info = engine
        .inspect(id)
        .await
        .map_err(|e| crate::error::engine(engine, "inspect container", e))?;
    let pid = info.pid.filter(|p| *p > 0).ok_or_else(|| {
        live_error(
            backend,
            "the engine reports no pid for the container".into(),
        )
    })?;
    let ns = netns::of_container(pid, &info.id).map_err(|e| live_error(backend, e))?;
    if ns.inode() != st.ns_inode {
        return Err(live_error(
            backend,
            "the container's network namespace is not the one its rules were loaded into \
             (restarted without its rules applied again)"
                .into(),
        ));
    }
    let net = library_network(engine).await?;
    let block = blocked_set(engine, &net).await?;
    let ruleset = ruleset_for(
        egress,
        &exempt_of(&st),
        block,
        &policy_for_overrides(&st),
        &files,
    )?;
    let ruleset = nft::Ruleset {
        resolver: Some(st.resolver),
        proxy: proxy_rules(&st),
        ..ruleset
    };
    nft::load(&ns.path(), &ruleset)
        .await
        .map_err(|e| live_error(backend, e))?;
    st.set_egress(egress).map_err(|e| live_error(backend, e))?;
    files.write(&st).map_err(|e| live_error(backend, e))?;
    tracing::debug!(sandbox_id = %id, %egress, generation = st.generation, "egress policy replaced");
    Ok(())
}

/// Removes the recorded policy of sandbox `id` (it is gone).
pub(crate) fn forget(id: &str) {
    state::Files::of(id).remove();
}

/// Removes the recorded policies of containers the engine no longer has (a sandbox whose
/// owner died and was swept elsewhere). `keep` is the sandbox being set up.
async fn prune_gone<E: ContainerEngine + ?Sized>(engine: &E, keep: &str) {
    for id in state::ids() {
        if id == keep {
            continue;
        }
        if let Err(e) = engine.inspect(&id).await
            && e.kind == EngineErrorKind::NotFound
        {
            forget(&id);
        }
    }
}

fn warn_once<E: ContainerEngine + ?Sized>(engine: &E) {
    static WARNED: OnceLock<()> = OnceLock::new();
    WARNED.get_or_init(|| {
        tracing::warn!(
            backend = engine.backend(),
            endpoint = engine.endpoint(),
            "egress Allow without the always-blocked set (link-local, metadata, bridge \
             addresses), as the configuration allows (allow_unfiltered_egress): the rules \
             cannot be loaded here; see docs/network.md"
        );
    });
}

/// Removes the library network when no container uses it (the engine refuses while one
/// does; that refusal is expected and ignored) and no create of this process is about to
/// join it. Returns whether it was removed.
pub(crate) async fn remove_network_if_unused<E: ContainerEngine + ?Sized>(engine: &E) -> bool {
    let _one = ENSURING.lock().await;
    // A create of this process is about to join it (the engine would see it unused).
    if JOINING.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        return false;
    }
    match engine.remove_network(NETWORK_NAME).await {
        Ok(removed) => removed,
        Err(e)
            if matches!(
                e.kind,
                EngineErrorKind::Conflict | EngineErrorKind::NotFound
            ) =>
        {
            false
        }
        Err(e) => {
            tracing::debug!(error = %e, "egress network not removed");
            false
        }
    }
}

#[cfg(test)]
mod tests;
