//! Tar archives for the engines' archive APIs, with no engine code: built on the fly for
//! uploads with bounded memory, and unpacked safely on download.
//!
//! Upload: a blocking thread archives the host path ([`stream_local`] into a
//! [`ChannelWriter`]); the writer hands [`CHUNK`]-sized pieces to a bounded tokio
//! channel that becomes the HTTP body. At most [`CHUNKS_IN_FLIGHT`] chunks wait in the
//! channel, so memory stays bounded whatever the size of the tree.
//!
//! Download: [`unpack_safely`] reads the engine's archive as a [`std::io::Read`] (on a
//! blocking thread, while it arrives) and refuses with
//! [`SandboxError::UnsafeArchiveEntry`] every entry that could place anything outside the
//! local target: absolute or `..` names, symlinks pointing out (also through other
//! links), hard links to anything but a regular file already unpacked, and writes through
//! symlinks.

use std::ffi::OsString;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use tokio::sync::mpsc;

use sandbox_core::{Result, SandboxError};

/// Size of the chunks an upload stream carries (256 KiB).
pub const CHUNK: usize = 256 * 1024;

/// Chunks waiting between the archive builder and the HTTP body: with [`CHUNK`], at most
/// 1 MiB of an upload is buffered at any time. Use it as the capacity of the channel
/// given to [`ChannelWriter::new`] / [`stream_local`].
pub const CHUNKS_IN_FLIGHT: usize = 4;

/// A [`Write`] that sends [`CHUNK`]-sized pieces into a bounded tokio channel, blocking
/// the writing thread while the consumer is behind: that back-pressure is the memory
/// bound of an upload.
///
/// It blocks, so use it on a blocking thread (`tokio::task::spawn_blocking` or a plain
/// thread), never on an async task. Call [`flush`](Write::flush) at the end to send the
/// last partial chunk. Writes fail with `BrokenPipe` once the receiver is gone or after
/// [`fail`](ChannelWriter::fail).
pub struct ChannelWriter {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
    failed: bool,
}

impl fmt::Debug for ChannelWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelWriter")
            .field("buffered", &self.buf.len())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl ChannelWriter {
    /// A writer feeding `tx` (create the channel with capacity [`CHUNKS_IN_FLIGHT`]).
    pub fn new(tx: mpsc::Sender<std::io::Result<Bytes>>) -> Self {
        ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
            failed: false,
        }
    }

    /// Reports `e` to the receiving side and refuses every later write, dropping what is
    /// buffered: the consumer sees a broken stream, never a truncated but well-formed
    /// archive (a `tar::Builder` dropped after an error still writes its end marker).
    pub fn fail(&mut self, e: std::io::Error) {
        self.failed = true;
        self.buf = Vec::new();
        let _ = self.tx.blocking_send(Err(e));
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| aborted())
    }
}

fn aborted() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "upload aborted")
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.failed {
            return Err(aborted());
        }
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.failed {
            return Err(aborted());
        }
        self.send()
    }
}

/// Appends `local` (a file or a directory tree) under the archive name `name`. Symlinks
/// are stored as links, never followed, `local` itself included: an upload never pulls in
/// host files from outside the named path.
fn append_tree<W: Write>(b: &mut tar::Builder<W>, local: &Path, name: &str) -> std::io::Result<()> {
    b.follow_symlinks(false);
    if std::fs::symlink_metadata(local)?.is_dir() {
        b.append_dir_all(name, local)
    } else {
        b.append_path_with_name(local, name)
    }
}

/// Writes `local` (a file or a directory tree) into `w` as one complete archive whose root
/// entry is `name`, then flushes `w` and returns it.
///
/// Symlinks are stored as links and never followed, `local` itself included, so an upload
/// never pulls in host files from outside the named path. Modes and mtimes come from the
/// host.
#[cfg(test)]
fn append_local<W: Write>(w: W, local: &Path, name: &str) -> std::io::Result<W> {
    let mut b = tar::Builder::new(w);
    append_tree(&mut b, local, name)?;
    let mut w = b.into_inner()?;
    w.flush()?;
    Ok(w)
}

/// The producer of an upload body, to run on a blocking thread: archives `local` as
/// `name` through a [`ChannelWriter`] into `tx`.
///
/// On failure the error is also sent into the channel, so the engine sees a broken
/// upload instead of a silently truncated archive; the same error is returned for the
/// caller to report.
pub fn stream_local(
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    local: &Path,
    name: &str,
) -> std::io::Result<()> {
    let mut b = tar::Builder::new(ChannelWriter::new(tx));
    match append_tree(&mut b, local, name) {
        Ok(()) => b.into_inner()?.flush(),
        Err(e) => {
            b.get_mut()
                .fail(std::io::Error::new(e.kind(), e.to_string()));
            Err(e)
        }
    }
}

/// A complete archive holding one regular file `name` with `data` and permission bits
/// `mode`, owned by root, modified now (for `write`).
pub fn single_file(name: &str, data: &[u8], mode: u32) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::with_capacity(data.len() + 1536));
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mtime(sandbox_core::labels::unix_now());
    h.set_uid(0);
    h.set_gid(0);
    b.append_data(&mut h, name, data)?;
    b.into_inner()
}

fn unsafe_entry(entry: &Path) -> SandboxError {
    SandboxError::unsafe_archive_entry(entry.display().to_string())
}

fn local_io(path: &Path, op: &str, e: std::io::Error) -> SandboxError {
    SandboxError::file_system(path.display().to_string(), format!("{op} failed")).with_source(e)
}

/// An archive name split into its first component (the root entry's name) and the rest;
/// `None` for names that are absolute, contain `..`, or are empty.
fn split_name(name: &Path) -> Option<(OsString, PathBuf)> {
    let mut first = None;
    let mut rest = PathBuf::new();
    for c in name.components() {
        match c {
            Component::Normal(p) if first.is_none() => first = Some(p.to_owned()),
            Component::Normal(p) => rest.push(p),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    first.map(|f| (f, rest))
}

/// Whether a symlink at `link` (relative to the target root) pointing at `target` can only
/// resolve inside the root, whatever the other links of the tree point at.
///
/// The target must be relative, may climb with `..` only before its first name, and no
/// higher than the link's own directory. `..` after a name is refused: that name may be
/// a link (unpacked before or after this one), and `link/..` is the parent of wherever
/// that link points, which a lexical check cannot know. With this rule every link starts
/// from a real directory inside the root, climbs to another one, and only descends, so by
/// induction no chain of links leaves the root.
fn link_stays_inside(link: &Path, target: &Path) -> bool {
    let mut room = link.parent().map_or(0, |p| p.components().count());
    let mut descended = false;
    let mut named = false;
    for c in target.components() {
        match c {
            Component::Normal(_) => {
                descended = true;
                named = true;
            }
            Component::CurDir => named = true,
            Component::ParentDir => {
                if descended || room == 0 {
                    return false;
                }
                room -= 1;
                named = true;
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    named
}

/// Makes sure every ancestor of `rel` below `root` is a real directory, creating the
/// missing ones when `create` is set: nothing is ever written through a symlink.
fn check_ancestors(root: &Path, rel: &Path, raw: &Path, create: bool) -> Result<()> {
    let mut cur = root.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    for c in parent.components() {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(unsafe_entry(raw)),
            Err(e) if create && e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&cur).map_err(|e| local_io(&cur, "mkdir", e))?;
            }
            Err(_) => return Err(unsafe_entry(raw)),
        }
    }
    Ok(())
}

/// Removes a symlink at `dest`, so the entry replaces the link instead of following it.
fn remove_link(dest: &Path) -> Result<()> {
    if let Ok(m) = std::fs::symlink_metadata(dest)
        && m.file_type().is_symlink()
    {
        std::fs::remove_file(dest).map_err(|e| local_io(dest, "replace link", e))?;
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| local_io(path, "chmod", e))
}

fn is_file_kind(kind: tar::EntryType) -> bool {
    matches!(
        kind,
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse
    )
}

/// Extension headers carry metadata for other entries; the tar crate applies the ones it
/// knows, anything left over is not content.
fn is_metadata_kind(kind: tar::EntryType) -> bool {
    matches!(
        kind,
        tar::EntryType::XGlobalHeader
            | tar::EntryType::XHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink
    )
}

/// The archive's root entry: its name and whether it is a directory.
struct Root {
    name: OsString,
    is_dir: bool,
}

/// Unpacks an archive from an engine's archive API into `local`, refusing anything that
/// could land outside it. Blocking: run it on a blocking thread.
///
/// The archive holds one root entry (the downloaded file or directory, named by the
/// engine) that becomes `local` itself, whatever its name: a single-file download is
/// written to `local`, a directory download fills the directory `local` (created with its
/// parents if missing). Every later entry must lie below that root.
///
/// Refused with [`SandboxError::UnsafeArchiveEntry`], aborting the unpack:
/// - names that are absolute, contain `..`, are empty, or start with another root name;
///   entries below a root that is a file, or before any root; a second root;
/// - a root that is a symlink or a hard link;
/// - an entry whose path below `local` crosses a symlink or a non-directory (nothing is
///   written through a link), and a directory entry onto an existing symlink;
/// - a symlink whose target is absolute, climbs above the link's directory, or uses `..`
///   after a name (see the rule on chained links in the module docs);
/// - a hard link whose target is not an already unpacked regular file below the root,
///   reached through real directories.
///
/// Permissions: files get the entry's `rwx` bits (setuid, setgid and sticky bits are
/// dropped), directories the same plus `u+rwx` so their entries can be written.
/// A symlink already at the place of a file or link entry is replaced, never followed.
/// Devices, fifos and unknown entries below the root are skipped: nothing is created
/// for them on the host.
///
/// An empty archive, or a root that is neither a file nor a directory, is a
/// [`SandboxError::FileSystem`] error, as is any local I/O failure.
pub fn unpack_safely<R: Read>(reader: R, local: &Path) -> Result<()> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| local_io(local, "reading archive", e))?;
    let mut root: Option<Root> = None;
    for entry in entries {
        let mut entry = entry.map_err(|e| local_io(local, "reading archive", e))?;
        let kind = entry.header().entry_type();
        if is_metadata_kind(kind) {
            continue;
        }
        let raw = entry
            .path()
            .map_err(|e| local_io(local, "reading archive entry name", e))?
            .into_owned();
        let (first, rest) = split_name(&raw).ok_or_else(|| unsafe_entry(&raw))?;
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let Some(root_entry) = &root else {
            if !rest.as_os_str().is_empty() {
                // Entries below a root that was never created: refuse rather than guess.
                return Err(unsafe_entry(&raw));
            }
            unpack_root(&mut entry, kind, mode, &raw, local)?;
            root = Some(Root {
                name: first,
                is_dir: kind == tar::EntryType::Directory,
            });
            continue;
        };
        if !root_entry.is_dir || first != root_entry.name || rest.as_os_str().is_empty() {
            return Err(unsafe_entry(&raw));
        }
        check_ancestors(local, &rest, &raw, true)?;
        let dest = local.join(&rest);
        match kind {
            tar::EntryType::Directory => {
                match std::fs::symlink_metadata(&dest) {
                    Ok(m) if m.file_type().is_symlink() => return Err(unsafe_entry(&raw)),
                    Ok(m) if m.is_dir() => {}
                    _ => std::fs::create_dir(&dest).map_err(|e| local_io(&dest, "mkdir", e))?,
                }
                set_mode(&dest, mode | 0o700)?;
            }
            k if is_file_kind(k) => {
                remove_link(&dest)?;
                write_file(&mut entry, &dest, mode)?;
            }
            tar::EntryType::Symlink => {
                let target = link_name(&entry, &raw, &dest)?;
                if !link_stays_inside(&rest, &target) {
                    return Err(unsafe_entry(&raw));
                }
                remove_link(&dest)?;
                std::os::unix::fs::symlink(&target, &dest)
                    .map_err(|e| local_io(&dest, "symlink", e))?;
            }
            tar::EntryType::Link => {
                let target = link_name(&entry, &raw, &dest)?;
                let src = hard_link_source(local, root_entry, &target, &raw)?;
                remove_link(&dest)?;
                std::fs::hard_link(&src, &dest).map_err(|e| local_io(&dest, "link", e))?;
            }
            // Devices, fifos and unknown kinds: never created on the host.
            _ => {}
        }
    }
    if root.is_none() {
        return Err(SandboxError::file_system(
            local.display().to_string(),
            "the engine sent an empty archive",
        ));
    }
    Ok(())
}

/// Unpacks the root entry onto `local` itself.
fn unpack_root<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    kind: tar::EntryType,
    mode: u32,
    raw: &Path,
    local: &Path,
) -> Result<()> {
    match kind {
        tar::EntryType::Directory => {
            std::fs::create_dir_all(local).map_err(|e| local_io(local, "mkdir", e))?;
            set_mode(local, mode | 0o700)
        }
        k if is_file_kind(k) => {
            if let Some(parent) = local.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| local_io(parent, "mkdir", e))?;
            }
            remove_link(local)?;
            write_file(entry, local, mode)
        }
        tar::EntryType::Symlink | tar::EntryType::Link => Err(unsafe_entry(raw)),
        _ => Err(SandboxError::file_system(
            local.display().to_string(),
            "the download is neither a regular file nor a directory",
        )),
    }
}

fn write_file<R: Read>(entry: &mut tar::Entry<'_, R>, dest: &Path, mode: u32) -> Result<()> {
    let mut f = std::fs::File::create(dest).map_err(|e| local_io(dest, "create", e))?;
    std::io::copy(entry, &mut f).map_err(|e| local_io(dest, "write", e))?;
    set_mode(dest, mode)
}

fn link_name<R: Read>(entry: &tar::Entry<'_, R>, raw: &Path, dest: &Path) -> Result<PathBuf> {
    Ok(entry
        .link_name()
        .map_err(|e| local_io(dest, "reading link", e))?
        .ok_or_else(|| unsafe_entry(raw))?
        .into_owned())
}

/// The local path a hard link entry may link to: an archive name below the root, reached
/// through real directories, naming a regular file that is already there.
fn hard_link_source(local: &Path, root: &Root, target: &Path, raw: &Path) -> Result<PathBuf> {
    let (first, rest) = split_name(target).ok_or_else(|| unsafe_entry(raw))?;
    if first != root.name || rest.as_os_str().is_empty() {
        return Err(unsafe_entry(raw));
    }
    check_ancestors(local, &rest, raw, false)?;
    let src = local.join(&rest);
    match std::fs::symlink_metadata(&src) {
        Ok(m) if m.is_file() => Ok(src),
        _ => Err(unsafe_entry(raw)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorCode;
    use tar::EntryType::{Directory as D, Link as H, Regular as F, Symlink as L};

    /// An archive entry with a raw name and link name, bypassing the tar crate's own path
    /// checks so hostile archives can be built.
    fn raw_entry(
        b: &mut tar::Builder<Vec<u8>>,
        name: &str,
        kind: tar::EntryType,
        link: &str,
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
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    type Spec<'a> = (&'a str, tar::EntryType, &'a str, &'a [u8]);

    fn archive(entries: &[Spec<'_>]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (n, k, l, d) in entries {
            raw_entry(&mut b, n, *k, l, d);
        }
        b.into_inner().unwrap()
    }

    fn mode_of(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn unpacks_directory_tree_with_links() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        let a = archive(&[
            ("d/", D, "", b""),
            ("d/a.txt", F, "", b"hi"),
            // No entry for `d/sub/`: missing parents are created.
            ("d/sub/b.txt", F, "", b"b"),
            ("d/l", L, "a.txt", b""),
            ("d/sub/up", L, "../a.txt", b""),
            ("d/sub/deep", L, "../sub/b.txt", b""),
            ("d/h", H, "d/sub/b.txt", b""),
        ]);
        unpack_safely(&a[..], &out).unwrap();
        assert_eq!(std::fs::read(out.join("a.txt")).unwrap(), b"hi");
        assert_eq!(
            std::fs::read_link(out.join("l")).unwrap(),
            Path::new("a.txt")
        );
        assert_eq!(std::fs::read(out.join("l")).unwrap(), b"hi");
        assert_eq!(std::fs::read(out.join("sub/up")).unwrap(), b"hi");
        assert_eq!(std::fs::read(out.join("sub/deep")).unwrap(), b"b");
        assert_eq!(std::fs::read(out.join("h")).unwrap(), b"b");
    }

    #[test]
    fn single_file_download_is_renamed_to_the_target() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("nested/single.bin");
        unpack_safely(&archive(&[("x.bin", F, "", b"\x00\xff")])[..], &f).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"\x00\xff");
        assert!(!t.path().join("nested/x.bin").exists());
    }

    #[test]
    fn download_replaces_a_symlink_at_the_target_instead_of_following_it() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let f = t.path().join("f");
        std::os::unix::fs::symlink(&victim, &f).unwrap();
        unpack_safely(&archive(&[("f", F, "", b"new")])[..], &f).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        assert!(
            !std::fs::symlink_metadata(&f)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn modes_drop_special_bits_and_keep_directories_writable() {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, mode) in [("d/", D, 0o555), ("d/s", F, 0o4755), ("d/r", F, 0o600)] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(0);
            b.append_data(&mut h, name, std::io::empty()).unwrap();
        }
        let a = b.into_inner().unwrap();
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        unpack_safely(&a[..], &out).unwrap();
        assert_eq!(mode_of(&out), 0o755);
        assert_eq!(mode_of(&out.join("s")), 0o755);
        assert_eq!(mode_of(&out.join("r")), 0o600);
    }

    #[test]
    fn special_entries_are_skipped_and_metadata_headers_ignored() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        let a = archive(&[
            ("pax_global_header", tar::EntryType::XGlobalHeader, "", b""),
            ("d/", D, "", b""),
            ("d/fifo", tar::EntryType::Fifo, "", b""),
            ("d/dev", tar::EntryType::Char, "", b""),
            ("d/f", F, "", b"x"),
        ]);
        unpack_safely(&a[..], &out).unwrap();
        assert!(!out.join("fifo").exists() && !out.join("dev").exists());
        assert_eq!(std::fs::read(out.join("f")).unwrap(), b"x");
        let fifo_root = archive(&[("p", tar::EntryType::Fifo, "", b"")]);
        let e = unpack_safely(&fifo_root[..], &t.path().join("p")).unwrap_err();
        assert_eq!(e.code(), ErrorCode::FileSystem);
        let e = unpack_safely(&[0u8; 1024][..], &t.path().join("empty")).unwrap_err();
        assert_eq!(e.code(), ErrorCode::FileSystem);
    }

    #[test]
    fn download_rejects_tar_path_escape() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("target");
        let cases: Vec<(&str, Vec<Spec<'_>>)> = vec![
            (
                "dotdot below root",
                vec![("d/", D, "", b""), ("d/../../evil", F, "", b"x")],
            ),
            ("dotdot root", vec![("../evil", F, "", b"x")]),
            (
                "absolute below root",
                vec![("d/", D, "", b""), ("/abs-evil", F, "", b"x")],
            ),
            ("absolute root", vec![("/abs", F, "", b"x")]),
            ("empty name", vec![("./", D, "", b"")]),
            (
                "absolute symlink",
                vec![("d/", D, "", b""), ("d/l", L, "/etc", b"")],
            ),
            (
                "absolute symlink 2",
                vec![("d/", D, "", b""), ("d/a", L, "/etc/passwd", b"")],
            ),
            (
                "symlink up",
                vec![("d/", D, "", b""), ("d/l", L, "../../outside", b"")],
            ),
            (
                "symlink up one",
                vec![("d/", D, "", b""), ("d/l", L, "..", b"")],
            ),
            (
                "symlink up deep",
                vec![("d/", D, "", b""), ("d/s/l", L, "../../x", b"")],
            ),
            (
                "empty symlink",
                vec![("d/", D, "", b""), ("d/l", L, "", b"")],
            ),
            (
                "write through symlink",
                vec![
                    ("d/", D, "", b""),
                    ("d/l", L, ".", b""),
                    ("d/l/x", F, "", b"x"),
                ],
            ),
            (
                "directory onto symlink",
                vec![
                    ("d/", D, "", b""),
                    ("d/l", L, ".", b""),
                    ("d/l/", D, "", b""),
                ],
            ),
            (
                "symlink chain, link first",
                vec![
                    ("d/", D, "", b""),
                    ("d/x", L, ".", b""),
                    ("d/y", L, "x/..", b""),
                ],
            ),
            (
                "symlink chain, link last",
                vec![
                    ("d/", D, "", b""),
                    ("d/y", L, "x/../..", b""),
                    ("d/x", L, ".", b""),
                ],
            ),
            (
                "hard link up",
                vec![("d/", D, "", b""), ("d/h", H, "../etc/passwd", b"")],
            ),
            (
                "hard link absolute",
                vec![("d/", D, "", b""), ("d/h", H, "/etc/passwd", b"")],
            ),
            (
                "hard link to another root",
                vec![("d/", D, "", b""), ("d/h", H, "e/f", b"")],
            ),
            (
                "hard link to the root",
                vec![("d/", D, "", b""), ("d/h", H, "d", b"")],
            ),
            (
                "hard link to a symlink",
                vec![
                    ("d/", D, "", b""),
                    ("d/s", L, "f", b""),
                    ("d/h", H, "d/s", b""),
                ],
            ),
            (
                "hard link through a symlink",
                vec![
                    ("d/", D, "", b""),
                    ("d/sub/f", F, "", b"x"),
                    ("d/l", L, "sub", b""),
                    ("d/h", H, "d/l/f", b""),
                ],
            ),
            ("symlink root", vec![("l", L, "/etc", b"")]),
            ("hard link root", vec![("h", H, "/etc/passwd", b"")]),
            ("entry before root", vec![("d/x", F, "", b"x")]),
            ("second root", vec![("d/", D, "", b""), ("d", D, "", b"")]),
            ("other root", vec![("d/", D, "", b""), ("e/x", F, "", b"x")]),
            (
                "below a file root",
                vec![("f", F, "", b"x"), ("f/x", F, "", b"x")],
            ),
        ];
        for (what, spec) in &cases {
            let _ = std::fs::remove_dir_all(&target);
            let _ = std::fs::remove_file(&target);
            let e = unpack_safely(&archive(spec)[..], &target).unwrap_err();
            assert_eq!(e.code(), ErrorCode::UnsafeArchiveEntry, "{what}: {e}");
        }
        let leaked: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "target")
            .collect();
        assert!(leaked.is_empty(), "nothing written outside: {leaked:?}");
    }

    #[test]
    fn symlink_rule_is_leading_dotdot_within_depth() {
        let inside = |l: &str, t: &str| link_stays_inside(Path::new(l), Path::new(t));
        assert!(inside("a/l", "../b"));
        assert!(inside("a/b/l", "../../c/d"));
        assert!(inside("l", "."));
        assert!(inside("l", "./x/./y"));
        assert!(!inside("a/l", "../../b"));
        assert!(!inside("l", "/etc"));
        assert!(!inside("a/l", "x/../b"));
        assert!(!inside("l", ""));
        assert_eq!(
            split_name(Path::new("./d/x")),
            Some((OsString::from("d"), PathBuf::from("x")))
        );
        assert_eq!(
            split_name(Path::new("d/")),
            Some((OsString::from("d"), PathBuf::new()))
        );
        assert_eq!(split_name(Path::new("d/../../x")), None);
        assert_eq!(split_name(Path::new("/d")), None);
        assert_eq!(split_name(Path::new(".")), None);
    }

    #[test]
    fn channel_writer_chunks() {
        let (tx, mut rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let h = std::thread::spawn(move || {
            let mut w = ChannelWriter::new(tx);
            w.write_all(&vec![7u8; CHUNK * 2 + 10]).unwrap();
            w.flush().unwrap();
        });
        let mut sizes = vec![];
        while let Some(c) = rx.blocking_recv() {
            sizes.push(c.unwrap().len());
        }
        h.join().unwrap();
        assert_eq!(sizes, vec![CHUNK, CHUNK, 10]);
    }

    #[test]
    fn channel_writer_blocks_when_the_consumer_is_behind() {
        let (tx, mut rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let h = std::thread::spawn(move || {
            let mut w = ChannelWriter::new(tx);
            w.write_all(&vec![1u8; CHUNK * (CHUNKS_IN_FLIGHT + 3)])
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!h.is_finished(), "the writer must wait for the consumer");
        assert_eq!(rx.len(), CHUNKS_IN_FLIGHT);
        let mut n = 0;
        while let Some(c) = rx.blocking_recv() {
            n += c.unwrap().len();
        }
        h.join().unwrap().unwrap();
        assert_eq!(n, CHUNK * (CHUNKS_IN_FLIGHT + 3));
    }

    #[test]
    fn channel_writer_fails_the_stream_and_refuses_more() {
        let (tx, mut rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let h = std::thread::spawn(move || {
            let mut w = ChannelWriter::new(tx);
            w.write_all(b"partial").unwrap();
            w.fail(std::io::Error::other("host read failed"));
            assert_eq!(
                w.write(b"more").unwrap_err().kind(),
                std::io::ErrorKind::BrokenPipe
            );
            assert!(w.flush().is_err());
        });
        let got: Vec<_> = std::iter::from_fn(|| rx.blocking_recv()).collect();
        h.join().unwrap();
        assert_eq!(got.len(), 1, "only the error, not the dropped buffer");
        assert!(got[0].is_err());
    }

    #[test]
    fn stream_local_round_trips_a_tree_through_the_channel() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("sub/big"), vec![7u8; CHUNK * 3 + 5]).unwrap();
        std::fs::write(src.join("a.txt"), b"a").unwrap();
        std::os::unix::fs::symlink("a.txt", src.join("l")).unwrap();
        let (tx, mut rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let src2 = src.clone();
        let h = std::thread::spawn(move || stream_local(tx, &src2, "up"));
        let mut data = Vec::new();
        while let Some(c) = rx.blocking_recv() {
            let c = c.unwrap();
            assert!(c.len() <= CHUNK);
            data.extend_from_slice(&c);
        }
        h.join().unwrap().unwrap();
        let out = t.path().join("out");
        unpack_safely(&data[..], &out).unwrap();
        assert_eq!(
            std::fs::read(out.join("sub/big")).unwrap().len(),
            CHUNK * 3 + 5
        );
        assert_eq!(
            std::fs::read_link(out.join("l")).unwrap(),
            Path::new("a.txt")
        );
    }

    #[test]
    fn stream_local_reports_a_missing_source_into_the_stream() {
        let t = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let missing = t.path().join("missing");
        let h = std::thread::spawn(move || stream_local(tx, &missing, "x"));
        let got: Vec<_> = std::iter::from_fn(|| rx.blocking_recv()).collect();
        assert!(h.join().unwrap().is_err());
        assert_eq!(got.len(), 1);
        assert!(got[0].is_err(), "the consumer sees a broken stream");
    }

    #[test]
    fn upload_never_follows_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("secret");
        std::fs::write(&secret, b"host secret").unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let a = append_local(Vec::new(), &link, "name").unwrap();
        let mut ar = tar::Archive::new(&a[..]);
        let entries: Vec<_> = ar
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.header().entry_type(), e.size())
            })
            .collect();
        assert_eq!(entries, vec![(L, 0)]);
    }

    #[test]
    fn single_file_archive_round_trips() {
        let a = single_file("f.bin", &[1, 2, 3], 0o600).unwrap();
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("g.bin");
        unpack_safely(&a[..], &p).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), vec![1, 2, 3]);
        assert_eq!(mode_of(&p), 0o600);
    }
}
