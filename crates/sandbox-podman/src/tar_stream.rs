//! Streaming tar in both directions with bounded memory, and safe extraction.
//!
//! Upload: a blocking task walks the host tree into a `tar::Builder` whose writer feeds a
//! small bounded channel that becomes the HTTP body. Download: the archive stream feeds a
//! bounded channel that a blocking task reads as `std::io::Read` while extracting. At most
//! a few 64 KiB chunks are in flight either way.
//!
//! Extraction refuses (with `UnsafeArchiveEntry`) absolute paths, `..` components, and
//! symlinks or hard links whose target would resolve outside the local target.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use sandbox_core::{Result, SandboxError};
use tokio::sync::mpsc;

/// Chunk size of the channels.
pub(crate) const CHUNK: usize = 64 * 1024;
/// Chunks in flight per channel.
pub(crate) const DEPTH: usize = 4;

fn fs_err(path: &Path, what: &str, e: std::io::Error) -> SandboxError {
    SandboxError::FileSystem {
        path: path.display().to_string(),
        message: what.to_string(),
        source: Some(Box::new(e)),
    }
}

/// A `Write` that sends 64 KiB chunks into a bounded channel (blocking; use in
/// `spawn_blocking`).
pub(crate) struct ChannelWriter {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    pub(crate) fn new(tx: mpsc::Sender<std::io::Result<Bytes>>) -> Self {
        ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "upload aborted"))
    }

    /// Reports a failure to the reading side.
    pub(crate) fn fail(&self, e: std::io::Error) {
        let _ = self.tx.blocking_send(Err(e));
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let room = CHUNK - self.buf.len();
        let n = room.min(data.len());
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

/// A `Read` over chunks received from a bounded channel (blocking; use in `spawn_blocking`).
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<std::io::Result<Bytes>>,
    cur: Bytes,
}

impl ChannelReader {
    pub(crate) fn new(rx: mpsc::Receiver<std::io::Result<Bytes>>) -> Self {
        ChannelReader {
            rx,
            cur: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

/// Writes `local` (file or directory) as a tar whose top entry is `name`.
pub(crate) fn write_tree(local: &Path, name: &str, w: impl Write) -> std::io::Result<()> {
    let mut b = tar::Builder::new(w);
    // Never pull in host files through symlinks: links are archived as links.
    b.follow_symlinks(false);
    let meta = std::fs::symlink_metadata(local)?;
    if meta.is_dir() {
        b.append_dir_all(name, local)?;
    } else {
        let mut f = std::fs::File::open(local)?;
        b.append_file(name, &mut f)?;
    }
    b.into_inner()?.flush()
}

/// A tar holding one file `name` with `data`.
pub(crate) fn single_file(name: &str, data: &[u8], mode: u32) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::with_capacity(data.len() + 1024));
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mtime(sandbox_core::labels::unix_now());
    b.append_data(&mut h, name, data)?;
    b.into_inner()
}

/// The relative path of an entry after dropping its first component, refusing absolute
/// paths and `..`. `None` for the top entry itself.
fn relative(entry: &Path) -> std::result::Result<Option<PathBuf>, ()> {
    let mut out = PathBuf::new();
    let mut first = true;
    for c in entry.components() {
        match c {
            Component::Normal(p) => {
                if first {
                    first = false;
                } else {
                    out.push(p)
                }
            }
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return Err(()),
        }
    }
    if first {
        return Err(());
    }
    Ok(if out.as_os_str().is_empty() {
        None
    } else {
        Some(out)
    })
}

/// Whether `target` (a link target) stays inside the root when resolved from `dir`
/// (both relative to the root).
fn link_stays_inside(dir: &Path, target: &Path) -> bool {
    let mut depth: i64 = dir
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count() as i64;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Extracts an archive whose top entry is the downloaded file or directory onto `local`
/// (the file itself, or the directory that receives the tree).
pub(crate) fn extract(r: impl Read, local: &Path) -> Result<()> {
    let mut ar = tar::Archive::new(r);
    let entries = ar
        .entries()
        .map_err(|e| fs_err(local, "reading the archive failed", e))?;
    let mut top_is_dir: Option<bool> = None;
    for entry in entries {
        let mut entry = entry.map_err(|e| fs_err(local, "reading the archive failed", e))?;
        let raw = entry
            .path()
            .map_err(|e| fs_err(local, "bad entry name", e))?
            .into_owned();
        let unsafe_entry = || SandboxError::UnsafeArchiveEntry {
            entry: raw.display().to_string(),
        };
        let rel = relative(&raw).map_err(|_| unsafe_entry())?;
        let kind = entry.header().entry_type();
        let dest = match (&rel, top_is_dir) {
            (None, None) => {
                top_is_dir = Some(kind.is_dir());
                local.to_path_buf()
            }
            (None, Some(_)) => return Err(unsafe_entry()),
            (Some(_), Some(false)) | (Some(_), None) => return Err(unsafe_entry()),
            (Some(p), Some(true)) => local.join(p),
        };
        let rel_dir = rel
            .as_ref()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_default();
        if kind.is_dir() {
            std::fs::create_dir_all(&dest).map_err(|e| fs_err(&dest, "mkdir failed", e))?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(|e| fs_err(&dest, "bad link target", e))?
                .ok_or_else(unsafe_entry)?
                .into_owned();
            if rel.is_none() || !link_stays_inside(&rel_dir, &target) {
                return Err(unsafe_entry());
            }
            if let Some(p) = dest.parent() {
                std::fs::create_dir_all(p).map_err(|e| fs_err(p, "mkdir failed", e))?;
            }
            let _ = std::fs::remove_file(&dest);
            std::os::unix::fs::symlink(&target, &dest)
                .map_err(|e| fs_err(&dest, "symlink failed", e))?;
        } else if kind.is_hard_link() {
            let target = entry
                .link_name()
                .map_err(|e| fs_err(&dest, "bad link target", e))?
                .ok_or_else(unsafe_entry)?
                .into_owned();
            let Ok(Some(t)) = relative(&target) else {
                return Err(unsafe_entry());
            };
            std::fs::hard_link(local.join(t), &dest)
                .map_err(|e| fs_err(&dest, "hard link failed", e))?;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            if let Some(p) = dest.parent() {
                std::fs::create_dir_all(p).map_err(|e| fs_err(p, "mkdir failed", e))?;
            }
            let mut f =
                std::fs::File::create(&dest).map_err(|e| fs_err(&dest, "create failed", e))?;
            std::io::copy(&mut entry, &mut f).map_err(|e| fs_err(&dest, "write failed", e))?;
            if let Ok(mode) = entry.header().mode() {
                use std::os::unix::fs::PermissionsExt;
                let _ =
                    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode & 0o777));
            }
        }
        // Devices, fifos and other special entries are skipped: never created on the host.
    }
    if top_is_dir.is_none() {
        return Err(SandboxError::FileSystem {
            path: local.display().to_string(),
            message: "the archive was empty".into(),
            source: None,
        });
    }
    Ok(())
}

/// The first regular file of an in-memory archive (for `read`): `Ok(None)` for a
/// directory, `Err` for other kinds.
pub(crate) enum FirstEntry {
    File(Bytes),
    Dir,
    Symlink,
    Other,
}

pub(crate) fn first_entry(data: &[u8], path: &str) -> Result<FirstEntry> {
    let mut ar = tar::Archive::new(data);
    let err = |e: std::io::Error| SandboxError::FileSystem {
        path: path.to_string(),
        message: "reading the archive failed".into(),
        source: Some(Box::new(e)),
    };
    let mut entries = ar.entries().map_err(err)?;
    let Some(entry) = entries.next() else {
        return Err(SandboxError::PathNotFound { path: path.into() });
    };
    let mut entry = entry.map_err(err)?;
    let kind = entry.header().entry_type();
    if kind.is_dir() {
        return Ok(FirstEntry::Dir);
    }
    if kind.is_symlink() {
        return Ok(FirstEntry::Symlink);
    }
    if !kind.is_file() {
        return Ok(FirstEntry::Other);
    }
    let mut buf = Vec::with_capacity(entry.size() as usize);
    entry.read_to_end(&mut buf).map_err(err)?;
    Ok(FirstEntry::File(Bytes::from(buf)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorCode;

    fn archive(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data_or_link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            match *kind {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    h.set_size(0);
                    b.append_link(&mut h, name, data_or_link).unwrap();
                }
                tar::EntryType::Directory => {
                    h.set_size(0);
                    b.append_data(&mut h, name, std::io::empty()).unwrap();
                }
                _ => {
                    h.set_size(data_or_link.len() as u64);
                    // append_data refuses `..`; write the name raw to build hostile archives.
                    let raw = name.as_bytes();
                    h.as_old_mut().name[..raw.len()].copy_from_slice(raw);
                    h.set_cksum();
                    b.append(&h, data_or_link.as_bytes()).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn extracts_a_tree() {
        let d = tempfile::tempdir().unwrap();
        let a = archive(&[
            ("top", tar::EntryType::Directory, ""),
            ("top/a.txt", tar::EntryType::Regular, "hello"),
            ("top/sub/b.txt", tar::EntryType::Regular, "b"),
            ("top/link", tar::EntryType::Symlink, "sub/b.txt"),
        ]);
        let out = d.path().join("out");
        extract(&a[..], &out).unwrap();
        assert_eq!(std::fs::read_to_string(out.join("a.txt")).unwrap(), "hello");
        assert_eq!(std::fs::read_to_string(out.join("link")).unwrap(), "b");
    }

    #[test]
    fn extracts_a_single_file_onto_the_target() {
        let d = tempfile::tempdir().unwrap();
        let a = archive(&[("f.bin", tar::EntryType::Regular, "xyz")]);
        let out = d.path().join("copy.bin");
        extract(&a[..], &out).unwrap();
        assert_eq!(std::fs::read(out).unwrap(), b"xyz");
    }

    #[test]
    fn download_rejects_tar_path_escape() {
        for hostile in [
            vec![
                ("top", tar::EntryType::Directory, ""),
                ("top/../../evil", tar::EntryType::Regular, "x"),
            ],
            vec![
                ("top", tar::EntryType::Directory, ""),
                ("top/link", tar::EntryType::Symlink, "../../etc"),
            ],
            vec![
                ("top", tar::EntryType::Directory, ""),
                ("top/abs", tar::EntryType::Symlink, "/etc/passwd"),
            ],
            vec![
                ("top", tar::EntryType::Directory, ""),
                ("top/hard", tar::EntryType::Link, "/etc/passwd"),
            ],
            vec![("/abs", tar::EntryType::Regular, "x")],
        ] {
            let d = tempfile::tempdir().unwrap();
            let e = extract(&archive(&hostile)[..], &d.path().join("out")).unwrap_err();
            assert_eq!(e.code(), ErrorCode::UnsafeArchiveEntry, "{hostile:?}");
            assert!(!d.path().join("evil").exists());
        }
    }

    #[test]
    fn channel_pipes_round_trip() {
        let (tx, rx) = mpsc::channel(DEPTH);
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("src")).unwrap();
        std::fs::write(d.path().join("src/x"), vec![7u8; 300_000]).unwrap();
        let src = d.path().join("src");
        let writer = std::thread::spawn(move || {
            let w = ChannelWriter::new(tx);
            write_tree(&src, "src", w).unwrap();
        });
        let out = d.path().join("dst");
        extract(ChannelReader::new(rx), &out).unwrap();
        writer.join().unwrap();
        assert_eq!(std::fs::read(out.join("x")).unwrap().len(), 300_000);
    }
}
