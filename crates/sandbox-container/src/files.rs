//! Files: the archive API for content (streamed both ways), the engine's path stat for
//! `stat`, and one set of busybox-compatible helper scripts for `ls`, `mkdir`, `remove`.
//!
//! Helper exit codes, the same for every engine: 3 not found, 4 not a directory, 5
//! already exists, 6 a listing failed, 7 the operation failed. `ls` output is
//! NUL-separated records `<size> <raw mode hex> <mtime>\n<name>`; a name of `.`, `..`, or
//! one containing `/` cannot come from the script, so a listing holding one is refused as
//! forged instead of trusted.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use sandbox_core::{
    FileInfo, FileSystem, Result, SandboxError, async_trait, resolve_path, tar_stream,
};

use crate::archive::{ArchiveReader, FirstEntry};
use crate::engine::{ArchiveBody, ContainerEngine, EngineError, EngineErrorKind};
use crate::error;
use crate::exec::helper_argv;
use crate::sandbox::Shared;

/// `ls`: busybox `stat` is preferred when present: GNU stat uses statx(2), which gVisor
/// (runsc) releases before 2023 reject with EINVAL.
pub const LS_SCRIPT: &str = r#"[ -e "$1" ] || [ -L "$1" ] || exit 3
[ -d "$1" ] || exit 4
cd "$1" || exit 7
if command -v busybox >/dev/null 2>&1; then S="busybox stat"; else S=stat; fi
for f in * .[!.]* ..?*; do
  if [ -e "$f" ] || [ -L "$f" ]; then
    $S -c '%s %f %Y' -- "$f" || exit 6
    printf '%s\0' "$f" || exit 6
  fi
done"#;

/// `mkdir`: `$1` path, `$2` 1 for `-p`, `$3` parent.
pub const MKDIR_SCRIPT: &str = r#"if [ "$2" = 1 ]; then mkdir -p -- "$1" || exit 7; exit 0; fi
if [ -e "$1" ] || [ -L "$1" ]; then exit 5; fi
[ -e "$3" ] || exit 3
[ -d "$3" ] || exit 4
mkdir -- "$1" || exit 7"#;

/// `remove`: `$1` path.
pub const REMOVE_SCRIPT: &str = r#"[ -e "$1" ] || [ -L "$1" ] || exit 3
rm -rf -- "$1" || exit 7"#;

/// The sandbox filesystem of a [`ContainerSandbox`](crate::ContainerSandbox).
pub(crate) struct ContainerFiles<E: ContainerEngine> {
    sh: Arc<Shared<E>>,
}

impl<E: ContainerEngine> ContainerFiles<E> {
    pub(crate) fn new(sh: Arc<Shared<E>>) -> Self {
        ContainerFiles { sh }
    }

    fn resolve(&self, path: &str) -> Result<String> {
        self.sh.remaining()?;
        resolve_path(&self.sh.workdir, path)
    }

    /// A `NotFound` from a path operation: the path is missing, unless the container is.
    async fn missing(&self, path: &str, op: &str, e: EngineError) -> SandboxError {
        match e.kind {
            EngineErrorKind::NotFound => {
                if self.sh.container_running().await {
                    error::path_not_found(path).with_source(e)
                } else {
                    error::gone(&self.sh.id).with_source(e)
                }
            }
            EngineErrorKind::Conflict => error::gone(&self.sh.id).with_source(e),
            _ => error::engine(&*self.sh.engine, op, e),
        }
    }

    async fn script(
        &self,
        path: &str,
        body: &str,
        args: &[&str],
    ) -> Result<sandbox_core::ExecResult> {
        let mut argv = vec!["sh", "-c", body, "sbx-files"];
        argv.extend_from_slice(args);
        let r = helper_argv(&self.sh, &argv).await?;
        match r.exit_code {
            0 => Ok(r),
            3 => Err(error::path_not_found(path)),
            4 => Err(error::file(path, "not a directory", None)),
            5 => Err(error::file(path, "already exists", None)),
            code => Err(error::file(
                path,
                format!(
                    "failed (exit {code}): {}",
                    error::bounded_text(&String::from_utf8_lossy(&r.stderr))
                ),
                None,
            )),
        }
    }

    async fn mkdir_p(&self, dir: &str) -> Result<()> {
        self.script(dir, MKDIR_SCRIPT, &[dir, "1", "/"])
            .await
            .map(|_| ())
    }

    async fn put(&self, dir: &str, body: ArchiveBody) -> std::result::Result<(), EngineError> {
        self.sh
            .call(
                "archive upload",
                self.sh.engine.put_archive(&self.sh.id, dir, body),
            )
            .await
    }

    /// The archive of `path`, each chunk wait bounded by the call timeout; a `NotFound`
    /// surfaces here.
    async fn get(&self, path: &str) -> Result<ArchiveBody> {
        match self
            .sh
            .call(
                "archive download",
                self.sh.engine.get_archive(&self.sh.id, path),
            )
            .await
        {
            Ok(b) => Ok(b),
            Err(e) => Err(self.missing(path, "archive download", e).await),
        }
    }

    async fn read_resolved(&self, path: &str) -> Result<Bytes> {
        let cap = self.sh.config.read_cap;
        let mut current = path.to_string();
        for _ in 0..8 {
            let body = self.get(&current).await?;
            let mut reader = ArchiveReader::new(body, self.sh.config.call_timeout);
            let entry = reader
                .first_entry(cap)
                .await
                .map_err(|e| error::file(path, "reading the archive failed", Some(Box::new(e))))?;
            match entry {
                FirstEntry::Missing => return Err(error::path_not_found(path)),
                FirstEntry::Dir => return Err(error::is_a_directory(path)),
                FirstEntry::File(data) => return Ok(data),
                FirstEntry::TooLarge(size) => {
                    return Err(error::limit(
                        format!("files().read cap ({cap} bytes; `{path}` has {size})"),
                        "stream it to the host with files().download(path, local) instead, or \
                         raise ContainerConfig::read_cap",
                    ));
                }
                FirstEntry::Link(target) => {
                    let (parent, _) = split_parent(&current);
                    current = resolve_path(&parent, &target)?;
                }
            }
        }
        Err(error::file(path, "too many levels of symbolic links", None))
    }
}

/// `/a/b` → (`/a`, `b`); `/a` → (`/`, `a`); `/` → (`/`, ``).
pub(crate) fn split_parent(path: &str) -> (String, String) {
    match path.rsplit_once('/') {
        Some(("", name)) => ("/".to_string(), name.to_string()),
        Some((parent, name)) => (parent.to_string(), name.to_string()),
        None => ("/".to_string(), path.to_string()),
    }
}

/// Parses the `ls` helper's output for directory `dir`. `None`: malformed or forged.
pub(crate) fn parse_listing(dir: &str, out: &[u8]) -> Option<Vec<FileInfo>> {
    let mut v = Vec::new();
    let mut records = out.split(|b| *b == 0).peekable();
    while let Some(rec) = records.next() {
        if rec.is_empty() && records.peek().is_none() {
            break;
        }
        let pos = rec.iter().position(|b| *b == b'\n')?;
        let stats = std::str::from_utf8(&rec[..pos]).ok()?;
        let name = std::str::from_utf8(&rec[pos + 1..]).ok()?;
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return None;
        }
        let mut it = stats.split(' ');
        let size: u64 = it.next()?.parse().ok()?;
        let raw = u32::from_str_radix(it.next()?, 16).ok()?;
        let mtime: u64 = it.next()?.parse().ok()?;
        if it.next().is_some() {
            return None;
        }
        let path = if dir == "/" {
            format!("/{name}")
        } else {
            format!("{dir}/{name}")
        };
        v.push(FileInfo::new(
            path,
            size,
            raw & 0o170000 == 0o040000,
            raw & 0o7777,
            SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(mtime)),
        ));
    }
    Some(v)
}

/// Sets a flag when dropped: stops a download's blocking unpack when its future is
/// dropped (the body it reads then fails).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl<E: ContainerEngine> FileSystem for ContainerFiles<E> {
    async fn read(&self, path: &str) -> Result<Bytes> {
        let p = self.resolve(path)?;
        self.read_resolved(&p).await
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        let p = self.resolve(path)?;
        let (parent, name) = split_parent(&p);
        if name.is_empty() {
            return Err(error::is_a_directory(&p));
        }
        let backend = self.sh.engine.backend();
        let tar = tar_stream::single_file(&name, &data, 0o644)
            .map_err(|e| error::io(backend, "building the archive", e))?;
        let tar = Bytes::from(tar);
        let body = || futures::stream::once(futures::future::ready(Ok(tar.clone()))).boxed();
        let e = match self.put(&parent, body()).await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if e.kind == EngineErrorKind::NotFound && self.sh.container_running().await {
            // The parent is missing: create it, then write once more.
            self.mkdir_p(&parent).await?;
            return match self.put(&parent, body()).await {
                Ok(()) => Ok(()),
                Err(e) => Err(self.write_error(&p, e).await),
            };
        }
        Err(self.write_error(&p, e).await)
    }

    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        let p = self.resolve(remote)?;
        let (parent, name) = split_parent(&p);
        if name.is_empty() {
            return Err(SandboxError::config(
                "cannot upload onto `/`",
                "name a target path below `/`",
            ));
        }
        let backend = self.sh.engine.backend();
        std::fs::symlink_metadata(local).map_err(|e| {
            error::file(
                &local.display().to_string(),
                "upload source",
                Some(Box::new(e)),
            )
        })?;
        match self
            .sh
            .call("stat", self.sh.engine.stat_path(&self.sh.id, &parent))
            .await
        {
            Ok(s) if s.is_dir => {}
            Ok(_) => return Err(error::file(&parent, "not a directory", None)),
            Err(e) if e.kind == EngineErrorKind::NotFound => self.mkdir_p(&parent).await?,
            Err(e) => return Err(self.missing(&parent, "stat", e).await),
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel(tar_stream::CHUNKS_IN_FLIGHT);
        let local_owned = local.to_path_buf();
        // If this future is dropped, `rx` goes with it and the producer's next send fails,
        // which stops it.
        let producer =
            tokio::task::spawn_blocking(move || tar_stream::stream_local(tx, &local_owned, &name));
        let body = futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed();
        // Not bounded by the call timeout: an upload takes as long as its size needs; the
        // engine answering nothing is still caught by the body ending.
        let sent = self.sh.engine.put_archive(&self.sh.id, &parent, body).await;
        let produced = producer
            .await
            .map_err(|e| error::internal(backend, format!("archive producer failed: {e}")))?;
        if let Err(e) = produced {
            return Err(error::file(
                &local.display().to_string(),
                "reading the upload source",
                Some(Box::new(e)),
            ));
        }
        match sent {
            Ok(()) => Ok(()),
            Err(e) => Err(self.missing(&p, "archive upload", e).await),
        }
    }

    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        let p = self.resolve(remote)?;
        let body = self.get(&p).await?;
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel = CancelOnDrop(cancelled.clone());
        let idle = self.sh.config.call_timeout;
        let body = body.then(move |chunk| {
            let cancelled = cancelled.clone();
            async move {
                if cancelled.load(Ordering::SeqCst) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::Interrupted,
                        "download cancelled",
                    ));
                }
                chunk
            }
        });
        let body = idle_bounded(body.boxed(), idle);
        let reader = tokio_util::io::StreamReader::new(body);
        let bridge = tokio_util::io::SyncIoBridge::new(reader);
        let local = local.to_path_buf();
        let backend = self.sh.engine.backend();
        tokio::task::spawn_blocking(move || tar_stream::unpack_safely(bridge, &local))
            .await
            .map_err(|e| error::internal(backend, format!("archive unpacker failed: {e}")))?
    }

    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        let p = self.resolve(path)?;
        let r = self.script(&p, LS_SCRIPT, &[&p]).await?;
        parse_listing(&p, &r.stdout).ok_or_else(|| {
            error::file(
                &p,
                "the listing was malformed (an entry named `.`, `..` or with `/`)",
                None,
            )
        })
    }

    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let p = self.resolve(path)?;
        let (parent, _) = split_parent(&p);
        let flag = if parents { "1" } else { "0" };
        self.script(&p, MKDIR_SCRIPT, &[&p, flag, &parent])
            .await
            .map(|_| ())
    }

    async fn remove(&self, path: &str) -> Result<()> {
        let p = self.resolve(path)?;
        if p == "/" {
            return Err(SandboxError::config(
                "refusing to remove `/`",
                "remove paths below `/`",
            ));
        }
        self.script(&p, REMOVE_SCRIPT, &[&p]).await.map(|_| ())
    }

    async fn stat(&self, path: &str) -> Result<FileInfo> {
        let p = self.resolve(path)?;
        match self
            .sh
            .call("stat", self.sh.engine.stat_path(&self.sh.id, &p))
            .await
        {
            Ok(s) => Ok(FileInfo::new(
                p,
                s.size,
                s.is_dir,
                s.mode & 0o7777,
                s.modified,
            )),
            Err(e) => Err(self.missing(&p, "stat", e).await),
        }
    }
}

impl<E: ContainerEngine> ContainerFiles<E> {
    /// A failed archive write: a directory in the way is `IsADirectory`.
    async fn write_error(&self, path: &str, e: EngineError) -> SandboxError {
        if let Ok(s) = self
            .sh
            .call("stat", self.sh.engine.stat_path(&self.sh.id, path))
            .await
        {
            if s.is_dir {
                return error::is_a_directory(path);
            }
        }
        self.missing(path, "archive upload", e).await
    }
}

/// Bounds each wait for the next chunk by `idle` (a wedged engine ends the stream with
/// `TimedOut` instead of hanging the transfer).
fn idle_bounded(body: ArchiveBody, idle: Duration) -> ArchiveBody {
    futures::stream::unfold(Some(body), move |state| async move {
        let mut body = state?;
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(item)) => Some((item, Some(body))),
            Ok(None) => None,
            Err(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the engine sent no archive data for {idle:?}"),
                )),
                None,
            )),
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_parses_nul_separated_records() {
        let out = b"12 81a4 100\nmy file.txt\x004096 41ed 0\nsub\x00";
        let v = parse_listing("/work", out).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].name.as_str(), v[0].size, v[0].is_dir, v[0].mode),
            ("my file.txt", 12, false, 0o644)
        );
        assert_eq!(v[0].path, "/work/my file.txt");
        assert!(v[1].is_dir && v[1].path == "/work/sub");
        assert_eq!(parse_listing("/", b"").unwrap(), vec![]);
    }

    #[test]
    fn a_newline_in_a_name_cannot_forge_an_entry() {
        // A file named "x\n0 41ed 0 .." is one entry with that odd name, not `..`.
        let out = b"1 81a4 5\nx\n0 41ed 0 ..\x00";
        let v = parse_listing("/w", out).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].name, "x\n0 41ed 0 ..");
    }

    #[test]
    fn dot_dotdot_and_slash_names_are_refused() {
        for bad in [
            &b"0 41ed 0\n.\x00"[..],
            b"0 41ed 0\n..\x00",
            b"0 81a4 0\na/b\x00",
            b"0 81a4 0\n\x00",
            b"junk\x00",
        ] {
            assert!(parse_listing("/w", bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn parents() {
        assert_eq!(
            split_parent("/work/a.txt"),
            ("/work".into(), "a.txt".into())
        );
        assert_eq!(split_parent("/a"), ("/".into(), "a".into()));
        assert_eq!(split_parent("/"), ("/".into(), "".into()));
    }

    /// The helper scripts run under the host's `sh` (dash or busybox ash) as they do in a
    /// sandbox.
    #[test]
    fn ls_script_lists_odd_names_nul_separated() {
        let dir = std::env::temp_dir().join(format!("sbx-ls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("x\n0 41ed 0 .."), b"abc").unwrap();
        std::fs::write(dir.join(".hidden"), b"").unwrap();
        std::fs::write(dir.join("..odd"), b"").unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", LS_SCRIPT, "sbx-files"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let d = dir.to_str().unwrap();
        let mut names: Vec<String> = parse_listing(d, &out.stdout)
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect();
        names.sort();
        assert_eq!(names, vec!["..odd", ".hidden", "sub", "x\n0 41ed 0 .."]);
        let code = |script: &str, args: &[&str]| {
            std::process::Command::new("sh")
                .args(["-c", script, "sbx-files"])
                .args(args)
                .status()
                .unwrap()
                .code()
        };
        let missing = format!("{d}/nope");
        assert_eq!(code(LS_SCRIPT, &[&missing]), Some(3));
        assert_eq!(code(LS_SCRIPT, &[&format!("{d}/.hidden")]), Some(4));
        assert_eq!(code(MKDIR_SCRIPT, &[&format!("{d}/sub"), "0", d]), Some(5));
        assert_eq!(
            code(MKDIR_SCRIPT, &[&format!("{missing}/a"), "0", &missing]),
            Some(3)
        );
        assert_eq!(
            code(MKDIR_SCRIPT, &[&format!("{d}/a/b/c"), "1", "/"]),
            Some(0)
        );
        assert_eq!(code(REMOVE_SCRIPT, &[&missing]), Some(3));
        assert_eq!(code(REMOVE_SCRIPT, &[&format!("{d}/a")]), Some(0));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
