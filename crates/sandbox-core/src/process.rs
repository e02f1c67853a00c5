//! A streamed remote process with the contract's semantics built in.
//!
//! Adapters only say how to *start* a remote process ([`StartedExec`]: its output, its exit
//! code and how to kill its process tree). [`Process`] adds what must behave the same on
//! every backend: lazy start on first poll, per-stream order, the timeout (kill, then
//! `ExecutionTimeout`), idempotent [`Process::wait`] that drains unconsumed output, and a
//! bounded kill when dropped before the end. `run` is [`Process::collect`] with a cap.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};

use crate::options::PtySize;
use crate::teardown::{Killer, OrphanInfo, shielded_kill, spawn_bounded_kill};
use crate::{ExecResult, OutputChunk, Result, SandboxError, StreamKind};

/// Exit code reported for a process killed through [`Process::kill`] before it reported
/// one itself (128 + SIGKILL, as shells do).
pub const KILLED_EXIT_CODE: i64 = 137;

/// A started remote process, as an adapter describes it.
pub struct StartedExec {
    /// Output in order per stream; ends when the process closed its output.
    pub output: BoxStream<'static, Result<OutputChunk>>,
    /// Resolves to the exit code; polled only after `output` ended. Adapters must not
    /// trust an exit code while the engine still reports the process running.
    pub exit_code: BoxFuture<'static, Result<i64>>,
    /// Kills only this process tree (not the sandbox). `SandboxGone` if the sandbox died.
    pub killer: Killer,
    /// The process's live input, for a process started with `RunOptions::interactive` or
    /// `RunOptions::pty`; `None` otherwise.
    pub input: Option<Arc<dyn InputSink>>,
}

/// The live input of a process, as an adapter provides it (see [`ProcessInput`]).
#[async_trait::async_trait]
pub trait InputSink: Send + Sync {
    /// Sends `data` to the process's stdin (bounded: waits while the process does not
    /// read).
    async fn write(&self, data: Bytes) -> Result<()>;
    /// Sets the terminal's window size. The default is a process without a terminal:
    /// `Configuration`.
    async fn resize(&self, size: PtySize) -> Result<()> {
        let _ = size;
        Err(SandboxError::config(
            "this process has no terminal to resize",
            "stream it with RunOptions::pty(..) to give it one",
        ))
    }
    /// Ends the input: closes stdin, or on a terminal sends end-of-file (`^D`).
    async fn end(&self) -> Result<()>;
}

/// The live input of a streamed process started with `RunOptions::interactive` (its
/// stdin) or `RunOptions::pty` (its terminal): what is written, end of input and, on a
/// terminal, the window size. Cheap to clone; usable from another task while the output
/// is read. Input after the process ended is discarded.
#[derive(Clone)]
pub struct ProcessInput {
    sink: Arc<dyn InputSink>,
}

impl std::fmt::Debug for ProcessInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessInput").finish_non_exhaustive()
    }
}

impl ProcessInput {
    /// Writes `data` (on a terminal: bytes as a keyboard sends them — `\r` is Enter,
    /// `\x03` Ctrl-C in the terminal's default mode).
    pub async fn write(&self, data: impl Into<Bytes>) -> Result<()> {
        self.sink.write(data.into()).await
    }

    /// Sets the terminal's window size; the process gets `SIGWINCH`. `Configuration` for
    /// an empty size or a process without a terminal.
    pub async fn resize(&self, size: PtySize) -> Result<()> {
        size.validate()?;
        self.sink.resize(size).await
    }

    /// Ends the input: stdin is closed (the process reads end of input); on a terminal
    /// end-of-file (`^D`) is sent, which a program reading it line by line takes as the end.
    pub async fn end(&self) -> Result<()> {
        self.sink.end().await
    }
}

/// Live stdin through a channel, for an adapter whose process reads its input from a
/// task of its own: the sink a `Process` hands out (`StartedExec::input`) and the
/// receiving end. Each item is a piece of input; `None`, or every sender gone, is the end
/// of input. Writes wait while `depth` pieces are in flight (bounded memory); once the
/// receiver is gone (the process ended) input is discarded. No terminal: a resize is a
/// `Configuration` error.
pub fn channel_input(
    depth: usize,
) -> (
    Arc<dyn InputSink>,
    tokio::sync::mpsc::Receiver<Option<Bytes>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(depth.max(1));
    (Arc::new(ChannelInput(tx)), rx)
}

struct ChannelInput(tokio::sync::mpsc::Sender<Option<Bytes>>);

#[async_trait::async_trait]
impl InputSink for ChannelInput {
    async fn write(&self, data: Bytes) -> Result<()> {
        let _ = self.0.send(Some(data)).await;
        Ok(())
    }
    async fn end(&self) -> Result<()> {
        let _ = self.0.send(None).await;
        Ok(())
    }
}

/// The future that starts a remote process.
pub type StartFuture = BoxFuture<'static, Result<StartedExec>>;

enum State {
    Pending(StartFuture),
    Output {
        output: BoxStream<'static, Result<OutputChunk>>,
        exit_code: Option<BoxFuture<'static, Result<i64>>>,
    },
    Exiting(BoxFuture<'static, Result<i64>>),
    TimingOut(BoxFuture<'static, Result<()>>),
    Finished(End),
}

enum End {
    Exited(i64),
    TimedOut(Duration),
    Failed(SandboxError),
    /// The error was handed out already; later calls get a replay.
    FailedReported(SandboxError),
}

/// A running (or not yet started) remote process: a [`Stream`] of output chunks.
///
/// Dropping it before the process ended kills the remote process tree (bounded by the
/// teardown grace). Stdout and stderr are each in order; their interleaving is not
/// guaranteed.
pub struct Process {
    state: State,
    timeout: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    killer: Option<Killer>,
    input: Option<Arc<dyn InputSink>>,
    info: OrphanInfo,
    killed: bool,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("id", &self.info.id)
            .field("timeout", &self.timeout)
            .field("returncode", &self.returncode())
            .finish()
    }
}

impl Process {
    /// A process that starts on first poll (or [`Process::start`]) and is killed after
    /// `timeout`. `info` names it in orphan warnings.
    pub fn new(start: StartFuture, timeout: Duration, info: OrphanInfo) -> Self {
        Process {
            state: State::Pending(start),
            timeout,
            deadline: None,
            killer: None,
            input: None,
            info,
            killed: false,
        }
    }

    /// The live input of a process started with `RunOptions::interactive` or
    /// `RunOptions::pty`: starts the process if it has not started yet, then hands out its
    /// input. `Configuration` for a process without live input; the start's own error when
    /// it failed to start.
    pub async fn input(&mut self) -> Result<ProcessInput> {
        self.start().await?;
        if let Some(sink) = &self.input {
            return Ok(ProcessInput { sink: sink.clone() });
        }
        if let State::Finished(End::Failed(_) | End::FailedReported(_)) = &self.state
            && let Err(e) = self.terminal_result()
        {
            return Err(e);
        }
        Err(SandboxError::config(
            "this process takes no live input",
            "stream the command with RunOptions::interactive() (stdin) or RunOptions::pty(..) (a terminal)",
        ))
    }

    /// The exit code once the process ended; `None` while running.
    pub fn returncode(&self) -> Option<i64> {
        match &self.state {
            State::Finished(End::Exited(c)) => Some(*c),
            _ => None,
        }
    }

    /// The timeout this process is bounded by.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Starts the process now instead of on first poll.
    pub async fn start(&mut self) -> Result<()> {
        futures::future::poll_fn(|cx| self.poll_start(cx)).await
    }

    fn poll_start(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.arm_deadline();
        if let Some(d) = self.deadline.as_mut()
            && d.as_mut().poll(cx).is_ready()
        {
            if let State::Pending(_) = self.state {
                self.state = State::Finished(End::TimedOut(self.timeout));
            }
            return Poll::Ready(Ok(()));
        }
        if let State::Pending(fut) = &mut self.state {
            match fut.poll_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(started)) => {
                    self.killer = Some(started.killer);
                    self.input = started.input;
                    self.state = State::Output {
                        output: started.output,
                        exit_code: Some(started.exit_code),
                    };
                }
                Poll::Ready(Err(e)) => {
                    self.state = State::Finished(End::Failed(e));
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    fn arm_deadline(&mut self) {
        if self.deadline.is_none() {
            self.deadline = Some(Box::pin(tokio::time::sleep(self.timeout)));
        }
    }

    /// Waits for the end, discarding unconsumed output, and returns the terminal result
    /// (`streamed = true`, empty stdout/stderr). Idempotent.
    pub async fn wait(&mut self) -> Result<ExecResult> {
        while let Some(item) = self.next().await {
            item?;
        }
        self.terminal_result()
            .map(|(code, _)| ExecResult::streamed(code))
    }

    fn terminal_result(&mut self) -> Result<(i64, ())> {
        match &mut self.state {
            State::Finished(End::Exited(c)) => Ok((*c, ())),
            State::Finished(End::TimedOut(after)) => {
                Err(SandboxError::ExecutionTimeout { after: *after })
            }
            State::Finished(End::Failed(_)) => {
                let State::Finished(End::Failed(e)) = std::mem::replace(
                    &mut self.state,
                    State::Finished(End::Exited(KILLED_EXIT_CODE)),
                ) else {
                    unreachable!()
                };
                let replay = replay_error(&e);
                self.state = State::Finished(End::FailedReported(e));
                Err(replay)
            }
            State::Finished(End::FailedReported(e)) => Err(replay_error(e)),
            _ => Err(SandboxError::Engine {
                backend: self.info.backend.clone(),
                message: "process has not finished".into(),
                source: None,
            }),
        }
    }

    /// Kills the remote process tree (shielded, bounded by the teardown grace).
    /// Idempotent; a process that already ended is left alone.
    pub async fn kill(&mut self) -> Result<()> {
        if self.killed || matches!(self.state, State::Finished(_)) {
            return Ok(());
        }
        self.killed = true;
        match &self.state {
            State::Pending(_) => {
                // Dropping the start future is the adapter's cancellation of a half-started
                // exec.
                self.state = State::Finished(End::Exited(KILLED_EXIT_CODE));
                Ok(())
            }
            _ => {
                let killer = self.killer.clone().expect("started process has a killer");
                let r = shielded_kill(self.info.clone(), killer()).await;
                if r.is_ok() {
                    // The tree is dead: its output ends and its exit code resolves; bound
                    // the wait anyway.
                    let grace = crate::teardown::teardown_grace();
                    let drained = tokio::time::timeout(grace, async {
                        while let Some(item) = self.next().await {
                            if item.is_err() {
                                break;
                            }
                        }
                    })
                    .await;
                    if drained.is_err() || !matches!(self.state, State::Finished(_)) {
                        self.state = State::Finished(End::Exited(KILLED_EXIT_CODE));
                    }
                }
                r
            }
        }
    }

    /// Buffers the whole output (at most `cap` bytes per stream) and returns a non-streamed
    /// [`ExecResult`]. Past the cap the process is killed and
    /// [`SandboxError::ResourceLimitExceeded`] is returned.
    pub async fn collect(mut self, cap: usize) -> Result<ExecResult> {
        let mut out = BytesMut::new();
        let mut err = BytesMut::new();
        while let Some(item) = self.next().await {
            let chunk = item?;
            let buf = match chunk.stream {
                StreamKind::Stdout => &mut out,
                StreamKind::Stderr => &mut err,
            };
            if buf.len() + chunk.data.len() > cap {
                let _ = self.kill().await;
                let name = match chunk.stream {
                    StreamKind::Stdout => "stdout",
                    StreamKind::Stderr => "stderr",
                };
                return Err(SandboxError::ResourceLimitExceeded {
                    limit: format!("{name} buffer ({cap} bytes)"),
                    hint: Some(
                        "raise RunOptions::output_cap, or use Sandbox::stream for unbounded output"
                            .into(),
                    ),
                });
            }
            buf.extend_from_slice(&chunk.data);
        }
        let (code, ()) = self.terminal_result()?;
        Ok(ExecResult::new(code, out.freeze(), err.freeze()))
    }

    fn begin_timeout(&mut self) {
        match &self.killer {
            Some(k) => {
                let kill = k();
                self.killed = true;
                let grace = crate::teardown::teardown_grace();
                let info = self.info.clone();
                self.state = State::TimingOut(Box::pin(async move {
                    match tokio::time::timeout(grace, kill).await {
                        Ok(r) => r,
                        Err(_) => {
                            tracing::warn!(
                                target: crate::teardown::TEARDOWN_TARGET,
                                sandbox_id = %info.id,
                                backend = %info.backend,
                                labels = ?info.labels,
                                reason = "kill after timeout did not finish",
                                "{}",
                                crate::teardown::ORPHAN_MESSAGE
                            );
                            Ok(())
                        }
                    }
                }));
            }
            None => self.state = State::Finished(End::TimedOut(self.timeout)),
        }
    }
}

/// Rebuilds an error for a second report (sources are not `Clone`; their text is kept).
fn replay_error(e: &SandboxError) -> SandboxError {
    match e {
        SandboxError::SandboxGone { id, .. } => SandboxError::gone(id.clone()),
        SandboxError::SandboxPaused { id } => SandboxError::paused(id.clone()),
        SandboxError::SandboxStopped { id } => SandboxError::stopped(id.clone()),
        SandboxError::ExecutionTimeout { after } => {
            SandboxError::ExecutionTimeout { after: *after }
        }
        SandboxError::ResourceLimitExceeded { limit, hint } => {
            SandboxError::ResourceLimitExceeded {
                limit: limit.clone(),
                hint: hint.clone(),
            }
        }
        SandboxError::CapabilityNotSupported {
            capability,
            backend,
            supported_by,
        } => SandboxError::CapabilityNotSupported {
            capability: *capability,
            backend: backend.clone(),
            supported_by: supported_by.clone(),
        },
        SandboxError::InterpreterMissing {
            interpreter,
            template,
        } => SandboxError::InterpreterMissing {
            interpreter: interpreter.clone(),
            template: template.clone(),
        },
        SandboxError::Configuration { message, hint } => SandboxError::Configuration {
            message: message.clone(),
            hint: hint.clone(),
        },
        other => SandboxError::Engine {
            backend: "process".into(),
            message: format!("{} ({})", other, other.code()),
            source: None,
        },
    }
}

impl Stream for Process {
    type Item = Result<OutputChunk>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            // The deadline covers start, output and exit.
            if !matches!(this.state, State::Finished(_) | State::TimingOut(_)) {
                this.arm_deadline();
                if let Some(d) = this.deadline.as_mut()
                    && d.as_mut().poll(cx).is_ready()
                {
                    this.begin_timeout();
                    continue;
                }
            }
            match &mut this.state {
                State::Pending(_) => match this.poll_start(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(_) => continue,
                },
                State::Output { output, exit_code } => match output.poll_next_unpin(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(chunk))) => return Poll::Ready(Some(Ok(chunk))),
                    Poll::Ready(Some(Err(e))) => {
                        // Output broke: make sure nothing keeps running remotely.
                        if let Some(k) = &this.killer
                            && !this.killed
                            && !matches!(e, SandboxError::SandboxGone { .. })
                        {
                            this.killed = true;
                            spawn_bounded_kill(this.info.clone(), k());
                        }
                        this.state = State::Finished(End::FailedReported(replay_error(&e)));
                        return Poll::Ready(Some(Err(e)));
                    }
                    Poll::Ready(None) => {
                        let fut = exit_code.take().expect("exit code future present");
                        this.state = State::Exiting(fut);
                    }
                },
                State::Exiting(fut) => match fut.poll_unpin(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(code)) => {
                        this.state = State::Finished(End::Exited(code));
                        return Poll::Ready(None);
                    }
                    Poll::Ready(Err(e)) => {
                        this.state = State::Finished(End::FailedReported(replay_error(&e)));
                        return Poll::Ready(Some(Err(e)));
                    }
                },
                State::TimingOut(fut) => match fut.poll_unpin(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e @ SandboxError::SandboxGone { .. })) => {
                        // The sandbox itself died (lifetime): that is not a timeout.
                        this.state = State::Finished(End::FailedReported(replay_error(&e)));
                        return Poll::Ready(Some(Err(e)));
                    }
                    Poll::Ready(_) => {
                        this.state = State::Finished(End::TimedOut(this.timeout));
                        return Poll::Ready(Some(Err(SandboxError::ExecutionTimeout {
                            after: this.timeout,
                        })));
                    }
                },
                State::Finished(End::Failed(e)) => {
                    let replay = replay_error(e);
                    let State::Finished(End::Failed(e)) = std::mem::replace(
                        &mut this.state,
                        State::Finished(End::FailedReported(replay)),
                    ) else {
                        unreachable!()
                    };
                    return Poll::Ready(Some(Err(e)));
                }
                State::Finished(_) => return Poll::Ready(None),
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let running = matches!(self.state, State::Output { .. } | State::Exiting(_));
        if running
            && !self.killed
            && let Some(k) = &self.killer
        {
            spawn_bounded_kill(self.info.clone(), k());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn info() -> OrphanInfo {
        OrphanInfo::new("p", "test", BTreeMap::new())
    }

    fn started(
        chunks: Vec<OutputChunk>,
        code: i64,
        kills: Arc<AtomicUsize>,
        hang: bool,
    ) -> StartFuture {
        Box::pin(async move {
            let out = futures::stream::iter(chunks.into_iter().map(Ok));
            let output: BoxStream<'static, Result<OutputChunk>> = if hang {
                Box::pin(out.chain(futures::stream::pending()))
            } else {
                Box::pin(out)
            };
            Ok(StartedExec {
                output,
                exit_code: Box::pin(async move { Ok(code) }),
                killer: Arc::new(move || {
                    let kills = kills.clone();
                    Box::pin(async move {
                        kills.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                }),
                input: None,
            })
        })
    }

    #[tokio::test]
    async fn collects_and_waits() {
        let kills = Arc::new(AtomicUsize::new(0));
        let p = Process::new(
            started(
                vec![OutputChunk::stdout("a"), OutputChunk::stderr("b")],
                3,
                kills.clone(),
                false,
            ),
            Duration::from_secs(5),
            info(),
        );
        let r = p.collect(1024).await.unwrap();
        assert_eq!(
            (r.exit_code, &r.stdout[..], &r.stderr[..], r.streamed),
            (3, &b"a"[..], &b"b"[..], false)
        );
        assert_eq!(kills.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn wait_is_idempotent_and_drains() {
        let kills = Arc::new(AtomicUsize::new(0));
        let mut p = Process::new(
            started(vec![OutputChunk::stdout("a")], 0, kills, false),
            Duration::from_secs(5),
            info(),
        );
        let a = p.wait().await.unwrap();
        let b = p.wait().await.unwrap();
        assert_eq!(a, b);
        assert!(a.streamed && a.stdout.is_empty());
        assert_eq!(p.returncode(), Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_kills_and_reports() {
        let kills = Arc::new(AtomicUsize::new(0));
        let mut p = Process::new(
            started(vec![], 0, kills.clone(), true),
            Duration::from_secs(1),
            info(),
        );
        let e = p.wait().await.unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::ExecutionTimeout);
        assert_eq!(kills.load(Ordering::SeqCst), 1);
        assert!(p.wait().await.unwrap_err().is_timeout(), "idempotent");
    }

    #[tokio::test]
    async fn drop_mid_stream_kills() {
        let kills = Arc::new(AtomicUsize::new(0));
        let mut p = Process::new(
            started(vec![OutputChunk::stdout("x")], 0, kills.clone(), true),
            Duration::from_secs(60),
            info(),
        );
        assert!(p.next().await.is_some());
        drop(p);
        assert!(crate::teardown::wait_for_teardowns(Duration::from_secs(2)).await);
        assert_eq!(kills.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn cap_exceeded_is_typed() {
        let kills = Arc::new(AtomicUsize::new(0));
        let p = Process::new(
            started(vec![OutputChunk::stdout("abcdef")], 0, kills, false),
            Duration::from_secs(5),
            info(),
        );
        let e = p.collect(3).await.unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::ResourceLimitExceeded);
    }

    #[tokio::test]
    async fn input_is_handed_out_only_where_there_is_one() {
        struct Typed(std::sync::Mutex<Vec<u8>>);
        #[async_trait::async_trait]
        impl InputSink for Typed {
            async fn write(&self, data: Bytes) -> Result<()> {
                self.0.lock().unwrap().extend_from_slice(&data);
                Ok(())
            }
            async fn resize(&self, _: PtySize) -> Result<()> {
                Ok(())
            }
            async fn end(&self) -> Result<()> {
                self.0.lock().unwrap().push(4);
                Ok(())
            }
        }
        let kills = Arc::new(AtomicUsize::new(0));
        let mut plain = Process::new(
            started(vec![], 0, kills.clone(), false),
            Duration::from_secs(5),
            info(),
        );
        let e = plain.input().await.unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Configuration);

        let typed = Arc::new(Typed(std::sync::Mutex::new(Vec::new())));
        let input: Arc<dyn InputSink> = typed.clone();
        let start: StartFuture = Box::pin(async move {
            let mut s = started(vec![], 0, Arc::new(AtomicUsize::new(0)), false).await?;
            s.input = Some(input);
            Ok(s)
        });
        let mut p = Process::new(start, Duration::from_secs(5), info());
        let t = p.input().await.unwrap();
        t.write("ls\r").await.unwrap();
        t.end().await.unwrap();
        let e = t.resize(PtySize::new(0, 10)).await.unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Configuration);
        assert_eq!(&typed.0.lock().unwrap()[..], b"ls\r\x04");

        let failed: StartFuture =
            Box::pin(async { Err(SandboxError::gone("sbx-gone".to_string())) });
        let mut p = Process::new(failed, Duration::from_secs(5), info());
        let e = p.input().await.unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::SandboxGone);
    }
}
