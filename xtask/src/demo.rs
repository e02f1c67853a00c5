//! `cargo xtask demo`: the first Quick-start command. Makes the machine ready (`setup` is
//! idempotent: a few seconds when everything is in place) and then runs the CLI's demo —
//! create, run_code, stream, proof that egress is denied, teardown — on local Docker.

use anyhow::Result;

use crate::process;

/// Runs `setup`, then `sandbox demo` from the workspace's CLI.
pub fn run() -> Result<()> {
    crate::setup::run(&crate::setup::Options::default())?;
    println!("demo: cargo run -p sandbox-rs-cli -- demo");
    process::run(process::cargo().args(["run", "--quiet", "-p", "sandbox-rs-cli", "--", "demo"]))
}
