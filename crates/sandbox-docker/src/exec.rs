//! Running commands: `run`, `run_code` and `stream` on the exec API.
//!
//! Every user command starts under a tiny `sh` wrapper that records its pid in
//! `/dev/shm/.sbx.<token>` and then `exec`s the argv unchanged (no shell parsing of the
//! user's list). The engine makes each exec a process-group leader, so a second exec can
//! kill exactly that tree with `kill -KILL -<pgid>`, leaving the sandbox usable. Exit codes
//! come from exec inspect, trusted only once `Running == false`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sandbox_core::options::DEFAULT_OUTPUT_CAP;
use sandbox_core::teardown::{Killer, TeardownGuard};
use sandbox_core::{
    CodeOptions, Command, ExecResult, OutputChunk, Process, Result, RunOptions, SandboxError,
    StartFuture, StartedExec,
};
use tokio::io::AsyncWrite;
use tracing::Instrument;

use crate::error::{self, BACKEND};
use crate::sandbox::SandboxInner;

/// Where the wrapper records each exec's pid (a tmpfs on runc and runsc alike).
pub(crate) const PID_DIR: &str = "/dev/shm";

/// Engine text for an exec whose binary is missing (when even `sh` is absent).
const ENGINE_EXEC_FAILED: &[u8] = b"OCI runtime exec failed";

/// Bound on internal helper execs (kill, mkdir, ls, …).
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);

/// The wrapper argv: records `$$` (the exec's pid and pgid) and `exec`s the user's argv.
pub(crate) fn wrap_argv(token: &str, argv: &[String]) -> Vec<String> {
    let mut v = vec![
        "sh".to_string(),
        "-c".to_string(),
        format!("echo $$ > {PID_DIR}/.sbx.{token} 2>/dev/null; exec \"$@\""),
        argv.first().cloned().unwrap_or_else(|| "sh".into()),
    ];
    v.extend(argv.iter().cloned());
    v
}

/// The script a second exec runs to kill one exec's process group.
pub(crate) fn kill_script(token: &str) -> String {
    let f = format!("{PID_DIR}/.sbx.{token}");
    format!(
        "i=0; while [ ! -s {f} ] && [ $i -lt 100 ]; do sleep 0.01; i=$((i+1)); done; \
         p=$(cat {f} 2>/dev/null) || exit 0; [ -n \"$p\" ] || exit 0; \
         kill -KILL -$p 2>/dev/null; kill -KILL $p 2>/dev/null; rm -f {f}; exit 0"
    )
}

/// What one exec runs.
pub(crate) struct ExecSpec {
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub workdir: String,
    pub stdin: bool,
    /// Bytes written to stdin right after start, then stdin is closed.
    pub feed: Option<bytes::Bytes>,
    /// Run under the pid-recording wrapper (user commands) or bare (helpers).
    pub wrapped: bool,
}

/// A started exec with its streams.
pub(crate) struct RawExec {
    pub exec_id: String,
    pub output: BoxStream<'static, Result<OutputChunk>>,
    pub input: std::pin::Pin<Box<dyn AsyncWrite + Send>>,
    pub killer: Killer,
    /// Set when the engine reported a missing executable on stdout.
    pub engine_missing_binary: Arc<AtomicBool>,
}

/// A killer that kills only the process group of exec `token`.
pub(crate) fn exec_killer(inner: &Arc<SandboxInner>, exec_id: String, token: String) -> Killer {
    let inner = inner.clone();
    Arc::new(move || {
        let inner = inner.clone();
        let exec_id = exec_id.clone();
        let token = token.clone();
        Box::pin(async move {
            // Nothing to kill once the engine reports the exec ended (its pid may be reused).
            match inner.client.inspect_exec(&exec_id).await {
                Ok(i) if i.running == Some(false) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(error::for_sandbox(&inner.id, "inspect exec", e)),
            }
            let spec = ExecSpec {
                argv: vec!["sh".into(), "-c".into(), kill_script(&token)],
                env: vec![],
                workdir: "/".into(),
                stdin: false,
                feed: None,
                wrapped: false,
            };
            let r = helper(&inner, spec).await?;
            if r.exit_code != 0 {
                return Err(SandboxError::Engine {
                    backend: BACKEND.into(),
                    message: format!("killing exec {exec_id} exited {}", r.exit_code),
                    source: None,
                });
            }
            Ok(())
        })
    })
}

/// Creates and starts an exec, attached. A drop after the engine started it kills it.
pub(crate) async fn start_exec(inner: &Arc<SandboxInner>, spec: ExecSpec) -> Result<RawExec> {
    let token = inner.next_token();
    let argv = if spec.wrapped {
        wrap_argv(&token, &spec.argv)
    } else {
        spec.argv.clone()
    };
    let config = CreateExecOptions::<String> {
        cmd: Some(argv),
        env: Some(spec.env.clone()),
        working_dir: Some(spec.workdir.clone()),
        attach_stdin: Some(spec.stdin || spec.feed.is_some()),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        ..Default::default()
    };
    let created = inner
        .client
        .create_exec(&inner.id, config)
        .await
        .map_err(|e| error::for_sandbox(&inner.id, "create exec", e))?;
    let killer = if spec.wrapped {
        exec_killer(inner, created.id.clone(), token)
    } else {
        noop_killer()
    };
    // From here the remote process may exist: a dropped future must kill it.
    let mut guard = TeardownGuard::new(
        sandbox_core::teardown::OrphanInfo::new(
            format!("{}/{}", inner.id, created.id),
            BACKEND,
            inner.labels.clone(),
        ),
        killer.clone(),
    );
    let started = inner
        .client
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty: false,
                output_capacity: Some(64 * 1024),
            }),
        )
        .await
        .map_err(|e| error::for_sandbox(&inner.id, "start exec", e));
    let started = match started {
        Ok(s) => s,
        Err(e) => {
            guard.disarm();
            return Err(e);
        }
    };
    guard.disarm();
    let StartExecResults::Attached { output, input } = started else {
        return Err(SandboxError::Engine {
            backend: BACKEND.into(),
            message: "engine started the exec detached".into(),
            source: None,
        });
    };
    let missing = Arc::new(AtomicBool::new(false));
    let flag = missing.clone();
    let id = inner.id.clone();
    let mut first = true;
    let output = output
        .map_err(move |e| error::for_sandbox(&id, "exec output", e))
        .try_filter_map(move |item| {
            let chunk = match item {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    // Normalise the engine's own "executable not found" text (on stdout,
                    // exit 126/127) into the contract's form: stderr, exit 127.
                    if first && message.starts_with(ENGINE_EXEC_FAILED) {
                        flag.store(true, Ordering::SeqCst);
                        Some(OutputChunk::stderr(message))
                    } else {
                        Some(OutputChunk::stdout(message))
                    }
                }
                LogOutput::StdErr { message } => Some(OutputChunk::stderr(message)),
                LogOutput::StdIn { .. } => None,
            };
            first = false;
            futures::future::ready(Ok(chunk))
        })
        .boxed();
    let output = watch_container(inner.clone(), output);
    Ok(RawExec {
        exec_id: created.id,
        output,
        input,
        killer,
        engine_missing_binary: missing,
    })
}

/// How long an exec runs before its output is also watched for the container dying.
const WATCH_AFTER: Duration = Duration::from_secs(1);

/// Ends `output` with `SandboxGone` if the container stops while the exec's stream is
/// still open. Needed because some runtimes (runsc) leave the attach stream open and the
/// exec "running" forever when the sandbox dies under it. The check runs only while the
/// stream is being polled (one inspect per second).
fn watch_container(
    inner: Arc<SandboxInner>,
    output: BoxStream<'static, Result<OutputChunk>>,
) -> BoxStream<'static, Result<OutputChunk>> {
    let died = Arc::new(AtomicBool::new(false));
    let flag = died.clone();
    let watch_inner = inner.clone();
    let watchdog = async move {
        tokio::time::sleep(WATCH_AFTER).await;
        loop {
            if !crate::code::container_running(&watch_inner).await {
                flag.store(true, Ordering::SeqCst);
                return;
            }
            tokio::time::sleep(WATCH_AFTER).await;
        }
    };
    let gone =
        futures::stream::once(
            async move { died.load(Ordering::SeqCst).then(|| Err(inner.gone())) },
        )
        .filter_map(futures::future::ready);
    output.take_until(watchdog).chain(gone).boxed()
}

fn noop_killer() -> Killer {
    Arc::new(|| Box::pin(async { Ok(()) }))
}

/// The exit code of an exec, once the engine reports it no longer running.
pub(crate) async fn exit_code(client: &Docker, sandbox_id: &str, exec_id: &str) -> Result<i64> {
    let mut delay = Duration::from_millis(1);
    let started = tokio::time::Instant::now();
    let mut next_container_check = started + WATCH_AFTER;
    loop {
        let i = client
            .inspect_exec(exec_id)
            .await
            .map_err(|e| error::for_sandbox(sandbox_id, "inspect exec", e))?;
        if i.running == Some(false) {
            return Ok(i.exit_code.unwrap_or(-1));
        }
        // An exec can stay "running" forever when its container died (runsc).
        if tokio::time::Instant::now() >= next_container_check {
            let running = match client.inspect_container(sandbox_id, None).await {
                Ok(c) => c.state.and_then(|s| s.running).unwrap_or(false),
                Err(e) => return Err(error::for_sandbox(sandbox_id, "inspect container", e)),
            };
            if !running {
                return Err(SandboxError::SandboxGone {
                    id: sandbox_id.to_string(),
                });
            }
            next_container_check = tokio::time::Instant::now() + WATCH_AFTER;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(50));
    }
}

fn start_future(inner: Arc<SandboxInner>, spec: ExecSpec) -> StartFuture {
    Box::pin(async move {
        inner.remaining()?;
        let feed = spec.feed.clone();
        let mut raw = start_exec(&inner, spec).await?;
        if let Some(data) = feed {
            use tokio::io::AsyncWriteExt;
            let fed = async {
                raw.input.write_all(&data).await?;
                raw.input.shutdown().await
            }
            .await;
            if let Err(e) = fed {
                sandbox_core::teardown::spawn_bounded_kill(inner.info(), (raw.killer)());
                return Err(SandboxError::Engine {
                    backend: BACKEND.into(),
                    message: "writing the exec's stdin failed".into(),
                    source: Some(Box::new(e)),
                });
            }
        }
        let client = inner.client.clone();
        let id = inner.id.clone();
        let exec_id = raw.exec_id.clone();
        let missing = raw.engine_missing_binary.clone();
        let exit_code = Box::pin(async move {
            let code = exit_code(&client, &id, &exec_id).await?;
            if missing.load(Ordering::SeqCst) && (code == 126 || code == 127) {
                return Ok(127);
            }
            Ok(code)
        });
        Ok(StartedExec {
            output: raw.output,
            exit_code,
            killer: raw.killer,
        })
    })
}

/// A user command as a lazily started, killable [`Process`].
pub(crate) fn process(
    inner: &Arc<SandboxInner>,
    argv: Vec<String>,
    env: &std::collections::BTreeMap<String, String>,
    workdir: Option<&str>,
    timeout: Duration,
    feed: Option<bytes::Bytes>,
) -> Result<Process> {
    let workdir = match workdir {
        Some(w) => sandbox_core::resolve_path(&inner.workdir, w)?,
        None => inner.workdir.clone(),
    };
    let spec = ExecSpec {
        argv,
        env: inner.exec_env(env),
        workdir,
        stdin: false,
        feed,
        wrapped: true,
    };
    let info = inner.info();
    Ok(Process::new(
        start_future(inner.clone(), spec),
        timeout,
        info,
    ))
}

/// `Sandbox::run`.
pub(crate) async fn run(
    inner: &Arc<SandboxInner>,
    cmd: Command,
    options: RunOptions,
) -> Result<ExecResult> {
    cmd.validate()?;
    let timeout = options.validate(inner.remaining()?)?;
    let cap = options.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
    let span = tracing::info_span!("sandbox.run", backend = BACKEND, sandbox_id = %inner.id);
    async {
        let p = process(
            inner,
            cmd.to_argv(),
            &options.env,
            options.workdir.as_deref(),
            timeout,
            None,
        )?;
        let r = p.collect(cap).await;
        if let Ok(r) = &r {
            tracing::debug!(exit_code = r.exit_code, "run finished");
        }
        r
    }
    .instrument(span)
    .await
}

/// `Sandbox::stream`: validated here, started on first poll.
pub(crate) fn stream(
    inner: &Arc<SandboxInner>,
    cmd: Command,
    options: RunOptions,
) -> Result<Process> {
    cmd.validate()?;
    let timeout = options.validate(inner.remaining()?)?;
    process(
        inner,
        cmd.to_argv(),
        &options.env,
        options.workdir.as_deref(),
        timeout,
        None,
    )
}

/// Runs a helper command (bounded, output buffered) outside any user timeout.
pub(crate) async fn helper(inner: &Arc<SandboxInner>, spec: ExecSpec) -> Result<ExecResult> {
    let fut = async {
        let raw = start_exec(inner, spec).await?;
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut output = raw.output;
        while let Some(chunk) = output.next().await {
            let chunk = chunk?;
            match chunk.stream {
                sandbox_core::StreamKind::Stdout => out.extend_from_slice(&chunk.data),
                sandbox_core::StreamKind::Stderr => err.extend_from_slice(&chunk.data),
            }
        }
        let code = exit_code(&inner.client, &inner.id, &raw.exec_id).await?;
        Ok(ExecResult::new(code, out, err))
    };
    match tokio::time::timeout(HELPER_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(SandboxError::Engine {
            backend: BACKEND.into(),
            message: format!("internal exec did not finish within {HELPER_TIMEOUT:?}"),
            source: None,
        }),
    }
}

/// A bare helper exec of `argv` in `/`.
pub(crate) async fn helper_argv(inner: &Arc<SandboxInner>, argv: &[&str]) -> Result<ExecResult> {
    helper(
        inner,
        ExecSpec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![],
            workdir: "/".into(),
            stdin: false,
            feed: None,
            wrapped: false,
        },
    )
    .await
}

/// Whether the template has the interpreter (checked once per sandbox).
async fn ensure_interpreter(inner: &Arc<SandboxInner>, interpreter: &str) -> Result<()> {
    let present = inner
        .python
        .get_or_try_init(|| async {
            let r = helper_argv(
                inner,
                &[
                    "sh",
                    "-c",
                    &format!("command -v {interpreter} >/dev/null 2>&1"),
                ],
            )
            .await?;
            Ok::<bool, SandboxError>(r.exit_code == 0)
        })
        .await?;
    if *present {
        Ok(())
    } else {
        Err(SandboxError::InterpreterMissing {
            interpreter: interpreter.to_string(),
            template: inner.template.clone(),
        })
    }
}

/// Largest code passed as an argument; larger code goes through stdin.
const MAX_INLINE_CODE: usize = 96 * 1024;

/// `Sandbox::run_code`.
pub(crate) async fn run_code(
    inner: &Arc<SandboxInner>,
    code: &str,
    options: CodeOptions,
) -> Result<ExecResult> {
    let timeout = options.validate(inner.remaining()?)?;
    let cap = options.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
    let interpreter = options.language.interpreter();
    if options.context_id.is_some() {
        sandbox_core::policy::require(
            inner.caps,
            sandbox_core::Capability::STATEFUL_CODE,
            BACKEND,
        )?;
    }
    let span = tracing::info_span!(
        "sandbox.run_code",
        backend = BACKEND,
        sandbox_id = %inner.id,
        stateful = options.context_id.is_some()
    );
    async {
        ensure_interpreter(inner, interpreter).await?;
        if let Some(ctx) = &options.context_id {
            return crate::code::run_in_context(inner, ctx, code, timeout, cap).await;
        }
        let (argv, feed) = if code.len() <= MAX_INLINE_CODE {
            (
                vec![interpreter.to_string(), "-c".into(), code.to_string()],
                None,
            )
        } else {
            (
                vec![interpreter.to_string(), "-".into()],
                Some(bytes::Bytes::from(code.to_string())),
            )
        };
        let p = process(inner, argv, &Default::default(), None, timeout, feed)?;
        p.collect(cap).await
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapper_execs_argv_without_parsing_it() {
        let argv = vec!["echo".to_string(), "$HOME; rm -rf /".to_string()];
        let w = wrap_argv("t1", &argv);
        assert_eq!(&w[..2], &["sh", "-c"]);
        assert!(w[2].contains("/dev/shm/.sbx.t1") && w[2].ends_with("exec \"$@\""));
        assert_eq!(&w[3], "echo", "$0 names the program in error messages");
        assert_eq!(
            &w[4..],
            &argv[..],
            "argv passed verbatim as positional args"
        );
    }

    #[test]
    fn kill_script_targets_the_group() {
        let s = kill_script("t9");
        assert!(s.contains("kill -KILL -$p"));
        assert!(s.contains("/dev/shm/.sbx.t9"));
    }
}
