//! The Podman-specific side of archive streaming; building and safely unpacking archives
//! is [`sandbox_core::tar_stream`].
//!
//! Download: podman-api yields the archive as an async stream, which a task feeds into a
//! small bounded channel that a blocking task reads through [`ChannelReader`] while
//! [`unpack_safely`](sandbox_core::tar_stream::unpack_safely) extracts it. `read` and
//! `stat`-like checks look at the first entry of an in-memory archive ([`first_entry`]).

use std::io::Read;

use bytes::Bytes;
use sandbox_core::{Result, SandboxError};
use tokio::sync::mpsc;

pub(crate) use sandbox_core::tar_stream::ChannelWriter;

/// Chunks in flight per channel, in both directions.
pub(crate) const DEPTH: usize = sandbox_core::tar_stream::CHUNKS_IN_FLIGHT;

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

/// The kind (and, for a regular file, the content) of an archive's first entry.
pub(crate) enum FirstEntry {
    File(Bytes),
    Dir,
    Symlink,
    Other,
}

/// The first entry of an in-memory archive (for `read`); `PathNotFound` when empty.
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
    use sandbox_core::tar_stream::{single_file, stream_local, unpack_safely};

    #[test]
    fn channel_pipes_round_trip() {
        let (tx, rx) = mpsc::channel(DEPTH);
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("src")).unwrap();
        std::fs::write(d.path().join("src/x"), vec![7u8; 300_000]).unwrap();
        let src = d.path().join("src");
        let writer = std::thread::spawn(move || stream_local(tx, &src, "src"));
        let out = d.path().join("dst");
        unpack_safely(ChannelReader::new(rx), &out).unwrap();
        writer.join().unwrap().unwrap();
        assert_eq!(std::fs::read(out.join("x")).unwrap().len(), 300_000);
    }

    #[test]
    fn channel_reader_passes_producer_errors() {
        let (tx, rx) = mpsc::channel(DEPTH);
        let producer = std::thread::spawn(move || {
            tx.blocking_send(Ok(Bytes::from_static(b"ab"))).unwrap();
            tx.blocking_send(Err(std::io::Error::other("engine failed")))
                .unwrap();
        });
        let mut r = ChannelReader::new(rx);
        let mut buf = Vec::new();
        assert!(r.read_to_end(&mut buf).is_err());
        assert_eq!(buf, b"ab");
        producer.join().unwrap();
    }

    #[test]
    fn first_entry_kinds() {
        let a = single_file("f", b"data", 0o644).unwrap();
        assert!(matches!(first_entry(&a, "/f").unwrap(), FirstEntry::File(b) if b == "data"));
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        b.append_data(&mut h, "d/", std::io::empty()).unwrap();
        let a = b.into_inner().unwrap();
        assert!(matches!(first_entry(&a, "/d").unwrap(), FirstEntry::Dir));
        let e = first_entry(&[0u8; 1024], "/gone").err().unwrap();
        assert_eq!(e.code(), sandbox_core::ErrorCode::PathNotFound);
    }
}
