//! `cargo xtask agent [--check]`: builds the static in-sandbox agent (`sandbox-agent`) for
//! x86_64 Linux, checks that it really is static (no ELF interpreter, so it runs in any
//! image, busybox and distroless included), and copies it to
//! `crates/sandbox-agent/prebuilt/x86_64/sandbox-agent`, the bytes the library embeds.
//! `--check` rebuilds and fails when the committed binary differs from its source.
//!
//! It builds into its own target directory: the static-CRT flag changes every crate's
//! fingerprint, and sharing `target/` would rebuild the workspace's host artifacts.
//!
//! The build is reproducible so that the check can compare bytes: paths are remapped
//! (the checkout and the cargo home would otherwise be embedded in panic locations),
//! one codegen unit, fat LTO, stripped, `--locked`; nothing embeds a time. The toolchain
//! is part of the input: a different rustc produces different bytes, and the check says
//! which rustc it used.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::process;

/// The only target shipped so far (see docs/agent.md for arm64).
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Where the binary lands, relative to the workspace root.
pub fn artifact(root: &Path) -> PathBuf {
    root.join("target/agent")
        .join(TARGET)
        .join("release/sandbox-agent")
}

/// The committed binary, relative to the workspace root.
pub const PREBUILT: &str = "crates/sandbox-agent/prebuilt/x86_64/sandbox-agent";

/// Builds the agent; with `check`, compares it with the committed binary instead of
/// replacing it.
pub fn run(check: bool) -> Result<()> {
    let root = workspace_root();
    let bytes = build(&root)?;
    let prebuilt = root.join(PREBUILT);
    if check {
        let committed =
            std::fs::read(&prebuilt).with_context(|| format!("reading {}", prebuilt.display()))?;
        if committed != bytes {
            bail!(
                "{} ({} bytes) differs from a fresh build of its source ({} bytes, {}): \
                 run `cargo xtask agent` and commit the result",
                prebuilt.display(),
                committed.len(),
                bytes.len(),
                rustc_version()
            );
        }
        println!(
            "sandbox-agent: {} matches its source ({} bytes, {})",
            prebuilt.display(),
            bytes.len(),
            rustc_version()
        );
        return Ok(());
    }
    if let Some(dir) = prebuilt.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&prebuilt, &bytes).with_context(|| format!("writing {}", prebuilt.display()))?;
    println!("sandbox-agent: copied to {}", prebuilt.display());
    Ok(())
}

fn rustc_version() -> String {
    process::stdout_of(std::process::Command::new("rustc").arg("--version"))
        .unwrap_or_else(|_| "rustc version unknown".into())
}

/// `$CARGO_HOME`, else `~/.cargo`: where registry sources live (remapped away).
fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
}

/// The reproducible rustflags: static CRT, and every host-specific path remapped.
fn rustflags(root: &Path) -> String {
    let mut flags = vec![
        "-C target-feature=+crt-static".to_string(),
        format!("--remap-path-prefix={}=/sandbox-rs", root.display()),
    ];
    if let Some(home) = cargo_home() {
        flags.push(format!("--remap-path-prefix={}=/cargo", home.display()));
    }
    flags.join(" ")
}

fn build(root: &Path) -> Result<Vec<u8>> {
    let mut cmd = process::cargo();
    cmd.current_dir(root)
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "sandbox-rs-agent",
            "--bin",
            "sandbox-agent",
        ])
        // The client (tokio) is host-side only; the agent is plain std threads.
        .arg("--no-default-features")
        .args(["--target", TARGET])
        .arg("--target-dir")
        .arg(root.join("target/agent"))
        // Size: stripped, one codegen unit, fat LTO. Panics keep unwinding: a panicking
        // worker thread must not take PID 1 (and so the whole sandbox) down.
        .args(["--config", "profile.release.strip=true"])
        .args(["--config", "profile.release.lto=true"])
        .args(["--config", "profile.release.codegen-units=1"])
        .args(["--config", "profile.release.opt-level=\"s\""])
        .args(["--config", "profile.release.debug=false"])
        .args(["--config", "profile.release.incremental=false"])
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("RUSTFLAGS", rustflags(root));
    process::run(&mut cmd)?;
    let bin = artifact(root);
    let bytes = std::fs::read(&bin).with_context(|| format!("reading {}", bin.display()))?;
    if has_interpreter(&bytes)? {
        bail!(
            "{} is dynamically linked (it has an ELF interpreter)",
            bin.display()
        );
    }
    println!(
        "sandbox-agent: {} ({} bytes, {:.2} MiB, static, stripped)",
        bin.display(),
        bytes.len(),
        bytes.len() as f64 / (1024.0 * 1024.0)
    );
    Ok(bytes)
}

fn workspace_root() -> PathBuf {
    // xtask lives in <root>/xtask.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Whether a 64-bit little-endian ELF has a PT_INTERP program header (dynamic linking).
fn has_interpreter(elf: &[u8]) -> Result<bool> {
    let field = |off: usize, len: usize| -> Result<u64> {
        let b = elf.get(off..off + len).context("truncated ELF header")?;
        let mut v = [0u8; 8];
        v[..len].copy_from_slice(b);
        Ok(u64::from_le_bytes(v))
    };
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        bail!("not a 64-bit little-endian ELF file");
    }
    let phoff = field(0x20, 8)? as usize;
    let phentsize = field(0x36, 2)? as usize;
    let phnum = field(0x38, 2)? as usize;
    for i in 0..phnum {
        const PT_INTERP: u64 = 3;
        if field(phoff + i * phentsize, 4)? == PT_INTERP {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_test_binary_is_recognised_as_dynamic() {
        // Test binaries are linked against the host's libc dynamically.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(has_interpreter(&me).unwrap());
        assert!(has_interpreter(b"not an elf").is_err());
    }
}
