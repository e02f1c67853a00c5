//! `cargo xtask teardown`: stops the daemons `setup` started (their pids are in
//! `/run/sandbox-rs/*.pid`) and nothing else — an engine someone else runs is left alone —
//! and removes the egress lab if a test left it (the `sbx-lab` network namespace and its
//! veth pair, `sandbox_testkit::egress_lab`: a contract run removes it when it ends, but a
//! run killed midway, or the egress tests of `cargo test`, which have no end-of-run hook,
//! leave it).

use std::time::Instant;

use anyhow::Result;

use crate::daemons::{DOCKERD, PODMAN};
use crate::report::seconds;

/// Stops the Podman service first (it is the lighter one), then dockerd.
pub fn run() -> Result<()> {
    let mut errors = Vec::new();
    for daemon in [&PODMAN, &DOCKERD] {
        let start = Instant::now();
        match daemon.stop_recorded() {
            Ok(Some(pid)) => println!(
                "teardown: {:<8} stopped (pid {pid}) [{}]",
                daemon.name,
                seconds(start.elapsed())
            ),
            Ok(None) => println!(
                "teardown: {:<8} not started by setup; left alone",
                daemon.name
            ),
            Err(err) => errors.push(format!("{}: {err:#}", daemon.name)),
        }
    }
    remove_egress_lab();
    if !errors.is_empty() {
        anyhow::bail!("teardown incomplete: {}", errors.join("; "));
    }
    Ok(())
}

/// Removes the egress lab (names as in `sandbox_testkit::egress_lab`; absent is fine).
fn remove_egress_lab() {
    let had_ns = std::path::Path::new("/run/netns/sbx-lab").exists();
    let quiet = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let removed_ns = had_ns && quiet(&["netns", "del", "sbx-lab"]);
    // Deleting the namespace deletes the pair; an older layout left a host interface alone.
    let removed_link = quiet(&["link", "del", "sbx-lab0"]);
    if removed_ns || removed_link {
        println!("teardown: egress lab removed (netns sbx-lab, link sbx-lab0)");
    }
}
