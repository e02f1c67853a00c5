//! The agent channel straight through the container's conmon, without the API service.
//!
//! Podman's attach endpoint is a relay: the service opens the container's conmon attach
//! socket (a `SOCK_SEQPACKET` socket in the container's bundle directory) and copies
//! between it and the HTTP connection for as long as the attach lasts. An agent sandbox
//! holds its attach for its whole life, so every live sandbox cost the service a
//! connection's goroutines and buffers (0.22 MiB PSS per live sandbox at N = 500 against
//! 0.03 for a plain container, docs/benchmarks.md "Under load"). On a local engine the
//! library can open that socket itself: same bytes, same semantics (conmon closes the
//! container's stdin when an attached client's input ends, exactly as when the service's
//! attach ends), no relay.
//!
//! The socket's protocol (conmon `src/conn_sock.c`): each packet conmon sends is one
//! read of the container's stdout or stderr (at most 8 KiB) behind one byte naming the
//! pipe (2 stdout, 3 stderr); each packet a client sends is written to the container's
//! stdin, and conmon reads a packet into a 32 KiB buffer, so a longer one would be cut.
//! The path can exceed `sun_path`'s 108 bytes, so it is reached through a descriptor of
//! its directory (`/proc/self/fd/N/attach`), as Podman does.

use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures::StreamExt as _;
use futures::stream::BoxStream;
use sandbox_container::{AttachStream, EngineError, EngineErrorKind, EngineResult};
use sandbox_core::OutputChunk;
use socket2::{Domain, SockAddr, SockRef, Socket, Type};
use tokio::net::UnixStream;

/// Largest packet written to conmon: its read buffer (`CONN_SOCK_BUF_SIZE`, 32 KiB since
/// conmon 2.0.1; Debian 12 ships 2.1.6).
const STDIN_PACKET: usize = 32 * 1024;

/// Receive buffer per packet (on the stack, for the read only: what a chunk keeps is
/// its own exact copy, so a parked reader holds nothing). Conmon sends at most 8 KiB + 1;
/// a packet filling this buffer whole may have been cut, which is refused rather than
/// passed on short.
const RECV_BUFFER: usize = 16 * 1024 + 2;

/// The pipe bytes of conmon's packets.
const PIPE_STDOUT: u8 = 2;
const PIPE_STDERR: u8 = 3;

/// Opens the attach socket of the container whose bundle directory is `bundle` (the
/// `StaticDir` of its inspect). Fails without side effect when the socket cannot be
/// reached (another machine's path, no permission, conmon gone): a connection that
/// never opened ends nothing.
pub(crate) async fn attach(bundle: String) -> EngineResult<AttachStream> {
    let socket = tokio::task::spawn_blocking(move || connect(&bundle))
        .await
        .map_err(|e| {
            EngineError::new(
                EngineErrorKind::Other,
                format!("conmon attach: the connecting task failed: {e}"),
            )
        })?
        .map_err(|e| {
            EngineError::new(
                EngineErrorKind::Unavailable,
                format!("conmon attach socket: {e}"),
            )
            .with_source(e)
        })?;
    let fd = Arc::new(register(socket).map_err(|e| {
        EngineError::new(
            EngineErrorKind::Other,
            format!("conmon attach socket: cannot register it with the runtime: {e}"),
        )
        .with_source(e)
    })?);
    Ok(AttachStream {
        output: output(fd.clone()),
        input: Box::pin(Input { fd }),
    })
}

/// Connects to `<bundle>/attach`, blocking (a unix socket connects at once unless the
/// listener's backlog is full; run off the runtime).
fn connect(bundle: &str) -> io::Result<Socket> {
    let dir = std::fs::File::open(bundle)?;
    if !dir.metadata()?.is_dir() {
        return Err(io::Error::other(format!("{bundle} is not a directory")));
    }
    let path = format!(
        "/proc/self/fd/{}/attach",
        std::os::fd::AsRawFd::as_raw_fd(&dir)
    );
    let socket = Socket::new(Domain::UNIX, Type::SEQPACKET, None)?;
    socket.connect(&SockAddr::unix(path)?)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// The connected socket on the runtime's reactor. Tokio has no seqpacket type; its
/// `UnixStream` drives any connected unix socket, and on a seqpacket one each `try_read`
/// is one `recv` of one packet and each `try_write` one `send` of one packet, which is
/// all this module asks of it (no buffering layer sits between).
fn register(socket: Socket) -> io::Result<UnixStream> {
    let std = std::os::unix::net::UnixStream::from(OwnedFd::from(socket));
    std.set_nonblocking(true)?;
    UnixStream::from_std(std)
}

/// The container's output, one chunk per packet; ends when conmon closes the socket.
fn output(fd: Arc<UnixStream>) -> BoxStream<'static, EngineResult<OutputChunk>> {
    futures::stream::unfold(Some(fd), |state| async move {
        let fd = state?;
        loop {
            match recv(&fd).await {
                Ok(None) => return None,
                Ok(Some((pipe, data))) => {
                    let chunk = match pipe {
                        PIPE_STDOUT => OutputChunk::stdout(data),
                        PIPE_STDERR => OutputChunk::stderr(data),
                        // conmon's own pipe numbering has nothing else for output; a
                        // packet naming another is not guessed at.
                        other => {
                            let e = EngineError::new(
                                EngineErrorKind::Other,
                                format!("conmon attach socket: a packet for pipe {other}"),
                            );
                            return Some((Err(e), None));
                        }
                    };
                    if chunk.data.is_empty() {
                        continue;
                    }
                    return Some((Ok(chunk), Some(fd)));
                }
                Err(e) => {
                    let e = EngineError::new(
                        EngineErrorKind::Unavailable,
                        format!("conmon attach socket: {e}"),
                    )
                    .with_source(e);
                    return Some((Err(e), None));
                }
            }
        }
    })
    .boxed()
}

/// One packet: its pipe byte and data; `None` at the end of the stream.
async fn recv(fd: &UnixStream) -> io::Result<Option<(u8, Vec<u8>)>> {
    loop {
        fd.readable().await?;
        let mut buf = [0u8; RECV_BUFFER];
        match fd.try_read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) if n >= RECV_BUFFER => {
                return Err(io::Error::other(format!(
                    "a packet of {RECV_BUFFER} bytes or more (conmon sends at most 8 KiB)"
                )));
            }
            Ok(n) => return Ok(Some((buf[0], buf[1..n].to_vec()))),
            // Not readable after all (the readiness was stale): wait again.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The container's stdin: each write is one packet of at most [`STDIN_PACKET`] bytes.
/// Shutting it down ends this client's input, which makes conmon close the container's
/// stdin (the agent then ends, as when the service's attach ends).
struct Input {
    fd: Arc<UnixStream>,
}

impl tokio::io::AsyncWrite for Input {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = buf.len().min(STDIN_PACKET);
        loop {
            ready!(self.fd.poll_write_ready(cx))?;
            match self.fd.try_write(&buf[..n]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                result => return Poll::Ready(result),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(SockRef::from(&*self.fd).shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use tokio::io::AsyncWriteExt as _;

    /// A stand-in for conmon: a seqpacket listener in a directory whose path is longer
    /// than `sun_path`, answering each packet with it echoed on stdout, then a stderr
    /// packet, and reporting the end of the client's input.
    fn fake_conmon(dir: &std::path::Path) -> std::thread::JoinHandle<Vec<usize>> {
        let listener = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        listener
            .bind(&SockAddr::unix(dir.join("attach")).unwrap())
            .unwrap();
        listener.listen(1).unwrap();
        std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut sizes = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = (&conn).read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                sizes.push(n);
                let mut out = vec![PIPE_STDOUT];
                out.extend_from_slice(&buf[..n.min(8192)]);
                conn.send(&out).unwrap();
            }
            conn.send(&[PIPE_STDERR, b'!']).unwrap();
            sizes
        })
    }

    #[tokio::test]
    async fn packets_go_both_ways_and_input_ends_at_shutdown() {
        let tmp = tempfile::tempdir().unwrap();
        // Longer than the 108 bytes `sun_path` holds, as Podman's bundle paths are.
        let bundle = tmp.path().join("b".repeat(120));
        std::fs::create_dir(&bundle).unwrap();
        // Bind through a short relative name: the listener itself may not exceed it.
        let short = tmp.path().join("s");
        std::os::unix::fs::symlink(&bundle, &short).unwrap();
        let server = fake_conmon(&short);
        let mut stream = attach(bundle.display().to_string()).await.unwrap();
        stream.input.write_all(b"hello").await.unwrap();
        let first = stream.output.next().await.unwrap().unwrap();
        assert_eq!(first, OutputChunk::stdout(b"hello".to_vec()));
        // A write longer than a packet goes as several, none over conmon's buffer.
        stream.input.write_all(&vec![7u8; 80 * 1024]).await.unwrap();
        stream.input.shutdown().await.unwrap();
        let mut got = 0usize;
        let mut stderr = Vec::new();
        while let Some(chunk) = stream.output.next().await {
            let chunk = chunk.unwrap();
            match chunk.stream {
                sandbox_core::StreamKind::Stdout => got += chunk.data.len(),
                _ => stderr.extend_from_slice(&chunk.data),
            }
        }
        assert_eq!(stderr, b"!");
        let sizes = server.join().unwrap();
        assert_eq!(sizes[0], 5);
        assert_eq!(sizes[1..].iter().sum::<usize>(), 80 * 1024);
        assert!(sizes.iter().all(|n| *n <= STDIN_PACKET), "{sizes:?}");
        // The stand-in echoes at most 8 KiB of each packet, as conmon reads its pipes.
        let echoed: usize = sizes[1..].iter().map(|n| (*n).min(8192)).sum();
        assert_eq!(got, echoed);
    }

    #[tokio::test]
    async fn an_unreachable_socket_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let e = match attach(tmp.path().display().to_string()).await {
            Err(e) => e,
            Ok(_) => panic!("no listener: the attach must fail"),
        };
        assert_eq!(e.kind, EngineErrorKind::Unavailable);
        let e = match attach(tmp.path().join("missing").display().to_string()).await {
            Err(e) => e,
            Ok(_) => panic!("no directory: the attach must fail"),
        };
        assert_eq!(e.kind, EngineErrorKind::Unavailable);
    }

    /// A packet longer than conmon ever sends could have been cut by the read: refused,
    /// never delivered short.
    #[tokio::test]
    async fn a_packet_longer_than_conmon_sends_is_refused() {
        let (a, b) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        b.send(&[PIPE_STDOUT, b'a']).unwrap();
        let mut long = vec![b'x'; RECV_BUFFER + 10];
        long[0] = PIPE_STDOUT;
        b.send(&long).unwrap();
        let mut out = output(Arc::new(register(a).unwrap()));
        assert_eq!(
            out.next().await.unwrap().unwrap(),
            OutputChunk::stdout(b"a".to_vec())
        );
        let e = out.next().await.unwrap().unwrap_err();
        assert!(e.to_string().contains("conmon sends at most 8 KiB"), "{e}");
        assert!(out.next().await.is_none());
    }

    #[tokio::test]
    async fn a_packet_for_another_pipe_is_refused() {
        let (a, b) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        b.send(&[9, b'x']).unwrap();
        let mut out = output(Arc::new(register(a).unwrap()));
        let e = out.next().await.unwrap().unwrap_err();
        assert!(e.to_string().contains("pipe 9"), "{e}");
        assert!(out.next().await.is_none());
    }
}
