//! How the suite proves a sandbox's memory and pids limits: applied settings are verified
//! from inside the sandbox, because an engine that accepted a setting may not have applied it.
//!
//! The first evidence is always the cgroup view inside the sandbox (`memory.max` /
//! `memory.limit_in_bytes`, `pids.max`), which must equal the request exactly. Only when
//! NONE of those files exists inside the sandbox (gVisor mounts no cgroup filesystem) does
//! the suite fall back — a file that exists but cannot be read is a failure, never a
//! fallback:
//!
//! - **memory**: `/proc/meminfo` `MemTotal`, read inside the sandbox, must equal the limit.
//!   gVisor sizes its guest memory to the container's limit (256 MiB → `MemTotal: 262144
//!   kB`); a runtime without that (runc shows the host's total) cannot pass by accident,
//!   because a host's total never equals the requested limit.
//! - **pids**: there is no in-sandbox view of the limit under gVisor. For a sandbox whose
//!   `isolation()` is `Gvisor` (and only then) the suite asks the engine
//!   ([`Probes::engine_limits`](crate::Probes::engine_limits)): memory == memory+swap ==
//!   the request, and pids == the request + the runtime headroom the adapter documents
//!   (bounded by [`MAX_PIDS_HEADROOM`]). Any other sandbox without a cgroup view fails.

use anyhow::{Context as _, bail, ensure};
use sandbox_core::{IsolationTier, Sandbox};

use crate::ctx::{Ctx, run};
use crate::probes::MAX_PIDS_HEADROOM;

const MEMORY_FILES: [&str; 2] = [
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
];

const PIDS_FILES: [&str; 2] = ["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"];

/// The first of `paths` that exists inside the sandbox, read and trimmed; `None` when none
/// exists. A file that exists but cannot be read fails.
pub(crate) async fn read_cgroup(
    sb: &dyn Sandbox,
    paths: &[&str],
) -> anyhow::Result<Option<String>> {
    for p in paths {
        let r = run(sb, ["cat", p]).await?;
        if r.exit_code == 0 {
            return Ok(Some(r.stdout_text().trim().to_string()));
        }
        if run(sb, ["test", "-e", p]).await?.exit_code == 0 {
            bail!(
                "{p} exists inside the sandbox but cannot be read: exit {} {:?}",
                r.exit_code,
                r.stderr_text()
            );
        }
    }
    Ok(None)
}

/// `/proc/meminfo` `MemTotal` in bytes, read inside the sandbox.
async fn mem_total(sb: &dyn Sandbox) -> anyhow::Result<u64> {
    let r = run(sb, ["cat", "/proc/meminfo"]).await?;
    ensure!(
        r.exit_code == 0,
        "no cgroup memory file inside the sandbox and /proc/meminfo unreadable: exit {} {:?}",
        r.exit_code,
        r.stderr_text()
    );
    let out = r.stdout_text();
    let line = out
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .with_context(|| format!("/proc/meminfo has no MemTotal line: {out:?}"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let kb: u64 = parts
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("MemTotal line {line:?}"))?;
    ensure!(
        parts.next() == Some("kB"),
        "MemTotal is not in kB: {line:?}"
    );
    Ok(kb * 1024)
}

/// Proves the memory limit is `mb` MiB from inside the sandbox: the cgroup file, or —
/// only when no cgroup memory file exists — `MemTotal` (see the module docs).
pub(crate) async fn expect_memory_limit(sb: &dyn Sandbox, mb: u64) -> anyhow::Result<()> {
    let want = mb << 20;
    match read_cgroup(sb, &MEMORY_FILES).await? {
        Some(v) => ensure!(
            v == want.to_string(),
            "memory limit inside (cgroup): {v:?}, requested {want}"
        ),
        None => {
            let total = mem_total(sb).await?;
            ensure!(
                total == want,
                "no cgroup memory file inside the sandbox, and /proc/meminfo MemTotal is \
                 {total} bytes, not the requested limit {want}"
            );
        }
    }
    Ok(())
}

/// How the pids limit was proven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PidsEvidence {
    /// The cgroup `pids.max` inside the sandbox equals the request.
    Cgroup,
    /// gVisor: the engine holds `engine_pids` (= request + documented headroom).
    Engine {
        /// The engine's pids limit.
        engine_pids: u64,
    },
}

/// Proves the pids limit is `pids` (the sandbox's memory limit being `memory_mb` MiB):
/// the cgroup `pids.max` inside, or — only for a gVisor sandbox with no cgroup pids file —
/// the engine's limits (see the module docs).
pub(crate) async fn expect_pids_limit(
    ctx: &Ctx,
    sb: &dyn Sandbox,
    pids: u64,
    memory_mb: u64,
) -> anyhow::Result<PidsEvidence> {
    if let Some(v) = read_cgroup(sb, &PIDS_FILES).await? {
        ensure!(
            v == pids.to_string(),
            "pids limit inside (cgroup): {v:?}, requested {pids}"
        );
        return Ok(PidsEvidence::Cgroup);
    }
    ensure!(
        sb.isolation() == IsolationTier::Gvisor,
        "no cgroup pids file inside the sandbox (tier {}): the pids limit cannot be verified",
        sb.isolation()
    );
    let Some(e) = ctx
        .probes
        .engine_limits(sb.id())
        .await
        .context("the engine_limits probe failed")?
    else {
        bail!(
            "gVisor sandbox without a cgroup view and no engine_limits probe: the pids limit \
             cannot be verified (implement Probes::engine_limits)"
        );
    };
    let mem = memory_mb << 20;
    ensure!(
        e.memory_bytes == mem && e.memory_swap_bytes == mem,
        "engine memory {} / memory+swap {}, requested {mem} for both (no swap)",
        e.memory_bytes,
        e.memory_swap_bytes
    );
    ensure!(
        e.pids_headroom <= MAX_PIDS_HEADROOM,
        "documented pids headroom {} exceeds {MAX_PIDS_HEADROOM}: not a limit",
        e.pids_headroom
    );
    ensure!(
        e.pids == pids + e.pids_headroom,
        "engine pids limit {}, requested {pids} + documented headroom {}",
        e.pids,
        e.pids_headroom
    );
    Ok(PidsEvidence::Engine {
        engine_pids: e.pids,
    })
}
