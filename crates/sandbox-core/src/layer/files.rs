//! The file system of a wrapped sandbox: each call is gated (a path no call could mean, a
//! killed sandbox, `UPLOAD_DOWNLOAD` for transfers), spanned and audited with the bytes it
//! moved, then forwarded to the adapter's file system.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tracing::Instrument as _;

use crate::{Capability, FileInfo, FileSystem, Result, SandboxError};

use super::op::op_span;
use super::shared::Shared;

/// The file system of a wrapped sandbox: each call is gated, spanned and audited, then
/// forwarded to the adapter's file system.
pub(super) struct EnforcedFiles {
    shared: Arc<Shared>,
}

impl EnforcedFiles {
    /// The file system of the wrapped sandbox whose state is `shared`.
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        EnforcedFiles { shared }
    }

    fn inner(&self) -> Result<&dyn FileSystem> {
        self.shared.alive()?;
        self.shared.inner.files()
    }
}

/// Refuses a path no file system call could mean, before the adapter sees it.
fn check_path(path: &str) -> Result<()> {
    if path.is_empty() || path.contains('\0') {
        return Err(SandboxError::file_system(path, "empty path or NUL byte"));
    }
    Ok(())
}

/// One file operation: its path checked, spanned and audited, with the bytes it moved.
macro_rules! file_op {
    ($self:ident, $name:literal, $path:expr, $body:expr, $bytes:expr) => {{
        let s = &$self.shared;
        let span = op_span!($name, s.backend, s.tier);
        let mut op = s.op(span.clone(), $name).path(&s.redactor, $path);
        async move {
            let r = match check_path($path) {
                Ok(()) => $body.await,
                Err(e) => Err(e),
            };
            if let Ok(v) = &r {
                if let Some(n) = ($bytes)(v) {
                    op.bytes(n);
                }
            }
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }};
}

#[async_trait]
impl FileSystem for EnforcedFiles {
    async fn read(&self, path: &str) -> Result<Bytes> {
        file_op!(
            self,
            "sandbox.files.read",
            path,
            async { self.inner()?.read(path).await },
            |b: &Bytes| Some(b.len() as u64)
        )
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        let n = data.len() as u64;
        file_op!(
            self,
            "sandbox.files.write",
            path,
            async { self.inner()?.write(path, data).await },
            |_: &()| Some(n)
        )
    }

    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        file_op!(
            self,
            "sandbox.files.upload",
            remote,
            async {
                self.shared.require(Capability::UPLOAD_DOWNLOAD)?;
                self.inner()?.upload(local, remote).await
            },
            |_: &()| local_size(local)
        )
    }

    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        file_op!(
            self,
            "sandbox.files.download",
            remote,
            async {
                self.shared.require(Capability::UPLOAD_DOWNLOAD)?;
                self.inner()?.download(remote, local).await
            },
            |_: &()| local_size(local)
        )
    }

    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        file_op!(
            self,
            "sandbox.files.ls",
            path,
            async { self.inner()?.ls(path).await },
            |_: &Vec<FileInfo>| None
        )
    }

    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        file_op!(
            self,
            "sandbox.files.mkdir",
            path,
            async { self.inner()?.mkdir(path, parents).await },
            |_: &()| None
        )
    }

    async fn remove(&self, path: &str) -> Result<()> {
        file_op!(
            self,
            "sandbox.files.remove",
            path,
            async { self.inner()?.remove(path).await },
            |_: &()| None
        )
    }

    async fn stat(&self, path: &str) -> Result<FileInfo> {
        file_op!(
            self,
            "sandbox.files.stat",
            path,
            async { self.inner()?.stat(path).await },
            |_: &FileInfo| None
        )
    }
}

/// Size of a host file, or of the files under a host directory (what was moved).
fn local_size(path: &Path) -> Option<u64> {
    fn walk(p: &Path, depth: usize) -> u64 {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return 0;
        };
        if meta.is_file() {
            return meta.len();
        }
        if !meta.is_dir() || depth > 64 {
            return 0;
        }
        std::fs::read_dir(p)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| walk(&e.path(), depth + 1))
                    .sum()
            })
            .unwrap_or(0)
    }
    std::fs::symlink_metadata(path).ok()?;
    Some(walk(path, 0))
}
