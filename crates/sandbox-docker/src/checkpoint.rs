//! Forks with memory on Docker: what the engine API does not do for them.
//!
//! gVisor (`runsc`) checkpoints a running container without CRIU, and Docker with its
//! experimental features takes the checkpoint (`POST /containers/{id}/checkpoints`),
//! which stops the container. Three things are left to this module, all on the engine's
//! host (so only for a local engine, whose files this process can reach):
//!
//! - **Where a new container finds the checkpoint.** Docker 20.10 refuses a custom
//!   checkpoint directory at start ("custom checkpointdir is not supported"), so the
//!   checkpoint is copied into the new container's own directory
//!   (`<DockerRootDir>/containers/<id>/checkpoints/<name>`), where Docker removes it with
//!   the container.
//! - **The container's own files.** gVisor's root filesystem is the host's overlay
//!   (a gofer), not memory: the checkpoint holds the processes and the sandbox's tmpfs
//!   mounts, not the files written to the root. Measured: a file written before the
//!   checkpoint is missing in a container restored from it. So the writable layer
//!   (overlay2's `UpperDir`) of the stopped original is copied into the new container's,
//!   whiteouts (0:0 character devices), ownership, modes, times and extended attributes
//!   (overlay's `trusted.overlay.opaque`) included. Hard links are copied as separate
//!   files.
//! - **Starting from a checkpoint.** bollard's start call has no `checkpoint` parameter;
//!   the request goes over the engine's unix socket as plain HTTP/1.1.
//!
//! Why the original stops: `docker checkpoint create --leave-running` makes runsc
//! (2022-12, Debian 12) panic ("invalid state transition: paused => stopped") and lose the
//! container, so a fork checkpoints and stops the original and starts it again from the
//! same checkpoint. That is also why such containers are created without `AutoRemove`
//! (see `policy.rs`): the engine would delete the original the moment the checkpoint
//! stops it.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::models::SystemInfo;
use sandbox_container::{EngineError, EngineErrorKind, EngineResult, Runtime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The file [`ForkHost::start_from`] adds to a checkpoint directory before a restore
/// (runsc reads only its own image files).
const RESTORE_MARKER: &str = "sandbox-rs-restore";

/// The prefix of the directories containerd unpacks a restored checkpoint into.
const CONTAINERD_COPY_PREFIX: &str = "ctrd-checkpoint";

/// Where containerd makes its temporary directories: `$XDG_RUNTIME_DIR` when its
/// environment sets it, else the system's temporary directory (`$TMPDIR`, `/tmp`). The
/// daemons `cargo xtask setup` starts set neither; this process's values are looked at
/// as well, for an engine started the same way as this program.
fn restore_copy_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("/tmp")];
    for var in ["XDG_RUNTIME_DIR", "TMPDIR"] {
        if let Some(d) = std::env::var_os(var).map(PathBuf::from)
            && d.is_absolute()
            && !dirs.contains(&d)
        {
            dirs.push(d);
        }
    }
    dirs
}

/// Removes every `ctrd-checkpoint*` directory directly in `dirs` (never through a link)
/// whose restore marker reads exactly `marker`: the copies of this restore, and nothing
/// another restore or program made.
fn remove_restore_copies(dirs: &[PathBuf], marker: &str) {
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let is_copy = e
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(CONTAINERD_COPY_PREFIX))
                && e.file_type().is_ok_and(|t| t.is_dir());
            if !is_copy {
                continue;
            }
            let path = e.path();
            let ours =
                std::fs::read_to_string(path.join(RESTORE_MARKER)).is_ok_and(|m| m == marker);
            if ours && let Err(err) = std::fs::remove_dir_all(&path) {
                tracing::debug!(path = %path.display(), error = %err, "containerd's checkpoint copy was not removed");
            }
        }
    }
}

/// Where forks work on this host: the engine's root directory and its socket.
#[derive(Debug, Clone)]
pub(crate) struct ForkHost {
    root: PathBuf,
    socket: PathBuf,
}

/// What forks need, in the words of the refusal: a fork of a running sandbox with its
/// memory is possible here only with all of it.
pub(crate) const FORK_NEEDS: &str = "forks with memory need Docker with the gVisor runtime \
     (`DockerConfig::runtime(Runtime::Runsc)`, `SBX_DOCKER_RUNTIME=runsc`), dockerd's \
     experimental features (`\"experimental\": true` in /etc/docker/daemon.json, which `sudo \
     cargo xtask setup` writes), the overlay2 storage driver, and a local engine whose \
     directory this process can write (run as root on the engine's host)";

/// Whether this engine can fork, from its `/info`: `Err` says which condition fails.
pub(crate) fn probe(
    info: &SystemInfo,
    runtime: Runtime,
    socket: Option<&Path>,
) -> Result<ForkHost, String> {
    if runtime != Runtime::Runsc {
        return Err(format!(
            "runtime `{runtime}` cannot checkpoint here (CRIU fails on this kernel); {FORK_NEEDS}"
        ));
    }
    if info.experimental_build != Some(true) {
        return Err(format!(
            "dockerd runs without its experimental features (no checkpoints); {FORK_NEEDS}"
        ));
    }
    let Some(socket) = socket else {
        return Err(format!(
            "the engine is not local (a unix socket): the checkpoint and the files must be \
             copied on the engine's host; {FORK_NEEDS}"
        ));
    };
    match info.driver.as_deref() {
        Some("overlay2") => {}
        other => {
            return Err(format!(
                "the storage driver is {other:?}, not overlay2, whose writable layer a fork \
                 copies; {FORK_NEEDS}"
            ));
        }
    }
    let root = PathBuf::from(info.docker_root_dir.as_deref().unwrap_or("/var/lib/docker"));
    let containers = root.join("containers");
    rustix::fs::access(&containers, rustix::fs::Access::WRITE_OK).map_err(|e| {
        format!(
            "this process cannot write {} ({e}), where a fork's checkpoint goes; {FORK_NEEDS}",
            containers.display()
        )
    })?;
    Ok(ForkHost {
        root,
        socket: socket.to_path_buf(),
    })
}

impl ForkHost {
    /// The directory of checkpoint `name` of container `id`.
    fn checkpoint_dir(&self, id: &str, name: &str) -> EngineResult<PathBuf> {
        for part in [id, name] {
            if part.is_empty()
                || !part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(EngineError::new(
                    EngineErrorKind::InvalidRequest,
                    format!("{part:?} is not a container id or checkpoint name"),
                ));
            }
        }
        Ok(self
            .root
            .join("containers")
            .join(id)
            .join("checkpoints")
            .join(name))
    }

    /// Copies checkpoint `name` of container `from` into container `to`'s directory.
    pub(crate) async fn place_checkpoint(
        &self,
        from: &str,
        name: &str,
        to: &str,
    ) -> EngineResult<()> {
        let src = self.checkpoint_dir(from, name)?;
        let dst = self.checkpoint_dir(to, name)?;
        blocking("copy the checkpoint", move || {
            if let Some(parent) = dst.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::create_dir(&dst)?;
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o700))?;
            for e in std::fs::read_dir(&src)? {
                let e = e?;
                if e.file_type()?.is_file() {
                    std::fs::copy(e.path(), dst.join(e.file_name()))?;
                }
            }
            Ok(())
        })
        .await
    }

    /// Copies the writable layer `from` (a stopped container's `UpperDir`) into `to` (a
    /// created, never started container's, still empty).
    pub(crate) async fn copy_layer(&self, from: PathBuf, to: PathBuf) -> EngineResult<()> {
        blocking("copy the writable layer", move || {
            copy_tree(&from, &to)?;
            copy_meta(&from, &to, &std::fs::symlink_metadata(&from)?)
        })
        .await
    }

    /// `POST /containers/{id}/start?checkpoint={name}` over the engine's socket.
    ///
    /// dockerd uploads the checkpoint directory as a tar into containerd's content store
    /// before the restore, and fails when that content already exists ("commit failed:
    /// content sha256:… already exists") — which it does when the same checkpoint was
    /// restored moments ago (the original, then each fork from an identical copy) and
    /// containerd has not collected it yet. A marker naming this restore makes every
    /// upload's content its own.
    pub(crate) async fn start_from(
        &self,
        id: &str,
        name: &str,
        limit: Duration,
    ) -> EngineResult<()> {
        // Both are checked to be plain names: nothing to escape in the request line.
        let dir = self.checkpoint_dir(id, name)?;
        let marker = format!(
            "{id} {name} {}\n",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        );
        let mark = marker.clone();
        blocking("mark the checkpoint", move || {
            std::fs::write(dir.join(RESTORE_MARKER), mark)
        })
        .await?;
        let answered = self.request_start(id, name, limit).await;
        // containerd unpacks the uploaded checkpoint into a directory of its own and
        // never removes it (2.2 MB per restore on this machine, 265 found after one
        // session): this restore's copy is the one holding its marker. The restored
        // process has read its image by the time the start answers.
        let marker_dirs = restore_copy_dirs();
        let _ = blocking("remove containerd's copy of the checkpoint", move || {
            remove_restore_copies(&marker_dirs, &marker);
            Ok(())
        })
        .await;
        answered
    }

    /// The start request itself; see [`ForkHost::start_from`].
    async fn request_start(&self, id: &str, name: &str, limit: Duration) -> EngineResult<()> {
        let request = format!(
            "POST /containers/{id}/start?checkpoint={name} HTTP/1.1\r\nHost: docker\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let exchange = async {
            let mut s = tokio::net::UnixStream::connect(&self.socket).await?;
            s.write_all(request.as_bytes()).await?;
            let mut answer = Vec::new();
            // Bounded: a start answers with a status line and at most a short JSON message.
            (&mut s).take(64 * 1024).read_to_end(&mut answer).await?;
            Ok::<_, io::Error>(answer)
        };
        let answer = match tokio::time::timeout(limit, exchange).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                return Err(EngineError::new(
                    EngineErrorKind::Unavailable,
                    format!("start from checkpoint: {e}"),
                ));
            }
            Err(_) => {
                return Err(EngineError::new(
                    EngineErrorKind::Timeout,
                    format!("start from checkpoint: no answer within {limit:?}"),
                ));
            }
        };
        let text = String::from_utf8_lossy(&answer);
        let status: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        match status {
            204 | 304 => Ok(()),
            s => {
                let body = text.split("\r\n\r\n").nth(1).unwrap_or("").trim();
                let kind = match s {
                    404 => EngineErrorKind::NotFound,
                    409 => EngineErrorKind::Conflict,
                    _ => EngineErrorKind::Other,
                };
                Err(EngineError::new(
                    kind,
                    format!("start from checkpoint answered {s}: {body}"),
                ))
            }
        }
    }
}

async fn blocking(
    what: &'static str,
    f: impl FnOnce() -> io::Result<()> + Send + 'static,
) -> EngineResult<()> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(EngineError::new(
            EngineErrorKind::Other,
            format!("{what}: {e}"),
        )),
        Err(e) => Err(EngineError::new(
            EngineErrorKind::Other,
            format!("{what}: {e}"),
        )),
    }
}

/// Copies the content of directory `src` into the existing directory `dst`, entry by
/// entry as overlay2 stores it.
fn copy_tree(src: &Path, dst: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let md = std::fs::symlink_metadata(&from)?;
        let ft = md.file_type();
        if ft.is_dir() {
            match std::fs::create_dir(&to) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            copy_tree(&from, &to)?;
        } else if ft.is_file() {
            std::fs::copy(&from, &to)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
        } else {
            // Whiteouts (character devices 0:0), and fifos, sockets, devices.
            let kind = rustix::fs::FileType::from_raw_mode(md.mode());
            let mode = rustix::fs::Mode::from_raw_mode(md.mode() & 0o7777);
            rustix::fs::mknodat(rustix::fs::CWD, &to, kind, mode, md.rdev())?;
        }
        copy_meta(&from, &to, &md)?;
    }
    Ok(())
}

/// Owner, extended attributes, mode and times of `from` onto `to` (the link itself for a
/// symbolic link).
fn copy_meta(from: &Path, to: &Path, md: &std::fs::Metadata) -> io::Result<()> {
    use rustix::fs::{AtFlags, CWD, Gid, Timestamps, Uid};
    rustix::fs::chownat(
        CWD,
        to,
        Some(Uid::from_raw(md.uid())),
        Some(Gid::from_raw(md.gid())),
        AtFlags::SYMLINK_NOFOLLOW,
    )?;
    copy_xattrs(from, to)?;
    if !md.file_type().is_symlink() {
        // After chown, which clears set-id bits.
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(md.mode() & 0o7777))?;
    }
    let times = Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: md.atime(),
            tv_nsec: md.atime_nsec() as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: md.mtime(),
            tv_nsec: md.mtime_nsec() as _,
        },
    };
    rustix::fs::utimensat(CWD, to, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Every extended attribute of `from` (overlay's opaque-directory marker among them).
fn copy_xattrs(from: &Path, to: &Path) -> io::Result<()> {
    let size = rustix::fs::llistxattr_query(from)?;
    if size == 0 {
        return Ok(());
    }
    let mut names = vec![0u8; size];
    let n = rustix::fs::llistxattr(from, &mut names[..])?;
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = std::ffi::CStr::from_bytes_with_nul(&[name, &[0]].concat())
            .map(std::ffi::CStr::to_owned)
            .map_err(io::Error::other)?;
        let len = rustix::fs::lgetxattr_query(from, name.as_c_str())?;
        let mut value = vec![0u8; len];
        let got = rustix::fs::lgetxattr(from, name.as_c_str(), &mut value[..])?;
        rustix::fs::lsetxattr(
            to,
            name.as_c_str(),
            &value[..got],
            rustix::fs::XattrFlags::empty(),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(experimental: bool, driver: &str) -> SystemInfo {
        SystemInfo {
            experimental_build: Some(experimental),
            driver: Some(driver.to_string()),
            docker_root_dir: Some(std::env::temp_dir().display().to_string()),
            ..Default::default()
        }
    }

    /// Every missing condition is a refusal that names what forks need, never a silent
    /// "not declared".
    #[test]
    fn only_this_restores_containerd_copy_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let copy = |name: &str, marker: Option<&str>| {
            let d = tmp.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("checkpoint.img"), b"img").unwrap();
            if let Some(m) = marker {
                std::fs::write(d.join(RESTORE_MARKER), m).unwrap();
            }
            d
        };
        let ours = copy("ctrd-checkpoint111", Some("abc ck 1\n"));
        let other_restore = copy("ctrd-checkpoint222", Some("abc ck 2\n"));
        let unmarked = copy("ctrd-checkpoint333", None);
        let not_containerds = copy("something-else", Some("abc ck 1\n"));
        // A link to our copy's twin elsewhere is not followed.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join(RESTORE_MARKER), "abc ck 1\n").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), tmp.path().join("ctrd-checkpoint444"))
            .unwrap();
        remove_restore_copies(&[tmp.path().to_path_buf()], "abc ck 1\n");
        assert!(!ours.exists());
        for kept in [&other_restore, &unmarked, &not_containerds] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        assert!(elsewhere.path().join(RESTORE_MARKER).exists());
    }

    #[test]
    fn each_missing_condition_is_named() {
        let sock = Path::new("/var/run/docker.sock");
        let why = |i: &SystemInfo, rt, s| probe(i, rt, s).unwrap_err();
        assert!(why(&info(true, "overlay2"), Runtime::Runc, Some(sock)).contains("runc"));
        assert!(why(&info(false, "overlay2"), Runtime::Runsc, Some(sock)).contains("experimental"));
        assert!(why(&info(true, "overlay2"), Runtime::Runsc, None).contains("not local"));
        assert!(why(&info(true, "vfs"), Runtime::Runsc, Some(sock)).contains("overlay2"));
        for e in [
            why(&info(true, "overlay2"), Runtime::Runc, Some(sock)),
            why(&info(false, "overlay2"), Runtime::Runsc, Some(sock)),
        ] {
            assert!(e.contains("runsc") && e.contains("experimental"), "{e}");
        }
    }

    /// Names that could leave the engine's directory are refused before any path is made.
    #[test]
    fn checkpoint_paths_take_plain_names_only() {
        let h = ForkHost {
            root: PathBuf::from("/var/lib/docker"),
            socket: PathBuf::from("/var/run/docker.sock"),
        };
        assert!(h.checkpoint_dir("abc123", "sbx-fork-1").is_ok());
        for (id, name) in [("../x", "c"), ("abc", "../../etc"), ("a/b", "c"), ("", "c")] {
            assert!(h.checkpoint_dir(id, name).is_err(), "{id} {name}");
        }
    }

    /// The copy keeps what overlay2 needs: modes, owners, symlinks, empty directories and
    /// a whiteout (a 0:0 character device, which needs root to make: skipped otherwise).
    #[test]
    fn the_layer_copy_keeps_links_modes_and_whiteouts() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let s = src.path();
        std::fs::create_dir_all(s.join("work/empty")).unwrap();
        std::fs::write(s.join("work/f.txt"), b"before the fork").unwrap();
        std::fs::set_permissions(s.join("work/f.txt"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        std::os::unix::fs::symlink("f.txt", s.join("work/link")).unwrap();
        let root = rustix::process::geteuid().is_root();
        if root {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                s.join("work/gone"),
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::empty(),
                0,
            )
            .unwrap();
        }
        copy_tree(s, dst.path()).unwrap();
        let d = dst.path();
        assert_eq!(
            std::fs::read(d.join("work/f.txt")).unwrap(),
            b"before the fork"
        );
        let mode = std::fs::metadata(d.join("work/f.txt")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o640);
        assert_eq!(
            std::fs::read_link(d.join("work/link")).unwrap(),
            Path::new("f.txt")
        );
        assert!(d.join("work/empty").is_dir());
        if root {
            let md = std::fs::symlink_metadata(d.join("work/gone")).unwrap();
            use std::os::unix::fs::FileTypeExt;
            assert!(md.file_type().is_char_device() && md.rdev() == 0);
        }
    }
}
