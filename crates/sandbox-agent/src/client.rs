//! The host side: an async client over any `AsyncRead` + `AsyncWrite` pair (the engine's
//! attach stream of the agent).
//!
//! One reader task routes frames to requests by id, one writer task serialises frames.
//! Memory is bounded everywhere: frame lengths are checked against the cap before a body
//! byte is read, each request receives at most one flow-control window of data before its
//! consumer acknowledges it (an agent that overruns it is treated as dead), and requests
//! in flight are capped. When the stream ends or breaks, every pending and future call
//! fails with `SandboxGone` at once — never a hang.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sandbox_core::SandboxError;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc, watch};

use crate::protocol::{
    self, AGENT_ID, DATA_CHUNK, ErrorKind, FORK_VERSION, FileStat, Frame, FrameKind, HEADER_LEN,
    LIFETIME_VERSION, PREAMBLE_LEN, PTY_VERSION, RESET_VERSION, Reply, Request,
    SSH_AGENT_MAX_MESSAGE, SSH_AGENT_VERSION, SUPPORTED_VERSIONS, SpawnSpec, TAKEOVER_MAGIC,
    TAKEOVER_PAD_BYTE, TAKEOVER_PAD_LEN, TOKEN_LEN, WINDOW, WindowSize,
};

mod tcp;

pub use tcp::{TcpConn, TcpRelay};

type Result<T> = std::result::Result<T, SandboxError>;

/// Backend name used in errors.
const BACKEND: &str = "sandbox-agent";

/// How long a takeover waits for the agent's answer to its first preamble before sending
/// the filler and the preamble again (the first may have been swallowed by a frame a dead
/// host left half written). The agent answers in well under a millisecond; a repeat that
/// was not needed costs one megabyte on the stream and nothing else.
const TAKEOVER_PROBE: Duration = Duration::from_millis(500);

/// Knobs of a client.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Bound on the hello exchange.
    pub hello_timeout: Duration,
    /// Bound on single-reply calls (stat, ls, mkdir, remove, ping, kill).
    pub call_timeout: Duration,
    /// Most requests in flight at once.
    pub max_in_flight: usize,
    /// Protocol versions offered in the hello (default: all this build speaks). A test
    /// offers fewer to prove how an older agent is treated.
    pub versions: Vec<u32>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            hello_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
            max_in_flight: 1024,
            versions: SUPPORTED_VERSIONS.to_vec(),
        }
    }
}

enum Incoming {
    Reply(Reply),
    Data(FrameKind, Bytes),
}

struct Route {
    tx: mpsc::UnboundedSender<Incoming>,
    /// Stdin credit of a spawn: acks from the agent refill it, the exit closes it.
    credit: Option<Arc<Semaphore>>,
    /// Data bytes delivered and not yet acknowledged by the consumer.
    unacked: Arc<AtomicU32>,
    /// Control replies delivered and not yet taken by the consumer.
    replies: Arc<AtomicU32>,
}

/// Most control replies one request may have waiting for its consumer. A request gets a
/// handful (spawned, killed, exit); frames written into the channel from inside the
/// sandbox could otherwise pile up without bound behind a consumer that is not reading.
const MAX_BUFFERED_REPLIES: u32 = 64;

#[derive(Default)]
struct Routes {
    map: HashMap<u32, Route>,
    /// Set once the channel is dead; no route is added after.
    dead: bool,
}

struct Shared {
    routes: Mutex<Routes>,
    out: mpsc::Sender<Frame>,
    next_id: AtomicU32,
    sandbox: String,
    in_flight: Arc<Semaphore>,
    opts: ClientOptions,
    /// Flips to true when the agent is gone (stream ended, broke, or deadline passed).
    gone: watch::Sender<bool>,
    /// Set when another host took the agent over: the sandbox lives on, this session
    /// ended.
    superseded: Arc<AtomicBool>,
}

impl Shared {
    /// The error of every call once the channel is dead.
    fn ended(&self) -> SandboxError {
        if self.superseded.load(Ordering::SeqCst) {
            SandboxError::connect(
                self.sandbox.clone(),
                "another handle took this sandbox's agent over (a later `connect` to it, \
                 e.g. `sandbox exec`); this handle's agent session ended with the \
                 processes it was reading — connect again to use the sandbox",
            )
        } else {
            SandboxError::gone(self.sandbox.clone())
        }
    }
}

struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// A connected agent. Cheap to clone; the I/O tasks end when the last clone is dropped.
#[derive(Clone)]
pub struct AgentClient {
    shared: Arc<Shared>,
    version: u32,
    _tasks: Arc<Tasks>,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("sandbox", &self.shared.sandbox)
            .field("version", &self.version)
            .finish()
    }
}

impl AgentClient {
    /// Starts the I/O tasks on `reader`/`writer` and negotiates the version. `sandbox` is
    /// the id named by `SandboxGone`. A refused version is a typed error the caller turns
    /// into a fallback to the engine's exec path. For an agent that has served no host
    /// yet (a new sandbox); [`Self::take_over`] starts a session on one that may have.
    pub async fn connect<R, W>(
        reader: R,
        writer: W,
        sandbox: impl Into<String>,
        opts: ClientOptions,
    ) -> Result<Self>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        Self::start(reader, writer, sandbox.into(), opts, None).await
    }

    /// Starts a new host session on an agent that may be serving, or have served, another
    /// host (protocol version 3; the caller must know the agent speaks it: an older agent
    /// ends the sandbox on the preamble). Sends the takeover preamble with a fresh random
    /// token and the hello, and reads nothing of the agent's output before the agent's
    /// answering marker (output of the old session, or the tail of a frame it was
    /// writing, is skipped). When the first preamble gets no answer within a short probe,
    /// a host that died mid-frame may have left a frame whose body swallowed it: the
    /// filler that completes any frame goes out, then the preamble again. Request ids of
    /// the new session start at a random number, so a frame an old host had in flight
    /// when it was shut out names no request of this session. The whole exchange is
    /// bounded by `opts.hello_timeout`.
    pub async fn take_over<R, W>(
        reader: R,
        writer: W,
        sandbox: impl Into<String>,
        opts: ClientOptions,
    ) -> Result<Self>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        Self::start(reader, writer, sandbox.into(), opts, Some(random_token())).await
    }

    async fn start<R, W>(
        reader: R,
        mut writer: W,
        sandbox: String,
        opts: ClientOptions,
        token: Option<[u8; TOKEN_LEN]>,
    ) -> Result<Self>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out_tx, out_rx) = mpsc::channel(64);
        let (gone, _) = watch::channel(false);
        let first_id = match token {
            Some(t) => u32::from_be_bytes([t[0], t[1], t[2], t[3]]).max(1),
            None => 1,
        };
        let shared = Arc::new(Shared {
            routes: Mutex::new(Routes::default()),
            out: out_tx,
            next_id: AtomicU32::new(first_id),
            sandbox,
            in_flight: Arc::new(Semaphore::new(opts.max_in_flight)),
            opts,
            gone,
            superseded: Arc::new(AtomicBool::new(false)),
        });
        let mut tasks = Tasks(vec![tokio::spawn(read_loop(reader, shared.clone(), token))]);
        let offered = shared.opts.versions.clone();
        let deadline = tokio::time::Instant::now() + shared.opts.hello_timeout;
        let reply = hello(&shared, &mut writer, &offered, token, deadline).await?;
        tasks
            .0
            .push(tokio::spawn(write_loop(writer, out_rx, shared.clone())));
        let client = AgentClient {
            shared,
            version: 0,
            _tasks: Arc::new(tasks),
        };
        match reply {
            Reply::Hello { version, .. } if offered.contains(&version) => {
                Ok(AgentClient { version, ..client })
            }
            Reply::Refused { supported } => Err(SandboxError::engine(
                BACKEND,
                format!("agent speaks protocol versions {supported:?}, this library {offered:?}"),
            )),
            other => Err(unexpected(&other)),
        }
    }

    /// The negotiated protocol version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Whether the agent is known to be gone.
    pub fn is_gone(&self) -> bool {
        *self.shared.gone.borrow()
    }

    /// A future that completes once this session has ended: with `true` when another host
    /// took the agent over (the sandbox lives on), `false` when the agent is gone or the
    /// session was dropped. It holds no part of the session, so it never keeps one open.
    pub fn ended(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        let mut gone = self.shared.gone.subscribe();
        let superseded = self.shared.superseded.clone();
        async move {
            // An error means every sender dropped: the session is over either way.
            let _ = gone.wait_for(|g| *g).await;
            superseded.load(Ordering::SeqCst)
        }
    }

    /// Whether this session ended because another host took the agent over (the sandbox
    /// lives on; a new session can take it back).
    pub fn is_superseded(&self) -> bool {
        self.shared.superseded.load(Ordering::SeqCst)
    }

    /// Round trip to the agent.
    pub async fn ping(&self) -> Result<Duration> {
        let t = Instant::now();
        match self.call(Request::Ping).await? {
            Reply::Pong => Ok(t.elapsed()),
            other => Err(unexpected(&other)),
        }
    }

    /// Starts a process. Its events arrive through the returned handle; dropping the
    /// handle before the exit kills everything it started.
    pub async fn spawn(&self, spec: SpawnSpec) -> Result<RemoteProcess> {
        if spec.pty.is_some() && self.version < PTY_VERSION {
            // An older agent would run it without a terminal: refused, never downgraded.
            return Err(SandboxError::unsupported(
                sandbox_core::Capability::PTY,
                BACKEND,
            ));
        }
        let credit =
            (spec.stdin || spec.pty.is_some()).then(|| Arc::new(Semaphore::new(WINDOW as usize)));
        let req = self
            .open(Frame::control(0, &Request::Spawn(spec)), credit.clone())
            .await?;
        let stdin = credit.map(|sem| StdinWriter {
            out: req.shared.out.clone(),
            id: req.id,
            sem,
            sandbox: req.shared.sandbox.clone(),
        });
        Ok(RemoteProcess {
            req,
            stdin,
            exited: None,
        })
    }

    /// Moves the sandbox's deadline to `deadline_unix` and returns the one now in force.
    /// An agent older than [`LIFETIME_VERSION`] cannot move it: `CapabilityNotSupported`
    /// (`EXTEND_LIFETIME`), nothing sent. Past the maximum the agent was started with:
    /// `ResourceLimitExceeded`.
    pub async fn set_deadline(&self, deadline_unix: u64) -> Result<u64> {
        if self.version < LIFETIME_VERSION {
            return Err(SandboxError::unsupported(
                sandbox_core::Capability::EXTEND_LIFETIME,
                BACKEND,
            ));
        }
        match self.call(Request::SetDeadline { deadline_unix }).await? {
            Reply::DeadlineSet { deadline_unix } => Ok(deadline_unix),
            Reply::Error {
                kind: ErrorKind::Limit,
                message,
            } => Err(SandboxError::resource_limit(
                format!("the sandbox's maximum lifetime ({message})"),
                Some("create the sandbox with a longer CreateOptions::max_lifetime".into()),
            )),
            other => Err(unexpected(&other)),
        }
    }

    /// Kills every process in the sandbox but the agent and returns how many were sent
    /// SIGKILL. An agent older than [`RESET_VERSION`] cannot: `CapabilityNotSupported`
    /// (`RESET_PROCESSES`), nothing sent.
    pub async fn reset_processes(&self) -> Result<u32> {
        if self.version < RESET_VERSION {
            return Err(SandboxError::unsupported(
                sandbox_core::Capability::RESET_PROCESSES,
                BACKEND,
            ));
        }
        match self.call(Request::ResetProcesses).await? {
            Reply::Killed { processes } => Ok(processes),
            other => Err(unexpected(&other)),
        }
    }

    /// Asks the agent to carry the processes `ids` of this session over the next takeover
    /// (see [`Request::Keep`]); returns how many of them are alive. An agent older than
    /// [`FORK_VERSION`] cannot: `CapabilityNotSupported` (`SNAPSHOT_FORK`), nothing sent.
    pub async fn keep(&self, ids: Vec<u32>) -> Result<u32> {
        if self.version < FORK_VERSION {
            return Err(SandboxError::unsupported(
                sandbox_core::Capability::SNAPSHOT_FORK,
                BACKEND,
            ));
        }
        match self.call(Request::Keep { ids }).await? {
            Reply::Kept { processes } => Ok(processes),
            other => Err(unexpected(&other)),
        }
    }

    /// Opens the ssh-agent relay socket at `path` inside the sandbox
    /// ([`Request::SshAgentListen`]): the messages its connections send arrive through the
    /// returned relay, and the host answers each. An agent older than
    /// [`SSH_AGENT_VERSION`] has none: `CapabilityNotSupported` (`SSH_AGENT`), nothing
    /// sent.
    pub async fn ssh_agent_listen(&self, path: &str) -> Result<SshAgentRelay> {
        if self.version < SSH_AGENT_VERSION {
            return Err(SandboxError::unsupported(
                sandbox_core::Capability::SSH_AGENT,
                BACKEND,
            ));
        }
        let listen = Request::SshAgentListen { path: path.into() };
        let mut req = self.open(Frame::control(0, &listen), None).await?;
        let timeout = self.shared.opts.call_timeout;
        match req.reply_within(timeout).await? {
            Reply::Done => Ok(SshAgentRelay { req }),
            other => Err(reply_error(other, path)),
        }
    }

    /// Takes on a process the agent carried over into this session under `id` (kept by
    /// the session before this takeover): its events arrive through the returned handle
    /// as through a spawn's, and with `stdin` it takes input. Nothing is sent; a wrong id
    /// simply never answers. The id is kept out of this session's own requests.
    pub async fn adopt(&self, id: u32, stdin: bool) -> Result<RemoteProcess> {
        let credit = stdin.then(|| Arc::new(Semaphore::new(WINDOW as usize)));
        let req = register_id(&self.shared, id, credit.clone()).await?;
        let stdin = credit.map(|sem| StdinWriter {
            out: req.shared.out.clone(),
            id: req.id,
            sem,
            sandbox: req.shared.sandbox.clone(),
        });
        Ok(RemoteProcess {
            req,
            stdin,
            exited: None,
        })
    }

    /// Reads a whole file, refusing (with `ResourceLimitExceeded`) past `max_bytes`.
    pub async fn read_file(&self, path: &str, max_bytes: u64) -> Result<Bytes> {
        let mut r = self.read_file_stream(path).await?;
        let mut buf = Vec::new();
        while let Some(chunk) = r.next_chunk().await? {
            if (buf.len() + chunk.len()) as u64 > max_bytes {
                return Err(SandboxError::resource_limit(
                    format!("file read buffer ({max_bytes} bytes)"),
                    Some("read it in chunks with read_file_stream".into()),
                ));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.into())
    }

    /// Streams a file's content with bounded memory.
    pub async fn read_file_stream(&self, path: &str) -> Result<FileReader> {
        let req = Request::ReadFile { path: path.into() };
        let req = self.open(Frame::control(0, &req), None).await?;
        Ok(FileReader {
            req,
            path: path.into(),
            done: false,
        })
    }

    /// Writes `data` to `path` (replaced atomically at the end).
    pub async fn write_file(&self, path: &str, data: &[u8], mode: Option<u32>) -> Result<()> {
        let open = Request::WriteFile {
            path: path.into(),
            mode,
        };
        let mut req = self.open(Frame::control(0, &open), None).await?;
        for chunk in data.chunks(DATA_CHUNK) {
            req.send(FrameKind::FileData, chunk.to_vec()).await?;
        }
        req.send_control(&Request::WriteEnd).await?;
        let timeout = self.shared.opts.call_timeout;
        match req.reply_within(timeout).await? {
            Reply::Done => Ok(()),
            other => Err(reply_error(other, path)),
        }
    }

    /// Metadata of `path` (symlinks not followed).
    pub async fn stat(&self, path: &str) -> Result<FileStat> {
        match self.call(Request::Stat { path: path.into() }).await? {
            Reply::Stat(s) => Ok(s),
            other => Err(reply_error(other, path)),
        }
    }

    /// Entries of the directory `path`, sorted by name.
    pub async fn list(&self, path: &str) -> Result<Vec<FileStat>> {
        match self.call(Request::List { path: path.into() }).await? {
            Reply::List { entries } => Ok(entries),
            other => Err(reply_error(other, path)),
        }
    }

    /// Creates a directory (and its parents when `parents`).
    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let req = Request::Mkdir {
            path: path.into(),
            parents,
        };
        match self.call(req).await? {
            Reply::Done => Ok(()),
            other => Err(reply_error(other, path)),
        }
    }

    /// Removes a file or (with `recursive`) a directory tree.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        let req = Request::Remove {
            path: path.into(),
            recursive,
        };
        match self.call(req).await? {
            Reply::Done => Ok(()),
            other => Err(reply_error(other, path)),
        }
    }

    async fn call(&self, req: Request) -> Result<Reply> {
        self.call_within(req, self.shared.opts.call_timeout).await
    }

    async fn call_within(&self, req: Request, timeout: Duration) -> Result<Reply> {
        let mut r = self.open(Frame::control(0, &req), None).await?;
        r.reply_within(timeout).await
    }

    /// Registers a route for a new id, then sends `first` under it.
    async fn open(&self, mut first: Frame, credit: Option<Arc<Semaphore>>) -> Result<Pending> {
        let pending = register(&self.shared, credit).await?;
        first.id = pending.id;
        pending.send_frame(first).await?;
        Ok(pending)
    }
}

/// The hello of a new session, written straight to the stream before the writer task
/// starts (a takeover's preamble and filler are raw bytes, not frames), bounded by
/// `deadline`.
async fn hello<W: AsyncWrite + Unpin>(
    shared: &Arc<Shared>,
    w: &mut W,
    offered: &[u32],
    token: Option<[u8; TOKEN_LEN]>,
    deadline: tokio::time::Instant,
) -> Result<Reply> {
    let mut pending = register(shared, None).await?;
    let frame = Frame::control(
        pending.id,
        &Request::Hello {
            versions: offered.to_vec(),
        },
    )
    .encode()
    .map_err(|e| SandboxError::engine(BACKEND, e.to_string()))?;
    let mut first = Vec::with_capacity(PREAMBLE_LEN + frame.len());
    if let Some(t) = &token {
        first.extend_from_slice(&protocol::takeover_preamble(t));
    }
    first.extend_from_slice(&frame);
    write_by(w, &first, deadline, shared).await?;
    let Some(_) = token else {
        return pending.reply_until(deadline).await;
    };
    let probe = (tokio::time::Instant::now() + TAKEOVER_PROBE).min(deadline);
    match tokio::time::timeout_at(probe, pending.next_reply()).await {
        Ok(reply) => return reply,
        Err(_) if probe >= deadline => return pending.reply_until(deadline).await,
        Err(_) => {}
    }
    let mut again = vec![TAKEOVER_PAD_BYTE; TAKEOVER_PAD_LEN];
    again.extend_from_slice(&first);
    write_by(w, &again, deadline, shared).await?;
    pending.reply_until(deadline).await
}

async fn write_by<W: AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
    deadline: tokio::time::Instant,
    shared: &Shared,
) -> Result<()> {
    let write = async {
        w.write_all(bytes).await?;
        w.flush().await
    };
    match tokio::time::timeout_at(deadline, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(shared.ended()),
        Err(_) => Err(SandboxError::engine(
            BACKEND,
            "the agent did not take its hello in time",
        )),
    }
}

/// A fresh random session token. std's `RandomState` is keyed from the operating
/// system's random source once per thread and differs for every instance, so no two
/// tokens repeat and none can be guessed from inside a sandbox.
fn random_token() -> [u8; TOKEN_LEN] {
    use std::hash::{BuildHasher, Hasher};
    let mut token = [0u8; TOKEN_LEN];
    for (i, half) in token.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        half.copy_from_slice(&h.finish().to_be_bytes());
    }
    token
}

/// Registers a route for the given `id` (a process carried over from an earlier session)
/// without sending anything; refused when the id is this session's own or in use.
async fn register_id(
    shared: &Arc<Shared>,
    id: u32,
    credit: Option<Arc<Semaphore>>,
) -> Result<Pending> {
    let permit = shared
        .in_flight
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| shared.ended())?;
    let (tx, rx) = mpsc::unbounded_channel();
    let unacked = Arc::new(AtomicU32::new(0));
    let replies = Arc::new(AtomicU32::new(0));
    {
        let mut routes = shared.routes.lock().unwrap_or_else(|e| e.into_inner());
        if routes.dead {
            return Err(shared.ended());
        }
        if id == AGENT_ID || routes.map.contains_key(&id) {
            return Err(SandboxError::engine(
                BACKEND,
                format!("request id {id} is in use in this session"),
            ));
        }
        routes.map.insert(
            id,
            Route {
                tx,
                credit,
                unacked: unacked.clone(),
                replies: replies.clone(),
            },
        );
    }
    Ok(Pending {
        shared: shared.clone(),
        id,
        rx,
        unacked,
        replies,
        _permit: permit,
    })
}

/// Registers a route for a new id without sending anything.
async fn register(shared: &Arc<Shared>, credit: Option<Arc<Semaphore>>) -> Result<Pending> {
    let permit = shared
        .in_flight
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| shared.ended())?;
    let (tx, rx) = mpsc::unbounded_channel();
    let unacked = Arc::new(AtomicU32::new(0));
    let replies = Arc::new(AtomicU32::new(0));
    let id = {
        let mut routes = shared.routes.lock().unwrap_or_else(|e| e.into_inner());
        if routes.dead {
            return Err(shared.ended());
        }
        let mut id;
        loop {
            id = shared.next_id.fetch_add(1, Ordering::Relaxed);
            if id != AGENT_ID && !routes.map.contains_key(&id) {
                break;
            }
        }
        routes.map.insert(
            id,
            Route {
                tx,
                credit,
                unacked: unacked.clone(),
                replies: replies.clone(),
            },
        );
        id
    };
    Ok(Pending {
        shared: shared.clone(),
        id,
        rx,
        unacked,
        replies,
        _permit: permit,
    })
}

/// One request's route; unregistered on drop.
struct Pending {
    shared: Arc<Shared>,
    id: u32,
    rx: mpsc::UnboundedReceiver<Incoming>,
    unacked: Arc<AtomicU32>,
    replies: Arc<AtomicU32>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut routes = self.shared.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.map.remove(&self.id);
    }
}

impl Pending {
    fn gone(&self) -> SandboxError {
        self.shared.ended()
    }

    async fn send_frame(&self, frame: Frame) -> Result<()> {
        self.shared.out.send(frame).await.map_err(|_| self.gone())
    }

    async fn send(&self, kind: FrameKind, body: Vec<u8>) -> Result<()> {
        self.send_frame(Frame {
            kind,
            id: self.id,
            body,
        })
        .await
    }

    async fn send_control(&self, req: &Request) -> Result<()> {
        self.send_frame(Frame::control(self.id, req)).await
    }

    /// The next message; `SandboxGone` when the channel died.
    async fn next(&mut self) -> Result<Incoming> {
        let msg = self.rx.recv().await.ok_or_else(|| self.gone())?;
        if let Incoming::Reply(_) = &msg {
            let _ = self
                .replies
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
        if let Incoming::Data(_, b) = &msg {
            // Credit goes back as soon as the consumer takes the chunk: at most one window
            // per request is ever buffered here.
            let n = b.len() as u32;
            self.unacked.fetch_sub(
                n.min(self.unacked.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
            let _ = self
                .shared
                .out
                .try_send(Frame::ack(self.id, n))
                .or_else(|e| match e {
                    mpsc::error::TrySendError::Full(f) => {
                        let out = self.shared.out.clone();
                        tokio::spawn(async move { out.send(f).await });
                        Ok(())
                    }
                    mpsc::error::TrySendError::Closed(_) => Err(()),
                });
        }
        if let Incoming::Reply(Reply::Deadline) = msg {
            return Err(self.gone());
        }
        Ok(msg)
    }

    async fn reply_within(&mut self, timeout: Duration) -> Result<Reply> {
        self.reply_until(tokio::time::Instant::now() + timeout)
            .await
    }

    async fn reply_until(&mut self, deadline: tokio::time::Instant) -> Result<Reply> {
        let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
        tokio::time::timeout_at(deadline, self.next_reply())
            .await
            .unwrap_or_else(|_| {
                Err(SandboxError::engine(
                    BACKEND,
                    format!("no reply from the agent within {timeout:?}"),
                ))
            })
    }

    /// The next control reply, skipping data.
    async fn next_reply(&mut self) -> Result<Reply> {
        loop {
            if let Incoming::Reply(r) = self.next().await? {
                return Ok(r);
            }
        }
    }
}

/// The host end of the ssh-agent relay socket opened by [`AgentClient::ssh_agent_listen`]:
/// the messages connections in the sandbox send, each to be answered through
/// [`SshAgentAnswers`]. Whatever arrives here was written by code in the sandbox.
pub struct SshAgentRelay {
    req: Pending,
}

impl std::fmt::Debug for SshAgentRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshAgentRelay")
            .field("id", &self.req.id)
            .finish()
    }
}

/// One message from a connection to the relay socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshAgentMessage {
    /// The connection, as the agent numbers them; answers go back under it.
    pub conn: u32,
    /// The ssh-agent message without its length prefix: untrusted bytes, at most
    /// [`SSH_AGENT_MAX_MESSAGE`] long (longer ones are dropped here too).
    pub message: Bytes,
}

impl SshAgentRelay {
    /// The next message; `SandboxGone` (or the takeover's error) once the channel ended,
    /// after which no message comes.
    pub async fn next_message(&mut self) -> Result<SshAgentMessage> {
        loop {
            let Incoming::Data(FrameKind::SshAgent, body) = self.req.next().await? else {
                continue;
            };
            let Some(head) = body.get(..4) else {
                continue;
            };
            let conn = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            let message = body.slice(4..);
            if message.len() > SSH_AGENT_MAX_MESSAGE {
                // The agent never sends one; an answer would be refused by the agent too,
                // so the connection is left to its own end.
                continue;
            }
            return Ok(SshAgentMessage { conn, message });
        }
    }

    /// Where answers go; cheap to clone, usable while [`Self::next_message`] waits.
    pub fn answers(&self) -> SshAgentAnswers {
        SshAgentAnswers {
            out: self.req.shared.out.clone(),
            id: self.req.id,
            sandbox: self.req.shared.sandbox.clone(),
        }
    }
}

/// Sends answers to connections of an [`SshAgentRelay`].
#[derive(Clone)]
pub struct SshAgentAnswers {
    out: mpsc::Sender<Frame>,
    id: u32,
    sandbox: String,
}

impl std::fmt::Debug for SshAgentAnswers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshAgentAnswers")
            .field("id", &self.id)
            .finish()
    }
}

impl SshAgentAnswers {
    /// Answers connection `conn` with `message` (without its length prefix; empty, or
    /// longer than [`SSH_AGENT_MAX_MESSAGE`], is refused as an engine error: the caller
    /// builds answers and must keep them within the bound).
    pub async fn answer(&self, conn: u32, message: &[u8]) -> Result<()> {
        if message.is_empty() || message.len() > SSH_AGENT_MAX_MESSAGE {
            return Err(SandboxError::engine(
                BACKEND,
                format!(
                    "an ssh-agent answer of {} bytes is not within 1..={SSH_AGENT_MAX_MESSAGE}",
                    message.len()
                ),
            ));
        }
        let mut body = Vec::with_capacity(4 + message.len());
        body.extend_from_slice(&conn.to_be_bytes());
        body.extend_from_slice(message);
        let frame = Frame {
            kind: FrameKind::SshAgent,
            id: self.id,
            body,
        };
        self.out
            .send(frame)
            .await
            .map_err(|_| SandboxError::gone(self.sandbox.clone()))
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// Exit code when it exited.
    pub code: Option<i32>,
    /// Signal number when a signal ended it.
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// The shell convention: the code, or 128 + the signal.
    pub fn exit_code(&self) -> i64 {
        match (self.code, self.signal) {
            (Some(c), _) => i64::from(c),
            (None, Some(s)) => 128 + i64::from(s),
            (None, None) => -1,
        }
    }
}

/// What a process produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// A chunk of stdout.
    Stdout(Bytes),
    /// A chunk of stderr.
    Stderr(Bytes),
    /// The end; nothing follows.
    Exit(ExitStatus),
}

/// Buffered result of [`RemoteProcess::output`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// How it ended.
    pub status: ExitStatus,
    /// All of stdout.
    pub stdout: Bytes,
    /// All of stderr.
    pub stderr: Bytes,
}

/// A process started by the agent. Dropped before its exit, it kills everything it started.
pub struct RemoteProcess {
    req: Pending,
    stdin: Option<StdinWriter>,
    exited: Option<ExitStatus>,
}

impl std::fmt::Debug for RemoteProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteProcess")
            .field("id", &self.req.id)
            .field("exited", &self.exited)
            .finish()
    }
}

impl RemoteProcess {
    /// The request id the process runs under in its session (what [`AgentClient::keep`]
    /// names).
    pub fn id(&self) -> u32 {
        self.req.id
    }

    /// The next event; `Ok(None)` after the exit was returned.
    pub async fn next_event(&mut self) -> Result<Option<ProcessEvent>> {
        if self.exited.is_some() {
            return Ok(None);
        }
        loop {
            match self.req.next().await? {
                Incoming::Data(FrameKind::Stdout, b) => return Ok(Some(ProcessEvent::Stdout(b))),
                Incoming::Data(FrameKind::Stderr, b) => return Ok(Some(ProcessEvent::Stderr(b))),
                Incoming::Data(..) => {}
                Incoming::Reply(Reply::Exit { code, signal }) => {
                    let st = ExitStatus { code, signal };
                    self.exited = Some(st);
                    return Ok(Some(ProcessEvent::Exit(st)));
                }
                Incoming::Reply(Reply::Spawned { .. } | Reply::Killed { .. }) => {}
                Incoming::Reply(Reply::Error {
                    kind: ErrorKind::Limit,
                    message,
                }) => {
                    return Err(SandboxError::resource_limit(
                        format!("agent: {message}"),
                        None,
                    ));
                }
                Incoming::Reply(Reply::Error {
                    kind: ErrorKind::Pids,
                    message,
                }) => return Err(SandboxError::pids_exhausted(&message)),
                Incoming::Reply(Reply::Error { message, .. }) => {
                    return Err(SandboxError::engine(
                        BACKEND,
                        format!("spawn refused: {message}"),
                    ));
                }
                Incoming::Reply(other) => return Err(unexpected(&other)),
            }
        }
    }

    /// Collects all output, refusing (with `ResourceLimitExceeded`, after killing the
    /// process) once a stream passes `max_bytes`.
    pub async fn output(mut self, max_bytes: usize) -> Result<Output> {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while let Some(ev) = self.next_event().await? {
            let (buf, data, stream) = match ev {
                ProcessEvent::Stdout(b) => (&mut out, b, "stdout"),
                ProcessEvent::Stderr(b) => (&mut err, b, "stderr"),
                ProcessEvent::Exit(status) => {
                    return Ok(Output {
                        status,
                        stdout: out.into(),
                        stderr: err.into(),
                    });
                }
            };
            if buf.len() + data.len() > max_bytes {
                let _ = self.kill().await;
                return Err(SandboxError::resource_limit(
                    format!("{stream} buffer ({max_bytes} bytes)"),
                    Some("stream the output instead of buffering it".into()),
                ));
            }
            buf.extend_from_slice(&data);
        }
        Err(SandboxError::engine(
            BACKEND,
            "process ended without an exit status",
        ))
    }

    /// A handle feeding the process's stdin, usable while events are read; `None` when
    /// the spawn did not ask for stdin.
    pub fn stdin(&self) -> Option<StdinWriter> {
        self.stdin.clone()
    }

    /// Sends `signal` to the process (not its descendants).
    pub async fn signal(&self, signal: i32) -> Result<()> {
        self.req.send_control(&Request::Signal { signal }).await
    }

    /// Kills everything the process started (its group, sessions it created, re-parented
    /// orphans). The exit follows as an event.
    pub async fn kill(&self) -> Result<()> {
        self.req.send_control(&Request::Kill).await
    }

    /// A handle that kills this process from elsewhere (a timeout, a teardown) while
    /// another task reads its events.
    pub fn kill_handle(&self) -> KillHandle {
        KillHandle {
            shared: self.req.shared.clone(),
            id: self.req.id,
        }
    }
}

/// Kills one process from anywhere; see [`RemoteProcess::kill_handle`].
#[derive(Clone)]
pub struct KillHandle {
    shared: Arc<Shared>,
    id: u32,
}

impl std::fmt::Debug for KillHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KillHandle").field("id", &self.id).finish()
    }
}

impl KillHandle {
    /// Sends the kill. The agent handles frames in order, so anything sent after this
    /// returns (a next spawn) runs after the kill; `SandboxGone` when the agent is gone.
    pub async fn kill(&self) -> Result<()> {
        let gone = || self.shared.ended();
        if *self.shared.gone.borrow() {
            return Err(gone());
        }
        self.shared
            .out
            .send(Frame::control(self.id, &Request::Kill))
            .await
            .map_err(|_| gone())
    }
}

/// Feeds one process's stdin.
#[derive(Clone)]
pub struct StdinWriter {
    out: mpsc::Sender<Frame>,
    id: u32,
    sem: Arc<Semaphore>,
    sandbox: String,
}

impl std::fmt::Debug for StdinWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdinWriter").field("id", &self.id).finish()
    }
}

impl StdinWriter {
    /// Writes `data`. Waits while a window of input is in flight (acknowledged once it
    /// reached the process's pipe), so a process that never reads its stdin cannot grow
    /// memory anywhere. Input after the process exited is discarded.
    pub async fn write(&self, data: &[u8]) -> Result<()> {
        for chunk in data.chunks(DATA_CHUNK) {
            match self.sem.acquire_many(chunk.len() as u32).await {
                Ok(p) => p.forget(),
                Err(_) => return Ok(()), // closed: the process exited or the agent is gone
            }
            let frame = Frame {
                kind: FrameKind::Stdin,
                id: self.id,
                body: chunk.to_vec(),
            };
            self.out
                .send(frame)
                .await
                .map_err(|_| SandboxError::gone(self.sandbox.clone()))?;
        }
        Ok(())
    }

    /// Sets the window size of the process's pseudo-terminal (a process without one
    /// ignores it).
    pub async fn resize(&self, size: WindowSize) -> Result<()> {
        self.out
            .send(Frame::control(self.id, &Request::Resize(size)))
            .await
            .map_err(|_| SandboxError::gone(self.sandbox.clone()))
    }

    /// Ends the process's input (on a pseudo-terminal: sends `^D`).
    pub async fn close(&self) -> Result<()> {
        self.out
            .send(Frame::control(self.id, &Request::CloseStdin))
            .await
            .map_err(|_| SandboxError::gone(self.sandbox.clone()))
    }
}

impl Drop for RemoteProcess {
    fn drop(&mut self) {
        if self.exited.is_none() {
            // Best effort without awaiting: a full queue means the writer is alive and
            // busy, so hand the frame to a task; a closed one means the agent is gone.
            let f = Frame::control(self.req.id, &Request::Kill);
            if let Err(mpsc::error::TrySendError::Full(f)) = self.req.shared.out.try_send(f)
                && let Ok(rt) = tokio::runtime::Handle::try_current()
            {
                let out = self.req.shared.out.clone();
                rt.spawn(async move { out.send(f).await });
            }
        }
    }
}

/// A file being read in chunks.
pub struct FileReader {
    req: Pending,
    path: String,
    done: bool,
}

impl std::fmt::Debug for FileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReader")
            .field("path", &self.path)
            .finish()
    }
}

impl Drop for FileReader {
    fn drop(&mut self) {
        if !self.done {
            // Cancels the agent's read (its `kill` applies to reads too).
            let _ = self
                .req
                .shared
                .out
                .try_send(Frame::control(self.req.id, &Request::Kill));
        }
    }
}

impl FileReader {
    /// The next chunk, `Ok(None)` at the end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        if self.done {
            return Ok(None);
        }
        loop {
            match self.req.next().await? {
                Incoming::Data(FrameKind::FileData, b) => return Ok(Some(b)),
                Incoming::Data(..) => {}
                Incoming::Reply(Reply::Done) => {
                    self.done = true;
                    return Ok(None);
                }
                Incoming::Reply(other) => return Err(reply_error(other, &self.path)),
            }
        }
    }
}

fn unexpected(r: &Reply) -> SandboxError {
    SandboxError::engine(BACKEND, format!("unexpected reply from the agent: {r:?}"))
}

fn reply_error(r: Reply, path: &str) -> SandboxError {
    match r {
        Reply::Error { kind, message } => match kind {
            ErrorKind::NotFound => SandboxError::path_not_found(path),
            ErrorKind::IsADirectory => SandboxError::is_a_directory(path),
            ErrorKind::Limit => SandboxError::resource_limit(format!("agent: {message}"), None),
            ErrorKind::Pids => SandboxError::pids_exhausted(&message),
            // The same words as the engine path, whatever the OS's message says.
            ErrorKind::AlreadyExists => SandboxError::file_system(path, "already exists"),
            _ => SandboxError::file_system(path, message),
        },
        other => unexpected(&other),
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::Receiver<Frame>,
    shared: Arc<Shared>,
) {
    let mut buf = Vec::with_capacity(64 * 1024);
    while let Some(f) = rx.recv().await {
        // Nothing more goes out once the session ended: after a takeover the stream is
        // another host's, and a frame of ours would be read as one of its requests.
        if *shared.gone.borrow() {
            return;
        }
        buf.clear();
        let push = |f: &Frame, buf: &mut Vec<u8>| match f.encode() {
            Ok(b) => buf.extend_from_slice(&b),
            Err(e) => tracing::warn!(error = %e, "frame over the cap not sent"),
        };
        push(&f, &mut buf);
        // Coalesce queued frames into one write (many small acks and stdin chunks).
        while buf.len() < 256 * 1024
            && let Ok(more) = rx.try_recv()
        {
            push(&more, &mut buf);
        }
        if w.write_all(&buf).await.is_err() || w.flush().await.is_err() {
            break;
        }
    }
    mark_dead(&shared, "write to the agent failed");
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut r: R,
    shared: Arc<Shared>,
    token: Option<[u8; TOKEN_LEN]>,
) {
    let why = match token {
        None => frames(r, &shared, None).await,
        Some(t) => match skip_to_marker(&mut r, &protocol::takeover_preamble(&t)).await {
            Ok(rest) => frames(std::io::Cursor::new(rest).chain(r), &shared, token).await,
            Err(e) => format!("agent channel closed before the takeover was answered: {e}"),
        },
    };
    tracing::debug!(sandbox = %shared.sandbox, reason = %why, "agent channel ended");
    mark_dead(&shared, &why);
}

/// Reads up to and including `marker`, discarding what comes before it (output of a
/// session that was taken over, or the tail of a frame the agent was writing when this
/// host attached); returns the bytes read past it. Memory: one read buffer.
async fn skip_to_marker<R: AsyncRead + Unpin>(
    r: &mut R,
    marker: &[u8],
) -> std::io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = protocol::find(&buf, marker) {
            return Ok(buf.split_off(at + marker.len()));
        }
        let keep = buf.len().min(marker.len() - 1);
        buf.drain(..buf.len() - keep);
    }
}

/// Routes frames until the stream ends or breaks; returns why it ended.
async fn frames<R: AsyncRead + Unpin>(
    mut r: R,
    shared: &Shared,
    token: Option<[u8; TOKEN_LEN]>,
) -> String {
    loop {
        let mut header = [0u8; HEADER_LEN];
        if let Err(e) = r.read_exact(&mut header).await {
            return format!("agent channel closed: {e}");
        }
        if header[..] == TAKEOVER_MAGIC[..HEADER_LEN] {
            // A takeover marker between frames: ours repeated, or another host's.
            let mut rest = [0u8; PREAMBLE_LEN - HEADER_LEN];
            if let Err(e) = r.read_exact(&mut rest).await {
                return format!("agent channel closed inside a takeover marker: {e}");
            }
            let (magic, theirs) = rest.split_at(TAKEOVER_MAGIC.len() - HEADER_LEN);
            if magic != &TAKEOVER_MAGIC[HEADER_LEN..] {
                return "malformed takeover marker from the agent".to_string();
            }
            if token.is_some_and(|t| t[..] == *theirs) {
                continue;
            }
            shared.superseded.store(true, Ordering::SeqCst);
            return "another host took the agent over".to_string();
        }
        // Checked before any body byte is read: a forged length costs nothing.
        let (kind, id, len) = match protocol::parse_header(&header) {
            Ok(h) => h,
            Err(e) => return format!("malformed frame from the agent: {e}"),
        };
        let mut body = vec![0u8; len];
        if let Err(e) = r.read_exact(&mut body).await {
            return format!("agent channel closed inside a frame: {e}");
        }
        let msg = match kind {
            FrameKind::Control => match serde_json::from_slice::<Reply>(&body) {
                Ok(r) => Incoming::Reply(r),
                Err(e) => return format!("malformed reply from the agent: {e}"),
            },
            FrameKind::Stdin => return "agent sent a stdin frame".to_string(),
            k => Incoming::Data(k, body.into()),
        };
        if id == AGENT_ID {
            if let Incoming::Reply(Reply::Deadline) = msg {
                return "the sandbox deadline passed".to_string();
            }
            continue;
        }
        if let Err(e) = route(shared, id, msg) {
            return e;
        }
    }
}

fn route(shared: &Shared, id: u32, msg: Incoming) -> std::result::Result<(), String> {
    let routes = shared.routes.lock().unwrap_or_else(|e| e.into_inner());
    // A request already dropped (a killed process's late output): discarded.
    let Some(route) = routes.map.get(&id) else {
        return Ok(());
    };
    if let Incoming::Data(FrameKind::Ack, b) = &msg {
        if let (Some(sem), Ok(n)) = (&route.credit, <[u8; 4]>::try_from(&b[..])) {
            // Never above one window, whatever the agent says.
            let room = (WINDOW as usize).saturating_sub(sem.available_permits());
            sem.add_permits((u32::from_be_bytes(n) as usize).min(room));
        }
        return Ok(());
    }
    if let Incoming::Reply(Reply::Exit { .. }) = &msg
        && let Some(sem) = &route.credit
    {
        sem.close();
    }
    if let Incoming::Reply(_) = &msg
        && route.replies.fetch_add(1, Ordering::Relaxed) >= MAX_BUFFERED_REPLIES
    {
        return Err(format!(
            "agent sent more than {MAX_BUFFERED_REPLIES} unread replies on request {id}"
        ));
    }
    if let Incoming::Data(_, b) = &msg {
        let n = route.unacked.fetch_add(b.len() as u32, Ordering::Relaxed) + b.len() as u32;
        if n > WINDOW {
            return Err(format!(
                "agent overran the flow-control window on request {id}"
            ));
        }
    }
    let _ = route.tx.send(msg);
    Ok(())
}

fn mark_dead(shared: &Shared, why: &str) {
    let mut routes = shared.routes.lock().unwrap_or_else(|e| e.into_inner());
    if !routes.dead {
        tracing::debug!(sandbox = %shared.sandbox, reason = why, "agent gone");
    }
    routes.dead = true;
    // Dropping the senders wakes every waiter with `SandboxGone`.
    for r in routes.map.values() {
        if let Some(sem) = &r.credit {
            sem.close();
        }
    }
    routes.map.clear();
    shared.gone.send_replace(true);
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorCode;

    /// The agent's side of an in-memory channel: answers the hello, then hands the test
    /// the stream to forge frames on and the requests the client sent.
    async fn forged_agent() -> (
        AgentClient,
        tokio::io::DuplexStream,
        mpsc::UnboundedReceiver<Frame>,
    ) {
        let (client_end, agent_end) = tokio::io::duplex(1 << 20);
        let (client_r, client_w) = tokio::io::split(client_end);
        let (mut agent_r, mut agent_w) = tokio::io::split(agent_end);
        let (seen_tx, seen_rx) = mpsc::unbounded_channel();
        let (forge_end, mut forge_src) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            let mut header = [0u8; protocol::HEADER_LEN];
            let mut read = async |r: &mut tokio::io::ReadHalf<tokio::io::DuplexStream>| {
                r.read_exact(&mut header).await.ok()?;
                let (kind, id, len) = protocol::parse_header(&header).ok()?;
                let mut body = vec![0u8; len];
                r.read_exact(&mut body).await.ok()?;
                Some(Frame { kind, id, body })
            };
            let Some(hello) = read(&mut agent_r).await else {
                return;
            };
            let reply = Reply::Hello {
                version: *SUPPORTED_VERSIONS.last().unwrap(),
                agent: "forged".into(),
            };
            let bytes = Frame::control(hello.id, &reply).encode().unwrap();
            agent_w.write_all(&bytes).await.unwrap();
            // From here the test writes whatever it forges.
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut forge_src, &mut agent_w).await;
            });
            while let Some(frame) = read(&mut agent_r).await {
                let _ = seen_tx.send(frame);
            }
        });
        let client =
            AgentClient::connect(client_r, client_w, "sbx-forged", ClientOptions::default())
                .await
                .unwrap();
        (client, forge_end, seen_rx)
    }

    /// Control replies for one request are bounded like its data: a forged stream of
    /// replies the consumer does not read ends the channel instead of buffering without
    /// limit (a frame can be written into the channel by root inside the sandbox).
    #[tokio::test]
    async fn unread_control_replies_are_bounded_per_request() {
        let (client, mut forge, mut seen) = forged_agent().await;
        let process = client
            .spawn(SpawnSpec {
                argv: vec!["sleep".into(), "60".into()],
                ..SpawnSpec::default()
            })
            .await
            .unwrap();
        let spawn = seen.recv().await.unwrap();
        let reply = Frame::control(spawn.id, &Reply::Spawned { pid: 7 })
            .encode()
            .unwrap();
        let flood: Vec<u8> = reply.repeat(4096);
        forge.write_all(&flood).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !client.is_gone() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            client.is_gone(),
            "4096 unread control replies for one request were buffered"
        );
        drop(process);
    }

    fn failed(kind: ErrorKind) -> SandboxError {
        reply_error(
            Reply::Error {
                kind,
                message: "File exists (os error 17)".into(),
            },
            "/work/d",
        )
    }

    /// Failures are typed by kind, never by the OS's wording (which differs by libc and
    /// locale): an existing path reads as the engine path words it.
    #[test]
    fn reply_errors_are_typed_by_kind() {
        assert_eq!(failed(ErrorKind::NotFound).code(), ErrorCode::PathNotFound);
        assert_eq!(
            failed(ErrorKind::IsADirectory).code(),
            ErrorCode::IsADirectory
        );
        assert_eq!(
            failed(ErrorKind::Limit).code(),
            ErrorCode::ResourceLimitExceeded
        );
        let exists = failed(ErrorKind::AlreadyExists);
        assert_eq!(exists.code(), ErrorCode::FileSystem);
        let text = exists.to_string();
        assert!(
            text.contains("/work/d") && text.contains("already exists"),
            "{text}"
        );
        assert!(!text.contains("os error"), "{text}");
    }
}
