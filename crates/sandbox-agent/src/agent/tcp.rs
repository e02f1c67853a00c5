//! TCP forwarding (protocol version 6): a loopback port inside the sandbox whose accepted
//! connections are relayed to the host as byte streams over the agent's channel.
//!
//! The agent only carries bytes: what a connection may ask of the service behind it on
//! the host is the host's to decide. Each connection gets a number, a reader thread
//! (socket → host, sending only within the credit the host returned) and a writer thread
//! (host → socket, returning credit as bytes reach the socket).
//!
//! Bounds, all against code in the sandbox that opens connections or sends without end:
//! at most [`TCP_MAX_CONNECTIONS`] live connections per port (more are closed as soon as
//! they are accepted), and at most [`TCP_WINDOW`] unacknowledged bytes per connection and
//! direction, so neither the host nor the agent buffers more than that per connection.
//! Bytes the host sends beyond the credit it was given close the connection. A takeover
//! closes the session's ports and their connections, whose other end was the host that
//! was shut out.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::spawn::Key;
use super::{Credits, Out};
use crate::protocol::{
    Frame, FrameKind, TCP_CHUNK, TCP_MAX_CONNECTIONS, TCP_WINDOW, TcpOp, parse_tcp, tcp_body,
};

/// Every forwarded port of the agent, by the (session, request id) that opened it.
#[derive(Clone, Default)]
pub(crate) struct Ports {
    inner: Arc<Mutex<HashMap<Key, Arc<Port>>>>,
}

/// One listening port and its connections.
struct Port {
    addr: SocketAddr,
    closed: AtomicBool,
    conns: Mutex<HashMap<u32, Arc<Conn>>>,
    next_conn: AtomicU32,
    /// Signalled by the accept thread once it ended and the socket is closed.
    ended: Mutex<Option<Receiver<()>>>,
}

/// What the writer thread of a connection is handed.
enum ToSocket {
    Data(Vec<u8>),
    Eof,
}

struct Conn {
    /// A handle on the stream, to shut it from outside its threads.
    stream: TcpStream,
    /// Socket → host: what the host still takes.
    credit: Arc<Credits>,
    /// Host → socket: the writer thread's queue, and the bytes in it.
    to_socket: Mutex<Option<Sender<ToSocket>>>,
    queued: AtomicU32,
    /// Threads of this connection still running (reader, writer); the last one out
    /// removes the connection.
    running: AtomicU8,
}

impl Conn {
    /// The host is done with the connection: what it sent still reaches the socket, then
    /// its write side is shut; nothing more is read from it.
    fn close_gracefully(&self) {
        if let Some(tx) = self
            .to_socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = tx.send(ToSocket::Eof);
        }
        self.credit.close();
        let _ = self.stream.shutdown(Shutdown::Read);
    }

    /// Shuts the connection both ways and ends both threads.
    fn close(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        self.credit.close();
        self.to_socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }
}

impl Ports {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Port>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Binds `127.0.0.1:port`, answers `listening` with the port bound, then accepts:
    /// events go out on `out` under `key.id`, never before the answer.
    pub(crate) fn listen(
        &self,
        key: Key,
        port: u16,
        out: &Out,
        listening: impl FnOnce(u16),
    ) -> io::Result<()> {
        if self.lock().contains_key(&key) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "this request already listens",
            ));
        }
        let socket = TcpListener::bind(("127.0.0.1", port))?;
        let addr = socket.local_addr()?;
        let p = Arc::new(Port {
            addr,
            closed: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU32::new(1),
            ended: Mutex::new(None),
        });
        let (ended_tx, ended_rx) = mpsc::channel();
        *p.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(ended_rx);
        let accepting = p.clone();
        let out = out.clone();
        let id = key.id;
        // Parked until the answer is queued: a connection accepted first could otherwise
        // announce itself ahead of it.
        let (go, wait) = mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("tcp-forward".into())
            .spawn(move || {
                if wait.recv().is_ok() {
                    accept_loop(socket, accepting, out, id);
                }
                let _ = ended_tx.send(());
            })?;
        self.lock().insert(key, p);
        listening(addr.port());
        let _ = go.send(());
        Ok(())
    }

    /// Handles a [`FrameKind::Tcp`] frame from the host. A malformed body, or one for a
    /// connection that is gone, is dropped: the host is trusted, a stale frame is not an
    /// error.
    pub(crate) fn host_frame(&self, key: Key, body: &[u8]) {
        let Some(port) = self.lock().get(&key).cloned() else {
            return;
        };
        let Some((conn, op, payload)) = parse_tcp(body) else {
            return;
        };
        if conn == 0 {
            if op == TcpOp::Close {
                self.lock().remove(&key);
                port.close();
            }
            return;
        }
        let Some(c) = port
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&conn)
            .cloned()
        else {
            return;
        };
        match op {
            TcpOp::Data => {
                let n = payload.len() as u32;
                let queued = c.queued.fetch_add(n, Ordering::SeqCst) + n;
                let sent = queued <= TCP_WINDOW
                    && c.to_socket
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_ref()
                        .is_some_and(|tx| tx.send(ToSocket::Data(payload.to_vec())).is_ok());
                // Beyond its credit the host broke the protocol: the connection ends
                // rather than the agent buffering without bound.
                if !sent {
                    c.close();
                }
            }
            TcpOp::Eof => {
                if let Some(tx) = c.to_socket.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    let _ = tx.send(ToSocket::Eof);
                }
            }
            TcpOp::Close => c.close_gracefully(),
            TcpOp::Credit => {
                let n = u32::from_be_bytes(payload.try_into().unwrap_or([0; 4]));
                c.credit.give(n);
            }
            TcpOp::Open => {}
        }
    }

    /// Closes every port of `session` and its connections.
    pub(crate) fn close_session(&self, session: u64) {
        let closing: Vec<Arc<Port>> = {
            let mut all = self.lock();
            let keys: Vec<Key> = all
                .keys()
                .filter(|k| k.session == session)
                .copied()
                .collect();
            keys.iter().filter_map(|k| all.remove(k)).collect()
        };
        for p in closing {
            p.close();
        }
    }
}

impl Port {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `closed` and ends (dropping the socket);
        // waited for, so the port no longer accepts when this returns.
        let _ = TcpStream::connect(self.addr);
        if let Some(ended) = self.ended.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = ended.recv_timeout(std::time::Duration::from_secs(1));
        }
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, c) in conns {
            c.close();
        }
    }

    /// Called by each thread of connection `conn` as it ends; the last removes it.
    fn thread_done(&self, conn: u32, c: &Conn) {
        if c.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&conn);
        }
    }
}

fn accept_loop(socket: TcpListener, port: Arc<Port>, out: Out, id: u32) {
    for stream in socket.incoming() {
        if port.closed.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = port.next_conn.fetch_add(1, Ordering::Relaxed).max(1);
        let (tx, rx) = mpsc::channel();
        let c = {
            let mut conns = port.conns.lock().unwrap_or_else(|e| e.into_inner());
            // Over the bound the connection is simply dropped (closed): the client sees
            // the end of the stream, as from a server that went away.
            if conns.len() >= TCP_MAX_CONNECTIONS {
                continue;
            }
            let Ok(handle) = stream.try_clone() else {
                continue;
            };
            let c = Arc::new(Conn {
                stream: handle,
                credit: Credits::with_window(TCP_WINDOW),
                to_socket: Mutex::new(Some(tx)),
                queued: AtomicU32::new(0),
                running: AtomicU8::new(2),
            });
            conns.insert(conn, c.clone());
            c
        };
        // Closed while this one was being accepted: the close did not see it.
        if port.closed.load(Ordering::SeqCst) {
            c.close();
            return;
        }
        if out.send(tcp_frame(id, conn, TcpOp::Open, &[])).is_err() {
            return;
        }
        spawn_side(&port, &c, conn, "tcp-write", stream.try_clone(), {
            let (c, out) = (c.clone(), out.clone());
            move |s| write_side(s, rx, &c, &out, id, conn)
        });
        spawn_side(&port, &c, conn, "tcp-read", Ok(stream), {
            let (c, out) = (c.clone(), out.clone());
            move |s| read_side(s, &c, &out, id, conn)
        });
    }
}

/// Starts one thread of connection `conn` on `stream`. Without a thread (the pids limit)
/// or a stream handle the connection ends and the agent goes on.
fn spawn_side(
    port: &Arc<Port>,
    c: &Arc<Conn>,
    conn: u32,
    name: &str,
    stream: io::Result<TcpStream>,
    side: impl FnOnce(TcpStream) + Send + 'static,
) {
    let (p, c2) = (port.clone(), c.clone());
    let started = stream.and_then(|s| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                side(s);
                p.thread_done(conn, &c2);
            })
            .map(|_| ())
    });
    if started.is_err() {
        c.close();
        port.thread_done(conn, c);
    }
}

fn tcp_frame(id: u32, conn: u32, op: TcpOp, payload: &[u8]) -> Frame {
    Frame {
        kind: FrameKind::Tcp,
        id,
        body: tcp_body(conn, op, payload),
    }
}

/// Socket → host, within the host's credit. At the socket's end the host gets an
/// [`TcpOp::Eof`] (the host may still write); on an error, or when the connection was
/// closed, a [`TcpOp::Close`].
fn read_side(mut s: TcpStream, c: &Conn, out: &Out, id: u32, conn: u32) {
    let mut buf = vec![0u8; TCP_CHUNK];
    loop {
        let Some(n) = c.credit.take(TCP_CHUNK) else {
            // Closed by the host or the port: the host knows.
            return;
        };
        let read = loop {
            match s.read(&mut buf[..n]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => break r,
            }
        };
        match read {
            Ok(0) => {
                c.credit.give(n as u32);
                let _ = out.send(tcp_frame(id, conn, TcpOp::Eof, &[]));
                return;
            }
            Ok(got) => {
                c.credit.give((n - got) as u32);
                if out
                    .send(tcp_frame(id, conn, TcpOp::Data, &buf[..got]))
                    .is_err()
                {
                    return;
                }
            }
            Err(_) => {
                c.close();
                let _ = out.send(tcp_frame(id, conn, TcpOp::Close, &[]));
                return;
            }
        }
    }
}

/// Host → socket; credit goes back to the host as bytes reach the socket. The host's
/// [`TcpOp::Eof`] shuts the socket's write side; a broken socket closes the connection.
fn write_side(mut s: TcpStream, rx: Receiver<ToSocket>, c: &Conn, out: &Out, id: u32, conn: u32) {
    while let Ok(item) = rx.recv() {
        match item {
            ToSocket::Data(bytes) => {
                if s.write_all(&bytes).is_err() {
                    c.close();
                    let _ = out.send(tcp_frame(id, conn, TcpOp::Close, &[]));
                    return;
                }
                let n = bytes.len() as u32;
                c.queued.fetch_sub(n, Ordering::SeqCst);
                if out
                    .send(tcp_frame(id, conn, TcpOp::Credit, &n.to_be_bytes()))
                    .is_err()
                {
                    return;
                }
            }
            ToSocket::Eof => {
                let _ = s.shutdown(Shutdown::Write);
                return;
            }
        }
    }
}

/// Whether a port of `ports` listens on `port` (for tests).
#[cfg(test)]
fn listens_on(ports: &Ports, port: u16) -> bool {
    ports.lock().values().any(|p| p.addr.port() == port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::Outgoing;

    fn frames(rx: &mpsc::Receiver<Outgoing>) -> impl Iterator<Item = Frame> + '_ {
        std::iter::from_fn(move || {
            match rx.recv_timeout(std::time::Duration::from_secs(5)).ok()? {
                Outgoing::Frame(_, f) => Some(f),
                Outgoing::Takeover(..) => None,
            }
        })
    }

    fn listening() -> (Ports, Key, u16, mpsc::Receiver<Outgoing>, Out) {
        let (tx, rx) = mpsc::sync_channel(1024);
        let out = Out::new(tx, 3);
        let ports = Ports::default();
        let key = Key { session: 3, id: 9 };
        let mut bound = 0;
        ports.listen(key, 0, &out, |p| bound = p).unwrap();
        assert!(listens_on(&ports, bound));
        (ports, key, bound, rx, out)
    }

    #[test]
    fn bytes_flow_both_ways_with_half_close_and_credit() {
        let (ports, key, port, rx, _out) = listening();
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut it = frames(&rx);
        let f = it.next().unwrap();
        assert_eq!(f.kind, FrameKind::Tcp);
        assert_eq!(f.id, 9);
        let (conn, op, _) = parse_tcp(&f.body).unwrap();
        assert_eq!(op, TcpOp::Open);
        client.write_all(b"hello").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut got = Vec::new();
        loop {
            let f = it.next().unwrap();
            let (c, op, payload) = parse_tcp(&f.body).unwrap();
            assert_eq!(c, conn);
            match op {
                TcpOp::Data => got.extend_from_slice(payload),
                TcpOp::Eof => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(got, b"hello");
        // The other direction is still open after the client's half-close.
        ports.host_frame(key, &tcp_body(conn, TcpOp::Data, b"world"));
        let f = it.next().unwrap();
        assert_eq!(
            parse_tcp(&f.body).unwrap(),
            (conn, TcpOp::Credit, &5u32.to_be_bytes()[..])
        );
        ports.host_frame(key, &tcp_body(conn, TcpOp::Eof, &[]));
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).unwrap();
        assert_eq!(answer, b"world");
    }

    #[test]
    fn the_sandbox_cannot_send_past_its_credit() {
        let (ports, key, port, rx, _out) = listening();
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut it = frames(&rx);
        let (conn, _, _) = parse_tcp(&it.next().unwrap().body).unwrap();
        // Four windows written by the code inside; the host returns no credit.
        let writer = std::thread::spawn(move || {
            let data = vec![7u8; 4 * TCP_WINDOW as usize];
            let _ = client.write_all(&data);
            client
        });
        let mut sent = 0usize;
        while let Ok(Outgoing::Frame(_, f)) = rx.recv_timeout(std::time::Duration::from_millis(500))
        {
            let (_, op, payload) = parse_tcp(&f.body).unwrap();
            assert_eq!(op, TcpOp::Data);
            sent += payload.len();
        }
        assert_eq!(
            sent, TCP_WINDOW as usize,
            "exactly one window without credit"
        );
        ports.host_frame(key, &tcp_body(conn, TcpOp::Credit, &100u32.to_be_bytes()));
        let mut more = 0usize;
        while let Ok(Outgoing::Frame(_, f)) = rx.recv_timeout(std::time::Duration::from_millis(500))
        {
            more += parse_tcp(&f.body).unwrap().2.len();
        }
        assert_eq!(more, 100, "then exactly the credit returned");
        ports.host_frame(key, &tcp_body(conn, TcpOp::Close, &[]));
        drop(writer.join());
    }

    #[test]
    fn connections_past_the_bound_are_closed_at_once() {
        let (ports, _key, port, rx, _out) = listening();
        let mut held = Vec::new();
        for _ in 0..TCP_MAX_CONNECTIONS {
            held.push(TcpStream::connect(("127.0.0.1", port)).unwrap());
        }
        let mut it = frames(&rx);
        for _ in 0..TCP_MAX_CONNECTIONS {
            assert_eq!(parse_tcp(&it.next().unwrap().body).unwrap().1, TcpOp::Open);
        }
        let mut extra = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(extra.read(&mut b).unwrap_or(0), 0, "closed unserved");
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "no open announced past the bound"
        );
        ports.close_session(3);
        assert!(!listens_on(&ports, port));
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port closed"
        );
        for mut h in held {
            let mut rest = Vec::new();
            let _ = h.read_to_end(&mut rest);
        }
    }

    #[test]
    fn the_host_closes_the_port_with_connection_zero() {
        let (ports, key, port, _rx, _out) = listening();
        ports.host_frame(key, &tcp_body(0, TcpOp::Close, &[]));
        assert!(!listens_on(&ports, port));
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    }
}
