//! Contract trials: `Sandbox::run` (exit codes, output, env, argv vs shell, timeouts,
//! output cap, binary safety, workdir).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, ErrorCode, RunOptions};

use crate::ctx::{
    Ctx, Need, assert_pid_gone, must_code, pid_alive, read_pid, run, run_ok, sbx, wait_for_pid,
};

const AREA: &str = "run";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let r = Need::Cap(C::RUN_COMMAND);
    vec![
        ctx.trial(
            AREA,
            "exit_codes_and_raise_for_status",
            &[r],
            exit_codes_and_raise_for_status,
        ),
        ctx.trial(
            AREA,
            "stdout_stderr_separated",
            &[r],
            stdout_stderr_separated,
        ),
        ctx.trial(AREA, "env_injected", &[r], env_injected),
        ctx.trial(AREA, "list_not_via_shell", &[r], list_not_via_shell),
        ctx.trial(AREA, "string_via_shell", &[r], string_via_shell),
        ctx.trial(
            AREA,
            "timeout_kills_only_that_process",
            &[r],
            timeout_kills_only_that_process,
        ),
        ctx.trial(
            AREA,
            "timeout_kills_process_tree",
            &[r],
            timeout_kills_process_tree,
        ),
        ctx.trial(
            AREA,
            "detached_child_survives_another_timeout",
            &[r],
            detached_child_survives_another_timeout,
        ),
        ctx.trial(AREA, "none_inherits_lifetime", &[r], none_inherits_lifetime),
        ctx.trial(AREA, "zero_timeout_refused", &[r], zero_timeout_refused),
        ctx.trial(
            AREA,
            "missing_binary_argv_is_127",
            &[r],
            missing_binary_argv_is_127,
        ),
        ctx.trial(
            AREA,
            "missing_binary_shell_is_127",
            &[r],
            missing_binary_shell_is_127,
        ),
        ctx.trial(
            AREA,
            "output_cap_exceeded_is_typed",
            &[r],
            output_cap_exceeded_is_typed,
        ),
        ctx.trial(
            AREA,
            "binary_safe_stdout",
            &[r, Need::Cap(C::FILESYSTEM)],
            binary_safe_stdout,
        ),
        ctx.trial(AREA, "large_output_intact", &[r], large_output_intact),
        ctx.trial(AREA, "workdir_is_work", &[r], workdir_is_work),
        ctx.trial(AREA, "workdir_option_applies", &[r], workdir_option_applies),
        ctx.trial(AREA, "create_workdir_applies", &[r], create_workdir_applies),
        ctx.trial(
            AREA,
            "stdin_reaches_the_command",
            &[r, Need::Cap(C::STDIN)],
            stdin_reaches_the_command,
        ),
        ctx.trial(
            AREA,
            "unread_stdin_is_not_an_error",
            &[r, Need::Cap(C::STDIN)],
            unread_stdin_is_not_an_error,
        ),
        ctx.trial(
            AREA,
            "no_stdin_is_end_of_input",
            &[r],
            no_stdin_is_end_of_input,
        ),
    ]
}

/// 1 MiB and a bit of every byte value, more than any pipe holds.
fn stdin_payload() -> Bytes {
    (0..(1usize << 20) + 4099)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// `RunOptions::stdin` reaches the command byte for byte, then end of input: `cat`
/// echoes 1 MiB of every byte value back (fed while the output is read, so more than a
/// pipe holds cannot deadlock) and exits 0.
async fn stdin_reaches_the_command(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("stdin_reaches_the_command")).await?;
    let data = stdin_payload();
    let r = sbx(
        sb.run(
            ["cat"].into(),
            RunOptions::default()
                .stdin(data.clone())
                .timeout(Duration::from_secs(30)),
        )
        .await,
        "cat with stdin",
    )?;
    ensure!(r.exit_code == 0, "cat with stdin exited {}", r.exit_code);
    ensure!(
        r.stdout == data,
        "cat echoed {} bytes of the {} given (first difference at {:?})",
        r.stdout.len(),
        data.len(),
        r.stdout.iter().zip(data.iter()).position(|(a, b)| a != b)
    );
    sb.kill().await
}

/// A command that exits without reading its input is not an error and does not hang
/// (as with a shell pipe): `echo kept` given 4 MiB exits 0 promptly with its output
/// intact, and the sandbox still runs commands afterwards.
async fn unread_stdin_is_not_an_error(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("unread_stdin_is_not_an_error")).await?;
    let big = Bytes::from(vec![b'x'; 4 << 20]);
    let started = Instant::now();
    let r = sbx(
        sb.run(
            ["echo", "kept"].into(),
            RunOptions::default()
                .stdin(big)
                .timeout(Duration::from_secs(20)),
        )
        .await,
        "echo with unread stdin",
    )?;
    ensure!(
        r.exit_code == 0 && r.stdout_text() == "kept\n",
        "echo with unread stdin: exit {}, stdout {:?}",
        r.exit_code,
        r.stdout_text()
    );
    ensure!(
        started.elapsed() < Duration::from_secs(10),
        "echo with unread stdin took {:?}",
        started.elapsed()
    );
    let r = run(&*sb, ["echo", "after"]).await?;
    ensure!(r.stdout_text() == "after\n", "next command: {r:?}");
    sb.kill().await
}

/// Without `RunOptions::stdin` a command reads end of input at once: `cat` exits 0 with
/// nothing, never waiting for input that cannot come.
async fn no_stdin_is_end_of_input(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("no_stdin_is_end_of_input")).await?;
    let r = sbx(
        sb.run(
            ["cat"].into(),
            RunOptions::default().timeout(Duration::from_secs(10)),
        )
        .await,
        "cat without stdin",
    )?;
    ensure!(
        r.exit_code == 0 && r.stdout.is_empty(),
        "cat without stdin: {r:?}"
    );
    sb.kill().await
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// Exit codes are returned, not raised; `raise_for_status` turns non-zero into
/// `Execution` carrying the code.
async fn exit_codes_and_raise_for_status(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("exit_codes_and_raise_for_status"))
        .await?;
    let ok = run(&*sb, ["true"]).await?;
    ensure!(ok.exit_code == 0 && ok.ok(), "true: {ok:?}");
    sbx(ok.raise_for_status(), "raise_for_status on exit 0")?;
    let bad = run(&*sb, "exit 3").await?;
    ensure!(bad.exit_code == 3 && !bad.ok(), "exit 3: {bad:?}");
    let e = must_code(bad.raise_for_status(), ErrorCode::Execution)?;
    ensure!(
        matches!(
            e,
            sandbox_core::SandboxError::Execution { exit_code: 3, .. }
        ),
        "Execution error does not carry exit code 3: {e:?}"
    );
    let f = run(&*sb, ["false"]).await?;
    ensure!(f.exit_code == 1, "false exited {}", f.exit_code);
    sb.kill().await
}

/// Stdout and stderr are captured separately.
async fn stdout_stderr_separated(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("stdout_stderr_separated")).await?;
    let r = run(&*sb, "echo out; echo err >&2").await?;
    ensure!(
        r.stdout_text() == "out\n" && r.stderr_text() == "err\n",
        "stdout {:?} stderr {:?}",
        r.stdout_text(),
        r.stderr_text()
    );
    ensure!(!r.streamed, "run result marked streamed");
    sb.kill().await
}

/// `CreateOptions::env`, secrets and `RunOptions::env` reach the process.
async fn env_injected(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("env_injected");
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .env("SBX_CREATE_ENV", "from-create")
                .secret("SBX_SECRET_ENV", "from-secret"),
        )
        .await?;
    let r = sbx(
        sb.run(
            ["printenv", "SBX_RUN_ENV"].into(),
            RunOptions::default().env("SBX_RUN_ENV", "from-run"),
        )
        .await,
        "printenv",
    )?;
    ensure!(r.stdout_text() == "from-run\n", "run env: {r:?}");
    let v = run_ok(&*sb, ["printenv", "SBX_CREATE_ENV"]).await?;
    ensure!(v == "from-create\n", "create env: {v:?}");
    let s = run_ok(&*sb, ["printenv", "SBX_SECRET_ENV"]).await?;
    ensure!(s == "from-secret\n", "secret env: {s:?}");
    sb.kill().await
}

/// A command given as a list never goes through a shell.
async fn list_not_via_shell(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("list_not_via_shell")).await?;
    let out = run_ok(&*sb, ["echo", "$HOME;", "a|b", "`id`", "&&", "*"]).await?;
    ensure!(
        out == "$HOME; a|b `id` && *\n",
        "argv was interpreted by a shell: {out:?}"
    );
    sb.kill().await
}

/// A command given as a string runs via `sh -c`.
async fn string_via_shell(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("string_via_shell")).await?;
    let out = run_ok(&*sb, "echo one && echo two; false || echo three").await?;
    ensure!(out == "one\ntwo\nthree\n", "shell string: {out:?}");
    sb.kill().await
}

/// A timeout kills the whole process tree: a background child of the timed-out command
/// (its output detached) is gone too, not just the exec's own pid.
async fn timeout_kills_process_tree(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("timeout_kills_process_tree")).await?;
    let r = sb
        .run(
            "sleep 300 > /dev/null 2>&1 & echo $! > /work/child; sleep 300".into(),
            RunOptions::default().timeout(Duration::from_secs(1)),
        )
        .await;
    must_code(r, ErrorCode::ExecutionTimeout)?;
    let child = wait_for_pid(&*sb, "/work/child", Duration::from_secs(5)).await?;
    assert_pid_gone(&*sb, &child, "background child of a timed-out command").await?;
    sb.kill().await
}

/// A timeout returns `ExecutionTimeout`, kills that process only; another process and the
/// sandbox survive.
async fn timeout_kills_only_that_process(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("timeout_kills_only_that_process"))
        .await?;
    let background = sb.run(
        "echo $$ > /work/bg; exec sleep 60".into(),
        RunOptions::default().timeout(Duration::from_secs(120)),
    );
    let checks = async {
        let bg = wait_for_pid(&*sb, "/work/bg", Duration::from_secs(20)).await?;
        let started = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(30),
            sb.run(
                "echo $$ > /work/fg; exec sleep 30".into(),
                RunOptions::default().timeout(Duration::from_secs(1)),
            ),
        )
        .await
        .context("a run with a 1 s timeout did not return within 30 s")?;
        let took = started.elapsed();
        must_code(r, ErrorCode::ExecutionTimeout)?;
        ensure!(
            took >= Duration::from_millis(900),
            "timed out early, after {took:?}"
        );
        ensure!(
            took < Duration::from_secs(1) + crate::ctx::grace_plus(Duration::from_secs(2)),
            "timeout took {took:?}"
        );
        let fg = read_pid(&*sb, "/work/fg").await?;
        assert_pid_gone(&*sb, &fg, "the timed-out process").await?;
        ensure!(
            pid_alive(&*sb, &bg).await?,
            "the timeout killed another process (pid {bg}) too"
        );
        let out = run_ok(&*sb, ["echo", "still-usable"]).await?;
        ensure!(out == "still-usable\n", "sandbox after timeout: {out:?}");
        Ok::<_, anyhow::Error>(())
    };
    tokio::select! {
        r = background => bail!("the background process ended during the trial: {r:?}"),
        r = checks => r?,
    }
    sb.kill().await
}

/// A process one command left running in the background (the command itself exited 0)
/// is that command's business only: it survives its own command's end and the timeout
/// of a later command. (An agent once counted it among the later command's victims.)
async fn detached_child_survives_another_timeout(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("detached_child_survives_another_timeout"))
        .await?;
    let started = sb
        .run(
            "sleep 300 > /dev/null 2>&1 & echo $! > /work/bg".into(),
            RunOptions::default().timeout(Duration::from_secs(30)),
        )
        .await?;
    ensure!(
        started.exit_code == 0,
        "starting the background process: {started:?}"
    );
    let bg = wait_for_pid(&*sb, "/work/bg", Duration::from_secs(5)).await?;
    ensure!(
        pid_alive(&*sb, &bg).await?,
        "the background process (pid {bg}) died when its command ended"
    );
    let r = sb
        .run(
            "sleep 60 > /dev/null 2>&1 & echo $! > /work/fg; sleep 60".into(),
            RunOptions::default().timeout(Duration::from_secs(1)),
        )
        .await;
    must_code(r, ErrorCode::ExecutionTimeout)?;
    let fg = wait_for_pid(&*sb, "/work/fg", Duration::from_secs(5)).await?;
    assert_pid_gone(&*sb, &fg, "background child of the timed-out command").await?;
    ensure!(
        pid_alive(&*sb, &bg).await?,
        "another command's timeout killed the earlier command's background process (pid {bg})"
    );
    sb.kill().await
}

/// `timeout: None` inherits the sandbox lifetime: a long command in a short-lived sandbox
/// ends (timeout or gone) instead of hanging.
async fn none_inherits_lifetime(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("none_inherits_lifetime");
    // The lifetime runs from create, and create itself can take a second or more on a
    // loaded engine: "before the lifetime" is measured from before create.
    let started = Instant::now();
    let sb = ctx
        .create(&c, ctx.opts(&c).timeout(Duration::from_secs(3)))
        .await?;
    let bound = Duration::from_secs(3) + crate::ctx::grace_plus(Duration::from_secs(5));
    let r = tokio::time::timeout(bound, sb.run(["sleep", "60"].into(), RunOptions::default()))
        .await
        .with_context(|| {
            format!("run with timeout None outlived the sandbox lifetime by {bound:?}")
        })?;
    match r {
        Err(e)
            if matches!(
                e.code(),
                ErrorCode::ExecutionTimeout | ErrorCode::SandboxGone
            ) => {}
        other => bail!("expected ExecutionTimeout or SandboxGone, got {other:?}"),
    }
    ensure!(
        started.elapsed() >= Duration::from_millis(2500),
        "ended after {:?}, before the lifetime",
        started.elapsed()
    );
    sb.kill().await
}

/// A zero timeout is a `Configuration` error.
async fn zero_timeout_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("zero_timeout_refused")).await?;
    must_code(
        sb.run(
            ["true"].into(),
            RunOptions::default().timeout(Duration::ZERO),
        )
        .await,
        ErrorCode::Configuration,
    )?;
    sb.kill().await
}

/// A missing executable given as argv exits 127 with a message on stderr.
async fn missing_binary_argv_is_127(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("missing_binary_argv_is_127")).await?;
    let r = run(&*sb, ["sbx-no-such-binary", "x"]).await?;
    ensure!(r.exit_code == 127, "exit {} ({r:?})", r.exit_code);
    ensure!(!r.stderr.is_empty(), "no message on stderr");
    sb.kill().await
}

/// A missing executable in a shell string exits 127 with a message on stderr.
async fn missing_binary_shell_is_127(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("missing_binary_shell_is_127")).await?;
    let r = run(&*sb, "sbx-no-such-binary x").await?;
    ensure!(r.exit_code == 127, "exit {} ({r:?})", r.exit_code);
    ensure!(!r.stderr.is_empty(), "no message on stderr");
    sb.kill().await
}

/// Output past `output_cap` is a `ResourceLimitExceeded` error, not a truncated result.
async fn output_cap_exceeded_is_typed(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("output_cap_exceeded_is_typed")).await?;
    let r = sb
        .run(
            ["dd", "if=/dev/zero", "bs=1024", "count=64"].into(),
            RunOptions::default().output_cap(1024),
        )
        .await;
    must_code(r, ErrorCode::ResourceLimitExceeded)?;
    let out = run_ok(&*sb, ["echo", "ok"]).await?;
    ensure!(out == "ok\n", "sandbox after cap: {out:?}");
    sb.kill().await
}

/// Stdout is binary-safe: all 256 byte values come back unchanged.
async fn binary_safe_stdout(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("binary_safe_stdout")).await?;
    let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let fs = sbx(sb.files(), "files")?;
    sbx(
        fs.write("/work/bytes.bin", Bytes::from(all.clone())).await,
        "write",
    )?;
    let r = run(&*sb, ["cat", "/work/bytes.bin"]).await?;
    ensure!(r.exit_code == 0, "cat exited {}", r.exit_code);
    ensure!(
        r.stdout[..] == all[..],
        "stdout differs: {} bytes, first difference at {:?}",
        r.stdout.len(),
        r.stdout.iter().zip(&all).position(|(a, b)| a != b)
    );
    sb.kill().await
}

/// Several MiB of output arrive intact.
async fn large_output_intact(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("large_output_intact")).await?;
    let _heavy = ctx.heavy_lock.lock().await;
    let r = run(&*sb, ["dd", "if=/dev/zero", "bs=1048576", "count=4"]).await?;
    ensure!(r.exit_code == 0, "dd exited {}", r.exit_code);
    ensure!(
        r.stdout.len() == 4 * 1024 * 1024,
        "got {} bytes, expected 4 MiB",
        r.stdout.len()
    );
    ensure!(r.stdout.iter().all(|b| *b == 0), "output corrupted");
    sb.kill().await
}

/// Commands run in `/work` by default.
async fn workdir_is_work(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("workdir_is_work")).await?;
    let out = run_ok(&*sb, ["pwd"]).await?;
    ensure!(out == "/work\n", "pwd: {out:?}");
    sb.kill().await
}

/// `RunOptions::workdir` changes the directory of that command only.
async fn workdir_option_applies(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("workdir_option_applies")).await?;
    let r = sbx(
        sb.run(["pwd"].into(), RunOptions::default().workdir("/tmp"))
            .await,
        "pwd in /tmp",
    )?;
    ensure!(r.stdout_text() == "/tmp\n", "pwd with workdir /tmp: {r:?}");
    let out = run_ok(&*sb, ["pwd"]).await?;
    ensure!(out == "/work\n", "default workdir changed: {out:?}");
    sb.kill().await
}

/// `CreateOptions::workdir` is where every command of the sandbox starts.
async fn create_workdir_applies(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("create_workdir_applies");
    let sb = ctx.create(&c, ctx.opts(&c).workdir("/tmp")).await?;
    let out = run_ok(&*sb, ["pwd"]).await?;
    ensure!(out.trim() == "/tmp", "pwd with workdir /tmp: {out:?}");
    let out = run_ok(&*sb, "pwd").await?;
    ensure!(out.trim() == "/tmp", "shell pwd with workdir /tmp: {out:?}");
    sb.kill().await
}
