//! `cargo xtask bench`: engine micro-benchmarks (create+start, exec, kill+remove; SPEC §12
//! lists the figures measured so far).

use anyhow::Result;

/// Runs the benchmarks.
pub fn run() -> Result<()> {
    // TODO(lead): drive `sandbox bench` (sandbox-cli) and print a comparison table.
    anyhow::bail!("not yet implemented: `cargo xtask bench`")
}
