//! Starting execs: the pid wrapper, exit codes, helper execs, and user processes.
//!
//! Every user command starts under a tiny `sh` wrapper that prints its own pid as the
//! exec's first stdout line and then `exec`s the argv unchanged (no shell parsing of the
//! user's list). The pid is read from the exec's *own* output stream before any user code
//! runs, so nothing inside the sandbox can forge it (a pidfile in a shared directory
//! could be rewritten to point a kill at PID 1). Every exec also carries a random token in
//! its environment (`SBX_EXEC`), which its children inherit: the kill finds background
//! children through it even after they were re-parented (see `kill.rs`).
//!
//! Exit codes come from the engine's exec inspect and are trusted only once it reports
//! the exec no longer running (Podman reports exit 0 while an exec still runs).

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sandbox_core::teardown::{Killer, OrphanInfo, TeardownGuard};
use sandbox_core::{
    ExecResult, OutputChunk, Process, Result, StartFuture, StartedExec, StreamKind,
};
use tokio::io::AsyncWriteExt;

use crate::engine::{ContainerEngine, ExecInput, ExecRequest};
use crate::error;
use crate::sandbox::kill::kill_argv;
use crate::sandbox::shared::Shared;
use crate::sandbox::stdin::Stdin;

/// Environment variable carrying each exec's token.
pub const EXEC_TOKEN_ENV: &str = "SBX_EXEC";

/// The wrapper: print our pid, then become the command. A missing program makes `exec`
/// fail with 127 and the shell's message on stderr.
pub(crate) const WRAPPER: &str = "echo \"$$\"; exec \"$@\"";

/// Longest first line accepted as the wrapper's pid line.
const PID_LINE_MAX: usize = 32;
/// Stderr held back while waiting for the pid line (the wrapper prints nothing there).
const HELD_STDERR_MAX: usize = 64 * 1024;
/// Bound on internal helper execs (kill, mkdir, ls, …): time and buffered output.
pub(crate) const HELPER_TIMEOUT: Duration = Duration::from_secs(30);
/// Output a helper may produce before it is refused.
pub(crate) const HELPER_OUTPUT_CAP: usize = 16 * 1024 * 1024;
/// How long an exec runs before its container is also watched for dying.
const WATCH_AFTER: Duration = Duration::from_secs(1);

/// The wrapper argv for `argv`.
pub(crate) fn wrap_argv(argv: &[String]) -> Vec<String> {
    let mut v = vec![
        "sh".to_string(),
        "-c".to_string(),
        WRAPPER.to_string(),
        // `$0`: names the program in the shell's error messages.
        argv.first().cloned().unwrap_or_else(|| "sh".into()),
    ];
    v.extend(argv.iter().cloned());
    v
}

/// A fresh exec token: 16 hex digits (fixed length, so no token is a prefix of another).
pub(crate) fn new_token() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// Parses the wrapper's first line.
pub(crate) fn parse_pid_line(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>().ok().filter(|p| *p > 1)
}

/// What to exec.
#[derive(Clone)]
pub(crate) struct ExecPlan {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: String,
    pub stdin: bool,
    /// Under the pid wrapper (user commands, interpreters, forwarders) or bare (helpers).
    pub wrapped: bool,
    /// Whether a dropped launch kills what it started. Off only for the kill helper
    /// itself, so a kill that times out cannot schedule kills of itself forever.
    pub guarded: bool,
}

impl ExecPlan {
    /// A bare, guarded helper exec in `/`.
    pub(crate) fn helper(argv: Vec<String>) -> Self {
        ExecPlan {
            argv,
            env: Vec::new(),
            workdir: "/".into(),
            stdin: false,
            wrapped: false,
            guarded: true,
        }
    }
}

/// A started exec.
pub(crate) struct Launched {
    pub exec_id: String,
    pub output: BoxStream<'static, Result<OutputChunk>>,
    pub input: Option<ExecInput>,
    /// Kills what this exec started (and only that).
    pub killer: Killer,
    /// Owns the remote process until the caller hands the killer on; dropping it kills.
    pub guard: TeardownGuard,
    /// The wrapper never ran: the engine's own text (e.g. no `sh` in the image) was
    /// turned into stderr, and an exit of 126/127 is reported as 127.
    pub engine_text: Arc<AtomicBool>,
}

/// Whether an output item is the reset of an attach connection its engine closed.
fn is_peer_reset<T>(item: &std::result::Result<T, crate::EngineError>) -> bool {
    let Err(e) = item else { return false };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// Creates and starts an exec; for a wrapped plan, reads the pid line first.
pub(crate) async fn launch<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    plan: ExecPlan,
) -> Result<Launched> {
    let token = new_token();
    let argv = if plan.wrapped {
        wrap_argv(&plan.argv)
    } else {
        plan.argv
    };
    let mut env = plan.env;
    env.push((EXEC_TOKEN_ENV.to_string(), token.clone()));
    let mut request = ExecRequest::new(argv, plan.workdir);
    request.env = env;
    request.stdin = plan.stdin;
    let stream = sh
        .call("exec", sh.engine.exec(&sh.id, request))
        .await
        .map_err(|e| error::on_sandbox(&*sh.engine, &sh.id, "exec", e))?;
    let exec_id = stream.exec_id;
    // From here the remote process may exist: a dropped launch kills it, by token until
    // the pid is known.
    let info = OrphanInfo::new(
        format!("{}/{exec_id}", sh.id),
        sh.engine.backend(),
        sh.labels.clone(),
    );
    let token_killer = exec_killer(sh, exec_id.clone(), None, token.clone());
    let mut guard = TeardownGuard::new(info.clone(), token_killer.clone());
    if !plan.guarded {
        guard.disarm();
    }
    let eng = sh.engine.clone();
    let id = sh.id.clone();
    let raw = match plan.stdin {
        // An engine that closes the attach connection with input still unread in it
        // (the process exited without reading it all) makes our next read fail with a
        // reset after the output it had sent: that is the end of the output, not a
        // failure. A real failure still shows, in the exit status the engine reports.
        true => stream
            .output
            .take_while(|item| futures::future::ready(!is_peer_reset(item)))
            .boxed(),
        false => stream.output,
    };
    // Fused: the pid line's reader may see the end of the output, and the stream is
    // then chained behind what it held and polled again (an engine's stream must not be
    // polled after its end; some panic).
    let mut output: BoxStream<'static, Result<OutputChunk>> = raw
        .map_err(move |e| error::on_sandbox(&*eng, &id, "exec output", e))
        .fuse()
        .boxed();
    let engine_text = Arc::new(AtomicBool::new(false));
    let mut killer = token_killer;
    if plan.wrapped {
        let (pid, prefix) = read_pid_line(&mut output).await?;
        match pid {
            Some(pid) => {
                killer = exec_killer(sh, exec_id.clone(), Some(pid), token);
                if plan.guarded {
                    // Disarmed first: dropping an armed guard would kill the exec.
                    guard.disarm();
                    guard = TeardownGuard::new(info, killer.clone());
                }
                output = futures::stream::iter(prefix.into_iter().map(Ok))
                    .chain(output)
                    .boxed();
            }
            None => {
                engine_text.store(true, Ordering::SeqCst);
                let rest = output.map_ok(|c| OutputChunk::stderr(c.data));
                output = futures::stream::iter(prefix.into_iter().map(Ok))
                    .chain(rest)
                    .boxed();
            }
        }
    }
    let output = watch_container(sh.clone(), output);
    Ok(Launched {
        exec_id,
        output,
        input: stream.input,
        killer,
        guard,
        engine_text,
    })
}

/// Reads until the wrapper's pid line. Returns the pid (or `None` when the first line is
/// not ours, i.e. the wrapper never ran) and the output read past it, in order.
async fn read_pid_line(
    output: &mut BoxStream<'static, Result<OutputChunk>>,
) -> Result<(Option<u32>, Vec<OutputChunk>)> {
    let mut line = BytesMut::new();
    let mut held: Vec<OutputChunk> = Vec::new();
    let mut held_len = 0usize;
    let not_ours = |line: BytesMut, held: Vec<OutputChunk>| {
        let mut v = Vec::with_capacity(held.len() + 1);
        if !line.is_empty() {
            v.push(OutputChunk::stderr(line.freeze()));
        }
        v.extend(held.into_iter().map(|c| OutputChunk::stderr(c.data)));
        (None, v)
    };
    loop {
        match output.next().await {
            Some(Ok(c)) if c.stream == StreamKind::Stdout => {
                line.extend_from_slice(&c.data);
                if let Some(pos) = line.iter().position(|b| *b == b'\n') {
                    let rest = line.split_off(pos + 1);
                    if let Some(pid) = parse_pid_line(&line[..pos]) {
                        if !rest.is_empty() {
                            held.push(OutputChunk::stdout(rest.freeze()));
                        }
                        return Ok((Some(pid), held));
                    }
                    line.unsplit(rest);
                    return Ok(not_ours(line, held));
                }
                if line.len() > PID_LINE_MAX {
                    return Ok(not_ours(line, held));
                }
            }
            Some(Ok(c)) => {
                held_len += c.data.len();
                held.push(c);
                if held_len > HELD_STDERR_MAX {
                    return Ok(not_ours(line, held));
                }
            }
            Some(Err(e)) => return Err(e),
            None => return Ok(not_ours(line, held)),
        }
    }
}

/// Ends `output` with `SandboxGone` if the container stops while the exec's stream is
/// still open: some runtimes (runsc) leave the attach stream open and the exec "running"
/// forever when the sandbox dies under it. Checked only while the stream is polled.
fn watch_container<E: ContainerEngine>(
    sh: Arc<Shared<E>>,
    output: BoxStream<'static, Result<OutputChunk>>,
) -> BoxStream<'static, Result<OutputChunk>> {
    let died = Arc::new(AtomicBool::new(false));
    let flag = died.clone();
    let watch = sh.clone();
    let watchdog = async move {
        tokio::time::sleep(WATCH_AFTER).await;
        loop {
            if !watch.container_running().await {
                flag.store(true, Ordering::SeqCst);
                return;
            }
            tokio::time::sleep(WATCH_AFTER).await;
        }
    };
    let gone = futures::stream::once(async move {
        died.load(Ordering::SeqCst)
            .then(|| Err(error::gone(&sh.id)))
    })
    .filter_map(futures::future::ready);
    output.take_until(watchdog).chain(gone).boxed()
}

/// A killer for exec `exec_id` (root `pid` when known, `token` always).
pub(crate) fn exec_killer<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    exec_id: String,
    pid: Option<u32>,
    token: String,
) -> Killer {
    let sh = sh.clone();
    Arc::new(move || {
        let sh = sh.clone();
        let exec_id = exec_id.clone();
        let token = token.clone();
        Box::pin(async move {
            let root = match pid {
                Some(pid) => {
                    let state = sh
                        .call("exec inspect", sh.engine.exec_state(&exec_id))
                        .await
                        .map_err(|e| error::on_sandbox(&*sh.engine, &sh.id, "exec inspect", e))?;
                    state.running.then_some(pid)
                }
                None => None,
            };
            let mut plan = ExecPlan::helper(kill_argv(root, &token));
            plan.guarded = false;
            let r = helper(&sh, plan).await?;
            if r.exit_code != 0 {
                return Err(error::internal(
                    sh.engine.backend(),
                    format!("killing exec {exec_id} exited {}", r.exit_code),
                ));
            }
            Ok(())
        })
    })
}

/// The exit code of an exec, once the engine reports it no longer running. A container
/// that stopped under it is `SandboxGone`, never a hang.
pub(crate) async fn exit_code<E: ContainerEngine>(sh: &Shared<E>, exec_id: &str) -> Result<i64> {
    let mut delay = Duration::from_millis(1);
    let mut next_container_check = tokio::time::Instant::now() + WATCH_AFTER;
    loop {
        let state = sh
            .call("exec inspect", sh.engine.exec_state(exec_id))
            .await
            .map_err(|e| error::on_sandbox(&*sh.engine, &sh.id, "exec inspect", e))?;
        if !state.running {
            return Ok(state.exit_code.unwrap_or(-1));
        }
        if tokio::time::Instant::now() >= next_container_check {
            if !sh.container_running().await {
                return Err(error::gone(&sh.id));
            }
            next_container_check = tokio::time::Instant::now() + WATCH_AFTER;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(50));
    }
}

/// Runs a helper to completion, bounded in time ([`HELPER_TIMEOUT`]) and output
/// ([`HELPER_OUTPUT_CAP`]); past either bound it is killed and refused.
pub(crate) async fn helper<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    plan: ExecPlan,
) -> Result<ExecResult> {
    let r = helper_once(sh, plan.clone()).await?;
    // Exit 126 with nothing on stderr means the engine could not exec the helper at all
    // (its own text goes to stdout; seen on runsc under load: "OCI runtime exec failed").
    // The helper scripts never exit 126 themselves and had not started, so one retry is
    // safe; a second failure is reported as it is.
    if r.exit_code == 126 && r.stderr.is_empty() {
        tracing::debug!(
            sandbox_id = %sh.id,
            "internal exec refused by the engine (exit 126); retrying once"
        );
        tokio::time::sleep(HELPER_RETRY_DELAY).await;
        return helper_once(sh, plan).await;
    }
    Ok(r)
}

/// Pause before the one retry of a helper the engine could not exec.
const HELPER_RETRY_DELAY: Duration = Duration::from_millis(100);

async fn helper_once<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    plan: ExecPlan,
) -> Result<ExecResult> {
    let backend = sh.engine.backend();
    let fut = async {
        let mut l = launch(sh, plan).await?;
        let mut out = BytesMut::new();
        let mut err = BytesMut::new();
        while let Some(chunk) = l.output.next().await {
            let chunk = chunk?;
            let buf = match chunk.stream {
                StreamKind::Stdout => &mut out,
                StreamKind::Stderr => &mut err,
            };
            if buf.len() + chunk.data.len() > HELPER_OUTPUT_CAP {
                // Dropping `l` (its guard armed) kills the helper.
                return Err(error::limit(
                    format!("internal helper output ({HELPER_OUTPUT_CAP} bytes)"),
                    "the directory or path holds more than sandbox-rs's helpers read at once; \
                     use run() or download() to handle it in parts",
                ));
            }
            buf.extend_from_slice(&chunk.data);
        }
        let code = exit_code(sh, &l.exec_id).await?;
        l.guard.disarm();
        Ok(ExecResult::new(code, out.freeze(), err.freeze()))
    };
    match tokio::time::timeout(HELPER_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(error::internal(
            backend,
            format!("an internal exec did not finish within {HELPER_TIMEOUT:?}"),
        )),
    }
}

/// A bare helper of `argv` in `/`.
pub(crate) async fn helper_argv<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    argv: &[&str],
) -> Result<ExecResult> {
    helper(
        sh,
        ExecPlan::helper(argv.iter().map(|s| s.to_string()).collect()),
    )
    .await
}

/// The future that starts a user process for `sandbox_core::Process`.
fn start_future<E: ContainerEngine>(
    sh: Arc<Shared<E>>,
    plan: ExecPlan,
    stdin: Stdin,
) -> StartFuture {
    Box::pin(async move {
        sh.remaining()?;
        let mut l = launch(&sh, plan).await?;
        let attached = match (stdin.attached(), l.input.take()) {
            (false, _) => None,
            (true, Some(input)) => Some(input),
            (true, None) => {
                return Err(error::internal(
                    sh.engine.backend(),
                    "the engine attached no stdin",
                ));
            }
        };
        let mut live = None;
        match (stdin, attached) {
            (Stdin::Given(data), Some(mut input)) => crate::sandbox::stdin::beside(
                &mut l.output,
                Box::pin(async move {
                    input.write_all(&data).await?;
                    input.shutdown().await
                }),
            ),
            (Stdin::Live, Some(input)) => {
                live = Some(crate::sandbox::stdin::live(&mut l.output, input));
            }
            // Terminals are the agent's (the layer refuses them here first).
            (Stdin::Terminal(_), _) => {
                return Err(sandbox_core::SandboxError::unsupported(
                    sandbox_core::Capability::PTY,
                    sh.engine.backend(),
                ));
            }
            _ => {}
        }
        l.guard.disarm();
        let exec_id = l.exec_id.clone();
        let engine_text = l.engine_text.clone();
        let exit = Box::pin(async move {
            let code = exit_code(&sh, &exec_id).await?;
            if engine_text.load(Ordering::SeqCst) && code != 0 {
                // The engine could not start the command: an exhausted pids limit is a
                // typed state, not the engine's exit code.
                if let Some(numbers) = crate::sandbox::pids::exhausted_on_host(&sh).await {
                    return Err(sandbox_core::SandboxError::pids_exhausted(format!(
                        "the engine could not start the command, the sandbox's pids limit \
                         is exhausted ({numbers})"
                    )));
                }
                if code == 126 || code == 127 {
                    return Ok(127);
                }
            }
            Ok(code)
        });
        Ok(StartedExec {
            output: l.output,
            exit_code: exit,
            killer: l.killer,
            input: live,
        })
    })
}

/// A user command as a lazily started, killable [`Process`] bounded by `timeout`.
pub(crate) fn process<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    argv: Vec<String>,
    env: &std::collections::BTreeMap<String, String>,
    workdir: Option<&str>,
    timeout: Duration,
    stdin: Stdin,
) -> Result<Process> {
    let workdir = match workdir {
        Some(w) => sandbox_core::resolve_path(&sh.workdir, w)?,
        None => sh.workdir.clone(),
    };
    let plan = ExecPlan {
        argv,
        env: sh.exec_env(env),
        workdir,
        stdin: stdin.attached(),
        wrapped: true,
        guarded: true,
    };
    Ok(Process::new(
        start_future(sh.clone(), plan, stdin),
        timeout,
        sh.info(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapper_execs_argv_without_parsing_it() {
        let argv = vec!["echo".to_string(), "$HOME; rm -rf /".to_string()];
        let w = wrap_argv(&argv);
        assert_eq!(&w[..3], &["sh", "-c", WRAPPER]);
        assert_eq!(&w[3], "echo", "$0 names the program in error messages");
        assert_eq!(
            &w[4..],
            &argv[..],
            "argv passed verbatim as positional args"
        );
        assert!(
            !WRAPPER.contains("/dev/shm") && !WRAPPER.contains('>'),
            "no pidfile"
        );
    }

    #[test]
    fn pid_line_is_strict() {
        assert_eq!(parse_pid_line(b"1234"), Some(1234));
        assert_eq!(parse_pid_line(b" 77\r"), Some(77));
        assert_eq!(parse_pid_line(b"1"), None, "never PID 1");
        assert_eq!(parse_pid_line(b"0"), None);
        assert_eq!(parse_pid_line(b"-1"), None);
        assert_eq!(parse_pid_line(b"12 34"), None);
        assert_eq!(parse_pid_line(b"99999999999"), None, "overflow refused");
        assert_eq!(parse_pid_line(b"OCI runtime exec failed"), None);
        assert_eq!(parse_pid_line(b""), None);
    }

    #[test]
    fn tokens_are_fixed_length_and_distinct() {
        let a = new_token();
        let b = new_token();
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    fn chunks(v: Vec<OutputChunk>) -> BoxStream<'static, Result<OutputChunk>> {
        futures::stream::iter(v.into_iter().map(Ok)).boxed()
    }

    #[tokio::test]
    async fn pid_line_split_across_chunks_keeps_the_rest() {
        let mut s = chunks(vec![
            OutputChunk::stdout("12"),
            OutputChunk::stderr("early"),
            OutputChunk::stdout("3\nhello"),
        ]);
        let (pid, rest) = read_pid_line(&mut s).await.unwrap();
        assert_eq!(pid, Some(123));
        assert_eq!(
            rest,
            vec![OutputChunk::stderr("early"), OutputChunk::stdout("hello")]
        );
    }

    #[tokio::test]
    async fn engine_text_instead_of_a_pid_becomes_stderr() {
        let mut s = chunks(vec![OutputChunk::stdout(
            "OCI runtime exec failed: no sh\n",
        )]);
        let (pid, rest) = read_pid_line(&mut s).await.unwrap();
        assert_eq!(pid, None);
        assert_eq!(
            rest,
            vec![OutputChunk::stderr("OCI runtime exec failed: no sh\n")]
        );
        let mut s = chunks(vec![OutputChunk::stdout("x".repeat(100))]);
        assert_eq!(
            read_pid_line(&mut s).await.unwrap().0,
            None,
            "an endless line is not a pid"
        );
    }
}
