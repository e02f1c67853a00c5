//! Tar archives for the engine's archive API: built on the fly for uploads (bounded
//! memory), and unpacked safely on download (nothing lands outside the target).

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use bytes::{Bytes, BytesMut};
use sandbox_core::{Result, SandboxError};

/// Size of the chunks an upload stream carries.
pub(crate) const CHUNK: usize = 256 * 1024;
/// Chunks in flight between the tar builder and the HTTP body.
pub(crate) const CHUNKS_IN_FLIGHT: usize = 4;

/// A one-file archive (for `write`).
pub(crate) fn single_file(name: &str, data: &[u8], mode: u32) -> std::io::Result<Vec<u8>> {
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

/// A `Write` that sends `CHUNK`-sized pieces into a bounded channel (blocking the
/// producer thread when the consumer is behind: that is the memory bound).
pub(crate) struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
    buf: BytesMut,
}

impl ChannelWriter {
    pub(crate) fn new(tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>) -> Self {
        ChannelWriter {
            tx,
            buf: BytesMut::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "upload aborted"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = CHUNK - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// Writes `local` (file or directory) into `w` as one archive whose root entry is `name`.
/// Symlinks are stored as links, never followed.
pub(crate) fn append_local<W: Write>(w: W, local: &Path, name: &str) -> std::io::Result<W> {
    let mut b = tar::Builder::new(w);
    b.follow_symlinks(false);
    let meta = std::fs::symlink_metadata(local)?;
    if meta.is_dir() {
        b.append_dir_all(name, local)?;
    } else {
        b.append_path_with_name(local, name)?;
    }
    b.into_inner()
}

fn unsafe_entry(entry: &Path) -> SandboxError {
    SandboxError::UnsafeArchiveEntry {
        entry: entry.display().to_string(),
    }
}

/// The entry path with the archive's root component removed, or `None` for the root
/// itself. `..`, absolute paths and prefixes are refused.
pub(crate) fn strip_root(entry: &Path) -> Result<Option<PathBuf>> {
    let mut parts = Vec::new();
    for c in entry.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_owned()),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(unsafe_entry(entry));
            }
        }
    }
    if parts.len() <= 1 {
        return Ok(None);
    }
    Ok(Some(parts[1..].iter().collect()))
}

/// Whether a symlink at `rel` (relative to the target root) pointing at `target` stays
/// inside the root, judged lexically.
pub(crate) fn link_stays_inside(rel: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth: Vec<()> = rel
        .parent()
        .map(|p| p.components().map(|_| ()).collect())
        .unwrap_or_default();
    for c in target.components() {
        match c {
            Component::Normal(_) => depth.push(()),
            Component::CurDir => {}
            Component::ParentDir => {
                if depth.pop().is_none() {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Refuses to write through a symlink: every existing ancestor of `path` below `root`
/// must be a real directory.
fn check_ancestors(root: &Path, rel: &Path) -> Result<()> {
    let mut cur = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            cur.push(c);
            match std::fs::symlink_metadata(&cur) {
                Ok(m) if m.file_type().is_symlink() => return Err(unsafe_entry(rel)),
                Ok(m) if !m.is_dir() => return Err(unsafe_entry(rel)),
                _ => {}
            }
        }
    }
    Ok(())
}

fn io_err(path: &Path, op: &str, e: std::io::Error) -> SandboxError {
    crate::error::local_io(path, op, e)
}

/// Unpacks an archive from the engine into `local`: the root entry becomes `local`
/// itself (a file or a directory), everything else lands below it. Any entry that would
/// land outside `local` — `..`, absolute names, symlinks pointing out, writes through
/// symlinks — aborts with `UnsafeArchiveEntry`.
pub(crate) fn unpack_safely<R: Read>(reader: R, local: &Path) -> Result<()> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| io_err(local, "reading archive", e))?;
    let mut saw_root = false;
    for entry in entries {
        let mut entry = entry.map_err(|e| io_err(local, "reading archive", e))?;
        let raw = entry
            .path()
            .map_err(|e| io_err(local, "reading archive entry name", e))?
            .into_owned();
        let rel = strip_root(&raw)?;
        let dest = match &rel {
            Some(r) => {
                if !saw_root {
                    // Entries below a root that was never created: refuse rather than guess.
                    return Err(unsafe_entry(&raw));
                }
                check_ancestors(local, r)?;
                local.join(r)
            }
            None => {
                if saw_root {
                    return Err(unsafe_entry(&raw));
                }
                saw_root = true;
                local.to_path_buf()
            }
        };
        let rel_for_links = rel.clone().unwrap_or_default();
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        match kind {
            tar::EntryType::Directory => {
                std::fs::create_dir_all(&dest).map_err(|e| io_err(&dest, "mkdir", e))?;
                set_mode(&dest, mode | 0o700)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                remove_link(&dest)?;
                let mut f = std::fs::File::create(&dest).map_err(|e| io_err(&dest, "create", e))?;
                std::io::copy(&mut entry, &mut f).map_err(|e| io_err(&dest, "write", e))?;
                set_mode(&dest, mode)?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| io_err(&dest, "reading link", e))?
                    .ok_or_else(|| unsafe_entry(&raw))?
                    .into_owned();
                if rel.is_none() || !link_stays_inside(&rel_for_links, &target) {
                    return Err(unsafe_entry(&raw));
                }
                remove_link(&dest)?;
                std::os::unix::fs::symlink(&target, &dest)
                    .map_err(|e| io_err(&dest, "symlink", e))?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| io_err(&dest, "reading link", e))?
                    .ok_or_else(|| unsafe_entry(&raw))?
                    .into_owned();
                let Some(target_rel) = strip_root(&target)? else {
                    return Err(unsafe_entry(&raw));
                };
                check_ancestors(local, &target_rel)?;
                let src = local.join(&target_rel);
                match std::fs::symlink_metadata(&src) {
                    Ok(m) if m.is_file() => {}
                    _ => return Err(unsafe_entry(&raw)),
                }
                remove_link(&dest)?;
                std::fs::hard_link(&src, &dest).map_err(|e| io_err(&dest, "link", e))?;
            }
            // Devices, fifos and extended headers are skipped: nothing to write.
            _ => {}
        }
    }
    if !saw_root {
        return Err(SandboxError::FileSystem {
            path: local.display().to_string(),
            message: "the engine sent an empty archive".into(),
            source: None,
        });
    }
    Ok(())
}

fn remove_link(dest: &Path) -> Result<()> {
    if let Ok(m) = std::fs::symlink_metadata(dest) {
        if m.file_type().is_symlink() {
            std::fs::remove_file(dest).map_err(|e| io_err(dest, "replace link", e))?;
        }
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io_err(path, "chmod", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive entry with a raw name (bypassing the tar crate's own path checks).
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

    fn archive(entries: &[(&str, tar::EntryType, &str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (n, k, l, d) in entries {
            raw_entry(&mut b, n, *k, l, d);
        }
        b.into_inner().unwrap()
    }

    use tar::EntryType::{Directory as D, Regular as F, Symlink as L};

    #[test]
    fn unpacks_directory_and_file() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        let a = archive(&[
            ("d/", D, "", b""),
            ("d/a.txt", F, "", b"hi"),
            ("d/l", L, "a.txt", b""),
        ]);
        unpack_safely(&a[..], &out).unwrap();
        assert_eq!(std::fs::read(out.join("a.txt")).unwrap(), b"hi");
        assert_eq!(
            std::fs::read_link(out.join("l")).unwrap(),
            Path::new("a.txt")
        );
        let f = t.path().join("single.bin");
        unpack_safely(&archive(&[("x.bin", F, "", b"\x00\xff")])[..], &f).unwrap();
        assert_eq!(std::fs::read(f).unwrap(), b"\x00\xff");
    }

    #[test]
    fn download_rejects_tar_path_escape() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("target");
        let cases: Vec<Vec<u8>> = vec![
            archive(&[("d/", D, "", b""), ("d/../../evil", F, "", b"x")]),
            archive(&[("d/", D, "", b""), ("/abs-evil", F, "", b"x")]),
            archive(&[("d/", D, "", b""), ("d/l", L, "/etc", b"")]),
            archive(&[("d/", D, "", b""), ("d/l", L, "../../outside", b"")]),
            archive(&[
                ("d/", D, "", b""),
                ("d/l", L, ".", b""),
                ("d/l/x", F, "", b"x"),
            ]),
            archive(&[
                ("d/", D, "", b""),
                ("d/h", tar::EntryType::Link, "../etc/passwd", b""),
            ]),
        ];
        for (i, a) in cases.iter().enumerate() {
            let _ = std::fs::remove_dir_all(&target);
            let e = unpack_safely(&a[..], &target).unwrap_err();
            assert_eq!(
                e.code(),
                sandbox_core::ErrorCode::UnsafeArchiveEntry,
                "case {i}: {e}"
            );
        }
        let leaked: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "target")
            .collect();
        assert!(leaked.is_empty(), "nothing written outside: {leaked:?}");
    }

    #[test]
    fn link_checks_are_lexical() {
        assert!(link_stays_inside(Path::new("a/l"), Path::new("../b")));
        assert!(!link_stays_inside(Path::new("a/l"), Path::new("../../b")));
        assert!(!link_stays_inside(Path::new("l"), Path::new("/etc")));
        assert_eq!(strip_root(Path::new("d")).unwrap(), None);
        assert_eq!(
            strip_root(Path::new("./d/x")).unwrap(),
            Some(PathBuf::from("x"))
        );
        assert!(strip_root(Path::new("d/../../x")).is_err());
    }

    #[test]
    fn channel_writer_chunks_and_bounds() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
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
    fn single_file_archive_round_trips() {
        let a = single_file("f.bin", &[1, 2, 3], 0o600).unwrap();
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f.bin");
        unpack_safely(&a[..], &p).unwrap();
        assert_eq!(std::fs::read(p).unwrap(), vec![1, 2, 3]);
    }
}
