//! The engine's own CLI (`docker` / `podman`), which the trials use to look at, prepare or
//! clean up the engine independently of the adapter under test.

use std::process::{Command, Stdio};

/// Runs the engine CLI `cli` with `args`, its output discarded: whether it ran and
/// succeeded.
pub fn cli_succeeds(cli: &str, args: &[&str]) -> bool {
    Command::new(cli)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `cmd`; its trimmed stdout, or a panic naming the command and its stderr.
pub fn cli_out(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Removes `image` from the engine (the tag, and the image when no other tag holds it).
pub fn remove_image(cli: &str, image: &str) {
    cli_succeeds(cli, &["rmi", "-f", image]);
}

/// Whether the engine holds `image`.
pub fn image_present(cli: &str, image: &str) -> bool {
    cli_succeeds(cli, &["image", "inspect", image])
}

/// Images a test may pull, removed when it starts (leftovers of an earlier run) and
/// again when this is dropped, also when the test fails.
#[derive(Debug)]
pub struct ImageCleanup {
    cli: &'static str,
    images: Vec<String>,
}

impl ImageCleanup {
    /// Removes `images` now, and again when dropped.
    pub fn new(cli: &'static str, images: Vec<String>) -> ImageCleanup {
        for i in &images {
            remove_image(cli, i);
        }
        ImageCleanup { cli, images }
    }
}

impl Drop for ImageCleanup {
    fn drop(&mut self) {
        for i in &self.images {
            remove_image(self.cli, i);
        }
    }
}
