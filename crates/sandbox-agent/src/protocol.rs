//! The wire format between the host and the agent, shared by both sides.
//!
//! A frame is a 9-byte header — `len: u32` (big endian, the byte count of everything after
//! this field: kind, id and body), `kind: u8`, `id: u32` — then the body. `len` is checked
//! against [`MAX_FRAME_LEN`] before a single body byte is buffered, on both sides: the host
//! never trusts a length beyond its cap, whatever the stream says.
//!
//! Control frames ([`FrameKind::Control`]) carry one JSON [`Request`] (host → agent) or
//! [`Reply`] (agent → host). Data frames carry raw bytes of one stream of the request `id`.
//! Streams are flow-controlled with a window of [`WINDOW`] bytes per request: the receiver
//! returns credit with [`FrameKind::Ack`] frames as it consumes data, so neither side ever
//! buffers more than a window per request.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// The protocol versions this build speaks, oldest first. Version 2 adds pseudo-terminals
/// ([`SpawnSpec::pty`], [`Request::Resize`]); a host must not send either on version 1
/// (an agent of version 1 would ignore the field and run the process without a terminal).
/// Version 3 adds session takeover ([`TAKEOVER_MAGIC`]), moving the deadline
/// ([`Request::SetDeadline`]) and the idle limit (the `--idle` argument). A host must know
/// the agent speaks it before sending the takeover preamble (an older agent reads it as a
/// forged length and exits, which ends the sandbox), so it learns that from outside the
/// stream (the container's labels), never by trying; nor may it rely on a moved deadline
/// or an idle limit with an older agent. Version 4 adds [`Request::ResetProcesses`] and
/// the [`ErrorKind::Pids`] refusal of a spawn or read for lack of pids, and carrying
/// processes over the next takeover ([`Request::Keep`]), which forks with memory need: the
/// host of a restored copy of the sandbox adopts the interpreters its original served.
/// Version 5 adds the ssh-agent relay ([`Request::SshAgentListen`], [`FrameKind::SshAgent`]).
/// Version 6 adds TCP forwarding from a loopback port inside the sandbox to the host
/// ([`Request::TcpListen`], [`Reply::Listening`], [`FrameKind::Tcp`]); a host must not send
/// either to an older agent (it would answer an unknown request with an error, and drop
/// the frames of an unknown kind as a broken stream).
pub const SUPPORTED_VERSIONS: &[u32] = &[1, 2, 3, 4, 5, 6];

/// The first version with pseudo-terminals.
pub const PTY_VERSION: u32 = 2;

/// The first version with [`Request::ResetProcesses`] and [`ErrorKind::Pids`].
pub const RESET_VERSION: u32 = 4;

/// The first version with session takeover.
pub const TAKEOVER_VERSION: u32 = 3;

/// Starts a new host session on an agent that may have served another host before
/// (version 3). A host sends it, then a [`TOKEN_LEN`]-byte random session token, then its
/// hello. The agent drops the session it served (see docs/agent.md for what happens to its
/// processes) and answers with the same magic and token on its output, then the hello
/// reply; every frame it wrote for the old session before that point precedes the marker,
/// none follows it. The first byte (0xFF) makes the magic an invalid frame header (a
/// length above [`MAX_FRAME_LEN`]), so it can never be mistaken for a frame at a frame
/// boundary, and bytes 1–4 are no frame kind, so a header a dead host left half written
/// and the magic completed is refused too; either way the agent then scans for the magic.
pub const TAKEOVER_MAGIC: [u8; 16] = *b"\xffSBX-takeover-v3";

/// Bytes of the random session token that follows [`TAKEOVER_MAGIC`].
pub const TOKEN_LEN: usize = 16;

/// Bytes of the takeover preamble (magic and token).
pub const PREAMBLE_LEN: usize = TAKEOVER_MAGIC.len() + TOKEN_LEN;

/// What a host sends before repeating its preamble when the first got no answer: a dead
/// host may have left a frame half written, whose announced body (at most
/// [`MAX_FRAME_LEN`] bytes) swallowed the first preamble. This many filler bytes complete
/// any such frame; the filler itself is no valid header (0xFF), so the agent then scans
/// for the repeated preamble.
pub const TAKEOVER_PAD_LEN: usize = MAX_FRAME_LEN as usize + HEADER_LEN;

/// The filler byte of [`TAKEOVER_PAD_LEN`].
pub const TAKEOVER_PAD_BYTE: u8 = 0xff;

/// The preamble a host sends for the session `token`.
pub fn takeover_preamble(token: &[u8; TOKEN_LEN]) -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[..TAKEOVER_MAGIC.len()].copy_from_slice(&TAKEOVER_MAGIC);
    p[TAKEOVER_MAGIC.len()..].copy_from_slice(token);
    p
}

/// Where `needle` first occurs in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The first version whose deadline can move and that enforces an idle limit.
pub const LIFETIME_VERSION: u32 = 3;

/// The agent's exit status when the idle limit ended the sandbox (at its deadline it exits
/// with 0). As PID 1 its status is the container's, so the host tells from the engine's
/// record alone, even after the process that created the sandbox is gone, that the
/// sandbox ended for being idle and is to be removed rather than kept stopped for a
/// `start`. Code inside cannot set it: PID 1 cannot be signalled or traced from inside,
/// and a forged one would only remove the forger's own sandbox.
pub const IDLE_EXIT_STATUS: i32 = 86;

/// The first version that carries processes over a takeover ([`Request::Keep`]).
pub const FORK_VERSION: u32 = 4;

/// The first version with the ssh-agent relay ([`Request::SshAgentListen`]).
pub const SSH_AGENT_VERSION: u32 = 5;

/// Largest ssh-agent message (the bytes after its own 4-byte length) the relay carries, in
/// either direction. Real requests are a few kilobytes (a signature over a session hash,
/// a commit); a length above this is refused before a byte of its body is read.
pub const SSH_AGENT_MAX_MESSAGE: usize = 256 * 1024;

/// The first version with TCP forwarding ([`Request::TcpListen`]).
pub const TCP_FORWARD_VERSION: u32 = 6;

/// Live connections per forwarded port; further ones are closed by the agent as soon as
/// they are accepted (and by the host, should an agent announce more).
pub const TCP_MAX_CONNECTIONS: usize = 16;

/// Flow-control window of one forwarded connection, per direction: the bytes a sender may
/// have sent that the receiver has not yet handed on (to the socket inside, or to the
/// reader on the host). All connections of a port together, with their frame overhead,
/// stay below one request's [`WINDOW`], so the host never buffers more than that for a
/// port whatever the code inside does.
pub const TCP_WINDOW: u32 = 48 * 1024;

/// Largest payload of one [`TcpOp::Data`] frame.
pub const TCP_CHUNK: usize = 16 * 1024;

/// What a [`FrameKind::Tcp`] frame says about its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TcpOp {
    /// Agent → host: a connection was accepted (no payload).
    Open = 1,
    /// Either way: bytes of the stream (1..=[`TCP_CHUNK`]), within the receiver's credit.
    Data = 2,
    /// Either way: the sender will send no more bytes (a half-close: the other direction
    /// goes on).
    Eof = 3,
    /// Agent → host: the connection is gone in both directions (reset, or the socket
    /// broke). Host → agent: the host is done with it (dropped): what it sent still
    /// reaches the socket, then its write side is shut, and nothing more is read. Host →
    /// agent under connection 0: close the listening port and every connection on it.
    Close = 4,
    /// Either way: the payload is a big-endian `u32` of bytes the receiver handed on, which
    /// the sender may send again.
    Credit = 5,
}

impl TcpOp {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Open,
            2 => Self::Data,
            3 => Self::Eof,
            4 => Self::Close,
            5 => Self::Credit,
            _ => return None,
        })
    }
}

/// The body of a [`FrameKind::Tcp`] frame: `conn: u32` (big endian), the op, the payload.
pub fn tcp_body(conn: u32, op: TcpOp, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(5 + payload.len());
    body.extend_from_slice(&conn.to_be_bytes());
    body.push(op as u8);
    body.extend_from_slice(payload);
    body
}

/// Connection, op and payload of a [`FrameKind::Tcp`] body; `None` when malformed (too
/// short, an unknown op, a data payload empty or above [`TCP_CHUNK`], a credit that is not
/// four bytes, or a payload on an op that has none).
pub fn parse_tcp(body: &[u8]) -> Option<(u32, TcpOp, &[u8])> {
    let (head, payload) = body.split_at_checked(5)?;
    let conn = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let op = TcpOp::from_u8(head[4])?;
    let ok = match op {
        TcpOp::Data => (1..=TCP_CHUNK).contains(&payload.len()),
        TcpOp::Credit => payload.len() == 4,
        TcpOp::Open | TcpOp::Eof | TcpOp::Close => payload.is_empty(),
    };
    ok.then_some((conn, op, payload))
}

/// Bytes of the fixed header: length (4), kind (1), id (4).
pub const HEADER_LEN: usize = 9;

/// Largest `len` accepted (kind + id + body): 1 MiB of body plus the 5 header bytes it
/// counts. Control messages and data chunks are far smaller; anything above is an attack
/// or a desynchronised stream.
pub const MAX_FRAME_LEN: u32 = (1 << 20) + 5;

/// Largest body a sender puts in one data frame.
pub const DATA_CHUNK: usize = 64 * 1024;

/// Flow-control window per request and direction, in bytes.
pub const WINDOW: u32 = 1 << 20;

/// Request id the agent uses for messages about itself (the deadline notice).
pub const AGENT_ID: u32 = 0;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A JSON [`Request`] or [`Reply`].
    Control = 1,
    /// Bytes for a spawned process's stdin (host → agent).
    Stdin = 2,
    /// Bytes a process wrote to stdout (agent → host).
    Stdout = 3,
    /// Bytes a process wrote to stderr (agent → host).
    Stderr = 4,
    /// File content: a read's chunks (agent → host) or a write's (host → agent).
    FileData = 5,
    /// Flow-control credit: the body is a big-endian `u32` byte count.
    Ack = 6,
    /// One ssh-agent message of a connection to the relay socket opened by
    /// [`Request::SshAgentListen`] (under that request's id): `conn: u32` (big endian,
    /// chosen by the agent per accepted connection), then the message without its length
    /// prefix (at most [`SSH_AGENT_MAX_MESSAGE`] bytes). Agent → host: a request read from
    /// the connection; host → agent: the answer written back to it. Version 5.
    SshAgent = 7,
    /// One event of a connection to a port opened by [`Request::TcpListen`] (under that
    /// request's id): see [`tcp_body`] and [`TcpOp`]. Version 6.
    Tcp = 8,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Control,
            2 => Self::Stdin,
            3 => Self::Stdout,
            4 => Self::Stderr,
            5 => Self::FileData,
            6 => Self::Ack,
            7 => Self::SshAgent,
            8 => Self::Tcp,
            _ => return None,
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What the body is.
    pub kind: FrameKind,
    /// The request this frame belongs to.
    pub id: u32,
    /// The body.
    pub body: Vec<u8>,
}

impl Frame {
    /// A control frame carrying `msg` as JSON.
    pub fn control<T: Serialize>(id: u32, msg: &T) -> Self {
        // Serialising our own enums to a Vec cannot fail (no maps with non-string keys).
        let body = serde_json::to_vec(msg).unwrap_or_default();
        Frame {
            kind: FrameKind::Control,
            id,
            body,
        }
    }

    /// A credit frame returning `bytes` of window.
    pub fn ack(id: u32, bytes: u32) -> Self {
        Frame {
            kind: FrameKind::Ack,
            id,
            body: bytes.to_be_bytes().to_vec(),
        }
    }

    /// The credit of an [`FrameKind::Ack`] frame, if well formed.
    pub fn ack_bytes(&self) -> Option<u32> {
        let b: [u8; 4] = self.body.as_slice().try_into().ok()?;
        Some(u32::from_be_bytes(b))
    }

    /// Parses the body of a control frame.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, FrameError> {
        serde_json::from_slice(&self.body).map_err(|e| FrameError::BadControl(e.to_string()))
    }

    /// The encoded frame. Fails only when the body exceeds the cap.
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        let len = frame_len(self.body.len())?;
        let mut out = Vec::with_capacity(HEADER_LEN + self.body.len());
        out.extend_from_slice(&len.to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.body);
        Ok(out)
    }
}

fn frame_len(body: usize) -> Result<u32, FrameError> {
    u32::try_from(body)
        .ok()
        .and_then(|b| b.checked_add(5))
        .filter(|l| *l <= MAX_FRAME_LEN)
        .ok_or(FrameError::TooLarge(body as u64))
}

/// A malformed or hostile frame. Any of these desynchronises the stream: the connection
/// must be dropped, never resynchronised by guessing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// `len` above [`MAX_FRAME_LEN`] (or a body too large to send).
    TooLarge(u64),
    /// `len` below the 5 bytes of kind and id.
    TooShort(u32),
    /// Unknown frame kind.
    UnknownKind(u8),
    /// The stream ended inside a frame.
    Truncated,
    /// A control body that is not a valid message.
    BadControl(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge(n) => {
                write!(f, "frame of {n} bytes exceeds the {MAX_FRAME_LEN}-byte cap")
            }
            FrameError::TooShort(n) => write!(f, "frame length {n} is shorter than its header"),
            FrameError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::Truncated => f.write_str("stream ended inside a frame"),
            FrameError::BadControl(e) => write!(f, "malformed control message: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Validates a header; returns the kind, id and body length to read next.
pub fn parse_header(h: &[u8; HEADER_LEN]) -> Result<(FrameKind, u32, usize), FrameError> {
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    if len > MAX_FRAME_LEN {
        return Err(FrameError::TooLarge(u64::from(len)));
    }
    if len < 5 {
        return Err(FrameError::TooShort(len));
    }
    let kind = FrameKind::from_u8(h[4]).ok_or(FrameError::UnknownKind(h[4]))?;
    let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]);
    Ok((kind, id, (len - 5) as usize))
}

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes are needed,
/// otherwise the frame and the bytes it used. Never allocates beyond the cap.
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(h) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let mut header = [0u8; HEADER_LEN];
    header.copy_from_slice(h);
    let (kind, id, body_len) = parse_header(&header)?;
    let Some(body) = buf.get(HEADER_LEN..HEADER_LEN + body_len) else {
        return Ok(None);
    };
    Ok(Some((
        Frame {
            kind,
            id,
            body: body.to_vec(),
        },
        HEADER_LEN + body_len,
    )))
}

/// Reads one frame (blocking). `Ok(None)` on a clean end of stream between frames.
pub fn read_frame<R: Read>(r: &mut R) -> io::Result<Option<Frame>> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(invalid(FrameError::Truncated)),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let (kind, id, body_len) = parse_header(&header).map_err(invalid)?;
    let mut body = vec![0u8; body_len];
    r.read_exact(&mut body).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            invalid(FrameError::Truncated)
        } else {
            e
        }
    })?;
    Ok(Some(Frame { kind, id, body }))
}

/// Writes one frame (blocking); the caller flushes.
pub fn write_frame<W: Write>(w: &mut W, frame: &Frame) -> io::Result<()> {
    w.write_all(&frame.encode().map_err(invalid)?)
}

fn invalid(e: FrameError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Host → agent control messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// First message: the versions the host speaks. The agent answers
    /// [`Reply::Hello`] with the highest common one, or [`Reply::Refused`].
    Hello {
        /// Versions the host speaks.
        versions: Vec<u32>,
    },
    /// Liveness check, answered by [`Reply::Pong`].
    Ping,
    /// Start a process; events follow on the same id.
    Spawn(SpawnSpec),
    /// Close the stdin of the process started under this id (on a pseudo-terminal: send
    /// end-of-file, `^D`, which a reading program in canonical mode takes as the end).
    CloseStdin,
    /// Set the window size of the pseudo-terminal of the process started under this id
    /// (the process gets `SIGWINCH`). Version 2.
    Resize(WindowSize),
    /// Send `signal` to the process started under this id (its root only).
    Signal {
        /// Signal number.
        signal: i32,
    },
    /// Kill everything the spawn under this id started, including processes that left its
    /// process group or session; answered by [`Reply::Killed`]. Under the id of a file
    /// read, cancels the read.
    Kill,
    /// Stream a file's content as [`FrameKind::FileData`] frames, then [`Reply::Done`].
    ReadFile {
        /// Sandbox path.
        path: String,
    },
    /// Open a file for writing (created or truncated); [`FrameKind::FileData`] frames
    /// follow, then [`Request::WriteEnd`]; answered by [`Reply::Done`].
    WriteFile {
        /// Sandbox path.
        path: String,
        /// Permission bits for a created file (default 0644).
        mode: Option<u32>,
    },
    /// The last frame of a write.
    WriteEnd,
    /// Metadata of a path, answered by [`Reply::Stat`].
    Stat {
        /// Sandbox path.
        path: String,
    },
    /// Entries of a directory, answered by [`Reply::List`].
    List {
        /// Sandbox path.
        path: String,
    },
    /// Create a directory.
    Mkdir {
        /// Sandbox path.
        path: String,
        /// Create missing parents too (and accept an existing directory).
        parents: bool,
    },
    /// Remove a file or directory.
    Remove {
        /// Sandbox path.
        path: String,
        /// Remove a directory with its content.
        recursive: bool,
    },
    /// Move the sandbox's deadline to `deadline_unix` (never past the maximum the agent
    /// was started with); answered by [`Reply::DeadlineSet`], or an error of kind
    /// [`ErrorKind::Limit`] past the maximum. Version 3.
    SetDeadline {
        /// The new deadline, Unix seconds.
        deadline_unix: u64,
    },
    /// Kill every process below the agent, whichever spawn started it; answered by
    /// [`Reply::Killed`] with how many were sent SIGKILL. Version 4.
    ResetProcesses,
    /// Carry the processes started under `ids` in this session over the next takeover:
    /// instead of being detached, they join the new session under the same ids, with
    /// their input open and a fresh output window, so the new host can adopt them (the
    /// host of a fork restored from a checkpoint taken after this request, or of the
    /// original restored from it). A later `keep` replaces the list; ids of no live
    /// process are ignored. Answered by [`Reply::Kept`]. Version 4.
    Keep {
        /// Request ids of processes of this session.
        ids: Vec<u32>,
    },
    /// Listen on a unix socket at `path` (its directory created) that speaks the
    /// ssh-agent protocol to programs in the sandbox: each message read from a connection
    /// goes to the host as a [`FrameKind::SshAgent`] frame under this request's id, and
    /// the host's answer goes back to that connection. The agent frames messages only
    /// (a length above [`SSH_AGENT_MAX_MESSAGE`] closes the connection unread); what a
    /// message may ask is the host's to decide. Answered by [`Reply::Done`] once the
    /// socket listens. The socket is removed when this session ends (a takeover).
    /// Version 5.
    SshAgentListen {
        /// Sandbox path of the socket.
        path: String,
    },
    /// Listen on `127.0.0.1:port` inside the sandbox (0: a free port the kernel picks) and
    /// relay every accepted connection to the host as a byte stream: [`FrameKind::Tcp`]
    /// frames under this request's id, one connection number per accepted connection,
    /// flow-controlled per connection by [`TCP_WINDOW`] credit in each direction. At most
    /// [`TCP_MAX_CONNECTIONS`] live connections (more are closed at once). Answered by
    /// [`Reply::Listening`] once the port listens; the port closes when the host sends
    /// [`TcpOp::Close`] for connection 0, or this session ends (a takeover). Version 6.
    TcpListen {
        /// Loopback port inside the sandbox; 0 for any free one.
        port: u16,
    },
}

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SpawnSpec {
    /// Program and arguments; never run through a shell.
    pub argv: Vec<String>,
    /// Variables added to (or overriding) the agent's environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory; the agent's when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Give the process a stdin pipe fed by [`FrameKind::Stdin`] frames (else /dev/null).
    #[serde(default)]
    pub stdin: bool,
    /// Run the process on a new pseudo-terminal of this size, as the session leader with
    /// the terminal as its controlling tty and as stdin, stdout and stderr: its output
    /// (both streams, merged by the terminal) arrives as [`FrameKind::Stdout`], its input
    /// is [`FrameKind::Stdin`] (whatever `stdin` says). Version 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<WindowSize>,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// Agent → host control messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Reply {
    /// The negotiated version.
    Hello {
        /// Version both sides now speak.
        version: u32,
        /// The agent's build (crate version).
        agent: String,
    },
    /// No common version: the host must fall back (to the engine's exec path).
    Refused {
        /// Versions the agent speaks.
        supported: Vec<u32>,
    },
    /// Answer to [`Request::Ping`].
    Pong,
    /// The process started.
    Spawned {
        /// Its pid inside the sandbox.
        pid: u32,
    },
    /// The process ended; all its output was sent before this.
    Exit {
        /// Exit code when it exited.
        code: Option<i32>,
        /// Signal number when a signal ended it.
        signal: Option<i32>,
    },
    /// Answer to [`Request::Kill`].
    Killed {
        /// How many processes were sent SIGKILL.
        processes: u32,
    },
    /// Answer to [`Request::Stat`].
    Stat(FileStat),
    /// Answer to [`Request::List`].
    List {
        /// The entries (without `.` and `..`).
        entries: Vec<FileStat>,
    },
    /// A file operation completed.
    Done,
    /// The sandbox deadline passed (or, version 3, its idle limit): the agent kills
    /// everything and exits.
    Deadline,
    /// The request failed.
    Error {
        /// What kind of failure.
        kind: ErrorKind,
        /// Human-readable detail (an OS error text, never file content).
        message: String,
    },
    /// Answer to [`Request::SetDeadline`]: the deadline now in force. Version 3.
    DeadlineSet {
        /// The deadline, Unix seconds.
        deadline_unix: u64,
    },
    /// Answer to [`Request::Keep`]: how many of the ids name a live process. Version 4.
    Kept {
        /// Live processes that the next takeover carries over.
        processes: u32,
    },
    /// Answer to [`Request::TcpListen`]: the port now listening on `127.0.0.1` inside the
    /// sandbox. Version 6.
    Listening {
        /// The port.
        port: u16,
    },
}

/// Failure kinds, stable across versions (unknown ones read as [`ErrorKind::Other`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The path does not exist.
    NotFound,
    /// A file operation was given a directory.
    IsADirectory,
    /// A path component is not a directory.
    NotADirectory,
    /// Permission denied.
    PermissionDenied,
    /// The path exists.
    AlreadyExists,
    /// A directory is not empty.
    NotEmpty,
    /// The request is malformed or not allowed in this state.
    InvalidRequest,
    /// A limit of the agent was reached.
    Limit,
    /// No process or thread could be started: the sandbox's pids limit is exhausted.
    /// Version 4 (an older host reads it as [`ErrorKind::Other`]).
    Pids,
    /// Anything else.
    #[serde(other)]
    Other,
}

impl ErrorKind {
    /// The kind of an I/O error.
    pub fn of(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound => Self::NotFound,
            io::ErrorKind::PermissionDenied => Self::PermissionDenied,
            io::ErrorKind::AlreadyExists => Self::AlreadyExists,
            io::ErrorKind::IsADirectory => Self::IsADirectory,
            io::ErrorKind::NotADirectory => Self::NotADirectory,
            io::ErrorKind::DirectoryNotEmpty => Self::NotEmpty,
            _ => Self::Other,
        }
    }
}

/// Metadata of one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// Last path component.
    pub name: String,
    /// Full sandbox path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// A directory.
    pub is_dir: bool,
    /// A symbolic link (not followed).
    pub is_symlink: bool,
    /// Permission and type bits (`st_mode`).
    pub mode: u32,
    /// Modification time, seconds since the Unix epoch.
    pub modified: i64,
}

/// The highest version in both lists, if any.
pub fn negotiate(ours: &[u32], theirs: &[u32]) -> Option<u32> {
    ours.iter().filter(|v| theirs.contains(v)).max().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn forged_length_is_refused_before_buffering() {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        h[4] = 1;
        assert_eq!(decode(&h), Err(FrameError::TooLarge(u64::from(u32::MAX))));
        let mut r = io::Cursor::new(h.to_vec());
        assert_eq!(
            read_frame(&mut r).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn length_shorter_than_header_is_refused() {
        let h = [0, 0, 0, 4, 1, 0, 0, 0, 0];
        assert_eq!(decode(&h), Err(FrameError::TooShort(4)));
    }

    #[test]
    fn unknown_kind_is_refused() {
        let h = [0, 0, 0, 5, 99, 0, 0, 0, 0];
        assert_eq!(decode(&h), Err(FrameError::UnknownKind(99)));
    }

    #[test]
    fn truncated_frame_is_an_error_not_a_hang() {
        let f = Frame::control(3, &Request::Ping).encode().unwrap();
        for cut in 1..f.len() {
            let mut r = io::Cursor::new(f[..cut].to_vec());
            assert!(read_frame(&mut r).is_err(), "cut at {cut}");
            assert_eq!(decode(&f[..cut]), Ok(None));
        }
        let mut r = io::Cursor::new(Vec::new());
        assert!(read_frame(&mut r).unwrap().is_none());
    }

    #[test]
    fn oversized_body_cannot_be_sent() {
        let f = Frame {
            kind: FrameKind::Stdout,
            id: 1,
            body: vec![0; MAX_FRAME_LEN as usize],
        };
        assert!(matches!(f.encode(), Err(FrameError::TooLarge(_))));
    }

    #[test]
    fn unknown_error_kind_reads_as_other() {
        let r: Reply =
            serde_json::from_str(r#"{"op":"error","kind":"quota","message":"x"}"#).unwrap();
        assert_eq!(
            r,
            Reply::Error {
                kind: ErrorKind::Other,
                message: "x".into()
            }
        );
    }

    #[test]
    fn tcp_bodies_are_checked() {
        let b = tcp_body(7, TcpOp::Data, b"abc");
        assert_eq!(parse_tcp(&b), Some((7, TcpOp::Data, &b"abc"[..])));
        assert_eq!(
            parse_tcp(&tcp_body(7, TcpOp::Data, b"")),
            None,
            "empty data"
        );
        let big = vec![0u8; TCP_CHUNK + 1];
        assert_eq!(
            parse_tcp(&tcp_body(7, TcpOp::Data, &big)),
            None,
            "over a chunk"
        );
        assert_eq!(parse_tcp(&tcp_body(7, TcpOp::Credit, &[0, 0, 1])), None);
        assert_eq!(
            parse_tcp(&tcp_body(1, TcpOp::Credit, &9u32.to_be_bytes())),
            Some((1, TcpOp::Credit, &9u32.to_be_bytes()[..]))
        );
        assert_eq!(parse_tcp(&tcp_body(1, TcpOp::Eof, b"x")), None);
        assert_eq!(parse_tcp(&[0, 0, 0, 1, 9]), None, "unknown op");
        assert_eq!(parse_tcp(&[0, 0, 0, 1]), None, "no op");
        // Every connection's window with its frames' overhead fits one request's window.
        let frames = TCP_WINDOW as usize / TCP_CHUNK + 1;
        let per_conn = TCP_WINDOW as usize + frames * (HEADER_LEN + 5) + 4 * (HEADER_LEN + 5);
        assert!(TCP_MAX_CONNECTIONS * per_conn < WINDOW as usize);
    }

    #[test]
    fn negotiation_picks_highest_common_or_none() {
        assert_eq!(negotiate(&[1, 2, 3], &[2, 3, 7]), Some(3));
        assert_eq!(negotiate(&[1], &[2]), None);
    }

    fn kind() -> impl Strategy<Value = FrameKind> {
        prop_oneof![
            Just(FrameKind::Control),
            Just(FrameKind::Stdin),
            Just(FrameKind::Stdout),
            Just(FrameKind::Stderr),
            Just(FrameKind::FileData),
            Just(FrameKind::Ack),
            Just(FrameKind::SshAgent),
            Just(FrameKind::Tcp),
        ]
    }

    proptest! {
        #[test]
        fn frames_round_trip(k in kind(), id in any::<u32>(), body in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let f = Frame { kind: k, id, body };
            let bytes = f.encode().unwrap();
            let (g, used) = decode(&bytes).unwrap().unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(&g, &f);
            let mut r = io::Cursor::new(bytes);
            prop_assert_eq!(read_frame(&mut r).unwrap().unwrap(), f);
        }

        #[test]
        fn garbage_never_panics_and_never_yields_oversized_frames(buf in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(Some((f, used))) = decode(&buf) {
                prop_assert!(used <= buf.len());
                prop_assert!(f.body.len() + 5 <= MAX_FRAME_LEN as usize);
            }
            let mut r = io::Cursor::new(buf);
            while let Ok(Some(_)) = read_frame(&mut r) {}
        }

        #[test]
        fn any_header_length_is_checked(len in any::<u32>(), k in 0u8..10) {
            let mut h = [0u8; HEADER_LEN];
            h[..4].copy_from_slice(&len.to_be_bytes());
            h[4] = k;
            match parse_header(&h) {
                Ok((_, _, body)) => prop_assert!((5..=MAX_FRAME_LEN).contains(&len) && body == (len - 5) as usize),
                Err(_) => prop_assert!(!(5..=MAX_FRAME_LEN).contains(&len) || FrameKind::from_u8(k).is_none()),
            }
        }

        #[test]
        fn garbage_control_bodies_are_errors(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let f = Frame { kind: FrameKind::Control, id: 1, body };
            let _ = f.parse::<Request>();
            let _ = f.parse::<Reply>();
        }
    }
}
