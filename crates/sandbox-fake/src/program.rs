//! One program running in a fake sandbox: its context ([`Proc`]: pid, process group,
//! environment, working directory, streams), what it can do with it (write output, read
//! input, resolve paths, fail, play a scripted response), and how it is started as a
//! process task with a pid. Which program answers an argv is `commands`'s job; a whole
//! exec (channels, exit code, killer) is `exec`'s.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use sandbox_core::{OutputChunk, Result, StreamKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::memfs::FsError;
use crate::processes::SpawnError;
use crate::script::{End, Response, Step};
use crate::state::SandboxInner;

/// A command's body: runs as `proc` with `argv`, returns the exit status.
pub(crate) type Program = fn(Proc, Vec<String>) -> BoxFuture<'static, Result<i64>>;

/// Largest chunk a program emits at once.
pub(crate) const MAX_CHUNK: usize = 64 * 1024;
/// Exit code of a program whose output consumer went away (128 + SIGPIPE).
pub(crate) const BROKEN_PIPE_EXIT: i64 = 141;

/// Where a program's output goes.
#[derive(Clone)]
pub(crate) enum Sink {
    /// To the exec's output stream.
    Chan(mpsc::Sender<OutputChunk>, StreamKind),
    /// Appended to a sandbox file.
    File(String),
    /// Discarded (`/dev/null`).
    Null,
}

/// The execution context of one program: its process, environment and streams.
#[derive(Clone)]
pub(crate) struct Proc {
    pub(crate) sb: Arc<SandboxInner>,
    pub(crate) pid: u32,
    pub(crate) pgid: u32,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) cwd: String,
    pub(crate) stdout: Sink,
    pub(crate) stderr: Sink,
    /// The exec's input, shared like a pipe by every program of the exec: what one
    /// reads, the next does not see.
    pub(crate) stdin: Arc<Stdin>,
}

/// What an exec reads on stdin.
pub(crate) enum Stdin {
    /// `RunOptions::stdin` (empty: end of input at once).
    Given(std::sync::Mutex<Bytes>),
    /// `RunOptions::interactive`: chunks written through `Process::input`; `None` (or
    /// every sender gone) is the end.
    Live(tokio::sync::Mutex<mpsc::Receiver<Option<Bytes>>>),
}

impl Proc {
    /// Writes to stdout; false when the consumer is gone.
    pub(crate) async fn out(&self, data: impl Into<Bytes>) -> bool {
        self.write(&self.stdout, data.into()).await
    }

    /// Writes to stderr; false when the consumer is gone.
    pub(crate) async fn err(&self, data: impl Into<Bytes>) -> bool {
        self.write(&self.stderr, data.into()).await
    }

    pub(crate) async fn write(&self, sink: &Sink, mut data: Bytes) -> bool {
        if data.is_empty() {
            return true;
        }
        // A paused sandbox's programs produce nothing until it is resumed.
        self.sb.thawed().await;
        match sink {
            Sink::Chan(tx, kind) => {
                while !data.is_empty() {
                    let piece = data.split_to(data.len().min(MAX_CHUNK));
                    let chunk = OutputChunk {
                        stream: *kind,
                        data: piece,
                    };
                    if tx.send(chunk).await.is_err() {
                        return false;
                    }
                }
                true
            }
            Sink::File(path) => {
                let now = self.sb.now();
                self.sb.fs().append(path, &data, now).is_ok()
            }
            Sink::Null => true,
        }
    }

    /// The next piece of input as it arrives; `None` at its end.
    pub(crate) async fn next_stdin(&self) -> Option<Bytes> {
        match &*self.stdin {
            Stdin::Given(m) => Some(std::mem::take(&mut *crate::lock(m))).filter(|b| !b.is_empty()),
            Stdin::Live(rx) => rx.lock().await.recv().await.flatten(),
        }
    }

    /// Resolves a sandbox path against this process's working directory.
    pub(crate) fn path(&self, p: &str) -> String {
        sandbox_core::resolve_path(&self.cwd, p).unwrap_or_else(|_| self.cwd.clone())
    }

    /// Reads a whole file for a program; `Err` carries the errno text.
    pub(crate) fn read_file(&self, path: &str) -> std::result::Result<Bytes, FsError> {
        self.sb.fs().read(&self.path(path))
    }

    /// Plays a scripted response as this program.
    pub(crate) async fn play(&self, response: &Response) -> Result<i64> {
        for step in &response.steps {
            match step {
                Step::Chunk(c) => {
                    let ok = match c.stream {
                        StreamKind::Stdout => self.out(c.data.clone()).await,
                        StreamKind::Stderr => self.err(c.data.clone()).await,
                    };
                    if !ok {
                        return Ok(BROKEN_PIPE_EXIT);
                    }
                }
                Step::Sleep(d) => tokio::time::sleep(*d).await,
            }
        }
        match &response.end {
            End::Exit(c) => Ok(*c),
            End::Hang => futures::future::pending().await,
            End::Error(f) => Err(f()),
        }
    }
}

/// Writes an error line to stderr and returns `code`.
pub(crate) async fn fail(p: &Proc, msg: impl Into<String>, code: i64) -> Result<i64> {
    let mut m = msg.into();
    m.push('\n');
    p.err(m).await;
    Ok(code)
}

/// Removes the pid when the process task ends or is aborted.
struct ExitGuard {
    sb: Arc<SandboxInner>,
    pid: u32,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.sb.procs().exited(self.pid);
    }
}

/// Starts a process task in `sb` (in group `pgid`, or a new group named after its pid).
pub(crate) fn spawn_process<T, F>(
    sb: &Arc<SandboxInner>,
    pgid: Option<u32>,
    command: String,
    body: F,
) -> Result<(u32, JoinHandle<T>), SpawnError>
where
    T: Send + 'static,
    F: FnOnce(u32) -> BoxFuture<'static, T>,
{
    let pid = sb.procs().register(pgid, command)?;
    let guard = ExitGuard {
        sb: sb.clone(),
        pid,
    };
    let fut = body(pid);
    let handle = tokio::spawn(async move {
        let _guard = guard;
        fut.await
    });
    sb.procs().set_abort(pid, handle.abort_handle());
    Ok((pid, handle))
}
