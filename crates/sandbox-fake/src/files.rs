//! `FileSystem` of a fake sandbox over its in-memory tree; uploads and downloads stream
//! host files in 1 MiB pieces, so memory stays bounded by the file itself plus one piece.

use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use bytes::Bytes;
use sandbox_core::policy::require;
use sandbox_core::{Capability, FileInfo, FileSystem, Result, SandboxError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::BACKEND_NAME;
use crate::calls::{Call, FileOp};
use crate::memfs::{self, FsError, MemFs, Node};
use crate::sandbox::FakeSandbox;
use crate::state::SandboxInner;

/// Size of one transfer piece.
const PIECE: usize = 1024 * 1024;

/// Maps an in-memory filesystem error to the typed error of `path`.
pub(crate) fn fs_error(path: &str, e: FsError) -> SandboxError {
    match e {
        FsError::NotFound => SandboxError::path_not_found(path.to_string()),
        FsError::IsADirectory => SandboxError::is_a_directory(path.to_string()),
        other => SandboxError::file_system(path, other.errno_text()),
    }
}

impl SandboxInner {
    /// Runs `op` on the filesystem at the current virtual time, its error typed for `path`.
    pub(crate) fn fs_op<T>(
        &self,
        path: &str,
        op: impl FnOnce(&mut MemFs, SystemTime) -> std::result::Result<T, FsError>,
    ) -> Result<T> {
        let now = self.now();
        op(&mut self.fs(), now).map_err(|e| fs_error(path, e))
    }
}

fn host_error(path: &Path, e: std::io::Error) -> SandboxError {
    SandboxError::file_system(
        path.display().to_string(),
        format!("host file operation failed: {}", e.kind()),
    )
    .with_source(e)
}

fn info(path: &str, node: &Node) -> FileInfo {
    FileInfo::new(
        path,
        node.size(),
        node.is_dir(),
        node.mode,
        Some(node.mtime),
    )
}

impl FakeSandbox {
    /// Checks the capability and liveness, records the call and resolves the path.
    fn file_op(&self, cap: Capability, op: FileOp, path: &str) -> Result<String> {
        require(self.inner().capabilities, cap, BACKEND_NAME)?;
        let sb = self.inner();
        sb.alive()?;
        sb.refuse_if_frozen()?;
        sb.touch();
        sb.record(Call::File {
            sandbox_id: sb.id.clone(),
            op,
            path: path.to_string(),
        });
        sandbox_core::resolve_path(&sb.workdir, path)
    }
}

async fn upload_file(sb: &SandboxInner, local: &Path, dest: &str, len: u64) -> Result<()> {
    let mut file = tokio::fs::File::open(local)
        .await
        .map_err(|e| host_error(local, e))?;
    sb.fs_op(dest, |fs, now| {
        fs.write(dest, Vec::new(), true, now)?;
        fs.reserve(dest, usize::try_from(len).unwrap_or(0));
        Ok(())
    })?;
    let mut buf = vec![0u8; PIECE];
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| host_error(local, e))?;
        if n == 0 {
            return Ok(());
        }
        sb.alive()?;
        sb.fs_op(dest, |fs, now| fs.append(dest, &buf[..n], now))?;
    }
}

async fn upload_dir(sb: &SandboxInner, local: &Path, dest: &str) -> Result<()> {
    let mut stack = vec![(local.to_path_buf(), dest.to_string())];
    while let Some((host_dir, sandbox_dir)) = stack.pop() {
        sb.fs_op(&sandbox_dir, |fs, now| fs.mkdir(&sandbox_dir, true, now))?;
        let mut entries = tokio::fs::read_dir(&host_dir)
            .await
            .map_err(|e| host_error(&host_dir, e))?;
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|e| host_error(&host_dir, e))?
        {
            let host_path = entry.path();
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Err(SandboxError::file_system(
                    host_path.display().to_string(),
                    "file name is not UTF-8",
                ));
            };
            let target = memfs::join(&sandbox_dir, name);
            let kind = entry
                .file_type()
                .await
                .map_err(|e| host_error(&host_path, e))?;
            if kind.is_dir() {
                stack.push((host_path, target));
            } else if kind.is_file() {
                let len = entry.metadata().await.map(|m| m.len()).unwrap_or(0);
                upload_file(sb, &host_path, &target, len).await?;
            } else {
                // Symlinks and special files are not followed: an upload never copies more
                // of the host than the tree it was given.
                tracing::debug!(path = %host_path.display(), "upload skips a non-regular file");
            }
        }
    }
    Ok(())
}

/// Refuses a relative entry path that could leave the target directory.
fn safe_relative(entry: &str) -> Result<PathBuf> {
    let p = Path::new(entry);
    let ok = !entry.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(p.to_path_buf())
    } else {
        Err(SandboxError::unsafe_archive_entry(entry.to_string()))
    }
}

/// Whether a symlink at `entry` (relative to the downloaded root) pointing to `target`
/// resolves inside the root. Absolute targets never do.
fn link_stays_inside(entry: &str, target: &str) -> bool {
    const ROOT: &str = "/download-root";
    if target.starts_with('/') {
        return false;
    }
    let link = format!("{ROOT}/{entry}");
    let dir = link.rsplit_once('/').map_or(ROOT, |(d, _)| d);
    sandbox_core::resolve_path(dir, target)
        .is_ok_and(|r| r == ROOT || r.starts_with(&format!("{ROOT}/")))
}

/// Whether a host path is itself a symlink.
async fn is_symlink(path: &Path) -> bool {
    let meta = tokio::fs::symlink_metadata(path).await;
    meta.is_ok_and(|m| m.file_type().is_symlink())
}

/// Refuses to write through a host symlink below `root` (an existing link could point
/// anywhere on the host).
async fn no_symlink_below(root: &Path, rel: &Path, entry: &str) -> Result<()> {
    let mut cur = root.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        if is_symlink(&cur).await {
            return Err(SandboxError::unsafe_archive_entry(entry.to_string()));
        }
    }
    Ok(())
}

async fn download_file(sb: &SandboxInner, src: &str, target: &Path) -> Result<()> {
    let mut out = tokio::fs::File::create(target)
        .await
        .map_err(|e| host_error(target, e))?;
    let mut offset = 0usize;
    loop {
        sb.alive()?;
        let piece = sb.fs_op(src, |fs, _| fs.read_range(src, offset, PIECE))?;
        if piece.is_empty() {
            break;
        }
        offset += piece.len();
        out.write_all(&piece)
            .await
            .map_err(|e| host_error(target, e))?;
    }
    out.flush().await.map_err(|e| host_error(target, e))
}

#[sandbox_core::async_trait]
impl FileSystem for FakeSandbox {
    async fn read(&self, path: &str) -> Result<Bytes> {
        let p = self.file_op(Capability::FILESYSTEM, FileOp::Read, path)?;
        self.inner().fs_op(&p, |fs, _| fs.read(&p))
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        let p = self.file_op(
            Capability::FILESYSTEM,
            FileOp::Write { len: data.len() },
            path,
        )?;
        let sb = self.inner();
        sb.fs_op(&p, |fs, now| fs.write(&p, data.to_vec(), true, now))
    }

    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        let dest = self.file_op(
            Capability::UPLOAD_DOWNLOAD,
            FileOp::Upload {
                local: local.to_path_buf(),
            },
            remote,
        )?;
        let meta = tokio::fs::metadata(local)
            .await
            .map_err(|e| host_error(local, e))?;
        let sb = self.inner();
        if meta.is_dir() {
            return upload_dir(sb, local, &dest).await;
        }
        let into_dir = sb.fs().get(&dest).is_some_and(Node::is_dir);
        let dest = match (into_dir, local.file_name().and_then(|n| n.to_str())) {
            (true, Some(name)) => memfs::join(&dest, name),
            _ => dest,
        };
        upload_file(sb, local, &dest, meta.len()).await
    }

    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        let src = self.file_op(
            Capability::UPLOAD_DOWNLOAD,
            FileOp::Download {
                local: local.to_path_buf(),
            },
            remote,
        )?;
        let sb = self.inner();
        // `get_followed` resolves links, so a node is a file or a directory.
        let is_dir = sb.fs().get_followed(&src).map(Node::is_dir);
        match is_dir {
            None => Err(SandboxError::path_not_found(src)),
            Some(false) => {
                let target = match tokio::fs::metadata(local).await {
                    Ok(m) if m.is_dir() => local.join(memfs::base_name(&src)),
                    _ => local.to_path_buf(),
                };
                if is_symlink(&target).await {
                    let name = memfs::base_name(&src).to_string();
                    return Err(SandboxError::unsafe_archive_entry(name));
                }
                download_file(sb, &src, &target).await
            }
            Some(true) => {
                if is_symlink(local).await {
                    let name = local.display().to_string();
                    return Err(SandboxError::unsafe_archive_entry(name));
                }
                let src = sb.fs_op(&src, |fs, _| fs.follow(&src))?;
                let strip = if src == "/" { 1 } else { src.len() + 1 };
                let entries = sb.fs().walk(&src);
                // Vet every link before writing anything.
                for (path, _, target) in &entries {
                    let entry = &path[strip.min(path.len())..];
                    if let Some(target) = target.as_deref().filter(|t| !link_stays_inside(entry, t))
                    {
                        return Err(SandboxError::unsafe_archive_entry(format!(
                            "{entry} -> {target}"
                        )));
                    }
                }
                tokio::fs::create_dir_all(local)
                    .await
                    .map_err(|e| host_error(local, e))?;
                for (path, is_dir, link) in entries {
                    let entry = &path[strip.min(path.len())..];
                    let rel = safe_relative(entry)?;
                    no_symlink_below(local, &rel, entry).await?;
                    let target = local.join(&rel);
                    if let Some(link) = link {
                        tokio::fs::symlink(link, &target)
                            .await
                            .map_err(|e| host_error(&target, e))?;
                    } else if is_dir {
                        tokio::fs::create_dir_all(&target)
                            .await
                            .map_err(|e| host_error(&target, e))?;
                    } else {
                        download_file(sb, &path, &target).await?;
                    }
                }
                Ok(())
            }
        }
    }

    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        let p = self.file_op(Capability::FILESYSTEM, FileOp::Ls, path)?;
        let fs = self.inner().fs();
        match fs.get(&p) {
            None => Err(SandboxError::path_not_found(p)),
            Some(n) if !n.is_dir() => Ok(vec![info(&p, n)]),
            Some(_) => Ok(fs
                .list(&p)
                .map_err(|e| fs_error(&p, e))?
                .iter()
                .map(|(name, n)| info(&memfs::join(&p, name), n))
                .collect()),
        }
    }

    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let p = self.file_op(Capability::FILESYSTEM, FileOp::Mkdir { parents }, path)?;
        let sb = self.inner();
        sb.fs_op(&p, |fs, now| fs.mkdir(&p, parents, now))
    }

    async fn remove(&self, path: &str) -> Result<()> {
        let p = self.file_op(Capability::FILESYSTEM, FileOp::Remove, path)?;
        self.inner().fs_op(&p, |fs, _| fs.remove(&p, true))
    }

    async fn stat(&self, path: &str) -> Result<FileInfo> {
        let p = self.file_op(Capability::FILESYSTEM, FileOp::Stat, path)?;
        let fs = self.inner().fs();
        match fs.get_followed(&p).or_else(|| fs.get(&p)) {
            Some(n) => Ok(info(&p, n)),
            None => Err(SandboxError::path_not_found(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_must_stay_inside() {
        assert!(link_stays_inside("sub/l", "../ok.txt"));
        assert!(link_stays_inside("l", "sub/x"));
        assert!(!link_stays_inside("l", "/"));
        assert!(!link_stays_inside("l", "../x"));
        assert!(!link_stays_inside("sub/passwd", "/etc/passwd"));
        assert!(!link_stays_inside("up", "../../../../../../.."));
    }

    #[test]
    fn relative_entries_are_checked() {
        assert!(safe_relative("a/b.txt").is_ok());
        for bad in ["../x", "/etc/passwd", "a/../../b", "", "./a"] {
            let e = safe_relative(bad).unwrap_err();
            assert_eq!(
                e.code(),
                sandbox_core::ErrorCode::UnsafeArchiveEntry,
                "{bad}"
            );
        }
    }
}
