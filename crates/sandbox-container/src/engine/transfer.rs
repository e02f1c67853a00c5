//! Bounds on the streams and calls of an engine, written once for every engine: a
//! download that stalls, an upload the engine stops reading (both applied by the container
//! layer to every engine's archive transfers), a call that never answers, a client library
//! that panics while decoding; and the engines' multiplexed stream format for clients that
//! hand over the raw connection.
//!
//! A stream is bounded per chunk, never in total: a large archive on a slow disk is not a
//! wedged engine, a chunk that never comes is. Time the consumer spends elsewhere is not
//! the engine's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use sandbox_core::OutputChunk;

use crate::engine::{ArchiveBody, EngineError, EngineErrorKind, EngineResult};

/// A download body whose every chunk must arrive within `limit` of the consumer asking
/// for it; a stall ends the stream with one `TimedOut` error. One timer, re-armed when
/// the consumer next waits (a chunk is a few KiB: a new timer per chunk would cost more
/// than the copy).
pub fn idle_bounded(body: ArchiveBody, limit: Duration) -> ArchiveBody {
    Box::pin(IdleBounded {
        body: Some(body),
        idle: Box::pin(tokio::time::sleep(limit)),
        limit,
        rearm: true,
    })
}

struct IdleBounded {
    body: Option<ArchiveBody>,
    idle: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
    /// A chunk was delivered since the timer was last armed.
    rearm: bool,
}

impl Stream for IdleBounded {
    type Item = std::io::Result<Bytes>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        match body.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(b))) => {
                this.rearm = true;
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(other) => {
                this.body = None;
                Poll::Ready(other)
            }
            Poll::Pending => {
                if std::mem::take(&mut this.rearm) {
                    let next = tokio::time::Instant::now() + this.limit;
                    this.idle.as_mut().reset(next);
                }
                match this.idle.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.body = None;
                        Poll::Ready(Some(Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("the engine sent nothing for {:?}", this.limit),
                        ))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// Upload progress: when the engine last asked for the body, and whether it then waited
/// on our source (a slow source is not a wedged engine).
struct Progress {
    start: Instant,
    last_poll_ms: AtomicU64,
    waiting_on_source: AtomicBool,
}

impl Progress {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

struct Watched {
    inner: ArchiveBody,
    progress: Arc<Progress>,
}

impl Stream for Watched {
    type Item = std::io::Result<Bytes>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let p = self.progress.clone();
        p.last_poll_ms.store(p.now_ms(), Ordering::Relaxed);
        let r = self.inner.as_mut().poll_next(cx);
        p.waiting_on_source.store(r.is_pending(), Ordering::Relaxed);
        r
    }
}

/// Runs `send` (the engine's upload of the body it is given) and fails it with
/// `Timeout` once the engine has not asked for the next chunk for `limit` while one was
/// ready. A panic inside `send` (a client library's decoder) becomes an error.
pub async fn bounded_upload<F, Fut>(
    what: &str,
    body: ArchiveBody,
    limit: Duration,
    send: F,
) -> EngineResult<()>
where
    F: FnOnce(ArchiveBody) -> Fut,
    Fut: Future<Output = EngineResult<()>>,
{
    let progress = Arc::new(Progress {
        start: Instant::now(),
        last_poll_ms: AtomicU64::new(0),
        waiting_on_source: AtomicBool::new(false),
    });
    let watched = Box::pin(Watched {
        inner: body,
        progress: progress.clone(),
    });
    let put = std::panic::AssertUnwindSafe(send(watched)).catch_unwind();
    tokio::pin!(put);
    let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
    let tick = (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        tokio::select! {
            r = &mut put => return r.unwrap_or_else(|_| Err(panicked(what))),
            _ = tokio::time::sleep(tick) => {
                let last = progress.last_poll_ms.load(Ordering::Relaxed);
                let idle = progress.now_ms().saturating_sub(last);
                if !progress.waiting_on_source.load(Ordering::Relaxed) && idle > limit_ms {
                    return Err(EngineError::new(
                        EngineErrorKind::Timeout,
                        format!("{what}: the engine made no progress for {limit:?}"),
                    ));
                }
            }
        }
    }
}

/// Runs one engine call bounded by `limit`, with a panic inside the client library turned
/// into an error (podman-api's frame decoder panics on unexpected frames). A wedged
/// engine fails the call with [`EngineErrorKind::Timeout`] instead of hanging the caller.
pub async fn bounded_call<T, F>(what: &str, limit: Duration, fut: F) -> EngineResult<T>
where
    F: Future<Output = EngineResult<T>>,
{
    match tokio::time::timeout(limit, std::panic::AssertUnwindSafe(fut).catch_unwind()).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(panicked(what)),
        Err(_) => Err(EngineError::new(
            EngineErrorKind::Timeout,
            format!("{what}: the engine did not answer within {limit:?}"),
        )),
    }
}

/// The error a panic inside an engine client library becomes (logged: it is a client
/// library's bug, not the engine's answer).
pub fn panicked(what: &str) -> EngineError {
    tracing::error!(
        operation = what,
        "the engine client panicked; mapped to an engine error"
    );
    EngineError::new(
        EngineErrorKind::Other,
        format!("{what}: the engine client panicked on an unexpected answer"),
    )
}

/// Wraps a stream so a panic while polling it (a client library's frame decoder) becomes
/// one error item, after which the stream ends.
pub fn unwind_safe<S, T>(what: &'static str, stream: S) -> BoxStream<'static, EngineResult<T>>
where
    S: Stream<Item = EngineResult<T>> + Send + 'static,
    T: Send + 'static,
{
    let mut done = false;
    std::panic::AssertUnwindSafe(stream)
        .catch_unwind()
        .map(move |item| item.unwrap_or_else(|_| Err(panicked(what))))
        .take_while(move |r| {
            let keep = !done;
            done |= r.is_err();
            futures::future::ready(keep)
        })
        .boxed()
}

/// Largest frame accepted from a multiplexed stream. Engines frame what they read from a
/// container's pipes in buffers far smaller than this; a larger header is a broken
/// stream, refused before anything is buffered.
pub const MAX_FRAME: usize = 4 << 20;

/// Reads an engine's multiplexed attach or exec stream (no TTY): frames of an 8-byte
/// header — stream (0 stdin, 1 stdout, 2 stderr), three zero bytes, u32 BE length — and
/// the data. Echoed stdin is dropped; a broken frame ends the stream with one error. A
/// read error is `Unavailable` with the I/O error itself as its source, so the container
/// layer can tell the engine's reset of the connection from other failures.
pub fn demultiplex<R>(reader: R) -> BoxStream<'static, EngineResult<OutputChunk>>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    use tokio::io::AsyncReadExt as _;
    let broken = |why: String| {
        EngineError::new(EngineErrorKind::Other, format!("multiplexed output: {why}"))
    };
    let failed = |e: std::io::Error| {
        EngineError::new(
            EngineErrorKind::Unavailable,
            format!("multiplexed output: {e}"),
        )
        .with_source(e)
    };
    futures::stream::unfold(Some(reader), move |state| async move {
        let mut r = state?;
        loop {
            let mut header = [0u8; 8];
            match r.read_exact(&mut header).await {
                Ok(_) => {}
                // The end of the stream between frames is the end of the container's output.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
                Err(e) => return Some((Err(failed(e)), None)),
            }
            let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
            if len > MAX_FRAME {
                return Some((Err(broken(format!("a frame of {len} bytes"))), None));
            }
            let mut data = vec![0u8; len];
            match r.read_exact(&mut data).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Some((Err(broken(format!("truncated frame: {e}"))), None));
                }
                Err(e) => return Some((Err(failed(e)), None)),
            }
            let chunk = match header[0] {
                1 => OutputChunk::stdout(Bytes::from(data)),
                2 => OutputChunk::stderr(Bytes::from(data)),
                0 => continue,
                other => return Some((Err(broken(format!("unknown stream {other}"))), None)),
            };
            return Some((Ok(chunk), Some(r)));
        }
    })
    .boxed()
}

/// How long an engine's first answer (the ping when an adapter connects) may take. An
/// engine that accepts connections and never answers (a wedged daemon) must fail a
/// `create` in seconds, not after the full per-call bound.
pub const FIRST_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Bounds one engine call by `limit`.
pub async fn bounded<T>(
    limit: Duration,
    op: &str,
    fut: impl Future<Output = EngineResult<T>>,
) -> EngineResult<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(EngineError::new(
            EngineErrorKind::Timeout,
            format!("{op} did not answer within {limit:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(stream: u8, data: &[u8]) -> Vec<u8> {
        let mut f = vec![stream, 0, 0, 0];
        f.extend_from_slice(&(data.len() as u32).to_be_bytes());
        f.extend_from_slice(data);
        f
    }

    async fn demuxed(bytes: Vec<u8>) -> Vec<EngineResult<OutputChunk>> {
        demultiplex(std::io::Cursor::new(bytes)).collect().await
    }

    #[tokio::test]
    async fn frames_are_split_by_stream() {
        let mut b = frame(1, b"out");
        b.extend(frame(0, b"echoed stdin is dropped"));
        b.extend(frame(2, b"err"));
        b.extend(frame(1, b""));
        let got: Vec<_> = demuxed(b).await.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            got,
            vec![
                OutputChunk::stdout(Bytes::from_static(b"out")),
                OutputChunk::stderr(Bytes::from_static(b"err")),
                OutputChunk::stdout(Bytes::new()),
            ]
        );
    }

    /// A header announcing more than the cap is refused before anything is allocated,
    /// and so are a truncated frame and an unknown stream; each ends the stream.
    #[tokio::test]
    async fn broken_frames_end_the_stream_with_an_error() {
        let mut huge = frame(1, b"ok");
        huge.extend([1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
        huge.extend(frame(1, b"never read"));
        let got = demuxed(huge).await;
        assert_eq!(got.len(), 2);
        let e = got[1].as_ref().unwrap_err().to_string();
        assert!(e.contains("4294967295"), "{e}");
        let mut cut = frame(2, b"partial");
        cut.truncate(10);
        let got = demuxed(cut).await;
        assert!(got.len() == 1 && got[0].is_err(), "{got:?}");
        let got = demuxed(frame(7, b"x")).await;
        assert!(got.len() == 1 && got[0].is_err(), "{got:?}");
    }

    /// A reset connection keeps its I/O error as the source (the exec layer reads the
    /// reset of a stdin-fed exec as the end of its output).
    #[tokio::test]
    async fn a_reset_keeps_the_io_error_as_source() {
        let reset = failing_reader(std::io::ErrorKind::ConnectionReset);
        let got: Vec<_> = demultiplex(reset).collect().await;
        let e = got[0].as_ref().unwrap_err();
        assert_eq!(e.kind, EngineErrorKind::Unavailable);
        let io = std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the I/O error is the source");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
    }

    /// A reader that fails at once with `kind`.
    fn failing_reader(kind: std::io::ErrorKind) -> impl tokio::io::AsyncRead + Unpin + Send {
        struct Failing(std::io::ErrorKind);
        impl tokio::io::AsyncRead for Failing {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                _: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::task::Poll::Ready(Err(self.0.into()))
            }
        }
        Failing(kind)
    }

    #[tokio::test]
    async fn a_panicking_or_hanging_call_is_an_engine_error() {
        let r: EngineResult<()> = bounded_call("exec start", Duration::from_secs(5), async {
            panic!("invalid stream number from podman daemon: '7'")
        })
        .await;
        assert_eq!(r.unwrap_err().kind, EngineErrorKind::Other);
        let t = Instant::now();
        let r: EngineResult<()> = bounded_call(
            "container create",
            Duration::from_millis(50),
            std::future::pending(),
        )
        .await;
        assert_eq!(r.unwrap_err().kind, EngineErrorKind::Timeout);
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_panicking_stream_ends_with_one_error() {
        let s = futures::stream::iter(0..3).map(|i| {
            if i == 1 {
                panic!("invalid stream number from the daemon: '7'");
            }
            Ok::<_, EngineError>(i)
        });
        let items: Vec<_> = unwind_safe("exec output", s).collect().await;
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        assert_eq!(items[1].as_ref().unwrap_err().kind, EngineErrorKind::Other);
    }

    fn channel() -> (
        tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
        ArchiveBody,
    ) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        (
            tx,
            Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx))),
        )
    }

    /// Time the consumer spends between chunks is not the engine's.
    #[tokio::test]
    async fn a_slow_consumer_is_not_a_stalled_download() {
        let (tx, body) = channel();
        let mut s = idle_bounded(body, Duration::from_millis(100));
        tx.send(Ok(Bytes::from_static(b"one"))).await.unwrap();
        assert_eq!(&s.next().await.unwrap().unwrap()[..], b"one");
        tokio::time::sleep(Duration::from_millis(300)).await;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40)).await;
            tx.send(Ok(Bytes::from_static(b"two"))).await.unwrap();
        });
        assert_eq!(&s.next().await.unwrap().unwrap()[..], b"two");
        assert!(s.next().await.is_none());
    }

    #[tokio::test]
    async fn a_stalled_download_fails_within_the_limit() {
        let (_tx, body) = channel();
        let mut s = idle_bounded(body, Duration::from_millis(50));
        let t = Instant::now();
        let e = s.next().await.unwrap().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(s.next().await.is_none());
    }

    /// An engine that stops reading fails the upload; a slow source does not.
    #[tokio::test]
    async fn an_engine_that_stops_reading_fails_the_upload() {
        let (tx, body) = channel();
        tx.send(Ok(Bytes::from_static(b"ready"))).await.unwrap();
        let t = Instant::now();
        let e = bounded_upload("archive upload", body, Duration::from_millis(100), |_b| {
            std::future::pending()
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind, EngineErrorKind::Timeout, "{e}");
        assert!(t.elapsed() < Duration::from_secs(3));

        let (tx, body) = channel();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            tx.send(Ok(Bytes::from_static(b"late"))).await.unwrap();
        });
        let got = bounded_upload(
            "archive upload",
            body,
            Duration::from_millis(100),
            |mut b| async move {
                let mut n = 0;
                while let Some(c) = b.next().await {
                    n += c.unwrap().len();
                }
                assert_eq!(n, 4);
                Ok(())
            },
        )
        .await;
        assert!(got.is_ok(), "{got:?}");
    }
}
