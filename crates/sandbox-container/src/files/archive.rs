//! Reading an engine's tar stream as it arrives, with caps checked from the headers.
//!
//! `files().read` needs one file out of the archive the engine streams. The header is
//! parsed from the first blocks (PAX and GNU long-name records included) and the entry's
//! size is checked against the cap *before* any of its data is read: a sparse 3 GiB file is
//! refused after 512 bytes, and dropping the stream ends the transfer.
//!
//! `files().download` unpacks the whole archive; [`GuardedReader`] sits between the engine's
//! stream and the unpacker and follows the same headers ([`TarTracker`]): it counts entries
//! and announced file bytes and fails the read that would hand the unpacker a header past
//! either limit, so nothing of an oversized entry is ever written. A sparse file inside is
//! sent densely by the engine, so its announced size is what the host would write.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;

use crate::engine::ArchiveBody;

/// Largest PAX or GNU long-name record accepted before the entry.
const META_MAX: u64 = 64 * 1024;
const BLOCK: usize = 512;

/// What the first entry of an archive is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FirstEntry {
    /// The archive is empty.
    Missing,
    /// A directory.
    Dir,
    /// A symbolic link to the target.
    Link(String),
    /// A regular file and its content.
    File(Bytes),
    /// A regular file larger than the cap (its size).
    TooLarge(u64),
}

/// Reads the body, bounding each wait for the next chunk by `idle`.
pub(crate) struct ArchiveReader {
    body: ArchiveBody,
    buf: BytesMut,
    idle: Duration,
}

impl ArchiveReader {
    pub(crate) fn new(body: ArchiveBody, idle: Duration) -> Self {
        ArchiveReader {
            body,
            buf: BytesMut::new(),
            idle,
        }
    }

    /// Ensures `n` bytes are buffered; `false` when the body ended first.
    async fn fill(&mut self, n: usize) -> std::io::Result<bool> {
        while self.buf.len() < n {
            match tokio::time::timeout(self.idle, self.body.next()).await {
                Ok(Some(Ok(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(Some(Err(e))) => return Err(e),
                Ok(None) => return Ok(false),
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the engine sent no archive data for {:?}", self.idle),
                    ));
                }
            }
        }
        Ok(true)
    }

    async fn take(&mut self, n: u64) -> std::io::Result<Bytes> {
        let n = usize::try_from(n).map_err(|_| malformed("entry too large for this host"))?;
        if !self.fill(n).await? {
            return Err(malformed("archive ended inside an entry"));
        }
        Ok(self.buf.split_to(n).freeze())
    }

    async fn skip_padding(&mut self, size: u64) -> std::io::Result<()> {
        let pad = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
        if pad > 0 {
            self.take(pad).await?;
        }
        Ok(())
    }

    /// Reads the first real entry; a regular file is returned only when its size is at
    /// most `cap`.
    pub(crate) async fn first_entry(&mut self, cap: u64) -> std::io::Result<FirstEntry> {
        let mut pax_size: Option<u64> = None;
        let mut long_link: Option<String> = None;
        for _ in 0..8 {
            if !self.fill(BLOCK).await? {
                return Ok(FirstEntry::Missing);
            }
            let block = self.buf.split_to(BLOCK);
            if block.iter().all(|b| *b == 0) {
                return Ok(FirstEntry::Missing);
            }
            let header = tar::Header::from_byte_slice(&block);
            header
                .cksum()
                .ok()
                .filter(|c| *c == checksum(&block))
                .ok_or_else(|| malformed("bad header checksum"))?;
            let size = header.entry_size()?;
            match header.entry_type() {
                tar::EntryType::XHeader | tar::EntryType::XGlobalHeader => {
                    if size > META_MAX {
                        return Err(malformed("oversized PAX record"));
                    }
                    let data = self.take(size).await?;
                    self.skip_padding(size).await?;
                    for (k, v) in pax_records(&data) {
                        match k {
                            "size" => pax_size = v.parse().ok(),
                            "linkpath" => long_link = Some(v.to_string()),
                            _ => {}
                        }
                    }
                }
                tar::EntryType::GNULongName | tar::EntryType::GNULongLink => {
                    if size > META_MAX {
                        return Err(malformed("oversized long-name record"));
                    }
                    let is_link = header.entry_type() == tar::EntryType::GNULongLink;
                    let data = self.take(size).await?;
                    self.skip_padding(size).await?;
                    if is_link {
                        let s = String::from_utf8_lossy(&data);
                        long_link = Some(s.trim_end_matches('\0').to_string());
                    }
                }
                tar::EntryType::Directory => return Ok(FirstEntry::Dir),
                tar::EntryType::Symlink => {
                    let target = long_link.or_else(|| {
                        header
                            .link_name_bytes()
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                    });
                    return Ok(FirstEntry::Link(target.unwrap_or_default()));
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let size = pax_size.unwrap_or(size);
                    if size > cap {
                        return Ok(FirstEntry::TooLarge(size));
                    }
                    return Ok(FirstEntry::File(self.take(size).await?));
                }
                other => {
                    return Err(malformed(&format!("unsupported entry type {other:?}")));
                }
            }
        }
        Err(malformed("too many metadata records"))
    }
}

/// Limits of one download: file bytes (the sum of every regular entry's announced size)
/// and entries (of any kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DownloadLimits {
    pub(crate) bytes: u64,
    pub(crate) entries: u64,
}

/// Why a guarded download stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The archive announced more file bytes than the limit (`total` so far, with the
    /// entry that crossed it).
    TooLarge { total: u64 },
    /// More entries than the limit.
    TooManyEntries,
    /// The download's future was dropped.
    Cancelled,
    /// The stream is not a tar archive this reader follows.
    Malformed(&'static str),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::TooLarge { total } => write!(f, "the archive announces {total} bytes"),
            Refusal::TooManyEntries => write!(f, "the archive has too many entries"),
            Refusal::Cancelled => write!(f, "download cancelled"),
            Refusal::Malformed(what) => write!(f, "malformed archive: {what}"),
        }
    }
}

impl std::error::Error for Refusal {}

/// Where the tracker is in the stream.
#[derive(Debug)]
enum Track {
    /// Collecting a 512-byte header.
    Header(Vec<u8>),
    /// Skipping an entry's data and padding.
    Skip(u64),
    /// Collecting a metadata record (PAX when `pax`), then skipping `pad`.
    Meta {
        left: u64,
        pad: u64,
        buf: Vec<u8>,
        pax: bool,
    },
}

/// Follows a tar stream's headers as bytes pass through, counting entries and announced
/// file bytes against [`DownloadLimits`].
#[derive(Debug)]
pub(crate) struct TarTracker {
    limits: DownloadLimits,
    track: Track,
    entries: u64,
    bytes: u64,
    pax_size: Option<u64>,
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

impl TarTracker {
    pub(crate) fn new(limits: DownloadLimits) -> Self {
        TarTracker {
            limits,
            track: Track::Header(Vec::with_capacity(BLOCK)),
            entries: 0,
            bytes: 0,
            pax_size: None,
        }
    }

    /// Takes the next bytes of the stream; `Err` as soon as a header crosses a limit.
    pub(crate) fn feed(&mut self, mut data: &[u8]) -> Result<(), Refusal> {
        while !data.is_empty() {
            match &mut self.track {
                Track::Header(h) => {
                    let take = (BLOCK - h.len()).min(data.len());
                    h.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if h.len() == BLOCK {
                        let block = std::mem::take(h);
                        self.on_header(&block)?;
                    }
                }
                Track::Skip(left) => {
                    let take = (*left).min(data.len() as u64);
                    *left -= take;
                    data = &data[take as usize..];
                    if *left == 0 {
                        self.track = Track::Header(Vec::with_capacity(BLOCK));
                    }
                }
                Track::Meta {
                    left,
                    pad,
                    buf,
                    pax,
                } => {
                    let take = (*left).min(data.len() as u64);
                    buf.extend_from_slice(&data[..take as usize]);
                    *left -= take;
                    data = &data[take as usize..];
                    if *left == 0 {
                        if *pax {
                            self.pax_size = pax_records(buf)
                                .into_iter()
                                .find(|(k, _)| *k == "size")
                                .and_then(|(_, v)| v.parse().ok());
                        }
                        self.track = match *pad {
                            0 => Track::Header(Vec::with_capacity(BLOCK)),
                            pad => Track::Skip(pad),
                        };
                    }
                }
            }
        }
        Ok(())
    }

    fn on_header(&mut self, block: &[u8]) -> Result<(), Refusal> {
        self.track = Track::Header(Vec::with_capacity(BLOCK));
        if block.iter().all(|b| *b == 0) {
            return Ok(());
        }
        let header = tar::Header::from_byte_slice(block);
        if header.cksum().ok() != Some(checksum(block)) {
            return Err(Refusal::Malformed("bad header checksum"));
        }
        let size = header
            .entry_size()
            .map_err(|_| Refusal::Malformed("bad entry size"))?;
        let kind = header.entry_type();
        match kind {
            tar::EntryType::XHeader
            | tar::EntryType::XGlobalHeader
            | tar::EntryType::GNULongName
            | tar::EntryType::GNULongLink => {
                if size > META_MAX {
                    return Err(Refusal::Malformed("oversized metadata record"));
                }
                if size > 0 {
                    self.track = Track::Meta {
                        left: size,
                        pad: padding(size),
                        buf: Vec::with_capacity(size as usize),
                        pax: kind == tar::EntryType::XHeader,
                    };
                }
                Ok(())
            }
            // Its extension blocks are not followed here; no engine sends one.
            tar::EntryType::GNUSparse => Err(Refusal::Malformed("GNU sparse entry")),
            _ => {
                self.entries += 1;
                if self.entries > self.limits.entries {
                    return Err(Refusal::TooManyEntries);
                }
                let size = self.pax_size.take().unwrap_or(size);
                if matches!(kind, tar::EntryType::Regular | tar::EntryType::Continuous) {
                    self.bytes = self.bytes.saturating_add(size);
                    if self.bytes > self.limits.bytes {
                        return Err(Refusal::TooLarge { total: self.bytes });
                    }
                }
                let skip = size.saturating_add(padding(size));
                if skip > 0 {
                    self.track = Track::Skip(skip);
                }
                Ok(())
            }
        }
    }
}

/// A reader that hands the unpacker only what [`TarTracker`] accepted, and stops on
/// cancellation. The first refusal is kept in `refusal` for the caller to map.
pub(crate) struct GuardedReader<R> {
    inner: R,
    tracker: TarTracker,
    cancelled: Arc<AtomicBool>,
    refusal: Arc<Mutex<Option<Refusal>>>,
}

impl<R> GuardedReader<R> {
    pub(crate) fn new(
        inner: R,
        limits: DownloadLimits,
        cancelled: Arc<AtomicBool>,
        refusal: Arc<Mutex<Option<Refusal>>>,
    ) -> Self {
        GuardedReader {
            inner,
            tracker: TarTracker::new(limits),
            cancelled,
            refusal,
        }
    }

    fn refuse(&self, r: Refusal) -> std::io::Error {
        if let Ok(mut slot) = self.refusal.lock() {
            slot.get_or_insert(r.clone());
        }
        std::io::Error::other(r)
    }
}

impl<R: std::io::Read> std::io::Read for GuardedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cancelled.load(Ordering::SeqCst) {
            return Err(self.refuse(Refusal::Cancelled));
        }
        let n = self.inner.read(buf)?;
        if let Err(r) = self.tracker.feed(&buf[..n]) {
            return Err(self.refuse(r));
        }
        Ok(n)
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

/// `"<len> key=value\n"` records; malformed ones end the parse.
fn pax_records(mut data: &[u8]) -> Vec<(&str, &str)> {
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
        if let Ok(text) = std::str::from_utf8(rec)
            && let Some((k, v)) = text.split_once('=')
        {
            out.push((k, v));
        }
        data.advance(len);
    }
    out
}

fn malformed(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("malformed archive: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(bytes: Vec<u8>, chunk: usize) -> ArchiveBody {
        let chunks: Vec<std::io::Result<Bytes>> = bytes
            .chunks(chunk)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures::stream::iter(chunks).boxed()
    }

    fn reader(bytes: Vec<u8>, chunk: usize) -> ArchiveReader {
        ArchiveReader::new(body(bytes, chunk), Duration::from_secs(5))
    }

    #[tokio::test]
    async fn file_dir_link_and_empty() {
        let data: Vec<u8> = (0..=255u8).collect();
        let tar = crate::files::tar_stream::single_file("f", &data, 0o644).unwrap();
        let got = reader(tar, 7).first_entry(1024).await.unwrap();
        assert_eq!(got, FirstEntry::File(Bytes::from(data)));

        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "l", "../target").unwrap();
        let got = reader(b.into_inner().unwrap(), 512)
            .first_entry(10)
            .await
            .unwrap();
        assert_eq!(got, FirstEntry::Link("../target".into()));

        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        b.append_data(&mut h, "d/", std::io::empty()).unwrap();
        let got = reader(b.into_inner().unwrap(), 512)
            .first_entry(10)
            .await
            .unwrap();
        assert_eq!(got, FirstEntry::Dir);

        assert_eq!(
            reader(vec![0; 1024], 512).first_entry(10).await.unwrap(),
            FirstEntry::Missing
        );
        assert_eq!(
            reader(vec![], 512).first_entry(10).await.unwrap(),
            FirstEntry::Missing
        );
    }

    #[tokio::test]
    async fn oversized_file_refused_from_its_header_alone() {
        // A header announcing 3 GiB followed by nothing: refused without reading data.
        let mut h = tar::Header::new_gnu();
        h.set_path("huge").unwrap();
        h.set_size(3 << 30);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        let got = reader(h.as_bytes().to_vec(), 512)
            .first_entry(64 << 20)
            .await
            .unwrap();
        assert_eq!(got, FirstEntry::TooLarge(3 << 30));
    }

    #[tokio::test]
    async fn pax_size_overrides_and_garbage_is_refused() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::XHeader);
        let rec = b"20 size=99999999999\n";
        h.set_size(rec.len() as u64);
        b.append_data(&mut h, "pax", &rec[..]).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(1);
        b.append_data(&mut h, "f", &b"x"[..]).unwrap();
        let got = reader(b.into_inner().unwrap(), 100)
            .first_entry(1 << 20)
            .await
            .unwrap();
        assert_eq!(got, FirstEntry::TooLarge(99_999_999_999));

        let e = reader(vec![0x41; 512], 512)
            .first_entry(10)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        let tar = crate::files::tar_stream::single_file("f", b"abcdef", 0o644).unwrap();
        let e = reader(tar[..515].to_vec(), 512)
            .first_entry(10)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "truncated entry");
    }

    #[test]
    fn pax_records_survive_forged_lengths() {
        assert_eq!(pax_records(b"8 a=bcd\n"), vec![("a", "bcd")]);
        assert!(pax_records(b"99999999999999999999 x=y\n").is_empty());
        assert!(pax_records(b"2 \n").is_empty());
        assert!(pax_records(b"nonsense").is_empty());
    }
}
