//! Drives the built `sandbox` binary.
#![allow(dead_code)]

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// A `sandbox` command with a predictable environment.
pub fn sandbox(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sandbox"));
    c.args(args)
        .env("NO_COLOR", "1")
        .env_remove("SANDBOX_LOG")
        .stdin(Stdio::null());
    c
}

/// Runs to completion.
pub fn run(args: &[&str]) -> Output {
    sandbox(args).output().expect("spawn sandbox")
}

/// Runs `sandbox ARGS` with `input` on stdin.
pub fn run_with_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = sandbox(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write stdin");
    child.wait_with_output().expect("wait")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Parses stdout as one JSON document.
pub fn json(o: &Output) -> Value {
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            stdout(o),
            stderr(o)
        )
    })
}

/// Replaces values that vary between runs (ids, timings, addresses, versions) with
/// placeholders, at any depth, so the snapshot pins the schema and the stable values.
pub fn redact(v: &mut Value) {
    const VARYING: &[&str] = &[
        "id",
        "sandbox_id",
        "ms",
        "total_ms",
        "duration_ms",
        "created_at",
        "age_s",
        "dialed",
        "version",
        "endpoint",
        "endpoint_reason",
    ];
    match v {
        Value::Object(map) => {
            for (k, val) in map.iter_mut() {
                if VARYING.contains(&k.as_str()) && !val.is_null() {
                    *val = Value::String(format!("[{k}]"));
                } else {
                    redact(val);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// Whether a Docker engine answers. With `CI=true` a missing engine is a failure, not a
/// skip.
pub fn docker_available(test: &str) -> bool {
    engine_available("docker", test)
}

/// Whether `engine` (`docker` or `podman`) answers `<engine> info`; with `CI=true` a
/// missing engine is a failure, not a skip.
pub fn engine_available(engine: &str, test: &str) -> bool {
    // Podman's CLI answers `info` without its API service; the CLI under test needs the
    // service, so ask through it (`--remote`).
    let args: &[&str] = match engine {
        "docker" => &["info", "--format", "{{.ServerVersion}}"],
        _ => &["--remote", "info", "--format", "{{.Version.Version}}"],
    };
    let ok = Command::new(engine)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{test}: {engine} is required when CI=true, but `{engine} info` failed");
        }
        eprintln!(
            "SKIPPED {test}: no {engine} engine (`{engine} info` failed); set CI=true to make \
             this fail"
        );
    }
    ok
}

/// Replaces every occurrence of `needle` in the strings of `v` (e.g. a host address).
pub fn replace_text(v: &mut Value, needle: &str, with: &str) {
    if needle.is_empty() {
        return;
    }
    match v {
        Value::String(s) => *s = s.replace(needle, with),
        Value::Object(map) => map.values_mut().for_each(|x| replace_text(x, needle, with)),
        Value::Array(items) => items.iter_mut().for_each(|x| replace_text(x, needle, with)),
        _ => {}
    }
}

/// Redacts a demo report: ids and timings, and the host address the egress probe dialed.
pub fn redact_demo(v: &mut Value) {
    let host = v["egress"]["dialed"]
        .as_str()
        .and_then(|d| d.rsplit_once(':'))
        .map(|(h, _)| h.to_string())
        .unwrap_or_default();
    replace_text(v, &host, "[host]");
    redact(v);
}
