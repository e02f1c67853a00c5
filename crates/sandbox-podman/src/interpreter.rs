//! Persistent Python interpreters for `run_code` with a `context_id` (STATEFUL_CODE).
//!
//! One `python3` per context runs an embedded driver in an exec with stdin attached.
//! Requests are length-framed (`<len>\n<code>`); the driver runs each in one persistent
//! globals dict with fd 1/2 redirected to memfds and answers
//! `SBXR <status> <outlen> <errlen>\n<out><err>`. An interrupted request (timeout, dropped
//! future) kills that interpreter's process group; the context starts fresh next time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::io::AsyncWriteExt;
use sandbox_core::teardown::{OrphanInfo, spawn_bounded_kill};
use sandbox_core::{ExecResult, Result, SandboxError, StreamKind};

use crate::error::{BACKEND, engine_msg};
use crate::exec::{ExecSpec, ExecTarget, Launched, exit_code, kill_group, launch_detached};

/// The driver run by `python3 -c`.
pub(crate) const DRIVER: &str = r#"
import os, sys
def _sbx_main():
    rd = os.fdopen(os.dup(0), "rb", buffering=0)
    wr = os.fdopen(os.dup(1), "wb", buffering=0)
    nul = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nul, 0)
    os.close(nul)
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        import traceback as tb
    except Exception:
        tb = None
    def read_exact(n):
        buf = b""
        while len(buf) < n:
            part = rd.read(n - len(buf))
            if not part:
                raise EOFError
            buf += part
        return buf
    def readline():
        b = b""
        while not b.endswith(b"\n"):
            c = rd.read(1)
            if not c:
                raise EOFError
            b += c
        return b
    def slurp(fd):
        os.lseek(fd, 0, 0)
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        os.close(fd)
        return b"".join(chunks)
    wr.write(b"SBXREADY\n")
    while True:
        try:
            n = int(readline())
            code = read_exact(n).decode("utf-8", "replace")
        except EOFError:
            return
        out = os.memfd_create("sbx-out")
        err = os.memfd_create("sbx-err")
        sys.stdout.flush()
        sys.stderr.flush()
        s1 = os.dup(1)
        s2 = os.dup(2)
        os.dup2(out, 1)
        os.dup2(err, 2)
        status = 0
        try:
            exec(compile(code, "<cell>", "exec"), g)
        except SystemExit as e:
            c = e.code
            if c is None:
                status = 0
            elif isinstance(c, int):
                status = c
            else:
                status = 1
                print(c, file=sys.stderr)
        except BaseException:
            status = 1
            et, ev, etb = sys.exc_info()
            if tb is not None:
                tb.print_exception(et, ev, etb.tb_next if etb is not None else None)
            else:
                print("%s: %s" % (et.__name__, ev), file=sys.stderr)
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:
                pass
        os.dup2(s1, 1)
        os.dup2(s2, 2)
        os.close(s1)
        os.close(s2)
        o = slurp(out)
        e = slurp(err)
        wr.write(b"SBXR %d %d %d\n" % (status, len(o), len(e)) + o + e)
_sbx_main()
"#;

/// One live interpreter. Dropping it kills its process group (bounded, in the background).
pub(crate) struct Interpreter {
    target: ExecTarget,
    launched: Option<Launched>,
    buf: BytesMut,
}

impl Drop for Interpreter {
    fn drop(&mut self) {
        if let Some(l) = self.launched.take() {
            let target = self.target.clone();
            let info = OrphanInfo::new(
                format!("{}/python-{}", target.id, l.pgid),
                BACKEND,
                target.info.labels.clone(),
            );
            spawn_bounded_kill(
                info,
                Box::pin(async move { kill_group(&target, &l.exec, l.pgid).await }),
            );
        }
    }
}

fn missing(template: &str) -> SandboxError {
    SandboxError::InterpreterMissing {
        interpreter: "python3".into(),
        template: template.to_string(),
    }
}

/// Whether an exec's result says the interpreter binary is missing (the wrapper's `exec`
/// failed with 127 and named it).
pub(crate) fn says_interpreter_missing(code: i64, stderr: &[u8]) -> bool {
    let s = String::from_utf8_lossy(stderr);
    code == 127 && s.contains("python3") && (s.contains("not found") || s.contains("No such file"))
}

impl Interpreter {
    /// Starts `python3` with the driver and waits for its ready line.
    pub(crate) async fn start(target: &ExecTarget, template: &str) -> Result<Interpreter> {
        let spec = ExecSpec {
            argv: vec!["python3".into(), "-u".into(), "-c".into(), DRIVER.into()],
            env: vec![],
            workdir: None,
            stdin: true,
        };
        let l = launch_detached(target.clone(), spec).await?;
        let mut me = Interpreter {
            target: target.clone(),
            launched: Some(l),
            buf: BytesMut::new(),
        };
        let mut stderr = BytesMut::new();
        loop {
            if let Some(pos) = me.buf.iter().position(|b| *b == b'\n') {
                let line = me.buf.split_to(pos + 1);
                if &line[..] == b"SBXREADY\n" {
                    return Ok(me);
                }
                return Err(engine_msg("python driver did not start"));
            }
            match me.next_chunk(&mut stderr).await? {
                true => continue,
                false => {
                    // Ended before ready: read its exit code to tell "no python3" apart.
                    let l = me
                        .launched
                        .take()
                        .ok_or_else(|| engine_msg("interpreter lost"))?;
                    let code = exit_code(target, &l.exec).await?;
                    if says_interpreter_missing(code, &stderr) {
                        return Err(missing(template));
                    }
                    return Err(engine_msg(format!(
                        "python3 exited {code} before it was ready: {}",
                        String::from_utf8_lossy(&stderr)
                            .chars()
                            .take(300)
                            .collect::<String>()
                    )));
                }
            }
        }
    }

    /// Reads one chunk into the stdout buffer (stderr aside). `false` at end of output.
    async fn next_chunk(&mut self, stderr: &mut BytesMut) -> Result<bool> {
        let l = self
            .launched
            .as_mut()
            .ok_or_else(|| engine_msg("interpreter lost"))?;
        match l.output.next().await {
            Some(Ok(c)) => {
                match c.stream {
                    StreamKind::Stdout => self.buf.extend_from_slice(&c.data),
                    StreamKind::Stderr => {
                        if stderr.len() < 64 * 1024 {
                            stderr.extend_from_slice(&c.data)
                        }
                    }
                }
                Ok(true)
            }
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
    }

    async fn fill(&mut self, n: usize, stderr: &mut BytesMut) -> Result<()> {
        while self.buf.len() < n {
            if !self.next_chunk(stderr).await? {
                return Err(self.ended().await);
            }
        }
        Ok(())
    }

    async fn ended(&mut self) -> SandboxError {
        // The interpreter died mid-request: killed, out of memory, or the sandbox is gone.
        match self
            .target
            .client
            .containers()
            .get(&self.target.id)
            .exists()
            .await
        {
            Ok(false) => SandboxError::SandboxGone {
                id: self.target.id.clone(),
            },
            _ => engine_msg("the python interpreter of this context exited"),
        }
    }

    /// Runs one request. `cap` bounds each captured stream.
    pub(crate) async fn request(&mut self, code: &str, cap: usize) -> Result<ExecResult> {
        let l = self
            .launched
            .as_mut()
            .ok_or_else(|| engine_msg("interpreter lost"))?;
        let stdin = l
            .stdin
            .as_mut()
            .ok_or_else(|| engine_msg("interpreter has no stdin"))?;
        let mut frame = format!("{}\n", code.len()).into_bytes();
        frame.extend_from_slice(code.as_bytes());
        let w = async {
            stdin.write_all(&frame).await?;
            stdin.flush().await
        };
        if let Err(e) = w.await {
            return Err(SandboxError::Engine {
                backend: BACKEND.into(),
                message: "sending code to the interpreter failed".into(),
                source: Some(Box::new(e)),
            });
        }
        let mut stderr = BytesMut::new();
        let header = loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                break self.buf.split_to(pos + 1);
            }
            if !self.next_chunk(&mut stderr).await? {
                return Err(self.ended().await);
            }
        };
        let text = String::from_utf8_lossy(&header);
        let mut parts = text.trim().split(' ');
        let (Some("SBXR"), Some(status), Some(olen), Some(elen)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(engine_msg("unexpected answer from the python driver"));
        };
        let parse = |s: &str| s.parse::<u64>().ok();
        let (Ok(status), Some(olen), Some(elen)) =
            (status.parse::<i64>(), parse(olen), parse(elen))
        else {
            return Err(engine_msg("unexpected answer from the python driver"));
        };
        for (name, len) in [("stdout", olen), ("stderr", elen)] {
            if len as usize > cap {
                // Drain it so the context stays usable, then refuse.
                self.fill((olen + elen) as usize, &mut stderr).await?;
                let _ = self.buf.split_to((olen + elen) as usize);
                return Err(SandboxError::ResourceLimitExceeded {
                    limit: format!("{name} buffer ({cap} bytes)"),
                    hint: Some("raise CodeOptions::output_cap".into()),
                });
            }
        }
        self.fill((olen + elen) as usize, &mut stderr).await?;
        let out: Bytes = self.buf.split_to(olen as usize).freeze();
        let err: Bytes = self.buf.split_to(elen as usize).freeze();
        Ok(ExecResult::new(status, out, err))
    }

    /// Gives up the drop-kill (the whole container is going away).
    pub(crate) fn disarm(&mut self) {
        self.launched = None;
    }

    /// Kills now (awaited, bounded by the caller) and disarms the drop-kill.
    pub(crate) async fn kill(mut self) -> Result<()> {
        match self.launched.take() {
            Some(l) => kill_group(&self.target, &l.exec, l.pgid).await,
            None => Ok(()),
        }
    }
}

/// The interpreters of one sandbox, by context id.
#[derive(Default)]
pub(crate) struct Contexts {
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Interpreter>>>>>,
}

impl Contexts {
    fn slot(&self, id: &str) -> Arc<tokio::sync::Mutex<Option<Interpreter>>> {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(id.to_string()).or_default().clone()
    }

    /// Forgets every interpreter without killing it (the container is being removed).
    pub(crate) fn forget(&self) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        for slot in m.values() {
            if let Ok(mut g) = slot.try_lock() {
                if let Some(i) = g.as_mut() {
                    i.disarm();
                }
            }
        }
        m.clear();
    }

    /// Runs `code` in context `id`, starting its interpreter on first use.
    pub(crate) async fn run(
        &self,
        target: &ExecTarget,
        template: &str,
        id: &str,
        code: &str,
        timeout: Duration,
        cap: usize,
    ) -> Result<ExecResult> {
        let slot = self.slot(id);
        let work = async {
            let mut guard = slot.lock().await;
            // Taken out while in use: if this future is dropped mid-request the
            // interpreter is dropped (and killed) with it, and the slot stays empty.
            let mut interp = match guard.take() {
                Some(i) => i,
                None => Interpreter::start(target, template).await?,
            };
            let r = interp.request(code, cap).await;
            match &r {
                Ok(_) | Err(SandboxError::ResourceLimitExceeded { .. }) => *guard = Some(interp),
                Err(_) => drop(interp),
            }
            r
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => {
                // The interpreter was dropped with `work` (its drop-kill is scheduled).
                // Tell a dead sandbox apart from a slow request.
                match target.client.containers().get(&target.id).exists().await {
                    Ok(false) => Err(SandboxError::SandboxGone {
                        id: target.id.clone(),
                    }),
                    _ => Err(SandboxError::ExecutionTimeout { after: timeout }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_interpreter_is_recognised() {
        assert!(says_interpreter_missing(
            127,
            b"sh: exec: line 0: python3: not found\n"
        ));
        assert!(says_interpreter_missing(
            127,
            b"sh: 1: exec: python3: not found\n"
        ));
        assert!(!says_interpreter_missing(1, b"python3: not found"));
        assert!(!says_interpreter_missing(127, b"foo: not found"));
    }
}
