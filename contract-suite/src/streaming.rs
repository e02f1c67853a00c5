//! Contract trials: `Sandbox::stream` and `Process` (a plain fn, lazy start, order,
//! stream kinds, `wait`, timeouts, cleanup on every exit path, latency, `returncode`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt;
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, ErrorCode, Process, RunOptions, Sandbox, StreamKind};

use crate::ctx::{
    Ctx, Need, assert_pid_gone, must_code, pid_alive, read_pid, run, run_ok, sbx, wait_for_pid,
};

const AREA: &str = "streaming";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let s = Need::Cap(C::STREAMING | C::RUN_COMMAND);
    vec![
        ctx.trial(AREA, "stream_is_not_a_future", &[s], stream_is_not_a_future),
        ctx.trial(AREA, "starts_on_first_poll", &[s], starts_on_first_poll),
        ctx.trial(AREA, "order_within_a_stream", &[s], order_within_a_stream),
        ctx.trial(
            AREA,
            "stdin_streams_through",
            &[s, Need::Cap(C::STDIN)],
            stdin_streams_through,
        ),
        ctx.trial(
            AREA,
            "live_input_is_read_as_it_is_written",
            &[s, Need::Cap(C::STDIN)],
            live_input_is_read_as_it_is_written,
        ),
        ctx.trial(
            AREA,
            "stdout_stderr_distinguishable",
            &[s],
            stdout_stderr_distinguishable,
        ),
        ctx.trial(
            AREA,
            "wait_idempotent_and_empty",
            &[s],
            wait_idempotent_and_empty,
        ),
        ctx.trial(AREA, "timeout_from_iteration", &[s], timeout_from_iteration),
        ctx.trial(
            AREA,
            "large_output_bounded_memory",
            &[s],
            large_output_bounded_memory,
        ),
        ctx.trial(AREA, "timeout_from_wait", &[s], timeout_from_wait),
        ctx.trial(
            AREA,
            "cleanup_after_full_iteration",
            &[s],
            cleanup_after_full_iteration,
        ),
        ctx.trial(
            AREA,
            "cleanup_after_early_break",
            &[s],
            cleanup_after_early_break,
        ),
        ctx.trial(
            AREA,
            "cleanup_after_consumer_error",
            &[s],
            cleanup_after_consumer_error,
        ),
        ctx.trial(AREA, "cleanup_after_drop", &[s], cleanup_after_drop),
        ctx.trial(
            AREA,
            "first_chunk_before_process_ends",
            &[s],
            first_chunk_before_process_ends,
        ),
        ctx.trial(
            AREA,
            "returncode_none_while_running",
            &[s],
            returncode_none_while_running,
        ),
        ctx.trial(
            AREA,
            "explicit_kill_ends_process",
            &[s],
            explicit_kill_ends_process,
        ),
        ctx.trial(
            AREA,
            "entry_point_honours_declaration",
            &[],
            entry_point_honours_declaration,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

fn stream(sb: &dyn Sandbox, cmd: &str, timeout: Duration) -> anyhow::Result<Process> {
    sbx(
        sb.stream(cmd.into(), RunOptions::default().timeout(timeout)),
        "stream",
    )
}

/// Collects a whole stream into (stdout, stderr).
async fn drain(p: &mut Process) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(item) = p.next().await {
        let chunk = sbx(item, "stream item")?;
        match chunk.stream {
            StreamKind::Stdout => out.extend_from_slice(&chunk.data),
            StreamKind::Stderr => err.extend_from_slice(&chunk.data),
        }
    }
    Ok((out, err))
}

/// `stream()` is a plain fn returning `Result<Process>` (checked at compile time).
async fn stream_is_not_a_future(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("stream_is_not_a_future")).await?;
    // No `.await`: this only compiles because `stream` is not async.
    let r: sandbox_core::Result<Process> = sb.stream(["echo", "x"].into(), RunOptions::default());
    let mut p = sbx(r, "stream")?;
    let (out, _) = drain(&mut p).await?;
    ensure!(out == b"x\n", "stdout {:?}", String::from_utf8_lossy(&out));
    sb.kill().await
}

/// The process starts on first poll: an unpolled `Process` runs nothing.
async fn starts_on_first_poll(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("starts_on_first_poll")).await?;
    let mut p = stream(
        &*sb,
        "echo started > /work/started",
        Duration::from_secs(30),
    )?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = run(&*sb, ["test", "-e", "/work/started"]).await?;
    ensure!(r.exit_code != 0, "the process ran before it was polled");
    let w = sbx(p.wait().await, "wait")?;
    ensure!(w.exit_code == 0, "exit {}", w.exit_code);
    let r = run(&*sb, ["test", "-e", "/work/started"]).await?;
    ensure!(r.exit_code == 0, "the process did not run once polled");
    sb.kill().await
}

/// Output within one stream arrives in order.
async fn order_within_a_stream(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("order_within_a_stream")).await?;
    let mut p = stream(&*sb, "seq 1 200", Duration::from_secs(30))?;
    let (out, _) = drain(&mut p).await?;
    let expected: String = (1..=200).map(|i| format!("{i}\n")).collect();
    ensure!(
        out == expected.as_bytes(),
        "out of order or incomplete: {:?}",
        String::from_utf8_lossy(&out)
    );
    sb.kill().await
}

/// A streamed process gets `RunOptions::stdin` too: `cat` streams 512 KiB of input back
/// in order, while the input is still being fed.
async fn stdin_streams_through(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("stdin_streams_through")).await?;
    let data: Vec<u8> = (0..512 * 1024).map(|i| (i % 253) as u8).collect();
    let mut p = sbx(
        sb.stream(
            ["cat"].into(),
            RunOptions::default()
                .stdin(data.clone())
                .timeout(Duration::from_secs(30)),
        ),
        "stream cat with stdin",
    )?;
    let (out, _) = drain(&mut p).await?;
    ensure!(
        out == data,
        "streamed back {} bytes of the {} given",
        out.len(),
        data.len()
    );
    sb.kill().await
}

/// With `interactive`, what is written through `Process::input` reaches the process
/// while it runs: `cat` echoes each line before the next is written (input given all at
/// once could not pass), `end` is its end of input (exit 0), a resize is refused (no
/// terminal), and a process without live input has no `input()`.
async fn live_input_is_read_as_it_is_written(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("live_input_is_read_as_it_is_written"))
        .await?;
    let mut p = sbx(
        sb.stream(
            ["cat"].into(),
            RunOptions::default()
                .interactive()
                .timeout(Duration::from_secs(30)),
        ),
        "stream cat with live input",
    )?;
    let input = sbx(p.input().await, "input()")?;
    let mut seen = Vec::new();
    for line in ["first line\n", "second line\n"] {
        sbx(input.write(line).await, "writing")?;
        let expected = [seen.as_slice(), line.as_bytes()].concat();
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while seen.len() < expected.len() {
                match p.next().await {
                    Some(Ok(c)) => seen.extend_from_slice(&c.data),
                    Some(Err(e)) => bail!("output: {}", e.render()),
                    None => bail!("the process ended"),
                }
            }
            Ok(())
        })
        .await;
        waited
            .map_err(|_| anyhow::anyhow!("{line:?} was not echoed within 10 s"))?
            .with_context(|| format!("waiting for {line:?}"))?;
        ensure!(
            seen == expected,
            "echoed {:?}",
            String::from_utf8_lossy(&seen)
        );
    }
    must_code(
        input.resize(sandbox_core::PtySize::default()).await,
        ErrorCode::Configuration,
    )
    .context("resizing a process without a terminal")?;
    sbx(input.end().await, "end of input")?;
    let end = sbx(p.wait().await, "cat's end")?;
    ensure!(
        end.exit_code == 0,
        "cat exited {} after the end",
        end.exit_code
    );
    let mut plain = sbx(
        sb.stream(["true"].into(), RunOptions::default()),
        "stream true",
    )?;
    must_code(plain.input().await, ErrorCode::Configuration)
        .context("input() of a process without live input")?;
    sbx(plain.wait().await, "true")?;
    sb.kill().await
}

/// Stdout and stderr chunks are tagged with their stream.
async fn stdout_stderr_distinguishable(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("stdout_stderr_distinguishable")).await?;
    let mut p = stream(
        &*sb,
        "echo out; echo err >&2; echo out2",
        Duration::from_secs(30),
    )?;
    let (out, err) = drain(&mut p).await?;
    ensure!(
        out == b"out\nout2\n",
        "stdout {:?}",
        String::from_utf8_lossy(&out)
    );
    ensure!(
        err == b"err\n",
        "stderr {:?}",
        String::from_utf8_lossy(&err)
    );
    sb.kill().await
}

/// `wait()` drains unconsumed output, returns `streamed = true` with empty output, and is
/// idempotent.
async fn wait_idempotent_and_empty(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("wait_idempotent_and_empty")).await?;
    let mut p = stream(&*sb, "seq 1 500; exit 4", Duration::from_secs(30))?;
    let first = sbx(p.wait().await, "first wait")?;
    ensure!(
        first.streamed && first.stdout.is_empty() && first.stderr.is_empty(),
        "{first:?}"
    );
    ensure!(first.exit_code == 4, "exit {}", first.exit_code);
    let second = sbx(p.wait().await, "second wait")?;
    ensure!(second == first, "second wait {second:?} != first {first:?}");
    ensure!(p.next().await.is_none(), "items after wait");
    sb.kill().await
}

/// A streamed process past its timeout yields `ExecutionTimeout` from iteration.
async fn timeout_from_iteration(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("timeout_from_iteration")).await?;
    let mut p = stream(
        &*sb,
        "echo $$ > /work/tpid; echo hi; exec sleep 30",
        Duration::from_secs(1),
    )?;
    let started = Instant::now();
    let mut timed_out = false;
    while let Some(item) = tokio::time::timeout(Duration::from_secs(30), p.next())
        .await
        .context("iteration hung past the timeout")?
    {
        if let Err(e) = item {
            ensure!(
                e.code() == ErrorCode::ExecutionTimeout,
                "expected ExecutionTimeout, got {}",
                e.render()
            );
            timed_out = true;
            break;
        }
    }
    ensure!(timed_out, "the stream ended without ExecutionTimeout");
    ensure!(
        started.elapsed() < crate::ctx::grace_plus(Duration::from_secs(3)),
        "timeout took {:?}",
        started.elapsed()
    );
    let pid = read_pid(&*sb, "/work/tpid").await?;
    assert_pid_gone(&*sb, &pid, "timed-out streamed process").await?;
    drop(p);
    sb.kill().await
}

/// A streamed process past its timeout yields `ExecutionTimeout` from `wait()`.
async fn timeout_from_wait(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("timeout_from_wait")).await?;
    let mut p = stream(&*sb, "sleep 30", Duration::from_secs(1))?;
    let r = tokio::time::timeout(Duration::from_secs(30), p.wait())
        .await
        .context("wait hung past the timeout")?;
    must_code(r, ErrorCode::ExecutionTimeout)?;
    must_code(p.wait().await, ErrorCode::ExecutionTimeout)?;
    sb.kill().await
}

const READY: &str = "echo $$ > /work/cpid; echo ready; exec sleep 1000";

/// Reads chunks until `ready` appeared on stdout.
async fn until_ready(p: &mut Process) -> anyhow::Result<()> {
    let mut seen = Vec::new();
    loop {
        let item = tokio::time::timeout(Duration::from_secs(20), p.next())
            .await
            .context("no `ready` from the streamed process")?;
        match item {
            Some(Ok(c)) => {
                seen.extend_from_slice(&c.data);
                if seen.windows(5).any(|w| w == b"ready") {
                    return Ok(());
                }
            }
            Some(Err(e)) => bail!("stream error before ready: {}", e.render()),
            None => bail!("stream ended before ready"),
        }
    }
}

/// After iterating a stream to its end, its process is gone: the end of the iteration is
/// the end of the process (all its output, its exit code), never a quiet pause.
async fn cleanup_after_full_iteration(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("cleanup_after_full_iteration")).await?;
    // A pause in the output longer than any read timeout an adapter might take for the
    // end of the stream.
    let mut p = stream(
        &*sb,
        "echo $$ > /work/cpid; seq 1 50; sleep 3; echo after-the-pause",
        Duration::from_secs(30),
    )?;
    let (out, _) = drain(&mut p).await?;
    ensure!(
        out.ends_with(b"50\nafter-the-pause\n"),
        "the iteration ended before the process did: got {:?}",
        String::from_utf8_lossy(&out)
    );
    ensure!(p.returncode() == Some(0), "returncode {:?}", p.returncode());
    let pid = read_pid(&*sb, "/work/cpid").await?;
    // Checked once, at once: the iteration's end must not precede the process's.
    ensure!(
        !pid_alive(&*sb, &pid).await?,
        "pid {pid} still alive right after its stream ended"
    );
    sb.kill().await
}

/// Breaking out of the iteration early (then dropping) kills the process.
async fn cleanup_after_early_break(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("cleanup_after_early_break")).await?;
    {
        let mut p = stream(&*sb, READY, Duration::from_secs(120))?;
        // Iterates until `ready`, then breaks out; `p` is dropped at the end of the block.
        until_ready(&mut p).await?;
    }
    let pid = wait_for_pid(&*sb, "/work/cpid", Duration::from_secs(5)).await?;
    assert_pid_gone(&*sb, &pid, "stream left by an early break").await?;
    sb.kill().await
}

async fn consume_and_fail(sb: &dyn Sandbox) -> anyhow::Result<()> {
    let mut p = stream(sb, READY, Duration::from_secs(120))?;
    until_ready(&mut p).await?;
    // The consumer's own error propagates with `?`, dropping the process.
    let n: u32 = "not-a-number".parse()?;
    bail!("parsed {n}")
}

/// An error in the consumer (propagated with `?`) still kills the process.
async fn cleanup_after_consumer_error(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("cleanup_after_consumer_error")).await?;
    let e = consume_and_fail(&*sb).await.expect_err("consumer fails");
    ensure!(
        e.downcast_ref::<std::num::ParseIntError>().is_some(),
        "unexpected error: {e:#}"
    );
    let pid = read_pid(&*sb, "/work/cpid").await?;
    assert_pid_gone(&*sb, &pid, "stream dropped by a consumer error").await?;
    sb.kill().await
}

/// Dropping a started process without consuming it kills it.
async fn cleanup_after_drop(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("cleanup_after_drop")).await?;
    let mut p = stream(&*sb, READY, Duration::from_secs(120))?;
    sbx(p.start().await, "start")?;
    let pid = wait_for_pid(&*sb, "/work/cpid", Duration::from_secs(20)).await?;
    drop(p);
    assert_pid_gone(&*sb, &pid, "dropped process").await?;
    sb.kill().await
}

/// The first chunk arrives while the process is still running.
async fn first_chunk_before_process_ends(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("first_chunk_before_process_ends"))
        .await?;
    let mut p = stream(
        &*sb,
        "echo first; sleep 2; echo second",
        Duration::from_secs(30),
    )?;
    let started = Instant::now();
    let first = tokio::time::timeout(Duration::from_secs(10), p.next())
        .await
        .context("no first chunk")?
        .context("stream ended at once")?;
    let at = started.elapsed();
    let first = sbx(first, "first chunk")?;
    ensure!(
        first.data.starts_with(b"first"),
        "first chunk {:?}",
        first.data
    );
    ensure!(
        at < Duration::from_millis(1500),
        "first chunk only after {at:?}: output is buffered until the end"
    );
    let (rest, _) = drain(&mut p).await?;
    ensure!(
        rest.ends_with(b"second\n"),
        "rest {:?}",
        String::from_utf8_lossy(&rest)
    );
    ensure!(
        started.elapsed() >= Duration::from_millis(1800),
        "the process ended after {:?}",
        started.elapsed()
    );
    sb.kill().await
}

/// `returncode()` is `None` while running and `Some(code)` after the end.
async fn returncode_none_while_running(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("returncode_none_while_running")).await?;
    let mut p = stream(&*sb, "echo x; sleep 0.5; exit 7", Duration::from_secs(30))?;
    ensure!(p.returncode().is_none(), "returncode before start");
    let first = p.next().await;
    ensure!(matches!(first, Some(Ok(_))), "first item {first:?}");
    ensure!(
        p.returncode().is_none(),
        "returncode while running: {:?}",
        p.returncode()
    );
    let r = sbx(p.wait().await, "wait")?;
    ensure!(r.exit_code == 7, "exit {}", r.exit_code);
    ensure!(
        p.returncode() == Some(7),
        "returncode after end: {:?}",
        p.returncode()
    );
    sb.kill().await
}

/// `Process::kill` ends the remote process and is idempotent.
async fn explicit_kill_ends_process(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("explicit_kill_ends_process")).await?;
    let mut p = stream(&*sb, READY, Duration::from_secs(120))?;
    until_ready(&mut p).await?;
    let pid = read_pid(&*sb, "/work/cpid").await?;
    sbx(p.kill().await, "kill")?;
    sbx(p.kill().await, "second kill")?;
    assert_pid_gone(&*sb, &pid, "killed process").await?;
    let out = run_ok(&*sb, ["echo", "ok"]).await?;
    ensure!(out == "ok\n", "sandbox after process kill: {out:?}");
    sb.kill().await
}

/// `stream()` honours the declaration: with `STREAMING` it returns a `Process` that
/// delivers the output and exit code; without it, `stream()` itself (not the first poll)
/// returns `CapabilityNotSupported`.
async fn entry_point_honours_declaration(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("entry_point_honours_declaration"))
        .await?;
    let declared = sb.capabilities().contains(C::STREAMING);
    let started = sb.stream(["echo", "streamed"].into(), RunOptions::default());
    if declared {
        let mut p = sbx(started, "stream() although STREAMING is declared")?;
        let (out, _) = tokio::time::timeout(Duration::from_secs(30), drain(&mut p))
            .await
            .context("the streamed echo did not end")??;
        ensure!(out == b"streamed\n", "streamed stdout {out:?}");
        let r = sbx(p.wait().await, "wait")?;
        ensure!(r.exit_code == 0, "streamed echo exited {}", r.exit_code);
    } else {
        must_code(started, ErrorCode::CapabilityNotSupported)?;
    }
    sb.kill().await
}

/// Output streamed by a process printing 200 MB to a consumer that reads slowly.
const STREAMED_BYTES: u64 = 200 * 1024 * 1024;
/// How much this process's memory may grow meanwhile: the adapter buffers a bounded
/// window, never the output the consumer has not read yet.
const STREAM_RSS_BOUND: u64 = 64 * 1024 * 1024;

/// `stream` holds memory bounded by a window, not by the output: a process printing
/// 200 MB to a consumer that reads slowly (a pause every MiB) grows this process's memory
/// by at most 64 MiB, and every byte arrives.
async fn large_output_bounded_memory(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("large_output_bounded_memory")).await?;
    let _heavy = ctx.heavy_lock.lock().await;
    let count = (STREAMED_BYTES / (1024 * 1024)).to_string();
    let mut p = sbx(
        sb.stream(
            [
                "dd",
                "if=/dev/zero",
                "bs=1048576",
                &format!("count={count}"),
            ]
            .into(),
            RunOptions::default().timeout(Duration::from_secs(150)),
        ),
        "stream",
    )?;
    let base = crate::files::rss_bytes();
    let sampler = crate::files::RssSampler::start();
    let (mut got, mut next_pause) = (0u64, 0u64);
    while let Some(chunk) = p.next().await {
        let chunk = sbx(chunk, "stream chunk")?;
        if chunk.stream == StreamKind::Stdout {
            ensure!(
                chunk.data.iter().all(|b| *b == 0),
                "dd if=/dev/zero streamed a non-zero byte"
            );
            got += chunk.data.len() as u64;
        }
        if got >= next_pause {
            // The slow consumer: the process keeps writing while this one sleeps.
            tokio::time::sleep(Duration::from_millis(15)).await;
            next_pause = got + 1024 * 1024;
        }
    }
    let growth = sampler.finish().saturating_sub(base);
    ensure!(
        p.returncode() == Some(0),
        "dd ended with {:?}",
        p.returncode()
    );
    ensure!(
        got == STREAMED_BYTES,
        "{got} of {STREAMED_BYTES} bytes arrived"
    );
    let mib = |b: u64| b as f64 / 1048576.0;
    ensure!(
        growth <= STREAM_RSS_BOUND,
        "streaming 200 MB to a slow consumer grew this process by {:.1} MiB (bound {:.1} \
         MiB): output is buffered ahead of the consumer",
        mib(growth),
        mib(STREAM_RSS_BOUND)
    );
    sb.kill().await
}
