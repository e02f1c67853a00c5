//! `run_code`: stateless through a plain exec, stateful through one persistent interpreter
//! per context, speaking one wire protocol.
//!
//! A context is a process running [`DRIVER`] with stdin attached: spawned by the in-sandbox
//! agent when there is one (a request then costs no engine round-trip), otherwise an
//! engine exec under the pid wrapper, so it is killable. Requests are `u32 BE length + UTF-8 code`. The driver `exec`s each in one
//! persistent globals dict, capturing output at the file-descriptor level (so
//! subprocesses' output is captured too), and answers with one frame:
//! `"SBX1" | u64 BE stdout length | stdout | u64 BE stderr length | stderr | i32 BE exit`.
//!
//! The user's code runs inside the driver process, so it can write to the driver's
//! response fd and forge frames: nothing can make the protocol unforgeable from inside. A
//! frame is therefore trusted no more than user output: each length is checked against
//! the output cap *before* anything is buffered (no length arithmetic can overflow), and
//! a frame that is malformed or too large kills the context with a typed error. A timeout,
//! a dropped call or a protocol failure kills that context's interpreter: its state is
//! lost and the next call with the same id starts a fresh one. At most
//! `ContainerConfig::max_contexts` contexts live per sandbox.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use futures::StreamExt;
use sandbox_agent::protocol::SpawnSpec;
use sandbox_core::options::DEFAULT_OUTPUT_CAP;
use sandbox_core::teardown::{Killer, OrphanInfo, TeardownGuard};
use sandbox_core::{Capability, CodeOptions, ExecResult, Result, SandboxError, StreamKind};
use tokio::io::AsyncWriteExt;

use crate::engine::ContainerEngine;
use crate::error;
use crate::sandbox::context::CodeContext;
use crate::sandbox::context::ContextExit;
use crate::sandbox::context::ContextInput;
use crate::sandbox::context::ContextSlot;
use crate::sandbox::exec::{ExecPlan, HELPER_TIMEOUT, exit_code, helper_argv, launch};
use crate::sandbox::shared::Shared;
use crate::sandbox::stdin::Stdin;

/// Response frame magic.
pub const MAGIC: &[u8; 4] = b"SBX1";
/// Largest code sent as an argument of a stateless run; larger code goes through stdin.
const MAX_INLINE_CODE: usize = 96 * 1024;
/// Output kept from the interpreter probe (it prints nothing).
const PROBE_OUTPUT_CAP: usize = 4096;
/// Driver stderr kept for the message when an interpreter dies.
const DRIVER_STDERR_MAX: usize = 64 * 1024;

/// The driver, run as `python3 -u -c DRIVER`.
pub const DRIVER: &str = r#"
import os, struct, sys, tempfile, traceback
_rd = os.fdopen(os.dup(0), 'rb', buffering=0)
_wr = os.fdopen(os.dup(1), 'wb', buffering=0)
_err = os.dup(2)
_null = os.open(os.devnull, os.O_RDWR)
os.dup2(_null, 0)
os.dup2(_null, 1)
_g = {'__name__': '__main__', '__builtins__': __builtins__}
def _read(k):
    b = bytearray()
    while len(b) < k:
        c = _rd.read(k - len(b))
        if not c:
            os._exit(0)
        b += c
    return bytes(b)
while True:
    (_n,) = struct.unpack('>I', _read(4))
    _src = _read(_n).decode('utf-8', 'replace')
    _fo = tempfile.TemporaryFile()
    _fe = tempfile.TemporaryFile()
    os.dup2(_fo.fileno(), 1)
    os.dup2(_fe.fileno(), 2)
    sys.stdout = open(1, 'w', closefd=False, errors='backslashreplace')
    sys.stderr = open(2, 'w', closefd=False, errors='backslashreplace')
    _rc = 0
    try:
        exec(compile(_src, '<code>', 'exec'), _g)
    except SystemExit as _e:
        if _e.code is None:
            _rc = 0
        elif isinstance(_e.code, int):
            _rc = _e.code
        else:
            print(_e.code, file=sys.stderr)
            _rc = 1
    except BaseException as _e:
        _tb = _e.__traceback__
        if _tb is not None and _tb.tb_frame.f_code.co_filename == '<string>':
            _tb = _tb.tb_next
        traceback.print_exception(type(_e), _e, _tb)
        _rc = 1
    for _s in (sys.stdout, sys.stderr):
        try:
            _s.flush()
        except Exception:
            pass
    os.dup2(_null, 1)
    os.dup2(_err, 2)
    sys.stdout = sys.__stdout__
    sys.stderr = sys.__stderr__
    _out = b''
    _e2 = b''
    _fo.seek(0)
    _out = _fo.read()
    _fe.seek(0)
    _e2 = _fe.read()
    _fo.close()
    _fe.close()
    _wr.write(b'SBX1' + struct.pack('>Q', len(_out)) + _out + struct.pack('>Q', len(_e2)) + _e2 + struct.pack('>i', max(-2**31, min(2**31 - 1, _rc))))
"#;

/// A parsed response frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i64,
}

/// Why a frame was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// Not a frame of this protocol.
    Malformed,
    /// A stream's announced length is over the cap.
    TooLarge(&'static str, u64),
}

/// Parses one frame from the front of `buf`. `Ok(None)`: more bytes needed. Lengths are
/// checked against `cap` as announced, before anything of that size is awaited.
pub(crate) fn parse_frame(
    buf: &mut BytesMut,
    cap: usize,
) -> std::result::Result<Option<Frame>, FrameError> {
    let have = buf.len().min(MAGIC.len());
    if buf[..have] != MAGIC[..have] {
        return Err(FrameError::Malformed);
    }
    let cap = cap as u64;
    let read_u64 = |b: &[u8], at: usize| -> Option<u64> {
        b.get(at..at.checked_add(8)?)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(u64::from_be_bytes)
    };
    let Some(out_len) = read_u64(buf, 4) else {
        return Ok(None);
    };
    if out_len > cap {
        return Err(FrameError::TooLarge("stdout", out_len));
    }
    // out_len <= cap, which fits usize: no overflow below.
    let out_end = 12 + out_len as usize;
    let Some(err_len) = read_u64(buf, out_end) else {
        return Ok(None);
    };
    if err_len > cap {
        return Err(FrameError::TooLarge("stderr", err_len));
    }
    let err_end = out_end + 8 + err_len as usize;
    let total = err_end + 4;
    if buf.len() < total {
        return Ok(None);
    }
    let code = <[u8; 4]>::try_from(&buf[err_end..total])
        .map(i32::from_be_bytes)
        .map_err(|_| FrameError::Malformed)?;
    let frame = Frame {
        stdout: buf[12..out_end].to_vec(),
        stderr: buf[out_end + 8..err_end].to_vec(),
        exit_code: i64::from(code),
    };
    buf.advance(total);
    Ok(Some(frame))
}

/// The request frame for `code`.
pub(crate) fn request_frame(code: &str) -> Result<Vec<u8>> {
    let len = u32::try_from(code.len()).map_err(|_| {
        SandboxError::config(
            "code is larger than 4 GiB",
            "send smaller pieces of code per call",
        )
    })?;
    let mut frame = Vec::with_capacity(4 + code.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(code.as_bytes());
    Ok(frame)
}

impl ContextInput {
    async fn send(&mut self, backend: &str, frame: &[u8]) -> Result<()> {
        match self {
            ContextInput::Engine(input) => {
                let io = |e: std::io::Error| error::io(backend, "writing to the interpreter", e);
                input.write_all(frame).await.map_err(io)?;
                input.flush().await.map_err(io)
            }
            ContextInput::Agent(stdin) => stdin.write(frame).await,
        }
    }
}

enum Outcome {
    /// The request completed; the interpreter lives on.
    Done(ExecResult),
    /// The interpreter exited (e.g. `os._exit`); its state is gone.
    Exited(ExecResult),
}

impl CodeContext {
    async fn start<E: ContainerEngine>(
        sh: &Arc<Shared<E>>,
        interpreter: &str,
    ) -> Result<CodeContext> {
        let argv = vec![interpreter.into(), "-u".into(), "-c".into(), DRIVER.into()];
        let env = sh.exec_env(&Default::default());
        if let Some(client) = sh.agent() {
            // Through the agent: no engine round-trip per request, and a kill reaches every
            // process the interpreter started, re-parented or not.
            let spec = SpawnSpec {
                argv,
                env,
                cwd: Some(sh.workdir.clone()),
                stdin: true,
                pty: None,
            };
            let p = client.spawn(spec).await?;
            return CodeContext::of_agent(sh.engine.backend(), p, &client);
        }
        let mut l = launch(
            sh,
            ExecPlan {
                argv,
                env,
                workdir: sh.workdir.clone(),
                stdin: true,
                wrapped: true,
                guarded: true,
            },
        )
        .await?;
        let input = l
            .input
            .take()
            .ok_or_else(|| error::internal(sh.engine.backend(), "the engine attached no stdin"))?;
        l.guard.disarm();
        Ok(CodeContext {
            name: l.exec_id.clone(),
            input: ContextInput::Engine(input),
            output: l.output,
            exit: ContextExit::Engine(l.exec_id),
            buf: BytesMut::new(),
            killer: l.killer,
            agent_id: None,
        })
    }

    /// The context of an interpreter the agent runs as `p` (spawned, or adopted by a
    /// fork's session).
    pub(crate) fn of_agent(
        backend: &str,
        p: sandbox_agent::client::RemoteProcess,
        client: &sandbox_agent::client::AgentClient,
    ) -> Result<CodeContext> {
        let input = p
            .stdin()
            .ok_or_else(|| error::internal(backend, "the agent gave the interpreter no stdin"))?;
        let handle = p.kill_handle();
        let killer: Killer = Arc::new(move || {
            let handle = handle.clone();
            Box::pin(async move { handle.kill().await })
        });
        let (tx, rx) = tokio::sync::oneshot::channel();
        let agent_id = Some(p.id());
        Ok(CodeContext {
            agent_id,
            name: "agent interpreter".into(),
            input: ContextInput::Agent(input),
            output: crate::sandbox::agent::events(p, client.clone(), tx),
            exit: ContextExit::Agent(rx),
            buf: BytesMut::new(),
            killer,
        })
    }

    async fn request<E: ContainerEngine>(
        &mut self,
        sh: &Shared<E>,
        code: &str,
        cap: usize,
    ) -> Result<Outcome> {
        let frame = request_frame(code)?;
        let backend = sh.engine.backend();
        self.input.send(backend, &frame).await?;
        let mut driver_err = Vec::new();
        loop {
            if !self.buf.is_empty() {
                match parse_frame(&mut self.buf, cap) {
                    Ok(Some(f)) => {
                        return Ok(Outcome::Done(ExecResult::new(
                            f.exit_code,
                            f.stdout,
                            f.stderr,
                        )));
                    }
                    Ok(None) => {}
                    Err(FrameError::Malformed) => {
                        return Err(error::internal(
                            backend,
                            "the interpreter context sent a malformed frame (its code wrote to \
                             the driver's channel); the context was killed",
                        ));
                    }
                    Err(FrameError::TooLarge(stream, len)) => {
                        return Err(error::limit(
                            format!("{stream} buffer ({cap} bytes; the context announced {len})"),
                            "raise CodeOptions::output_cap, or print less per call; the context \
                             was killed",
                        ));
                    }
                }
            }
            match self.output.next().await {
                Some(Ok(chunk)) => match chunk.stream {
                    StreamKind::Stdout => self.buf.extend_from_slice(&chunk.data),
                    StreamKind::Stderr => {
                        let room = DRIVER_STDERR_MAX.saturating_sub(driver_err.len());
                        driver_err.extend_from_slice(&chunk.data[..chunk.data.len().min(room)]);
                    }
                },
                Some(Err(e)) => return Err(e),
                None => {
                    let code = match &mut self.exit {
                        ContextExit::Engine(exec_id) => exit_code(sh, exec_id).await?,
                        // No status with the end of the output: the agent is gone.
                        ContextExit::Agent(rx) => rx.await.map_err(|_| error::gone(&sh.id))?,
                    };
                    driver_err.extend_from_slice(
                        b"\n[sandbox-rs] the interpreter exited; this context's state is lost\n",
                    );
                    return Ok(Outcome::Exited(ExecResult::new(
                        if code == 0 { 1 } else { code },
                        Vec::new(),
                        driver_err,
                    )));
                }
            }
        }
    }
}

/// Whether the template has `interpreter` (checked once per sandbox and interpreter).
async fn ensure_interpreter<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    interpreter: &str,
) -> Result<()> {
    let known = sh
        .interpreters
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(interpreter)
        .copied();
    let present = match known {
        Some(p) => p,
        None => {
            let check = format!("command -v {interpreter} >/dev/null 2>&1");
            let r = match sh.agent() {
                Some(client) => {
                    let argv = ["sh", "-c", &check].map(String::from).to_vec();
                    let none = Default::default();
                    crate::sandbox::agent::process(
                        sh,
                        &client,
                        argv,
                        &none,
                        Some("/"),
                        HELPER_TIMEOUT,
                        Stdin::Closed,
                    )?
                    .collect(PROBE_OUTPUT_CAP)
                    .await?
                }
                None => helper_argv(sh, &["sh", "-c", &check]).await?,
            };
            let present = r.exit_code == 0;
            sh.interpreters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(interpreter.to_string(), present);
            present
        }
    };
    if present {
        Ok(())
    } else {
        Err(error::interpreter_missing(interpreter, &sh.template))
    }
}

/// `Sandbox::run_code`.
pub(crate) async fn run_code<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    code: &str,
    options: CodeOptions,
) -> Result<ExecResult> {
    let backend = sh.engine.backend();
    sandbox_core::policy::require(sh.caps, Capability::RUN_CODE, backend)?;
    let timeout = options.validate(sh.remaining()?)?;
    if options.context_id.is_some() {
        sandbox_core::policy::require(sh.caps, Capability::STATEFUL_CODE, backend)?;
    }
    let cap = options.output_cap.unwrap_or(DEFAULT_OUTPUT_CAP);
    let interpreter = options.language.interpreter();
    ensure_interpreter(sh, interpreter).await?;
    if let Some(ctx) = &options.context_id {
        return run_in_context(sh, ctx, interpreter, code, timeout, cap).await;
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
    sh.process(argv, &Default::default(), None, timeout, Stdin::given(feed))?
        .collect(cap)
        .await
}

/// The slot of context `ctx_id`, refusing a new one past the cap.
fn slot<E: ContainerEngine>(sh: &Shared<E>, ctx_id: &str) -> Result<ContextSlot> {
    let mut map = sh.contexts.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = map.get(ctx_id) {
        return Ok(s.clone());
    }
    let max = sh.config.max_contexts;
    if map.len() >= max {
        return Err(error::limit(
            format!("stateful contexts per sandbox ({max})"),
            "reuse an existing context id, or create another sandbox",
        ));
    }
    Ok(map.entry(ctx_id.to_string()).or_default().clone())
}

/// Runs `code` in context `ctx_id`, starting its interpreter on first use.
async fn run_in_context<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    ctx_id: &str,
    interpreter: &str,
    code: &str,
    timeout: Duration,
    cap: usize,
) -> Result<ExecResult> {
    let deadline = tokio::time::Instant::now() + timeout;
    let slot = slot(sh, ctx_id)?;
    let timed_out = || error::execution_timeout(timeout);
    let mut held = tokio::time::timeout_at(deadline, slot.lock())
        .await
        .map_err(|_| timed_out())?;
    let mut ctx = match held.take() {
        Some(c) => c,
        None => tokio::time::timeout_at(deadline, CodeContext::start(sh, interpreter))
            .await
            .map_err(|_| timed_out())??,
    };
    // Owns the interpreter while a request is in flight: a dropped call kills it.
    let mut guard = TeardownGuard::new(
        OrphanInfo::new(
            format!("{}/{}", sh.id, ctx.name),
            sh.engine.backend(),
            sh.labels.clone(),
        ),
        ctx.killer.clone(),
    );
    match tokio::time::timeout_at(deadline, ctx.request(&**sh, code, cap)).await {
        Ok(Ok(Outcome::Done(r))) => {
            guard.disarm();
            *held = Some(ctx);
            Ok(r)
        }
        Ok(Ok(Outcome::Exited(r))) => {
            guard.disarm();
            Ok(r)
        }
        Ok(Err(e)) => {
            let _ = guard.kill_now().await;
            Err(e)
        }
        Err(_) => {
            let killed = guard.kill_now().await;
            drop(ctx);
            if killed.is_err() || !sh.container_running().await {
                return Err(error::gone(&sh.id));
            }
            Err(timed_out())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(out: &[u8], err: &[u8], code: i32) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&(out.len() as u64).to_be_bytes());
        v.extend_from_slice(out);
        v.extend_from_slice(&(err.len() as u64).to_be_bytes());
        v.extend_from_slice(err);
        v.extend_from_slice(&code.to_be_bytes());
        v
    }

    #[test]
    fn frames_parse_incrementally() {
        let whole = frame(b"42\n", b"warn", 3);
        let mut buf = BytesMut::new();
        for (i, b) in whole.iter().enumerate() {
            buf.extend_from_slice(&[*b]);
            let r = parse_frame(&mut buf, 1024).unwrap();
            assert_eq!(r.is_some(), i == whole.len() - 1);
            if let Some(f) = r {
                assert_eq!(
                    (f.stdout.as_slice(), f.stderr.as_slice(), f.exit_code),
                    (&b"42\n"[..], &b"warn"[..], 3)
                );
            }
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn forged_lengths_are_refused_before_buffering() {
        // A header announcing u64::MAX bytes: refused from the 12 header bytes alone, and
        // no length arithmetic overflows.
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&u64::MAX.to_be_bytes());
        let mut buf = BytesMut::from(&v[..]);
        assert_eq!(
            parse_frame(&mut buf, 64 << 20),
            Err(FrameError::TooLarge("stdout", u64::MAX))
        );
        let mut v = frame(b"", b"", 0);
        v.truncate(12);
        v.extend_from_slice(&(u64::MAX - 3).to_be_bytes());
        let mut buf = BytesMut::from(&v[..]);
        assert_eq!(
            parse_frame(&mut buf, 10),
            Err(FrameError::TooLarge("stderr", u64::MAX - 3))
        );
        let mut buf = BytesMut::from(&frame(&[b'x'; 100], b"", 1)[..]);
        assert_eq!(
            parse_frame(&mut buf, 10),
            Err(FrameError::TooLarge("stdout", 100))
        );
    }

    #[test]
    fn garbage_is_malformed_at_once() {
        let mut buf = BytesMut::from(&b"S"[..]);
        assert_eq!(parse_frame(&mut buf, 10), Ok(None), "a magic prefix waits");
        let mut buf = BytesMut::from(&b"garbage"[..]);
        assert_eq!(parse_frame(&mut buf, 10), Err(FrameError::Malformed));
        let mut buf = BytesMut::from(&b"SBX2"[..]);
        assert_eq!(parse_frame(&mut buf, 10), Err(FrameError::Malformed));
        let mut buf = BytesMut::from(&frame(b"", b"boom", -1)[..]);
        assert_eq!(parse_frame(&mut buf, 10).unwrap().unwrap().exit_code, -1);
    }

    #[test]
    fn request_frames_are_length_prefixed() {
        let f = request_frame("print(1)").unwrap();
        assert_eq!(&f[..4], &8u32.to_be_bytes());
        assert_eq!(&f[4..], b"print(1)");
    }
}
