//! Contract trials: moving a sandbox's deadline (`EXTEND_LIFETIME`) and the idle limit
//! (`IDLE_TIMEOUT`).
//!
//! What a declared `EXTEND_LIFETIME` promises: `extend` keeps a sandbox alive past the
//! deadline it was created with, and the moved deadline is enforced as the first one was
//! — the sandbox ends at it, even after root inside tried to stop the sandbox's
//! supervisor — and never passes the maximum lifetime set at create (refused with
//! `ResourceLimitExceeded`, which changes nothing). What a declared `IDLE_TIMEOUT`
//! promises: a sandbox with no call and nothing running for the idle limit is removed,
//! and one running a (silent) command is not. Without the flag each trial proves the
//! refusal (`CapabilityNotSupported`) instead.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, bail, ensure};
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, ErrorCode, IsolationTier, RunOptions, SandboxState, teardown::teardown_grace,
};

use crate::ctx::{Ctx, Need, Sbx, must_code, run_ok};

const AREA: &str = "lifetime";

/// The lifetime the extension trial creates with.
const FIRST_LIFETIME: Duration = Duration::from_secs(3);
/// What it adds.
const EXTENSION: Duration = Duration::from_secs(4);
/// The idle limit of the idle trial.
const IDLE: Duration = Duration::from_secs(3);

/// How long after an idle sandbox stopped running it may still be listed (its removal
/// by the host, a few hundred milliseconds on an engine).
const IDLE_REMOVED_WITHIN: Duration = Duration::from_secs(5);

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let extend: &[Need] = if ctx.caps.contains(C::EXTEND_LIFETIME) {
        &[Need::Cap(C::RUN_COMMAND), Need::Reapable]
    } else {
        &[]
    };
    let idle: &[Need] = if ctx.caps.contains(C::IDLE_TIMEOUT) {
        &[Need::Cap(C::RUN_COMMAND), Need::Reapable]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "extend_outlives_the_first_deadline_and_the_new_one_holds",
            extend,
            extend_outlives_the_first_deadline_and_the_new_one_holds,
        ),
        ctx.trial(
            AREA,
            "extend_past_the_maximum_is_refused",
            extend,
            extend_past_the_maximum_is_refused,
        ),
        ctx.trial(
            AREA,
            "an_idle_sandbox_is_removed_and_a_busy_one_is_not",
            idle,
            an_idle_sandbox_is_removed_and_a_busy_one_is_not,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// A sandbox with these options for an extension trial; `None` when the backend does
/// not declare `EXTEND_LIFETIME` and `extend` was just proven refused.
async fn extendable(
    ctx: &Ctx,
    name: &str,
    opts: sandbox_core::CreateOptions,
) -> anyhow::Result<Option<Sbx>> {
    if !ctx.caps.contains(C::EXTEND_LIFETIME) {
        let sb = ctx.sandbox(&case(name)).await?;
        must_code(
            sb.extend(Duration::from_secs(1)).await,
            ErrorCode::CapabilityNotSupported,
        )
        .context("extend without EXTEND_LIFETIME")?;
        sb.kill().await?;
        return Ok(None);
    }
    let sb = ctx.create(&case(name), opts).await?;
    ensure!(
        sb.capabilities().contains(C::EXTEND_LIFETIME),
        "the backend declares EXTEND_LIFETIME but this sandbox does not"
    );
    Ok(Some(sb))
}

/// Whether the engine still lists sandbox `id` (of trial `c`) as running or paused.
async fn still_running(ctx: &Ctx, c: &str, id: &str) -> anyhow::Result<bool> {
    Ok(ctx
        .listed(c)
        .await?
        .iter()
        .any(|m| m.id == id && matches!(m.state, SandboxState::Running | SandboxState::Paused)))
}

/// Root inside tries to stop what ends the sandbox at its deadline (the supervisor, PID 1,
/// and every other process). Skipped in-process, where nothing inside can reach the
/// provider's own deadline, and under gVisor, whose kernel does not shield PID 1 from
/// root inside (a documented limit: the host-side timer is the backstop there, and the
/// moved deadline's hold is still checked below).
async fn attack_the_deadline(ctx: &Ctx, sb: &Sbx) -> anyhow::Result<()> {
    if ctx.probes.in_process() || sb.isolation() == IsolationTier::Gvisor {
        return Ok(());
    }
    // Each step may fail (the kernel drops signals to a protected PID 1); what counts is
    // what happens to the deadline afterwards.
    let script = "kill -STOP 1; kill -KILL 1; kill -TERM 1; kill -STOP -1; true";
    sb.run(["sh", "-c", script].into(), RunOptions::default())
        .await
        .map_err(|e| anyhow::anyhow!("the attack could not run: {}", e.render()))?;
    Ok(())
}

/// `extend` keeps a sandbox alive past the deadline it was created with (it answers a
/// command well after that deadline and the host's grace), after root inside tried to
/// stop the sandbox's supervisor; and the moved deadline still holds: the sandbox is gone
/// from the engine within a bounded margin of it.
async fn extend_outlives_the_first_deadline_and_the_new_one_holds(
    ctx: Arc<Ctx>,
) -> anyhow::Result<()> {
    let name = "extend_outlives_the_first_deadline_and_the_new_one_holds";
    let c = case(name);
    let opts = ctx
        .opts(&c)
        .timeout(FIRST_LIFETIME)
        .max_lifetime(Duration::from_secs(60));
    let before_create = SystemTime::now();
    let Some(sb) = extendable(&ctx, name, opts).await? else {
        return Ok(());
    };
    let created = Instant::now();
    let id = sb.id().to_string();
    attack_the_deadline(&ctx, &sb).await?;
    let asked = SystemTime::now();
    let moved = sb
        .extend(EXTENSION)
        .await
        .map_err(|e| anyhow::anyhow!("extend: {}", e.render()))?;
    // The first deadline lies between the start of the create and its end (plus a second
    // of rounding); the new one is the extension after it.
    let earliest = before_create + FIRST_LIFETIME + EXTENSION;
    let latest = asked + FIRST_LIFETIME + EXTENSION + Duration::from_secs(2);
    ensure!(
        moved >= earliest && moved <= latest,
        "extend returned a deadline {:?} from now, outside the first deadline plus {EXTENSION:?}",
        moved.duration_since(SystemTime::now()).unwrap_or_default()
    );
    // Well past the first deadline and the 2 s a host-side timer waits after it.
    tokio::time::sleep_until((created + FIRST_LIFETIME + Duration::from_millis(2500)).into()).await;
    run_ok(&*sb, ["echo", "alive"])
        .await
        .context("the sandbox did not outlive its first deadline after extend")?;
    // The new deadline holds: gone (or at least not running) within a margin of it.
    let left = moved.duration_since(SystemTime::now()).unwrap_or_default();
    let limit = Instant::now() + left + teardown_grace() + Duration::from_secs(5);
    loop {
        if !still_running(&ctx, &c, &id).await? {
            break;
        }
        if Instant::now() >= limit {
            bail!(
                "the sandbox still runs {:?} past its moved deadline",
                teardown_grace() + Duration::from_secs(5)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let late = sb.run(["true"].into(), RunOptions::default()).await;
    must_code(late, ErrorCode::SandboxGone).context("a command after the moved deadline")?;
    sb.kill().await
}

/// An extension past the maximum lifetime is refused with `ResourceLimitExceeded` whose
/// hint names `max_lifetime`, and changes nothing; one within it works; without a
/// maximum the deadline set at create is final.
async fn extend_past_the_maximum_is_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let name = "extend_past_the_maximum_is_refused";
    let c = case(name);
    let opts = ctx
        .opts(&c)
        .timeout(Duration::from_secs(20))
        .max_lifetime(Duration::from_secs(30));
    let Some(sb) = extendable(&ctx, name, opts).await? else {
        return Ok(());
    };
    let e = must_code(
        sb.extend(Duration::from_secs(15)).await,
        ErrorCode::ResourceLimitExceeded,
    )
    .context("an extension past the maximum")?;
    ensure!(
        e.hint().contains("max_lifetime"),
        "the refusal does not say how to raise the maximum: {}",
        e.render()
    );
    // Nothing moved: 8 of the 10 s left still fit, twice 8 do not.
    sb.extend(Duration::from_secs(8))
        .await
        .map_err(|e| anyhow::anyhow!("an extension within the maximum: {}", e.render()))?;
    must_code(
        sb.extend(Duration::from_secs(8)).await,
        ErrorCode::ResourceLimitExceeded,
    )
    .context("a second extension past what is left")?;
    run_ok(&*sb, ["true"]).await?;
    sb.kill().await?;
    // Without max_lifetime the deadline cannot move at all.
    let plain = ctx.sandbox(&c).await?;
    must_code(
        plain.extend(Duration::from_secs(1)).await,
        ErrorCode::ResourceLimitExceeded,
    )
    .context("extend of a sandbox created without max_lifetime")?;
    plain.kill().await
}

/// With an idle limit, a sandbox nobody calls and where nothing runs is removed soon
/// after the limit (not kept stopped: it is no longer listed at all); one running a
/// silent command longer than the limit is not.
async fn an_idle_sandbox_is_removed_and_a_busy_one_is_not(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("an_idle_sandbox_is_removed_and_a_busy_one_is_not");
    let opts = ctx
        .opts(&c)
        .timeout(Duration::from_secs(60))
        .idle_timeout(IDLE);
    if !ctx.caps.contains(C::IDLE_TIMEOUT) {
        must_code(
            ctx.backend.create(opts).await.map(|_| ()),
            ErrorCode::CapabilityNotSupported,
        )
        .context("create with an idle limit without IDLE_TIMEOUT")?;
        return Ok(());
    }
    let (idle, busy) = tokio::try_join!(ctx.create(&c, opts.clone()), ctx.create(&c, opts))?;
    let (idle_id, busy_id) = (idle.id().to_string(), busy.id().to_string());
    // Busy for 8 s without a word (well past the 3 s limit) while the other one idles.
    let silent = Duration::from_secs(8);
    let work = busy.run(
        ["sleep", "8"].into(),
        RunOptions::default().timeout(silent + Duration::from_secs(20)),
    );
    let watch = async {
        tokio::time::sleep(IDLE + Duration::from_millis(3500)).await;
        let idle_running = still_running(&ctx, &c, &idle_id).await?;
        let busy_running = still_running(&ctx, &c, &busy_id).await?;
        anyhow::Ok((idle_running, busy_running))
    };
    let (worked, watched) = tokio::join!(work, watch);
    let (idle_running, busy_running) = watched?;
    let worked = worked.map_err(|e| e.render());
    ensure!(
        busy_running && matches!(&worked, Ok(r) if r.exit_code == 0),
        "the busy sandbox was removed while its command ran (listed running: {busy_running}, \
         its command: {worked:?})"
    );
    ensure!(
        !idle_running,
        "the idle sandbox still runs {:?} after its idle limit",
        Duration::from_millis(3500)
    );
    // Removed, not only stopped: an ended sandbox kept until its deadline would hold its
    // files and its name on the engine for the rest of a long lifetime.
    let until = tokio::time::Instant::now() + IDLE_REMOVED_WITHIN;
    let left = loop {
        let listed = ctx.listed(&c).await?;
        let left: Vec<String> = listed
            .iter()
            .filter(|m| m.id == idle_id)
            .map(|m| format!("{:?}", m.state))
            .collect();
        if left.is_empty() || tokio::time::Instant::now() >= until {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    ensure!(
        left.is_empty(),
        "the idle sandbox is still listed ({}) {IDLE_REMOVED_WITHIN:?} after it stopped running: \
         the idle limit must remove it",
        left.join(", ")
    );
    must_code(
        idle.run(["true"].into(), RunOptions::default()).await,
        ErrorCode::SandboxGone,
    )
    .context("a command in the sandbox the idle limit removed")?;
    let _ = idle.kill().await;
    busy.kill().await
}
