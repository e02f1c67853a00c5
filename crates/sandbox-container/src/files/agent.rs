//! File operations through the in-sandbox agent (`read`, `write`, `ls`, `stat`, `mkdir`,
//! `remove`): one round trip over the attach stream instead of an archive request or a
//! helper exec, with the same results and errors as the engine path in `files.rs`
//! (the contract suite runs both). `upload` and `download` keep the archive API: they
//! move trees, and tar is what carries a tree.
//!
//! What the sandbox controls stays bounded here as on the engine path: a read stops at
//! the read cap, each chunk must arrive within the call timeout (a FIFO or a stalled
//! agent fails the call instead of hanging it), and a listing entry whose name is `.`,
//! `..` or holds a `/` is refused as forged.

use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use sandbox_agent::client::AgentClient;
use sandbox_agent::protocol::FileStat;
use sandbox_core::{ErrorCode, FileInfo, Result};

use crate::error;

/// Where the files of one sandbox go through its agent.
pub(crate) struct AgentFiles {
    pub client: AgentClient,
    /// Bound of one call, and of the wait for each chunk of a read.
    pub call_timeout: Duration,
    /// Largest file `read` returns.
    pub read_cap: u64,
}

impl AgentFiles {
    async fn bounded<T>(
        &self,
        what: &str,
        path: &str,
        f: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.call_timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(error::file(
                path,
                format!("{what}: the agent sent nothing for {:?}", self.call_timeout),
                None,
            )),
        }
    }

    /// The whole content of the file at `path` (absolute), refused past the read cap.
    pub(crate) async fn read(&self, path: &str) -> Result<Bytes> {
        let cap = self.read_cap;
        // Refused from its size before a byte moves (a sparse 3 GiB file must not cost
        // the host 64 MiB first); the stream is capped too, for files that grow or report
        // no size (a symlink's own size, /proc, devices).
        let s = self.bounded("stat", path, self.client.stat(path)).await?;
        if !s.is_symlink && !s.is_dir && s.size > cap {
            return Err(too_large(path, cap, &format!("has {}", s.size)));
        }
        let mut reader = self
            .bounded("read", path, self.client.read_file_stream(path))
            .await?;
        let mut buf = BytesMut::new();
        while let Some(chunk) = self.bounded("read", path, reader.next_chunk()).await? {
            if (buf.len() + chunk.len()) as u64 > cap {
                // Dropping the reader cancels the agent's read.
                return Err(too_large(path, cap, "is larger"));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    }

    /// Writes `data` to `path` (absolute, not `/`), creating missing parents.
    pub(crate) async fn write(&self, path: &str, parent: &str, data: &[u8]) -> Result<()> {
        let once = || self.client.write_file(path, data, Some(0o644));
        match once().await {
            Err(e) if e.code() == ErrorCode::PathNotFound => {
                self.mkdir(parent, true).await?;
                once().await
            }
            r => r,
        }
    }

    /// The entries of directory `path`; `None` when the agent refuses the listing as too
    /// large for one answer (the caller lists through the engine instead).
    pub(crate) async fn ls(&self, path: &str) -> Result<Option<Vec<FileInfo>>> {
        let entries = match self.client.list(path).await {
            Ok(e) => e,
            Err(e) if e.code() == ErrorCode::ResourceLimitExceeded => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut out = Vec::with_capacity(entries.len());
        for s in entries {
            if s.name.is_empty() || s.name == "." || s.name == ".." || s.name.contains('/') {
                return Err(error::file(
                    path,
                    "the listing was malformed (an entry named `.`, `..` or with `/`)",
                    None,
                ));
            }
            let full = if path == "/" {
                format!("/{}", s.name)
            } else {
                format!("{path}/{}", s.name)
            };
            out.push(info(full, &s));
        }
        Ok(Some(out))
    }

    /// Metadata of `path` (a symlink itself, not its target).
    pub(crate) async fn stat(&self, path: &str) -> Result<FileInfo> {
        let s = self.client.stat(path).await?;
        Ok(info(path.to_string(), &s))
    }

    /// Creates directory `path` (and its parents with `parents`). Without `parents`, an
    /// existing path is refused as the engine path refuses it.
    pub(crate) async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        self.client.mkdir(path, parents).await
    }

    /// Removes `path` and, for a directory, everything below it.
    pub(crate) async fn remove(&self, path: &str) -> Result<()> {
        self.client.remove(path, true).await
    }
}

fn too_large(path: &str, cap: u64, what: &str) -> sandbox_core::SandboxError {
    error::limit(
        format!("files().read cap ({cap} bytes; `{path}` {what})"),
        "stream it to the host with files().download(path, local) instead, or raise \
         ContainerConfig::read_cap",
    )
}

fn info(path: String, s: &FileStat) -> FileInfo {
    let modified = u64::try_from(s.modified)
        .ok()
        .and_then(|secs| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs)));
    FileInfo::new(path, s.size, s.is_dir, s.mode & 0o7777, modified)
}
