//! Contract trials: pause and resume (`PAUSE_RESUME`).
//!
//! What a declared `PAUSE_RESUME` promises: `pause` stops every process of the sandbox at
//! once and `resume` lets them go on exactly where they were — a counter streaming at the
//! pause prints nothing while paused and continues with the next number, on the same
//! stream; while paused every other call fails at once with `SandboxPaused` (never a
//! hang); both are idempotent; and a paused sandbox can still be killed, leaving nothing.
//! Without `PAUSE_RESUME` each trial proves the refusal instead (`CapabilityNotSupported`
//! from `pause` and `resume`), which needs nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt;
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, ErrorCode, Process, RunOptions};

use crate::ctx::{Ctx, Need, Sbx, must_code, run_ok, sbx};

const AREA: &str = "pause";

/// How long a trial waits for an expected piece of output.
const OUTPUT_WAIT: Duration = Duration::from_secs(15);

/// How long the paused counter is watched for output it must not print.
const FROZEN_WATCH: Duration = Duration::from_millis(1200);

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let needs: &[Need] = if ctx.caps.contains(C::PAUSE_RESUME) {
        &[Need::Cap(C::RUN_COMMAND | C::STREAMING)]
    } else {
        &[]
    };
    let reap: &[Need] = if ctx.caps.contains(C::PAUSE_RESUME) {
        &[Need::Cap(C::RUN_COMMAND), Need::Reapable]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "a_paused_counter_stops_and_resumes_exactly",
            needs,
            a_paused_counter_stops_and_resumes_exactly,
        ),
        ctx.trial(
            AREA,
            "calls_on_a_paused_sandbox_are_refused_at_once",
            needs,
            calls_on_a_paused_sandbox_are_refused_at_once,
        ),
        ctx.trial(
            AREA,
            "a_reattached_handle_sees_the_pause",
            needs,
            a_reattached_handle_sees_the_pause,
        ),
        ctx.trial(
            AREA,
            "a_paused_sandbox_can_be_killed",
            reap,
            a_paused_sandbox_can_be_killed,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// A sandbox for a pause trial; `None` when the backend does not declare `PAUSE_RESUME`
/// and `pause` and `resume` were just proven refused.
async fn sandbox(ctx: &Ctx, name: &str) -> anyhow::Result<Option<Sbx>> {
    let sb = ctx.sandbox(&case(name)).await?;
    if sb.capabilities().contains(C::PAUSE_RESUME) {
        return Ok(Some(sb));
    }
    ensure!(
        !ctx.caps.contains(C::PAUSE_RESUME),
        "the backend declares PAUSE_RESUME but this sandbox does not"
    );
    must_code(sb.pause().await, ErrorCode::CapabilityNotSupported).context("pause")?;
    must_code(sb.resume().await, ErrorCode::CapabilityNotSupported).context("resume")?;
    sb.kill().await?;
    Ok(None)
}

/// A shell script printing 0, 1, 2, … one every 100 ms (written out step by step: no
/// loop construct needed).
fn counter_script(steps: u32) -> String {
    (0..steps)
        .map(|i| format!("echo {i}; sleep 0.1"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The counter's output so far, as numbers (complete lines only).
fn numbers(text: &str) -> Vec<u32> {
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    complete
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Reads `p`'s output into `seen` until the counter has printed `at_least` numbers.
async fn read_count(p: &mut Process, seen: &mut String, at_least: usize) -> anyhow::Result<()> {
    let waited = tokio::time::timeout(OUTPUT_WAIT, async {
        while numbers(seen).len() < at_least {
            match p.next().await {
                Some(Ok(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk.data)),
                Some(Err(e)) => bail!("the counter's stream failed: {}", e.render()),
                None => bail!("the counter ended early"),
            }
        }
        Ok(())
    })
    .await;
    match waited {
        Ok(r) => r.with_context(|| format!("counter output so far: {seen:?}")),
        Err(_) => bail!("fewer than {at_least} numbers within {OUTPUT_WAIT:?}: {seen:?}"),
    }
}

/// Everything `p` prints within `window` (its stream must stay open).
async fn read_for(p: &mut Process, seen: &mut String, window: Duration) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + window;
    loop {
        match tokio::time::timeout_at(until, p.next()).await {
            Err(_) => return Ok(()),
            Ok(Some(Ok(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk.data)),
            Ok(Some(Err(e))) => bail!("the counter's stream failed: {}", e.render()),
            Ok(None) => bail!("the counter's stream ended while paused: {seen:?}"),
        }
    }
}

/// A counter streaming when the sandbox pauses prints nothing more while paused (after
/// what was in flight arrived), and after `resume` goes on, on the same stream, with the
/// very next number: nothing restarted, nothing skipped.
async fn a_paused_counter_stops_and_resumes_exactly(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "a_paused_counter_stops_and_resumes_exactly").await? else {
        return Ok(());
    };
    let script = counter_script(300);
    let mut p = sbx(
        sb.stream(
            ["sh", "-c", script.as_str()].into(),
            RunOptions::default().timeout(Duration::from_secs(60)),
        ),
        "stream the counter",
    )?;
    let mut seen = String::new();
    read_count(&mut p, &mut seen, 3).await?;
    sbx(sb.pause().await, "pause")?;
    // What was printed before the freeze may still be on its way.
    read_for(&mut p, &mut seen, Duration::from_millis(300)).await?;
    let at_pause = numbers(&seen);
    let mut frozen = seen.clone();
    read_for(&mut p, &mut frozen, FROZEN_WATCH).await?;
    ensure!(
        numbers(&frozen) == at_pause,
        "the counter went on while paused: {at_pause:?} at the pause, then {:?}",
        numbers(&frozen)
    );
    sbx(sb.resume().await, "resume")?;
    seen = frozen;
    read_count(&mut p, &mut seen, at_pause.len() + 3).await?;
    let all = numbers(&seen);
    let expected: Vec<u32> = (0..all.len() as u32).collect();
    ensure!(
        all == expected,
        "the counter did not continue exactly (paused at {:?}): {all:?}",
        at_pause.last()
    );
    drop(p);
    sb.kill().await
}

/// While paused, `run`, `stream`, `run_code` and the file system fail at once with
/// `SandboxPaused`; a second `pause` and, later, a second `resume` do nothing; after
/// `resume` the sandbox runs commands again.
async fn calls_on_a_paused_sandbox_are_refused_at_once(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "calls_on_a_paused_sandbox_are_refused_at_once").await? else {
        return Ok(());
    };
    sbx(sb.pause().await, "pause")?;
    sbx(sb.pause().await, "pause again")?;
    let t0 = Instant::now();
    must_code(
        sb.run(["true"].into(), RunOptions::default()).await,
        ErrorCode::SandboxPaused,
    )
    .context("run while paused")?;
    must_code(
        sb.stream(["true"].into(), RunOptions::default())
            .map(|_| ()),
        ErrorCode::SandboxPaused,
    )
    .context("stream while paused")?;
    if sb.capabilities().contains(C::RUN_CODE) {
        must_code(
            sb.run_code("print(1)", Default::default()).await,
            ErrorCode::SandboxPaused,
        )
        .context("run_code while paused")?;
    }
    if let Ok(files) = sb.files() {
        must_code(files.ls(".").await, ErrorCode::SandboxPaused).context("ls while paused")?;
    }
    ensure!(
        t0.elapsed() < Duration::from_secs(2),
        "the refusals took {:?}: a paused sandbox must refuse at once",
        t0.elapsed()
    );
    sbx(sb.resume().await, "resume")?;
    sbx(sb.resume().await, "resume again")?;
    let out = run_ok(&*sb, ["echo", "after-resume"]).await?;
    ensure!(out.contains("after-resume"), "after resume: {out:?}");
    sb.kill().await
}

/// A handle reattached with `connect` to a sandbox paused through another handle refuses
/// commands at once with `SandboxPaused` (it never waits on frozen processes), and its
/// `resume` thaws the sandbox for both handles.
async fn a_reattached_handle_sees_the_pause(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "a_reattached_handle_sees_the_pause").await? else {
        return Ok(());
    };
    sbx(sb.pause().await, "pause")?;
    let other = sbx(
        ctx.backend.connect(sb.id()).await,
        "connect to the paused sandbox",
    )?;
    let t0 = Instant::now();
    must_code(
        other.run(["true"].into(), RunOptions::default()).await,
        ErrorCode::SandboxPaused,
    )
    .context("run through the reattached handle while paused")?;
    ensure!(
        t0.elapsed() < Duration::from_secs(2),
        "the reattached handle took {:?} to refuse",
        t0.elapsed()
    );
    sbx(other.resume().await, "resume through the reattached handle")?;
    let out = run_ok(&*other, ["echo", "thawed"]).await?;
    ensure!(out.contains("thawed"), "after resume: {out:?}");
    sbx(
        sb.resume().await,
        "resume through the first handle (already running)",
    )?;
    let out = run_ok(&*sb, ["echo", "first"]).await?;
    ensure!(
        out.contains("first"),
        "the first handle after resume: {out:?}"
    );
    drop(other);
    sb.kill().await
}

/// `kill` of a paused sandbox succeeds within the teardown grace and the backend lists
/// nothing left of it.
async fn a_paused_sandbox_can_be_killed(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let name = "a_paused_sandbox_can_be_killed";
    let Some(sb) = sandbox(&ctx, name).await? else {
        return Ok(());
    };
    run_ok(&*sb, ["true"]).await?;
    sbx(sb.pause().await, "pause")?;
    let t0 = Instant::now();
    sb.kill().await.context("kill while paused")?;
    ensure!(
        t0.elapsed() < sandbox_core::teardown::teardown_grace() + Duration::from_secs(1),
        "kill of a paused sandbox took {:?}",
        t0.elapsed()
    );
    let left = ctx.listed(&case(name)).await?;
    ensure!(left.is_empty(), "left after kill: {left:?}");
    Ok(())
}
