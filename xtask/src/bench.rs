//! `cargo xtask bench [-- <args>...]`: builds and runs the `sandbox-bench` binary
//! (`crates/sandbox-bench`) in release mode on every backend and regenerates
//! `docs/benchmarks.md`. Arguments after `--` go to the binary (e.g. `--runs 10`,
//! `--backend docker`, `--quick`, `--json`); `--backend` and `--report` given there replace
//! the defaults (`--backend all --report docs/benchmarks.md`).
//!
//! `cargo xtask bench --load [-- <args>...]` runs `sandbox-bench load` instead: many live
//! sandboxes per engine, held and churned for tens of minutes, so it is never part of
//! `cargo xtask test` or `ci`; it rewrites only the load section of the same report.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;

use crate::process;

/// The report the command regenerates.
fn report_path() -> PathBuf {
    let xtask = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    xtask
        .parent()
        .map(|root| root.join("docs/benchmarks.md"))
        .unwrap_or_else(|| xtask.join("../docs/benchmarks.md"))
}

/// The binary's arguments: the defaults unless the passthrough overrides them.
pub fn bench_args(passthrough: &[String]) -> Vec<String> {
    let given = |flag: &str| {
        passthrough
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    let mut args = Vec::new();
    if !given("--backend") {
        args.extend(["--backend".to_string(), "all".to_string()]);
    }
    if !given("--report") {
        args.extend([
            "--report".to_string(),
            report_path().to_string_lossy().into_owned(),
        ]);
    }
    args.extend(passthrough.iter().cloned());
    args
}

/// The load run's arguments: the `load` subcommand, the report unless given, then the
/// passthrough.
pub fn load_args(passthrough: &[String]) -> Vec<String> {
    let mut args = vec!["load".to_string()];
    if !passthrough
        .iter()
        .any(|a| a == "--report" || a.starts_with("--report="))
    {
        args.extend([
            "--report".to_string(),
            report_path().to_string_lossy().into_owned(),
        ]);
    }
    args.extend(passthrough.iter().cloned());
    args
}

/// Runs the load benchmark and rewrites the report's load section.
pub fn run_load(passthrough: &[String]) -> Result<()> {
    run_bench(
        load_args(passthrough),
        "cargo xtask bench --load",
        passthrough,
        "load run",
    )
}

/// Runs the benchmarks and regenerates the report.
pub fn run(passthrough: &[String]) -> Result<()> {
    run_bench(
        bench_args(passthrough),
        "cargo xtask bench",
        passthrough,
        "run",
    )
}

/// `sandbox-bench` in release with `args`; the report records `invoked` (plus the
/// passthrough) as the command that made it.
fn run_bench(args: Vec<String>, invoked: &str, passthrough: &[String], what: &str) -> Result<()> {
    let start = Instant::now();
    let mut cmd = process::cargo();
    cmd.args(["run", "--release", "--quiet", "-p", "sandbox-bench", "--"])
        .args(args);
    let mut invoked = invoked.to_string();
    if !passthrough.is_empty() {
        invoked.push_str(" -- ");
        invoked.push_str(&passthrough.join(" "));
    }
    cmd.env("SANDBOX_BENCH_COMMAND", &invoked);
    println!("bench: {}", process::describe(&cmd));
    let result = process::run(&mut cmd);
    println!(
        "bench: {what} finished in {:.0} s (build included)",
        start.elapsed().as_secs_f64()
    );
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn defaults_to_all_backends_and_the_docs_report() {
        let a = bench_args(&[]);
        assert_eq!(&a[..2], &s(&["--backend", "all"])[..]);
        assert_eq!(a[2], "--report");
        assert!(a[3].ends_with("docs/benchmarks.md"));
    }

    #[test]
    fn load_runs_the_subcommand_into_the_docs_report() {
        let a = load_args(&s(&["--population", "100"]));
        assert_eq!(a[0], "load");
        assert_eq!(a[1], "--report");
        assert!(a[2].ends_with("docs/benchmarks.md"));
        assert!(a.ends_with(&s(&["--population", "100"])));
        let own = load_args(&s(&["--report", "x.md"]));
        assert_eq!(own, s(&["load", "--report", "x.md"]));
    }

    #[test]
    fn passthrough_replaces_defaults() {
        let a = bench_args(&s(&["--backend", "docker", "--runs", "5"]));
        assert_eq!(a.iter().filter(|x| *x == "--backend").count(), 1);
        assert!(a.ends_with(&s(&["--backend", "docker", "--runs", "5"])));
        assert!(a.contains(&"--report".to_string()));
    }
}
