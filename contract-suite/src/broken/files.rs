//! The flaws of a broken sandbox's file system: reads that are not refused (a directory,
//! a file past the cap), `mkdir` that always makes parents, `stat` that loses the mode or
//! the time, listings split on newlines, uploads that follow links out of the tree,
//! downloads that unpack escaping links.

use std::path::Path;

use async_trait::async_trait;
use bytes::Bytes;
use sandbox_core::{ErrorCode, FileInfo, FileSystem, Result, SandboxError};

use super::flaw::Flaw;
use super::sandbox::BrokenSandbox;

/// Copies the tree at `from` to `to`, following every symlink (what `UploadFollowsLinks`
/// uploads).
fn copy_dereferenced(from: &Path, to: &Path) -> std::io::Result<()> {
    if std::fs::metadata(from)?.is_dir() {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            copy_dereferenced(&e.path(), &to.join(e.file_name()))?;
        }
        Ok(())
    } else {
        std::fs::copy(from, to).map(|_| ())
    }
}

#[async_trait]
impl FileSystem for BrokenSandbox {
    async fn read(&self, path: &str) -> Result<Bytes> {
        match self.inner.files()?.read(path).await {
            Err(e)
                if self.flaw == Flaw::UncappedRead
                    && e.code() == ErrorCode::ResourceLimitExceeded =>
            {
                Ok(Bytes::new())
            }
            Err(e)
                if self.flaw == Flaw::ReadDirReturnsData && e.code() == ErrorCode::IsADirectory =>
            {
                Ok(Bytes::new())
            }
            r => r,
        }
    }
    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        self.inner.files()?.write(path, data).await
    }
    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        if self.flaw == Flaw::UploadFollowsLinks && local.is_dir() {
            // Uploads a copy in which every symlink is replaced by what it points at.
            let copy =
                tempfile::tempdir().map_err(|e| SandboxError::engine("broken", e.to_string()))?;
            let root = copy.path().join("tree");
            copy_dereferenced(local, &root)
                .map_err(|e| SandboxError::engine("broken", e.to_string()))?;
            return self.inner.files()?.upload(&root, remote).await;
        }
        self.inner.files()?.upload(local, remote).await
    }
    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        match self.inner.files()?.download(remote, local).await {
            Err(e)
                if self.flaw == Flaw::UnsafeUnpack && e.code() == ErrorCode::UnsafeArchiveEntry =>
            {
                // Unpacks anyway, links as the archive names them.
                std::fs::create_dir_all(local)
                    .map_err(|e| SandboxError::engine("broken", e.to_string()))?;
                std::os::unix::fs::symlink("/", local.join("escape"))
                    .map_err(|e| SandboxError::engine("broken", e.to_string()))?;
                Ok(())
            }
            r => r,
        }
    }
    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        let entries = self.inner.files()?.ls(path).await?;
        if self.flaw != Flaw::SplitNamesOnNewline {
            return Ok(entries);
        }
        Ok(entries
            .into_iter()
            .flat_map(|e| {
                e.name
                    .split('\n')
                    .map(|part| {
                        let mut piece = e.clone();
                        piece.name = part.to_string();
                        piece
                    })
                    .collect::<Vec<_>>()
            })
            .collect())
    }
    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let parents = parents || self.flaw == Flaw::MkdirAlwaysParents;
        self.inner.files()?.mkdir(path, parents).await
    }
    async fn remove(&self, path: &str) -> Result<()> {
        self.inner.files()?.remove(path).await
    }
    async fn stat(&self, path: &str) -> Result<FileInfo> {
        let info = self.inner.files()?.stat(path).await?;
        if self.flaw == Flaw::StaleFileInfo {
            let mut stale = info;
            stale.mode = 0;
            stale.modified = None;
            return Ok(stale);
        }
        if self.flaw == Flaw::DropSpecialModeBits {
            let mut masked = info;
            masked.mode &= 0o777;
            return Ok(masked);
        }
        Ok(info)
    }
}
