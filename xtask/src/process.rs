//! Running host programs. Every external command goes through here so a failure always
//! names the command line and carries the program's own stderr.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

/// `cargo` as invoked by the user (`$CARGO`, set by `cargo xtask`), else `cargo` on PATH.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo")))
}

/// The command line, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `cmd` with the terminal attached; an unsuccessful exit is an error naming it.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Runs `cmd` capturing its output, whatever its exit status (for probes).
pub fn probe(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{}`", describe(cmd)))
}

/// Runs `cmd` and returns its trimmed stdout; a failure carries its stderr.
pub fn stdout_of(cmd: &mut Command) -> Result<String> {
    let output = probe(cmd)?;
    if !output.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(cmd),
            output.status,
            last_lines(&String::from_utf8_lossy(&output.stderr), 15)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The last `n` lines of `text`, trimmed, for error messages that must stay readable.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The last lines of a log file, or a note that it cannot be read.
pub fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => last_lines(&String::from_utf8_lossy(&bytes), n),
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}

/// Where `program` resolves on PATH, like `command -v`.
pub fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Sends `signal` (e.g. "HUP", "TERM") to `pid`. Through `sh`'s builtin `kill`: the only
/// safe way without `unsafe` or a libc wrapper crate, and `sh` is on every machine
/// (procps' `/bin/kill` is not).
pub fn send_signal(pid: u32, signal: &str) -> Result<()> {
    run(Command::new("sh")
        .args(["-c", "kill -s \"$1\" \"$2\"", "sh", signal])
        .arg(pid.to_string()))
}
