//! The agent binary as a file on this host, for engines that bind-mount it read-only into
//! every sandbox (docs/agent.md): where the copy lives, which directories may hold it, how
//! it is written, and the check of its bytes before every mount. When anything here fails
//! the caller uploads the agent into the container instead; a file that was not just
//! checked is never handed to the engine.
//!
//! Why so strict: the file becomes PID 1 of every sandbox, and the engine (root) opens it by
//! path after the check. Every directory from `/` down to the copy must be writable only by
//! the effective user and root, so nobody else can swap the file or a directory between
//! the check and the mount; the effective user and root could do worse anyway.

use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::endpoint::discovery::EnvSnapshot;

/// Mode of the copy: executable by the engine's runtime, writable by its owner only.
const FILE_MODE: u32 = 0o755;

/// The host copy of this build's agent, just checked, for the agent mount of the next
/// create; `None` (the caller uploads instead) when no binary ships for this architecture,
/// no cache directory is known, the effective uid is unknown (no `/proc`), or the cache is
/// refused or cannot be written. Called for every create that mounts the agent.
pub(crate) async fn host_copy() -> Option<PathBuf> {
    static CACHE: OnceLock<Option<AgentCache>> = OnceLock::new();
    static WARNED: AtomicBool = AtomicBool::new(false);
    let bin = crate::sandbox::agent::binary()?;
    let cache = CACHE
        .get_or_init(|| AgentCache::from_env(&EnvSnapshot::capture()))
        .as_ref()?;
    match tokio::task::spawn_blocking(move || cache.mount_source(bin)).await {
        Ok(Ok(path)) => Some(path),
        Ok(Err(e)) => {
            // Said once at `warn` (the upload costs every create ~1.5 MiB), then quietly.
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "the agent is uploaded into every sandbox instead of mounted");
            } else {
                tracing::debug!(error = %e, "no host copy of the agent; it is uploaded instead");
            }
            None
        }
        Err(_) => None,
    }
}

/// Why the host copy cannot be used; the caller uploads the agent instead.
#[derive(Debug)]
pub(crate) enum CacheError {
    /// A directory on the way to the copy could be written by someone other than the
    /// effective user and root, or is not what it must be.
    Untrusted {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        why: Untrusted,
    },
    /// Reading or writing failed.
    Io {
        /// What was done.
        step: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The copy just written does not read back as the agent (someone with the effective
    /// user's rights is changing it).
    Unverified {
        /// The copy.
        path: PathBuf,
        /// What was found instead.
        found: Mismatch,
    },
}

/// What is wrong with a directory on the way to the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Untrusted {
    /// Owned by another uid than the effective user's (or, above our own two
    /// directories, root's).
    Owner(u32),
    /// Writable by group or others (not a root- or self-owned sticky directory), or, for
    /// our own two directories, any group or other permission at all.
    Mode(u32),
    /// A symbolic link where our own directory must be.
    Symlink,
    /// Not a directory.
    NotADirectory,
    /// The path has `..` in it.
    NotNormal,
}

/// How a file at the copy's name differs from this build's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// A symbolic link.
    Symlink,
    /// Not a regular file.
    NotAFile,
    /// Owned by another uid.
    Owner(u32),
    /// Another mode than 0755.
    Mode(u32),
    /// Other bytes.
    Content,
}

impl std::fmt::Display for CacheError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheError::Untrusted { path, why } => {
                let path = path.display();
                match why {
                    Untrusted::Owner(uid) => write!(
                        f,
                        "{path} is owned by uid {uid}: the agent's cache must be in directories owned by this user (or root); set XDG_CACHE_HOME to a directory of this user's (as root, of root's)"
                    ),
                    Untrusted::Mode(mode) => write!(
                        f,
                        "{path} has mode {mode:04o}: others could replace the agent there; make it private (chmod go-w, 0700 for sandbox-rs/ and agent/) or set XDG_CACHE_HOME elsewhere"
                    ),
                    Untrusted::Symlink => write!(
                        f,
                        "{path} is a symbolic link: the agent's own cache directories must be real directories; remove it"
                    ),
                    Untrusted::NotADirectory => write!(f, "{path} is not a directory"),
                    Untrusted::NotNormal => {
                        write!(
                            f,
                            "{path} contains `..`: give the cache directory as a plain absolute path"
                        )
                    }
                }
            }
            CacheError::Io { step, path, source } => {
                write!(f, "cannot {step} {}: {source}", path.display())
            }
            CacheError::Unverified { path, found } => write!(
                f,
                "{} does not read back as the agent just written ({found:?}): something else writes there",
                path.display()
            ),
        }
    }
}

impl std::error::Error for CacheError {}

/// Where the host copy lives and whose it must be: `<base>/sandbox-rs/agent/`, every
/// directory on the way owned by `euid` or root and not writable by others, the last two
/// owned by `euid` with no group or other permission. Each [`AgentCache::mount_source`]
/// checks the directories and the file's identity again; the file's bytes are read again
/// only when its identity changed since they were last compared (see [`Identity`]).
pub(crate) struct AgentCache {
    base: PathBuf,
    euid: u32,
    /// The copy whose bytes were last compared equal to the agent, and its identity then.
    verified: std::sync::Mutex<Option<(PathBuf, Identity)>>,
    /// The file name of the last binary asked for, by its address and length (the agent
    /// is a static: hashing its 1.7 MiB for the name took 1.4 ms of every create).
    named: std::sync::Mutex<Option<((usize, usize), String)>>,
}

/// What the file system says of a file, enough to know its bytes did not change: the
/// same inode of the same device (a rename onto the path makes another), the same size,
/// owner and mode, and the same modification and change times. Any write, truncation,
/// `chmod` or `chown` sets the change time to the current time, which no call can set
/// back, so equal identities mean the bytes compared before are still the bytes. The
/// file system's clock is coarse (a change within the same tick as the last one keeps the
/// change time), so a comparison is remembered only for a file whose last change is
/// older than [`SETTLED`]: any later change then shows a change time of its own.
/// Reading and comparing the 1.7 MiB on every create took 1.7 ms of each create here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    len: u64,
    uid: u32,
    mode: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// How long ago a file's last change must be for a comparison of its bytes to be
/// remembered: far more than any file system clock's tick.
const SETTLED: std::time::Duration = std::time::Duration::from_millis(200);

impl Identity {
    /// Whether the file's last change is older than [`SETTLED`].
    fn settled(&self) -> bool {
        let (secs, nanos) = self.ctime;
        let changed = u64::try_from(secs).ok().map(|s| {
            std::time::UNIX_EPOCH + std::time::Duration::new(s, nanos.clamp(0, 999_999_999) as u32)
        });
        changed.is_some_and(|c| {
            std::time::SystemTime::now()
                .duration_since(c)
                .is_ok_and(|age| age >= SETTLED)
        })
    }

    fn of(meta: &std::fs::Metadata) -> Identity {
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            uid: meta.uid(),
            mode: meta.mode(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// The two directories below the base that are ours alone.
const OWN_LEVELS: [&str; 2] = ["sandbox-rs", "agent"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// `/` down to the base: the effective user's or root's, not writable by others.
    Above,
    /// Our own directories: the effective user's, 0700.
    Own,
}

impl AgentCache {
    fn from_env(env: &EnvSnapshot) -> Option<Self> {
        let base = cache_base(env)?;
        let Some(euid) = effective_uid() else {
            tracing::debug!("the effective uid is unknown (no /proc); the agent is uploaded");
            return None;
        };
        Some(Self::new(base, euid))
    }

    /// The cache under `base` (an absolute path) for a process whose effective uid is
    /// `euid`.
    pub(crate) fn new(base: PathBuf, euid: u32) -> Self {
        Self {
            base,
            euid,
            verified: std::sync::Mutex::new(None),
            named: std::sync::Mutex::new(None),
        }
    }

    /// [`file_name`] of `bin`, hashed once per binary.
    fn name_of(&self, bin: &[u8]) -> String {
        let key = (bin.as_ptr() as usize, bin.len());
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        match &*named {
            Some((k, name)) if *k == key => name.clone(),
            _ => {
                let name = file_name(bin);
                *named = Some((key, name.clone()));
                name
            }
        }
    }

    /// The path of a copy of `bin` that was checked just now: the directories on the way
    /// are trusted, and the file is a regular file of ours, 0755, with exactly these
    /// bytes. A missing or different file is (re)written first, through a fresh temporary
    /// file and a rename, and checked again.
    pub(crate) fn mount_source(&self, bin: &[u8]) -> Result<PathBuf, CacheError> {
        let dir = self.trusted_dir()?;
        let path = dir.join(self.name_of(bin));
        match self.check_copy(&path, bin)? {
            None => return Ok(path),
            Some(Found::Missing) => {}
            Some(Found::Other(found)) => tracing::warn!(
                path = %path.display(),
                found = ?found,
                "the cached agent binary is not this build's agent; replacing it"
            ),
        }
        self.write_copy(&dir, &path, bin)?;
        match self.check_copy(&path, bin)? {
            None => Ok(path),
            Some(Found::Missing) => Err(CacheError::Io {
                step: "find the copy just written at",
                path,
                source: io::ErrorKind::NotFound.into(),
            }),
            Some(Found::Other(found)) => Err(CacheError::Unverified { path, found }),
        }
    }

    /// `<base>/sandbox-rs/agent` as a canonical path, created (0700) where missing, every
    /// directory from `/` down checked. A symbolic link above our own directories is
    /// followed and its target checked from `/`: the returned path names only checked
    /// directories, so what the link says later does not matter.
    fn trusted_dir(&self) -> Result<PathBuf, CacheError> {
        let mut names = Vec::new();
        for c in self.base.components() {
            match c {
                Component::RootDir => {}
                Component::Normal(n) => names.push((n.to_owned(), Level::Above)),
                _ => {
                    return Err(CacheError::Untrusted {
                        path: self.base.clone(),
                        why: Untrusted::NotNormal,
                    });
                }
            }
        }
        if !self.base.is_absolute() {
            return Err(CacheError::Untrusted {
                path: self.base.clone(),
                why: Untrusted::NotNormal,
            });
        }
        names.extend(OWN_LEVELS.iter().map(|n| (n.into(), Level::Own)));

        let mut cur = PathBuf::from("/");
        self.check_dir(&cur, &lstat(&cur)?, Level::Above)?;
        for (name, level) in names {
            let next = cur.join(&name);
            let meta = match std::fs::symlink_metadata(&next) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // Created in a directory only we (and root) can write: no one can put
                    // anything else there before the check below.
                    match std::fs::DirBuilder::new().mode(0o700).create(&next) {
                        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                            return Err(io_err("create", &next, e));
                        }
                        _ => lstat(&next)?,
                    }
                }
                r => r.map_err(|e| io_err("inspect", &next, e))?,
            };
            if meta.file_type().is_symlink() {
                if level == Level::Own {
                    return Err(CacheError::Untrusted {
                        path: next,
                        why: Untrusted::Symlink,
                    });
                }
                let target =
                    std::fs::canonicalize(&next).map_err(|e| io_err("resolve", &next, e))?;
                self.check_chain(&target)?;
                cur = target;
                continue;
            }
            self.check_dir(&next, &meta, level)?;
            cur = next;
        }
        Ok(cur)
    }

    /// Every directory of the canonical path `dir`, from `/`, as an upper level.
    fn check_chain(&self, dir: &Path) -> Result<(), CacheError> {
        let mut cur = PathBuf::new();
        for c in dir.components() {
            cur.push(c);
            let meta = lstat(&cur)?;
            if meta.file_type().is_symlink() {
                // Canonical a moment ago: it changed, which only its owner can do.
                return Err(CacheError::Untrusted {
                    path: cur,
                    why: Untrusted::Symlink,
                });
            }
            self.check_dir(&cur, &meta, Level::Above)?;
        }
        Ok(())
    }

    fn check_dir(
        &self,
        path: &Path,
        meta: &std::fs::Metadata,
        level: Level,
    ) -> Result<(), CacheError> {
        let refuse = |why| {
            Err(CacheError::Untrusted {
                path: path.to_path_buf(),
                why,
            })
        };
        if !meta.is_dir() {
            return refuse(Untrusted::NotADirectory);
        }
        let (owner, mode) = (meta.uid(), meta.mode() & 0o7777);
        match level {
            Level::Above => {
                if owner != self.euid && owner != 0 {
                    return refuse(Untrusted::Owner(owner));
                }
                // A sticky directory (`/tmp`) lets others add entries, never rename or
                // remove ours; an entry of theirs is refused when it is checked.
                if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                    return refuse(Untrusted::Mode(mode));
                }
            }
            Level::Own => {
                if owner != self.euid {
                    return refuse(Untrusted::Owner(owner));
                }
                if mode & 0o077 != 0 {
                    return refuse(Untrusted::Mode(mode));
                }
            }
        }
        Ok(())
    }

    /// `None` when `path` is a regular file of ours, 0755, holding exactly `bin`; read
    /// through a descriptor opened without following a symbolic link.
    fn check_copy(&self, path: &Path, bin: &[u8]) -> Result<Option<Found>, CacheError> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            // Not through a link; and a FIFO planted at the name does not block the open.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Some(Found::Missing)),
            // O_NOFOLLOW on a symbolic link.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Ok(Some(Found::Other(Mismatch::Symlink)));
            }
            Err(e) => return Err(io_err("open", path, e)),
        };
        let meta = file.metadata().map_err(|e| io_err("inspect", path, e))?;
        let identity = Identity::of(&meta);
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified
            .as_ref()
            .is_some_and(|(p, id)| p == path && *id == identity)
        {
            return Ok(None);
        }
        let found = if !meta.is_file() {
            Some(Mismatch::NotAFile)
        } else if meta.uid() != self.euid {
            Some(Mismatch::Owner(meta.uid()))
        } else if meta.mode() & 0o7777 != FILE_MODE {
            Some(Mismatch::Mode(meta.mode() & 0o7777))
        } else if meta.len() != bin.len() as u64 {
            Some(Mismatch::Content)
        } else {
            // Compared byte for byte with the embedded binary (a memcmp of 1.5 MiB,
            // cheaper than hashing it); one byte more than expected means different.
            let mut have = Vec::with_capacity(bin.len() + 1);
            (&file)
                .take(bin.len() as u64 + 1)
                .read_to_end(&mut have)
                .map_err(|e| io_err("read", path, e))?;
            (have != bin).then_some(Mismatch::Content)
        };
        // Remembered only for a copy just compared equal, with the identity read through
        // the same open file before its bytes were.
        *verified = (found.is_none() && identity.settled()).then(|| (path.to_path_buf(), identity));
        Ok(found.map(Found::Other))
    }

    /// Writes `bin` to a new file with an unpredictable name in `dir` (created, never
    /// opened through an existing entry or link), sets its mode through the open file, and
    /// renames it onto `path` (replacing whatever is there, a link included, never writing
    /// through it).
    fn write_copy(&self, dir: &Path, path: &Path, bin: &[u8]) -> Result<(), CacheError> {
        let tmp = dir.join(format!(
            ".{}.{}.tmp",
            file_name(bin),
            crate::sandbox::exec::new_token()
        ));
        let written = (|| {
            let mut file = create_new_file(&tmp).map_err(|e| io_err("create", &tmp, e))?;
            file.write_all(bin).map_err(|e| io_err("write", &tmp, e))?;
            file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
                .map_err(|e| io_err("set the mode of", &tmp, e))?;
            drop(file);
            std::fs::rename(&tmp, path).map_err(|e| io_err("rename into place", path, e))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

/// A new file at `path`, 0700 until written: `create_new` (`O_CREAT|O_EXCL`) fails on any
/// existing entry, a symbolic link included, even a dangling one (which a plain `O_CREAT`
/// would follow and create the target of); `O_NOFOLLOW` says the same to a reader.
fn create_new_file(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// What [`AgentCache::check_copy`] found instead of the agent.
enum Found {
    Missing,
    Other(Mismatch),
}

fn lstat(path: &Path) -> Result<std::fs::Metadata, CacheError> {
    std::fs::symlink_metadata(path).map_err(|e| io_err("inspect", path, e))
}

fn io_err(step: &'static str, path: &Path, source: io::Error) -> CacheError {
    CacheError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// The process's effective uid, from `/proc/self/status` (`Uid:` real, effective, saved,
/// filesystem): without `unsafe`, and `None` where there is no `/proc`.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `$XDG_CACHE_HOME`, else `$HOME/.cache` (absolute paths only: a relative one would
/// depend on the working directory).
fn cache_base(env: &EnvSnapshot) -> Option<PathBuf> {
    env.get("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            env.get("HOME")
                .map(|h| Path::new(h).join(".cache"))
                .filter(|p| p.is_absolute())
        })
}

/// `sandbox-agent-<first 8 bytes of the SHA-256, hex>`: one name per binary version.
fn file_name(bin: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(bin);
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("sandbox-agent-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIN: &[u8] = b"\x7fELF the agent, as far as this test knows";

    fn euid() -> u32 {
        effective_uid().expect("/proc/self/status names the effective uid")
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn mkdir(p: &Path, mode: u32) {
        std::fs::create_dir_all(p).unwrap();
        chmod(p, mode);
    }

    fn agent_dir(base: &Path) -> PathBuf {
        base.join("sandbox-rs").join("agent")
    }

    fn entries(dir: &Path) -> Vec<String> {
        match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The usual case: 0755 in 0700 directories, named by content, the same path on the
    /// next use, another name for another version, no temporary file left behind.
    #[test]
    fn host_copy_is_content_addressed_private_and_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("cache");
        let cache = AgentCache::new(base.clone(), euid());
        let path = cache.mount_source(BIN).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), BIN);
        assert_eq!(mode(&path), 0o755);
        assert_eq!(mode(&base.join("sandbox-rs")), 0o700);
        assert_eq!(mode(&agent_dir(&base)), 0o700);
        assert_eq!(cache.mount_source(BIN).unwrap(), path);
        let v2 = AgentCache::new(base.clone(), euid())
            .mount_source(b"v2")
            .unwrap();
        assert_ne!(v2, path);
        let names = entries(&agent_dir(&base));
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }

    /// A cache directory others can write (a shared cache, a umask of 002) is refused, and
    /// nothing is written into it; so is one of our own directories with group bits.
    #[test]
    fn group_writable_cache_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("cache");
        mkdir(&base, 0o775);
        let r = AgentCache::new(base.clone(), euid()).mount_source(BIN);
        assert!(
            matches!(&r, Err(CacheError::Untrusted { path, why: Untrusted::Mode(0o775) }) if *path == base),
            "{r:?}"
        );
        assert!(!base.join("sandbox-rs").exists());

        chmod(&base, 0o755);
        mkdir(&agent_dir(&base), 0o770);
        chmod(&base.join("sandbox-rs"), 0o700);
        let r = AgentCache::new(base.clone(), euid()).mount_source(BIN);
        assert!(
            matches!(&r, Err(CacheError::Untrusted { path, why: Untrusted::Mode(0o770) }) if *path == agent_dir(&base)),
            "{r:?}"
        );
        assert_eq!(entries(&agent_dir(&base)), Vec::<String>::new());

        // The same directories made private again: accepted.
        chmod(&agent_dir(&base), 0o700);
        assert!(
            AgentCache::new(base.clone(), euid())
                .mount_source(BIN)
                .is_ok()
        );
    }

    /// A cache directory owned by another user is refused: as root, a directory chowned to
    /// `nobody` (root keeping a user's `HOME`, as `sudo -E` does); otherwise the process
    /// claims another uid than the owner of its temporary directory.
    #[test]
    fn cache_dir_owned_by_someone_else_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("cache");
        mkdir(&base, 0o755);
        let me = euid();
        let claimed = if me == 0 {
            std::os::unix::fs::chown(&base, Some(65534), Some(65534)).unwrap();
            0
        } else {
            me + 1
        };
        let r = AgentCache::new(base.clone(), claimed).mount_source(BIN);
        assert!(
            matches!(
                &r,
                Err(CacheError::Untrusted {
                    why: Untrusted::Owner(_),
                    ..
                })
            ),
            "{r:?}"
        );
        assert!(!base.join("sandbox-rs").exists());

        if me == 0 {
            // Our own level owned by another user, under a root-owned base.
            std::os::unix::fs::chown(&base, Some(0), Some(0)).unwrap();
            mkdir(&base.join("sandbox-rs"), 0o700);
            std::os::unix::fs::chown(base.join("sandbox-rs"), Some(65534), Some(65534)).unwrap();
            let r = AgentCache::new(base.clone(), 0).mount_source(BIN);
            assert!(
                matches!(&r, Err(CacheError::Untrusted { path, why: Untrusted::Owner(65534) }) if *path == base.join("sandbox-rs")),
                "{r:?}"
            );
            assert_eq!(entries(&agent_dir(&base)), Vec::<String>::new());
        }
    }

    /// Symbolic links planted at the temporary name the writer would have used (it was
    /// predictable: the pid) and at the final name point at a victim file: the victim keeps
    /// its bytes and its mode, and the copy is a regular file.
    #[test]
    fn planted_symlinks_are_not_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("cache");
        let dir = agent_dir(&base);
        mkdir(&dir, 0o700);
        chmod(&base.join("sandbox-rs"), 0o700);
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"victim").unwrap();
        chmod(&victim, 0o600);
        let name = file_name(BIN);
        std::os::unix::fs::symlink(
            &victim,
            dir.join(format!(".{name}.{}.tmp", std::process::id())),
        )
        .unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(&name)).unwrap();

        let path = AgentCache::new(base.clone(), euid())
            .mount_source(BIN)
            .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");
        assert_eq!(mode(&victim), 0o600);
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        assert_eq!(std::fs::read(&path).unwrap(), BIN);
    }

    /// The copy replaced after it was first checked (in place, or by a rename) is found on
    /// the next use, not mounted: each use gets this build's bytes.
    #[test]
    fn replaced_content_is_detected_on_every_use() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("cache");
        let cache = AgentCache::new(base.clone(), euid());
        let path = cache.mount_source(BIN).unwrap();

        std::fs::write(&path, vec![b'!'; BIN.len()]).unwrap();
        assert_eq!(mode(&path), 0o755);
        let again = cache.mount_source(BIN).unwrap();
        assert_eq!(std::fs::read(&again).unwrap(), BIN);

        let other = agent_dir(&base).join("other");
        std::fs::write(&other, vec![b'?'; BIN.len()]).unwrap();
        chmod(&other, 0o755);
        std::fs::rename(&other, &path).unwrap();
        let again = cache.mount_source(BIN).unwrap();
        assert_eq!(std::fs::read(&again).unwrap(), BIN);
    }

    /// A comparison is remembered (the bytes are not read again) only while the file's
    /// identity stays the same and its last change is settled; a change made in place
    /// right after, even in the same tick of the file system's clock, is still found.
    #[test]
    fn a_settled_copy_is_not_read_again_and_a_change_is_still_found() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("cache");
        let cache = AgentCache::new(base.clone(), euid());
        let path = cache.mount_source(BIN).unwrap();
        // Just written: not remembered, so a write in the same tick is found.
        assert!(
            cache.verified.lock().unwrap().is_none(),
            "remembered a fresh copy"
        );
        std::thread::sleep(SETTLED + std::time::Duration::from_millis(50));
        cache.mount_source(BIN).unwrap();
        let remembered = cache.verified.lock().unwrap().clone();
        assert!(
            remembered.is_some(),
            "a settled copy compared equal is remembered"
        );
        // Changed in place, same length and mode: its change time moves, so it is read
        // again and replaced.
        std::fs::write(&path, vec![b'!'; BIN.len()]).unwrap();
        let again = cache.mount_source(BIN).unwrap();
        assert_eq!(std::fs::read(&again).unwrap(), BIN);
        // The remembered identity is that of the file now there, or none.
        let now = cache.verified.lock().unwrap().clone();
        assert_ne!(now, remembered);
    }

    /// The temporary file is created, never opened: a link at its name, even a dangling
    /// one (which `O_CREAT` alone would follow and create), is refused and its target
    /// untouched.
    #[test]
    fn temporary_file_is_never_opened_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"victim").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = create_new_file(&link).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");

        let dangling = tmp.path().join("dangling");
        let target = tmp.path().join("created-through-the-link");
        std::os::unix::fs::symlink(&target, &dangling).unwrap();
        let e = create_new_file(&dangling).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert!(!target.exists());
    }

    /// A file at the copy's name that is not a private regular file of ours with the
    /// agent's bytes is replaced, whatever it is: other owner, other mode, a FIFO.
    #[test]
    fn copy_with_wrong_mode_owner_or_type_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("cache");
        let cache = AgentCache::new(base.clone(), euid());
        let path = cache.mount_source(BIN).unwrap();

        chmod(&path, 0o777);
        assert_eq!(cache.mount_source(BIN).unwrap(), path);
        assert_eq!(mode(&path), 0o755);

        if euid() == 0 {
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            cache.mount_source(BIN).unwrap();
            assert_eq!(std::fs::symlink_metadata(&path).unwrap().uid(), 0);
        }

        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        // Opening a FIFO for reading would wait for a writer: O_NONBLOCK returns at once.
        assert_eq!(cache.mount_source(BIN).unwrap(), path);
        assert_eq!(std::fs::read(&path).unwrap(), BIN);
    }

    /// A base that is a link (`~/.cache` pointing elsewhere) is followed once and the
    /// target checked from `/`; the path handed to the engine names the target, so what the
    /// link says later does not matter. Our own directories must be real directories.
    #[test]
    fn symlinked_base_is_resolved_and_own_links_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        mkdir(&real, 0o700);
        let base = tmp.path().join("cache");
        std::os::unix::fs::symlink(&real, &base).unwrap();
        let path = AgentCache::new(base.clone(), euid())
            .mount_source(BIN)
            .unwrap();
        let real = std::fs::canonicalize(&real).unwrap();
        assert!(path.starts_with(agent_dir(&real)), "{path:?}");

        let elsewhere = tmp.path().join("elsewhere");
        mkdir(&elsewhere, 0o700);
        let base2 = tmp.path().join("cache2");
        mkdir(&base2, 0o700);
        std::os::unix::fs::symlink(&elsewhere, base2.join("sandbox-rs")).unwrap();
        let r = AgentCache::new(base2.clone(), euid()).mount_source(BIN);
        assert!(
            matches!(
                &r,
                Err(CacheError::Untrusted {
                    why: Untrusted::Symlink,
                    ..
                })
            ),
            "{r:?}"
        );
        assert_eq!(entries(&elsewhere), Vec::<String>::new());
    }

    /// A relative or `..` base is refused; the lookup prefers `XDG_CACHE_HOME`.
    #[test]
    fn cache_base_prefers_xdg_and_refuses_relative_paths() {
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .fold(EnvSnapshot::empty(), |e, (k, v)| e.var(*k, *v))
        };
        assert_eq!(
            cache_base(&env(&[("XDG_CACHE_HOME", "/c"), ("HOME", "/h")])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            cache_base(&env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache"))
        );
        assert_eq!(cache_base(&env(&[("HOME", "rel")])), None);
        assert_eq!(cache_base(&env(&[])), None);
        let r = AgentCache::new(PathBuf::from("/tmp/../tmp"), euid()).mount_source(BIN);
        assert!(
            matches!(
                &r,
                Err(CacheError::Untrusted {
                    why: Untrusted::NotNormal,
                    ..
                })
            ),
            "{r:?}"
        );
    }

    /// The uid read from `/proc/self/status` is the owner of a file this process creates.
    #[test]
    fn effective_uid_owns_what_this_process_creates() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        std::fs::write(&f, b"").unwrap();
        assert_eq!(Some(std::fs::metadata(&f).unwrap().uid()), effective_uid());
    }
}
