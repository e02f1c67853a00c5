//! Spawning, reaping and killing what a spawn started.
//!
//! Reaping without racing std: `Command::spawn` waits for its own child when `exec` fails,
//! and would panic if the reaper had taken that child first. So spawns happen under the
//! table lock, and the reaper blocks in `waitid(WNOWAIT)` (which reaps nothing), then
//! takes the lock and reaps everything reapable with `waitpid(-1, WNOHANG)`.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use rustix::process::{Pid, Signal, WaitIdOptions, WaitOptions};

use super::pids::{self, Reserved};
use super::{Credits, Out, kill, pty};
use crate::protocol::{DATA_CHUNK, ErrorKind, Frame, FrameKind, Reply, SpawnSpec, WINDOW};

/// Environment variable carrying the per-spawn marker; inherited by descendants, so a
/// process that left the spawn's process group and session is still found by the kill.
pub const MARKER_VAR: &str = "SANDBOX_AGENT_SPAWN";

/// Most concurrent spawns; more is refused with a `limit` error.
const MAX_SPAWNS: usize = 1024;

/// Most ended spawns remembered for the kill's orphan rule (kill.rs); the oldest is
/// forgotten first. Only spawns that could have overlapped a running one are kept anyway.
const ENDED_KEPT: usize = 4096;

/// After the root exits, output still arriving within this gap is forwarded; then the exit
/// is reported even if a background process keeps the pipes open.
const DRAIN_GAP: Duration = Duration::from_millis(100);

/// A request of one host session: the same wire id in a later session (after a
/// takeover) is another request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// The host session (0 for the first, one more per takeover).
    pub(crate) session: u64,
    /// The request id the host chose.
    pub(crate) id: u32,
}

/// Shared handle to the process table.
#[derive(Clone)]
pub(crate) struct Processes {
    inner: Arc<Inner>,
}

struct Inner {
    table: Mutex<Table>,
    /// Bumped on every spawn; the reaper waits on it when it has no children.
    spawned: Condvar,
    /// Distinguishes this agent's markers from another agent's (pipe tests on one host).
    nonce: String,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<Key, Entry>,
    by_pid: HashMap<u32, Key>,
    credits: HashMap<Key, Arc<Credits>>,
    generation: u64,
    /// When the roots of spawns that left the table ran: a kill must not attribute an
    /// orphan to its target when another root ran at the orphan's start, even one that has
    /// ended since (a leftover of a command that ended within the clock tick the next one
    /// started in, say).
    ended: VecDeque<Ended>,
}

/// The run of a spawn that left the table.
struct Ended {
    start_ticks: u64,
    exit_ticks: u64,
}

impl Table {
    fn remember(&mut self, e: &Entry) {
        let now = kill::now_ticks();
        self.ended.push_back(Ended {
            start_ticks: e.start_ticks,
            exit_ticks: e.exit_ticks.unwrap_or(now),
        });
        // A run that ended before every spawn in the table started, and before now (a
        // later spawn starts at now or after), overlaps no run the kill can be asked about.
        let horizon = self
            .by_id
            .values()
            .map(|e| e.start_ticks)
            .min()
            .unwrap_or(now)
            .min(now);
        self.ended.retain(|x| x.exit_ticks >= horizon);
        while self.ended.len() > ENDED_KEPT {
            self.ended.pop_front();
        }
    }
}

pub(crate) struct Entry {
    pub(crate) pid: u32,
    pub(crate) marker: String,
    /// Start of the root in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub(crate) start_ticks: u64,
    /// When the root was reaped, in the same clock; `None` while it runs.
    pub(crate) exit_ticks: Option<u64>,
    stdin: Option<Sender<Vec<u8>>>,
    /// The terminal's controller side, for spawns on a pseudo-terminal (resize, and
    /// end-of-file instead of closing the input).
    pty: Option<std::fs::File>,
    events: Sender<Event>,
    /// Where its frames go; moved to the new session when a takeover carries it over.
    route: Out,
}

enum Event {
    Exited(Option<i32>, Option<i32>),
    Progress,
    ReaderDone,
}

impl Processes {
    pub(crate) fn start() -> Self {
        let inner = Arc::new(Inner {
            table: Mutex::new(Table::default()),
            spawned: Condvar::new(),
            nonce: nonce(),
        });
        let reaper = Processes {
            inner: inner.clone(),
        };
        let _ = std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || reaper.reap_forever());
        Processes { inner }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A poisoned table only means a thread panicked mid-update; the data is still the
        // best knowledge of what runs, and PID 1 must keep going.
        self.inner.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn spawn(&self, key: Key, spec: SpawnSpec, out: &Out) {
        let id = key.id;
        // Its own route: its readers, stdin pump and supervisor follow it when a takeover
        // carries it over to another session.
        let out = &out.route();
        let send = |reply: Reply| {
            let _ = out.send(Frame::control(id, &reply));
        };
        let mut t = self.lock();
        if t.by_id.contains_key(&key) {
            drop(t);
            return send(Reply::Error {
                kind: ErrorKind::InvalidRequest,
                message: "request id in use".into(),
            });
        }
        if t.by_id.len() >= MAX_SPAWNS {
            drop(t);
            return send(Reply::Error {
                kind: ErrorKind::Limit,
                message: format!("more than {MAX_SPAWNS} concurrent processes"),
            });
        }
        let Some(program) = spec.argv.first().and_then(|p| resolve(p, &spec.env)) else {
            drop(t);
            return not_started(out, id, &spec, 127, "not found");
        };
        let marker = format!("{}-{}-{id}", self.inner.nonce, key.session);
        let terminal = match spec.pty.map(pty::open).transpose() {
            Ok(t) => t,
            Err(e) => {
                drop(t);
                return send(Reply::Error {
                    kind: ErrorKind::of(&e),
                    message: format!("opening a pseudo-terminal: {e}"),
                });
            }
        };
        let mut cmd = match &terminal {
            // Through ourselves: the helper becomes a session leader with the terminal as
            // its controlling tty, then execs the program (pty.rs says why).
            Some(_) => {
                let mut c = Command::new("/proc/self/exe");
                c.arg(pty::EXEC_FLAG).arg(&program);
                if !spec.env.iter().any(|(k, _)| k == "TERM") {
                    c.env("TERM", pty::DEFAULT_TERM);
                }
                c
            }
            None => {
                let mut c = Command::new(&program);
                // Its own process group: signals to the root's group reach the whole job,
                // and a kill of the group catches children that did not call setsid. (On
                // a terminal the helper's setsid gives it a group of its own.)
                c.process_group(0);
                c
            }
        };
        cmd.args(&spec.argv[1..])
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env(MARKER_VAR, &marker);
        // Never the agent's fds: its stdin/stdout are the channel.
        match &terminal {
            Some((_, user)) => {
                let io = |f: &std::fs::File| f.try_clone().map(Stdio::from);
                match (io(user), io(user), io(user)) {
                    (Ok(i), Ok(o), Ok(e)) => {
                        cmd.stdin(i).stdout(o).stderr(e);
                    }
                    _ => {
                        drop(t);
                        return not_started(out, id, &spec, 126, "no file descriptors left");
                    }
                }
            }
            None => {
                cmd.stdin(if spec.stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            }
        }
        if let Some(cwd) = &spec.cwd {
            cmd.current_dir(cwd);
        }
        // Every thread this spawn needs, before the process: one that cannot start later
        // would leave the host waiting for output or an exit that never comes.
        let needed =
            2 + usize::from(terminal.is_none()) + usize::from(spec.stdin || terminal.is_some());
        let mut threads = match Reserved::start_many("spawn", needed) {
            Ok(t) => t,
            Err(e) => {
                drop(t);
                return send(if pids::exhausted(&e) {
                    pids::refused("spawn")
                } else {
                    Reply::Error {
                        kind: ErrorKind::Other,
                        message: format!("starting the spawn's threads: {e}"),
                    }
                });
            }
        };
        let spawned = cmd.spawn();
        // The user side now lives only in the child: the controller's reads end (EIO)
        // once every process holding it is gone.
        drop(cmd);
        let controller = terminal.map(|(controller, _user)| controller);
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) if pids::exhausted(&e) => {
                drop(t);
                return send(pids::refused("spawn"));
            }
            Err(e) => {
                drop(t);
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                };
                return not_started(out, id, &spec, code, &e.to_string());
            }
        };
        let pid = child.id();
        let (events_tx, events_rx) = mpsc::channel();
        let credits = Credits::new();
        let (stdin, output, pty) = match controller {
            Some(c) => match (c.try_clone(), c.try_clone()) {
                (Ok(writer), Ok(reader)) => (
                    Some(start_stdin(take(&mut threads), writer, out.clone(), id)),
                    Some(reader),
                    Some(c),
                ),
                _ => (None, None, Some(c)),
            },
            None => (
                child
                    .stdin
                    .take()
                    .map(|s| start_stdin(take(&mut threads), s, out.clone(), id)),
                None,
                None,
            ),
        };
        let start_ticks = kill::start_ticks(pid).unwrap_or(0);
        t.by_pid.insert(pid, key);
        t.credits.insert(key, credits.clone());
        t.by_id.insert(
            key,
            Entry {
                pid,
                marker,
                start_ticks,
                exit_ticks: None,
                stdin,
                pty,
                events: events_tx.clone(),
                route: out.clone(),
            },
        );
        t.generation += 1;
        drop(t);
        self.inner.spawned.notify_all();
        send(Reply::Spawned { pid });
        let mut readers = 0;
        if let Some(terminal) = output {
            // Both streams, as the terminal merged them.
            readers += start_reader(
                take(&mut threads),
                terminal,
                FrameKind::Stdout,
                id,
                out,
                &credits,
                &events_tx,
            );
        }
        if let Some(s) = child.stdout.take() {
            readers += start_reader(
                take(&mut threads),
                s,
                FrameKind::Stdout,
                id,
                out,
                &credits,
                &events_tx,
            );
        }
        if let Some(s) = child.stderr.take() {
            readers += start_reader(
                take(&mut threads),
                s,
                FrameKind::Stderr,
                id,
                out,
                &credits,
                &events_tx,
            );
        }
        // `child` is dropped without wait: the reaper owns reaping.
        let me = self.clone();
        let out = out.clone();
        take(&mut threads).run(move || me.supervise(key, &out, readers, events_rx, credits));
    }

    fn supervise(
        &self,
        key: Key,
        out: &Out,
        mut readers: u32,
        events: Receiver<Event>,
        credits: Arc<Credits>,
    ) {
        let mut status = None;
        loop {
            let ev = if status.is_some() {
                match events.recv_timeout(DRAIN_GAP) {
                    Ok(ev) => ev,
                    // Quiet because the host has not taken what was sent yet: the output
                    // is real, keep forwarding it.
                    Err(mpsc::RecvTimeoutError::Timeout) if credits.has_waiters() => continue,
                    Err(_) => break,
                }
            } else {
                match events.recv() {
                    Ok(ev) => ev,
                    Err(_) => break,
                }
            };
            match ev {
                Event::Exited(code, signal) => status = Some((code, signal)),
                Event::Progress => {}
                Event::ReaderDone => readers = readers.saturating_sub(1),
            }
            if status.is_some() && readers == 0 {
                break;
            }
        }
        // Readers still blocked (a background process holds the pipe) stop forwarding.
        credits.close();
        let (code, signal) = status.unwrap_or((None, None));
        let mut t = self.lock();
        // Under the lock a takeover moves the route under: the session it is in now.
        let key = Key {
            session: out.session(),
            id: key.id,
        };
        if let Some(e) = t.by_id.remove(&key) {
            t.remember(&e);
        }
        t.credits.remove(&key);
        drop(t);
        let _ = out.send(Frame::control(key.id, &Reply::Exit { code, signal }));
    }

    fn reap_forever(&self) {
        loop {
            // Blocks until some child is a zombie, reaping nothing (see the module docs).
            match rustix::process::waitid(
                rustix::process::WaitId::All,
                WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
            ) {
                Ok(_) => self.reap_all_ready(),
                Err(rustix::io::Errno::CHILD) => {
                    let t = self.lock();
                    let generation = t.generation;
                    let _ = self
                        .inner
                        .spawned
                        .wait_timeout_while(t, Duration::from_secs(1), |t| {
                            t.generation == generation
                        });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    fn reap_all_ready(&self) {
        let mut t = self.lock();
        // `wait` is wait4(-1): any child. (rustix's `waitpid(None)` is wait4(0), only the
        // caller's process group, which no spawn is in.)
        while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
            let pid = pid.as_raw_nonzero().get() as u32;
            let Some(id) = t.by_pid.remove(&pid) else {
                continue; // an orphan that came to PID 1: reaped, nothing to report
            };
            if let Some(e) = t.by_id.get_mut(&id) {
                e.exit_ticks = Some(kill::now_ticks());
                let _ = e.events.send(Event::Exited(
                    status.exit_status(),
                    status.terminating_signal(),
                ));
            }
        }
    }

    pub(crate) fn stdin(&self, key: Key, data: Vec<u8>) {
        let t = self.lock();
        if let Some(tx) = t.by_id.get(&key).and_then(|e| e.stdin.as_ref()) {
            let _ = tx.send(data);
        }
    }

    pub(crate) fn close_stdin(&self, key: Key) {
        let mut t = self.lock();
        if let Some(e) = t.by_id.get_mut(&key) {
            match (&e.pty, &e.stdin) {
                // A terminal has no end of input to close: `^D` is how a reader gets one.
                (Some(_), Some(tx)) => {
                    let _ = tx.send(vec![0x04]);
                }
                _ => e.stdin = None,
            }
        }
    }

    pub(crate) fn resize(&self, key: Key, size: crate::protocol::WindowSize, out: &Out) {
        let t = self.lock();
        let resized = t
            .by_id
            .get(&key)
            .and_then(|e| e.pty.as_ref())
            .map(|c| pty::resize(c, size));
        drop(t);
        match resized {
            Some(Ok(())) | None => {}
            Some(Err(e)) => {
                let reply = Reply::Error {
                    kind: ErrorKind::of(&e),
                    message: format!("resizing the terminal: {e}"),
                };
                let _ = out.send(Frame::control(key.id, &reply));
            }
        }
    }

    pub(crate) fn credit(&self, key: Key, n: u32) {
        let t = self.lock();
        if let Some(c) = t.credits.get(&key) {
            c.give(n);
        }
    }

    /// Registers credit for a file read under `key`; released by [`Self::release`].
    pub(crate) fn credits_for_read(&self, key: Key) -> (Arc<Credits>, Processes) {
        let c = Credits::new();
        self.lock().credits.insert(key, c.clone());
        (c, self.clone())
    }

    pub(crate) fn release(&self, key: Key) {
        self.lock().credits.remove(&key);
    }

    pub(crate) fn signal(&self, key: Key, signal: i32) {
        let t = self.lock();
        let Some(e) = t.by_id.get(&key).filter(|e| e.exit_ticks.is_none()) else {
            return;
        };
        // Checked under the lock while the root is unreaped, so the pid cannot have been
        // reused by another process.
        if let (Some(pid), Some(sig)) =
            (Pid::from_raw(e.pid as i32), Signal::from_named_raw(signal))
        {
            let _ = rustix::process::kill_process(pid, sig);
        }
    }

    /// Kills everything the spawn `key` started; returns how many processes got SIGKILL.
    pub(crate) fn kill(&self, key: Key) -> u32 {
        let mut total = 0;
        {
            // A kill of a file read cancels it: its thread stops at the next chunk.
            let mut t = self.lock();
            if !t.by_id.contains_key(&key)
                && let Some(c) = t.credits.remove(&key)
            {
                c.close();
                return 0;
            }
        }
        // A process can fork between a scan and the kill: repeat until a scan finds none.
        for _ in 0..50 {
            let t = self.lock();
            let Some(target) = t.by_id.get(&key) else {
                return total;
            };
            // By id, not pid: a spawn whose root reused the target's pid is another spawn.
            let others: Vec<kill::Other<'_>> = t
                .by_id
                .iter()
                .filter(|(other, _)| **other != key)
                .map(|(_, e)| kill::Other {
                    root: e.exit_ticks.is_none().then_some(e.pid),
                    marker: Some(&e.marker),
                    start_ticks: e.start_ticks,
                    exit_ticks: e.exit_ticks,
                })
                .chain(t.ended.iter().map(|e| kill::Other {
                    root: None,
                    marker: None,
                    start_ticks: e.start_ticks,
                    exit_ticks: Some(e.exit_ticks),
                }))
                .collect();
            let mut victims = kill::victims(target, &others);
            // The root first: otherwise a shell may see its child die and exit 137 on its
            // own before its SIGKILL lands, and the exit would not say "killed".
            victims.sort_by_key(|p| *p != target.pid);
            if victims.is_empty() {
                return total;
            }
            for pid in &victims {
                if let Some(p) = Pid::from_raw(*pid as i32) {
                    let _ = rustix::process::kill_process(p, Signal::KILL);
                }
            }
            total += victims.len() as u32;
            drop(t);
            std::thread::sleep(Duration::from_millis(1));
        }
        total
    }

    /// How many of `ids` name a live process of host session `session`.
    pub(crate) fn live(&self, session: u64, ids: &[u32]) -> u32 {
        let t = self.lock();
        let mut seen: Vec<u32> = ids.to_vec();
        seen.sort_unstable();
        seen.dedup();
        seen.iter()
            .filter(|&&id| t.by_id.contains_key(&Key { session, id }))
            .count() as u32
    }

    /// Moves the processes `ids` of session `from` into session `to` under the same ids:
    /// their frames go to the new host from now on, their input stays open, and their
    /// output gets a whole window (the new host has acknowledged nothing yet).
    pub(crate) fn carry_over(&self, from: u64, to: u64, ids: &[u32]) {
        let mut t = self.lock();
        for &id in ids {
            let old = Key { session: from, id };
            let new = Key { session: to, id };
            let Some(e) = t.by_id.remove(&old) else {
                continue;
            };
            e.route.move_to(to);
            if t.by_pid.get(&e.pid) == Some(&old) {
                t.by_pid.insert(e.pid, new);
            }
            t.by_id.insert(new, e);
            if let Some(c) = t.credits.remove(&old) {
                c.refill();
                t.credits.insert(new, c);
            }
        }
    }

    /// Detaches the processes of host session `session` (taken over by another host):
    /// they run on, their output is read and discarded (so a full pipe never blocks
    /// them), their stdin is closed; file reads of the session stop. Their exits go
    /// unreported, and nothing of theirs is written after the takeover marker anyway.
    pub(crate) fn detach_session(&self, session: u64) {
        let mut t = self.lock();
        for (key, credits) in &t.credits {
            if key.session == session {
                credits.close();
            }
        }
        for (key, e) in t.by_id.iter_mut() {
            if key.session == session {
                e.stdin = None;
            }
        }
        let reads: Vec<Key> = t
            .credits
            .keys()
            .filter(|k| k.session == session && !t.by_id.contains_key(k))
            .copied()
            .collect();
        for k in reads {
            t.credits.remove(&k);
        }
    }

    /// Whether any process runs below the agent (a command, or anything it left behind):
    /// the sandbox is not idle.
    pub(crate) fn busy(&self) -> bool {
        !kill::all_descendants().is_empty()
    }

    /// Kills every process but the agent (the deadline, the host went away, or a reset)
    /// and returns how many distinct processes were sent SIGKILL. Repeated while new
    /// ones appear: a process forking as fast as it can is caught in a later round.
    pub(crate) fn kill_everything(&self) -> u32 {
        let mut killed = std::collections::HashSet::new();
        for _ in 0..50 {
            let victims = kill::all_descendants();
            if victims.is_empty() {
                break;
            }
            for pid in victims {
                if let Some(p) = Pid::from_raw(pid as i32)
                    && rustix::process::kill_process(p, Signal::KILL).is_ok()
                {
                    killed.insert(pid);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        u32::try_from(killed.len()).unwrap_or(u32::MAX)
    }
}

/// Reports a spawn that never started the way a shell would (exit 127/126 with the
/// reason on stderr), so callers see the same result as through the engine's exec.
fn not_started(out: &Out, id: u32, spec: &SpawnSpec, code: i32, why: &str) {
    let name = spec.argv.first().map(String::as_str).unwrap_or("");
    let msg = format!("sandbox-agent: {name}: {why}\n");
    let _ = out.send(Frame {
        kind: FrameKind::Stderr,
        id,
        body: msg.into_bytes(),
    });
    let _ = out.send(Frame::control(
        id,
        &Reply::Exit {
            code: Some(code),
            signal: None,
        },
    ));
}

/// The next of a spawn's reserved threads. As many were reserved as the spawn's shape
/// needs (terminal or pipes, stdin or not), so one is always there; PID 1 still never
/// panics over it.
fn take(threads: &mut Vec<Reserved>) -> Reserved {
    threads.pop().unwrap_or_else(Reserved::none)
}

fn start_reader(
    thread: Reserved,
    mut src: impl Read + Send + 'static,
    kind: FrameKind,
    id: u32,
    out: &Out,
    credits: &Arc<Credits>,
    events: &Sender<Event>,
) -> u32 {
    let (out, credits, events) = (out.clone(), credits.clone(), events.clone());
    thread.run(move || {
        let mut buf = vec![0u8; DATA_CHUNK];
        let mut forwarding = true;
        loop {
            // Read, then wait for credit to send: at most one chunk is held here, the
            // rest stays in the pipe and the writing process blocks — the host's memory
            // stays bounded. (Taking credit *before* the read would let an idle stderr
            // reader sit on a chunk of the window shared with stdout.)
            let n = match src.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut sent = 0;
            while forwarding && sent < n {
                let Some(k) = credits.take(n - sent) else {
                    forwarding = false; // exit reported: drain and discard
                    break;
                };
                let body = buf[sent..sent + k].to_vec();
                if out.send(Frame { kind, id, body }).is_err() {
                    forwarding = false;
                    break;
                }
                sent += k;
            }
            if forwarding {
                let _ = events.send(Event::Progress);
            }
        }
        let _ = events.send(Event::ReaderDone);
    });
    1
}

/// The stdin pump. The host keeps at most one window in flight (it waits for acks), so
/// the queue is bounded by the protocol; the ack is sent once bytes reached the pipe.
fn start_stdin(
    thread: Reserved,
    mut dst: impl Write + Send + 'static,
    out: Out,
    id: u32,
) -> Sender<Vec<u8>> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    thread.run(move || {
        while let Ok(data) = rx.recv() {
            if dst.write_all(&data).is_err() {
                break;
            }
            let n = u32::try_from(data.len()).unwrap_or(WINDOW);
            let _ = out.send(Frame::ack(id, n));
        }
        // Dropping `dst` closes the pipe: the process sees end of input.
    });
    tx
}

/// Finds `prog` like `execvp` would, with the PATH the process will get.
fn resolve(prog: &str, env: &[(String, String)]) -> Option<PathBuf> {
    if prog.is_empty() {
        return None;
    }
    if prog.contains('/') {
        return Some(PathBuf::from(prog));
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(prog))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn nonce() -> String {
    let mut b = [0u8; 8];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if ok.is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        b = t.to_le_bytes();
    }
    format!("{}-{:016x}", std::process::id(), u64::from_le_bytes(b))
}
