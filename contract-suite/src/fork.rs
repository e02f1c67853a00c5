//! Contract trials: forks with memory (`SNAPSHOT_FORK`).
//!
//! What a declared `SNAPSHOT_FORK` promises: `fork(n)` gives n new sandboxes whose
//! interpreter contexts, processes and files continue from the instant of the fork — a
//! Python variable set before the fork is there in each fork, a file written before it
//! too — and from then on every fork and the original diverge independently; the
//! original goes on (same id, its context, its files, a process it was running); each
//! fork has an id of its own and is removed by `kill`, and nothing the fork needed (a
//! checkpoint) is left on the original. Without `SNAPSHOT_FORK` each trial proves the
//! refusal instead (`CapabilityNotSupported` from `fork`), which needs nothing.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, CodeOptions, ErrorCode, ForkOptions, Sandbox};

use crate::ctx::{Ctx, Need, Sbx, must_code, run_ok, sbx, token};

const AREA: &str = "fork";

/// The interpreter context the trials fork.
const CONTEXT: &str = "forked";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let declared = ctx.caps.contains(C::SNAPSHOT_FORK);
    let needs: &[Need] = if declared {
        &[Need::Cap(C::RUN_COMMAND | C::STATEFUL_CODE | C::FILESYSTEM)]
    } else {
        &[]
    };
    let reap: &[Need] = if declared {
        &[Need::Cap(C::RUN_COMMAND | C::STATEFUL_CODE), Need::Reapable]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "a_context_variable_survives_into_each_fork",
            needs,
            a_context_variable_survives_into_each_fork,
        ),
        ctx.trial(
            AREA,
            "forks_diverge_independently",
            needs,
            forks_diverge_independently,
        ),
        ctx.trial(AREA, "the_original_goes_on", needs, the_original_goes_on),
        ctx.trial(
            AREA,
            "a_file_survives_into_each_fork",
            needs,
            a_file_survives_into_each_fork,
        ),
        ctx.trial(
            AREA,
            "each_fork_has_its_own_id_and_kill_leaves_nothing",
            reap,
            each_fork_has_its_own_id_and_kill_leaves_nothing,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// A sandbox for a fork trial; `None` when the backend does not declare `SNAPSHOT_FORK`
/// and `fork` was just proven refused.
async fn sandbox(ctx: &Ctx, name: &str) -> anyhow::Result<Option<Sbx>> {
    let sb = ctx.sandbox(&case(name)).await?;
    if sb.capabilities().contains(C::SNAPSHOT_FORK) {
        return Ok(Some(sb));
    }
    ensure!(
        !ctx.caps.contains(C::SNAPSHOT_FORK),
        "the backend declares SNAPSHOT_FORK but this sandbox does not"
    );
    must_code(
        sb.fork(ForkOptions::new(1)).await.map(|_| ()),
        ErrorCode::CapabilityNotSupported,
    )
    .context("fork")?;
    sb.kill().await?;
    Ok(None)
}

/// Forks `sb` `n` times; each fork is guarded (killed when the trial ends, also on
/// failure).
async fn fork(ctx: &Ctx, sb: &Sbx, n: usize) -> anyhow::Result<Vec<Sbx>> {
    let forks = sbx(sb.fork(ForkOptions::new(n)).await, "fork")?;
    ensure!(
        forks.len() == n,
        "fork({n}) returned {} sandboxes",
        forks.len()
    );
    Ok(forks
        .into_iter()
        .map(|f| Sbx::new(f, ctx.background_counter()))
        .collect())
}

/// `code` in the trials' context; its stdout, trimmed.
async fn code(sb: &dyn Sandbox, code: &str) -> anyhow::Result<String> {
    let r = sbx(
        sb.run_code(code, CodeOptions::default().context(CONTEXT))
            .await,
        &format!("run_code {code:?} in {}", sb.id()),
    )?;
    ensure!(
        r.exit_code == 0,
        "run_code {code:?} in {} exited {}: {}",
        sb.id(),
        r.exit_code,
        String::from_utf8_lossy(&r.stderr)
    );
    Ok(String::from_utf8_lossy(&r.stdout).trim().to_string())
}

/// A variable set in a context before the fork is there, with its value, in the same
/// context of every fork.
async fn a_context_variable_survives_into_each_fork(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "a_context_variable_survives_into_each_fork").await? else {
        return Ok(());
    };
    code(&*sb, "before_the_fork = 41").await?;
    let forks = fork(&ctx, &sb, 2).await?;
    for f in &forks {
        let got = code(&**f, "print(before_the_fork + 1)").await?;
        ensure!(
            got == "42",
            "fork {}: the variable + 1 was {got:?}, not 42",
            f.id()
        );
    }
    for f in forks {
        f.kill().await?;
    }
    sb.kill().await
}

/// After the fork each sandbox changes on its own: a variable and a file set in one are
/// seen neither in the others nor in the original, which keep theirs.
async fn forks_diverge_independently(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "forks_diverge_independently").await? else {
        return Ok(());
    };
    code(&*sb, "branch = 0").await?;
    let forks = fork(&ctx, &sb, 2).await?;
    let all: Vec<(&dyn Sandbox, i64)> = vec![(&*sb, 1), (&*forks[0], 2), (&*forks[1], 3)];
    for (s, n) in &all {
        code(*s, &format!("branch = {n}")).await?;
        run_ok(*s, ["sh", "-c", &format!("echo {n} > /work/branch-{n}")]).await?;
    }
    for (s, n) in &all {
        let got = code(*s, "print(branch)").await?;
        ensure!(
            got == n.to_string(),
            "branch {n} ({}): its variable is {got:?}",
            s.id()
        );
        for (_, other) in &all {
            let r = sbx(
                s.run(
                    ["test", "-e", &format!("/work/branch-{other}")].into(),
                    Default::default(),
                )
                .await,
                "test -e",
            )?;
            let seen = r.exit_code == 0;
            ensure!(
                seen == (other == n),
                "branch {n} ({}) {} the file of branch {other}",
                s.id(),
                if seen { "sees" } else { "does not see" }
            );
        }
    }
    for f in forks {
        f.kill().await?;
    }
    sb.kill().await
}

/// The original keeps its id and goes on: its context holds what was set before, a
/// process it was running still runs, and commands run.
async fn the_original_goes_on(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "the_original_goes_on").await? else {
        return Ok(());
    };
    let id = sb.id().to_string();
    code(&*sb, "kept = 7").await?;
    // A process running through the fork (its stream is detached by it; the process is
    // what must go on).
    let mut p = sbx(
        sb.stream(
            ["sh", "-c", "echo $$; exec sleep 60"].into(),
            Default::default(),
        ),
        "stream sleep",
    )?;
    let pid = first_line(&mut p).await?;
    let forks = fork(&ctx, &sb, 1).await?;
    ensure!(
        sb.id() == id,
        "the original's id changed: {id} → {}",
        sb.id()
    );
    let got = code(&*sb, "print(kept + 35)").await?;
    ensure!(
        got == "42",
        "the original's context after the fork: {got:?}"
    );
    let r = sbx(
        sb.run(["kill", "-0", &pid].into(), Default::default())
            .await,
        "kill -0",
    )?;
    ensure!(
        r.exit_code == 0,
        "the original's process {pid} did not survive the fork (kill -0 exited {})",
        r.exit_code
    );
    let out = run_ok(&*sb, ["echo", "still-here"]).await?;
    ensure!(
        out.contains("still-here"),
        "the original after the fork: {out:?}"
    );
    drop(p);
    for f in forks {
        f.kill().await?;
    }
    sb.kill().await
}

/// The first line `p` prints (a pid), within 15 s.
async fn first_line(p: &mut sandbox_core::Process) -> anyhow::Result<String> {
    use futures::StreamExt;
    let mut seen = String::new();
    let read = tokio::time::timeout(Duration::from_secs(15), async {
        while !seen.contains('\n') {
            match p.next().await {
                Some(Ok(c)) => seen.push_str(&String::from_utf8_lossy(&c.data)),
                Some(Err(e)) => anyhow::bail!("the stream failed: {}", e.render()),
                None => anyhow::bail!("the stream ended before its first line"),
            }
        }
        Ok(())
    })
    .await;
    read.map_err(|_| anyhow::anyhow!("no first line within 15 s: {seen:?}"))??;
    Ok(seen.lines().next().unwrap_or("").trim().to_string())
}

/// Files written before the fork — through the file API and by a command — are in each
/// fork with their content.
async fn a_file_survives_into_each_fork(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = sandbox(&ctx, "a_file_survives_into_each_fork").await? else {
        return Ok(());
    };
    let note = token("note");
    sbx(
        sb.files()?
            .write("/work/fork-note.txt", Bytes::from(note.clone()))
            .await,
        "write the note",
    )?;
    run_ok(
        &*sb,
        ["sh", "-c", &format!("echo {note} > /work/fork-cmd.txt")],
    )
    .await?;
    let forks = fork(&ctx, &sb, 2).await?;
    for f in &forks {
        let got = sbx(
            f.files()?.read("/work/fork-note.txt").await,
            "read the note",
        )?;
        ensure!(
            got == note.as_bytes(),
            "fork {}: the note was {:?}",
            f.id(),
            String::from_utf8_lossy(&got)
        );
        let got = run_ok(&**f, ["cat", "/work/fork-cmd.txt"]).await?;
        ensure!(
            got.trim() == note,
            "fork {}: the command's file was {got:?}",
            f.id()
        );
    }
    for f in forks {
        f.kill().await?;
    }
    sb.kill().await
}

/// Each fork has an id of its own (neither the original's nor another fork's), is listed
/// as a managed sandbox carrying the original's metadata, and is gone after its `kill`,
/// while the original runs on; the original keeps no checkpoint where the adapter can
/// show its checkpoints.
async fn each_fork_has_its_own_id_and_kill_leaves_nothing(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let name = "each_fork_has_its_own_id_and_kill_leaves_nothing";
    let Some(sb) = sandbox(&ctx, name).await? else {
        return Ok(());
    };
    code(&*sb, "x = 1").await?;
    let forks = fork(&ctx, &sb, 2).await?;
    let mut ids = vec![sb.id().to_string()];
    ids.extend(forks.iter().map(|f| f.id().to_string()));
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    ensure!(unique.len() == 3, "the ids are not distinct: {ids:?}");
    // A sandbox that no longer declares SNAPSHOT_FORK (a backend may refuse to fork a
    // restored sandbox again) refuses a fork, never half-does one.
    let all: Vec<&dyn Sandbox> = std::iter::once(&*sb)
        .chain(forks.iter().map(|f| &**f))
        .collect();
    for s in all {
        if !s.capabilities().contains(C::SNAPSHOT_FORK) {
            must_code(
                s.fork(ForkOptions::new(1)).await.map(|_| ()),
                ErrorCode::CapabilityNotSupported,
            )
            .with_context(|| format!("a second fork of {}", s.id()))?;
        }
    }
    let listed = ctx.listed(&case(name)).await?;
    for id in &ids {
        ensure!(
            listed.iter().any(|m| &m.id == id),
            "{id} is not listed with the trial's metadata: {:?}",
            listed.iter().map(|m| &m.id).collect::<Vec<_>>()
        );
    }
    if let Some(left) = ctx.probes.checkpoints(sb.id()).await? {
        ensure!(
            left.is_empty(),
            "the original keeps checkpoints after the fork: {left:?}"
        );
    }
    for (f, id) in forks.into_iter().zip(ids.iter().skip(1)) {
        f.kill().await?;
        ctx.wait_id_unlisted(&case(name), id, Duration::from_secs(5))
            .await?;
    }
    let got = code(&*sb, "print(x)").await?;
    ensure!(
        got == "1",
        "the original after its forks were killed: {got:?}"
    );
    sb.kill().await
}
