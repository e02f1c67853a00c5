//! Files on the engine path: the archive API for content (streamed both ways), the
//! engine's path stat for `stat`, and one set of busybox-compatible helper scripts for
//! `ls`, `mkdir`, `remove`. A sandbox with an agent sends everything but `upload` and
//! `download` through it instead (`files_agent.rs`).
//!
//! Helper exit codes, the same for every engine: 3 not found, 4 not a directory, 5
//! already exists, 6 a listing failed, 7 the operation failed. `ls` output is
//! NUL-separated records `<size> <raw mode hex> <mtime>\n<name>`; a name of `.`, `..`, or
//! one containing `/` cannot come from the script, so a listing holding one is refused as
//! forged instead of trusted.

mod agent;
mod archive;
pub(crate) mod tar_stream;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use sandbox_core::{FileInfo, FileSystem, Result, SandboxError, async_trait, resolve_path};

use crate::engine::{ArchiveBody, ContainerEngine, EngineError, EngineErrorKind};
use crate::error;
use crate::files::agent::AgentFiles;
use crate::files::archive::{ArchiveReader, DownloadLimits, FirstEntry, GuardedReader, Refusal};
use crate::sandbox::exec::helper_argv;
use crate::sandbox::shared::Shared;

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

    /// The agent's file operations, when this sandbox has an agent.
    fn agent(&self) -> Option<AgentFiles> {
        self.sh.agent().map(|client| AgentFiles {
            client,
            call_timeout: self.sh.config.call_timeout,
            read_cap: self.sh.config.read_cap,
        })
    }

    fn resolve(&self, path: &str) -> Result<String> {
        self.sh.remaining()?;
        self.sh.refuse_if_paused()?;
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
/// dropped (its next read fails and the unpack cleans up after itself).
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
        match self.agent() {
            Some(a) => a.read(&p).await,
            None => self.read_resolved(&p).await,
        }
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        let p = self.resolve(path)?;
        let (parent, name) = split_parent(&p);
        if name.is_empty() {
            return Err(error::is_a_directory(&p));
        }
        if let Some(a) = self.agent() {
            return a.write(&p, &parent, &data).await;
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
        // Not bounded by the call timeout as a whole (an upload takes as long as its size
        // needs); every engine fails an upload it stops reading (`transfer::bounded_upload`
        // in its `put_archive`), so the stall bound is applied once, there.
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
        let limits = DownloadLimits {
            bytes: self.sh.config.download_cap,
            entries: self.sh.config.download_entries,
        };
        download_archive(
            body,
            local,
            limits,
            self.sh.config.call_timeout,
            self.sh.engine.backend(),
        )
        .await
    }

    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        let p = self.resolve(path)?;
        if let Some(a) = self.agent()
            && let Some(listing) = a.ls(&p).await?
        {
            return Ok(listing);
        }
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
        if let Some(a) = self.agent() {
            return a.mkdir(&p, parents).await;
        }
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
        if let Some(a) = self.agent() {
            return a.remove(&p).await;
        }
        self.script(&p, REMOVE_SCRIPT, &[&p]).await.map(|_| ())
    }

    async fn stat(&self, path: &str) -> Result<FileInfo> {
        let p = self.resolve(path)?;
        if let Some(a) = self.agent() {
            return a.stat(&p).await;
        }
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
            && s.is_dir
        {
            return error::is_a_directory(path);
        }
        self.missing(path, "archive upload", e).await
    }
}

/// Unpacks the engine's archive of a download onto `local`, bounded by `limits`.
///
/// The archive is unpacked (by `tar_stream::unpack_safely`, which refuses escaping
/// entries) into a private staging directory next to `local` (mode 0700, so nobody sees
/// the half-written tree), the modes the sandbox chose are masked (no setuid, setgid,
/// sticky or group/world-writable bit reaches the host), and only then is the result
/// renamed onto `local`: an existing file there is replaced, never truncated in place
/// through its hard links, and a failed, refused or cancelled download leaves `local`
/// untouched and no staging directory behind. Dropping the returned future stops the
/// transfer (the engine stream ends and the unpacker's next read fails).
pub(crate) async fn download_archive(
    body: ArchiveBody,
    local: &Path,
    limits: DownloadLimits,
    idle: Duration,
    backend: &str,
) -> Result<()> {
    let staging = Staging::create(local)?;
    let cancelled = Arc::new(AtomicBool::new(false));
    let _cancel = CancelOnDrop(cancelled.clone());
    // Dropped with this future: the body ends at once even while the engine is silent.
    let (_stop, stopped) = futures::channel::oneshot::channel::<()>();
    let body = crate::engine::transfer::idle_bounded(body, idle)
        .take_until(stopped)
        .boxed();
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(body));
    let local = local.to_path_buf();
    tokio::task::spawn_blocking(move || staging.unpack(reader, &local, limits, &cancelled))
        .await
        .map_err(|e| error::internal(backend, format!("archive unpacker failed: {e}")))?
}

/// The private directory a download is unpacked into before it is renamed into place.
/// Removed when dropped (also when the unpack failed or was cancelled).
struct Staging {
    dir: PathBuf,
}

impl Staging {
    fn create(local: &Path) -> Result<Staging> {
        use std::os::unix::fs::DirBuilderExt;
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let parent = match local.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let shown = local.display().to_string();
        std::fs::create_dir_all(&parent)
            .map_err(|e| error::file(&shown, "creating the parent directory", Some(Box::new(e))))?;
        let name = local
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = parent.join(format!(
            ".{name}.sbx-download-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                error::file(&shown, "creating the staging directory", Some(Box::new(e)))
            })?;
        Ok(Staging { dir })
    }

    /// Blocking: unpacks, masks modes, renames into place.
    fn unpack<R: std::io::Read>(
        self,
        reader: R,
        local: &Path,
        limits: DownloadLimits,
        cancelled: &Arc<AtomicBool>,
    ) -> Result<()> {
        let refusal = Arc::new(Mutex::new(None));
        let guarded = GuardedReader::new(reader, limits, cancelled.clone(), refusal.clone());
        let root = self.dir.join("root");
        let shown = local.display().to_string();
        let unpacked = tar_stream::unpack_safely(guarded, &root);
        let refused = refusal.lock().ok().and_then(|r| r.clone());
        match (unpacked, refused) {
            (_, Some(Refusal::TooLarge { total })) => {
                return Err(error::limit(
                    format!(
                        "download cap ({} bytes; the archive of `{shown}` announces {total})",
                        limits.bytes
                    ),
                    "download a smaller file or directory, or raise the adapter's \
                     download_cap (e.g. DockerConfig::download_cap; it bounds what a sandbox \
                     can write to this host's disk)",
                ));
            }
            (_, Some(Refusal::TooManyEntries)) => {
                return Err(error::limit(
                    format!("download entries ({} entries)", limits.entries),
                    "download a smaller directory, pack it into one archive file inside the \
                     sandbox first, or raise the adapter's download_entries",
                ));
            }
            (_, Some(r @ (Refusal::Cancelled | Refusal::Malformed(_)))) => {
                return Err(error::file(&shown, r.to_string(), None));
            }
            (Err(e), None) => return Err(e),
            (Ok(()), None) => {}
        }
        if cancelled.load(Ordering::SeqCst) {
            return Err(error::file(&shown, Refusal::Cancelled.to_string(), None));
        }
        mask_modes(&root)
            .map_err(|e| error::file(&shown, "masking the downloaded modes", Some(Box::new(e))))?;
        std::fs::rename(&root, local).map_err(|e| {
            error::file(
                &shown,
                "moving the download into place (an existing directory there is never merged \
                 into)",
                Some(Box::new(e)),
            )
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Drops every mode bit a sandbox must not choose for the host: setuid, setgid, sticky,
/// group and world write. Directories keep `u+rwx`. Symlinks are not followed.
fn mask_modes(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // Iterative: a hostile tree may be as deep as the host's path length allows.
    let mut todo = vec![root.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o755;
        if meta.is_dir() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode | 0o700))?;
            for e in std::fs::read_dir(&path)? {
                todo.push(e?.path());
            }
        } else if meta.is_file() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
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

    /// A fresh directory under the temp dir, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "sbx-dl-test-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
        /// Names in the directory (the staging directory must never stay behind).
        fn names(&self) -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// One entry with a raw name, link name and mode (no path checks: hostile archives).
    fn entry(
        b: &mut tar::Builder<Vec<u8>>,
        name: &str,
        kind: tar::EntryType,
        link: &str,
        mode: u32,
        data: &[u8],
    ) {
        let mut h = tar::Header::new_old();
        {
            let old = h.as_old_mut();
            old.name[..name.len()].copy_from_slice(name.as_bytes());
            old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn body_of(bytes: Vec<u8>) -> ArchiveBody {
        let chunks: Vec<std::io::Result<Bytes>> = bytes
            .chunks(4096)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures::stream::iter(chunks).boxed()
    }

    const LIMITS: DownloadLimits = DownloadLimits {
        bytes: 1 << 20,
        entries: 100,
    };

    async fn download(bytes: Vec<u8>, local: &Path, limits: DownloadLimits) -> Result<()> {
        download_archive(
            body_of(bytes),
            local,
            limits,
            Duration::from_secs(5),
            "test",
        )
        .await
    }

    fn mode_of(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// Attack: a symlink inside the downloaded tree pointing at /etc/shadow.
    #[tokio::test]
    async fn download_refuses_a_link_to_etc_shadow_and_leaves_nothing() {
        let dir = Scratch::new("shadow");
        let mut b = tar::Builder::new(Vec::new());
        entry(&mut b, "d/", tar::EntryType::Directory, "", 0o755, b"");
        entry(
            &mut b,
            "d/ok.txt",
            tar::EntryType::Regular,
            "",
            0o644,
            b"ok",
        );
        entry(
            &mut b,
            "d/shadow",
            tar::EntryType::Symlink,
            "/etc/shadow",
            0o777,
            b"",
        );
        let out = dir.0.join("out");
        let e = download(b.into_inner().unwrap(), &out, LIMITS)
            .await
            .unwrap_err();
        assert_eq!(e.code(), sandbox_core::ErrorCode::UnsafeArchiveEntry, "{e}");
        assert!(dir.names().is_empty(), "left behind: {:?}", dir.names());
    }

    /// Attack: a 4 GiB sparse file inside (sent densely, so announced as 4 GiB): refused
    /// from its header, before a byte of it is written.
    #[tokio::test]
    async fn download_refuses_a_huge_file_from_its_header() {
        let dir = Scratch::new("huge");
        let mut h = tar::Header::new_gnu();
        h.set_path("huge").unwrap();
        h.set_size(4 << 30);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        // Only the header and a little data: the refusal must not wait for the rest.
        let mut bytes = h.as_bytes().to_vec();
        bytes.extend(vec![0u8; 64 * 1024]);
        let out = dir.0.join("huge");
        let limits = DownloadLimits {
            bytes: crate::DEFAULT_DOWNLOAD_CAP,
            entries: 10,
        };
        let e = download(bytes, &out, limits).await.unwrap_err();
        assert_eq!(
            e.code(),
            sandbox_core::ErrorCode::ResourceLimitExceeded,
            "{e}"
        );
        assert!(dir.names().is_empty(), "left behind: {:?}", dir.names());
    }

    #[tokio::test]
    async fn download_entry_count_is_bounded() {
        let dir = Scratch::new("entries");
        let mut b = tar::Builder::new(Vec::new());
        entry(&mut b, "d/", tar::EntryType::Directory, "", 0o755, b"");
        for i in 0..20 {
            entry(
                &mut b,
                &format!("d/f{i}"),
                tar::EntryType::Regular,
                "",
                0o644,
                b"",
            );
        }
        let out = dir.0.join("d");
        let limits = DownloadLimits {
            bytes: 1 << 20,
            entries: 10,
        };
        let e = download(b.into_inner().unwrap(), &out, limits)
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            sandbox_core::ErrorCode::ResourceLimitExceeded,
            "{e}"
        );
        assert!(dir.names().is_empty(), "left behind: {:?}", dir.names());
    }

    /// Attack: setuid, setgid, sticky and world-writable modes chosen by the sandbox.
    #[tokio::test]
    async fn download_masks_the_sandboxs_modes() {
        let dir = Scratch::new("modes");
        let mut b = tar::Builder::new(Vec::new());
        entry(&mut b, "d/", tar::EntryType::Directory, "", 0o1777, b"");
        entry(
            &mut b,
            "d/suid",
            tar::EntryType::Regular,
            "",
            0o4777,
            b"#!/bin/sh\n",
        );
        entry(&mut b, "d/sgid", tar::EntryType::Regular, "", 0o2775, b"x");
        let out = dir.0.join("d");
        download(b.into_inner().unwrap(), &out, LIMITS)
            .await
            .unwrap();
        assert_eq!(mode_of(&out), 0o755);
        assert_eq!(mode_of(&out.join("suid")), 0o755);
        assert_eq!(mode_of(&out.join("sgid")), 0o755);
        assert_eq!(dir.names(), vec!["d"]);

        let single = crate::files::tar_stream::single_file("f", b"data", 0o6777).unwrap();
        let f = dir.0.join("f");
        download(single, &f, LIMITS).await.unwrap();
        assert_eq!(mode_of(&f), 0o755);
        assert_eq!(std::fs::read(&f).unwrap(), b"data");
    }

    /// An existing file is replaced by a rename, never truncated through its hard links.
    #[tokio::test]
    async fn download_replaces_instead_of_truncating_in_place() {
        let dir = Scratch::new("replace");
        let target = dir.0.join("t");
        let other = dir.0.join("other-link");
        std::fs::write(&target, b"precious").unwrap();
        std::fs::hard_link(&target, &other).unwrap();
        let single = crate::files::tar_stream::single_file("t", b"new", 0o644).unwrap();
        download(single, &target, LIMITS).await.unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(std::fs::read(&other).unwrap(), b"precious");
        assert_eq!(dir.names(), vec!["other-link", "t"]);
    }

    /// A dropped download stops reading from the engine and removes what it staged.
    #[tokio::test(flavor = "multi_thread")]
    async fn dropped_download_stops_and_removes_its_staging() {
        let dir = Scratch::new("drop");
        let mut h = tar::Header::new_gnu();
        h.set_path("big").unwrap();
        h.set_size(512 << 10);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        let head = Bytes::copy_from_slice(h.as_bytes());
        let first = Bytes::from(vec![7u8; 64 << 10]);
        // The header and some data, then an engine that sends nothing more.
        let body: ArchiveBody = futures::stream::iter(vec![Ok(head), Ok(first)])
            .chain(futures::stream::pending())
            .boxed();
        let out = dir.0.join("big");
        let d = download_archive(body, &out, LIMITS, Duration::from_secs(60), "test");
        let r = tokio::time::timeout(Duration::from_millis(500), d).await;
        assert!(
            r.is_err(),
            "the download finished on a silent engine: {r:?}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !dir.names().is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(dir.names().is_empty(), "left behind: {:?}", dir.names());
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
