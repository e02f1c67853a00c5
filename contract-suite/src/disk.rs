//! Contract trials: `Resources::disk_mb` (`DISK_LIMIT`) bounds what the sandbox can write.
//!
//! What a declared disk limit promises: the root filesystem is read-only, and each
//! writable place (the workdir and `/tmp`, plus `/dev/shm`; and each volume the image
//! declares, which the adapters' engine tests cover) holds at most `disk_mb` MiB.
//! Root inside the sandbox runs every write here; the file API and the interpreter keep
//! working under the limit.

use std::sync::Arc;

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, CodeOptions, CreateOptions, ErrorCode, Resources};

use crate::ctx::{Ctx, Need, Sbx, must_code, run, run_ok, sbx};

const AREA: &str = "disk";

/// The limit every trial here asks for, in MiB.
const LIMIT_MB: u64 = 8;

/// The writable places a disk limit leaves (the trials' workdir is `/work`).
const SCRATCH: [&str; 3] = ["/work", "/tmp", "/dev/shm"];

/// Places on the root filesystem that must refuse a write (those missing in an image
/// refuse it too, since creating them is a write).
const READ_ONLY: [&str; 9] = [
    "/",
    "/etc",
    "/root",
    "/home",
    "/opt",
    "/usr/local",
    "/var",
    "/var/tmp",
    "/run",
];

/// The trials of this area. Without `DISK_LIMIT` each proves the refusal instead
/// (`CapabilityNotSupported` before anything is provisioned), which needs nothing.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let declared = ctx.caps.contains(C::DISK_LIMIT);
    let run: &[Need] = if declared {
        &[Need::Cap(C::RUN_COMMAND)]
    } else {
        &[]
    };
    let files: &[Need] = if declared {
        &[Need::Cap(C::FILESYSTEM)]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "writes_beyond_the_limit_fail",
            run,
            writes_beyond_the_limit_fail,
        ),
        ctx.trial(AREA, "root_is_read_only", run, root_is_read_only),
        ctx.trial(
            AREA,
            "files_and_code_work_under_the_limit",
            files,
            files_and_code_work_under_the_limit,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

fn limited(ctx: &Ctx, case: &str) -> CreateOptions {
    ctx.opts(case)
        .workdir("/work")
        .resources(Resources::default().disk_mb(LIMIT_MB))
}

/// A sandbox under the limit; `None` when the backend does not declare `DISK_LIMIT` and
/// was just proven to refuse it without provisioning anything.
async fn create(ctx: &Ctx, name: &str) -> anyhow::Result<Option<Sbx>> {
    let c = case(name);
    if ctx.caps.contains(C::DISK_LIMIT) {
        return ctx.create(&c, limited(ctx, &c)).await.map(Some);
    }
    must_code(
        ctx.backend.create(limited(ctx, &c)).await,
        ErrorCode::CapabilityNotSupported,
    )
    .context("a disk limit without DISK_LIMIT")?;
    if ctx.backend.as_reapable().is_some() {
        let left = ctx.listed(&c).await?;
        ensure!(left.is_empty(), "a refused disk limit provisioned {left:?}");
    }
    Ok(None)
}

/// Writing three times the limit into each writable place fails part-way ("No space left
/// on device"), and what landed is at most the limit.
async fn writes_beyond_the_limit_fail(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = create(&ctx, "writes_beyond_the_limit_fail").await? else {
        return Ok(());
    };
    for dir in SCRATCH {
        let file = format!("{dir}/fill");
        let r = run(
            &*sb,
            [
                "dd",
                "if=/dev/zero",
                &format!("of={file}"),
                "bs=1048576",
                &format!("count={}", LIMIT_MB * 3),
            ],
        )
        .await?;
        ensure!(
            r.exit_code != 0,
            "writing {} MiB into {dir} under a {LIMIT_MB} MiB disk limit succeeded",
            LIMIT_MB * 3
        );
        let size: u64 = run_ok(&*sb, ["sh", "-c", "wc -c < \"$1\"", "sh", &file])
            .await?
            .trim()
            .parse()
            .with_context(|| format!("size of {file}"))?;
        ensure!(
            size <= LIMIT_MB * 1024 * 1024,
            "{file} holds {size} bytes under a {LIMIT_MB} MiB limit"
        );
        ensure!(
            size > 0,
            "{dir} took no bytes at all: it is not writable under the limit"
        );
        // Room again for the next place (and for the limit to be per place, not shared
        // with what an earlier place still holds).
        run_ok(&*sb, ["rm", "-f", &file]).await?;
    }
    sb.kill().await
}

/// Nothing outside the writable places takes a write, not even from root.
async fn root_is_read_only(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = create(&ctx, "root_is_read_only").await? else {
        return Ok(());
    };
    run_ok(&*sb, ["sh", "-c", "echo x > /work/control"])
        .await
        .context("the control write into the workdir")?;
    for dir in READ_ONLY {
        let probe = format!("{}/sbx-disk-probe", dir.trim_end_matches('/'));
        let r = run(
            &*sb,
            [
                "sh",
                "-c",
                "mkdir -p \"$(dirname \"$1\")\" && echo x > \"$1\"",
                "sh",
                &probe,
            ],
        )
        .await?;
        ensure!(
            r.exit_code != 0,
            "root wrote {probe} although the disk limit makes the root filesystem read-only"
        );
    }
    sb.kill().await
}

/// The file API (and upload/download, and the interpreter, where declared) work in the
/// writable places; a write elsewhere is an error, never a silent loss.
async fn files_and_code_work_under_the_limit(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let Some(sb) = create(&ctx, "files_and_code_work_under_the_limit").await? else {
        return Ok(());
    };
    let caps = sb.capabilities();
    let fs = sbx(sb.files(), "files()")?;
    for path in ["/work/a.txt", "/work/sub/b.txt", "/tmp/c.txt"] {
        let data = Bytes::from(format!("under the limit: {path}"));
        sbx(fs.write(path, data.clone()).await, &format!("write {path}"))?;
        let back = sbx(fs.read(path).await, &format!("read {path}"))?;
        ensure!(back == data, "{path} read back {back:?}");
    }
    ensure!(
        fs.write("/etc/sbx-disk-probe", Bytes::from("x"))
            .await
            .is_err(),
        "a write to /etc succeeded on a read-only root filesystem"
    );
    if caps.contains(C::UPLOAD_DOWNLOAD) {
        let dir = tempfile::tempdir()?;
        let src = dir.path().join("in");
        std::fs::create_dir(&src)?;
        std::fs::write(src.join("f.txt"), "uploaded")?;
        sbx(fs.upload(&src, "/work/in").await, "upload into /work")?;
        let back = dir.path().join("back");
        sbx(fs.download("/work/in", &back).await, "download from /work")?;
        let got = std::fs::read_to_string(back.join("f.txt")).context("downloaded file")?;
        ensure!(got == "uploaded", "round trip through /work gave {got:?}");
    }
    if caps.contains(C::STATEFUL_CODE) {
        let code = "open('/work/py.txt', 'w').write('py')\nprint(open('/work/py.txt').read())";
        let r = sbx(
            sb.run_code(code, CodeOptions::default().context("disk"))
                .await,
            "run_code",
        )?;
        ensure!(
            r.stdout_text().trim() == "py",
            "the interpreter under a disk limit: {r:?}"
        );
    }
    sb.kill().await
}
