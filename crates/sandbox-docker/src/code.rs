//! Stateful code: one persistent `python3` per `context_id`.
//!
//! Each context is an exec running a small driver ([`DRIVER`]) with stdin attached. The
//! driver reads length-framed requests, `exec`s them in one persistent globals dict, and
//! answers with a frame holding the captured stdout, stderr and an exit code. Output is
//! captured at the file-descriptor level (temp files dup'ed onto fds 1 and 2), so
//! subprocesses' output is captured too. Contexts are separate processes (isolated from
//! each other) inside the container, so they die with the sandbox.
//!
//! A timeout, a dropped call or a protocol failure kills that context's interpreter: its
//! state is lost and the next call with the same id starts a fresh one.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use sandbox_core::teardown::{Killer, TeardownGuard};
use sandbox_core::{ExecResult, OutputChunk, Result, SandboxError, StreamKind};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::error::{self, BACKEND};
use crate::exec::{ExecSpec, exit_code, start_exec};
use crate::sandbox::SandboxInner;

/// One context's slot; `None` until started, or after its interpreter was lost.
pub(crate) type ContextSlot = Arc<tokio::sync::Mutex<Option<CodeContext>>>;

/// Response frame magic.
const MAGIC: &[u8; 4] = b"SBX1";

/// The driver run as `python3 -u -c DRIVER`.
pub(crate) const DRIVER: &str = r#"
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
    _fo.seek(0)
    _out = _fo.read()
    _fe.seek(0)
    _e2 = _fe.read()
    _fo.close()
    _fe.close()
    _wr.write(b'SBX1' + struct.pack('>Q', len(_out)) + _out + struct.pack('>Q', len(_e2)) + _e2 + struct.pack('>i', max(-2**31, min(2**31 - 1, _rc))))
"#;

/// A live interpreter.
pub(crate) struct CodeContext {
    exec_id: String,
    input: std::pin::Pin<Box<dyn AsyncWrite + Send>>,
    output: BoxStream<'static, Result<OutputChunk>>,
    buf: BytesMut,
    killer: Killer,
}

/// A parsed response frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: i64,
}

/// Parses one response frame from the front of `buf`. `Ok(None)`: need more bytes.
/// `Err(limit)`: a stream exceeds `cap`.
pub(crate) fn parse_frame(
    buf: &mut BytesMut,
    cap: usize,
) -> std::result::Result<Option<Frame>, &'static str> {
    if buf.len() < 12 {
        return Ok(None);
    }
    if &buf[..4] != MAGIC {
        return Err("protocol");
    }
    let out_len = u64::from_be_bytes(buf[4..12].try_into().unwrap_or_default()) as usize;
    if out_len > cap {
        return Err("stdout");
    }
    if buf.len() < 12 + out_len + 8 {
        return Ok(None);
    }
    let at = 12 + out_len;
    let err_len = u64::from_be_bytes(buf[at..at + 8].try_into().unwrap_or_default()) as usize;
    if err_len > cap {
        return Err("stderr");
    }
    let total = at + 8 + err_len + 4;
    if buf.len() < total {
        return Ok(None);
    }
    let stdout = buf[12..at].to_vec();
    let stderr = buf[at + 8..at + 8 + err_len].to_vec();
    let code = i32::from_be_bytes(buf[total - 4..total].try_into().unwrap_or_default());
    buf.advance(total);
    Ok(Some(Frame {
        stdout,
        stderr,
        exit_code: code as i64,
    }))
}

async fn start_context(inner: &Arc<SandboxInner>) -> Result<CodeContext> {
    let raw = start_exec(
        inner,
        ExecSpec {
            argv: vec!["python3".into(), "-u".into(), "-c".into(), DRIVER.into()],
            env: inner.exec_env(&Default::default()),
            workdir: inner.workdir.clone(),
            stdin: true,
            feed: None,
            wrapped: true,
        },
    )
    .await?;
    Ok(CodeContext {
        exec_id: raw.exec_id,
        input: raw.input,
        output: raw.output,
        buf: BytesMut::new(),
        killer: raw.killer,
    })
}

enum Outcome {
    /// The request completed; the interpreter lives on.
    Done(ExecResult),
    /// The interpreter exited (e.g. `os._exit`); its state is gone.
    Exited(ExecResult),
}

impl CodeContext {
    async fn request(&mut self, inner: &SandboxInner, code: &str, cap: usize) -> Result<Outcome> {
        let len = u32::try_from(code.len()).map_err(|_| {
            SandboxError::config(
                "code is larger than 4 GiB",
                "send smaller pieces of code per call",
            )
        })?;
        let mut frame = Vec::with_capacity(4 + code.len());
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(code.as_bytes());
        let io = |e: std::io::Error| SandboxError::Engine {
            backend: BACKEND.into(),
            message: "writing to the interpreter failed".into(),
            source: Some(Box::new(e)),
        };
        self.input.write_all(&frame).await.map_err(io)?;
        self.input.flush().await.map_err(io)?;
        let mut driver_err = Vec::new();
        loop {
            match parse_frame(&mut self.buf, cap) {
                Ok(Some(f)) => {
                    return Ok(Outcome::Done(ExecResult::new(
                        f.exit_code,
                        f.stdout,
                        f.stderr,
                    )));
                }
                Ok(None) => {}
                Err("protocol") => {
                    return Err(SandboxError::Engine {
                        backend: BACKEND.into(),
                        message: "the interpreter driver sent an unexpected frame".into(),
                        source: None,
                    });
                }
                Err(stream) => {
                    return Err(SandboxError::ResourceLimitExceeded {
                        limit: format!("{stream} buffer ({cap} bytes)"),
                        hint: Some("raise CodeOptions::output_cap, or print less per call".into()),
                    });
                }
            }
            match self.output.next().await {
                Some(Ok(chunk)) => match chunk.stream {
                    StreamKind::Stdout => self.buf.extend_from_slice(&chunk.data),
                    StreamKind::Stderr => {
                        if driver_err.len() < 64 * 1024 {
                            driver_err.extend_from_slice(&chunk.data);
                        }
                    }
                },
                Some(Err(e)) => return Err(e),
                None => {
                    let code = exit_code(&inner.client, &inner.id, &self.exec_id).await?;
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

/// Runs `code` in context `ctx_id`, starting its interpreter on first use.
pub(crate) async fn run_in_context(
    inner: &Arc<SandboxInner>,
    ctx_id: &str,
    code: &str,
    timeout: Duration,
    cap: usize,
) -> Result<ExecResult> {
    let deadline = tokio::time::Instant::now() + timeout;
    let slot = {
        let mut map = inner
            .contexts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.entry(ctx_id.to_string()).or_default().clone()
    };
    let timed_out = || SandboxError::ExecutionTimeout { after: timeout };
    let mut held = tokio::time::timeout_at(deadline, slot.lock())
        .await
        .map_err(|_| timed_out())?;
    let mut ctx = match held.take() {
        Some(c) => c,
        None => tokio::time::timeout_at(deadline, start_context(inner))
            .await
            .map_err(|_| timed_out())??,
    };
    // Owns the interpreter while a request is in flight: a dropped call kills it.
    let mut guard = TeardownGuard::new(
        sandbox_core::teardown::OrphanInfo::new(
            format!("{}/{}", inner.id, ctx.exec_id),
            BACKEND,
            inner.labels.clone(),
        ),
        ctx.killer.clone(),
    );
    match tokio::time::timeout_at(deadline, ctx.request(inner, code, cap)).await {
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
            let _ = guard.kill_now().await;
            drop(ctx);
            if !container_running(inner).await {
                return Err(inner.gone());
            }
            Err(timed_out())
        }
    }
}

/// Whether the container still runs (a failed inspect counts as not running).
pub(crate) async fn container_running(inner: &SandboxInner) -> bool {
    match inner.client.inspect_container(&inner.id, None).await {
        Ok(c) => c.state.and_then(|s| s.running).unwrap_or(false),
        Err(e) => {
            tracing::debug!(error = %error::engine("inspect container", e), "container check");
            false
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
        let whole = frame(b"42\n", b"", 0);
        let mut buf = BytesMut::new();
        for (i, b) in whole.iter().enumerate() {
            buf.extend_from_slice(&[*b]);
            let r = parse_frame(&mut buf, 1024).unwrap();
            assert_eq!(r.is_some(), i == whole.len() - 1);
            if let Some(f) = r {
                assert_eq!(f.stdout, b"42\n");
                assert_eq!(f.exit_code, 0);
            }
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_and_garbage_frames_refused() {
        let mut buf = BytesMut::from(&frame(&[b'x'; 100], b"", 1)[..]);
        assert_eq!(parse_frame(&mut buf, 10), Err("stdout"));
        let mut buf = BytesMut::from(&b"garbage-garbage"[..]);
        assert_eq!(parse_frame(&mut buf, 10), Err("protocol"));
        let mut buf = BytesMut::from(&frame(b"", b"boom", -1)[..]);
        assert_eq!(parse_frame(&mut buf, 10).unwrap().unwrap().exit_code, -1);
    }
}
