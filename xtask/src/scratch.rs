//! A build directory for image root filesystems, removed when dropped — but never across a
//! mount point: debootstrap mounts /proc and /sys inside its target, and a failed run can
//! leave them mounted. Deleting "through" them would be a disaster, so they are unmounted
//! first and the directory is kept if that fails.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use crate::process;

/// Where rootfs builds happen (on disk: /tmp may be a small tmpfs).
const BUILD_ROOT: &str = "/var/cache/sandbox-rs/build";

/// A fresh directory owned by this process; removed on drop.
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Creates `/var/cache/sandbox-rs/build/<name>-<pid>`, clearing a leftover of that name.
    pub fn new(name: &str) -> Result<Self> {
        let path = Path::new(BUILD_ROOT).join(format!("{name}-{}", std::process::id()));
        let scratch = ScratchDir { path };
        if scratch.path.exists() {
            scratch.remove()?;
        }
        fs::create_dir_all(&scratch.path)?;
        Ok(scratch)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn remove(&self) -> Result<()> {
        for mount in mounts_under(&self.path) {
            // Lazy: a busy mount is detached now and released when its last user goes.
            process::run(Command::new("umount").arg("-l").arg(&mount))?;
        }
        if !mounts_under(&self.path).is_empty() {
            anyhow::bail!("{} still has mounts; not removing it", self.path.display());
        }
        fs::remove_dir_all(&self.path)?;
        Ok(())
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(err) = self.remove() {
            eprintln!(
                "xtask: warning: could not remove {}: {err:#}",
                self.path.display()
            );
        }
    }
}

/// Mount points at or below `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut mounts: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mount_path(field)))
        .filter(|mount| mount.starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    mounts
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mount_path(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(digits) = bytes.get(i + 1..i + 4)
            && let Ok(digits) = std::str::from_utf8(digits)
            && let Ok(code) = u8::from_str_radix(digits, 8)
        {
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mount_path(r"/a\040b"), "/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
    }

    #[test]
    fn root_filesystem_is_not_under_a_scratch_dir() {
        assert!(mounts_under(Path::new("/nonexistent/scratch")).is_empty());
    }
}
