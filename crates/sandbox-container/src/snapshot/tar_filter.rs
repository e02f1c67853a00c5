//! Drops named entries from a tar stream as it passes, block by block, without unpacking
//! or re-encoding anything else: what the engine exported reaches the import byte for
//! byte (modes, owners, extended attributes, file capabilities), minus the dropped
//! entries.
//!
//! An entry's name is the one a reader would give it: a PAX `path` record, else a GNU
//! long name, else the header's (ustar prefix included), with `./` and `/` leading parts
//! and a trailing `/` ignored. A dropped entry goes with its PAX and GNU records and its
//! data. A hard link whose target is a dropped entry goes too: its target's bytes are not
//! in the stream any more, and the import would fail on it.
//!
//! The stream comes from the engine, but every name in it was chosen inside the sandbox:
//! a header the filter cannot follow (bad checksum, a metadata record past its bound)
//! fails the stream rather than letting it pass unread.

use std::collections::HashSet;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;

use crate::engine::ArchiveBody;

const BLOCK: usize = 512;
/// Largest PAX or GNU name record followed (extended attributes make PAX records grow).
const META_MAX: u64 = 1024 * 1024;

/// `body` without the entries whose normalised names are in `drop` (each given without
/// a leading `/`), nor hard links to them.
pub(crate) fn without_entries(body: ArchiveBody, drop: &[&str]) -> ArchiveBody {
    Box::pin(Filtered {
        body,
        filter: Filter::new(drop.iter().map(|d| normalise(d)).collect()),
        done: false,
    })
}

struct Filtered {
    body: ArchiveBody,
    filter: Filter,
    done: bool,
}

impl Stream for Filtered {
    type Item = std::io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match self.body.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.done = true;
                    return Poll::Ready(match self.filter.finish() {
                        Ok(()) => None,
                        Err(e) => Some(Err(e)),
                    });
                }
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(chunk))) => {
                    let mut out = Vec::with_capacity(chunk.len());
                    if let Err(e) = self.filter.feed(&chunk, &mut out) {
                        self.done = true;
                        return Poll::Ready(Some(Err(e)));
                    }
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Bytes::from(out))));
                    }
                }
            }
        }
    }
}

/// Where the filter is in the stream.
#[derive(Debug)]
enum State {
    /// Collecting a 512-byte header.
    Header,
    /// Collecting a metadata record's data (and then its padding).
    Meta { kind: MetaKind, left: u64, pad: u64 },
    /// Passing (`keep`) or skipping an entry's data and padding.
    Data { left: u64, keep: bool },
    /// Past the end-of-archive block: the rest passes as it is.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MetaKind {
    Pax,
    LongName,
    LongLink,
    /// A global PAX header: it belongs to no single entry and passes.
    Global,
}

#[derive(Debug)]
struct Filter {
    drop: HashSet<String>,
    state: State,
    /// The header being collected, or the metadata record being collected.
    buf: Vec<u8>,
    /// Raw bytes of the metadata records (headers, data, padding) before the next entry:
    /// written with it, or dropped with it.
    pending: Vec<u8>,
    pax_path: Option<String>,
    pax_link: Option<String>,
    long_name: Option<String>,
    long_link: Option<String>,
    /// Dropped names, for the hard links that point at them.
    dropped: HashSet<String>,
}

fn malformed(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("snapshot: the exported archive cannot be followed: {what}"),
    )
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

/// A name without leading `./` or `/` parts, `.` components and a trailing `/`.
fn normalise(name: &str) -> String {
    name.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// A NUL-terminated (or full) name field as text.
fn field_text(data: &[u8]) -> String {
    let end = data.iter().position(|b| *b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

impl Filter {
    fn new(drop: HashSet<String>) -> Self {
        Filter {
            drop,
            state: State::Header,
            buf: Vec::with_capacity(BLOCK),
            pending: Vec::new(),
            pax_path: None,
            pax_link: None,
            long_name: None,
            long_link: None,
            dropped: HashSet::new(),
        }
    }

    fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
        while !data.is_empty() {
            match &mut self.state {
                State::End => {
                    out.extend_from_slice(data);
                    return Ok(());
                }
                State::Header => {
                    let take = (BLOCK - self.buf.len()).min(data.len());
                    self.buf.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.buf.len() == BLOCK {
                        let block = std::mem::replace(&mut self.buf, Vec::with_capacity(BLOCK));
                        self.on_header(&block, out)?;
                    }
                }
                State::Data { left, keep } => {
                    let take = (*left).min(data.len() as u64) as usize;
                    if *keep {
                        out.extend_from_slice(&data[..take]);
                    }
                    *left -= take as u64;
                    data = &data[take..];
                    if *left == 0 {
                        self.state = State::Header;
                    }
                }
                State::Meta { kind, left, pad } => {
                    let kind = *kind;
                    let take = (*left + *pad).min(data.len() as u64) as usize;
                    let record_part = (*left).min(take as u64) as usize;
                    self.buf.extend_from_slice(&data[..record_part]);
                    if kind == MetaKind::Global {
                        out.extend_from_slice(&data[..take]);
                    } else {
                        self.pending.extend_from_slice(&data[..take]);
                    }
                    *left -= record_part as u64;
                    *pad -= (take - record_part) as u64;
                    data = &data[take..];
                    if *left == 0 && *pad == 0 {
                        let record = std::mem::replace(&mut self.buf, Vec::with_capacity(BLOCK));
                        self.on_record(kind, &record);
                        self.state = State::Header;
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(&self) -> std::io::Result<()> {
        match self.state {
            State::End => Ok(()),
            State::Header if self.buf.is_empty() && self.pending.is_empty() => Ok(()),
            _ => Err(malformed("it ends inside an entry")),
        }
    }

    fn on_record(&mut self, kind: MetaKind, record: &[u8]) {
        match kind {
            MetaKind::Pax => {
                for (k, v) in pax_records(record) {
                    match k.as_str() {
                        "path" => self.pax_path = Some(v),
                        "linkpath" => self.pax_link = Some(v),
                        _ => {}
                    }
                }
            }
            MetaKind::LongName => self.long_name = Some(field_text(record)),
            MetaKind::LongLink => self.long_link = Some(field_text(record)),
            MetaKind::Global => {}
        }
    }

    fn on_header(&mut self, block: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
        if block.iter().all(|b| *b == 0) {
            if !self.pending.is_empty() {
                return Err(malformed("metadata records without their entry"));
            }
            out.extend_from_slice(block);
            self.state = State::End;
            return Ok(());
        }
        let header = tar::Header::from_byte_slice(block);
        if header.cksum().ok() != Some(checksum(block)) {
            return Err(malformed("a header checksum is wrong"));
        }
        let size = header
            .entry_size()
            .map_err(|_| malformed("an entry size is unreadable"))?;
        let meta = match header.entry_type() {
            tar::EntryType::XHeader => Some(MetaKind::Pax),
            tar::EntryType::XGlobalHeader => Some(MetaKind::Global),
            tar::EntryType::GNULongName => Some(MetaKind::LongName),
            tar::EntryType::GNULongLink => Some(MetaKind::LongLink),
            tar::EntryType::GNUSparse => return Err(malformed("a GNU sparse entry")),
            _ => None,
        };
        if let Some(kind) = meta {
            if size > META_MAX {
                return Err(malformed("a metadata record is too large"));
            }
            if kind == MetaKind::Global {
                out.extend_from_slice(block);
            } else {
                self.pending.extend_from_slice(block);
            }
            self.state = if size == 0 {
                State::Header
            } else {
                State::Meta {
                    kind,
                    left: size,
                    pad: padding(size),
                }
            };
            return Ok(());
        }
        let name = normalise(&match (self.pax_path.take(), self.long_name.take()) {
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => String::from_utf8_lossy(&header.path_bytes()).into_owned(),
        });
        let link = match (self.pax_link.take(), self.long_link.take()) {
            (Some(l), _) | (None, Some(l)) => Some(l),
            (None, None) => header.link_name_bytes().map(|l| field_text(&l)),
        };
        let hard_link_to_dropped = header.entry_type() == tar::EntryType::Link
            && link.is_some_and(|l| self.dropped.contains(&normalise(&l)));
        let keep = !self.drop.contains(&name) && !hard_link_to_dropped;
        let pending = std::mem::take(&mut self.pending);
        if keep {
            out.extend_from_slice(&pending);
            out.extend_from_slice(block);
        } else {
            tracing::debug!(entry = %name, "left out of the snapshot");
            self.dropped.insert(name);
        }
        // Only regular files carry data in these archives; a link's size field is 0.
        let data =
            if header.entry_type().is_file() || header.entry_type() == tar::EntryType::Continuous {
                size
            } else {
                0
            };
        let skip = data + padding(data);
        self.state = if skip == 0 {
            State::Header
        } else {
            State::Data { left: skip, keep }
        };
        Ok(())
    }
}

/// The header checksum: the sum of all bytes with the checksum field read as spaces.
fn checksum(block: &[u8]) -> u32 {
    block
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(*b)
            }
        })
        .sum()
}

/// `"<len> key=value\n"` records; a malformed one ends the parse.
fn pax_records(mut data: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let Some(sp) = data.iter().position(|b| *b == b' ') else {
            break;
        };
        let Some(len) = std::str::from_utf8(&data[..sp])
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
        else {
            break;
        };
        if len <= sp + 1 || len > data.len() {
            break;
        }
        let rec = &data[sp + 1..len];
        let rec = rec.strip_suffix(b"\n").unwrap_or(rec);
        if let Some(eq) = rec.iter().position(|b| *b == b'=') {
            out.push((
                String::from_utf8_lossy(&rec[..eq]).into_owned(),
                String::from_utf8_lossy(&rec[eq + 1..]).into_owned(),
            ));
        }
        data = &data[len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, data).unwrap();
    }

    fn hard_link(b: &mut tar::Builder<Vec<u8>>, name: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_entry_type(tar::EntryType::Link);
        b.append_link(&mut h, name, target).unwrap();
    }

    /// A PAX-named entry, as Go's writer emits for long or non-ASCII names.
    fn pax_file(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
        b.append_pax_extensions([("path", name.as_bytes())])
            .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_path("short").unwrap();
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    /// Runs `archive` through the filter in chunks of `chunk` bytes; the names and
    /// contents that come out.
    async fn filtered(archive: Vec<u8>, chunk: usize) -> Vec<(String, Vec<u8>)> {
        let chunks: Vec<std::io::Result<Bytes>> = archive
            .chunks(chunk)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body: ArchiveBody = futures::stream::iter(chunks).boxed();
        let mut out = Vec::new();
        let mut s = without_entries(body, &[".sandbox-agent"]);
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c.unwrap());
        }
        let mut a = tar::Archive::new(out.as_slice());
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                (e.path().unwrap().to_string_lossy().into_owned(), data)
            })
            .collect()
    }

    fn names(entries: &[(String, Vec<u8>)]) -> Vec<&str> {
        entries.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[tokio::test]
    async fn the_agent_is_left_out_and_everything_else_passes() {
        let long = format!("usr/local/{}/tool", "d".repeat(150));
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, ".dockerenv", b"");
        file(&mut b, ".sandbox-agent", &[0xAB; 3000]);
        file(&mut b, "usr/local/bin/hello", b"#!/bin/sh\necho hi\n");
        file(&mut b, &long, b"long");
        pax_file(&mut b, "work/pax-named", b"pax");
        file(&mut b, "work/.sandbox-agent", b"not the agent");
        let archive = b.into_inner().unwrap();
        for chunk in [1, 100, 511, 512, 513, 4096, usize::MAX >> 1] {
            let out = filtered(archive.clone(), chunk.min(archive.len())).await;
            assert_eq!(
                names(&out),
                [
                    ".dockerenv",
                    "usr/local/bin/hello",
                    long.as_str(),
                    "work/pax-named",
                    "work/.sandbox-agent"
                ],
                "chunk {chunk}"
            );
            assert_eq!(out[1].1, b"#!/bin/sh\necho hi\n");
            assert_eq!(out[3].1, b"pax");
        }
    }

    #[tokio::test]
    async fn every_spelling_of_the_agent_path_is_left_out() {
        for name in ["./.sandbox-agent", "/.sandbox-agent", ".//./.sandbox-agent"] {
            let mut b = tar::Builder::new(Vec::new());
            // `tar` normalises names it is given: the raw header is written by hand.
            let mut h = tar::Header::new_gnu();
            h.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
            h.set_size(4);
            h.set_mode(0o755);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_cksum();
            b.append(&h, &b"\x7fELF"[..]).unwrap();
            file(&mut b, "etc/kept", b"k");
            let out = filtered(b.into_inner().unwrap(), 700).await;
            assert_eq!(names(&out), ["etc/kept"], "{name}");
        }
        // A PAX path naming the agent behind an innocent header name.
        let mut b = tar::Builder::new(Vec::new());
        pax_file(&mut b, ".sandbox-agent", b"agent");
        file(&mut b, "etc/kept", b"k");
        let out = filtered(b.into_inner().unwrap(), 333).await;
        assert_eq!(names(&out), ["etc/kept"]);
    }

    #[tokio::test]
    async fn a_hard_link_to_the_agent_goes_with_it() {
        // `ln /.sandbox-agent /tmp/copy` inside: the export names the agent first and
        // the copy as a link to it, which the import could not resolve.
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, ".sandbox-agent", &[1; 600]);
        hard_link(&mut b, "tmp/copy", ".sandbox-agent");
        file(&mut b, "tmp/other", b"o");
        hard_link(&mut b, "tmp/other-link", "tmp/other");
        let out = filtered(b.into_inner().unwrap(), 512).await;
        assert_eq!(names(&out), ["tmp/other", "tmp/other-link"]);
    }

    #[tokio::test]
    async fn an_archive_the_filter_cannot_follow_fails_the_stream() {
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "a", b"x");
        let mut archive = b.into_inner().unwrap();
        archive[0] ^= 0x55; // the header's checksum no longer matches
        let body: ArchiveBody = futures::stream::iter([Ok(Bytes::from(archive))]).boxed();
        let mut s = without_entries(body, &[".sandbox-agent"]);
        assert!(s.next().await.unwrap().is_err());
        // Cut inside an entry's data.
        let mut b = tar::Builder::new(Vec::new());
        file(&mut b, "a", &[0; 2000]);
        let archive = b.into_inner().unwrap();
        let body: ArchiveBody =
            futures::stream::iter([Ok(Bytes::copy_from_slice(&archive[..1000]))]).boxed();
        let items: Vec<_> = without_entries(body, &[".sandbox-agent"]).collect().await;
        assert!(items.last().unwrap().is_err());
    }
}
