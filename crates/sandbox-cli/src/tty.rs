//! `run -t` / `exec -t`: the command on a pseudo-terminal inside the sandbox, with this
//! terminal attached to it the way `ssh -t` does it.
//!
//! The sandbox's terminal gets our window size (and every later one: `SIGWINCH`), what
//! we read on stdin is typed into it (our terminal in raw mode, so Ctrl-C, arrows and tab
//! reach the sandboxed program instead of acting here), and its output is written to our
//! stdout byte for byte — a terminal session is the one place the sandbox may drive the
//! terminal. Our terminal's settings are restored however the session ends. Without a
//! terminal on our stdin, what it carries is typed in live, then end-of-file (`^D`).

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use futures::StreamExt;
use rustix::termios::{self, OptionalActions, Termios};
use sandbox::{Command, ProcessInput, PtySize, RunOptions, SandboxError};

/// Our terminal's window size (24×80 when stdout is not a terminal).
fn window_size() -> PtySize {
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return PtySize::default();
    }
    match termios::tcgetwinsize(&stdout) {
        Ok(w) if w.ws_row > 0 && w.ws_col > 0 => PtySize::new(w.ws_row, w.ws_col),
        _ => PtySize::default(),
    }
}

/// Our terminal in raw mode while alive; the saved settings come back on drop.
struct RawMode(Option<Termios>);

impl RawMode {
    fn enter() -> sandbox::Result<RawMode> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(RawMode(None));
        }
        let cannot = |e: rustix::io::Errno| {
            SandboxError::config(
                format!("cannot put this terminal in raw mode: {e}"),
                "run without -t, or from a terminal that allows it",
            )
        };
        let saved = termios::tcgetattr(&stdin).map_err(cannot)?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw).map_err(cannot)?;
        Ok(RawMode(Some(saved)))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, saved);
        }
    }
}

/// Our stdin, read by a thread of its own (a read blocked on a terminal must not hold the
/// runtime's shutdown), in chunks; the channel closes at its end.
fn stdin_chunks() -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let _ = std::thread::Builder::new()
        .name("tty-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin();
            let mut buf = vec![0u8; 4096];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    rx
}

/// Forwards our input and window size to `input` until our stdin ends (then `^D`).
async fn forward(input: ProcessInput) {
    let mut chunks = stdin_chunks();
    let mut winch =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
    loop {
        let resized = async {
            match winch.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            chunk = chunks.recv() => match chunk {
                Some(data) => {
                    if input.write(data).await.is_err() {
                        return;
                    }
                }
                None => {
                    let _ = input.end().await;
                    return;
                }
            },
            Some(()) = resized => {
                let _ = input.resize(window_size()).await;
            }
        }
    }
}

/// Runs `cmd` on a terminal in `sb` with ours attached; returns its exit code.
pub async fn session(
    sb: &dyn sandbox::Sandbox,
    cmd: Command,
    timeout: Duration,
) -> sandbox::Result<i64> {
    let mut process = sb.stream(
        cmd,
        RunOptions::default().timeout(timeout).pty(window_size()),
    )?;
    let input = process.input().await?;
    let raw = RawMode::enter()?;
    let forwarding = tokio::spawn(forward(input));
    let mut failed = None;
    while let Some(chunk) = process.next().await {
        match chunk {
            Ok(c) => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&c.data);
                let _ = out.flush();
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    forwarding.abort();
    drop(raw);
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(process.wait().await?.exit_code)
}
