//! Execs: `run`, `stream` and stateless `run_code`, all through one launcher.
//!
//! Every exec runs under a tiny `sh` wrapper that prints its own pid and then `exec`s the
//! command, so the command keeps that pid, which is also its process-group id (runc makes
//! every exec a session leader). A timeout, a dropped future or a dropped `Process` kills
//! `-<pgid>` from a second exec: only that process tree, never the sandbox.
//!
//! podman-api specifics handled here: the exec handle from `create_exec` is kept (a handle
//! from `execs().get(id)` is "unchecked" and cannot start); the output stream is polled
//! through `error::guard_stream` because the crate's frame decoder panics on unknown
//! frames; and the exit code is read only once exec inspect says `Running: false` (Podman
//! reports exit 0 while an exec still runs).

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::io::AsyncWrite;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use podman_api::Podman;
use podman_api::api::Exec;
use podman_api::conn::TtyChunk;
use podman_api::opts::{ExecCreateOpts, ExecStartOpts};
use sandbox_core::teardown::{KillFuture, Killer, OrphanInfo, spawn_bounded_kill};
use sandbox_core::{OutputChunk, Result, SandboxError, Secret, StartedExec};

use crate::error::{engine_msg, guard, guard_stream, on_sandbox};

/// The wrapper: print our pid (= pgid, runc makes each exec a session leader), then become
/// the command. A missing program makes `exec` fail with 127 and its message on stderr.
const WRAPPER: &str = "echo \"$$\"; exec \"$@\"";

/// What every exec in one sandbox shares.
#[derive(Clone)]
pub(crate) struct ExecTarget {
    pub client: Podman,
    pub id: String,
    pub workdir: String,
    /// Injected per exec, never stored in the container config.
    pub secrets: Arc<Vec<(String, Secret)>>,
    pub info: OrphanInfo,
}

impl std::fmt::Debug for ExecTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecTarget").field("id", &self.id).finish()
    }
}

/// One exec request.
#[derive(Clone, Debug, Default)]
pub(crate) struct ExecSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub stdin: bool,
}

/// A started exec whose pgid is known.
pub(crate) struct Launched {
    pub exec: Arc<Exec>,
    pub pgid: u32,
    pub output: BoxStream<'static, Result<OutputChunk>>,
    pub stdin: Option<Pin<Box<dyn AsyncWrite + Send>>>,
}

fn chunk_of(c: TtyChunk) -> Option<OutputChunk> {
    match c {
        TtyChunk::StdOut(v) => Some(OutputChunk::stdout(Bytes::from(v))),
        TtyChunk::StdErr(v) => Some(OutputChunk::stderr(Bytes::from(v))),
        TtyChunk::StdIn(_) => None,
    }
}

/// Creates and starts an exec without the wrapper; returns the handle and its output.
async fn start_raw(
    target: &ExecTarget,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    workdir: Option<String>,
    stdin: bool,
) -> Result<(
    Arc<Exec>,
    BoxStream<'static, Result<OutputChunk>>,
    Option<Pin<Box<dyn AsyncWrite + Send>>>,
)> {
    let mut all_env: Vec<(String, String)> = target
        .secrets
        .iter()
        .map(|(k, v)| (k.clone(), v.expose().to_string()))
        .collect();
    all_env.extend(env);
    let mut b = ExecCreateOpts::builder()
        .command(argv)
        .attach_stdout(true)
        .attach_stderr(true)
        .attach_stdin(stdin)
        .working_dir(workdir.unwrap_or_else(|| target.workdir.clone()));
    if !all_env.is_empty() {
        b = b.env(all_env);
    }
    let opts = b.build();
    let container = target.client.containers().get(&target.id);
    let id = target.id.clone();
    let exec = guard("exec create", async {
        container
            .create_exec(&opts)
            .await
            .map_err(|e| on_sandbox(&id, "exec create", e))
    })
    .await?;
    let exec = Arc::new(exec);
    let start_opts = ExecStartOpts::builder().build();
    let mux = guard("exec start", async {
        exec.start(&start_opts)
            .await
            .map_err(|e| on_sandbox(&id, "exec start", e))
    })
    .await?
    .ok_or_else(|| engine_msg("exec start returned no stream"))?;
    let (reader, writer) = mux.split();
    let reader = reader
        .map_err(|e| SandboxError::Engine {
            backend: crate::error::BACKEND.into(),
            message: "reading exec output failed".into(),
            source: Some(Box::new(e)),
        })
        .try_filter_map(|c| futures::future::ready(Ok(chunk_of(c))));
    let output: BoxStream<'static, Result<OutputChunk>> =
        Box::pin(guard_stream("exec output", reader));
    let stdin: Option<Pin<Box<dyn AsyncWrite + Send>>> =
        if stdin { Some(Box::pin(writer)) } else { None };
    Ok((exec, output, stdin))
}

/// Starts `spec` under the wrapper and reads the pgid line.
pub(crate) async fn launch(target: &ExecTarget, spec: ExecSpec) -> Result<Launched> {
    let mut argv = vec!["sh".to_string(), "-c".into(), WRAPPER.into(), "sh".into()];
    argv.extend(spec.argv);
    let (exec, mut output, stdin) =
        start_raw(target, argv, spec.env, spec.workdir, spec.stdin).await?;
    let mut line = BytesMut::new();
    let mut held_stderr: Vec<OutputChunk> = Vec::new();
    loop {
        match output.next().await {
            Some(Ok(c)) if c.stream == sandbox_core::StreamKind::Stdout => {
                line.extend_from_slice(&c.data);
                if let Some(pos) = line.iter().position(|b| *b == b'\n') {
                    let rest = line.split_off(pos + 1);
                    let pgid: u32 = std::str::from_utf8(&line[..pos])
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .ok_or_else(|| engine_msg("exec wrapper printed no pid"))?;
                    let mut first = held_stderr;
                    if !rest.is_empty() {
                        first.push(OutputChunk::stdout(rest.freeze()));
                    }
                    let output =
                        Box::pin(futures::stream::iter(first.into_iter().map(Ok)).chain(output));
                    return Ok(Launched {
                        exec,
                        pgid,
                        output,
                        stdin,
                    });
                }
            }
            Some(Ok(c)) => held_stderr.push(c),
            Some(Err(e)) => return Err(e),
            None => {
                // The wrapper died before printing (no `sh` in the image, or the sandbox
                // went away).
                let code = exit_code(target, &exec).await?;
                let err: Vec<u8> = held_stderr.iter().flat_map(|c| c.data.to_vec()).collect();
                return Err(engine_msg(format!(
                    "exec wrapper exited {code} before starting the command: {}",
                    String::from_utf8_lossy(&err)
                        .chars()
                        .take(200)
                        .collect::<String>()
                )));
            }
        }
    }
}

/// Waits until exec inspect says `Running: false`, then returns `ExitCode`.
pub(crate) async fn exit_code(target: &ExecTarget, exec: &Exec) -> Result<i64> {
    let mut delay = Duration::from_millis(2);
    loop {
        let v = guard("exec inspect", async {
            exec.inspect()
                .await
                .map_err(|e| on_sandbox(&target.id, "exec inspect", e))
        })
        .await;
        let v = match v {
            Ok(v) => v,
            Err(SandboxError::SandboxGone { .. }) => {
                // The exec session is gone: either the whole container is, or the engine
                // dropped the session. Only the former is known for sure.
                return Err(SandboxError::SandboxGone {
                    id: target.id.clone(),
                });
            }
            Err(e) => return Err(e),
        };
        let running = v.get("Running").and_then(|r| r.as_bool()).unwrap_or(true);
        if !running {
            return v
                .get("ExitCode")
                .and_then(|c| c.as_i64())
                .ok_or_else(|| engine_msg("exec inspect has no ExitCode"));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(50));
    }
}

/// Runs a helper command (no wrapper) to completion, collecting its output.
pub(crate) async fn run_helper(
    target: &ExecTarget,
    argv: Vec<String>,
    workdir: Option<String>,
) -> Result<(i64, Bytes, Bytes)> {
    let (exec, mut output, _) = start_raw(target, argv, vec![], workdir, false).await?;
    let mut out = BytesMut::new();
    let mut err = BytesMut::new();
    while let Some(c) = output.next().await {
        let c = c?;
        match c.stream {
            sandbox_core::StreamKind::Stdout => out.extend_from_slice(&c.data),
            sandbox_core::StreamKind::Stderr => err.extend_from_slice(&c.data),
        }
    }
    let code = exit_code(target, &exec).await?;
    Ok((code, out.freeze(), err.freeze()))
}

/// Kills the process group `pgid` unless the exec already ended (so a reused pid is never
/// hit). `SandboxGone` when the sandbox itself is gone.
pub(crate) async fn kill_group(target: &ExecTarget, exec: &Exec, pgid: u32) -> Result<()> {
    let v = guard("exec inspect", async {
        exec.inspect()
            .await
            .map_err(|e| on_sandbox(&target.id, "exec inspect", e))
    })
    .await?;
    if v.get("Running").and_then(|r| r.as_bool()) == Some(false) {
        return Ok(());
    }
    let script = format!("kill -9 -{pgid} 2>/dev/null; kill -9 {pgid} 2>/dev/null; true");
    run_helper(
        target,
        vec!["sh".into(), "-c".into(), script],
        Some("/".into()),
    )
    .await
    .map(|_| ())
}

fn killer_for(target: ExecTarget, exec: Arc<Exec>, pgid: u32) -> Killer {
    Arc::new(move || {
        let target = target.clone();
        let exec = exec.clone();
        Box::pin(async move { kill_group(&target, &exec, pgid).await }) as KillFuture
    })
}

/// Launches in a task of its own (panic isolation, and cancellation safety: if the caller
/// drops the start future before the pgid is known, the task kills the exec itself).
pub(crate) async fn launch_detached(target: ExecTarget, spec: ExecSpec) -> Result<Launched> {
    let (tx, rx) = tokio::sync::oneshot::channel::<Result<Launched>>();
    let t = target.clone();
    tokio::spawn(async move {
        let r = launch(&t, spec).await;
        if let Err(Ok(l)) = tx.send(r) {
            let info = OrphanInfo::new(
                format!("{}/exec-{}", t.id, l.pgid),
                crate::error::BACKEND,
                t.info.labels.clone(),
            );
            let killer = killer_for(t, l.exec, l.pgid);
            spawn_bounded_kill(info, killer());
        }
    });
    match rx.await {
        Ok(r) => r,
        Err(_) => Err(engine_msg("exec start task ended unexpectedly")),
    }
}

/// A `StartedExec` for `sandbox_core::Process`.
pub(crate) async fn start_process(target: ExecTarget, spec: ExecSpec) -> Result<StartedExec> {
    let l = launch_detached(target.clone(), spec).await?;
    let killer = killer_for(target.clone(), l.exec.clone(), l.pgid);
    let exec = l.exec;
    let t = target;
    Ok(StartedExec {
        output: l.output,
        exit_code: Box::pin(async move { exit_code(&t, &exec).await }),
        killer,
    })
}
