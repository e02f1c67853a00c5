//! Test support for egress trials that never leave the machine (not part of the API).
//!
//! A dummy (or empty bridge) interface on the host carries [`CANARY`] (198.18.0.1, from RFC 2544's
//! benchmarking range: never routed on the internet, and inside no engine's address
//! pool). A server bound there is reachable from a sandbox through its gateway like any
//! outside host would be, yet the packets never leave this machine; and since it is not
//! an engine network's address, egress `Allow` may reach it while the host's bridge
//! addresses stay blocked. [`Names`] teaches the egress resolver names only the test knows.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use futures::future::BoxFuture;

use super::{HostLookup, Lookup};

/// The dummy interface's name.
pub const INTERFACE: &str = "sbx-lab0";

/// The canary address on [`INTERFACE`].
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

/// Ensures [`INTERFACE`] exists, is up and holds [`CANARY`]/32 (needs root; idempotent:
/// concurrent test processes may all call it). Returns the address.
pub fn ensure() -> Result<IpAddr, String> {
    if ip(&["link", "show", INTERFACE]).is_err() {
        // Another process may create it between the check and here: the re-check decides.
        // A dummy interface where the kernel has the module, else an empty bridge (every
        // engine host has bridges); either holds a local address without any port.
        if ip(&["link", "add", INTERFACE, "type", "dummy"]).is_err() {
            let _ = ip(&["link", "add", INTERFACE, "type", "bridge"]);
        }
        ip(&["link", "show", INTERFACE])?;
    }
    let addr = format!("{CANARY}/32");
    let shown = ip(&["-4", "addr", "show", "dev", INTERFACE])?;
    if !shown.contains(&addr) {
        let _ = ip(&["addr", "add", &addr, "dev", INTERFACE]);
        if !ip(&["-4", "addr", "show", "dev", INTERFACE])?.contains(&addr) {
            return Err(format!("{addr} could not be added to {INTERFACE}"));
        }
    }
    ip(&["link", "set", INTERFACE, "up"])?;
    Ok(IpAddr::V4(CANARY))
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
    super::set_lookup(std::sync::Arc::new(
        Names::new().with(LISTED, addr).with(UNLISTED, addr),
    ))
    .map_err(|e| e.to_string())?;
    Ok(addr)
}

static FAIL_NEXT_APPLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes the next egress apply in this process fail after the container started (as a
/// failing `nft` would), so a test can prove the failure leaves no container behind.
pub fn fail_next_apply() {
    FAIL_NEXT_APPLY.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether an injected failure is due (and consumes it).
pub(crate) fn take_injected_failure() -> bool {
    FAIL_NEXT_APPLY.swap(false, std::sync::atomic::Ordering::SeqCst)
}
