//! Contract trials: commands on a pseudo-terminal (`RunOptions::pty`, `PTY`).
//!
//! What a declared `PTY` promises: the command sees a terminal on stdin, stdout and stderr;
//! what is typed through [`Process::input`](sandbox_core::Process::input) reaches
//! it while its output is read; a resize reaches it; `^D` ends a line-mode reader; and a
//! timeout or a dropped stream kills what runs on the terminal, as for any command.
//! Without `PTY` each trial proves the refusal instead (`CapabilityNotSupported` from
//! `stream`/`run`, before anything starts), which needs nothing.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt;
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, ErrorCode, Process, ProcessInput, PtySize, RunOptions, Sandbox,
};

use crate::ctx::{Ctx, Need, assert_pid_gone, must_code, run, sbx, wait_for_pid};

const AREA: &str = "pty";

/// How long a trial waits for an expected piece of terminal output.
const OUTPUT_WAIT: Duration = Duration::from_secs(10);

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let needs: &[Need] = if ctx.caps.contains(C::PTY) {
        &[Need::Cap(C::RUN_COMMAND | C::STREAMING)]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "command_sees_a_terminal",
            needs,
            command_sees_a_terminal,
        ),
        ctx.trial(
            AREA,
            "typed_input_reaches_the_shell",
            needs,
            typed_input_reaches_the_shell,
        ),
        ctx.trial(
            AREA,
            "resize_reaches_the_process",
            needs,
            resize_reaches_the_process,
        ),
        ctx.trial(
            AREA,
            "end_of_file_ends_a_reader",
            needs,
            end_of_file_ends_a_reader,
        ),
        ctx.trial(
            AREA,
            "timeout_kills_what_runs_on_the_terminal",
            needs,
            timeout_kills_what_runs_on_the_terminal,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// A sandbox for a terminal trial; `None` when the backend does not declare `PTY` and a
/// terminal was just proven refused by `run` and `stream`.
async fn sandbox(ctx: &Ctx, name: &str) -> anyhow::Result<Option<crate::ctx::Sbx>> {
    let c = case(name);
    let sb = ctx.sandbox(&c).await?;
    if sb.capabilities().contains(C::PTY) {
        return Ok(Some(sb));
    }
    ensure!(
        !ctx.caps.contains(C::PTY),
        "the backend declares PTY but this sandbox does not"
    );
    let pty = || RunOptions::default().pty(PtySize::default());
    must_code(
        sb.run(["true"].into(), pty()).await.map(|_| ()),
        ErrorCode::CapabilityNotSupported,
    )
    .context("run on a terminal without PTY")?;
    must_code(
        sb.stream(["true"].into(), pty()).map(|_| ()),
        ErrorCode::CapabilityNotSupported,
    )
    .context("stream on a terminal without PTY")?;
    sb.kill().await?;
    Ok(None)
}

/// `program` streamed on a terminal of `size` (30 s timeout), and its input.
async fn on_terminal(
    sb: &dyn Sandbox,
    program: &str,
    size: PtySize,
) -> anyhow::Result<(Process, ProcessInput)> {
    let mut p = sbx(
        sb.stream(
            [program].into(),
            RunOptions::default()
                .pty(size)
                .timeout(Duration::from_secs(30)),
        ),
        &format!("stream {program} on a terminal"),
    )?;
    let input = sbx(p.input().await, "input()")?;
    Ok((p, input))
}

/// Reads `p`'s output until it contains `needle` (within [`OUTPUT_WAIT`]); returns all of
/// it so far.
async fn read_until(p: &mut Process, seen: &mut String, needle: &str) -> anyhow::Result<()> {
    let waited = tokio::time::timeout(OUTPUT_WAIT, async {
        while !seen.contains(needle) {
            match p.next().await {
                Some(Ok(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk.data)),
                Some(Err(e)) => bail!("the terminal's output failed: {}", e.render()),
                None => bail!("the process ended before printing {needle:?}"),
            }
        }
        Ok(())
    })
    .await;
    match waited {
        Ok(r) => r.with_context(|| format!("terminal output so far: {seen:?}")),
        Err(_) => bail!("no {needle:?} on the terminal within {OUTPUT_WAIT:?}; so far: {seen:?}"),
    }
}

/// stdin, stdout and stderr are a terminal (`test -t`, `tty` names a `/dev/pts` device),
/// stderr arrives merged into stdout, and without `pty` the same command sees none.
async fn command_sees_a_terminal(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "command_sees_a_terminal").await? else {
        return Ok(());
    };
    let script = "test -t 0 && test -t 1 && test -t 2 && tty && echo to-stderr >&2";
    let r = sbx(
        sb.run(script.into(), RunOptions::default().pty(PtySize::default()))
            .await,
        "run on a terminal",
    )?;
    let out = r.stdout_text();
    ensure!(
        r.exit_code == 0,
        "not a terminal on every stream: exit {} {out:?}",
        r.exit_code
    );
    ensure!(out.contains("/dev/pts/"), "tty printed {out:?}");
    ensure!(
        out.contains("to-stderr") && r.stderr.is_empty(),
        "stderr is not merged into the terminal's output: {r:?}"
    );
    let plain = run(&*sb, ["sh", "-c", "test -t 0 || test -t 1"]).await?;
    ensure!(
        plain.exit_code != 0,
        "a command without pty sees a terminal"
    );
    sb.kill().await
}

/// Typed lines reach an interactive shell while its output is read, and its exit code
/// comes back: the shell computes what it prints, so the echo of the typed line alone
/// cannot pass.
async fn typed_input_reaches_the_shell(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "typed_input_reaches_the_shell").await? else {
        return Ok(());
    };
    let (mut p, term) = on_terminal(&*sb, "sh", PtySize::default()).await?;
    let mut seen = String::new();
    for (typed, expected) in [
        ("echo sbx-$((40+2))\r", "sbx-42"),
        ("echo sbx-$((6*7))-again\r", "sbx-42-again"),
    ] {
        sbx(term.write(typed).await, "typing")?;
        read_until(&mut p, &mut seen, expected).await?;
    }
    sbx(term.write("exit 3\r").await, "typing exit")?;
    let end = sbx(p.wait().await, "the shell's end")?;
    ensure!(end.exit_code == 3, "the shell exited {}", end.exit_code);
    sb.kill().await
}

/// The size given at start and a later resize are what the process reads (`stty size`).
async fn resize_reaches_the_process(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "resize_reaches_the_process").await? else {
        return Ok(());
    };
    let (mut p, term) = on_terminal(&*sb, "sh", PtySize::new(31, 101)).await?;
    let mut seen = String::new();
    sbx(term.write("stty size\r").await, "typing")?;
    read_until(&mut p, &mut seen, "31 101").await?;
    sbx(term.resize(PtySize::new(42, 123)).await, "resize")?;
    sbx(term.write("stty size\r").await, "typing")?;
    read_until(&mut p, &mut seen, "42 123").await?;
    must_code(
        term.resize(PtySize::new(0, 80)).await,
        ErrorCode::Configuration,
    )
    .context("an empty terminal size")?;
    sbx(term.write("exit\r").await, "typing exit")?;
    sbx(p.wait().await, "the shell's end")?;
    sb.kill().await
}

/// `^D` ends a program reading the terminal line by line (`cat`), which then exits 0.
async fn end_of_file_ends_a_reader(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "end_of_file_ends_a_reader").await? else {
        return Ok(());
    };
    let (mut p, term) = on_terminal(&*sb, "cat", PtySize::default()).await?;
    let mut seen = String::new();
    sbx(term.write("line-one\r").await, "typing")?;
    // The terminal echoes the line, then cat prints it: twice.
    read_until(&mut p, &mut seen, "line-one\r\nline-one").await?;
    sbx(term.end().await, "end of file")?;
    let end = sbx(p.wait().await, "cat's end")?;
    ensure!(end.exit_code == 0, "cat exited {} after ^D", end.exit_code);
    sb.kill().await
}

/// A command on a terminal that outlives its timeout is killed with everything it
/// started (`ExecutionTimeout`), and the sandbox keeps working.
async fn timeout_kills_what_runs_on_the_terminal(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "timeout_kills_what_runs_on_the_terminal").await? else {
        return Ok(());
    };
    let script = "sh -c 'echo $$ > /tmp/pty-child; exec sleep 301' & sleep 302";
    let r = sb
        .run(
            script.into(),
            RunOptions::default()
                .pty(PtySize::default())
                .timeout(Duration::from_secs(2)),
        )
        .await;
    must_code(r, ErrorCode::ExecutionTimeout)?;
    let child = wait_for_pid(&*sb, "/tmp/pty-child", Duration::from_secs(5)).await?;
    assert_pid_gone(
        &*sb,
        &child,
        "a background child of a timed-out terminal command",
    )
    .await?;
    let after = sbx(
        sb.run(["echo", "still-here"].into(), RunOptions::default())
            .await,
        "run after the timeout",
    )?;
    ensure!(after.stdout_text() == "still-here\n", "after: {after:?}");
    sb.kill().await
}
