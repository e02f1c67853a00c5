//! Files through the archive API (streamed both ways, bounded memory), the archive HEAD
//! for `stat`, and small busybox-compatible helper execs for `ls`, `mkdir` and `remove`.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use sandbox_core::{FileInfo, FileSystem, Result, SandboxError, resolve_path};
use tokio::sync::mpsc;

use crate::error::{engine_msg, guard, on_sandbox};
use crate::exec::run_helper;
use crate::rest::PathStat;
use crate::sandbox::Shared;
use crate::tar_stream::{ChannelReader, DEPTH, FirstEntry, first_entry};
use sandbox_core::tar_stream::{single_file, stream_local, unpack_safely};

/// The [`FileSystem`] of a Podman sandbox.
pub(crate) struct PodmanFiles {
    shared: Arc<Shared>,
}

fn split_parent(p: &str) -> Result<(String, String)> {
    let trimmed = p.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((parent, name)) if !name.is_empty() => Ok((
            if parent.is_empty() {
                "/".into()
            } else {
                parent.into()
            },
            name.into(),
        )),
        _ => Err(SandboxError::FileSystem {
            path: p.into(),
            message: "needs a path below /".into(),
            source: None,
        }),
    }
}

fn host_err(path: &Path, what: &str, e: std::io::Error) -> SandboxError {
    SandboxError::FileSystem {
        path: path.display().to_string(),
        message: what.into(),
        source: Some(Box::new(e)),
    }
}

impl PodmanFiles {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        PodmanFiles { shared }
    }

    fn resolve(&self, path: &str) -> Result<String> {
        self.shared.remaining()?;
        resolve_path(self.shared.workdir(), path)
    }

    async fn stat_raw(&self, p: &str) -> Result<Option<PathStat>> {
        self.shared
            .rest
            .stat_path(self.shared.id(), p)
            .await
            .map_err(|e| {
                self.shared
                    .rest
                    .on_sandbox(self.shared.id(), "archive stat", e)
            })
    }

    async fn helper(&self, script: &str, args: &[&str]) -> Result<(i64, Bytes, Bytes)> {
        let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "sh".into()];
        argv.extend(args.iter().map(|a| a.to_string()));
        run_helper(&self.shared.target, argv, Some("/".into())).await
    }

    async fn mkdir_p(&self, p: &str) -> Result<()> {
        let (code, _, err) = self.helper("mkdir -p -- \"$1\"", &[p]).await?;
        if code != 0 {
            return Err(helper_failed(p, "mkdir", &err));
        }
        Ok(())
    }

    async fn ensure_parent(&self, parent: &str) -> Result<()> {
        match self.stat_raw(parent).await? {
            Some(s) if s.is_dir() => Ok(()),
            Some(_) => Err(SandboxError::FileSystem {
                path: parent.into(),
                message: "parent is not a directory".into(),
                source: None,
            }),
            None => self.mkdir_p(parent).await,
        }
    }

    async fn put_archive(&self, parent: &str, body: hyper::Body) -> Result<()> {
        let c = self.shared.target.client.containers().get(self.shared.id());
        let id = self.shared.id().to_string();
        guard("archive upload", async {
            c.copy_to(parent, body)
                .await
                .map_err(|e| on_sandbox(&id, "archive upload", e))
        })
        .await
    }

    /// Streams the archive of `p` into a bounded channel.
    fn spawn_get(
        &self,
        p: String,
        tx: mpsc::Sender<std::io::Result<Bytes>>,
    ) -> tokio::task::JoinHandle<Result<()>> {
        let client = self.shared.target.client.clone();
        let id = self.shared.id().to_string();
        tokio::spawn(async move {
            let c = client.containers().get(&id);
            let s = c
                .copy_from(&p)
                .map(|r| r.map_err(|e| on_sandbox(&id, "archive download", e)));
            let mut s = Box::pin(crate::error::guard_stream("archive download", s));
            while let Some(item) = s.next().await {
                match item {
                    Ok(chunk) => {
                        if tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                            break; // the reader stopped (e.g. refused an entry)
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                        return Err(e);
                    }
                }
            }
            Ok(())
        })
    }

    async fn get_all(&self, p: &str) -> Result<Vec<u8>> {
        let (tx, mut rx) = mpsc::channel(DEPTH);
        let task = self.spawn_get(p.to_string(), tx);
        let mut out = Vec::new();
        while let Some(c) = rx.recv().await {
            match c {
                Ok(b) => out.extend_from_slice(&b),
                Err(_) => break,
            }
        }
        task.await
            .map_err(|_| engine_msg("archive download task failed"))??;
        Ok(out)
    }
}

#[sandbox_core::async_trait]
impl FileSystem for PodmanFiles {
    async fn read(&self, path: &str) -> Result<Bytes> {
        let p = self.resolve(path)?;
        let st = self
            .stat_raw(&p)
            .await?
            .ok_or_else(|| SandboxError::PathNotFound { path: p.clone() })?;
        if st.is_dir() {
            return Err(SandboxError::IsADirectory { path: p });
        }
        // The engine reports the resolved target of a symlink; read that.
        let source = if st.link_target.is_empty() {
            p.clone()
        } else {
            st.link_target.clone()
        };
        let data = self.get_all(&source).await?;
        match first_entry(&data, &p)? {
            FirstEntry::File(b) => Ok(b),
            FirstEntry::Dir => Err(SandboxError::IsADirectory { path: p }),
            FirstEntry::Symlink | FirstEntry::Other => Err(SandboxError::FileSystem {
                path: p,
                message: "not a regular file".into(),
                source: None,
            }),
        }
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        let p = self.resolve(path)?;
        let (parent, name) = split_parent(&p)?;
        if let Some(st) = self.stat_raw(&p).await? {
            if st.is_dir() {
                return Err(SandboxError::IsADirectory { path: p });
            }
        }
        self.ensure_parent(&parent).await?;
        let tar = single_file(&name, &data, 0o644).map_err(|e| SandboxError::FileSystem {
            path: p.clone(),
            message: "building the archive failed".into(),
            source: Some(Box::new(e)),
        })?;
        self.put_archive(&parent, hyper::Body::from(tar)).await
    }

    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        std::fs::symlink_metadata(local)
            .map_err(|e| host_err(local, "cannot read host path", e))?;
        let p = self.resolve(remote)?;
        let (parent, name) = split_parent(&p)?;
        self.ensure_parent(&parent).await?;
        let (tx, mut rx) = mpsc::channel::<std::io::Result<Bytes>>(DEPTH);
        let local_owned = local.to_path_buf();
        let producer = tokio::task::spawn_blocking(move || stream_local(tx, &local_owned, &name));
        let body_stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let body = hyper::Body::wrap_stream(body_stream);
        let put = self.put_archive(&parent, body).await;
        let produced = producer
            .await
            .map_err(|_| engine_msg("upload task failed"))?;
        if let Err(e) = produced {
            return Err(host_err(local, "reading the host tree failed", e));
        }
        put
    }

    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        let p = self.resolve(remote)?;
        let st = self
            .stat_raw(&p)
            .await?
            .ok_or_else(|| SandboxError::PathNotFound { path: p.clone() })?;
        let source = if st.link_target.is_empty() || st.is_dir() {
            p.clone()
        } else {
            st.link_target.clone()
        };
        let (tx, rx) = mpsc::channel(DEPTH);
        let task = self.spawn_get(source, tx);
        let local_owned = local.to_path_buf();
        let extracted = tokio::task::spawn_blocking(move || {
            unpack_safely(ChannelReader::new(rx), &local_owned)
        })
        .await
        .map_err(|_| engine_msg("download task failed"))?;
        let fetched = task
            .await
            .map_err(|_| engine_msg("archive download task failed"))?;
        // An extraction refusal wins: it explains why the stream stopped.
        extracted?;
        fetched
    }

    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        let p = self.resolve(path)?;
        // One `stat` per entry; the name goes last, NUL-terminated, so any name parses.
        let script = r#"cd -- "$1" 2>/dev/null || { if [ -e "$1" ]; then exit 20; fi; exit 44; }
for f in * .*; do
  case "$f" in .|..) continue;; esac
  [ -e "$f" ] || [ -L "$f" ] || continue
  s=$(stat -c '%s %f %Y' -- "$f" 2>/dev/null) || continue
  printf '%s %s\0' "$s" "$f"
done"#;
        let (code, out, err) = self.helper(script, &[&p]).await?;
        match code {
            0 => {}
            44 => return Err(SandboxError::PathNotFound { path: p }),
            20 => {
                return Err(SandboxError::FileSystem {
                    path: p,
                    message: "not a directory".into(),
                    source: None,
                });
            }
            _ => {
                return Err(helper_failed(p, "listing", &err));
            }
        }
        let mut v = Vec::new();
        for rec in out.split(|b| *b == 0).filter(|r| !r.is_empty()) {
            let rec = String::from_utf8_lossy(rec);
            let mut it = rec.splitn(4, ' ');
            let (Some(size), Some(mode), Some(mtime), Some(name)) =
                (it.next(), it.next(), it.next(), it.next())
            else {
                continue;
            };
            let size: u64 = size.parse().unwrap_or(0);
            let raw_mode = u32::from_str_radix(mode, 16).unwrap_or(0);
            let is_dir = raw_mode & 0o170000 == 0o040000;
            let modified = mtime
                .parse::<u64>()
                .ok()
                .map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
            let full = if p == "/" {
                format!("/{name}")
            } else {
                format!("{p}/{name}")
            };
            v.push(FileInfo::new(
                full,
                size,
                is_dir,
                raw_mode & 0o7777,
                modified,
            ));
        }
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let p = self.resolve(path)?;
        let script = if parents {
            r#"mkdir -p -- "$1""#
        } else {
            r#"if [ -e "$1" ]; then exit 17; fi; d=$(dirname -- "$1"); [ -d "$d" ] || exit 44; mkdir -- "$1""#
        };
        let (code, _, err) = self.helper(script, &[&p]).await?;
        match code {
            0 => Ok(()),
            44 => Err(SandboxError::PathNotFound {
                path: split_parent(&p).map(|(parent, _)| parent).unwrap_or(p),
            }),
            17 => Err(SandboxError::FileSystem {
                path: p,
                message: "already exists".into(),
                source: None,
            }),
            _ => Err(helper_failed(p, "mkdir", &err)),
        }
    }

    async fn remove(&self, path: &str) -> Result<()> {
        let p = self.resolve(path)?;
        if p == "/" {
            return Err(SandboxError::FileSystem {
                path: p,
                message: "refusing to remove /".into(),
                source: None,
            });
        }
        let (code, _, err) = self
            .helper(
                r#"[ -e "$1" ] || [ -L "$1" ] || exit 44; rm -rf -- "$1""#,
                &[&p],
            )
            .await?;
        match code {
            0 => Ok(()),
            44 => Err(SandboxError::PathNotFound { path: p }),
            _ => Err(helper_failed(p, "remove", &err)),
        }
    }

    async fn stat(&self, path: &str) -> Result<FileInfo> {
        let p = self.resolve(path)?;
        let st = self
            .stat_raw(&p)
            .await?
            .ok_or_else(|| SandboxError::PathNotFound { path: p.clone() })?;
        let size = if st.is_dir() {
            0
        } else {
            st.size.max(0) as u64
        };
        Ok(FileInfo::new(
            p,
            size,
            st.is_dir(),
            st.perm(),
            st.modified(),
        ))
    }
}

/// A helper exec failed: the operation and the first 200 characters of its stderr (a
/// sandbox's own output, so bounded — never a wall of text in an error).
fn helper_failed(path: impl Into<String>, op: &str, stderr: &[u8]) -> SandboxError {
    let text: String = String::from_utf8_lossy(stderr)
        .trim()
        .chars()
        .take(200)
        .collect();
    SandboxError::FileSystem {
        path: path.into(),
        message: format!("{op} failed: {text}"),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_split() {
        assert_eq!(
            split_parent("/work/a.txt").unwrap(),
            ("/work".into(), "a.txt".into())
        );
        assert_eq!(split_parent("/a").unwrap(), ("/".into(), "a".into()));
        assert!(split_parent("/").is_err());
    }
}
