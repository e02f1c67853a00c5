//! The agent: PID 1 of a container sandbox.
//!
//! Threads, all plain `std`: the main thread reads frames from stdin and dispatches; one
//! writer thread owns stdout (a bounded queue, so producers feel back-pressure); the reaper
//! reaps every child (the agent is PID 1 and, outside a container, a child subreaper);
//! the lifetime thread ends everything at the sandbox deadline or idle limit
//! (`lifetime.rs`). Each spawn adds a
//! supervisor, two output readers and, when asked, a stdin writer.
//!
//! No signal handler is installed: as PID 1 of a PID namespace the kernel then drops every
//! signal sent from inside the namespace (SIGKILL and SIGSTOP included), so sandboxed root
//! cannot stop the deadline.

mod files;
mod input;
mod kill;
mod lifetime;
mod pids;
pub mod pty;
mod spawn;
mod ssh;
mod tcp;

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::protocol::{
    self, ErrorKind, Frame, FrameKind, Reply, Request, SUPPORTED_VERSIONS, TAKEOVER_MAGIC,
    TOKEN_LEN,
};

pub use spawn::MARKER_VAR;

/// Frames queued for stdout before producers block.
const OUT_QUEUE: usize = 256;

/// Command line of the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// When the sandbox ends.
    pub deadline: SystemTime,
    /// The latest the host may move the deadline to (`--max-deadline-unix`); the
    /// deadline itself when absent, i.e. it cannot move later.
    pub max_deadline: SystemTime,
    /// End after this long with no frame from the host and no process running
    /// (`--idle <seconds>`).
    pub idle: Option<Duration>,
}

/// Parses `--deadline-unix <seconds>` or `--timeout <seconds>`, and optionally
/// `--max-deadline-unix <seconds>` and `--idle <seconds>`.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Args, String> {
    let mut it = args.into_iter();
    let mut deadline = None;
    let mut max_deadline = None;
    let mut idle = None;
    while let Some(a) = it.next() {
        let value = |it: &mut I::IntoIter| {
            it.next()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| format!("{a} needs a number of seconds"))
        };
        match a.as_str() {
            "--deadline-unix" => {
                deadline = Some(UNIX_EPOCH + Duration::from_secs(value(&mut it)?));
            }
            "--timeout" => {
                deadline = Some(SystemTime::now() + Duration::from_secs(value(&mut it)?));
            }
            "--max-deadline-unix" => {
                max_deadline = Some(UNIX_EPOCH + Duration::from_secs(value(&mut it)?));
            }
            "--idle" => match value(&mut it)? {
                0 => return Err("--idle needs a positive number of seconds".into()),
                s => idle = Some(Duration::from_secs(s)),
            },
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let deadline =
        deadline.ok_or("a deadline is required: --deadline-unix <s> or --timeout <s>")?;
    Ok(Args {
        deadline,
        max_deadline: max_deadline.unwrap_or(deadline).max(deadline),
        idle,
    })
}

/// Runs the agent on this process's stdin and stdout until the deadline or the end of
/// stdin. Returns the process exit code.
pub fn run(args: Args) -> i32 {
    harden();
    let (out_tx, out_rx) = mpsc::sync_channel::<Outgoing>(OUT_QUEUE);
    let writer = std::thread::Builder::new()
        .name("writer".into())
        .spawn(move || write_loop(out_rx));
    if writer.is_err() {
        return 70;
    }
    let procs = spawn::Processes::start();
    let life = lifetime::Lifetime::new(args.deadline, args.max_deadline, args.idle);
    lifetime::watch(life.clone(), procs.clone(), Out::agent(out_tx.clone()));
    let code = serve(&procs, &life, &out_tx);
    procs.kill_everything();
    code
}

/// What the writer thread is given.
pub(crate) enum Outgoing {
    /// A frame produced for host session `session` ([`ANY_SESSION`]: every session).
    Frame(u64, Frame),
    /// Host session `session` starts: the writer writes the takeover marker and from then
    /// on drops every frame of an earlier session.
    Takeover(u64, [u8; TOKEN_LEN]),
}

/// Session tag of the agent's own notices (the deadline), which every host may read.
const ANY_SESSION: u64 = u64::MAX;

/// Where one host session's frames go: the writer, tagged with the session they belong
/// to, so frames of a session that was taken over are never written after the marker (a
/// process of the old session that is still draining cannot answer the new host's ids).
/// Clones share the session; a process gets a route of its own ([`Out::route`]), which a
/// takeover that carries the process over moves to the new session.
#[derive(Clone)]
pub(crate) struct Out {
    tx: SyncSender<Outgoing>,
    session: Arc<AtomicU64>,
}

impl Out {
    pub(crate) fn agent(tx: SyncSender<Outgoing>) -> Self {
        Out::new(tx, ANY_SESSION)
    }

    fn new(tx: SyncSender<Outgoing>, session: u64) -> Self {
        Out {
            tx,
            session: Arc::new(AtomicU64::new(session)),
        }
    }

    /// The session these frames belong to.
    pub(crate) fn session(&self) -> u64 {
        self.session.load(Ordering::SeqCst)
    }

    /// A route of its own for one process, in this session for now.
    pub(crate) fn route(&self) -> Out {
        Out::new(self.tx.clone(), self.session())
    }

    /// Moves this route (and every clone of it) to `session`.
    pub(crate) fn move_to(&self, session: u64) {
        self.session.store(session, Ordering::SeqCst);
    }

    /// Queues a frame; blocks while the writer is behind (back-pressure, never loss).
    /// Fails only when the writer is gone.
    pub(crate) fn send(&self, frame: Frame) -> Result<(), ()> {
        self.tx
            .send(Outgoing::Frame(self.session(), frame))
            .map_err(|_| ())
    }

    /// Queues a frame unless the queue is full.
    pub(crate) fn try_send(&self, frame: Frame) {
        let _ = self.tx.try_send(Outgoing::Frame(self.session(), frame));
    }
}

/// Undumpable: /proc/1/fd, /proc/1/mem and ptrace of the agent then need CAP_SYS_PTRACE,
/// which sandboxed root does not have, so the channel stays out of its reach. Subreaper:
/// outside a container (the pipe tests) orphans of spawns still come back to the agent.
fn harden() {
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
}

fn write_loop(rx: Receiver<Outgoing>) {
    let stdout = io::stdout();
    let mut w = BufWriter::with_capacity(128 * 1024, stdout.lock());
    let mut current = 0;
    while let Ok(first) = rx.recv() {
        if write_outgoing(&mut w, first, &mut current).is_err() {
            return;
        }
        // Coalesce what is already queued into one write, then flush: latency of a lone
        // reply stays one syscall, bulk output is not flushed per frame.
        while let Ok(more) = rx.try_recv() {
            if write_outgoing(&mut w, more, &mut current).is_err() {
                return;
            }
        }
        if w.flush().is_err() {
            return;
        }
    }
}

/// Writes one queued item for the host session `current` (which a takeover advances).
fn write_outgoing<W: Write>(w: &mut W, item: Outgoing, current: &mut u64) -> io::Result<()> {
    match item {
        Outgoing::Frame(session, frame) if session == *current || session == ANY_SESSION => {
            write_capped(w, frame)
        }
        // A frame of a session that was taken over: its host is gone or shut out.
        Outgoing::Frame(..) => Ok(()),
        Outgoing::Takeover(session, token) => {
            *current = session;
            w.write_all(&TAKEOVER_MAGIC)?;
            w.write_all(&token)
        }
    }
}

/// Writes a frame; one over the cap (a huge listing) becomes a `limit` error for its
/// request instead of breaking the stream.
fn write_capped<W: Write>(w: &mut W, frame: Frame) -> io::Result<()> {
    if frame.encode().is_ok() {
        return protocol::write_frame(w, &frame);
    }
    let reply = Reply::Error {
        kind: ErrorKind::Limit,
        message: "reply larger than one frame".into(),
    };
    protocol::write_frame(w, &Frame::control(frame.id, &reply))
}

/// One host session: what the agent keeps for the host it serves now.
struct Session {
    out: Out,
    /// The token it started with (none for the first session, begun by a plain hello).
    token: Option<[u8; TOKEN_LEN]>,
    /// The negotiated version, once its hello succeeded.
    version: Option<u32>,
    /// Files being written, by request id.
    writes: HashMap<u32, files::Upload>,
    /// Processes the next takeover carries over instead of detaching (`keep`).
    keep: Vec<u32>,
}

impl Session {
    fn new(out: Out, token: Option<[u8; TOKEN_LEN]>) -> Self {
        Session {
            out,
            token,
            version: None,
            writes: HashMap::new(),
            keep: Vec::new(),
        }
    }
}

fn serve(procs: &spawn::Processes, life: &lifetime::Lifetime, tx: &SyncSender<Outgoing>) -> i32 {
    let stdin = io::stdin();
    let mut input = input::Input::new(stdin.lock());
    let mut s = Session::new(Out::new(tx.clone(), 0), None);
    let ssh = ssh::Listeners::default();
    let tcp = tcp::Ports::default();
    loop {
        let item = match input.next_item() {
            Ok(item) => item,
            // Reading the channel itself failed (not its content, which never ends the
            // agent): nobody can reach what runs any more.
            Err(_) => return 65,
        };
        let skipped = input.take_discarded();
        if skipped > 0 {
            diagnose(&format!(
                "discarded {skipped} bytes of a broken stream up to a takeover"
            ));
        }
        let frame = match item {
            input::Item::Frame(f) => f,
            // The host closed the channel: nobody can use or stop what runs, so end it.
            input::Item::End => return 0,
            // The same host repeating its preamble after filler (its first try was slow,
            // not swallowed): the session goes on, and its repeated hello is answered again.
            input::Item::Takeover(token) if s.token == Some(token) => {
                s.version = None;
                continue;
            }
            input::Item::Takeover(token) => {
                // Answers for the old session's relay connections could only come from
                // the host that was shut out.
                ssh.close_session(s.out.session());
                tcp.close_session(s.out.session());
                s = take_over(procs, s, token);
                continue;
            }
        };
        let id = frame.id;
        // Any frame is a use of the sandbox (a call, its input, or the host taking
        // output): the idle clock starts again.
        life.touch();
        let out = &s.out;
        if s.version.is_none() {
            s.version = hello(&frame, out);
            continue;
        }
        match frame.kind {
            FrameKind::Control => match frame.parse::<Request>() {
                Ok(Request::SetDeadline { deadline_unix }) => {
                    match life.set_deadline(deadline_unix) {
                        Ok(deadline_unix) => send(out, id, Reply::DeadlineSet { deadline_unix }),
                        Err((kind, message)) => reply_error(out, id, kind, message),
                    }
                }
                Ok(Request::SshAgentListen { path }) => {
                    if let Err(e) =
                        ssh.listen(key(out, id), &path, out, || send(out, id, Reply::Done))
                    {
                        reply_error(out, id, ErrorKind::of(&e), e.to_string());
                    }
                }
                Ok(Request::TcpListen { port }) => {
                    if let Err(e) = tcp.listen(key(out, id), port, out, |port| {
                        send(out, id, Reply::Listening { port })
                    }) {
                        reply_error(out, id, ErrorKind::of(&e), e.to_string());
                    }
                }
                Ok(Request::Keep { ids }) => {
                    let processes = procs.live(out.session(), &ids);
                    send(out, id, Reply::Kept { processes });
                    s.keep = ids;
                }
                Ok(req) => dispatch(id, req, procs, out, &mut s.writes),
                Err(e) => reply_error(out, id, ErrorKind::InvalidRequest, e.to_string()),
            },
            FrameKind::Stdin => procs.stdin(key(out, id), frame.body),
            FrameKind::Ack => procs.credit(key(out, id), frame.ack_bytes().unwrap_or(0)),
            FrameKind::FileData => {
                if let Some(up) = s.writes.get_mut(&id)
                    && let Err(e) = up.write(&frame.body)
                {
                    s.writes.remove(&id);
                    reply_error(out, id, ErrorKind::of(&e), e.to_string());
                }
            }
            FrameKind::SshAgent => ssh.answer(key(out, id), &frame.body),
            FrameKind::Tcp => tcp.host_frame(key(out, id), &frame.body),
            FrameKind::Stdout | FrameKind::Stderr => reply_error(
                out,
                id,
                ErrorKind::InvalidRequest,
                "unexpected frame kind".into(),
            ),
        }
    }
}

/// Ends session `old` for a new host's session `token`. The processes the old session
/// asked to keep join the new one under the same ids; the others keep running, detached
/// (docs/agent.md says why): their output is discarded, their input is closed. Its file
/// reads stop and its unfinished uploads are removed. The marker goes out before anything
/// of the new session, and nothing of the old one follows it.
fn take_over(procs: &spawn::Processes, old: Session, token: [u8; TOKEN_LEN]) -> Session {
    for (_, upload) in old.writes {
        upload.abandon();
    }
    let session = old.out.session() + 1;
    // Moved before the marker is queued: a kept process's frames queued after this carry
    // the new session, any queued before it are the old host's and are dropped.
    procs.carry_over(old.out.session(), session, &old.keep);
    procs.detach_session(old.out.session());
    let _ = old.out.tx.send(Outgoing::Takeover(session, token));
    Session::new(Out::new(old.out.tx.clone(), session), Some(token))
}

/// The process-table key of request `id` in the session `out` belongs to.
fn key(out: &Out, id: u32) -> spawn::Key {
    spawn::Key {
        session: out.session(),
        id,
    }
}

/// A line on the agent's stderr, which the host logs (bounded); never on the channel.
fn diagnose(message: &str) {
    let _ = io::stderr().write_all(format!("sandbox-agent: {message}\n").as_bytes());
}

fn hello(frame: &Frame, out: &Out) -> Option<u32> {
    let versions = match frame.parse::<Request>() {
        Ok(Request::Hello { versions }) if frame.kind == FrameKind::Control => versions,
        _ => {
            reply_error(
                out,
                frame.id,
                ErrorKind::InvalidRequest,
                "the first message must be hello".into(),
            );
            return None;
        }
    };
    match protocol::negotiate(SUPPORTED_VERSIONS, &versions) {
        Some(version) => {
            send(
                out,
                frame.id,
                Reply::Hello {
                    version,
                    agent: env!("CARGO_PKG_VERSION").into(),
                },
            );
            Some(version)
        }
        None => {
            send(
                out,
                frame.id,
                Reply::Refused {
                    supported: SUPPORTED_VERSIONS.to_vec(),
                },
            );
            None
        }
    }
}

fn dispatch(
    id: u32,
    req: Request,
    procs: &spawn::Processes,
    out: &Out,
    writes: &mut HashMap<u32, files::Upload>,
) {
    let k = key(out, id);
    match req {
        Request::Hello { .. } => reply_error(
            out,
            id,
            ErrorKind::InvalidRequest,
            "hello was already done".into(),
        ),
        Request::Ping => send(out, id, Reply::Pong),
        Request::Spawn(spec) => procs.spawn(k, spec, out),
        Request::CloseStdin => procs.close_stdin(k),
        Request::Resize(size) => procs.resize(k, size, out),
        Request::Signal { signal } => procs.signal(k, signal),
        Request::Kill => {
            let n = procs.kill(k);
            send(out, id, Reply::Killed { processes: n });
        }
        Request::ResetProcesses => {
            let n = procs.kill_everything();
            send(out, id, Reply::Killed { processes: n });
        }
        Request::ReadFile { path } => files::read(id, path, procs.credits_for_read(k), out.clone()),
        Request::WriteFile { path, mode } => match files::Upload::open(&path, mode) {
            Ok(up) => {
                writes.insert(id, up);
            }
            Err(e) => reply_error(out, id, ErrorKind::of(&e), e.to_string()),
        },
        // Without an open upload the write already failed (its error was sent).
        Request::WriteEnd => {
            if let Some(up) = writes.remove(&id) {
                match up.finish() {
                    Ok(()) => send(out, id, Reply::Done),
                    Err(e) => reply_error(out, id, ErrorKind::of(&e), e.to_string()),
                }
            }
        }
        Request::Stat { path } => send(out, id, files::stat(&path)),
        Request::List { path } => send(out, id, files::list(&path)),
        Request::Mkdir { path, parents } => send(out, id, files::mkdir(&path, parents)),
        Request::Remove { path, recursive } => send(out, id, files::remove(&path, recursive)),
        // Answered by `serve`, which holds the lifetime and the session.
        Request::SetDeadline { .. }
        | Request::Keep { .. }
        | Request::SshAgentListen { .. }
        | Request::TcpListen { .. } => {}
    }
}

/// Queues a reply; blocks while the writer is behind (back-pressure, never loss).
fn send(out: &Out, id: u32, reply: Reply) {
    let _ = out.send(Frame::control(id, &reply));
}

fn reply_error(out: &Out, id: u32, kind: ErrorKind, message: String) {
    send(out, id, Reply::Error { kind, message });
}

/// A shared byte budget: a producer takes before sending, the peer's acks give back.
pub(crate) struct Credits {
    state: Mutex<(u64, bool)>,
    /// The window: never more credit than this at once.
    cap: u64,
    cv: std::sync::Condvar,
    /// Producers blocked for credit: the host is behind, the process is not idle.
    waiting: std::sync::atomic::AtomicUsize,
}

impl Credits {
    pub(crate) fn new() -> Arc<Self> {
        Self::with_window(protocol::WINDOW)
    }

    /// A budget of `window` bytes.
    pub(crate) fn with_window(window: u32) -> Arc<Self> {
        Arc::new(Credits {
            state: Mutex::new((u64::from(window), false)),
            cap: u64::from(window),
            cv: std::sync::Condvar::new(),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Waits for credit; returns how much may be sent (≤ `want`), or `None` once closed.
    pub(crate) fn take(&self, want: usize) -> Option<usize> {
        let mut s = self.state.lock().ok()?;
        loop {
            if s.1 {
                return None;
            }
            if s.0 > 0 {
                let n = (want as u64).min(s.0);
                s.0 -= n;
                return Some(n as usize);
            }
            self.waiting
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let woke = self.cv.wait(s);
            self.waiting
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            s = woke.ok()?;
        }
    }

    /// Whether a producer waits for the peer to take data.
    pub(crate) fn has_waiters(&self) -> bool {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    pub(crate) fn give(&self, n: u32) {
        if let Ok(mut s) = self.state.lock() {
            // Capped: a confused peer cannot grant more than one window in advance.
            s.0 = (s.0 + u64::from(n)).min(self.cap);
            self.cv.notify_all();
        }
    }

    pub(crate) fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.1 = true;
            self.cv.notify_all();
        }
    }

    /// A whole window again: a new host has received nothing of this stream yet (what
    /// the old one was sent and had not acknowledged is not coming back).
    pub(crate) fn refill(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.0 = self.cap;
            self.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_required_and_numeric() {
        assert!(parse_args(Vec::<String>::new()).is_err());
        assert!(parse_args(["--timeout".into(), "x".into()]).is_err());
        assert!(parse_args(["--bogus".into()]).is_err());
        let a = parse_args(["--deadline-unix".into(), "100".into()]).unwrap();
        assert_eq!(a.deadline, UNIX_EPOCH + Duration::from_secs(100));
        assert_eq!(
            a.max_deadline, a.deadline,
            "no maximum: the deadline cannot move"
        );
        assert_eq!(a.idle, None);
        let a = parse_args(
            [
                "--deadline-unix",
                "100",
                "--max-deadline-unix",
                "500",
                "--idle",
                "3",
            ]
            .map(String::from),
        )
        .unwrap();
        assert_eq!(a.max_deadline, UNIX_EPOCH + Duration::from_secs(500));
        assert_eq!(a.idle, Some(Duration::from_secs(3)));
        assert!(parse_args(["--deadline-unix", "1", "--idle", "0"].map(String::from)).is_err());
    }

    #[test]
    fn credits_never_exceed_a_window() {
        let c = Credits::new();
        c.give(u32::MAX);
        assert_eq!(c.take(usize::MAX), Some(protocol::WINDOW as usize));
        c.close();
        assert_eq!(c.take(1), None);
    }
}
