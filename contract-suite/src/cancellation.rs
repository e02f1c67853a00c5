//! Contract trials: cancellation and teardown (dropped futures kill their remote work,
//! kills in drop paths, the orphan warning, failing kills, errors that teardown must not
//! hide).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt;
use libtest_mimic::Trial;
use sandbox_core::teardown::{teardown_grace, wait_for_teardowns};
use sandbox_core::{Capability as C, CodeOptions, ErrorCode, ReapableBackend, RunOptions, Sandbox};

use crate::capture;
use crate::ctx::{
    CASE_LABEL, Ctx, Need, assert_pid_gone, must_code, read_pid, sbx, wait_for_file, wait_for_pid,
};

const AREA: &str = "cancellation";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let run = Need::Cap(C::RUN_COMMAND);
    vec![
        ctx.trial(
            AREA,
            "drop_mid_run_kills_process",
            &[run],
            drop_mid_run_kills_process,
        ),
        ctx.trial(
            AREA,
            "drop_mid_run_code_kills_interpreter",
            &[Need::Cap(C::RUN_CODE | C::RUN_COMMAND)],
            drop_mid_run_code_kills_interpreter,
        ),
        ctx.trial(
            AREA,
            "drop_mid_stream_kills_process",
            &[run, Need::Cap(C::STREAMING)],
            drop_mid_stream_kills_process,
        ),
        ctx.trial(
            AREA,
            "drop_mid_create_leaves_nothing",
            &[Need::Reapable],
            drop_mid_create_leaves_nothing,
        ),
        ctx.trial(
            AREA,
            "kill_inside_drop_path_works",
            &[Need::Reapable],
            kill_inside_drop_path_works,
        ),
        ctx.trial(
            AREA,
            "grace_expiry_warns_orphan_with_id",
            &[Need::Faults],
            grace_expiry_warns_orphan_with_id,
        ),
        ctx.trial(
            AREA,
            "failing_teardown_only_warns",
            &[Need::Faults],
            failing_teardown_only_warns,
        ),
        ctx.trial(
            AREA,
            "failing_kill_is_connect_error_with_reap_hint",
            &[Need::Faults],
            failing_kill_is_connect_error_with_reap_hint,
        ),
        ctx.trial(
            AREA,
            "teardown_failure_never_hides_callers_error",
            &[run, Need::Faults],
            teardown_failure_never_hides_callers_error,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// Dropping a `run` future mid-flight kills its remote process (no orphan).
async fn drop_mid_run_kills_process(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("drop_mid_run_kills_process")).await?;
    {
        let long = sb.run(
            "echo $$ > /work/pid; exec sleep 1000".into(),
            RunOptions::default().timeout(Duration::from_secs(120)),
        );
        tokio::select! {
            r = long => bail!("the long run ended by itself: {r:?}"),
            w = wait_for_file(&*sb, "/work/pid", Duration::from_secs(20)) => w?,
        }
        // `long` is dropped here, mid-run.
    }
    let pid = read_pid(&*sb, "/work/pid").await?;
    assert_pid_gone(&*sb, &pid, "run future dropped").await?;
    sb.kill().await
}

/// The snippet of `drop_mid_run_code_kills_interpreter`: the interpreter writes its pid,
/// then sleeps.
const PYID_SNIPPET: &str =
    "import os; open(\"/work/pyid\", \"w\").write(str(os.getpid()))\nimport time; time.sleep(1000)";

/// Dropping a `run_code` future mid-flight returns promptly and kills the interpreter
/// (the pid it wrote is gone once the teardowns finish), and the sandbox still runs code.
async fn drop_mid_run_code_kills_interpreter(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx
        .sandbox(&case("drop_mid_run_code_kills_interpreter"))
        .await?;
    let mut long = Box::pin(sb.run_code(
        PYID_SNIPPET,
        CodeOptions::default().timeout(Duration::from_secs(120)),
    ));
    let pid = tokio::select! {
        r = &mut long => bail!("the sleeping code ended by itself: {r:?}"),
        pid = wait_for_pid(&*sb, "/work/pyid", Duration::from_secs(30)) => pid?,
    };
    let dropping = Instant::now();
    drop(long);
    ensure!(
        dropping.elapsed() < Duration::from_secs(1),
        "dropping the run_code future blocked for {:?}",
        dropping.elapsed()
    );
    ensure!(
        wait_for_teardowns(teardown_grace() + Duration::from_secs(1)).await,
        "the dropped run_code's teardown did not finish within the grace"
    );
    assert_pid_gone(&*sb, &pid, "python interpreter of a dropped run_code").await?;
    let r = sbx(
        tokio::time::timeout(
            Duration::from_secs(30),
            sb.run_code("print(1)", CodeOptions::default()),
        )
        .await
        .context("run_code after a dropped run_code hung")?,
        "run_code after drop",
    )?;
    ensure!(
        r.exit_code == 0 && r.stdout_text() == "1\n",
        "print(1) after drop: {r:?}"
    );
    sb.kill().await
}

/// Dropping a started `Process` mid-stream kills its remote process.
async fn drop_mid_stream_kills_process(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("drop_mid_stream_kills_process")).await?;
    let mut p = sbx(
        sb.stream(
            "echo $$ > /work/spid; echo ready; exec sleep 1000".into(),
            RunOptions::default().timeout(Duration::from_secs(120)),
        ),
        "stream",
    )?;
    let first = tokio::time::timeout(Duration::from_secs(20), p.next())
        .await
        .context("no output from the streamed process")?;
    ensure!(matches!(first, Some(Ok(_))), "first item: {first:?}");
    let pid = wait_for_pid(&*sb, "/work/spid", Duration::from_secs(10)).await?;
    drop(p);
    assert_pid_gone(&*sb, &pid, "process dropped mid-stream").await?;
    sb.kill().await
}

/// Dropping `create` at any point — mid-flight, or its finished handle — leaves no sandbox
/// behind (within grace + margin).
async fn drop_mid_create_leaves_nothing(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("drop_mid_create_leaves_nothing");
    for delay_ms in [1u64, 20, 60, 150, 300] {
        let create = ctx.backend.create(ctx.opts(&c));
        match tokio::time::timeout(Duration::from_millis(delay_ms), create).await {
            // Finished before this drop point: drop the handle unkilled instead, the
            // last point at which "dropping create" can happen.
            Ok(Ok(sb)) => drop(sb),
            Ok(Err(e)) => bail!("create failed: {}", e.render()),
            // Dropped mid-create.
            Err(_) => {}
        }
    }
    wait_for_teardowns(teardown_grace() + Duration::from_secs(1)).await;
    ctx.wait_unlisted(&c, Duration::from_secs(3)).await
}

struct UserGuard {
    sb: Option<Box<dyn Sandbox>>,
    done: Option<tokio::sync::oneshot::Sender<sandbox_core::Result<()>>>,
}

impl Drop for UserGuard {
    fn drop(&mut self) {
        // A user's scope guard: kill from a Drop, on the runtime.
        if let (Some(sb), Some(done)) = (self.sb.take(), self.done.take()) {
            tokio::spawn(async move {
                let r = sb.kill().await;
                let _ = done.send(r);
            });
        }
    }
}

/// `kill()` called from a user's `Drop` (spawned on the runtime) succeeds and removes the
/// sandbox.
async fn kill_inside_drop_path_works(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("kill_inside_drop_path_works");
    let sb = ctx.sandbox(&c).await?.into_inner();
    let id = sb.id().to_string();
    let (tx, rx) = tokio::sync::oneshot::channel();
    drop(UserGuard {
        sb: Some(sb),
        done: Some(tx),
    });
    let r = tokio::time::timeout(teardown_grace() + Duration::from_secs(2), rx)
        .await
        .context("kill from a drop path did not finish within the grace")?
        .context("kill task vanished")?;
    sbx(r, "kill from a drop path")?;
    ctx.wait_id_unlisted(&c, &id, Duration::from_secs(1)).await
}

async fn reap(faults_backend: &dyn ReapableBackend, id: &str) {
    let _ = faults_backend.kill_managed(id).await;
}

/// When a dropped sandbox's kill hangs past the grace, an "orphaned sandbox" warning
/// names its id (target `sandbox::teardown`).
async fn grace_expiry_warns_orphan_with_id(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    ensure!(
        capture::is_installed(),
        "the suite's tracing capture is not the global subscriber"
    );
    let c = case("grace_expiry_warns_orphan_with_id");
    let faults = ctx.faults()?;
    let _serial = ctx.fault_lock.lock().await;
    let fb = faults.backend();
    let sb = sbx(
        fb.create(ctx.opts(&c).metadata(CASE_LABEL, &c)).await,
        "create",
    )?;
    let id = sb.id().to_string();
    faults.hang_kills().await;
    let outcome = async {
        drop(sb);
        let deadline = Instant::now() + teardown_grace() + Duration::from_secs(3);
        loop {
            if let Some(w) = capture::orphan_warnings_for(&id).into_iter().next() {
                ensure!(
                    w.fields.get("backend").is_some_and(|b| b == fb.name()),
                    "orphan warning backend field: {:?}",
                    w.fields
                );
                ensure!(
                    w.fields.contains_key("labels"),
                    "orphan warning has no labels field: {:?}",
                    w.fields
                );
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "no \"orphaned sandbox\" warning naming {id} within grace {:?} + 3 s",
                    teardown_grace()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    .await;
    faults.heal().await;
    if let Some(r) = fb.as_reapable() {
        reap(r, &id).await;
    } else if let Some(r) = ctx.backend.as_reapable() {
        reap(r, &id).await;
    }
    outcome
}

/// A teardown that fails on its own (a dropped handle whose kill the engine refuses) only
/// warns: an "orphaned sandbox" warning names its id, and nothing else breaks — the
/// runtime keeps serving, and the sandbox can be reaped once the engine heals.
async fn failing_teardown_only_warns(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    ensure!(
        capture::is_installed(),
        "the suite's tracing capture is not the global subscriber"
    );
    let c = case("failing_teardown_only_warns");
    let faults = ctx.faults()?;
    let _serial = ctx.fault_lock.lock().await;
    let fb = faults.backend();
    let sb = sbx(
        fb.create(ctx.opts(&c).metadata(CASE_LABEL, &c)).await,
        "create",
    )?;
    let id = sb.id().to_string();
    faults.fail_kills().await;
    let outcome = async {
        drop(sb);
        let deadline = Instant::now() + teardown_grace() + Duration::from_secs(3);
        loop {
            if !capture::orphan_warnings_for(&id).is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "no \"orphaned sandbox\" warning naming {id} within grace {:?} + 3 s after \
                     its teardown failed",
                    teardown_grace()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The failure stayed a warning: the runtime still runs the suite's own work.
        let still = tokio::spawn(async { 42 }).await?;
        ensure!(still == 42, "the runtime stopped after a failed teardown");
        Ok(())
    }
    .await;
    faults.heal().await;
    if let Some(r) = fb.as_reapable() {
        reap(r, &id).await;
    } else if let Some(r) = ctx.backend.as_reapable() {
        reap(r, &id).await;
    }
    outcome
}

/// A kill the engine refuses maps to a `Connect` error whose hint names `sandbox reap`.
async fn failing_kill_is_connect_error_with_reap_hint(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("failing_kill_is_connect_error_with_reap_hint");
    let faults = ctx.faults()?;
    let _serial = ctx.fault_lock.lock().await;
    let fb = faults.backend();
    let sb = sbx(
        fb.create(ctx.opts(&c).metadata(CASE_LABEL, &c)).await,
        "create",
    )?;
    faults.fail_kills().await;
    let r = tokio::time::timeout(teardown_grace() + Duration::from_secs(2), sb.kill()).await;
    faults.heal().await;
    let outcome = (|| {
        let r = r.context("a failing kill was not bounded by the grace")?;
        let e = must_code(r, ErrorCode::Connect)?;
        ensure!(
            e.hint().contains("sandbox reap"),
            "hint does not mention `sandbox reap`: {}",
            e.hint()
        );
        Ok(())
    })();
    let healed = sb.kill().await;
    drop(sb);
    outcome?;
    sbx(healed, "kill after heal")
}

/// With kills failing, the caller still gets its own error (an exit status, a timeout),
/// never the teardown's: a refused kill is a `Connect` error that leaves the handle
/// usable, and the caller's later errors are its own.
async fn teardown_failure_never_hides_callers_error(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("teardown_failure_never_hides_callers_error");
    let faults = ctx.faults()?;
    let _serial = ctx.fault_lock.lock().await;
    let fb = faults.backend();
    let sb = sbx(
        fb.create(ctx.opts(&c).metadata(CASE_LABEL, &c)).await,
        "create",
    )?;
    faults.fail_kills().await;
    let outcome = async {
        // The teardown fails first; what follows must not be reported as that failure.
        must_code(sb.kill().await, ErrorCode::Connect).context("a kill the engine refuses")?;
        let r = sbx(sb.run("exit 3".into(), RunOptions::default()).await, "run")
            .context("after a failed kill")?;
        ensure!(r.exit_code == 3, "exit 3 after a failed kill: {r:?}");
        must_code(r.raise_for_status(), ErrorCode::Execution)?;
        let t = sb
            .run(
                ["sleep", "30"].into(),
                RunOptions::default().timeout(Duration::from_millis(500)),
            )
            .await;
        must_code(t, ErrorCode::ExecutionTimeout)?;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    faults.heal().await;
    let killed = sb.kill().await;
    outcome?;
    sbx(killed, "kill after heal")?;
    Ok(())
}
