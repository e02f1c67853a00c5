//! Running work in a fake sandbox: every exec is a task with a pid whose output flows
//! through a bounded channel as it is produced, wrapped into a core [`Process`] (which adds
//! timeouts, drop-kill and `wait`). `run` is `Process::collect`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use sandbox_core::teardown::{Killer, OrphanInfo};
use sandbox_core::{
    KILLED_EXIT_CODE, OutputChunk, Result, SandboxError, StartFuture, StartedExec, StreamKind,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::memfs::FsError;
use crate::processes::{SpawnError, spawn_process};
use crate::sandbox::SandboxInner;
use crate::snippets::{self, Vars};
use crate::vocabulary::{self, NOT_IN_VOCABULARY_EXIT};

/// Chunks buffered between a program and its consumer (backpressure bounds memory).
const CHANNEL_DEPTH: usize = 16;
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
}

/// What an exec runs.
pub(crate) enum Job {
    /// A program with its arguments.
    Argv(Vec<String>),
    /// A `run_code` snippet, with its context's variables.
    Code {
        code: String,
        vars: Vars,
        /// A scripted response that replaces the snippet table.
        scripted: Option<crate::script::Response>,
    },
}

/// Runs one program: a scripted rule, else the vocabulary, else the typed "not in
/// vocabulary" answer.
pub(crate) fn run_program(
    proc: Proc,
    argv: Vec<String>,
) -> futures::future::BoxFuture<'static, Result<i64>> {
    Box::pin(async move {
        if argv.is_empty() {
            return Ok(0);
        }
        if let Some(response) = proc.sb.scripted_run(&argv) {
            return response.play(&proc).await;
        }
        match vocabulary::lookup(&argv[0]) {
            Some(spec) => (spec.run)(proc, argv).await,
            None => {
                let msg = vocabulary::not_in_vocabulary_message(&argv[0]);
                proc.sb.outside_vocabulary(msg.trim_end());
                proc.err(msg).await;
                Ok(NOT_IN_VOCABULARY_EXIT)
            }
        }
    })
}

/// The lazy start of one exec, for [`sandbox_core::Process::new`].
pub(crate) fn start(
    sb: Arc<SandboxInner>,
    job: Job,
    env: BTreeMap<String, String>,
    cwd: String,
    stdin: Option<Bytes>,
    live: bool,
) -> StartFuture {
    Box::pin(async move {
        sb.alive()?;
        let command = match &job {
            Job::Argv(argv) => argv.join(" "),
            Job::Code { .. } => "python3".to_string(),
        };
        let (tx, mut rx) = mpsc::channel::<OutputChunk>(CHANNEL_DEPTH);
        let (input, stdin) = if live {
            let (sink, rx) = sandbox_core::channel_input(4);
            (Some(sink), Stdin::Live(tokio::sync::Mutex::new(rx)))
        } else {
            (
                None,
                Stdin::Given(std::sync::Mutex::new(stdin.unwrap_or_default())),
            )
        };
        let stdin = Arc::new(stdin);
        let (code_tx, code_rx) = oneshot::channel::<Result<i64>>();
        let task_sb = sb.clone();
        let spawned = spawn_process(&sb, None, command, move |pid| {
            Box::pin(async move {
                let proc = Proc {
                    sb: task_sb.clone(),
                    pid,
                    pgid: pid,
                    env,
                    cwd,
                    stdout: Sink::Chan(tx.clone(), StreamKind::Stdout),
                    stderr: Sink::Chan(tx, StreamKind::Stderr),
                    stdin,
                };
                let result = match job {
                    Job::Argv(argv) => run_program(proc, argv).await,
                    Job::Code {
                        scripted: Some(response),
                        ..
                    } => response.play(&proc).await,
                    Job::Code { code, vars, .. } => snippets::run(proc, code, vars).await,
                };
                // The process is gone before its exit code is observable.
                task_sb.procs().exited(pid);
                let _ = code_tx.send(result);
            })
        });
        let (pid, _join) = spawned.map_err(|SpawnError::PidsLimit| {
            SandboxError::resource_limit(
                format!("pids ({})", sb.resources.pids),
                Some("raise Resources::pids, or let running processes finish".into()),
            )
        })?;
        let output = futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).map(Ok);
        let exit_sb = sb.clone();
        let exit_code = Box::pin(async move {
            // No code: the task was aborted, by the exec's killer or because the sandbox died.
            code_rx
                .await
                .unwrap_or_else(|_| exit_sb.alive().map(|()| KILLED_EXIT_CODE))
        });
        Ok(StartedExec {
            output: Box::pin(output),
            exit_code,
            killer: group_killer(sb, pid),
            input,
        })
    })
}

/// Kills exec `pgid` and everything it started (not the sandbox).
fn group_killer(sb: Arc<SandboxInner>, pgid: u32) -> Killer {
    Arc::new(move || {
        let sb = sb.clone();
        Box::pin(async move {
            sb.alive()?;
            // Take the entries out under the lock, abort outside it (exit guards lock).
            let handles = sb.procs().kill_group(pgid);
            handles.iter().for_each(AbortHandle::abort);
            Ok(())
        })
    })
}

/// What an exec's orphan warning names.
pub(crate) fn orphan_info(sb: &SandboxInner, what: &str) -> OrphanInfo {
    OrphanInfo::new(
        format!("{}/{what}", sb.id),
        crate::BACKEND_NAME,
        sb.labels.clone(),
    )
}
