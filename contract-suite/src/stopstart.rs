//! Contract trials: stop and start (`STOP_START`).
//!
//! What a declared `STOP_START` promises: `stop` ends every process of the sandbox and
//! keeps the sandbox — a file written in it and a package installed in it are there after
//! `start`, under the same id — and `start` brings it back usable: commands run, the
//! in-sandbox agent is the first process again where the sandbox declared `AGENT`, and
//! the network policy holds again, checked from inside as root (an engine gives a
//! restarted container a new network namespace, so rules loaded at create are gone unless
//! they are loaded again). While stopped, every call but `start`, `kill` and `snapshot`
//! fails at once with `SandboxStopped` (a reattached handle sees it too and can start
//! it); interpreter contexts do not survive; a stopped sandbox can be killed, leaving
//! nothing, and one past its deadline is removed while one within it is kept. Without
//! `STOP_START` each trial proves the refusal instead (`CapabilityNotSupported`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, CodeOptions, ErrorCode, NetworkPolicy, RunOptions, SandboxState,
    teardown::teardown_grace,
};

use crate::ctx::{Ctx, Need, Sbx, must_code, run_ok, sbx};

const AREA: &str = "stopstart";

/// Longest a refusal on a stopped sandbox may take.
const REFUSAL_BOUND: Duration = Duration::from_secs(2);

/// The lifetime of the trial that watches a stopped sandbox reach its deadline.
const SHORT_LIFETIME: Duration = Duration::from_secs(6);

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let declared = ctx.caps.contains(C::STOP_START);
    let run: &[Need] = if declared {
        &[Need::Cap(C::RUN_COMMAND | C::FILESYSTEM)]
    } else {
        &[]
    };
    let net: &[Need] = if declared {
        &[Need::Cap(C::RUN_COMMAND | C::NETWORK_POLICY), Need::Canary]
    } else {
        &[]
    };
    let reap: &[Need] = if declared {
        &[Need::Cap(C::RUN_COMMAND), Need::Reapable]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "files_and_installed_packages_survive_stop_and_start",
            run,
            files_and_installed_packages_survive_stop_and_start,
        ),
        ctx.trial(
            AREA,
            "the_egress_policy_holds_after_start",
            net,
            the_egress_policy_holds_after_start,
        ),
        ctx.trial(
            AREA,
            "start_brings_back_the_agent_and_a_fresh_context",
            run,
            start_brings_back_the_agent_and_a_fresh_context,
        ),
        ctx.trial(
            AREA,
            "calls_on_a_stopped_sandbox_are_refused_at_once",
            run,
            calls_on_a_stopped_sandbox_are_refused_at_once,
        ),
        ctx.trial(
            AREA,
            "a_stopped_sandbox_is_killed_or_expires_leaving_nothing",
            reap,
            a_stopped_sandbox_is_killed_or_expires_leaving_nothing,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// A sandbox for a stop/start trial created from `opts`; `None` when the backend does not
/// declare `STOP_START` and `stop` and `start` were just proven refused.
async fn stoppable(
    ctx: &Ctx,
    name: &str,
    opts: sandbox_core::CreateOptions,
) -> anyhow::Result<Option<Sbx>> {
    let sb = ctx.create(&case(name), opts).await?;
    if sb.capabilities().contains(C::STOP_START) {
        return Ok(Some(sb));
    }
    ensure!(
        !ctx.caps.contains(C::STOP_START),
        "the backend declares STOP_START but this sandbox does not"
    );
    must_code(sb.stop().await, ErrorCode::CapabilityNotSupported).context("stop")?;
    must_code(sb.start().await, ErrorCode::CapabilityNotSupported).context("start")?;
    sb.kill().await?;
    Ok(None)
}

/// Stops and starts `sb`, each bounded.
async fn stop_and_start(sb: &Sbx) -> anyhow::Result<()> {
    let bound = Duration::from_secs(60);
    tokio::time::timeout(bound, sb.stop())
        .await
        .context("stop did not return within 60 s")?
        .map_err(|e| anyhow::anyhow!("stop: {}", e.render()))?;
    tokio::time::timeout(bound, sb.start())
        .await
        .context("start did not return within 60 s")?
        .map_err(|e| anyhow::anyhow!("start: {}", e.render()))?;
    Ok(())
}

/// Where the template's Python installs packages, and whether there is a `python3` to
/// import with: a fixed place and `false` where the sandbox has no interpreter to ask
/// (in-process; a model of a kernel in front of one, whose `python3` exits 127). The
/// suite's base template has `python3` on every engine, so there the import is checked.
async fn site_packages(ctx: &Ctx, sb: &Sbx) -> anyhow::Result<(String, bool)> {
    let fixed = || ("/usr/local/lib/python3/site-packages".to_string(), false);
    if ctx.probes.in_process() {
        return Ok(fixed());
    }
    let script = "import site; print(site.getsitepackages()[0])";
    let r = sbx(
        sb.run(["python3", "-c", script].into(), RunOptions::default())
            .await,
        "ask python3 for site-packages",
    )?;
    if r.exit_code == 127 {
        return Ok(fixed());
    }
    let dir = r.stdout_text().trim().to_string();
    ensure!(
        r.exit_code == 0 && dir.starts_with('/'),
        "no site-packages directory: exit {} {:?} {:?}",
        r.exit_code,
        r.stdout_text(),
        r.stderr_text()
    );
    Ok((dir, true))
}

/// A file written in the workdir and a package installed into the template's Python (a
/// module put under site-packages, no network) are there after `stop` and `start`, under
/// the same id, and the package still imports.
async fn files_and_installed_packages_survive_stop_and_start(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let name = "files_and_installed_packages_survive_stop_and_start";
    let Some(sb) = stoppable(&ctx, name, ctx.opts(&case(name))).await? else {
        return Ok(());
    };
    let id = sb.id().to_string();
    let files = sbx(sb.files(), "files")?;
    sbx(
        files
            .write("kept.txt", Bytes::from_static(b"written before the stop"))
            .await,
        "write kept.txt",
    )?;
    let (site, importable) = site_packages(&ctx, &sb).await?;
    let module = format!("{site}/sbx_stopstart_pkg.py");
    sbx(
        files
            .write(&module, Bytes::from_static(b"VALUE = 'installed-42'\n"))
            .await,
        "install the module",
    )?;
    stop_and_start(&sb).await?;
    ensure!(sb.id() == id, "the id changed across stop/start");
    let files = sbx(sb.files(), "files after start")?;
    let kept = sbx(files.read("kept.txt").await, "read kept.txt after start")?;
    ensure!(
        &kept[..] == b"written before the stop",
        "kept.txt after start: {kept:?}"
    );
    let installed = sbx(files.read(&module).await, "read the module after start")?;
    ensure!(
        installed.starts_with(b"VALUE = 'installed-42'"),
        "the installed module after start: {installed:?}"
    );
    if importable {
        let out = run_ok(
            &*sb,
            [
                "python3",
                "-c",
                "import sbx_stopstart_pkg; print(sbx_stopstart_pkg.VALUE)",
            ],
        )
        .await?;
        ensure!(
            out.contains("installed-42"),
            "the installed package does not import after start: {out:?}"
        );
    }
    sb.kill().await
}

/// Runs the canary probe as root inside `sb`; `Ok(true)` when it reached the canary.
async fn reaches_the_canary(ctx: &Ctx, sb: &Sbx) -> anyhow::Result<bool> {
    let canary = ctx.canary()?;
    let r = sbx(
        sb.run(
            canary.probe_command(),
            RunOptions::default().timeout(Duration::from_secs(30)),
        )
        .await,
        "the canary probe",
    )?;
    ensure!(
        r.exit_code != 127,
        "nc is missing (127): nothing was proven"
    );
    Ok(r.stdout_text().contains(&canary.token))
}

/// That `sb`'s commands run as root (uid 0): the policy must hold against root. Not
/// asked where there is no `id` (in-process, or a model exiting 127).
async fn runs_as_root(ctx: &Ctx, sb: &Sbx) -> anyhow::Result<()> {
    if ctx.probes.in_process() {
        return Ok(());
    }
    let r = sbx(
        sb.run(["id", "-u"].into(), RunOptions::default()).await,
        "id -u",
    )?;
    if r.exit_code == 127 {
        return Ok(());
    }
    ensure!(
        r.exit_code == 0 && r.stdout_text().trim() == "0",
        "the probe does not run as root: exit {} uid {:?}",
        r.exit_code,
        r.stdout_text()
    );
    Ok(())
}

/// The network policy holds after `start`, checked from inside as root: a `Deny` sandbox
/// still cannot reach the canary server, and where `EGRESS_ALLOWLIST` is declared, an
/// allowlist sandbox (listing only an address nothing routes) still cannot either — its
/// rules are in the restarted sandbox's network, not only in the one it was created with.
async fn the_egress_policy_holds_after_start(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let name = "the_egress_policy_holds_after_start";
    let c = case(name);
    let Some(deny) = stoppable(&ctx, name, ctx.opts(&c).network(NetworkPolicy::deny())).await?
    else {
        return Ok(());
    };
    ensure!(
        !reaches_the_canary(&ctx, &deny).await?,
        "a Deny sandbox reached the canary before any stop"
    );
    stop_and_start(&deny).await?;
    runs_as_root(&ctx, &deny).await?;
    ensure!(
        !reaches_the_canary(&ctx, &deny).await?,
        "a Deny sandbox reached the canary after stop and start"
    );
    deny.kill().await?;
    if !ctx.caps.contains(C::EGRESS_ALLOWLIST) {
        return Ok(());
    }
    // TEST-NET-1 (RFC 5737): never routed, so nothing leaves this machine.
    let listed = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list(["192.0.2.1"])),
        )
        .await?;
    ensure!(
        !reaches_the_canary(&ctx, &listed).await?,
        "an allowlist sandbox reached an unlisted canary before any stop"
    );
    stop_and_start(&listed).await?;
    runs_as_root(&ctx, &listed).await?;
    ensure!(
        !reaches_the_canary(&ctx, &listed).await?,
        "an allowlist sandbox reached an unlisted canary after stop and start: its rules \
         were not loaded into the restarted sandbox's network"
    );
    listed.kill().await
}

/// After `start` commands run again, a sandbox that declared `AGENT` still does and its
/// agent is the first process again (PID 1), and an interpreter context from before the
/// stop is gone: the same context id starts afresh.
async fn start_brings_back_the_agent_and_a_fresh_context(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let name = "start_brings_back_the_agent_and_a_fresh_context";
    let Some(sb) = stoppable(&ctx, name, ctx.opts(&case(name))).await? else {
        return Ok(());
    };
    let had_agent = sb.capabilities().contains(C::AGENT);
    let stateful = sb.capabilities().contains(C::STATEFUL_CODE);
    let in_context = || CodeOptions::default().context("kept");
    if stateful {
        let r = sbx(
            sb.run_code("x = 41", in_context()).await,
            "set a variable in a context",
        )?;
        ensure!(r.exit_code == 0, "setting x: {:?}", r.stderr_text());
    }
    stop_and_start(&sb).await?;
    let out = run_ok(&*sb, ["echo", "after-start"]).await?;
    ensure!(out.contains("after-start"), "after start: {out:?}");
    ensure!(
        sb.capabilities().contains(C::AGENT) == had_agent,
        "AGENT declared before the stop: {had_agent}, after the start: {}",
        !had_agent
    );
    if had_agent && !ctx.probes.in_process() {
        let cmdline = run_ok(&*sb, ["cat", "/proc/1/cmdline"]).await?;
        ensure!(
            cmdline.contains("sandbox-agent"),
            "PID 1 after start is not the agent: {cmdline:?}"
        );
    }
    if stateful {
        let r = sbx(
            sb.run_code("print(x)", in_context()).await,
            "use the context after start",
        )?;
        ensure!(
            r.exit_code != 0 || !r.stdout_text().contains("41"),
            "a context survived the stop: x is still set ({:?})",
            r.stdout_text()
        );
    }
    sb.kill().await
}

/// While stopped, `run`, `stream`, `run_code` and the file system fail at once with
/// `SandboxStopped` (never a hang); a second `stop` does nothing; a handle reattached with
/// `connect` sees the stopped state too and can start the sandbox, after which both
/// handles run commands.
async fn calls_on_a_stopped_sandbox_are_refused_at_once(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let name = "calls_on_a_stopped_sandbox_are_refused_at_once";
    let Some(sb) = stoppable(&ctx, name, ctx.opts(&case(name))).await? else {
        return Ok(());
    };
    sbx(sb.stop().await, "stop")?;
    sbx(sb.stop().await, "stop again")?;
    let t0 = Instant::now();
    must_code(
        sb.run(["true"].into(), RunOptions::default()).await,
        ErrorCode::SandboxStopped,
    )
    .context("run while stopped")?;
    must_code(
        sb.stream(["true"].into(), RunOptions::default())
            .map(|_| ()),
        ErrorCode::SandboxStopped,
    )
    .context("stream while stopped")?;
    if sb.capabilities().contains(C::RUN_CODE) {
        must_code(
            sb.run_code("print(1)", Default::default()).await,
            ErrorCode::SandboxStopped,
        )
        .context("run_code while stopped")?;
    }
    if let Ok(files) = sb.files() {
        must_code(files.ls(".").await, ErrorCode::SandboxStopped).context("ls while stopped")?;
    }
    ensure!(
        t0.elapsed() < REFUSAL_BOUND,
        "the refusals took {:?}: a stopped sandbox must refuse at once",
        t0.elapsed()
    );
    let other = sbx(
        ctx.backend.connect(sb.id()).await,
        "connect to the stopped sandbox",
    )?;
    let t0 = Instant::now();
    must_code(
        other.run(["true"].into(), RunOptions::default()).await,
        ErrorCode::SandboxStopped,
    )
    .context("run through the reattached handle while stopped")?;
    ensure!(
        t0.elapsed() < REFUSAL_BOUND,
        "the reattached handle took {:?} to refuse",
        t0.elapsed()
    );
    sbx(other.start().await, "start through the reattached handle")?;
    let out = run_ok(&*other, ["echo", "restarted"]).await?;
    ensure!(out.contains("restarted"), "after start: {out:?}");
    sbx(
        sb.start().await,
        "start through the first handle (already running)",
    )?;
    let out = run_ok(&*sb, ["echo", "first"]).await?;
    ensure!(
        out.contains("first"),
        "the first handle after start: {out:?}"
    );
    sb.kill().await?;
    // The reattached handle's sandbox is the same one: already gone.
    let _ = other.kill().await;
    Ok(())
}

/// A stopped sandbox stays listed (`Stopped`) and `kill` removes it, leaving nothing;
/// where `PAUSE_RESUME` is declared, a paused sandbox can be stopped too. A stopped
/// sandbox within its deadline is kept, and once past its deadline it is removed without
/// any call (its lifetime kept running while stopped).
async fn a_stopped_sandbox_is_killed_or_expires_leaving_nothing(
    ctx: Arc<Ctx>,
) -> anyhow::Result<()> {
    let name = "a_stopped_sandbox_is_killed_or_expires_leaving_nothing";
    let c = case(name);
    let Some(sb) = stoppable(&ctx, name, ctx.opts(&c)).await? else {
        return Ok(());
    };
    if sb.capabilities().contains(C::PAUSE_RESUME) {
        sbx(sb.pause().await, "pause before the stop")?;
    }
    sbx(sb.stop().await, "stop")?;
    let id = sb.id().to_string();
    let state = ctx
        .listed(&c)
        .await?
        .into_iter()
        .find(|m| m.id == id)
        .map(|m| m.state);
    ensure!(
        state == Some(SandboxState::Stopped),
        "a stopped sandbox is listed as {state:?}, not Stopped"
    );
    sb.kill().await.context("kill the stopped sandbox")?;
    ctx.wait_id_unlisted(&c, &id, Duration::from_secs(2))
        .await?;

    let short = ctx.opts(&c).timeout(SHORT_LIFETIME);
    let Some(sb) = stoppable(&ctx, name, short).await? else {
        bail!("the second sandbox does not declare STOP_START");
    };
    let created = Instant::now();
    let id = sb.id().to_string();
    sbx(sb.stop().await, "stop the short-lived sandbox")?;
    // Within its deadline: kept, stopped.
    tokio::time::sleep(SHORT_LIFETIME / 3).await;
    let listed = ctx.listed(&c).await?;
    ensure!(
        listed
            .iter()
            .any(|m| m.id == id && m.state == SandboxState::Stopped),
        "a stopped sandbox within its deadline was not kept: {:?}",
        listed.iter().map(|m| (&m.id, m.state)).collect::<Vec<_>>()
    );
    // Past it (plus the host's grace and a removal): gone without any call.
    let past = SHORT_LIFETIME + Duration::from_secs(8);
    tokio::time::sleep(past.saturating_sub(created.elapsed())).await;
    let deadline = Instant::now() + teardown_grace();
    loop {
        if !ctx.listed(&c).await?.iter().any(|m| m.id == id) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "a stopped sandbox is still held {:?} after its deadline",
            created.elapsed().saturating_sub(SHORT_LIFETIME)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    must_code(sb.start().await, ErrorCode::SandboxGone)
        .context("start of a stopped sandbox past its deadline")?;
    sb.kill().await
}
