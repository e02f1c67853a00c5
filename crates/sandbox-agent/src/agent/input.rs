//! Reading the host's byte stream: frames, and the takeover preamble that starts a new
//! host session (protocol version 3).
//!
//! The stream is shared by every host that ever attached: a host that died mid-frame left
//! that frame's first bytes, and the next host's bytes follow them. So a malformed header
//! never ends the agent (PID 1: its exit would end the sandbox); the reader then discards
//! bytes until it finds [`TAKEOVER_MAGIC`], which a new host sends first (and sends again
//! after filler when its first preamble got no answer, i.e. was swallowed by the body of
//! a half-written frame). Bodies are never scanned: a frame read whole is delivered as it
//! is, whatever bytes it carries.

use std::io::{self, Read};

use crate::protocol::{self, Frame, PREAMBLE_LEN, TAKEOVER_MAGIC, TOKEN_LEN};

/// Most bytes asked of the stream per read, while it delivers whole chunks (a file
/// upload).
const READ_CHUNK: usize = 64 * 1024;

/// Fewest bytes asked per read, and what an idle agent keeps: most sandboxes are idle
/// most of their life, and a buffer sized for uploads was 64 KiB of resident memory in
/// each of them (docs/benchmarks.md, "Under load"), more than the rest of the agent's heap.
const MIN_READ: usize = 4 * 1024;

/// What the stream delivered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Item {
    /// A frame, read whole.
    Frame(Frame),
    /// A new host session starts with this token.
    Takeover([u8; TOKEN_LEN]),
    /// The stream ended (at a frame boundary or not).
    End,
}

/// The host's stream, read frame by frame with the takeover preamble recognised.
pub(crate) struct Input<R> {
    r: R,
    buf: Vec<u8>,
    /// Start of the unread bytes in `buf`.
    start: usize,
    /// Bytes asked of the next read: doubles while reads fill it, halves while they do
    /// not, between [`MIN_READ`] and [`READ_CHUNK`].
    chunk: usize,
    /// After a malformed header: discarding bytes up to the next preamble.
    scanning: bool,
    /// Bytes discarded while scanning since the last item (for the agent's diagnostics).
    discarded: u64,
}

impl<R: Read> Input<R> {
    pub(crate) fn new(r: R) -> Self {
        Input {
            r,
            buf: Vec::with_capacity(MIN_READ),
            start: 0,
            chunk: MIN_READ,
            scanning: false,
            discarded: 0,
        }
    }

    /// Bytes discarded while looking for a preamble since the last call.
    pub(crate) fn take_discarded(&mut self) -> u64 {
        std::mem::take(&mut self.discarded)
    }

    /// The next item. Errors are the stream's own (a read failed), never its content.
    pub(crate) fn next_item(&mut self) -> io::Result<Item> {
        loop {
            if let Some(item) = self.parse() {
                return Ok(item);
            }
            if !self.fill()? {
                return Ok(Item::End);
            }
        }
    }

    /// An item from the buffered bytes, or `None` when more bytes are needed.
    fn parse(&mut self) -> Option<Item> {
        loop {
            let avail = &self.buf[self.start..];
            if self.scanning {
                match protocol::find(avail, &TAKEOVER_MAGIC) {
                    Some(at) => {
                        self.discarded += at as u64;
                        self.start += at;
                        self.scanning = false;
                    }
                    None => {
                        // Keep what could be the magic's first bytes.
                        let keep = avail.len().min(TAKEOVER_MAGIC.len() - 1);
                        let drop = avail.len() - keep;
                        self.discarded += drop as u64;
                        self.start += drop;
                        return None;
                    }
                }
                continue;
            }
            let n = avail.len().min(TAKEOVER_MAGIC.len());
            if n > 0 && avail[..n] == TAKEOVER_MAGIC[..n] {
                if avail.len() < PREAMBLE_LEN {
                    return None;
                }
                let mut token = [0u8; TOKEN_LEN];
                token.copy_from_slice(&avail[TAKEOVER_MAGIC.len()..PREAMBLE_LEN]);
                self.start += PREAMBLE_LEN;
                return Some(Item::Takeover(token));
            }
            return match protocol::decode(avail) {
                Ok(Some((frame, used))) => {
                    self.start += used;
                    Some(Item::Frame(frame))
                }
                Ok(None) => None,
                // The failed header's own bytes are scanned too: a header a dead host
                // left half written may end where the next host's magic begins.
                Err(_) => {
                    self.scanning = true;
                    continue;
                }
            };
        }
    }

    /// Reads more bytes; `false` at the end of the stream.
    fn fill(&mut self) -> io::Result<bool> {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        // Back to an idle agent's size once the stream slowed and nothing is pending.
        if self.buf.is_empty() && self.chunk == MIN_READ && self.buf.capacity() > 2 * MIN_READ {
            self.buf = Vec::with_capacity(MIN_READ);
        }
        let len = self.buf.len();
        let chunk = self.chunk;
        self.buf.resize(len + chunk, 0);
        loop {
            match self.r.read(&mut self.buf[len..]) {
                Ok(n) => {
                    self.buf.truncate(len + n);
                    self.chunk = if n == chunk {
                        (chunk * 2).min(READ_CHUNK)
                    } else if n < chunk / 4 {
                        (chunk / 2).max(MIN_READ)
                    } else {
                        chunk
                    };
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.buf.truncate(len);
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{
        FrameKind, HEADER_LEN, Request, TAKEOVER_PAD_BYTE, TAKEOVER_PAD_LEN, takeover_preamble,
    };

    /// Delivers its bytes in reads of at most `step` bytes.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = out.len().min(self.step).min(self.data.len() - self.at);
            out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn items(data: Vec<u8>, step: usize) -> Vec<Item> {
        let mut input = Input::new(Trickle { data, at: 0, step });
        let mut out = Vec::new();
        loop {
            match input.next_item().unwrap() {
                Item::End => return out,
                item => out.push(item),
            }
        }
    }

    fn ping(id: u32) -> Frame {
        Frame::control(id, &Request::Ping)
    }

    fn bytes(f: &Frame) -> Vec<u8> {
        f.encode().unwrap()
    }

    const TOKEN: [u8; TOKEN_LEN] = [7; TOKEN_LEN];

    /// What a new host sends: the preamble and its hello (here a ping stands for it).
    fn next_host(first_try: bool) -> Vec<u8> {
        let mut v = Vec::new();
        if !first_try {
            v.extend(std::iter::repeat_n(TAKEOVER_PAD_BYTE, TAKEOVER_PAD_LEN));
        }
        v.extend_from_slice(&takeover_preamble(&TOKEN));
        v.extend(bytes(&ping(9)));
        v
    }

    /// Delivers its segments one after another, a read never crossing a segment's end:
    /// an upload's bytes arrive in full reads, an interactive session's one frame a read.
    struct Segments(std::collections::VecDeque<Vec<u8>>);

    impl Read for Segments {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let Some(seg) = self.0.front_mut() else {
                return Ok(0);
            };
            let n = out.len().min(seg.len());
            out[..n].copy_from_slice(&seg[..n]);
            seg.drain(..n);
            if seg.is_empty() {
                self.0.pop_front();
            }
            Ok(n)
        }
    }

    /// The reads grow to [`READ_CHUNK`] while an upload fills them, and once the stream
    /// is back to small frames the buffer returns to an idle agent's size.
    #[test]
    fn the_buffer_grows_for_an_upload_and_shrinks_back_when_idle() {
        let upload = Frame {
            kind: FrameKind::Stdin,
            id: 3,
            body: vec![b'u'; 1 << 20],
        };
        let mut segments = std::collections::VecDeque::from([bytes(&upload)]);
        segments.extend((0..20).map(|i| bytes(&ping(10 + i))));
        let mut input = Input::new(Segments(segments));
        assert!(input.buf.capacity() <= 2 * MIN_READ);
        assert_eq!(input.next_item().unwrap(), Item::Frame(upload));
        // The upload's last read is short, so the size may have halved once.
        assert!(
            input.chunk >= READ_CHUNK / 2,
            "full reads grow the read size"
        );
        for i in 0..20 {
            assert_eq!(input.next_item().unwrap(), Item::Frame(ping(10 + i)));
        }
        assert_eq!(input.next_item().unwrap(), Item::End);
        assert_eq!(input.chunk, MIN_READ, "short reads shrink it back");
        assert!(
            input.buf.capacity() <= 2 * MIN_READ,
            "an idle agent keeps {} bytes",
            input.buf.capacity()
        );
    }

    #[test]
    fn frames_and_a_preamble_at_a_boundary_are_read_in_any_chunking() {
        let mut data = bytes(&ping(1));
        data.extend(next_host(true));
        for step in [1, 2, 5, 9, 31, 4096] {
            assert_eq!(
                items(data.clone(), step),
                vec![
                    Item::Frame(ping(1)),
                    Item::Takeover(TOKEN),
                    Item::Frame(ping(9))
                ],
                "reads of {step} bytes"
            );
        }
    }

    /// Cut before its kind byte, a header the next host's magic completes is no header
    /// (the magic's bytes are no length and no kind), so the preamble is found at once.
    #[test]
    fn a_header_cut_before_its_kind_is_found_past_by_the_next_preamble() {
        let dead = bytes(&Frame {
            kind: FrameKind::Stdin,
            id: 3,
            body: vec![b'x'; 100],
        });
        for cut in 1..5 {
            let mut data = dead[..cut].to_vec();
            data.extend(next_host(true));
            assert_eq!(
                items(data, 7),
                vec![Item::Takeover(TOKEN), Item::Frame(ping(9))],
                "header cut after {cut} bytes"
            );
        }
    }

    /// Cut after its kind byte, the frame announces a body that swallows the first
    /// preamble; the filler completes it whatever its length, and the repeat is found.
    #[test]
    fn a_frame_cut_after_its_kind_is_completed_by_the_filler_and_the_repeat_is_found() {
        for len in [1usize, 50, 4096, protocol::MAX_FRAME_LEN as usize - 5] {
            let dead = bytes(&Frame {
                kind: FrameKind::FileData,
                id: 3,
                body: vec![b'x'; len],
            });
            for cut in [5, 8, HEADER_LEN, HEADER_LEN + len / 2, dead.len() - 1] {
                let mut data = dead[..cut].to_vec();
                data.extend(next_host(true));
                data.extend(next_host(false));
                let got = items(data, 64 * 1024);
                // The dead host's frame completes with garbage (delivered: its body is
                // never scanned), then the repeated preamble starts the session.
                let tail = &got[got.len() - 2..];
                assert_eq!(
                    tail,
                    &[Item::Takeover(TOKEN), Item::Frame(ping(9))],
                    "body of {len} cut at {cut}"
                );
                assert!(
                    got[..got.len() - 2]
                        .iter()
                        .all(|i| !matches!(i, Item::Takeover(_))),
                    "a takeover was read inside the dead host's frame: {len} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn garbage_is_discarded_up_to_the_preamble_and_bodies_are_never_scanned() {
        // A body carrying the magic is data, not a takeover.
        let carrier = Frame {
            kind: FrameKind::Stdin,
            id: 1,
            body: takeover_preamble(&[1; TOKEN_LEN]).to_vec(),
        };
        let mut data = bytes(&carrier);
        data.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 1]);
        data.extend_from_slice(b"more garbage");
        data.extend(next_host(true));
        let mut input = Input::new(Trickle {
            data,
            at: 0,
            step: 3,
        });
        assert_eq!(input.next_item().unwrap(), Item::Frame(carrier));
        assert_eq!(input.next_item().unwrap(), Item::Takeover(TOKEN));
        assert_eq!(input.take_discarded(), 9 + 12);
        assert_eq!(input.next_item().unwrap(), Item::Frame(ping(9)));
        assert_eq!(input.next_item().unwrap(), Item::End);
    }

    #[test]
    fn a_stream_ending_mid_frame_or_mid_scan_is_the_end() {
        let f = bytes(&ping(1));
        assert!(items(f[..5].to_vec(), 2).is_empty());
        assert!(items(vec![0xff; 40], 3).is_empty());
        assert!(items(TAKEOVER_MAGIC[..10].to_vec(), 3).is_empty());
    }
}
