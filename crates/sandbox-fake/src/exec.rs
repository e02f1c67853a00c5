//! Running work in a fake sandbox: every exec is a task with a pid whose output flows
//! through a bounded channel as it is produced, wrapped into a core
//! [`Process`](sandbox_core::Process) (which adds timeouts, drop-kill and `wait`). `run` is
//! `Process::collect`. What the task runs is `commands`'s job (an argv) or
//! `commands::snippets`'s (a `run_code` snippet).

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

use crate::commands::{run_program, snippets};
use crate::processes::SpawnError;
use crate::program::{Proc, Sink, Stdin, spawn_process};
use crate::script::Response;
use crate::state::{SandboxInner, Vars};

/// Chunks buffered between a program and its consumer (backpressure bounds memory).
const CHANNEL_DEPTH: usize = 16;

/// What an exec runs.
pub(crate) enum Job {
    /// A program with its arguments.
    Argv(Vec<String>),
    /// A `run_code` snippet, with its context's variables.
    Code {
        code: String,
        vars: Vars,
        /// A scripted response that replaces the snippet table.
        scripted: Option<Response>,
    },
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
                    } => proc.play(&response).await,
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
