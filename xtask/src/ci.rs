//! `cargo xtask ci`: everything CI checks, so a green local run means a green CI run
//! (STYLE.md). `.ci/run` adds the machine setup, the leftover-container check and teardown.

use anyhow::Result;

use crate::process;

/// fmt, clippy, the full test command, then the docs drift check.
pub fn run() -> Result<()> {
    println!("ci: cargo fmt --all --check");
    process::run(process::cargo().args(["fmt", "--all", "--check"]))?;
    println!("ci: cargo clippy --workspace --all-targets -- -D warnings");
    process::run(process::cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    crate::test::run(&[])?;
    crate::docs::run(true)
}
