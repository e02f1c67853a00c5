//! The flaws of runs and streams: timeouts swallowed or widened, kills that reach too
//! little or too much, processes left running, streams that end early or buffer without
//! bound. Each is a function over the unbroken sandbox's own runs and streams.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use sandbox_core::teardown::OrphanInfo;
use sandbox_core::{
    Command, ErrorCode, ExecResult, Process, Result, RunOptions, Sandbox, SandboxError, StartedExec,
};

use super::abandoned::abandon;

/// A started process's output, re-wrapped: the flaws that change how a stream ends.
pub(super) fn rewrap(
    inner: Process,
    timeout: Duration,
    info: OrphanInfo,
    end_on_pause: bool,
) -> Process {
    let start = async move {
        let mut inner = inner;
        inner.start().await?;
        let held = Arc::new(tokio::sync::Mutex::new(Some(inner)));
        let out = held.clone();
        let output = futures::stream::unfold(out, move |out| async move {
            let next = {
                let mut guard = out.lock().await;
                let p = guard.as_mut()?;
                if end_on_pause {
                    match tokio::time::timeout(Duration::from_secs(1), p.next()).await {
                        Ok(item) => item,
                        Err(_) => {
                            // Ends the stream; the process is left running.
                            if let Some(p) = guard.take() {
                                abandon(p);
                            }
                            None
                        }
                    }
                } else {
                    p.next().await
                }
            };
            next.map(|item| (item, out))
        })
        .boxed();
        let exit_code = Box::pin(async move {
            let guard = held.lock().await;
            Ok(guard.as_ref().and_then(|p| p.returncode()).unwrap_or(0))
        });
        Ok(StartedExec {
            output,
            exit_code,
            killer: Arc::new(|| Box::pin(async { Ok(()) })),
            input: None,
        })
    };
    Process::new(Box::pin(start), timeout, info)
}

/// A process whose killer does nothing and whose real process is never dropped (so
/// its own drop-kill never runs).
pub(super) fn orphaning_stream(
    sandbox: &dyn Sandbox,
    cmd: Command,
    options: RunOptions,
    info: OrphanInfo,
) -> Result<Process> {
    let timeout = options.timeout;
    let mut inner = sandbox.stream(cmd, options)?;
    let start = async move {
        inner.start().await?;
        let held: &'static Mutex<Process> = Box::leak(Box::new(Mutex::new(inner)));
        let output = futures::stream::poll_fn(move |cx| match held.lock() {
            Ok(mut p) => p.poll_next_unpin(cx),
            Err(_) => std::task::Poll::Ready(None),
        })
        .boxed();
        let exit_code = Box::pin(async move {
            held.lock()
                .ok()
                .and_then(|p| p.returncode())
                .ok_or_else(|| SandboxError::engine("broken", "no exit code"))
        });
        Ok(StartedExec {
            output,
            exit_code,
            killer: Arc::new(|| Box::pin(async { Ok(()) })),
            input: None,
        })
    };
    Ok(Process::new(
        Box::pin(start),
        timeout.unwrap_or(Duration::from_secs(300)),
        info,
    ))
}

/// Runs `cmd` with its shell's pid (its process group) recorded in a list every
/// command appends to; on a timeout, kills every group on the list —
/// `TimeoutKillsStrays`.
pub(super) async fn run_killing_every_group(
    sandbox: &dyn Sandbox,
    cmd: Command,
    options: RunOptions,
) -> Result<ExecResult> {
    const GROUPS: &str = "/tmp/.sbx-broken-groups";
    let cmd = match cmd {
        Command::Shell(script) => Command::Shell(format!("echo $$ >> {GROUPS}; {script}")),
        cmd => cmd,
    };
    let r = sandbox.run(cmd, options).await;
    if matches!(&r, Err(e) if e.code() == ErrorCode::ExecutionTimeout) {
        let groups = sandbox
            .run(
                vec!["cat".to_string(), GROUPS.to_string()].into(),
                RunOptions::default(),
            )
            .await?
            .stdout_text();
        for g in groups.lines().map(str::trim).filter(|g| !g.is_empty()) {
            let _ = sandbox
                .run(
                    vec!["kill".to_string(), "-9".to_string(), format!("-{g}")].into(),
                    RunOptions::default(),
                )
                .await;
        }
    }
    r
}

/// Runs `cmd` as a shell job whose pid is recorded, and on expiry kills only that
/// pid (its group lives on) — `KillOnlyExecPid`.
pub(super) async fn run_killing_only_the_pid(
    sandbox: &dyn Sandbox,
    script: &str,
    options: RunOptions,
) -> Result<ExecResult> {
    static N: AtomicU64 = AtomicU64::new(0);
    let Some(timeout) = options.timeout else {
        return sandbox
            .run(Command::Shell(script.to_string()), options)
            .await;
    };
    let pid_file = format!("/tmp/.sbx-broken-pid-{}", N.fetch_add(1, Ordering::SeqCst));
    let wrapped = format!("echo $$ > {pid_file}; {script}");
    let mut long = options.clone();
    long.timeout = Some(Duration::from_secs(300));
    let mut p = sandbox.stream(Command::Shell(wrapped), long)?;
    p.start().await?;
    let cap = options.output_cap.unwrap_or(64 << 20);
    match tokio::time::timeout(timeout, collect_all(&mut p, cap)).await {
        Ok(r) => r,
        Err(_) => {
            let pid = sandbox
                .run(
                    ["cat".to_string(), pid_file].to_vec().into(),
                    RunOptions::default(),
                )
                .await?
                .stdout_text();
            let _ = sandbox
                .run(
                    vec!["kill".to_string(), "-9".to_string(), pid.trim().to_string()].into(),
                    RunOptions::default(),
                )
                .await;
            abandon(p);
            Err(SandboxError::execution_timeout(timeout))
        }
    }
}

/// A started process whose output a task reads as fast as it comes into an unbounded
/// queue (`UnboundedStreamBuffer`).
pub(super) fn buffer_eagerly(inner: Process, timeout: Duration, info: OrphanInfo) -> Process {
    let start = async move {
        let mut inner = inner;
        inner.start().await?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (code_tx, code_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            while let Some(item) = inner.next().await {
                // Each chunk in its own allocation, as read off a socket (an in-process
                // backend may hand out slices of one shared buffer).
                let item = item.map(|mut c| {
                    c.data = Bytes::copy_from_slice(&c.data);
                    c
                });
                if tx.send(item).is_err() {
                    break;
                }
            }
            let _ = code_tx.send(inner.returncode().unwrap_or(-1));
        });
        let output = futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed();
        let exit_code = Box::pin(async move {
            code_rx
                .await
                .map_err(|_| SandboxError::engine("broken", "no exit code"))
        });
        Ok(StartedExec {
            output,
            exit_code,
            killer: Arc::new(|| Box::pin(async { Ok(()) })),
            input: None,
        })
    };
    Process::new(Box::pin(start), timeout, info)
}

/// Collects a started process's output into a result (the `run` shape).
async fn collect_all(p: &mut Process, cap: usize) -> Result<ExecResult> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(item) = p.next().await {
        let chunk = item?;
        match chunk.stream {
            sandbox_core::StreamKind::Stdout => out.extend_from_slice(&chunk.data),
            sandbox_core::StreamKind::Stderr => err.extend_from_slice(&chunk.data),
        }
        if out.len() + err.len() > cap {
            return Err(SandboxError::resource_limit("output", None));
        }
    }
    Ok(ExecResult::new(p.returncode().unwrap_or(-1), out, err))
}

/// `SwallowTimeouts`: a timed-out command reported as a successful exit 0.
pub(super) fn swallow(r: Result<ExecResult>) -> Result<ExecResult> {
    match r {
        Err(e) if e.code() == ErrorCode::ExecutionTimeout => Ok(ExecResult::new(0, "", "")),
        r => r,
    }
}
