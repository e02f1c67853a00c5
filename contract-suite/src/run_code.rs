//! Contract trials: `Sandbox::run_code` (results, errors, stateful contexts, missing
//! interpreter, timeout, cwd).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, CodeOptions, ErrorCode, ExecResult, Sandbox};

use crate::ctx::{Ctx, Need, must_code, sbx};

const AREA: &str = "run_code";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let code = Need::Cap(C::RUN_CODE);
    let stateful = Need::Cap(C::RUN_CODE | C::STATEFUL_CODE);
    vec![
        ctx.trial(AREA, "basic_print", &[code], basic_print),
        ctx.trial(AREA, "stderr_captured", &[code], stderr_captured),
        ctx.trial(AREA, "syntax_error_nonzero", &[code], syntax_error_nonzero),
        ctx.trial(
            AREA,
            "runtime_error_nonzero",
            &[code],
            runtime_error_nonzero,
        ),
        ctx.trial(
            AREA,
            "rich_results_typed_or_absent",
            &[code],
            rich_results_typed_or_absent,
        ),
        ctx.trial(
            AREA,
            "context_honours_declaration",
            &[],
            context_honours_declaration,
        ),
        ctx.trial(AREA, "contexts_isolated", &[stateful], contexts_isolated),
        ctx.trial(
            AREA,
            "contextless_runs_do_not_see_context_state",
            &[stateful],
            contextless_runs_do_not_see_context_state,
        ),
        ctx.trial(
            AREA,
            "missing_interpreter_is_typed",
            &[code, Need::TemplateWithoutPython],
            missing_interpreter_is_typed,
        ),
        ctx.trial(
            AREA,
            "timeout_is_execution_timeout",
            &[code],
            timeout_is_execution_timeout,
        ),
        ctx.trial(AREA, "cwd_is_work", &[code], cwd_is_work),
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

async fn code(sb: &dyn Sandbox, src: &str, opts: CodeOptions) -> anyhow::Result<ExecResult> {
    sbx(sb.run_code(src, opts).await, &format!("run_code {src:?}"))
}

/// `print(1)` prints `1` and exits 0.
async fn basic_print(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("basic_print")).await?;
    let r = code(&*sb, "print(1)", CodeOptions::default()).await?;
    ensure!(r.exit_code == 0 && r.stdout_text() == "1\n", "{r:?}");
    let r = code(&*sb, "print(40 + 2)", CodeOptions::default()).await?;
    ensure!(r.stdout_text() == "42\n", "{r:?}");
    sb.kill().await
}

/// What the code writes to stderr is captured as stderr.
async fn stderr_captured(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("stderr_captured")).await?;
    let r = code(
        &*sb,
        "import sys; sys.stderr.write(\"err\\n\")",
        CodeOptions::default(),
    )
    .await?;
    ensure!(r.exit_code == 0, "{r:?}");
    ensure!(
        r.stderr_text() == "err\n" && r.stdout.is_empty(),
        "stdout {:?} stderr {:?}",
        r.stdout_text(),
        r.stderr_text()
    );
    sb.kill().await
}

/// A syntax error exits non-zero with `SyntaxError` on stderr (not an `Err`).
async fn syntax_error_nonzero(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("syntax_error_nonzero")).await?;
    let r = code(&*sb, "def (:", CodeOptions::default()).await?;
    ensure!(r.exit_code != 0, "syntax error exited 0");
    ensure!(
        r.stderr_text().contains("SyntaxError"),
        "stderr {:?}",
        r.stderr_text()
    );
    sb.kill().await
}

/// A runtime error exits non-zero with the exception name on stderr.
async fn runtime_error_nonzero(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("runtime_error_nonzero")).await?;
    let r = code(&*sb, "1/0", CodeOptions::default()).await?;
    ensure!(r.exit_code != 0, "1/0 exited 0");
    ensure!(
        r.stderr_text().contains("ZeroDivisionError"),
        "stderr {:?}",
        r.stderr_text()
    );
    let r = code(&*sb, "raise ValueError(\"x\")", CodeOptions::default()).await?;
    ensure!(r.exit_code != 0, "raise exited 0");
    ensure!(
        r.stderr_text().contains("ValueError"),
        "stderr {:?}",
        r.stderr_text()
    );
    sb.kill().await
}

/// Rich results are typed (a MIME type each) or absent — never untyped blobs.
async fn rich_results_typed_or_absent(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("rich_results_typed_or_absent")).await?;
    let r = code(&*sb, "print(1)", CodeOptions::default()).await?;
    // Printed text is output, not a rich result: it stays on stdout, intact.
    ensure!(
        r.exit_code == 0 && r.stdout_text() == "1\n",
        "print(1) did not print 1 on stdout: {r:?}"
    );
    for res in &r.results {
        let mime = res.mime.as_str();
        ensure!(
            is_mime_type(mime),
            "rich result with MIME type {mime:?} ({} bytes): results must be typed",
            res.data.len()
        );
        ensure!(!res.data.is_empty(), "rich result {mime} has no payload");
        ensure!(
            res.data.as_ref() != r.stdout.as_ref(),
            "rich result {mime} only repeats stdout"
        );
    }
    ensure!(!r.streamed, "run_code result marked streamed");
    sb.kill().await
}

/// `type/subtype` with RFC 6838 token characters on both sides.
fn is_mime_type(mime: &str) -> bool {
    let token = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$&^_.+-".contains(c))
    };
    let essence = mime.split(';').next().unwrap_or_default().trim();
    essence
        .split_once('/')
        .is_some_and(|(a, b)| token(a) && token(b))
}

/// A context id honours the declaration: with `STATEFUL_CODE` the context keeps state
/// between calls; without it, `run_code` with a context is `CapabilityNotSupported`.
async fn context_honours_declaration(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("context_honours_declaration")).await?;
    let caps = sb.capabilities();
    let c1 = CodeOptions::default().context("decl-c1");
    if caps.contains(C::STATEFUL_CODE) {
        ensure!(
            caps.contains(C::RUN_CODE),
            "STATEFUL_CODE is declared without RUN_CODE"
        );
        let r = code(&*sb, "x = 41", c1.clone()).await?;
        ensure!(r.exit_code == 0, "x = 41: {r:?}");
        let r = code(&*sb, "print(x + 1)", c1).await?;
        ensure!(r.exit_code == 0 && r.stdout_text() == "42\n", "{r:?}");
    } else {
        must_code(
            sb.run_code("x = 1", c1).await,
            ErrorCode::CapabilityNotSupported,
        )?;
    }
    sb.kill().await
}

/// Two contexts do not share state.
async fn contexts_isolated(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("contexts_isolated")).await?;
    code(&*sb, "x = 41", CodeOptions::default().context("iso-a")).await?;
    let r = code(&*sb, "print(x)", CodeOptions::default().context("iso-b")).await?;
    ensure!(r.exit_code != 0, "context b sees context a's x: {r:?}");
    ensure!(
        r.stderr_text().contains("NameError"),
        "stderr {:?}",
        r.stderr_text()
    );
    sb.kill().await
}

/// A context-less run does not see a context's state.
async fn contextless_runs_do_not_see_context_state(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("contextless_runs_do_not_see_context_state"))
        .await?;
    code(&*sb, "x = 41", CodeOptions::default().context("st")).await?;
    let r = code(&*sb, "print(x)", CodeOptions::default()).await?;
    ensure!(r.exit_code != 0, "a context-less run sees x: {r:?}");
    ensure!(
        r.stderr_text().contains("NameError"),
        "stderr {:?}",
        r.stderr_text()
    );
    sb.kill().await
}

/// A template without the interpreter yields `InterpreterMissing`, never a bogus result.
async fn missing_interpreter_is_typed(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("missing_interpreter_is_typed");
    let template = ctx
        .probes
        .template_without_python()
        .context("no template_without_python")?;
    let sb = ctx.create(&c, ctx.opts(&c).template(template)).await?;
    let e = must_code(
        sb.run_code("print(1)", CodeOptions::default()).await,
        ErrorCode::InterpreterMissing,
    )?;
    ensure!(
        e.to_string().contains("python3"),
        "error does not name the interpreter: {e}"
    );
    sb.kill().await
}

/// A `run_code` timeout is `ExecutionTimeout`, and the sandbox still runs code after.
async fn timeout_is_execution_timeout(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("timeout_is_execution_timeout")).await?;
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        sb.run_code(
            "import time; time.sleep(30)",
            CodeOptions::default().timeout(Duration::from_secs(1)),
        ),
    )
    .await
    .context("run_code with a 1 s timeout did not return")?;
    must_code(r, ErrorCode::ExecutionTimeout)?;
    ensure!(
        started.elapsed() < crate::ctx::grace_plus(Duration::from_secs(3)),
        "timeout took {:?}",
        started.elapsed()
    );
    let r = code(&*sb, "print(1)", CodeOptions::default()).await?;
    ensure!(r.stdout_text() == "1\n", "after timeout: {r:?}");
    sb.kill().await
}

/// Code runs with `/work` as its working directory.
async fn cwd_is_work(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("cwd_is_work")).await?;
    let r = code(
        &*sb,
        "import os; print(os.getcwd())",
        CodeOptions::default(),
    )
    .await?;
    ensure!(r.stdout_text() == "/work\n", "{r:?}");
    sb.kill().await
}

/// `run_code` honours the declaration: with `RUN_CODE`, `print(1)` prints `1`; without
/// it, `run_code` is `CapabilityNotSupported`.
async fn entry_point_honours_declaration(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("entry_point_honours_declaration"))
        .await?;
    let r = sb.run_code("print(1)", CodeOptions::default()).await;
    if sb.capabilities().contains(C::RUN_CODE) {
        let r = sbx(r, "run_code although RUN_CODE is declared")?;
        ensure!(r.exit_code == 0 && r.stdout_text() == "1\n", "{r:?}");
    } else {
        must_code(r, ErrorCode::CapabilityNotSupported)?;
    }
    sb.kill().await
}
