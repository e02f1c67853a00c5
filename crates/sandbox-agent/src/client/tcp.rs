//! The host end of TCP forwarding ([`AgentClient::tcp_listen`]): the connections accepted
//! on a loopback port inside the sandbox, each as an [`AsyncRead`] + [`AsyncWrite`] stream
//! any host-side service can serve.
//!
//! One task per port routes the agent's frames to connections and sends theirs. Memory is
//! bounded against the code inside the sandbox, which writes every byte that arrives here:
//! a connection buffers at most [`TCP_WINDOW`] bytes its reader has not taken (credit goes
//! back only as the reader takes bytes, and an agent that sends past it resets that
//! connection), and at most [`TCP_MAX_CONNECTIONS`] connections live at once (an agent
//! announcing more has the extra ones closed). Writes wait for the agent's credit, so a
//! sandbox that does not read stalls only its own connection.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use super::{AgentClient, BACKEND, Incoming, Pending, Result, reply_error, unexpected};
use crate::protocol::Frame;
use crate::protocol::{
    FrameKind, Reply, Request, TCP_CHUNK, TCP_FORWARD_VERSION, TCP_MAX_CONNECTIONS, TCP_WINDOW,
    TcpOp, parse_tcp, tcp_body,
};
use sandbox_core::SandboxError;

impl AgentClient {
    /// Listens on `127.0.0.1:port` inside the sandbox (0: any free port) and relays every
    /// connection made to it to the returned [`TcpRelay`] ([`Request::TcpListen`]). An
    /// agent older than [`TCP_FORWARD_VERSION`] has no forwarding: `CapabilityNotSupported`
    /// (`GIT_GATE`, the feature built on it), nothing sent. A port the agent cannot bind is
    /// an engine error naming it.
    pub async fn tcp_listen(&self, port: u16) -> Result<TcpRelay> {
        if self.version < TCP_FORWARD_VERSION {
            return Err(SandboxError::unsupported(
                sandbox_core::Capability::GIT_GATE,
                BACKEND,
            ));
        }
        let listen = Request::TcpListen { port };
        let mut req = self.open(Frame::control(0, &listen), None).await?;
        let timeout = self.shared.opts.call_timeout;
        let port = match req.reply_within(timeout).await? {
            Reply::Listening { port } => port,
            other @ Reply::Error { .. } => {
                return Err(reply_error(other, &format!("127.0.0.1:{port}")));
            }
            other => return Err(unexpected(&other)),
        };
        let (frames_tx, frames_rx) = mpsc::unbounded_channel();
        let (accepted_tx, accepted_rx) = mpsc::channel(TCP_MAX_CONNECTIONS);
        let conns = Arc::new(Mutex::new(HashMap::new()));
        let out = req.shared.out.clone();
        let id = req.id;
        let sandbox = req.shared.sandbox.clone();
        let route = tokio::spawn(route_loop(
            req,
            conns.clone(),
            frames_tx.clone(),
            accepted_tx,
        ));
        let send = tokio::spawn(send_loop(frames_rx, out));
        Ok(TcpRelay {
            port,
            id,
            sandbox,
            accepted: accepted_rx,
            frames: frames_tx,
            tasks: [route, send],
        })
    }
}

/// A forwarded port: [`Self::accept`] yields each connection made to it inside the
/// sandbox. Dropping it closes the port inside (connection 0's close) and resets every
/// connection still open.
pub struct TcpRelay {
    port: u16,
    id: u32,
    sandbox: String,
    accepted: mpsc::Receiver<TcpConn>,
    frames: mpsc::UnboundedSender<Frame>,
    tasks: [tokio::task::JoinHandle<()>; 2],
}

impl std::fmt::Debug for TcpRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpRelay")
            .field("port", &self.port)
            .field("id", &self.id)
            .finish()
    }
}

impl TcpRelay {
    /// The loopback port listening inside the sandbox.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The next connection; `SandboxGone` once the agent's channel ended (or this
    /// session was taken over), after which none comes.
    pub async fn accept(&mut self) -> Result<TcpConn> {
        self.accepted
            .recv()
            .await
            .ok_or_else(|| SandboxError::gone(self.sandbox.clone()))
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        let close = tcp_frame(self.id, 0, TcpOp::Close, &[]);
        let _ = self.frames.send(close);
        // The sender task goes on until it has sent the close (its queue ends with it).
        self.tasks[0].abort();
    }
}

/// State of one connection, shared by the routing task and the stream.
#[derive(Default)]
struct ConnState {
    /// Bytes from the sandbox not yet read, and their count.
    inbound: VecDeque<Bytes>,
    inbound_len: usize,
    /// The sandbox closed its write side.
    eof: bool,
    /// The connection is gone both ways (reset by the sandbox, the agent or the channel).
    reset: bool,
    /// Bytes this side may still send.
    credit: usize,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

impl ConnState {
    fn wake(&mut self) {
        if let Some(w) = self.read_waker.take() {
            w.wake();
        }
        if let Some(w) = self.write_waker.take() {
            w.wake();
        }
    }
}

type Conns = Arc<Mutex<HashMap<u32, Arc<Mutex<ConnState>>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn tcp_frame(id: u32, conn: u32, op: TcpOp, payload: &[u8]) -> Frame {
    Frame {
        kind: FrameKind::Tcp,
        id,
        body: tcp_body(conn, op, payload),
    }
}

/// One connection made inside the sandbox to a forwarded port. Reads return what the
/// code inside wrote (end of stream at its half-close; `ConnectionReset` when it is
/// gone); [`AsyncWrite::poll_shutdown`] half-closes towards it. Dropping it closes the
/// connection.
pub struct TcpConn {
    conn: u32,
    id: u32,
    state: Arc<Mutex<ConnState>>,
    conns: Conns,
    frames: mpsc::UnboundedSender<Frame>,
    shut: bool,
}

impl std::fmt::Debug for TcpConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConn").field("conn", &self.conn).finish()
    }
}

impl TcpConn {
    /// The connection's number, as the agent counts them on its port.
    pub fn number(&self) -> u32 {
        self.conn
    }
}

impl AsyncRead for TcpConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let mut s = lock(&this.state);
        let mut taken = 0usize;
        while buf.remaining() > 0 {
            let Some(front) = s.inbound.front_mut() else {
                break;
            };
            let n = front.len().min(buf.remaining());
            buf.put_slice(&front.split_to(n));
            if front.is_empty() {
                s.inbound.pop_front();
            }
            taken += n;
        }
        if taken > 0 {
            s.inbound_len -= taken;
            drop(s);
            // Credit goes back only for bytes the reader took: the agent never has more
            // than a window outstanding here.
            let credit = (taken as u32).to_be_bytes();
            let _ = this
                .frames
                .send(tcp_frame(this.id, this.conn, TcpOp::Credit, &credit));
            return Poll::Ready(Ok(()));
        }
        if s.reset {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if s.eof {
            return Poll::Ready(Ok(()));
        }
        s.read_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl AsyncWrite for TcpConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.shut {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let mut s = lock(&this.state);
        if s.reset {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if s.credit == 0 {
            s.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = buf.len().min(s.credit).min(TCP_CHUNK);
        s.credit -= n;
        drop(s);
        let sent = this
            .frames
            .send(tcp_frame(this.id, this.conn, TcpOp::Data, &buf[..n]));
        match sent {
            Ok(()) => Poll::Ready(Ok(n)),
            Err(_) => Poll::Ready(Err(io::ErrorKind::ConnectionReset.into())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.shut {
            this.shut = true;
            let _ = this
                .frames
                .send(tcp_frame(this.id, this.conn, TcpOp::Eof, &[]));
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for TcpConn {
    fn drop(&mut self) {
        lock(&self.conns).remove(&self.conn);
        let _ = self
            .frames
            .send(tcp_frame(self.id, self.conn, TcpOp::Close, &[]));
    }
}

/// Sends the port's frames in order; ends when every sender is gone.
async fn send_loop(mut frames: mpsc::UnboundedReceiver<Frame>, out: mpsc::Sender<Frame>) {
    while let Some(f) = frames.recv().await {
        if out.send(f).await.is_err() {
            return;
        }
    }
}

/// Routes the agent's frames for the port to its connections until the channel ends;
/// then every connection is reset.
async fn route_loop(
    mut req: Pending,
    conns: Conns,
    frames: mpsc::UnboundedSender<Frame>,
    accepted: mpsc::Sender<TcpConn>,
) {
    let id = req.id;
    while let Ok(msg) = req.next().await {
        let Incoming::Data(FrameKind::Tcp, body) = msg else {
            continue;
        };
        let Some((conn, op, payload)) = parse_tcp(&body) else {
            continue;
        };
        if op == TcpOp::Open {
            let state = Arc::new(Mutex::new(ConnState {
                credit: TCP_WINDOW as usize,
                ..ConnState::default()
            }));
            let admitted = {
                let mut all = lock(&conns);
                (conn != 0 && all.len() < TCP_MAX_CONNECTIONS && !all.contains_key(&conn))
                    .then(|| all.insert(conn, state.clone()))
                    .is_some()
            };
            if !admitted {
                let _ = frames.send(tcp_frame(id, conn, TcpOp::Close, &[]));
                continue;
            }
            let stream = TcpConn {
                conn,
                id,
                state,
                conns: conns.clone(),
                frames: frames.clone(),
                shut: false,
            };
            // Nobody accepting (the relay is being dropped): the stream's drop closes it.
            let _ = accepted.try_send(stream);
            continue;
        }
        let Some(state) = lock(&conns).get(&conn).cloned() else {
            continue;
        };
        let mut s = lock(&state);
        match op {
            TcpOp::Data => {
                s.inbound_len += payload.len();
                if s.inbound_len > TCP_WINDOW as usize {
                    // Past the credit it was given: that connection is reset, nothing
                    // more is buffered for it.
                    s.inbound.clear();
                    s.inbound_len = 0;
                    s.reset = true;
                    let _ = frames.send(tcp_frame(id, conn, TcpOp::Close, &[]));
                } else {
                    s.inbound.push_back(body.slice(5..));
                }
            }
            TcpOp::Eof => s.eof = true,
            TcpOp::Close => s.reset = true,
            TcpOp::Credit => {
                let n = u32::from_be_bytes(payload.try_into().unwrap_or([0; 4])) as usize;
                // Never above one window, whatever the agent says.
                s.credit = (s.credit + n).min(TCP_WINDOW as usize);
            }
            TcpOp::Open => {}
        }
        s.wake();
    }
    for (_, state) in lock(&conns).iter() {
        let mut s = lock(state);
        s.reset = true;
        s.wake();
    }
}
