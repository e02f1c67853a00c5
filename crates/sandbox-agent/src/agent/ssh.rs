//! The ssh-agent relay socket (protocol version 5): a unix socket inside the sandbox whose
//! connections' ssh-agent messages go to the host over the agent's channel and whose
//! answers come back from it.
//!
//! The agent only frames: it reads a message's 4-byte length, refuses one above
//! [`SSH_AGENT_MAX_MESSAGE`] (or empty) by closing that connection before reading a byte
//! of its body, and passes the message to the host unchanged. What a message may ask (list
//! the selected keys, sign with one of them, nothing else) is decided on the host, which
//! holds the keys' agent; nothing here is trusted with a decision.
//!
//! Bounds, all against code in the sandbox that opens connections without end: at most
//! [`MAX_CONNECTIONS`] live connections per listener (more are closed at once), one
//! message in flight per connection (ssh-agent is request/answer), and at most
//! [`MAX_IN_FLIGHT`] messages in flight per listener, so what the host may have to buffer
//! stays below one flow-control window whatever the sandbox does. A takeover closes the
//! session's listeners: the socket is removed and every connection is shut, since their
//! answers could only come from the host that was shut out.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};

use super::Out;
use super::spawn::Key;
use crate::protocol::{Frame, FrameKind, SSH_AGENT_MAX_MESSAGE};

/// Live connections per listener; further ones are closed as soon as they are accepted.
pub(crate) const MAX_CONNECTIONS: usize = 8;

/// Messages of one listener waiting for the host's answer. Three of the largest messages
/// (with their frame's `conn` prefix) stay below the host's flow-control window of 1 MiB.
pub(crate) const MAX_IN_FLIGHT: u32 = 3;

/// Every listener of the agent, by the (session, request id) that opened it.
#[derive(Clone, Default)]
pub(crate) struct Listeners {
    inner: Arc<Mutex<HashMap<Key, Arc<Listener>>>>,
}

/// One listening socket and its connections.
struct Listener {
    path: PathBuf,
    closed: AtomicBool,
    /// Answer routes of live connections, by connection number.
    conns: Mutex<HashMap<u32, Conn>>,
    next_conn: AtomicU32,
    in_flight: Mutex<u32>,
    slot_freed: Condvar,
}

struct Conn {
    answers: SyncSender<Vec<u8>>,
    /// A second handle on the stream, to shut it when the listener closes.
    stream: UnixStream,
}

impl Listeners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Listener>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Binds the socket at `path` (its directory created, a stale socket replaced),
    /// answers `done`, then starts accepting: messages go out on `out` under `key.id`,
    /// never before the answer (the host takes nothing but the answer until it has it).
    pub(crate) fn listen(
        &self,
        key: Key,
        path: &str,
        out: &Out,
        done: impl FnOnce(),
    ) -> io::Result<()> {
        let path = PathBuf::from(path);
        if !path.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the socket path must be absolute",
            ));
        }
        if self.lock().contains_key(&key) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "this request already listens",
            ));
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // Only a socket is replaced: a file or directory there is the sandbox's, and an
        // error says so instead of deleting it.
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "something other than a socket is at the path",
                ));
            }
            std::fs::remove_file(&path)?;
        }
        let socket = UnixListener::bind(&path)?;
        // Every user in the sandbox may use it: they are all the same untrusted code, and
        // the host decides what any of them may ask.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))?;
        let listener = Arc::new(Listener {
            path,
            closed: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU32::new(1),
            in_flight: Mutex::new(0),
            slot_freed: Condvar::new(),
        });
        let accepting = listener.clone();
        let out = out.clone();
        let id = key.id;
        // Parked until the answer is queued: a connection accepted first could otherwise
        // send its message ahead of it.
        let (go, wait) = mpsc::sync_channel::<()>(1);
        let started = std::thread::Builder::new()
            .name("ssh-agent".into())
            .spawn(move || {
                if wait.recv().is_ok() {
                    accept_loop(socket, accepting, out, id);
                }
            });
        if let Err(e) = started {
            let _ = std::fs::remove_file(&listener.path);
            return Err(e);
        }
        self.lock().insert(key, listener);
        done();
        let _ = go.send(());
        Ok(())
    }

    /// Hands the host's answer in `body` (`conn` + message) to its connection. An answer
    /// for no live connection (one that closed meanwhile) is dropped.
    pub(crate) fn answer(&self, key: Key, body: &[u8]) {
        let Some(listener) = self.lock().get(&key).cloned() else {
            return;
        };
        let Some((conn, message)) = split(body) else {
            return;
        };
        let conns = listener.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = conns.get(&conn) {
            // One message in flight per connection: the slot is free unless the host
            // answered twice, and a second answer is dropped.
            let _ = c.answers.try_send(message.to_vec());
        }
    }

    /// Closes every listener of `session`: sockets removed, connections shut.
    pub(crate) fn close_session(&self, session: u64) {
        let closing: Vec<Arc<Listener>> = {
            let mut all = self.lock();
            let keys: Vec<Key> = all
                .keys()
                .filter(|k| k.session == session)
                .copied()
                .collect();
            keys.iter().filter_map(|k| all.remove(k)).collect()
        };
        for l in closing {
            l.close();
        }
    }
}

impl Listener {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `closed` and ends.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, c) in conns {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        self.slot_freed.notify_all();
    }

    /// Waits for a message slot; `false` once the listener closed.
    fn take_slot(&self) -> bool {
        let mut n = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return false;
            }
            if *n < MAX_IN_FLIGHT {
                *n += 1;
                return true;
            }
            n = self.slot_freed.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn free_slot(&self) {
        let mut n = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        self.slot_freed.notify_one();
    }
}

/// `conn` and the message of a [`FrameKind::SshAgent`] body.
pub(crate) fn split(body: &[u8]) -> Option<(u32, &[u8])> {
    let (head, message) = body.split_at_checked(4)?;
    let conn = u32::from_be_bytes(head.try_into().ok()?);
    Some((conn, message))
}

fn accept_loop(socket: UnixListener, listener: Arc<Listener>, out: Out, id: u32) {
    for stream in socket.incoming() {
        if listener.closed.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else {
            continue;
        };
        let (tx, rx) = mpsc::sync_channel(1);
        let conn = listener.next_conn.fetch_add(1, Ordering::Relaxed);
        {
            let mut conns = listener.conns.lock().unwrap_or_else(|e| e.into_inner());
            let Ok(second) = stream.try_clone() else {
                continue;
            };
            // Over the bound the connection is simply dropped (closed): the client sees
            // the end of the stream, as from an agent that went away.
            if conns.len() >= MAX_CONNECTIONS {
                continue;
            }
            conns.insert(
                conn,
                Conn {
                    answers: tx,
                    stream: second,
                },
            );
        }
        let serving = listener.clone();
        let out = out.clone();
        let started = std::thread::Builder::new()
            .name("ssh-agent-conn".into())
            .spawn(move || {
                serve_conn(stream, rx, &serving, &out, id, conn);
                serving
                    .conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&conn);
            });
        // No thread (the pids limit): the connection is closed, the agent goes on.
        if started.is_err() {
            listener
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&conn);
        }
    }
}

/// Relays one connection's messages until it ends, breaks a bound, or the listener closes.
fn serve_conn(
    mut stream: UnixStream,
    answers: Receiver<Vec<u8>>,
    listener: &Listener,
    out: &Out,
    id: u32,
    conn: u32,
) {
    loop {
        let Ok(Some(message)) = read_message(&mut stream) else {
            return;
        };
        if !listener.take_slot() {
            return;
        }
        let mut body = Vec::with_capacity(4 + message.len());
        body.extend_from_slice(&conn.to_be_bytes());
        body.extend_from_slice(&message);
        let sent = out.send(Frame {
            kind: FrameKind::SshAgent,
            id,
            body,
        });
        let answer = sent.ok().and_then(|()| answers.recv().ok());
        listener.free_slot();
        let Some(answer) = answer.filter(|a| !a.is_empty() && a.len() <= SSH_AGENT_MAX_MESSAGE)
        else {
            return;
        };
        let mut framed = Vec::with_capacity(4 + answer.len());
        framed.extend_from_slice(&(answer.len() as u32).to_be_bytes());
        framed.extend_from_slice(&answer);
        if stream.write_all(&framed).is_err() {
            return;
        }
    }
}

/// One message from the connection: `Ok(None)` at its end, an error for a length that is
/// zero or above the cap (checked before any body byte is read) or a broken stream.
pub(crate) fn read_message<R: Read>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > SSH_AGENT_MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "ssh-agent message length out of bounds",
        ));
    }
    let mut message = vec![0u8; len];
    r.read_exact(&mut message)?;
    Ok(Some(message))
}

/// Whether `path` is where a listener of this agent listens (for tests).
#[cfg(test)]
fn listens_at(l: &Listeners, path: &std::path::Path) -> bool {
    l.lock().values().any(|x| x.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_above_the_cap_is_refused_before_its_body() {
        // A reader that would hand out a gibibyte: the refusal must come from the length.
        struct Endless(usize);
        impl Read for Endless {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    let n = buf.len().min(4);
                    buf[..n].copy_from_slice(&(1u32 << 30).to_be_bytes()[..n]);
                    self.0 += n;
                    return Ok(n);
                }
                self.0 += buf.len();
                Ok(buf.len())
            }
        }
        let mut r = Endless(0);
        let e = read_message(&mut r).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(r.0, 4, "no body byte read");
        let mut zero = io::Cursor::new(vec![0, 0, 0, 0]);
        assert!(read_message(&mut zero).is_err());
        let mut ok = io::Cursor::new(vec![0, 0, 0, 1, 11]);
        assert_eq!(read_message(&mut ok).unwrap(), Some(vec![11]));
        let mut end = io::Cursor::new(Vec::new());
        assert_eq!(read_message(&mut end).unwrap(), None);
        let mut cut = io::Cursor::new(vec![0, 0, 0, 9, 11]);
        assert!(read_message(&mut cut).is_err());
    }

    #[test]
    fn split_needs_a_connection_number() {
        assert_eq!(split(&[0, 0, 0, 7, 5]), Some((7, &[5u8][..])));
        assert_eq!(split(&[0, 0, 7]), None);
    }

    #[test]
    fn a_closed_session_removes_its_socket() {
        let dir = std::env::temp_dir().join(format!("sbx-ssh-{}", std::process::id()));
        let path = dir.join("agent.sock");
        let (tx, _rx) = mpsc::sync_channel(4);
        let out = Out::new(tx, 3);
        let l = Listeners::default();
        let key = Key { session: 3, id: 9 };
        l.listen(key, path.to_str().unwrap(), &out, || {}).unwrap();
        assert!(listens_at(&l, &path));
        assert!(UnixStream::connect(&path).is_ok());
        l.close_session(2);
        assert!(path.exists(), "another session's close leaves it");
        l.close_session(3);
        assert!(!path.exists());
        assert!(!listens_at(&l, &path));
        let _ = std::fs::remove_dir_all(dir);
    }
}
