//! `cargo xtask python`: the Python wheel end to end. Builds the wheel with maturin (pip
//! installs maturin into a virtual environment under the target directory, never
//! system-wide), installs it into fresh virtual environments, runs sandboxio 0.1.0's
//! conformance suite on the Docker and Podman backends and on the reference
//! `sandboxio-docker` adapter (pytest), the timing comparison, and the README's Python
//! example with the wheel users get, alone: the suite's fault proxy and canary come from a
//! second, test-only wheel (`crates/sandbox-py-testkit`).
//!
//! Python 3.12+ is preferred (sandboxio's classifiers); 3.10 and 3.11 work, installed with
//! `--ignore-requires-python` below 3.12. Without any Python the step is skipped with a
//! note, except under `CI=true`, where it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::process;

/// The sandboxio release the suite and the example are pinned to.
const SANDBOXIO: &str = "sandboxio==0.1.0";
/// The reference adapter the suite runs beside.
const SANDBOXIO_DOCKER: &str = "sandboxio-docker==0.1.0";
const MATURIN: &str = "maturin>=1.7,<2";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// `major.minor` of `python`, when it runs and has `venv` and `ensurepip`.
fn version_of(python: &Path) -> Option<(u32, u32)> {
    let out = process::probe(Command::new(python).args([
        "-c",
        "import sys, venv, ensurepip; print('%d %d' % sys.version_info[:2])",
    ]))
    .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace().map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// The interpreter to use: `SBX_PYTHON`, else the newest 3.12+ on PATH or under pyenv,
/// else `python3` when it is 3.11 or later (sandboxio's code needs 3.11).
fn find_python() -> Option<(PathBuf, (u32, u32))> {
    if let Some(p) = std::env::var_os("SBX_PYTHON") {
        let p = PathBuf::from(p);
        return version_of(&p).map(|v| (p, v));
    }
    let mut candidates: Vec<PathBuf> = ["python3.14", "python3.13", "python3.12"]
        .iter()
        .filter_map(|name| process::find_in_path(name))
        .collect();
    let pyenv = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
    if let Some(versions) = pyenv.map(|p| p.join("versions"))
        && let Ok(entries) = std::fs::read_dir(versions)
    {
        candidates.extend(entries.flatten().map(|e| e.path().join("bin/python3")));
    }
    let best = candidates
        .into_iter()
        .filter_map(|p| version_of(&p).map(|v| (p, v)))
        .filter(|(_, v)| *v >= (3, 12))
        .max_by_key(|(_, v)| *v);
    best.or_else(|| {
        let p = process::find_in_path("python3")?;
        version_of(&p).filter(|v| *v >= (3, 11)).map(|v| (p, v))
    })
}

/// A fresh virtual environment at `dir` (an old one is removed first).
fn fresh_venv(python: &Path, dir: &Path) -> Result<PathBuf> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
    }
    process::run(Command::new(python).arg("-m").arg("venv").arg(dir))?;
    Ok(dir.join("bin/python"))
}

fn pip_install(venv_python: &Path, old_python: bool, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new(venv_python);
    cmd.args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]);
    if old_python {
        // sandboxio's metadata names a newer floor than its code needs.
        cmd.arg("--ignore-requires-python");
    }
    process::run(cmd.args(args))
}

/// Builds the crate at `crate_dir` into `out` (emptied first); returns the one wheel.
fn build_wheel(
    maturin: &Path,
    python: &Path,
    crate_dir: &Path,
    out: &Path,
    release: bool,
) -> Result<PathBuf> {
    if out.exists() {
        std::fs::remove_dir_all(out)?;
    }
    let mut cmd = Command::new(maturin);
    cmd.current_dir(crate_dir).arg("build");
    if release {
        cmd.arg("--release");
    }
    cmd.arg("--out").arg(out).arg("-i").arg(python);
    // Cargo's compile lines would fill the tail of a CI log that is all a CI service may
    // keep; errors and warnings still print.
    cmd.env("CARGO_TERM_QUIET", "true");
    println!("python: {}", process::describe(&cmd));
    process::run(&mut cmd)?;
    let wheel = std::fs::read_dir(out)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("maturin left no wheel in {}", out.display()))?;
    Ok(wheel)
}

/// The README's Python example, which must be the example file verbatim.
fn check_readme_example(root: &Path, example: &Path) -> Result<()> {
    let readme = std::fs::read_to_string(root.join("README.md"))?;
    let code = std::fs::read_to_string(example)?;
    if !readme.contains(code.trim()) {
        bail!(
            "README.md's Python example differs from {}: keep them identical",
            example.display()
        );
    }
    Ok(())
}

/// Builds, installs and runs everything described in the module docs.
pub fn run() -> Result<()> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let Some((python, version)) = find_python() else {
        if ci {
            bail!(
                "no Python 3.11+ with venv and ensurepip found: `cargo xtask setup` installs \
                 python3, python3-venv and python3-pip (or set SBX_PYTHON)"
            );
        }
        println!("python: skipped: no Python 3.11+ with venv found (set SBX_PYTHON)");
        return Ok(());
    };
    let old_python = version < (3, 12);
    println!(
        "python: using {} ({}.{}{})",
        python.display(),
        version.0,
        version.1,
        if old_python {
            ", --ignore-requires-python"
        } else {
            ""
        }
    );
    let root = workspace_root();
    let crate_dir = root.join("crates/sandbox-py");
    let example = crate_dir.join("examples/first_sandbox.py");
    check_readme_example(&root, &example)?;
    let dir = target_dir(&root).join("python");
    std::fs::create_dir_all(&dir)?;

    // Build tools live in their own environment, kept between runs.
    let tools = dir.join("tools");
    let maturin = tools.join("bin/maturin");
    if !maturin.exists() {
        let py = fresh_venv(&python, &tools)?;
        pip_install(&py, false, &[MATURIN])?;
    }
    let tools_python = tools.join("bin/python");
    // The wheel users get, optimised (the timings are taken with it); the test-only
    // module (fault proxy, canary) in a wheel of its own, unoptimised: it only relays.
    let wheel = build_wheel(
        &maturin,
        &tools_python,
        &crate_dir,
        &dir.join("wheels"),
        true,
    )?;
    let testkit = build_wheel(
        &maturin,
        &tools_python,
        &root.join("crates/sandbox-py-testkit"),
        &dir.join("wheels-testkit"),
        false,
    )?;
    let wheel = wheel.to_string_lossy().into_owned();
    let testkit = testkit.to_string_lossy().into_owned();

    let mut failed = Vec::new();

    // The conformance suite: sandbox-rs on both engines, then the reference adapter.
    let suite = fresh_venv(&python, &dir.join("venv-suite"))?;
    pip_install(
        &suite,
        old_python,
        &[&wheel, &testkit, SANDBOXIO, SANDBOXIO_DOCKER, "pytest"],
    )?;
    let report = dir.join("suite.xml");
    // pytest keeps its tests' temporary directories (the last three runs) under
    // /tmp/pytest-of-<user> by default: here they go below the build output and are
    // removed after the run, so no test file outlives it.
    let basetemp = dir.join("pytest-tmp");
    let mut pytest = Command::new(&suite);
    pytest
        .current_dir(crate_dir.join("tests"))
        // Nothing may be written into the checkout: no bytecode, no pytest cache.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("SBX_PY_REFERENCE", "1")
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"])
        .arg("--basetemp")
        .arg(&basetemp)
        .arg("--junitxml")
        .arg(&report);
    println!("python: {}", process::describe(&pytest));
    if let Err(e) = crate::digest::run_teed(&mut pytest, "python conformance suite") {
        eprintln!("python: {e:#}");
        failed.push("conformance suite");
    }
    let _ = std::fs::remove_dir_all(&basetemp);
    // Per area, both adapters side by side: passed / skipped / failed.
    let mut areas = Command::new(&suite);
    areas
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg(crate_dir.join("bench/areas.py"))
        .arg(&report);
    if let Err(e) = process::run(&mut areas) {
        eprintln!("python: {e:#}");
        failed.push("per-area table");
    }

    let mut compare = Command::new(&suite);
    compare
        .current_dir(&dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg(crate_dir.join("bench/compare.py"))
        // The opt-in warm pool is timed apart from the like-for-like table.
        .args(["--rounds", "3", "--pool", "2", "--check"]);
    println!("python: {}", process::describe(&compare));
    if let Err(e) = process::run(&mut compare) {
        eprintln!("python: {e:#}");
        failed.push("timing comparison");
    }

    // The README's example, with the wheel users install and nothing else but sandboxio.
    let plain = fresh_venv(&python, &dir.join("venv-example"))?;
    pip_install(&plain, old_python, &[&wheel, SANDBOXIO])?;
    let mut run_example = Command::new(&plain);
    run_example
        .current_dir(&dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg(&example);
    println!("python: {}", process::describe(&run_example));
    match process::stdout_of(&mut run_example) {
        Ok(out) if out.contains("hello from sandbox-rs") => println!("{out}"),
        Ok(out) => {
            eprintln!("python: the example printed {out:?}");
            failed.push("README example");
        }
        Err(e) => {
            eprintln!("python: {e:#}");
            failed.push("README example");
        }
    }

    if !failed.is_empty() {
        bail!("python: failed: {}", failed.join(", "));
    }
    Ok(())
}
