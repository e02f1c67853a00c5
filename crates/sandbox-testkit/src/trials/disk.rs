//! What the engine itself would keep on its disk for a sandbox, past `Resources::disk_mb`:
//! an anonymous volume for each `VOLUME` the image declares, and a log of everything PID 1
//! writes (which root inside reaches through `/proc/1/fd/1`, also on the exec path). The
//! engine CLI (`docker`, `podman --remote`, run through `sh -c`) builds the image with a
//! declared volume and reads what the engine kept.

use std::process::{Command, Stdio};

use sandbox_core::{Backend, Resources, SandboxExt};

use crate::tagged::test_options;

/// The image the volume trials build `FROM` the busybox test image, with `VOLUME /data`;
/// each trial tags its own (`:bounded`, `:removed`), since trials run in parallel and one
/// removes its image when it ends.
pub const VOLUME_IMAGE: &str = "sandbox-rs/busybox-volume";

/// The disk limit the volume trial asks for, in MiB.
const LIMIT_MB: u64 = 8;

/// `cli args` through `sh -c` (the CLI may carry flags: `podman --remote`): success and
/// stdout.
fn sh(cli: &str, args: &str) -> (bool, String) {
    let out = Command::new("sh")
        .args(["-c", &format!("{cli} {args}")])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run sh -c '{cli} {args}': {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

/// [`VOLUME_IMAGE`], built now and removed when dropped (also when the trial fails).
struct VolumeImage {
    cli: String,
    /// `VOLUME_IMAGE:<tag>`.
    name: String,
}

impl VolumeImage {
    fn build(cli: &str, base: &str, tag: &str) -> VolumeImage {
        let image = VolumeImage {
            cli: cli.to_string(),
            name: format!("{VOLUME_IMAGE}:{tag}"),
        };
        let dir =
            std::env::temp_dir().join(format!("sbx-volume-image-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("build context");
        std::fs::write(
            dir.join("Dockerfile"),
            format!("FROM {base}\nVOLUME /data\n"),
        )
        .expect("Dockerfile");
        let (built, _) = sh(
            cli,
            &format!("build -q -t {} {}", image.name, dir.display()),
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert!(built, "{cli} build of {} FROM {base} failed", image.name);
        image
    }
}

impl Drop for VolumeImage {
    fn drop(&mut self) {
        sh(&self.cli, &format!("rmi -f {}", self.name));
    }
}

/// Under `disk_mb`, a volume the image declares is a bounded RAM-backed scratch
/// filesystem, not an anonymous volume on the engine's disk: root writing three times
/// the limit into it fails part-way, and at most the limit lands. `base` is the busybox
/// test image; `b` any backend of the engine `cli` drives.
pub async fn an_image_volume_is_bounded_scratch(b: &dyn Backend, cli: &str, base: &str) {
    let image = VolumeImage::build(cli, base, "bounded");
    let s = b
        .create(
            test_options(&image.name, "disk-image-volume")
                .workdir("/work")
                .resources(Resources::default().disk_mb(LIMIT_MB)),
        )
        .await
        .expect("create from an image with a declared volume");
    let fs = s
        .exec([
            "sh",
            "-c",
            "awk '$2 == \"/data\" { print $3 }' /proc/mounts",
        ])
        .await
        .expect("mounts");
    let r = s
        .exec(format!(
            "dd if=/dev/zero of=/data/fill bs=1048576 count={} 2>&1; echo exit=$?; \
             du -k /data/fill | cut -f1",
            LIMIT_MB * 3
        ))
        .await
        .expect("fill /data");
    let out = r.stdout_text();
    let kib: u64 = out
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(u64::MAX);
    s.kill().await.expect("kill");
    assert_eq!(
        fs.stdout_text().trim(),
        "tmpfs",
        "/data must be a RAM-backed scratch filesystem, not a volume on the engine's disk"
    );
    assert!(
        !out.contains("exit=0"),
        "writing {} MiB into a declared volume under a {LIMIT_MB} MiB disk limit succeeded: {out}",
        LIMIT_MB * 3
    );
    assert!(
        kib <= LIMIT_MB * 1024,
        "{kib} KiB landed in /data under a {LIMIT_MB} MiB limit: {out}"
    );
}

/// Without `disk_mb` a volume the image declares is the engine's own anonymous volume (no
/// limit applies, as documented), but it goes with the sandbox: after `kill` the engine
/// no longer holds it.
pub async fn an_image_volume_goes_with_its_sandbox(b: &dyn Backend, cli: &str, base: &str) {
    let image = VolumeImage::build(cli, base, "removed");
    let s = b
        .create(test_options(&image.name, "disk-image-volume-removed"))
        .await
        .expect("create from an image with a declared volume");
    let id = s.id().to_string();
    let (_, names) = sh(
        cli,
        &format!(
            "inspect -f '{{{{range .Mounts}}}}{{{{if eq .Destination \"/data\"}}}}{{{{.Name}}}}{{{{end}}}}{{{{end}}}}' {id}"
        ),
    );
    s.kill().await.expect("kill");
    assert!(!names.is_empty(), "the engine made no volume at /data");
    // The engine's own cleanup of an exited container may finish just after `kill`.
    let mut left = true;
    for _ in 0..50 {
        left = sh(cli, &format!("volume inspect {names}")).0;
        if !left {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if left {
        sh(cli, &format!("volume rm -f {names}"));
    }
    assert!(
        !left,
        "volume {names} of a removed sandbox stays on the engine's disk"
    );
}

/// With the agent off (`b` on the engine's exec path), root writing to PID 1's output
/// leaves nothing in the engine: log driver `none`, and no log to read. `base` is the
/// busybox test image.
pub async fn pid1_output_is_not_logged_on_the_exec_path(b: &dyn Backend, cli: &str, base: &str) {
    let s = b
        .create(test_options(base, "disk-no-log"))
        .await
        .expect("create");
    let r = s
        .exec("for i in 1 2 3 4 5 6 7 8; do echo leaked-into-the-engine-log > /proc/1/fd/1; done; echo done")
        .await
        .expect("write to PID 1's stdout");
    assert_eq!(r.stdout_text(), "done\n", "{r:?}");
    let id = s.id().to_string();
    let (_, driver) = sh(
        cli,
        &format!("inspect -f '{{{{.HostConfig.LogConfig.Type}}}}' {id}"),
    );
    let (_, logs) = sh(cli, &format!("logs {id} 2>/dev/null"));
    s.kill().await.expect("kill");
    assert_eq!(driver, "none", "the engine logs PID 1's output");
    assert!(
        !logs.contains("leaked-into-the-engine-log"),
        "the engine kept PID 1's output: {logs}"
    );
}
