//! Contract trials: lifecycle (identity, create/kill, teardown on drop, error and panic,
//! connect, Debug hygiene, labels, reaping, the lifetime backstop).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use libtest_mimic::Trial;
use sandbox_core::labels::{
    LABEL_BACKEND, LABEL_DEADLINE, LABEL_MANAGED, LABEL_OWNER, LABEL_SESSION, Owner, session_id,
    unix_now,
};
use sandbox_core::teardown::{teardown_grace, wait_for_teardowns};
use sandbox_core::{Capability as C, ErrorCode, IsolationTier, RunOptions, SandboxState};

use crate::ctx::{CASE_LABEL, Ctx, Need, Sbx, injected, must_code, run_ok, sbx, token};

const AREA: &str = "lifecycle";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let run = Need::Cap(C::RUN_COMMAND);
    vec![
        ctx.trial(
            AREA,
            "identity_caps_tier_reported",
            &[],
            identity_caps_tier_reported,
        ),
        ctx.trial(
            AREA,
            "sandbox_tier_equals_backend_tier",
            &[],
            sandbox_tier_equals_backend_tier,
        ),
        ctx.trial(
            AREA,
            "default_lifetime_is_applied",
            &[Need::Reapable],
            default_lifetime_is_applied,
        ),
        ctx.trial(AREA, "create_run_kill_kill", &[run], create_run_kill_kill),
        ctx.trial(
            AREA,
            "hostname_as_asked",
            &[run, Need::KernelEvidence],
            hostname_as_asked,
        ),
        ctx.trial(
            AREA,
            "run_after_kill_is_gone",
            &[run],
            run_after_kill_is_gone,
        ),
        ctx.trial(
            AREA,
            "drop_without_kill_tears_down",
            &[Need::Reapable],
            drop_without_kill_tears_down,
        ),
        ctx.trial(
            AREA,
            "teardown_on_error_path",
            &[run, Need::Reapable],
            teardown_on_error_path,
        ),
        ctx.trial(
            AREA,
            "teardown_on_panic",
            &[run, Need::Reapable],
            teardown_on_panic,
        ),
        ctx.trial(
            AREA,
            "connect_unknown_is_connect_error_and_creates_nothing",
            &[Need::Reapable],
            connect_unknown_is_connect_error_and_creates_nothing,
        ),
        ctx.trial(
            AREA,
            "connect_dead_is_connect_error",
            &[],
            connect_dead_is_connect_error,
        ),
        ctx.trial(AREA, "connect_reattaches", &[run], connect_reattaches),
        ctx.trial(
            AREA,
            "required_agent_is_kept_or_refused",
            &[],
            required_agent_is_kept_or_refused,
        ),
        ctx.trial(
            AREA,
            "list_managed_shows_stopped",
            &[Need::Reapable],
            list_managed_shows_stopped,
        ),
        ctx.trial(
            AREA,
            "debug_shows_id_never_secrets",
            &[],
            debug_shows_id_never_secrets,
        ),
        ctx.trial(
            AREA,
            "metadata_propagates_to_labels",
            &[Need::Reapable],
            metadata_propagates_to_labels,
        ),
        ctx.trial(
            AREA,
            "list_managed_label_filter_narrows",
            &[Need::Reapable],
            list_managed_label_filter_narrows,
        ),
        ctx.trial(
            AREA,
            "kill_managed_true_then_false",
            &[Need::Reapable],
            kill_managed_true_then_false,
        ),
        ctx.trial(
            AREA,
            "lifetime_backstop_ends_sandbox",
            &[run, Need::Reapable],
            lifetime_backstop_ends_sandbox,
        ),
    ]
}

/// A sandbox reports exactly its backend's isolation tier (a handle never claims more, or
/// less, than the backend that made it).
async fn sandbox_tier_equals_backend_tier(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("sandbox_tier_equals_backend_tier"))
        .await?;
    let (tier, backend) = (sb.isolation(), ctx.backend.isolation());
    ensure!(
        tier == backend,
        "sandbox tier {tier} differs from its backend's tier {backend}"
    );
    sb.kill().await
}

/// A sandbox created without a lifetime gets the default one
/// (`CreateOptions::default().timeout`): its deadline label is that far from its creation.
async fn default_lifetime_is_applied(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("default_lifetime_is_applied");
    let default_lifetime = sandbox_core::CreateOptions::default().timeout;
    let opts = ctx.opts(&c).timeout(default_lifetime);
    ensure!(
        opts == ctx.opts(&c),
        "the base options set a lifetime of their own; this trial needs the default"
    );
    let before = std::time::SystemTime::now();
    let sb = ctx.create(&c, opts).await?;
    let listed = ctx.listed(&c).await?;
    let m = listed
        .iter()
        .find(|m| m.id == sb.id())
        .with_context(|| format!("{} is not listed", sb.id()))?;
    let deadline: u64 = m
        .labels
        .get(LABEL_DEADLINE)
        .with_context(|| format!("no {LABEL_DEADLINE} label: {:?}", m.labels))?
        .parse()
        .context("deadline label is not unix seconds")?;
    let created = before
        .duration_since(std::time::UNIX_EPOCH)
        .context("clock before 1970")?
        .as_secs();
    let lifetime = deadline.saturating_sub(created);
    let want = default_lifetime.as_secs();
    ensure!(
        lifetime.abs_diff(want) <= 30,
        "deadline is {lifetime} s after creation, the default lifetime is {want} s"
    );
    sb.kill().await
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// Backend and sandbox report a name, an id, capabilities (sandbox ⊆ backend) and a known
/// isolation tier.
async fn identity_caps_tier_reported(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("identity_caps_tier_reported");
    ensure!(!ctx.backend.name().is_empty(), "backend name is empty");
    ensure!(
        ctx.tier != IsolationTier::Unknown,
        "backend reports isolation tier Unknown"
    );
    let sb = ctx.sandbox(&c).await?;
    ensure!(!sb.id().is_empty(), "sandbox id is empty");
    ensure!(
        sb.backend() == ctx.backend.name(),
        "sandbox backend {:?} != backend name {:?}",
        sb.backend(),
        ctx.backend.name()
    );
    ensure!(
        ctx.caps.contains(sb.capabilities()),
        "sandbox declares {} which the backend does not ({})",
        sb.capabilities() - ctx.caps,
        ctx.caps
    );
    ensure!(
        sb.isolation() != IsolationTier::Unknown,
        "sandbox reports isolation tier Unknown"
    );
    sb.kill().await
}

/// create → run → kill → kill: the second kill is Ok (idempotent).
async fn create_run_kill_kill(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("create_run_kill_kill")).await?;
    let out = run_ok(&*sb, ["echo", "alive"]).await?;
    ensure!(out == "alive\n", "stdout {out:?}");
    let raw = sb.into_inner();
    sbx(raw.kill().await, "first kill")?;
    sbx(raw.kill().await, "second kill (must be idempotent)")?;
    Ok(())
}

/// `CreateOptions::hostname` is the sandbox's name for itself: in `/etc/hostname` and in
/// the kernel's (UTS) hostname its processes read.
async fn hostname_as_asked(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("hostname_as_asked");
    let name = "sbx-host-7";
    let sb = ctx.create(&c, ctx.opts(&c).hostname(name)).await?;
    for file in ["/etc/hostname", "/proc/sys/kernel/hostname"] {
        let got = run_ok(&*sb, ["cat", file]).await?;
        ensure!(
            got.trim() == name,
            "{file} says {:?}; the sandbox was created with hostname {name:?}",
            got.trim()
        );
    }
    sb.kill().await
}

/// Running in a killed sandbox returns `SandboxGone`, not a timeout or an engine error.
async fn run_after_kill_is_gone(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("run_after_kill_is_gone")).await?;
    let raw = sb.into_inner();
    sbx(raw.kill().await, "kill")?;
    must_code(
        raw.run(["echo", "x"].into(), RunOptions::default()).await,
        ErrorCode::SandboxGone,
    )?;
    Ok(())
}

/// Dropping a handle without `kill()` removes the sandbox within the teardown grace.
async fn drop_without_kill_tears_down(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("drop_without_kill_tears_down");
    let sb = ctx.sandbox(&c).await?.into_inner();
    let id = sb.id().to_string();
    ensure!(
        ctx.listed(&c).await?.iter().any(|m| m.id == id),
        "a live sandbox is not in list_managed"
    );
    drop(sb);
    wait_for_teardowns(teardown_grace() + Duration::from_secs(1)).await;
    ctx.wait_id_unlisted(&c, &id, Duration::from_secs(3)).await
}

async fn fails_midway(ctx: &Ctx, c: &str, id_out: &mut String) -> anyhow::Result<()> {
    let sb = ctx.sandbox(c).await?.into_inner();
    *id_out = sb.id().to_string();
    // A user's `?` on a failing command: the handle is dropped on the error path.
    sb.run(["false"].into(), RunOptions::default())
        .await?
        .raise_for_status()?;
    bail!("`false` did not fail")
}

/// A sandbox dropped on an error path (`?`) is torn down.
async fn teardown_on_error_path(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("teardown_on_error_path");
    let mut id = String::new();
    let err = fails_midway(&ctx, &c, &mut id)
        .await
        .expect_err("error path");
    let code = err
        .downcast_ref::<sandbox_core::SandboxError>()
        .map(|e| e.code());
    ensure!(
        code == Some(ErrorCode::Execution),
        "the caller's error must be the Execution error, got {err:#}"
    );
    ensure!(!id.is_empty(), "sandbox was not created: {err:#}");
    wait_for_teardowns(teardown_grace() + Duration::from_secs(1)).await;
    ctx.wait_id_unlisted(&c, &id, Duration::from_secs(3)).await
}

/// A sandbox owned by a task that panics is torn down.
async fn teardown_on_panic(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("teardown_on_panic");
    let sb = ctx.sandbox(&c).await?.into_inner();
    let id = sb.id().to_string();
    let task = tokio::spawn(async move {
        let r = sb.run(["true"].into(), RunOptions::default()).await;
        if r.is_ok() {
            // `resume_unwind` panics without running the panic hook (no noisy backtrace).
            std::panic::resume_unwind(Box::new("deliberate panic while holding a sandbox"));
        }
        r
    });
    let joined = task.await;
    ensure!(
        joined.as_ref().is_err_and(|e| e.is_panic()),
        "the task did not panic: {joined:?}"
    );
    wait_for_teardowns(teardown_grace() + Duration::from_secs(1)).await;
    ctx.wait_id_unlisted(&c, &id, Duration::from_secs(3)).await
}

/// `connect` of an unknown id is a `Connect` error and provisions nothing.
async fn connect_unknown_is_connect_error_and_creates_nothing(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let unknown = token("sbx-contract-unknown-");
    must_code(ctx.backend.connect(&unknown).await, ErrorCode::Connect)?;
    // Every trial sandbox carries `contract=<case>`: one without it was made by connect.
    let mut filter = BTreeMap::new();
    filter.insert(LABEL_SESSION.to_string(), session_id().to_string());
    let all = sbx(ctx.reaper()?.list_managed(&filter).await, "list_managed")?;
    for m in all {
        ensure!(
            m.id != unknown,
            "connect created a sandbox with the asked id"
        );
        ensure!(
            m.labels
                .contains_key(&format!("io.sandbox-rs.meta.{CASE_LABEL}")),
            "a sandbox without contract metadata appeared: {} {:?}",
            m.id,
            m.labels
        );
    }
    Ok(())
}

/// `connect` of a killed sandbox's id is a `Connect` error.
async fn connect_dead_is_connect_error(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("connect_dead_is_connect_error")).await?;
    let id = sb.id().to_string();
    sb.kill().await?;
    must_code(ctx.backend.connect(&id).await, ErrorCode::Connect)?;
    Ok(())
}

/// `connect` reattaches: state written through one handle is visible through the other.
async fn connect_reattaches(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("connect_reattaches")).await?;
    let tok = token("attach-");
    run_ok(&*sb, format!("echo {tok} > /work/attach.txt")).await?;
    let other = sbx(ctx.backend.connect(sb.id()).await, "connect")?;
    ensure!(
        other.id() == sb.id(),
        "connected id {} != {}",
        other.id(),
        sb.id()
    );
    let seen = run_ok(&*other, ["cat", "/work/attach.txt"]).await?;
    ensure!(seen.trim() == tok, "reattached handle sees {seen:?}");
    sb.kill().await?;
    // The second handle's kill is idempotent on a killed sandbox.
    sbx(other.kill().await, "kill through the reattached handle")
}

/// With `require_agent`, a backend that declares `AGENT` gives a sandbox that declares it too (and runs commands); one that does not refuses with `CapabilityNotSupported` naming `AGENT`.
async fn required_agent_is_kept_or_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("required_agent_is_kept_or_refused");
    let opts = ctx.opts(&c).require_agent(true);
    if !ctx.caps.contains(C::AGENT) {
        let e = must_code(
            ctx.backend.create(opts).await,
            ErrorCode::CapabilityNotSupported,
        )
        .context("require_agent on a backend without AGENT")?;
        ensure!(
            matches!(
                &e,
                sandbox_core::SandboxError::CapabilityNotSupported { capability, .. }
                    if capability.contains(C::AGENT)
            ),
            "the refusal does not name AGENT: {}",
            e.render()
        );
        return Ok(());
    }
    let sb = ctx.create(&c, opts).await?;
    let caps = sb.capabilities();
    let out = if caps.contains(C::RUN_COMMAND) {
        Some(run_ok(&*sb, "echo kept").await)
    } else {
        None
    };
    sb.kill().await?;
    ensure!(
        caps.contains(C::AGENT),
        "a sandbox created with require_agent does not declare AGENT (it runs without the \
         agent): {caps}"
    );
    if let Some(out) = out {
        let out = out?;
        ensure!(
            out.trim() == "kept",
            "the required-agent sandbox ran: {out:?}"
        );
    }
    Ok(())
}

/// `Debug` of a sandbox shows its id and never a secret value; nor does `CreateOptions`.
async fn debug_shows_id_never_secrets(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("debug_shows_id_never_secrets");
    let secret = token("sbx-secret-");
    let env_val = token("sbx-envval-");
    let opts = ctx
        .opts(&c)
        .secret("SBX_CONTRACT_SECRET", secret.as_str())
        .env("SBX_CONTRACT_PLAIN", env_val.as_str());
    let od = format!("{opts:?}");
    ensure!(
        !od.contains(&secret) && !od.contains(&env_val),
        "CreateOptions Debug leaks: {od}"
    );
    let sb = ctx.create(&c, opts).await?;
    let d = format!("{:?}", &*sb);
    ensure!(
        d.contains(sb.id()),
        "sandbox Debug does not show its id: {d}"
    );
    ensure!(!d.contains(&secret), "sandbox Debug leaks the secret: {d}");
    ensure!(
        !d.contains(&env_val),
        "sandbox Debug leaks an env value: {d}"
    );
    let alt = format!("{:#?}", &*sb);
    ensure!(!alt.contains(&secret), "sandbox {{:#?}} leaks the secret");
    sb.kill().await
}

/// Metadata becomes `io.sandbox-rs.meta.<k>` labels, next to managed, session, owner,
/// backend and deadline.
async fn metadata_propagates_to_labels(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("metadata_propagates_to_labels");
    let lifetime = Duration::from_secs(120);
    let before = unix_now();
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .metadata("team", "contract-evals")
                .timeout(lifetime),
        )
        .await?;
    let listed = ctx.listed(&c).await?;
    let m = listed
        .iter()
        .find(|m| m.id == sb.id())
        .context("sandbox not in list_managed")?;
    let l = &m.labels;
    let get = |k: &str| l.get(k).map(String::as_str);
    ensure!(
        get("io.sandbox-rs.meta.team") == Some("contract-evals"),
        "labels {l:?}"
    );
    ensure!(get(LABEL_MANAGED) == Some("true"), "managed label: {l:?}");
    ensure!(get(LABEL_SESSION) == Some(session_id()), "session: {l:?}");
    let owner = Owner::current().to_label();
    ensure!(get(LABEL_OWNER) == Some(owner.as_str()), "owner: {l:?}");
    ensure!(
        get(LABEL_BACKEND) == Some(ctx.backend.name()),
        "backend: {l:?}"
    );
    let deadline: u64 = get(LABEL_DEADLINE)
        .context("no deadline label")?
        .parse()
        .context("deadline is not unix seconds")?;
    let expect = before + lifetime.as_secs();
    ensure!(
        deadline + 30 >= expect && deadline <= unix_now() + lifetime.as_secs() + 30,
        "deadline {deadline} is not create time + lifetime (~{expect})"
    );
    ensure!(m.backend == ctx.backend.name(), "ManagedSandbox.backend");
    sb.kill().await
}

/// `list_managed` with a metadata filter returns only matching sandboxes.
async fn list_managed_label_filter_narrows(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("list_managed_label_filter_narrows");
    let part = token("p");
    let a = ctx
        .create(&c, ctx.opts(&c).metadata("part", format!("{part}-a")))
        .await?;
    let b = ctx
        .create(&c, ctx.opts(&c).metadata("part", format!("{part}-b")))
        .await?;
    let mut filter = BTreeMap::new();
    filter.insert("part".to_string(), format!("{part}-a"));
    let only_a = sbx(ctx.reaper()?.list_managed(&filter).await, "list_managed")?;
    let ids: Vec<_> = only_a.iter().map(|m| m.id.as_str()).collect();
    ensure!(
        ids == [a.id()],
        "filter part=a returned {ids:?}, expected only {}",
        a.id()
    );
    let both = ctx.listed(&c).await?;
    ensure!(
        both.len() == 2,
        "case filter returned {} sandboxes",
        both.len()
    );
    a.kill().await?;
    b.kill().await
}

/// `kill_managed` returns `true` for a live sandbox, then `false` once it is gone.
async fn kill_managed_true_then_false(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("kill_managed_true_then_false");
    let sb = ctx.sandbox(&c).await?;
    let id = sb.id().to_string();
    let r = ctx.reaper()?;
    ensure!(
        sbx(r.kill_managed(&id).await, "first kill_managed")?,
        "kill_managed of a live sandbox returned false"
    );
    ensure!(
        !sbx(r.kill_managed(&id).await, "second kill_managed")?,
        "kill_managed of a gone sandbox returned true"
    );
    ensure!(
        !ctx.listed(&c).await?.iter().any(|m| m.id == id),
        "killed sandbox still listed"
    );
    sb.kill().await
}

/// A sandbox stopped from outside (its processes ended, as a crashed init or `docker
/// stop` would) is never lost track of. Where the engine still holds it, it stays in
/// `list_managed` as `Stopped`, so `reap` can find it, and `kill_managed` removes it.
/// Where the engine deletes a stopped sandbox itself (Docker's `AutoRemove`, Podman's
/// `--rm`), it leaves `list_managed` within a bound, a `run` on it is `SandboxGone`,
/// and `kill_managed` answers "nothing to remove".
async fn list_managed_shows_stopped(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("list_managed_shows_stopped");
    let sb = ctx.sandbox(&c).await?;
    let id = sb.id().to_string();
    let stopped = ctx
        .probes
        .stop_sandbox(&id)
        .await
        .context("the stop_sandbox probe failed")?;
    if let crate::probes::Injection::Removed(why) = stopped {
        return stopped_sandbox_is_removed(&ctx, &c, sb, &id, &why).await;
    }
    injected("a stopped sandbox (Probes::stop_sandbox)", stopped)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let listed = ctx.listed(&c).await?;
        let Some(m) = listed.iter().find(|m| m.id == id) else {
            bail!("a stopped sandbox is missing from list_managed: reap could never find it");
        };
        if m.state == SandboxState::Stopped {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "a stopped sandbox is still listed as {:?} after 15 s",
            m.state
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = ctx.reaper()?;
    ensure!(
        sbx(
            r.kill_managed(&id).await,
            "kill_managed of a stopped sandbox"
        )?,
        "kill_managed of a stopped (still held) sandbox returned false"
    );
    ctx.wait_id_unlisted(&c, &id, Duration::from_secs(2))
        .await?;
    // Idempotent on a removed sandbox.
    sb.kill().await
}

/// The branch of [`list_managed_shows_stopped`] for an engine that deletes a stopped
/// sandbox itself (`why`): gone from `list_managed` (never shown `Running` after the
/// stop), `SandboxGone` on use, nothing left for `kill_managed`, `kill` idempotent.
async fn stopped_sandbox_is_removed(
    ctx: &Ctx,
    c: &str,
    sb: Sbx,
    id: &str,
    why: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let listed = ctx.listed(c).await?;
        match listed.iter().find(|m| m.id == id) {
            None => break,
            Some(m) => {
                ensure!(
                    m.state != SandboxState::Running,
                    "a stopped sandbox is listed as Running ({why})"
                );
                ensure!(
                    Instant::now() < deadline,
                    "a stopped sandbox the engine removes itself ({why}) is still listed as \
                     {:?} after 15 s",
                    m.state
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        sb.run(["echo", "late"].into(), RunOptions::default()),
    )
    .await
    .context("run on a stopped, removed sandbox hung")?;
    must_code(r, ErrorCode::SandboxGone)?;
    let reaper = ctx.reaper()?;
    ensure!(
        !sbx(
            reaper.kill_managed(id).await,
            "kill_managed of a removed sandbox"
        )?,
        "kill_managed of a sandbox the engine already removed returned true"
    );
    sb.kill().await
}

/// Past its lifetime a sandbox is gone: `run` → `SandboxGone`, and it leaves
/// `list_managed` within a bounded margin.
async fn lifetime_backstop_ends_sandbox(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("lifetime_backstop_ends_sandbox");
    let sb = ctx
        .create(&c, ctx.opts(&c).timeout(Duration::from_secs(2)))
        .await?;
    let id = sb.id().to_string();
    run_ok(&*sb, ["true"]).await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        sb.run(["echo", "late"].into(), RunOptions::default()),
    )
    .await
    .context("run on an expired sandbox hung")?;
    must_code(r, ErrorCode::SandboxGone)?;
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "SandboxGone took {:?}",
        started.elapsed()
    );
    // Gone from the engine, or at least not running, within a bounded margin.
    let deadline = Instant::now() + teardown_grace() + Duration::from_secs(5);
    loop {
        let listed = ctx.listed(&c).await?;
        match listed.iter().find(|m| m.id == id) {
            None => break,
            Some(m) if Instant::now() >= deadline => {
                bail!(
                    "expired sandbox still listed ({:?}) {:?} past its deadline",
                    m.state,
                    teardown_grace() + Duration::from_secs(5)
                )
            }
            Some(m) if m.state == SandboxState::Running => {
                ensure!(Instant::now() < deadline, "expired sandbox still running");
            }
            Some(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sb.kill().await
}
