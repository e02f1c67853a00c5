//! `cargo xtask test`: the README's test command — the workspace's own tests, then the
//! contract suite on every backend (Docker twice: runc, then gVisor/runsc when the engine
//! registers it — see `contract.rs`; each run prints its own duration), then the Python
//! wheel's conformance run (`python.rs`). An ignored
//! contract trial fails it (no `--allow-ignored` here). All parts run even
//! when one fails, so one CI log shows every failure.

use std::time::Instant;

use anyhow::{Result, bail};

use crate::contract::{self, Backend};
use crate::process;
use crate::report::seconds;

/// Runs `cargo test --workspace`, then `contract fake|docker|podman` (docker: runc and
/// runsc), then `python`.
pub fn run(passthrough: &[String]) -> Result<()> {
    let mut failed = Vec::new();
    let mut timings = Vec::new();

    crate::digest::reset()?;
    let start = Instant::now();
    let mut workspace = process::cargo();
    // --no-fail-fast: one failing test binary must not hide the results of the others.
    workspace.args(["test", "--workspace", "--no-fail-fast"]);
    if !passthrough.is_empty() {
        workspace.arg("--").args(passthrough);
    }
    println!("test: {}", process::describe(&workspace));
    if let Err(err) = crate::digest::run_teed(&mut workspace, "cargo test --workspace") {
        eprintln!("test: {err:#}");
        failed.push("cargo test --workspace".to_string());
    }
    timings.push(format!("workspace {}", seconds(start.elapsed())));

    for backend in Backend::ALL {
        let start = Instant::now();
        if let Err(err) = contract::run(backend, contract::Options::default(), passthrough) {
            eprintln!("test: {err:#}");
            failed.push(format!("contract {}", backend.name()));
        }
        timings.push(format!("{} {}", backend.name(), seconds(start.elapsed())));
    }

    let start = Instant::now();
    if let Err(err) = crate::python::run() {
        eprintln!("test: {err:#}");
        failed.push("python".to_string());
    }
    timings.push(format!("python {}", seconds(start.elapsed())));

    println!("test: timings: {}", timings.join(", "));
    // Last, so that a log cut to its tail still says which tests failed (or were flaky)
    // and why.
    crate::digest::print()?;
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}
