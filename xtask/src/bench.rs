//! `cargo xtask bench [-- <args>...]`: builds and runs the `sandbox-bench` binary
//! (`crates/sandbox-bench`) in release mode on every backend and regenerates
//! `docs/benchmarks.md`. Arguments after `--` go to the binary (e.g. `--runs 10`,
//! `--backend docker`, `--quick`, `--json`); `--backend` and `--report` given there replace
//! the defaults (`--backend all --report docs/benchmarks.md`).

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

/// Runs the benchmarks and regenerates the report.
pub fn run(passthrough: &[String]) -> Result<()> {
    let start = Instant::now();
    let mut cmd = process::cargo();
    cmd.args(["run", "--release", "--quiet", "-p", "sandbox-bench", "--"])
        .args(bench_args(passthrough));
    let mut invoked = "cargo xtask bench".to_string();
    if !passthrough.is_empty() {
        invoked.push_str(" -- ");
        invoked.push_str(&passthrough.join(" "));
    }
    cmd.env("SANDBOX_BENCH_COMMAND", &invoked);
    println!("bench: {}", process::describe(&cmd));
    let result = process::run(&mut cmd);
    println!(
        "bench: finished in {:.0} s (build included)",
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
    fn passthrough_replaces_defaults() {
        let a = bench_args(&s(&["--backend", "docker", "--runs", "5"]));
        assert_eq!(a.iter().filter(|x| *x == "--backend").count(), 1);
        assert!(a.ends_with(&s(&["--backend", "docker", "--runs", "5"])));
        assert!(a.contains(&"--report".to_string()));
    }
}
