//! `cargo xtask ci`: everything CI checks, so a green local run means a green CI run
//! (STYLE.md). `.ci/run` runs the same checks (a test keeps the two lists in step) and adds
//! the machine setup, the leftover-container check and teardown.
//!
//! Every check runs even when an earlier one fails, so one log shows every failure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::process;
use crate::report::seconds;

/// The plain cargo invocations CI runs besides the tests, in order. `.ci/run` runs exactly
/// these command lines too.
const CARGO_CHECKS: &[(&str, &[&str])] = &[
    ("fmt", &["fmt", "--all", "--", "--check"]),
    (
        "clippy",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    ),
    // `--workspace` builds unify features (the CLI turns on docker's `tls`, tests turn on
    // the fake), so the libraries' own configurations are built on their own as well:
    // the facade with no engine (its missing-feature paths), docker without TLS.
    (
        "facade without engines",
        &[
            "test",
            "-p",
            "sandbox-rs",
            "--no-default-features",
            "--features",
            "fake",
        ],
    ),
    (
        "docker without tls",
        &["check", "-p", "sandbox-rs-docker", "--all-targets"],
    ),
    // The agent binary the library embeds, rebuilt and compared byte for byte.
    ("agent --check", &["xtask", "agent", "--check"]),
    // Would `cargo publish` work (names, metadata, versions, packaged files)? Offline,
    // seconds.
    ("publish-check", &["xtask", "publish-check"]),
];

/// fmt, clippy, the feature configurations, the full test command, the docs drift check,
/// and finally that none of it changed the checkout.
pub fn run() -> Result<()> {
    let checkout = checkout_root();
    // Read before anything runs; a failure to read it fails only the last check.
    let before = checkout_state(&checkout);
    let mut failed = Vec::new();
    let mut check = |name: &str, f: &mut dyn FnMut() -> Result<()>| {
        println!("ci: === {name}");
        let start = Instant::now();
        let result = f();
        let took = seconds(start.elapsed());
        match result {
            Ok(()) => println!("ci: === {name}: ok [{took}]"),
            Err(err) => {
                eprintln!("ci: {name}: {err:#}");
                println!("ci: === {name}: FAILED [{took}]");
                failed.push(name.to_string());
            }
        }
    };
    for (name, args) in CARGO_CHECKS {
        check(name, &mut || {
            let mut cmd = process::cargo();
            cmd.args(*args);
            println!("ci: {}", process::describe(&cmd));
            process::run(&mut cmd)
        });
    }
    check("feature budget", &mut || {
        feature_budget().map(|summary| println!("ci: {summary}"))
    });
    check("test", &mut || crate::test::run(&[]));
    check("docs --check", &mut || crate::docs::run(true));
    check("checkout unchanged", &mut || match &before {
        Ok(before) => checkout_unchanged(&checkout, before),
        Err(err) => bail!("the checkout's state before the run is unknown: {err:#}"),
    });
    if !failed.is_empty() {
        bail!("ci failed: {}", failed.join(", "));
    }
    Ok(())
}

/// The repository checkout (xtask lives in `<checkout>/xtask`).
fn checkout_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// `git status` entries (status and path, untracked files listed one by one).
fn checkout_state(checkout: &Path) -> Result<BTreeSet<String>> {
    let status = process::stdout_of(
        Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=all"])
            .current_dir(checkout),
    )
    .context("reading the checkout's state")?;
    Ok(status.lines().map(str::to_string).collect())
}

/// Tests must leave no file in the checkout (the Podman service once dropped conmon's
/// `oom` marker there): any `git status` entry that was not there before is a failure.
fn checkout_unchanged(checkout: &Path, before: &BTreeSet<String>) -> Result<()> {
    let after = checkout_state(checkout)?;
    let new: Vec<&String> = after.difference(before).collect();
    if !new.is_empty() {
        bail!(
            "the checkout {} changed during the run: {new:?}",
            checkout.display()
        );
    }
    println!(
        "ci: checkout unchanged ({} entries before and after)",
        before.len()
    );
    Ok(())
}

/// One rule about a crate's dependency graph, checked with `cargo tree`.
struct Budget {
    /// What the rule protects, for the failure message.
    why: &'static str,
    /// `cargo tree` arguments (always with `--prefix none`).
    tree: &'static [&'static str],
    /// Lines (package names or `tokio feature "x"`) that must not appear.
    forbidden: &'static [&'static str],
    /// Lines that must appear.
    required: &'static [&'static str],
}

const BUDGETS: &[Budget] = &[
    Budget {
        why: "sandbox-core must not choose a runtime for adapter authors (tests included)",
        tree: &["-e", "features", "-p", "sandbox-rs-core"],
        forbidden: &[r#"tokio feature "rt-multi-thread""#],
        required: &[],
    },
    Budget {
        why: "sandbox-core needs only tokio's rt, sync and time",
        tree: &["-e", "normal,features", "-p", "sandbox-rs-core"],
        forbidden: &[
            r#"tokio feature "rt-multi-thread""#,
            r#"tokio feature "macros""#,
            r#"tokio feature "fs""#,
        ],
        required: &[],
    },
    Budget {
        why: "a production build of the facade carries the engines, not the fake or the \
              remote-engine TLS connector (rustls itself comes with the credentials broker)",
        tree: &["-e", "normal", "-p", "sandbox-rs"],
        forbidden: &["sandbox-rs-fake", "hyper-rustls"],
        required: &["sandbox-rs-docker", "sandbox-rs-podman"],
    },
    Budget {
        why: "the CLI ships every first-party engine, the fake and TLS",
        tree: &["-e", "normal", "-p", "sandbox-rs-cli"],
        forbidden: &[],
        required: &[
            "sandbox-rs-docker",
            "sandbox-rs-podman",
            "sandbox-rs-fake",
            "rustls",
        ],
    },
];

/// Checks every [`BUDGETS`] rule; the summary names how many held.
pub fn feature_budget() -> Result<String> {
    let mut violations = Vec::new();
    for budget in BUDGETS {
        let mut cmd = process::cargo();
        cmd.arg("tree")
            .args(budget.tree)
            .args(["--prefix", "none"])
            .current_dir(checkout_root());
        let tree = process::stdout_of(&mut cmd)?;
        violations.extend(budget_violations(budget, &tree));
    }
    if !violations.is_empty() {
        bail!("feature budget exceeded:\n  {}", violations.join("\n  "));
    }
    Ok(format!("feature budget: {} rules hold", BUDGETS.len()))
}

/// What `tree` (`cargo tree --prefix none` output) breaks of `budget`.
fn budget_violations(budget: &Budget, tree: &str) -> Vec<String> {
    let nodes = tree_nodes(tree);
    let command = format!("cargo tree {} --prefix none", budget.tree.join(" "));
    let forbidden = budget
        .forbidden
        .iter()
        .filter(|node| nodes.contains(**node))
        .map(|node| format!("`{command}` has {node}: {}", budget.why));
    let missing = budget
        .required
        .iter()
        .filter(|node| !nodes.contains(**node))
        .map(|node| format!("`{command}` lacks {node}: {}", budget.why));
    forbidden.chain(missing).collect()
}

/// The nodes of a `cargo tree --prefix none` listing: a package's name (`tokio v1.2.3
/// (…)` → `tokio`), or a feature node as printed (`tokio feature "rt"`).
fn tree_nodes(tree: &str) -> BTreeSet<&str> {
    tree.lines()
        .map(str::trim)
        .filter_map(|line| {
            if line.contains(" feature \"") {
                return Some(line.trim_end_matches(" (*)"));
            }
            line.split_whitespace().next()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CORE_TREE_WITH_MULTI_THREAD: &str = r#"sandbox-rs-core v0.1.0 (/w/crates/sandbox-core)
tokio feature "default"
tokio v1.54.1
tokio feature "rt"
tokio feature "rt-multi-thread"
tokio feature "rt" (*)
"#;

    #[test]
    fn a_multi_thread_runtime_in_core_breaks_the_budget() {
        let violations = budget_violations(&BUDGETS[0], CORE_TREE_WITH_MULTI_THREAD);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].contains("rt-multi-thread"));
        let without: String = CORE_TREE_WITH_MULTI_THREAD
            .lines()
            .filter(|l| !l.contains("rt-multi-thread"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(budget_violations(&BUDGETS[0], &without).is_empty());
    }

    #[test]
    fn missing_and_forbidden_packages_are_both_reported() {
        let facade = "sandbox-rs v0.1.0 (/w)\nsandbox-rs-docker v0.1.0 (/w)\nsandbox-rs-fake v0.1.0 (/w)\nhyper-rustls v0.27.1\n";
        let violations = budget_violations(&BUDGETS[2], facade);
        assert_eq!(violations.len(), 3, "{violations:?}");
        assert!(violations.iter().any(|v| v.contains("has sandbox-rs-fake")));
        assert!(violations.iter().any(|v| v.contains("has hyper-rustls")));
        assert!(
            violations
                .iter()
                .any(|v| v.contains("lacks sandbox-rs-podman"))
        );
    }

    /// The real graphs: fails when a manifest change brings back the multi-thread runtime
    /// into sandbox-core, the fake or TLS into the facade's defaults, or drops an engine
    /// from the CLI.
    #[test]
    fn workspace_stays_within_its_feature_budget() {
        if let Err(err) = feature_budget() {
            panic!("{err:#}");
        }
    }

    /// `.ci/run` runs every cargo check `cargo xtask ci` runs, and the docs drift check.
    #[test]
    fn ci_script_runs_the_same_checks() {
        let script = std::fs::read_to_string(checkout_root().join(".ci/run")).unwrap();
        for (name, args) in CARGO_CHECKS {
            let line = format!("cargo {}", args.join(" "));
            assert!(script.contains(&line), ".ci/run lacks {name}: `{line}`");
        }
        for line in ["cargo xtask test", "cargo xtask docs --check"] {
            assert!(script.contains(line), ".ci/run lacks `{line}`");
        }
    }

    #[test]
    fn a_file_left_in_the_checkout_fails_the_check() {
        let repo = std::env::temp_dir().join(format!("xtask-ci-checkout-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&repo);
        std::fs::create_dir_all(&repo).unwrap();
        let git = |args: &[&str]| {
            let status = Command::new("git")
                .args(args)
                .current_dir(&repo)
                .output()
                .unwrap()
                .status;
            assert!(status.success(), "git {args:?}");
        };
        git(&["init", "-q"]);
        std::fs::write(repo.join("already-dirty"), "x").unwrap();
        let before = checkout_state(&repo).unwrap();
        assert!(checkout_unchanged(&repo, &before).is_ok());
        std::fs::write(repo.join("oom"), "").unwrap();
        let err = checkout_unchanged(&repo, &before).unwrap_err();
        assert!(format!("{err:#}").contains("oom"), "{err:#}");
        std::fs::remove_dir_all(&repo).unwrap();
    }

    #[test]
    fn feature_nodes_and_package_names_are_parsed() {
        let nodes = tree_nodes("tokio feature \"rt\" (*)\nbollard v0.21.1\n\n");
        assert!(nodes.contains("tokio feature \"rt\""));
        assert!(nodes.contains("bollard"));
    }
}
