//! The transfer caps a user configures are the ones enforced: an adapter's `read_cap` and
//! `download_caps` reach the container layer, for `read` and `download` (a cap lost on
//! the way would silently fall back to the default).

use std::path::PathBuf;

use sandbox_core::{Backend, ErrorCode, SandboxExt};

use crate::tagged::test_options;

/// The `read_cap` and download byte cap the backend under test is configured with.
pub const CAPPED_BYTES: u64 = 1024 * 1024;
/// The download entry cap the backend under test is configured with.
pub const CAPPED_ENTRIES: u64 = 5;

/// A local directory removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Asserts `e` is `ResourceLimitExceeded` naming `cap` (the configured number).
fn refused_naming(e: &sandbox_core::SandboxError, cap: u64) {
    assert_eq!(e.code(), ErrorCode::ResourceLimitExceeded, "{}", e.render());
    assert!(
        e.to_string().contains(&cap.to_string()),
        "names the configured cap: {e}"
    );
}

/// With `b` configured with [`CAPPED_BYTES`] / [`CAPPED_ENTRIES`]: a 2 MiB file is
/// refused by `read` and `download` naming the configured cap, a 9-entry directory by
/// `download`, nothing is left on the host, and a small file still passes both ways.
pub async fn configured_caps_apply(b: &dyn Backend, template: &str) {
    let s = b
        .create(test_options(template, "configured-caps"))
        .await
        .expect("create");
    let r = s
        .exec(
            "head -c 2097152 /dev/zero > /work/big && head -c 1000 /dev/zero > /work/small \
             && mkdir /work/many && for i in 1 2 3 4 5 6 7 8; do : > /work/many/f$i; done \
             && echo ok",
        )
        .await
        .expect("prepare");
    assert_eq!(r.stdout_text(), "ok\n", "{r:?}");
    let files = s.files().expect("files");

    let e = files
        .read("/work/big")
        .await
        .expect_err("over the read cap");
    refused_naming(&e, CAPPED_BYTES);
    assert_eq!(
        files.read("/work/small").await.expect("small read").len(),
        1000
    );

    let dir = std::env::temp_dir().join(format!(
        "sbx-caps-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let scratch = Scratch(dir);
    let big = scratch.0.join("big");
    let e = files
        .download("/work/big", &big)
        .await
        .expect_err("over the download cap");
    refused_naming(&e, CAPPED_BYTES);
    assert!(
        e.hint().contains("download_cap"),
        "names the knob: {}",
        e.hint()
    );
    let many = scratch.0.join("many");
    let e = files
        .download("/work/many", &many)
        .await
        .expect_err("over the entry cap");
    refused_naming(&e, CAPPED_ENTRIES);
    let left: Vec<_> = std::fs::read_dir(&scratch.0)
        .expect("scratch listing")
        .flatten()
        .map(|d| d.file_name())
        .collect();
    assert!(left.is_empty(), "refused downloads left {left:?}");
    let small = scratch.0.join("small");
    files
        .download("/work/small", &small)
        .await
        .expect("small download");
    assert_eq!(std::fs::metadata(&small).expect("small").len(), 1000);
    s.kill().await.expect("kill");
}
