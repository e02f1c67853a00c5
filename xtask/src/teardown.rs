//! `cargo xtask teardown`: stops the daemons `setup` started (their pids are in
//! `/run/sandbox-rs/*.pid`) and nothing else — an engine someone else runs is left alone.

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
    if !errors.is_empty() {
        anyhow::bail!("teardown incomplete: {}", errors.join("; "));
    }
    Ok(())
}
