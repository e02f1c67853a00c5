//! Stdin for `run` and `exec`.
//!
//! The `Sandbox` port has no stdin channel, so the CLI stages what it reads into a file in
//! the sandbox and runs the command with that file as its stdin:
//! `sh -c "exec 'python3' '-' < '.sandbox-stdin-…'"`, every argument single-quoted (the
//! argv is data, never shell syntax). Stdin is therefore read to the end before the command
//! starts (pipes and files work; an interactive session does not) and bounded by
//! [`STDIN_CAP`].

use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

use sandbox::{Command, Sandbox, SandboxError};
use tokio::io::AsyncReadExt;

/// Largest stdin passed through (the same as the default output cap).
pub const STDIN_CAP: u64 = 64 * 1024 * 1024;

/// Whether to pass stdin: `-i`, or stdin is a pipe or a file rather than a terminal.
pub fn wanted(interactive: bool) -> bool {
    interactive || !std::io::stdin().is_terminal()
}

/// Reads our stdin to the end, refusing more than [`STDIN_CAP`] bytes.
pub async fn read_all() -> sandbox::Result<Vec<u8>> {
    let mut data = Vec::new();
    tokio::io::stdin()
        .take(STDIN_CAP + 1)
        .read_to_end(&mut data)
        .await
        .map_err(|e| {
            SandboxError::config(
                format!("cannot read stdin: {e}"),
                "check the pipe or file given as stdin",
            )
        })?;
    if data.len() as u64 > STDIN_CAP {
        return Err(SandboxError::resource_limit(
            format!("stdin ({} MiB)", STDIN_CAP / (1024 * 1024)),
            Some("copy large inputs in with `sandbox cp` and pass the path instead".into()),
        ));
    }
    Ok(data)
}

/// A staged stdin file; remove it with [`Staged::remove`] once the command ended.
pub struct Staged {
    path: String,
}

impl Staged {
    /// Best-effort removal: a leftover file dies with the sandbox anyway.
    pub async fn remove(self, sb: &dyn Sandbox) {
        if let Ok(files) = sb.files()
            && let Err(e) = files.remove(&self.path).await
        {
            tracing::debug!(error = %e, path = %self.path, "could not remove the staged stdin");
        }
    }
}

/// Writes `data` into the sandbox and returns the command that reads it as stdin. Empty
/// input stages nothing: the command keeps the engine's empty stdin.
pub async fn stage(
    sb: &dyn Sandbox,
    argv: &[String],
    data: Vec<u8>,
) -> sandbox::Result<(Command, Option<Staged>)> {
    if data.is_empty() {
        return Ok((Command::Argv(argv.to_vec()), None));
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    // Relative: resolved against the workdir by both `files()` and `run`.
    let path = format!(".sandbox-stdin-{}-{nanos}", std::process::id());
    sb.files()?.write(&path, bytes::Bytes::from(data)).await?;
    Ok((redirected(argv, &path), Some(Staged { path })))
}

/// `exec 'a' 'b' < 'path'`.
fn redirected(argv: &[String], path: &str) -> Command {
    let words: Vec<String> = argv.iter().map(|a| quote(a)).collect();
    Command::Shell(format!("exec {} < {}", words.join(" "), quote(path)))
}

/// POSIX single quoting: nothing inside is special except `'`, written as `'\''`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_is_quoted_as_data() {
        let cmd = redirected(
            &[
                "python3".into(),
                "-c".into(),
                "print('$HOME; rm -rf /')".into(),
            ],
            ".in",
        );
        assert_eq!(
            cmd,
            Command::Shell(
                r#"exec 'python3' '-c' 'print('\''$HOME; rm -rf /'\'')' < '.in'"#.into()
            )
        );
    }
}
