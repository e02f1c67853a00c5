//! Proves the engines really apply the settings every sandbox gets (the security defaults) by running a
//! hardened container in each and reading the result back from inside, plus the gVisor
//! probe. Takes about a second; run at the end of every `setup`.

use std::time::Instant;

use anyhow::{Result, bail};

use crate::images::{BUSYBOX, DOCKER, Engine, PODMAN, PYTHON};
use crate::process;
use crate::report::seconds;

/// The flags every sandbox gets (the security defaults), with test-sized limits.
const HARDENED: &[&str] = &[
    "run",
    "--rm",
    "--network",
    "none",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
    "--pids-limit",
    "64",
    "--memory",
    "256m",
    "--memory-swap",
    "256m",
    "--init",
];

/// Prints `FAIL: ...` for each setting not in effect, then `done`. Reads cgroup v1 paths
/// first (this host), v2 second.
const CHECK_SCRIPT: &str = r#"
fail() { echo "FAIL: $*"; }
grep -q '^NoNewPrivs:[[:space:]]*1$' /proc/1/status || fail no-new-privileges not applied
grep -q '^CapEff:[[:space:]]*0000000000000000$' /proc/1/status || fail capabilities not dropped
mem=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max)
[ "$mem" = 268435456 ] || fail "memory limit is $mem"
pids=$(cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max)
[ "$pids" = 64 ] || fail "pids limit is $pids"
nets=$(ls /sys/class/net | tr '\n' ' ')
[ "$nets" = "lo " ] || fail "interfaces: $nets"
for tool in sh echo cat printf sleep true false env printenv seq ls mkdir rm pwd kill tar id head wc ip nc wget timeout setsid; do
    command -v "$tool" >/dev/null || fail "missing $tool"
done
echo done
"#;

/// Runs the hardened checks in both engines with both images, then probes gVisor.
pub fn run() -> Result<((), String)> {
    let mut timings = Vec::new();
    for engine in [&DOCKER, &PODMAN] {
        for image in [BUSYBOX.reference, PYTHON.reference] {
            let start = Instant::now();
            hardened_checks(engine, image)?;
            timings.push(format!(
                "{} {} {}",
                engine.name,
                image.trim_start_matches("sandbox-rs/"),
                seconds(start.elapsed())
            ));
        }
        python_runs(engine)?;
    }
    Ok(((), format!("hardened run ok: {}", timings.join(", "))))
}

fn hardened_checks(engine: &Engine, image: &str) -> Result<()> {
    let output =
        process::stdout_of(
            engine
                .cli()
                .args(HARDENED)
                .args([image, "sh", "-c", CHECK_SCRIPT]),
        )?;
    let failures: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL")).collect();
    if !failures.is_empty() || !output.ends_with("done") {
        bail!(
            "{} {image}: hardened container is not as configured:\n{}",
            engine.name,
            output
        );
    }
    Ok(())
}

fn python_runs(engine: &Engine) -> Result<()> {
    let output = process::stdout_of(engine.cli().args(HARDENED).args([
        PYTHON.reference,
        "sh",
        "-c",
        "python3 -c 'import json, sys; print(json.dumps(list(sys.version_info[:2])))' && python -c 'print(1)'",
    ]))?;
    if output != "[3, 11]\n1" {
        bail!("{}: python image answered {output:?}", engine.name);
    }
    Ok(())
}

/// Whether `docker run --runtime runsc` works, as an outcome line (never an error: gVisor is
/// optional). The pids limit is 512, not 64: under runsc the host pids cgroup also counts
/// the gVisor Sentry's own threads (≈ 50 idle), and at 256 or below the Sentry panics
/// ("error initializing first thread: resource temporarily unavailable") once a workload
/// starts a few processes.
pub fn gvisor() -> Result<((), String)> {
    let runtimes =
        process::stdout_of(
            DOCKER
                .cli()
                .args(["info", "--format", "{{json .Runtimes}}"]),
        )?;
    if !runtimes.contains("\"runsc\"") {
        return Ok((
            (),
            "unavailable: runsc is not registered with dockerd".into(),
        ));
    }
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let output = process::probe(DOCKER.cli().args([
        "run",
        "--rm",
        "--runtime",
        "runsc",
        "--network",
        "none",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--pids-limit",
        "512",
        "--memory",
        "256m",
        "--memory-swap",
        "256m",
        "--init",
        BUSYBOX.reference,
        "sh",
        "-c",
        "uname -r; for i in 1 2 3 4 5 6 7 8; do sleep 0.1 & done; wait; echo done",
    ]))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let guest_kernel = stdout.lines().next().unwrap_or_default().trim();
    let outcome = if !output.status.success() || !stdout.trim_end().ends_with("done") {
        format!(
            "NOT working: `docker run --runtime runsc` failed ({}): {}",
            output.status,
            process::last_lines(&String::from_utf8_lossy(&output.stderr), 3)
        )
    } else if guest_kernel == host_kernel.trim() {
        format!("NOT isolating: guest kernel {guest_kernel} is the host's")
    } else {
        format!(
            "works (guest kernel {guest_kernel}, host {})",
            host_kernel.trim()
        )
    };
    Ok(((), outcome))
}
