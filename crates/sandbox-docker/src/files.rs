//! Files through the engine's archive API, streamed both ways.
//!
//! `read`/`write`/`upload`/`download` move tar archives (`GET`/`PUT
//! /containers/{id}/archive`); `stat` is the archive `HEAD`. `ls`, `mkdir` and `remove`
//! run busybox-compatible helpers (`stat -c`, `mkdir`, `rm -rf`) through exec, so no
//! GNU-only tool is needed. Relative paths resolve against the sandbox workdir.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bollard::query_parameters::{
    ContainerArchiveInfoOptions, DownloadFromContainerOptions, UploadToContainerOptions,
};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use sandbox_core::tar_stream;
use sandbox_core::{FileInfo, FileSystem, Result, SandboxError, async_trait, resolve_path};

use crate::error::{self, BACKEND};
use crate::exec::helper_argv;
use crate::sandbox::SandboxInner;

/// The sandbox filesystem of a [`DockerSandbox`](crate::DockerSandbox).
pub(crate) struct DockerFiles {
    inner: Arc<SandboxInner>,
}

impl DockerFiles {
    pub(crate) fn new(inner: Arc<SandboxInner>) -> Self {
        DockerFiles { inner }
    }
}

fn split_parent(path: &str) -> (String, String) {
    match path.rsplit_once('/') {
        Some(("", name)) => ("/".to_string(), name.to_string()),
        Some((parent, name)) => (parent.to_string(), name.to_string()),
        None => ("/".to_string(), path.to_string()),
    }
}

/// A 404 from the archive API: the path is missing, unless the container itself is.
async fn missing(
    inner: &SandboxInner,
    path: &str,
    op: &str,
    e: error::EngineError,
) -> SandboxError {
    if error::kind(&e) == error::Kind::NotFound {
        if error::is_missing_container(&e) || !crate::code::container_running(inner).await {
            return inner.gone();
        }
        return SandboxError::PathNotFound {
            path: path.to_string(),
        };
    }
    if error::kind(&e) == error::Kind::NotRunning {
        return inner.gone();
    }
    error::for_path(path, op, e)
}

/// Go `os.FileMode` bits the engine reports in archive stats.
const GO_MODE_DIR: u32 = 1 << 31;
const GO_MODE_SETUID: u32 = 1 << 23;
const GO_MODE_SETGID: u32 = 1 << 22;
const GO_MODE_STICKY: u32 = 1 << 20;

/// Unix permission bits from a Go `os.FileMode`.
pub(crate) fn unix_mode(go: u32) -> u32 {
    let mut m = go & 0o777;
    if go & GO_MODE_SETUID != 0 {
        m |= 0o4000;
    }
    if go & GO_MODE_SETGID != 0 {
        m |= 0o2000;
    }
    if go & GO_MODE_STICKY != 0 {
        m |= 0o1000;
    }
    m
}

/// Parses an RFC 3339 timestamp (`2024-01-02T03:04:05.123Z`, `…+01:00`).
pub(crate) fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || (b[10] != b'T' && b[10] != b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        let f = &frac[..digits];
        let padded = format!("{:0<9}", &f[..f.len().min(9)]);
        nanos = padded.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (o.get(1..3)?.parse::<i64>().ok()? * 3600
                + o.get(4..6)?.parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset;
    if secs >= 0 {
        Some(SystemTime::UNIX_EPOCH + Duration::new(secs as u64, nanos))
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs((-secs) as u64))
    }
}

/// One `ls` line: `<size> <raw mode hex> <mtime> <name>`.
pub(crate) fn parse_ls_line(dir: &str, line: &str) -> Option<FileInfo> {
    let mut it = line.splitn(4, ' ');
    let size = it.next()?.parse().ok()?;
    let raw = u32::from_str_radix(it.next()?, 16).ok()?;
    let mtime: u64 = it.next()?.parse().ok()?;
    let name = it.next()?;
    let path = if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    };
    Some(FileInfo::new(
        path,
        size,
        raw & 0o170000 == 0o040000,
        raw & 0o7777,
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(mtime)),
    ))
}

// busybox `stat` is preferred when present: GNU stat uses statx(2), which gVisor (runsc)
// releases before 2023 reject with EINVAL.
const LS_SCRIPT: &str = r#"[ -e "$1" ] || [ -L "$1" ] || exit 3
[ -d "$1" ] || exit 4
cd "$1" || exit 5
if command -v busybox >/dev/null 2>&1; then S="busybox stat"; else S=stat; fi
for f in * .[!.]* ..?*; do
  if [ -e "$f" ] || [ -L "$f" ]; then $S -c '%s %f %Y %n' -- "$f" || exit 6; fi
done"#;

const MKDIR_SCRIPT: &str = r#"if [ "$2" = 1 ]; then mkdir -p -- "$1" || exit 7; exit 0; fi
[ -e "$1" ] || [ -L "$1" ] && exit 5
[ -d "$3" ] || exit 3
mkdir -- "$1" || exit 7"#;

const REMOVE_SCRIPT: &str = r#"[ -e "$1" ] || [ -L "$1" ] || exit 3
rm -rf -- "$1" || exit 7"#;

async fn script(
    inner: &Arc<SandboxInner>,
    path: &str,
    body: &str,
    args: &[&str],
) -> Result<sandbox_core::ExecResult> {
    inner.remaining()?;
    let mut argv = vec!["sh", "-c", body, "sbx-files"];
    argv.extend_from_slice(args);
    let r = helper_argv(inner, &argv).await?;
    match r.exit_code {
        0 => Ok(r),
        3 => Err(SandboxError::PathNotFound {
            path: path.to_string(),
        }),
        code => Err(SandboxError::FileSystem {
            path: path.to_string(),
            message: match code {
                4 => "not a directory".to_string(),
                5 => "already exists".to_string(),
                _ => format!("failed: {}", String::from_utf8_lossy(&r.stderr).trim()),
            },
            source: None,
        }),
    }
}

/// Writes `data` to an absolute sandbox path, creating parent directories.
pub(crate) async fn write_bytes(inner: &Arc<SandboxInner>, path: &str, data: Bytes) -> Result<()> {
    inner.remaining()?;
    let (parent, name) = split_parent(path);
    if name.is_empty() {
        return Err(SandboxError::IsADirectory {
            path: path.to_string(),
        });
    }
    let tar = tar_stream::single_file(&name, &data, 0o644)
        .map_err(|e| error::local_io(Path::new(path), "building archive", e))?;
    let tar = Bytes::from(tar);
    for attempt in 0..2 {
        let opts = UploadToContainerOptions {
            path: parent.clone(),
            ..Default::default()
        };
        match inner
            .client
            .upload_to_container(&inner.id, Some(opts), bollard::body_full(tar.clone()))
            .await
        {
            Ok(()) => return Ok(()),
            Err(e)
                if attempt == 0
                    && error::kind(&e) == error::Kind::NotFound
                    && !error::is_missing_container(&e) =>
            {
                script(inner, &parent, MKDIR_SCRIPT, &[&parent, "1", "/"]).await?;
            }
            Err(e) => return Err(upload_error(inner, path, e).await),
        }
    }
    Err(SandboxError::FileSystem {
        path: path.to_string(),
        message: "write failed".into(),
        source: None,
    })
}

async fn upload_error(inner: &SandboxInner, path: &str, e: error::EngineError) -> SandboxError {
    let is_dir_conflict = matches!(
        &e,
        bollard::errors::Error::DockerResponseServerError { message, .. }
            if message.contains("cannot overwrite directory")
    );
    if is_dir_conflict {
        return SandboxError::IsADirectory {
            path: path.to_string(),
        };
    }
    missing(inner, path, "upload", e).await
}

/// Streams the archive of `path` (first chunk checked, so a 404 surfaces here).
async fn archive_stream(
    inner: &Arc<SandboxInner>,
    path: &str,
) -> Result<futures::stream::BoxStream<'static, std::io::Result<Bytes>>> {
    inner.remaining()?;
    let opts = DownloadFromContainerOptions {
        path: path.to_string(),
    };
    let mut s = inner
        .client
        .download_from_container(&inner.id, Some(opts))
        .boxed();
    let first = match s.next().await {
        Some(Ok(b)) => b,
        Some(Err(e)) => return Err(missing(inner, path, "download", e).await),
        None => Bytes::new(),
    };
    let rest = s.map_err(|e| std::io::Error::other(error::engine("archive download", e)));
    Ok(futures::stream::once(async move { Ok(first) })
        .chain(rest)
        .boxed())
}

async fn read_bytes(inner: &Arc<SandboxInner>, path: &str, depth: u8) -> Result<Bytes> {
    let mut s = archive_stream(inner, path).await?;
    let mut buf = Vec::new();
    while let Some(chunk) = s.next().await {
        let chunk = chunk.map_err(|e| error::local_io(Path::new(path), "reading archive", e))?;
        buf.extend_from_slice(&chunk);
    }
    match first_entry(&buf).map_err(|e| error::local_io(Path::new(path), "reading archive", e))? {
        FirstEntry::Missing => Err(SandboxError::PathNotFound {
            path: path.to_string(),
        }),
        FirstEntry::Dir => Err(SandboxError::IsADirectory {
            path: path.to_string(),
        }),
        FirstEntry::Link(target) if depth < 8 => {
            let (parent, _) = split_parent(path);
            let next = resolve_path(&parent, &target)?;
            Box::pin(read_bytes(inner, &next, depth + 1)).await
        }
        FirstEntry::Link(_) => Err(SandboxError::FileSystem {
            path: path.to_string(),
            message: "too many levels of symbolic links".into(),
            source: None,
        }),
        FirstEntry::File(data) => Ok(data),
    }
}

enum FirstEntry {
    Missing,
    Dir,
    Link(String),
    File(Bytes),
}

fn first_entry(tar_bytes: &[u8]) -> std::io::Result<FirstEntry> {
    let mut archive = tar::Archive::new(tar_bytes);
    let mut entries = archive.entries()?;
    let Some(entry) = entries.next() else {
        return Ok(FirstEntry::Missing);
    };
    let mut entry = entry?;
    Ok(match entry.header().entry_type() {
        tar::EntryType::Directory => FirstEntry::Dir,
        tar::EntryType::Symlink => FirstEntry::Link(
            entry
                .link_name()?
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
        _ => {
            let mut data = Vec::with_capacity(entry.size() as usize);
            std::io::Read::read_to_end(&mut entry, &mut data)?;
            FirstEntry::File(Bytes::from(data))
        }
    })
}

async fn ensure_dir(inner: &Arc<SandboxInner>, dir: &str) -> Result<()> {
    let opts = ContainerArchiveInfoOptions {
        path: dir.to_string(),
    };
    match inner
        .client
        .get_container_archive_info(&inner.id, Some(opts))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if error::kind(&e) == error::Kind::NotFound => {
            script(inner, dir, MKDIR_SCRIPT, &[dir, "1", "/"])
                .await
                .map(|_| ())
        }
        Err(e) => Err(missing(inner, dir, "stat", e).await),
    }
}

#[async_trait]
impl FileSystem for DockerFiles {
    async fn read(&self, path: &str) -> Result<Bytes> {
        let p = resolve_path(&self.inner.workdir, path)?;
        read_bytes(&self.inner, &p, 0).await
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        let p = resolve_path(&self.inner.workdir, path)?;
        write_bytes(&self.inner, &p, data).await
    }

    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        let inner = &self.inner;
        let p = resolve_path(&inner.workdir, remote)?;
        let (parent, name) = split_parent(&p);
        if name.is_empty() {
            return Err(SandboxError::config(
                "cannot upload onto `/`",
                "name a target path below `/`",
            ));
        }
        std::fs::symlink_metadata(local).map_err(|e| error::local_io(local, "upload source", e))?;
        inner.remaining()?;
        ensure_dir(inner, &parent).await?;
        let (tx, mut rx) = tokio::sync::mpsc::channel(tar_stream::CHUNKS_IN_FLIGHT);
        let local_owned = local.to_path_buf();
        let producer =
            tokio::task::spawn_blocking(move || tar_stream::stream_local(tx, &local_owned, &name));
        let body = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let opts = UploadToContainerOptions {
            path: parent.clone(),
            ..Default::default()
        };
        let sent = inner
            .client
            .upload_to_container(&inner.id, Some(opts), bollard::body_try_stream(body))
            .await;
        let produced = producer.await.map_err(|e| SandboxError::Engine {
            backend: BACKEND.into(),
            message: "archive producer failed".into(),
            source: Some(Box::new(e)),
        })?;
        if let Err(e) = produced {
            return Err(error::local_io(local, "reading upload source", e));
        }
        sent.map_err(|e| error::for_path(&p, "upload", e))
    }

    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        let inner = &self.inner;
        let p = resolve_path(&inner.workdir, remote)?;
        let stream = archive_stream(inner, &p).await?;
        let reader = tokio_util::io::StreamReader::new(stream);
        let bridge = tokio_util::io::SyncIoBridge::new(reader);
        let local = local.to_path_buf();
        tokio::task::spawn_blocking(move || tar_stream::unpack_safely(bridge, &local))
            .await
            .map_err(|e| SandboxError::Engine {
                backend: BACKEND.into(),
                message: "archive unpacker failed".into(),
                source: Some(Box::new(e)),
            })?
    }

    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        let p = resolve_path(&self.inner.workdir, path)?;
        let r = script(&self.inner, &p, LS_SCRIPT, &[&p]).await?;
        let text = String::from_utf8_lossy(&r.stdout);
        Ok(text.lines().filter_map(|l| parse_ls_line(&p, l)).collect())
    }

    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let p = resolve_path(&self.inner.workdir, path)?;
        let (parent, _) = split_parent(&p);
        let flag = if parents { "1" } else { "0" };
        script(&self.inner, &p, MKDIR_SCRIPT, &[&p, flag, &parent])
            .await
            .map(|_| ())
    }

    async fn remove(&self, path: &str) -> Result<()> {
        let p = resolve_path(&self.inner.workdir, path)?;
        if p == "/" {
            return Err(SandboxError::config(
                "refusing to remove `/`",
                "remove paths below `/`",
            ));
        }
        script(&self.inner, &p, REMOVE_SCRIPT, &[&p])
            .await
            .map(|_| ())
    }

    async fn stat(&self, path: &str) -> Result<FileInfo> {
        let p = resolve_path(&self.inner.workdir, path)?;
        self.inner.remaining()?;
        let opts = ContainerArchiveInfoOptions { path: p.clone() };
        let s = match self
            .inner
            .client
            .get_container_archive_info(&self.inner.id, Some(opts))
            .await
        {
            Ok(s) => s,
            Err(e) => return Err(missing(&self.inner, &p, "stat", e).await),
        };
        Ok(FileInfo::new(
            p,
            s.size.max(0) as u64,
            s.file_mode & GO_MODE_DIR != 0,
            unix_mode(s.file_mode),
            s.modification_time.as_deref().and_then(parse_rfc3339),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        let t = parse_rfc3339("1970-01-02T00:00:01Z").unwrap();
        assert_eq!(t, SystemTime::UNIX_EPOCH + Duration::from_secs(86_401));
        let t = parse_rfc3339("2024-02-29T12:00:00.5+01:00").unwrap();
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(secs.as_secs(), 1_709_204_400);
        assert_eq!(secs.subsec_millis(), 500);
        assert!(parse_rfc3339("yesterday").is_none());
    }

    #[test]
    fn go_modes() {
        assert_eq!(unix_mode(0o755 | GO_MODE_DIR), 0o755);
        assert_eq!(unix_mode(0o777 | GO_MODE_STICKY), 0o1777);
    }

    #[test]
    fn ls_lines() {
        let f = parse_ls_line("/work", "12 81a4 100 my file.txt").unwrap();
        assert_eq!(
            (f.name.as_str(), f.size, f.is_dir, f.mode),
            ("my file.txt", 12, false, 0o644)
        );
        assert_eq!(f.path, "/work/my file.txt");
        let d = parse_ls_line("/", "4096 41ed 0 work").unwrap();
        assert!(d.is_dir && d.path == "/work");
        assert!(parse_ls_line("/", "garbage").is_none());
    }

    #[test]
    fn parents() {
        assert_eq!(
            split_parent("/work/a.txt"),
            ("/work".into(), "a.txt".into())
        );
        assert_eq!(split_parent("/a"), ("/".into(), "a".into()));
    }
}
