//! The egress lab: a canary for egress trials that never leave the machine.
//!
//! The canary lives in a network namespace of its own ([`NETNS`]), joined to the host by
//! a veth pair: the host end [`INTERFACE`] holds [`HOST_SIDE`], the namespace end holds
//! [`CANARY`] (198.18.0.1, from RFC 2544's benchmarking range: never routed on the
//! internet, and inside no engine's address pool). A sandbox reaches it through its
//! gateway and the host's forwarding like any outside host, yet the packets never leave
//! this machine. It is deliberately *not* one of the host's addresses: those are blocked
//! under every egress policy, the canary must not be. [`bind`] opens a listener inside
//! the namespace; [`Names`] teaches the egress resolver names only the test knows.
//!
//! The lab is shared by every test process on the host. Each holds a shared lock
//! ([`USERS_LOCK`]) from the moment it first ensures the lab until it exits; a run's
//! [`Teardown`], dropped at its end, removes the lab when no other process holds the
//! lock, and otherwise says what it kept and why (`cargo xtask teardown` removes it too).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;

use futures::future::BoxFuture;
use sandbox_container::egress::{HostLookup, Lookup};

/// The network namespace the canary lives in (`ip netns`: `/run/netns/sbx-lab`).
pub const NETNS: &str = "sbx-lab";

/// The host end of the veth pair into [`NETNS`].
pub const INTERFACE: &str = "sbx-lab0";

/// The namespace end of the veth pair.
const PEER: &str = "sbx-lab1";

/// The host's address on [`INTERFACE`] (the canary namespace's default gateway).
pub const HOST_SIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 254);

/// The canary address, inside [`NETNS`].
pub const CANARY: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Adds `addr` to `dev` (in `netns` when given) unless it is there. Concurrent test
/// processes may race: the re-check decides.
fn ensure_addr(netns: Option<&str>, dev: &str, addr: &str) -> Result<(), String> {
    let ns: Vec<&str> = netns.map(|n| vec!["-n", n]).unwrap_or_default();
    let show = |_: ()| ip(&[&ns[..], &["-4", "addr", "show", "dev", dev]].concat());
    if !show(())?.contains(&format!("inet {addr} ")) {
        let _ = ip(&[&ns[..], &["addr", "add", addr, "dev", dev]].concat());
        if !show(())?.contains(&format!("inet {addr} ")) {
            return Err(format!("{addr} could not be added to {dev}"));
        }
    }
    Ok(())
}

/// The lock file the lab's users hold (under `/run`, cleared at boot like the namespace).
pub const USERS_LOCK: &str = "/run/sandbox-rs/egress-lab.lock";

/// This process's shared lock on [`USERS_LOCK`], once it used the lab.
#[cfg(target_os = "linux")]
static USERS: std::sync::OnceLock<Result<std::fs::File, String>> = std::sync::OnceLock::new();

/// This process's shared lock on [`USERS_LOCK`]: taken (waiting for a teardown under way
/// to finish) before the process first ensures the lab, held until it exits.
#[cfg(target_os = "linux")]
fn users_lock() -> Result<&'static std::fs::File, String> {
    USERS
        .get_or_init(|| {
            let path = std::path::Path::new(USERS_LOCK);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("create {}: {e}", dir.display()))?;
            }
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .map_err(|e| format!("open {USERS_LOCK}: {e}"))?;
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockShared)
                .map_err(|e| format!("lock {USERS_LOCK}: {e}"))?;
            Ok(file)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Ensures [`NETNS`] exists with [`CANARY`] reachable from the host through
/// [`INTERFACE`] (needs root; idempotent, and safe when concurrent test processes call
/// it), this process counted among its users. Returns the canary address.
pub fn ensure() -> Result<IpAddr, String> {
    #[cfg(target_os = "linux")]
    users_lock()?;
    // An earlier layout put the canary on a host-local dummy interface of this name.
    if let Ok(shown) = ip(&["-d", "link", "show", INTERFACE])
        && !shown.contains("veth")
    {
        let _ = ip(&["link", "del", INTERFACE]);
    }
    if !ip(&["netns", "list"])?
        .lines()
        .any(|l| l.split_whitespace().next() == Some(NETNS))
    {
        let _ = ip(&["netns", "add", NETNS]);
    }
    if ip(&["link", "show", INTERFACE]).is_err() {
        let _ = ip(&[
            "link", "add", INTERFACE, "type", "veth", "peer", "name", PEER, "netns", NETNS,
        ]);
        ip(&["link", "show", INTERFACE])?;
    }
    ensure_addr(None, INTERFACE, &format!("{HOST_SIDE}/24"))?;
    ensure_addr(Some(NETNS), PEER, &format!("{CANARY}/24"))?;
    ip(&["link", "set", INTERFACE, "up"])?;
    ip(&["-n", NETNS, "link", "set", "lo", "up"])?;
    ip(&["-n", NETNS, "link", "set", PEER, "up"])?;
    ip(&[
        "-n",
        NETNS,
        "route",
        "replace",
        "default",
        "via",
        &HOST_SIDE.to_string(),
    ])?;
    Ok(IpAddr::V4(CANARY))
}

/// Adds `addr` (a /24 neighbour of [`CANARY`], such as 198.18.0.2) to the namespace end
/// of the lab, after [`ensure`]: a second host outside the machine's addresses, for
/// trials that need two destinations apart.
pub fn ensure_address(addr: Ipv4Addr) -> Result<IpAddr, String> {
    ensure()?;
    ensure_addr(Some(NETNS), PEER, &format!("{addr}/24"))?;
    Ok(IpAddr::V4(addr))
}

/// Removes [`NETNS`] and the veth pair (absent is fine), whoever uses them: [`Teardown`]
/// calls it once no other process does.
pub fn remove() {
    let _ = ip(&["netns", "del", NETNS]);
    let _ = ip(&["link", "del", INTERFACE]);
}

/// Held by a run's `main` (a contract binary's): dropped when the run ends, it removes
/// the lab if this process used it and no other test process still does, and prints in
/// one line what it removed, or what it kept and why. A process that never used the lab
/// prints nothing.
#[derive(Debug)]
#[must_use = "the lab is removed when the guard is dropped"]
pub struct Teardown(());

impl Teardown {
    /// The guard; hold it until the run's last line.
    pub fn at_end_of_run() -> Teardown {
        Teardown(())
    }
}

impl Drop for Teardown {
    #[allow(clippy::print_stdout)]
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        {
            // Only a process that used the lab (and so holds the shared lock) decides.
            let Some(Ok(lock)) = USERS.get() else { return };
            let what = format!("netns {NETNS}, link {INTERFACE} with {HOST_SIDE}/24");
            match rustix::fs::flock(lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    remove();
                    println!("egress lab: removed ({what}): no other test process uses it");
                }
                Err(_) => println!(
                    "egress lab: kept ({what}): another test process still uses it; the \
                     last run to end removes it, or `cargo xtask teardown`"
                ),
            }
        }
    }
}

/// A TCP listener bound to `addr` inside [`NETNS`] (non-blocking, ready for
/// `tokio::net::TcpListener::from_std`). A socket keeps the namespace it was made in, so
/// a short-lived thread enters the namespace, binds, and ends; the caller's threads never
/// change namespace.
#[cfg(target_os = "linux")]
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/run/netns/{NETNS}"))
            .map_err(|e| format!("open the namespace {NETNS}: {e}"))?;
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&ns),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| format!("enter the namespace {NETNS}: {e}"))?;
        let l = std::net::TcpListener::bind(addr)
            .map_err(|e| format!("bind {addr} in {NETNS}: {e}"))?;
        l.set_nonblocking(true)
            .map_err(|e| format!("listener on {addr}: {e}"))?;
        Ok(l)
    })
    .join()
    .map_err(|_| "the namespace thread panicked".to_string())?
}

/// Network namespaces are Linux's: elsewhere the lab has no canary.
#[cfg(not(target_os = "linux"))]
pub fn bind(_addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    Err("the egress lab needs Linux network namespaces".into())
}

/// A [`Lookup`] that knows a few names and asks the host about the rest.
#[derive(Debug, Clone, Default)]
pub struct Names(BTreeMap<String, Vec<IpAddr>>);

impl Names {
    /// No names yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `name` → `addr`.
    pub fn with(mut self, name: &str, addr: IpAddr) -> Self {
        self.0
            .entry(name.to_ascii_lowercase())
            .or_default()
            .push(addr);
        self
    }
}

impl Lookup for Names {
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>> {
        match self.0.get(name) {
            Some(a) => Box::pin(std::future::ready(Ok(a.clone()))),
            None => HostLookup.lookup(name),
        }
    }
}

/// The name the egress trials put on an allowlist (`.test` is reserved, RFC 6761).
pub const LISTED: &str = "canary.sbx-lab.test";
/// A name the trials' resolver knows (same address) but the allowlist does not.
pub const UNLISTED: &str = "unlisted.sbx-lab.test";

/// [`ensure`], then teaches this process's egress resolver [`LISTED`] and [`UNLISTED`]
/// (both → [`CANARY`]; every other name still resolves through the host).
pub fn install() -> Result<IpAddr, String> {
    let addr = ensure()?;
    sandbox_container::egress::set_lookup(std::sync::Arc::new(
        Names::new().with(LISTED, addr).with(UNLISTED, addr),
    ))
    .map_err(|e| e.to_string())?;
    Ok(addr)
}
