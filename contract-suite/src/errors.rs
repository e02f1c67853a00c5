//! Contract trials: errors (every error carries a catalog code, a hint and a URL; no raw
//! engine error escapes; no secret or env value in any rendering).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, CodeOptions, CreateOptions, ErrorCode, IsolationTier, RunOptions, SandboxError,
};

use crate::ctx::{CASE_LABEL, Ctx, Need, injected, must_code, token};

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
        ctx.trial(
            AREA,
            "provider_failure_is_creation_error",
            &[Need::Faults, Need::Reapable],
            provider_failure_is_creation_error,
        ),
        ctx.trial(
            AREA,
            "stalled_create_is_create_timeout",
            &[Need::Faults, Need::Reapable],
            stalled_create_is_create_timeout,
        ),
        ctx.trial(
            AREA,
            "missing_credential_is_auth_error",
            &[Need::Faults],
            missing_credential_is_auth_error,
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
        // Never pulled: a pull would leave the machine (Docker Hub), and the point is the
        // error mapping.
        .create(
            ctx.opts(&c)
                .template("sandbox-rs/no-such-template:0")
                .pull(sandbox_core::PullPolicy::Never),
        )
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
            with_values(ctx.opts(&c))
                .template("sandbox-rs/no-such-template:0")
                .pull(sandbox_core::PullPolicy::Never),
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

/// The create-time faults the trials below inject.
#[derive(Clone, Copy)]
enum CreateFault {
    Fail,
    Stall,
    NoCredential,
}

/// Runs one create through the fault backend with `inject` in place, heals, and returns
/// the create's outcome (an `Ok` sandbox is killed) and how long it took.
async fn create_under_fault(
    ctx: &Ctx,
    c: &str,
    fault: CreateFault,
) -> anyhow::Result<(sandbox_core::Result<()>, Duration)> {
    let faults = ctx.faults()?;
    let _serial = ctx.fault_lock.lock().await;
    let fb = faults.backend();
    let (injection, what) = match fault {
        CreateFault::Fail => (
            faults.fail_creates().await,
            "a failing provider (Faults::fail_creates)",
        ),
        CreateFault::Stall => (
            faults.stall_creates().await,
            "a stalled create (Faults::stall_creates)",
        ),
        CreateFault::NoCredential => (
            faults.withhold_credential().await,
            "a withheld credential (Faults::withhold_credential)",
        ),
    };
    if injection != crate::probes::Injection::Injected {
        faults.heal().await;
        injected(what, injection)?;
    }
    let started = std::time::Instant::now();
    // Bounded by the trial budget: an adapter that never bounds a stalled create fails
    // here instead of hanging the suite.
    let r = tokio::time::timeout(
        Duration::from_secs(90),
        fb.create(ctx.opts(c).metadata(CASE_LABEL, c)),
    )
    .await;
    let took = started.elapsed();
    faults.heal().await;
    let r = r.with_context(|| format!("create under {what} did not return within 90 s"))?;
    let r = match r {
        Ok(sb) => {
            let _ = sb.kill().await;
            Ok(())
        }
        Err(e) => Err(e),
    };
    Ok((r, took))
}

/// A create the provider fails (the engine answers it with an error) is a `Creation`
/// error carrying its cause (`source()`), and leaves nothing behind.
async fn provider_failure_is_creation_error(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("provider_failure_is_creation_error");
    let (r, _) = create_under_fault(&ctx, &c, CreateFault::Fail).await?;
    let e = must_code(r, ErrorCode::Creation)?;
    ensure!(
        std::error::Error::source(&e).is_some(),
        "the Creation error lost its cause (no source): {}",
        e.render()
    );
    ctx.wait_unlisted(&c, Duration::from_secs(2)).await
}

/// A create the engine never answers ends with `CreateTimeout` (SBX_E1203) within the
/// adapter's create bound — not an unbounded wait, not a generic error — and leaves
/// nothing behind.
async fn stalled_create_is_create_timeout(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("stalled_create_is_create_timeout");
    let (r, took) = create_under_fault(&ctx, &c, CreateFault::Stall).await?;
    let e = must_code(r, ErrorCode::CreateTimeout)?;
    ensure!(
        e.is_timeout(),
        "CreateTimeout is not a timeout: {}",
        e.render()
    );
    ensure!(
        took >= Duration::from_millis(500),
        "CreateTimeout after {took:?}: reported before the create was ever waited on"
    );
    ctx.wait_unlisted(&c, Duration::from_secs(2)).await
}

/// A create missing its credential is `Auth` naming the environment variable that
/// carries it (a name, never a value). Where the backend uses no credential at all the
/// adapter says so, and the trial is "not applicable" with that reason.
async fn missing_credential_is_auth_error(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("missing_credential_is_auth_error");
    let (r, _) = create_under_fault(&ctx, &c, CreateFault::NoCredential).await?;
    let e = must_code(r, ErrorCode::Auth)?;
    let SandboxError::Auth { env_var, .. } = &e else {
        bail!("code Auth on a non-Auth variant: {}", e.render());
    };
    ensure!(
        !env_var.is_empty()
            && env_var
                .chars()
                .all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit() || ch == '_'),
        "Auth names no environment variable: {env_var:?}"
    );
    ensure!(
        e.hint().contains(env_var.as_str()),
        "the hint does not name {env_var}: {}",
        e.hint()
    );
    Ok(())
}
