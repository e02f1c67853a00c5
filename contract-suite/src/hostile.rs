//! Contract trials: hostile code. Everything inside a sandbox is assumed to be
//! written by an attacker; each trial runs one attack and proves the promise it targets
//! still holds — limits bound it, a timeout ends all of it, the sandbox (or at least the
//! caller) survives it, and this process's memory and disk stay bounded.
//!
//! The attacks that need a real kernel or userland (a fork bomb, a memory hog, junk in
//! `/dev/shm`, a sparse file) report "not applicable: in-process backend" on the fake;
//! the broken-adapter self-test runs them against `broken::kernel_model`, which answers
//! them from the sandbox's configured limits, so a flaw that drops a limit makes them fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, Command, ErrorCode, IsolationTier, Resources, RunOptions, Sandbox,
};

use crate::ctx::{Ctx, Need, assert_pid_gone, must_code, run, run_ok, sbx, wait_for_pid};

const AREA: &str = "hostile";

/// Marks the fork-bomb program (the kernel model recognises it by this).
pub(crate) const FORK_BOMB_MARK: &str = "sbx-fork-bomb";
/// Marks the program that holds every pid of the limit.
pub(crate) const PIDS_HOLDER_MARK: &str = "sbx-pids-holder";
/// Marks the memory-hog program.
pub(crate) const MEMORY_HOG_MARK: &str = "sbx-memory-hog";
/// What the memory hog allocates and touches, in MiB.
pub(crate) const MEMORY_HOG_MB: u64 = 384;
/// Marks the junk writer's script (writes into `/dev/shm`, `/tmp` and `/run`).
pub(crate) const JUNK_MARK: &str = "/dev/shm";
/// Size of the sparse file the read/download attack plants (4 GiB).
pub(crate) const SPARSE_FILE: &str = "4G";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let r = Need::Cap(C::RUN_COMMAND);
    let rf = Need::Cap(C::RUN_COMMAND | C::FILESYSTEM | C::UPLOAD_DOWNLOAD);
    vec![
        ctx.trial(
            AREA,
            "fork_bomb_bounded_by_pids",
            &[r, Need::KernelEvidence],
            fork_bomb_bounded_by_pids,
        ),
        ctx.trial(
            AREA,
            "pids_exhaustion_is_typed_and_reset_recovers",
            &[r, Need::KernelEvidence],
            pids_exhaustion_is_typed_and_reset_recovers,
        ),
        ctx.trial(
            AREA,
            "memory_hog_killed_sandbox_survives",
            &[r, Need::KernelEvidence],
            memory_hog_killed_sandbox_survives,
        ),
        ctx.trial(
            AREA,
            "timeout_kills_background_and_setsid_children",
            &[r],
            timeout_kills_background_and_setsid_children,
        ),
        ctx.trial(
            AREA,
            "junk_in_shm_tmp_run_cannot_break_the_timeout",
            &[r, Need::KernelEvidence],
            junk_in_shm_tmp_run_cannot_break_the_timeout,
        ),
        ctx.trial(AREA, "huge_output_capped", &[r], huge_output_capped),
        ctx.trial(
            AREA,
            "huge_sparse_file_read_and_download_refused",
            &[rf, Need::KernelEvidence],
            huge_sparse_file_read_and_download_refused,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// The pids limit the engine really holds for `sb`: the requested one, or — for a gVisor
/// sandbox, whose runtime threads count against the engine limit — the requested one plus
/// the headroom the adapter documents (`Probes::engine_limits`).
async fn enforced_pids(ctx: &Ctx, sb: &dyn Sandbox, requested: u64) -> anyhow::Result<u64> {
    if sb.isolation() != IsolationTier::Gvisor {
        return Ok(requested);
    }
    let limits = ctx
        .probes
        .engine_limits(sb.id())
        .await
        .context("the engine_limits probe failed")?
        .context("a gVisor sandbox needs Probes::engine_limits to bound a fork bomb")?;
    Ok(limits.pids)
}

/// A fork bomb is bounded by the pids limit: a program forking far past a limit of 64
/// gets a fork error at the limit (or, under gVisor, the runtime ends the sandbox), and
/// the run returns instead of hanging.
async fn fork_bomb_bounded_by_pids(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("fork_bomb_bounded_by_pids");
    let requested = 64;
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c).resources(Resources::default().pids(requested)),
        )
        .await?;
    let bound = enforced_pids(&ctx, &*sb, requested).await?;
    let attempts = bound + 64;
    let code = format!(
        "import os, time\n# {FORK_BOMB_MARK}\nn = 0\nfor i in range({attempts}):\n    try:\n        \
         pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        \
         fd = os.open('/dev/null', os.O_WRONLY)\n        os.dup2(fd, 1)\n        os.dup2(fd, \
         2)\n        time.sleep(60)\n        os._exit(0)\n    n += 1\nprint(n)\n"
    );
    let r = sb
        .run(
            Command::Argv(vec!["python3".into(), "-c".into(), code]),
            RunOptions::default().timeout(Duration::from_secs(60)),
        )
        .await;
    match r {
        Ok(r) => {
            let forked: u64 = r.stdout_text().trim().parse().with_context(|| {
                format!(
                    "the fork bomb printed no count (exit {}, stderr {:?})",
                    r.exit_code,
                    r.stderr_text()
                )
            })?;
            ensure!(
                forked < attempts && forked <= bound,
                "a fork bomb started {forked} processes under a pids limit of {bound}"
            );
        }
        Err(e) if e.code() == ErrorCode::SandboxGone && sb.isolation() == IsolationTier::Gvisor => {
        }
        Err(e) => bail!("the fork bomb's run failed: {}", e.render()),
    }
    sb.kill().await
}

/// Processes a finished command left behind that hold every pid of the limit make the next
/// command fail at once with `ResourceLimitExceeded` naming pids — never an exit code that
/// looks like the command's own, never a hang — every time it is tried. (On an engine's
/// exec path, which starts commands outside the limit, the command may also just run.) Where
/// `RESET_PROCESSES` is declared, `reset_processes` then ends them all (and reports them),
/// the sandbox's files are kept, and commands run again.
async fn pids_exhaustion_is_typed_and_reset_recovers(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("pids_exhaustion_is_typed_and_reset_recovers");
    let requested = 32;
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c).resources(Resources::default().pids(requested)),
        )
        .await?;
    if sb.isolation() == IsolationTier::Gvisor {
        // gVisor's guest processes are not the host's tasks: the engine's pids limit
        // bounds the runtime's threads, not the guest's processes (the fork bomb trial
        // covers what it does bound).
        return sb.kill().await;
    }
    run_ok(&*sb, ["sh", "-c", "echo kept > /tmp/pids-kept"]).await?;
    // A detached holder forks sleepers until fork fails, then keeps taking every pid
    // that frees up (the command's own, the agent's finished threads), so the limit
    // stays exhausted; the command returns once the holder says it is full.
    let fill = format!(
        "import os, sys, time\n# {PIDS_HOLDER_MARK}\nif os.fork():\n    \
         while not os.path.exists('/tmp/pids-full'):\n        time.sleep(0.01)\n    \
         sys.exit(0)\nos.setsid()\nnull = os.open('/dev/null', os.O_RDWR)\n\
         for fd in (0, 1, 2):\n    os.dup2(null, fd)\nfull = False\nwhile True:\n    \
         try:\n        child = os.fork()\n    except OSError:\n        if not full:\n            \
         open('/tmp/pids-full', 'w').close()\n            full = True\n        \
         time.sleep(0.005)\n        continue\n    if child == 0:\n        \
         time.sleep(300)\n        os._exit(0)\n"
    );
    let filled = sb
        .run(
            Command::Argv(vec!["python3".into(), "-c".into(), fill]),
            RunOptions::default().timeout(Duration::from_secs(30)),
        )
        .await
        .context("the pids holder's start")?;
    ensure!(
        filled.exit_code == 0,
        "the pids holder did not start: exit {}, stderr {:?}",
        filled.exit_code,
        filled.stderr_text()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for attempt in 1..=6 {
        let started = Instant::now();
        let r = sb
            .run(
                Command::Argv(vec!["true".into()]),
                RunOptions::default().timeout(Duration::from_secs(20)),
            )
            .await;
        let took = started.elapsed();
        ensure!(
            took < Duration::from_secs(5),
            "attempt {attempt}: a command in a sandbox whose pids are exhausted took {took:?} \
             (result {:?})",
            r.as_ref().map(|r| r.exit_code).map_err(|e| e.render())
        );
        match r {
            Err(e) if e.code() == ErrorCode::ResourceLimitExceeded => {
                let text = e.render();
                ensure!(
                    text.contains("pids"),
                    "attempt {attempt}: the limit error does not name pids: {text}"
                );
            }
            Err(e) => bail!(
                "attempt {attempt}: pids exhaustion gave {} instead of ResourceLimitExceeded",
                e.render()
            ),
            // On the engine's exec path the engine starts each command outside the
            // limit (runc moves it into the cgroup after the fork, and the limit bounds
            // only forks): `true` itself starts and ends.
            Ok(r) if !sb.capabilities().contains(C::AGENT) && r.exit_code == 0 => {}
            Ok(r) => bail!(
                "attempt {attempt}: pids exhaustion gave exit code {} (stderr {:?}) instead of \
                 ResourceLimitExceeded",
                r.exit_code,
                r.stderr_text()
            ),
        }
    }
    if !sb.capabilities().contains(C::RESET_PROCESSES) {
        return sb.kill().await;
    }
    let ended = sb.reset_processes().await.context("reset_processes")?;
    ensure!(
        u64::from(ended) >= requested / 2,
        "reset_processes reported {ended} processes ended; the sandbox held about {requested}"
    );
    let kept = run_ok(&*sb, ["cat", "/tmp/pids-kept"]).await?;
    ensure!(
        kept.trim() == "kept",
        "a file did not survive reset_processes: {kept:?}"
    );
    sb.kill().await
}

/// A memory hog is killed by the memory limit (swap off): touching 384 MiB in a 128 MiB
/// sandbox never completes, and the sandbox itself still runs commands afterwards (under
/// gVisor, whose own memory counts against the same limit, the sandbox may end instead:
/// `SandboxGone`).
async fn memory_hog_killed_sandbox_survives(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("memory_hog_killed_sandbox_survives");
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c).resources(Resources::default().memory_mb(128)),
        )
        .await?;
    let code = format!(
        "# {MEMORY_HOG_MARK}\nb = bytearray({MEMORY_HOG_MB} * 1024 * 1024)\nfor i in range(0, \
         len(b), 4096):\n    b[i] = 1\nprint('survived')\n"
    );
    let r = sb
        .run(
            Command::Argv(vec!["python3".into(), "-c".into(), code]),
            RunOptions::default().timeout(Duration::from_secs(60)),
        )
        .await;
    let r = match r {
        Ok(r) => r,
        // gVisor's own memory is charged to the same limit on the host: an exceeded limit
        // ends the whole sandbox (typed, bounded — the host is untouched).
        Err(e) if e.code() == ErrorCode::SandboxGone && sb.isolation() == IsolationTier::Gvisor => {
            return Ok(());
        }
        Err(e) => bail!("the memory hog's run failed: {}", e.render()),
    };
    ensure!(
        r.exit_code != 0 && !r.stdout_text().contains("survived"),
        "a program touched {MEMORY_HOG_MB} MiB in a 128 MiB sandbox (exit {}): the memory limit \
         is not enforced",
        r.exit_code
    );
    let after = run_ok(&*sb, ["echo", "still-here"]).await?;
    ensure!(
        after.trim() == "still-here",
        "after the OOM kill: {after:?}"
    );
    sb.kill().await
}

/// A timeout ends everything the command started: a background child and a child that
/// left the process group with `setsid` are gone once `ExecutionTimeout` is returned,
/// and the sandbox keeps running commands.
async fn timeout_kills_background_and_setsid_children(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("timeout_kills_background_and_setsid_children");
    let sb = ctx.sandbox(&c).await?;
    let script = "setsid sh -c 'echo $$ > /tmp/hostile-a; exec sleep 301' & \
                  sh -c 'echo $$ > /tmp/hostile-b; exec sleep 302' & sleep 303";
    let r = sb
        .run(
            script.into(),
            RunOptions::default().timeout(Duration::from_secs(2)),
        )
        .await;
    must_code(r, ErrorCode::ExecutionTimeout)?;
    let a = wait_for_pid(&*sb, "/tmp/hostile-a", Duration::from_secs(5)).await?;
    let b = wait_for_pid(&*sb, "/tmp/hostile-b", Duration::from_secs(5)).await?;
    assert_pid_gone(&*sb, &a, "a `setsid` child of a timed-out command").await?;
    assert_pid_gone(&*sb, &b, "a background child of a timed-out command").await?;
    let after = run_ok(&*sb, ["echo", "still-here"]).await?;
    ensure!(after.trim() == "still-here", "after the timeout: {after:?}");
    sb.kill().await
}

/// Writing `1` into every file under `/dev/shm`, `/tmp` and `/run` (where an adapter's
/// own bookkeeping could live) and then sleeping cannot turn the timeout into anything
/// else: `ExecutionTimeout` is returned, the sleep is gone, and the sandbox still runs
/// commands — the kill never hits the whole sandbox, nor nothing.
async fn junk_in_shm_tmp_run_cannot_break_the_timeout(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("junk_in_shm_tmp_run_cannot_break_the_timeout");
    let sb = ctx.sandbox(&c).await?;
    let script = format!(
        "echo $$ > /work/junk-pid; for d in {JUNK_MARK} /tmp /run; do for f in $(find $d -type \
         f 2>/dev/null); do echo 1 > $f 2>/dev/null; done; done; exec sleep 300"
    );
    let started = Instant::now();
    let r = sb
        .run(
            script.into(),
            RunOptions::default().timeout(Duration::from_secs(3)),
        )
        .await;
    must_code(r, ErrorCode::ExecutionTimeout)?;
    ensure!(
        started.elapsed() < Duration::from_secs(30),
        "the timeout took {:?}",
        started.elapsed()
    );
    let pid = wait_for_pid(&*sb, "/work/junk-pid", Duration::from_secs(5)).await?;
    assert_pid_gone(&*sb, &pid, "the junk writer's sleep").await?;
    let after = run(&*sb, ["echo", "still-here"]).await?;
    ensure!(
        after.exit_code == 0 && after.stdout_text().trim() == "still-here",
        "after the timeout the sandbox answers exit {} {:?}",
        after.exit_code,
        after.stdout_text()
    );
    sb.kill().await
}

/// Huge output is capped, not buffered: 300 MiB on stdout against the default 64 MiB
/// cap is `ResourceLimitExceeded` (never a truncated result), this process grows by less
/// than the output, and the sandbox still runs commands.
async fn huge_output_capped(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("huge_output_capped");
    let sb = ctx.sandbox(&c).await?;
    let _heavy = ctx.heavy_lock.lock().await;
    let base = crate::files::rss_bytes();
    let sampler = crate::files::RssSampler::start();
    let r = sb
        .run(
            ["dd", "if=/dev/zero", "bs=1048576", "count=300"].into(),
            RunOptions::default().timeout(Duration::from_secs(120)),
        )
        .await;
    let growth = sampler.finish().saturating_sub(base);
    must_code(r, ErrorCode::ResourceLimitExceeded)?;
    let bound: u64 = 160 << 20;
    ensure!(
        growth <= bound,
        "300 MiB of output against a 64 MiB cap grew this process by {} MiB (bound {} MiB)",
        growth >> 20,
        bound >> 20
    );
    let after = run_ok(&*sb, ["echo", "still-here"]).await?;
    ensure!(after.trim() == "still-here", "after the cap: {after:?}");
    sb.kill().await
}

/// A 4 GiB sparse file (free inside the sandbox) is never pulled onto the host: `read`
/// is `ResourceLimitExceeded` naming the limit, so is `download`, and the download
/// leaves nothing at its target or next to it.
async fn huge_sparse_file_read_and_download_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("huge_sparse_file_read_and_download_refused");
    let sb = ctx.sandbox(&c).await?;
    run_ok(&*sb, ["truncate", "-s", SPARSE_FILE, "/work/huge"]).await?;
    let f = sbx(sb.files(), "files()")?;
    let started = Instant::now();
    let e = must_code(f.read("/work/huge").await, ErrorCode::ResourceLimitExceeded)?;
    ensure!(!e.hint().is_empty(), "the refusal has no hint");
    let dir = tempfile::tempdir().context("tempdir")?;
    let target = dir.path().join("huge");
    must_code(
        f.download("/work/huge", &target).await,
        ErrorCode::ResourceLimitExceeded,
    )?;
    ensure!(
        started.elapsed() < Duration::from_secs(30),
        "refusing a 4 GiB file took {:?}: it was transferred first",
        started.elapsed()
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    ensure!(left.is_empty(), "a refused download left {left:?} behind");
    sb.kill().await
}
