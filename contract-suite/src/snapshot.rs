//! Contract trials: filesystem snapshots (`SNAPSHOT`).
//!
//! What a declared `SNAPSHOT` promises: `snapshot` turns a sandbox's files at that
//! instant into a template `create` accepts — the files written and the programs
//! installed are there, the secrets the sandbox was created with are not (nowhere in the
//! new sandbox's environment, nor in the snapshot's record); the backend lists the
//! snapshot and removes it, after which it is gone; and the original sandbox goes on
//! as before, its later changes not in the template (paused, it stays paused). Without
//! `SNAPSHOT` each trial proves the refusal instead (`CapabilityNotSupported`).
//!
//! Every trial removes the snapshots it makes, also when it fails.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, ErrorCode, RunOptions, Snapshot};

use crate::ctx::{Ctx, Need, Sbx, must_code, run, run_ok, sbx, token};

const AREA: &str = "snapshot";

/// A file written into the workdir before the snapshot.
const NOTE: &str = "/work/snapshot-note.txt";
/// A "program installed" before the snapshot, outside the workdir.
const TOOL: &str = "/usr/local/bin/sbx-snapshot-tool";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let needs: &[Need] = if ctx.caps.contains(C::SNAPSHOT) {
        &[Need::Cap(C::RUN_COMMAND | C::FILESYSTEM), Need::Reapable]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "a_template_starts_with_the_files_and_without_the_secrets",
            needs,
            a_template_starts_with_the_files_and_without_the_secrets,
        ),
        ctx.trial(
            AREA,
            "snapshots_are_listed_and_removable",
            needs,
            snapshots_are_listed_and_removable,
        ),
        ctx.trial(
            AREA,
            "the_original_goes_on_after_a_snapshot",
            needs,
            the_original_goes_on_after_a_snapshot,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// A sandbox for a snapshot trial created with `opts`; `None` when the backend does not
/// declare `SNAPSHOT` and `snapshot` was just proven refused.
async fn sandbox(
    ctx: &Ctx,
    name: &str,
    opts: sandbox_core::CreateOptions,
) -> anyhow::Result<Option<Sbx>> {
    let sb = ctx.create(&case(name), opts).await?;
    if sb.capabilities().contains(C::SNAPSHOT) {
        return Ok(Some(sb));
    }
    ensure!(
        !ctx.caps.contains(C::SNAPSHOT),
        "the backend declares SNAPSHOT but this sandbox does not"
    );
    must_code(sb.snapshot().await, ErrorCode::CapabilityNotSupported).context("snapshot")?;
    sb.kill().await?;
    Ok(None)
}

/// Runs `body`, then removes the snapshot whatever `body` returned.
async fn removing(
    ctx: &Ctx,
    snap: &Snapshot,
    body: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let template = &snap.template;
    let r = body.await;
    // A failed body dropped its copies: their kills finish in the background within the
    // teardown grace, and until then the engine refuses to remove the image they use.
    // Retrying that long keeps a failed trial from also leaking its snapshot.
    let deadline = tokio::time::Instant::now()
        + sandbox_core::teardown::teardown_grace()
        + std::time::Duration::from_secs(5);
    let removed = loop {
        let removed = ctx.reaper()?.remove_snapshot(template).await;
        if removed.is_ok() || tokio::time::Instant::now() >= deadline {
            break removed;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    match (r, removed) {
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => bail!("removing snapshot {template}: {}", e.render()),
        (Ok(()), Ok(_)) => Ok(()),
    }
}

/// Writes the note and the tool into `sb`.
async fn write_files(sb: &Sbx, note: &str) -> anyhow::Result<()> {
    let files = sbx(sb.files(), "files")?;
    sbx(
        files.mkdir("/usr/local/bin", true).await,
        "mkdir /usr/local/bin",
    )?;
    sbx(
        files.write(NOTE, Bytes::from(note.to_string())).await,
        "write the note",
    )?;
    sbx(
        files
            .write(TOOL, Bytes::from_static(b"#!/bin/sh\necho tool\n"))
            .await,
        "write the tool",
    )?;
    Ok(())
}

/// A sandbox created from the snapshot has the files written and the program installed
/// before it; the secret the original was created with (and saw in its commands) is not
/// in the new sandbox's environment and not in the snapshot's record.
async fn a_template_starts_with_the_files_and_without_the_secrets(
    ctx: Arc<Ctx>,
) -> anyhow::Result<()> {
    let name = "a_template_starts_with_the_files_and_without_the_secrets";
    let secret = token("snapshot-secret-");
    let opts = ctx
        .opts(&case(name))
        .secret("SBX_SNAPSHOT_SECRET", secret.clone());
    let Some(sb) = sandbox(&ctx, name, opts).await? else {
        return Ok(());
    };
    let seen = run_ok(&*sb, ["printenv", "SBX_SNAPSHOT_SECRET"]).await?;
    ensure!(
        seen.trim() == secret,
        "the secret did not reach the original: {seen:?}"
    );
    let note = token("note-");
    write_files(&sb, &note).await?;
    let snap = sbx(sb.snapshot().await, "snapshot")?;
    // The kill inside `removing`: a failed kill must not leave the snapshot's image.
    removing(&ctx, &snap, async {
        sb.kill().await?;
        ensure!(
            !format!("{snap:?}").contains(&secret),
            "the snapshot's record carries the secret: {snap:?}"
        );
        let opts = ctx.opts(&case(name)).template(snap.template.clone());
        let copy = ctx
            .create(&case(name), opts)
            .await
            .context("create from the snapshot")?;
        let files = sbx(copy.files(), "files")?;
        let got = sbx(files.read(NOTE).await, "read the note from the copy")?;
        ensure!(got == note.as_bytes(), "the note in the copy: {got:?}");
        let tool = sbx(files.read(TOOL).await, "read the tool from the copy")?;
        ensure!(
            tool.starts_with(b"#!/bin/sh"),
            "the tool in the copy: {tool:?}"
        );
        let env = run(&*copy, ["printenv", "SBX_SNAPSHOT_SECRET"]).await?;
        ensure!(
            env.exit_code != 0 && !String::from_utf8_lossy(&env.stdout).contains(&secret),
            "the copy sees the original's secret: exit {}, {:?}",
            env.exit_code,
            String::from_utf8_lossy(&env.stdout)
        );
        copy.kill().await
    })
    .await
}

/// The backend lists a snapshot (by its template, naming the sandbox it was made from)
/// until it is removed; removed, it is listed no more, a second removal says it was
/// gone, and `create` from it fails.
async fn snapshots_are_listed_and_removable(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let name = "snapshots_are_listed_and_removable";
    let Some(sb) = sandbox(&ctx, name, ctx.opts(&case(name))).await? else {
        return Ok(());
    };
    let snap = sbx(sb.snapshot().await, "snapshot")?;
    let source = sb.id().to_string();
    let reaper = ctx.reaper()?;
    let template = snap.template.clone();
    let listed = removing(&ctx, &snap, async {
        sb.kill().await?;
        let all = sbx(reaper.list_snapshots().await, "list snapshots")?;
        let found = all.iter().find(|s| s.template == snap.template);
        let Some(found) = found else {
            bail!("snapshot {} is not listed: {all:?}", snap.template);
        };
        ensure!(
            found.source == source,
            "listed with source {:?}, made from {source}",
            found.source
        );
        Ok(())
    })
    .await;
    listed?;
    let all = sbx(reaper.list_snapshots().await, "list snapshots")?;
    ensure!(
        all.iter().all(|s| s.template != template),
        "snapshot {template} still listed after removal"
    );
    ensure!(
        !sbx(reaper.remove_snapshot(&template).await, "remove again")?,
        "a second removal of {template} reported a removal"
    );
    let opts = ctx.opts(&case(name)).template(template.clone());
    match ctx.backend.create(opts).await {
        Ok(sb) => {
            let _ = sb.kill().await;
            bail!("create from the removed snapshot {template} succeeded")
        }
        Err(_) => Ok(()),
    }
}

/// After a snapshot the sandbox runs commands and reads its files at once; what it
/// writes after the snapshot is not in the template (the snapshot is one instant). A
/// paused sandbox can be snapshotted and stays paused.
async fn the_original_goes_on_after_a_snapshot(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let name = "the_original_goes_on_after_a_snapshot";
    let Some(sb) = sandbox(&ctx, name, ctx.opts(&case(name))).await? else {
        return Ok(());
    };
    let note = token("note-");
    write_files(&sb, &note).await?;
    let snap = sbx(sb.snapshot().await, "snapshot")?;
    let r = removing(&ctx, &snap, async {
        let out = run_ok(&*sb, ["echo", "still-here"])
            .await
            .context("run after the snapshot")?;
        ensure!(out.contains("still-here"), "after the snapshot: {out:?}");
        let files = sbx(sb.files(), "files")?;
        let got = sbx(files.read(NOTE).await, "read after the snapshot")?;
        ensure!(
            got == note.as_bytes(),
            "the note after the snapshot: {got:?}"
        );
        sbx(
            files
                .write("/work/after.txt", Bytes::from_static(b"later"))
                .await,
            "write after the snapshot",
        )?;
        let opts = ctx.opts(&case(name)).template(snap.template.clone());
        let copy = ctx
            .create(&case(name), opts)
            .await
            .context("create from the snapshot")?;
        let later = sbx(copy.files(), "files")?.read("/work/after.txt").await;
        must_code(later, ErrorCode::PathNotFound)
            .context("a file written after the snapshot is in the template")?;
        copy.kill().await
    })
    .await;
    r?;
    if sb.capabilities().contains(C::PAUSE_RESUME) {
        sbx(sb.pause().await, "pause")?;
        let snap = sbx(sb.snapshot().await, "snapshot while paused")?;
        removing(&ctx, &snap, async {
            // Still paused: refused at once (`SandboxPaused`), or, without the core layer
            // in front, frozen (no answer) — a command that completes means it was thawed.
            let paused_run = sb.run(["true"].into(), RunOptions::default());
            match tokio::time::timeout(Duration::from_secs(2), paused_run).await {
                Err(_) => {}
                Ok(r) => {
                    must_code(r, ErrorCode::SandboxPaused)
                        .context("a command after a snapshot of a paused sandbox")?;
                }
            }
            sbx(sb.resume().await, "resume")?;
            run_ok(&*sb, ["true"]).await.map(|_| ())
        })
        .await?;
    }
    sb.kill().await
}
