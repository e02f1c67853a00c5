//! The failure digest: the few lines of each failed test that a CI log must show at its
//! end. A CI service that keeps only the tail of a long log (the compile lines of the
//! Python wheel alone fill a screen) otherwise shows that trials failed but not why.
//!
//! `cargo xtask test` runs every test binary through [`run_teed`], which copies its
//! stdout to the terminal and to a log under `target/test-logs/`; when the binary fails,
//! the failures it printed (libtest's `---- NAME stdout ----` and libtest-mimic's
//! `---- NAME ----` sections) are shortened to their first lines and appended to
//! `target/ci-failures.txt`, with the last warnings and errors of the engine daemons that
//! setup started. `cargo xtask test` prints that file last, and `.ci/run` prints it again
//! after its final checks.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::daemons;
use crate::process;

/// Lines kept of each failed test's message.
const LINES_PER_FAILURE: usize = 6;
/// Characters kept of each of those lines.
const CHARS_PER_LINE: usize = 300;
/// Failed tests listed in full per binary; the rest are named only.
const FAILURES_IN_FULL: usize = 30;
/// Warning and error lines kept from each engine daemon's log.
const DAEMON_LINES: usize = 15;

fn target_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(PathBuf::from(dir));
    }
    Ok(crate::contract::workspace_root()?.join("target"))
}

/// Where the digest of this `cargo xtask test` run is written.
pub fn path() -> Result<PathBuf> {
    Ok(target_dir()?.join("ci-failures.txt"))
}

/// Starts a new digest (a passing run must not print an old run's failures).
pub fn reset() -> Result<()> {
    let path = path()?;
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// Prints the digest, if this run recorded any failure.
pub fn print() -> Result<()> {
    let path = path()?;
    if let Ok(text) = fs::read_to_string(&path) {
        println!("=== failure digest ({})", path.display());
        print!("{text}");
        println!("=== end of failure digest");
    }
    Ok(())
}

/// Runs `cmd` like [`process::run`], copying its stdout to the terminal and to
/// `target/test-logs/<label>.log`; on failure, records its failed tests in the digest
/// under `label`.
pub fn run_teed(cmd: &mut Command, label: &str) -> Result<()> {
    let logs = target_dir()?.join("test-logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let log_path = logs.join(format!("{}.log", slug(label)));
    let mut log =
        fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{}`", process::describe(cmd)))?;
    let stdout = child.stdout.take().context("child stdout was not piped")?;
    let mut out = std::io::stdout();
    // Byte lines, not `String` lines: a test may print invalid UTF-8.
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .context("reading the test binary's output")?;
        if n == 0 {
            break;
        }
        // The terminal copy matters more than the log: a full disk must not stop the run.
        out.write_all(&line).ok();
        out.flush().ok();
        log.write_all(&line).ok();
    }
    let status = child.wait().context("waiting for the test binary")?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read(&log_path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    if let Err(err) = record(label, &text, &log_path) {
        eprintln!("digest: could not record the failures of {label}: {err:#}");
    }
    bail!("`{}` failed ({status})", process::describe(cmd))
}

/// The failed tests of `label`'s last run, from its log (empty when there is none).
pub fn failed_in_log(label: &str) -> Vec<String> {
    let Ok(dir) = target_dir() else {
        return Vec::new();
    };
    let path = dir.join("test-logs").join(format!("{}.log", slug(label)));
    let text = fs::read(&path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    failures(&text).into_iter().map(|(name, _)| name).collect()
}

/// Records that `label`'s failed tests `names` all passed when rerun alone.
pub fn note_flaky(label: &str, names: &[String]) -> Result<()> {
    let path = path()?;
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(
        file,
        "--- {label}: FLAKY, not failed: the {} test(s) above passed when rerun alone: {}",
        names.len(),
        names.join(", ")
    )
    .with_context(|| format!("writing {}", path.display()))
}

/// Appends `label`'s failures (parsed from its output `text`) and the engines' recent
/// complaints to the digest.
fn record(label: &str, text: &str, log_path: &Path) -> Result<()> {
    let failures = failures(text);
    let mut entry = format!(
        "--- {label}: {} failed test(s); full output in {}\n",
        failures.len(),
        log_path.display()
    );
    for (i, (name, lines)) in failures.iter().enumerate() {
        if i == FAILURES_IN_FULL {
            entry.push_str("  (the rest named only)\n");
        }
        entry.push_str(&format!("* {name}\n"));
        if i < FAILURES_IN_FULL {
            for line in lines {
                entry.push_str(&format!("    {line}\n"));
            }
        }
    }
    if failures.is_empty() {
        // Not a test failure (a build error, a crash): its last lines say what happened.
        for line in last_lines(text, LINES_PER_FAILURE * 2) {
            entry.push_str(&format!("    {line}\n"));
        }
    }
    let engines: &[&daemons::Daemon] = if label.contains("podman") {
        &[&daemons::PODMAN]
    } else if label.contains("docker") {
        &[&daemons::DOCKERD]
    } else {
        &[&daemons::DOCKERD, &daemons::PODMAN]
    };
    for daemon in engines {
        let path = daemon.log_file();
        let Ok(bytes) = fs::read(&path) else { continue };
        let complaints = complaints(&String::from_utf8_lossy(&bytes));
        if !complaints.is_empty() {
            entry.push_str(&format!("  last warnings/errors in {}:\n", path.display()));
            for line in complaints {
                entry.push_str(&format!("    {line}\n"));
            }
        }
    }
    let path = path()?;
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    file.write_all(entry.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// The failed tests of a libtest or libtest-mimic output, each with the first lines of
/// its message.
fn failures(text: &str) -> Vec<(String, Vec<String>)> {
    let mut found: Vec<(String, Vec<String>)> = Vec::new();
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if let Some(name) = section_name(line) {
            found.push((name.to_string(), Vec::new()));
            current = Some(found.len() - 1);
            continue;
        }
        // The list of names after the sections, and the summary, end the last section.
        if line == "failures:" || line.starts_with("test result:") {
            current = None;
            continue;
        }
        if let Some(i) = current {
            let kept = &mut found[i].1;
            let trimmed = line.trim_end();
            if kept.len() < LINES_PER_FAILURE && !trimmed.is_empty() {
                kept.push(shorten(trimmed));
            }
        }
    }
    found
}

/// `NAME` of a `---- NAME stdout ----` (libtest) or `---- NAME ----` (libtest-mimic) line.
fn section_name(line: &str) -> Option<&str> {
    let inner = line.strip_prefix("---- ")?.strip_suffix(" ----")?;
    let name = inner.strip_suffix(" stdout").unwrap_or(inner);
    (!name.is_empty() && !name.contains(' ')).then_some(name)
}

/// The last warning and error lines of an engine daemon's log.
fn complaints(log: &str) -> Vec<String> {
    let mut lines: Vec<String> = log
        .lines()
        .filter(|l| {
            // Routine after every container's end: noise that would push out the news.
            if l.contains("cleaning up after shim disconnected") || l.contains("cleanup warnings") {
                return false;
            }
            let lower = l.to_ascii_lowercase();
            lower.contains("level=error")
                || lower.contains("level=warn")
                || lower.contains("level=fatal")
                || lower.contains("panic")
        })
        .map(shorten)
        .collect();
    let skip = lines.len().saturating_sub(DAEMON_LINES);
    lines.drain(..skip);
    lines
}

fn last_lines(text: &str, n: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| shorten(l))
        .collect()
}

fn shorten(line: &str) -> String {
    if line.chars().count() <= CHARS_PER_LINE {
        return line.to_string();
    }
    let mut s: String = line.chars().take(CHARS_PER_LINE).collect();
    s.push('…');
    s
}

/// A file name for a run's label (`docker (runsc)` → `docker-runsc`).
fn slug(label: &str) -> String {
    let mut s = String::new();
    for c in label.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') && !s.is_empty() {
            s.push('-');
        }
    }
    s.trim_end_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_mimic_failures_are_parsed_with_their_first_lines() {
        let out = "\
test a::ok ... ok
test a::bad ... FAILED

failures:

---- a::bad ----
Error: the sandbox did not answer
Caused by:
    engine: connection refused

---- b::worse ----
Error: x
1
2
3
4
5
6
7

failures:
    a::bad
    b::worse

test result: FAILED. 1 passed; 2 failed;
";
        let f = failures(out);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].0, "a::bad");
        assert_eq!(
            f[0].1,
            vec![
                "Error: the sandbox did not answer",
                "Caused by:",
                "    engine: connection refused"
            ]
        );
        assert_eq!(f[1].0, "b::worse");
        assert_eq!(f[1].1.len(), LINES_PER_FAILURE);
    }

    #[test]
    fn libtest_sections_carry_stdout_in_their_header() {
        let out = "failures:\n\n---- tests::it stdout ----\nthread 'x' panicked at a.rs:1:1:\nboom\n\nfailures:\n    tests::it\n";
        let f = failures(out);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0, "tests::it");
        assert_eq!(f[0].1, vec!["thread 'x' panicked at a.rs:1:1:", "boom"]);
    }

    #[test]
    fn daemon_complaints_keep_the_last_warnings_and_errors() {
        let mut log = String::new();
        for i in 0..40 {
            log.push_str(&format!("time=x level=info msg=\"fine {i}\"\n"));
            log.push_str(&format!("time=x level=error msg=\"bad {i}\"\n"));
        }
        let c = complaints(&log);
        assert_eq!(c.len(), DAEMON_LINES);
        assert!(c.last().unwrap().contains("bad 39"));
        assert!(c.iter().all(|l| l.contains("level=error")));
    }

    #[test]
    fn labels_become_file_names() {
        assert_eq!(slug("docker (runsc)"), "docker-runsc");
        assert_eq!(slug("podman (exec path)"), "podman-exec-path");
        assert_eq!(slug("cargo test --workspace"), "cargo-test-workspace");
    }
}
