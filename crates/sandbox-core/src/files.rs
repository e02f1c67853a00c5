//! The sandbox filesystem port.

use std::path::Path;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{Result, SandboxError};

/// Metadata of one sandbox path.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct FileInfo {
    /// File name (last path component).
    pub name: String,
    /// Absolute sandbox path.
    pub path: String,
    /// Size in bytes (0 for directories where unknown).
    pub size: u64,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Unix permission bits.
    pub mode: u32,
    /// Last modification time, when known.
    pub modified: Option<SystemTime>,
}

impl FileInfo {
    /// A `FileInfo`.
    pub fn new(
        path: impl Into<String>,
        size: u64,
        is_dir: bool,
        mode: u32,
        modified: Option<SystemTime>,
    ) -> Self {
        let path = path.into();
        let name = path
            .rsplit('/')
            .find(|s| !s.is_empty())
            .unwrap_or("/")
            .to_string();
        FileInfo {
            name,
            path,
            size,
            is_dir,
            mode,
            modified,
        }
    }
}

/// Files inside a sandbox. All paths are sandbox-internal; relative paths resolve against
/// the same workdir as `run`. Reads are binary-safe; large transfers stream.
#[async_trait]
pub trait FileSystem: Send + Sync {
    /// Reads a whole file. Missing → `PathNotFound`; a directory → `IsADirectory`.
    async fn read(&self, path: &str) -> Result<Bytes>;
    /// Writes (creates or replaces) a file, creating parent directories.
    async fn write(&self, path: &str, data: Bytes) -> Result<()>;
    /// Copies a host file or directory into the sandbox (streamed, bounded memory).
    async fn upload(&self, local: &Path, remote: &str) -> Result<()>;
    /// Copies a sandbox file or directory to the host (streamed, bounded memory). Entries
    /// that would land outside `local` are refused with `UnsafeArchiveEntry`.
    async fn download(&self, remote: &str, local: &Path) -> Result<()>;
    /// Lists a directory.
    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>>;
    /// Creates a directory; with `parents`, like `mkdir -p`.
    async fn mkdir(&self, path: &str, parents: bool) -> Result<()>;
    /// Removes a file or a directory tree. Missing → `PathNotFound`.
    async fn remove(&self, path: &str) -> Result<()>;
    /// Metadata of one path. Missing → `PathNotFound`.
    async fn stat(&self, path: &str) -> Result<FileInfo>;
}

/// Resolves a sandbox path against `workdir` and normalises `.` and `..` lexically
/// (never above `/`). Adapters use this so `run` and `files` agree on relative paths.
pub fn resolve_path(workdir: &str, path: &str) -> Result<String> {
    if path.is_empty() || path.contains('\0') {
        return Err(SandboxError::FileSystem {
            path: path.to_string(),
            message: "empty path or NUL byte".into(),
            source: None,
        });
    }
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{}", workdir.trim_end_matches('/'), path)
    };
    let mut parts: Vec<&str> = Vec::new();
    for seg in joined.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_relative_against_workdir() {
        assert_eq!(resolve_path("/work", "a.txt").unwrap(), "/work/a.txt");
        assert_eq!(resolve_path("/work/", "./d/../b").unwrap(), "/work/b");
        assert_eq!(resolve_path("/work", "/etc/x").unwrap(), "/etc/x");
        assert_eq!(resolve_path("/work", "../../..").unwrap(), "/");
        assert!(resolve_path("/work", "").is_err());
    }

    #[test]
    fn file_info_name() {
        assert_eq!(
            FileInfo::new("/work/a.txt", 1, false, 0o644, None).name,
            "a.txt"
        );
        assert_eq!(FileInfo::new("/", 0, true, 0o755, None).name, "/");
    }
}
