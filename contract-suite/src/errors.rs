//! Contract trials: errors (every error carries a catalog code, a hint and a URL; no raw
//! engine error escapes; no secret or env value in any rendering).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, CodeOptions, CreateOptions, ErrorCode, IsolationTier, RunOptions, SandboxError,
};

use crate::ctx::{Ctx, Need, token};

const AREA: &str = "errors";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    vec![
        ctx.trial(
            AREA,
            "every_error_has_code_hint_url",
            &[],
            every_error_has_code_hint_url,
        ),
        ctx.trial(
            AREA,
            "no_raw_engine_error_escapes",
            &[],
            no_raw_engine_error_escapes,
        ),
        ctx.trial(
            AREA,
            "errors_never_contain_secrets",
            &[],
            errors_never_contain_secrets,
        ),
        ctx.trial(
            AREA,
            "execution_error_hides_output",
            &[Need::Cap(C::RUN_COMMAND)],
            execution_error_hides_output,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// Provokes the errors every backend can produce: (label, error).
async fn provoke(ctx: &Ctx, c: &str) -> anyhow::Result<Vec<(String, SandboxError)>> {
    let mut errs = Vec::new();
    let mut push = |what: &str, r: sandbox_core::Result<()>| {
        if let Err(e) = r {
            errs.push((what.to_string(), e));
        }
    };
    push(
        "connect unknown",
        ctx.backend
            .connect(&token("sbx-unknown-"))
            .await
            .map(|_| ()),
    );
    push(
        "zero lifetime",
        ctx.backend
            .create(ctx.opts(c).timeout(Duration::ZERO))
            .await
            .map(|_| ()),
    );
    push(
        "require Unknown",
        ctx.backend
            .create(ctx.opts(c).require_isolation(IsolationTier::Unknown))
            .await
            .map(|_| ()),
    );
    let sb = ctx.sandbox(c).await?;
    if ctx.caps.contains(C::RUN_COMMAND) {
        push(
            "zero run timeout",
            sb.run(
                ["true"].into(),
                RunOptions::default().timeout(Duration::ZERO),
            )
            .await
            .map(|_| ()),
        );
        push(
            "run timeout",
            sb.run(
                ["sleep", "10"].into(),
                RunOptions::default().timeout(Duration::from_millis(300)),
            )
            .await
            .map(|_| ()),
        );
    }
    match sb.files() {
        Ok(f) => {
            push("read missing", f.read("/work/missing").await.map(|_| ()));
            push("read dir", f.read("/work").await.map(|_| ()));
            push(
                "remove missing",
                f.remove("/work/missing").await.map(|_| ()),
            );
        }
        Err(e) => push("files", Err(e)),
    }
    if !ctx.caps.contains(C::STREAMING) {
        push(
            "stream",
            sb.stream(["true"].into(), RunOptions::default())
                .map(|_| ()),
        );
    }
    let raw = sb.into_inner();
    let _ = raw.kill().await;
    push(
        "run after kill",
        raw.run(["true"].into(), RunOptions::default())
            .await
            .map(|_| ()),
    );
    push(
        "run_code after kill",
        raw.run_code("print(1)", CodeOptions::default())
            .await
            .map(|_| ()),
    );
    if let Ok(f) = raw.files() {
        push("read after kill", f.read("/work/x").await.map(|_| ()));
        push(
            "write after kill",
            f.write("/work/x", Bytes::from("x")).await,
        );
    }
    Ok(errs)
}

/// Every error the backend returns has a catalog code, a non-empty hint and the code's
/// documentation URL.
async fn every_error_has_code_hint_url(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let errs = provoke(&ctx, &case("every_error_has_code_hint_url")).await?;
    ensure!(errs.len() >= 4, "too few errors provoked: {}", errs.len());
    for (what, e) in &errs {
        let code = e.code();
        ensure!(
            ErrorCode::ALL.contains(&code),
            "{what}: code {code:?} is not in the catalog"
        );
        ensure!(!e.hint().trim().is_empty(), "{what}: empty hint ({e})");
        ensure!(
            e.url() == code.url() && e.url().contains(code.as_str()),
            "{what}: url {} does not document {}",
            e.url(),
            code.as_str()
        );
        ensure!(!e.to_string().trim().is_empty(), "{what}: empty message");
    }
    Ok(())
}

/// No raw engine error escapes: the provoked errors map to specific codes, never the
/// generic `Engine` one.
async fn no_raw_engine_error_escapes(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("no_raw_engine_error_escapes");
    let mut errs = provoke(&ctx, &c).await?;
    // A template the engine does not have.
    match ctx
        .backend
        .create(ctx.opts(&c).template("sandbox-rs/no-such-template:0"))
        .await
    {
        Ok(sb) => {
            let _ = sb.kill().await;
        }
        Err(e) => errs.push(("unknown template".into(), e)),
    }
    let raw: Vec<String> = errs
        .iter()
        .filter(|(_, e)| e.code() == ErrorCode::Engine)
        .map(|(what, e)| format!("{what}: {}", e.render()))
        .collect();
    ensure!(raw.is_empty(), "raw engine errors escaped: {raw:#?}");
    Ok(())
}

fn assert_clean(e: &SandboxError, needles: &[&str], what: &str) -> anyhow::Result<()> {
    let mut renderings = vec![e.to_string(), e.hint(), e.render()];
    // `Execution` deliberately carries the command's stderr as data (its `Debug` shows
    // it); everything else must not show values even in `Debug`.
    if e.code() != ErrorCode::Execution {
        renderings.push(format!("{e:?}"));
    }
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        renderings.push(s.to_string());
        src = s.source();
    }
    for r in &renderings {
        for n in needles {
            ensure!(
                !r.contains(n),
                "{what}: an error rendering leaks a secret/env value: {r}"
            );
        }
    }
    Ok(())
}

/// Error messages never contain secret or env values, even when the failing request
/// carried them.
async fn errors_never_contain_secrets(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("errors_never_contain_secrets");
    let secret = token("sbx-secret-");
    let env_val = token("sbx-envval-");
    let with_values = |o: CreateOptions| {
        o.secret("SBX_CONTRACT_SECRET", secret.as_str())
            .env("SBX_CONTRACT_PLAIN", env_val.as_str())
    };
    let needles = [secret.as_str(), env_val.as_str()];
    for (what, opts) in [
        (
            "bad env key",
            with_values(ctx.opts(&c)).env("BAD\u{1}", "v"),
        ),
        (
            "require Unknown",
            with_values(ctx.opts(&c)).require_isolation(IsolationTier::Unknown),
        ),
        (
            "zero lifetime",
            with_values(ctx.opts(&c)).timeout(Duration::ZERO),
        ),
        (
            "unknown template",
            with_values(ctx.opts(&c)).template("sandbox-rs/no-such-template:0"),
        ),
    ] {
        match ctx.backend.create(opts).await {
            Ok(sb) => {
                let _ = sb.kill().await;
            }
            Err(e) => assert_clean(&e, &needles, what)?,
        }
    }
    if ctx.caps.contains(C::RUN_COMMAND) {
        let sb = ctx.create(&c, with_values(ctx.opts(&c))).await?;
        let e = sb
            .run(
                "echo $SBX_CONTRACT_SECRET; exec sleep 10".into(),
                RunOptions::default()
                    .timeout(Duration::from_millis(500))
                    .env("SBX_RUN_VALUE", env_val.as_str()),
            )
            .await
            .err()
            .context("a 0.5 s timeout on sleep 10 did not fail")?;
        assert_clean(&e, &needles, "run timeout")?;
        let e = sb
            .run(
                ["true"].into(),
                RunOptions::default().env("BAD\nKEY", env_val.as_str()),
            )
            .await
            .err()
            .context("a bad run env key was accepted")?;
        assert_clean(&e, &needles, "bad run env key")?;
        sb.kill().await?;
    }
    Ok(())
}

/// `raise_for_status` errors never carry the command's output in their message.
async fn execution_error_hides_output(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("execution_error_hides_output");
    let sb = ctx.sandbox(&c).await?;
    let tok = token("sbx-out-");
    let r = sb
        .run(
            format!("echo {tok}; echo {tok} >&2; exit 5").into(),
            RunOptions::default(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("run: {}", e.render()))?;
    let e = r
        .raise_for_status()
        .err()
        .context("exit 5 raised nothing")?;
    ensure!(e.code() == ErrorCode::Execution, "code {:?}", e.code());
    assert_clean(&e, &[tok.as_str()], "raise_for_status")?;
    sb.kill().await
}
