//! Stdin for `run` and `exec`.
//!
//! What the CLI reads on its stdin is given to the command as `RunOptions::stdin` (the
//! command's argv is untouched: no shell is involved). Stdin is read to the end before the
//! command starts (pipes and files work; an interactive session does not) and bounded by
//! [`STDIN_CAP`].

use std::io::IsTerminal;

use sandbox::{RunOptions, SandboxError};
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

/// `options` with `data` as the command's stdin (`RunOptions::stdin`); empty input
/// leaves the command the empty stdin it has anyway.
pub fn given(options: RunOptions, data: Vec<u8>) -> RunOptions {
    if data.is_empty() {
        options
    } else {
        options.stdin(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_sets_nothing() {
        assert_eq!(given(RunOptions::default(), Vec::new()).stdin, None);
        assert_eq!(
            given(RunOptions::default(), b"x".to_vec()).stdin.as_deref(),
            Some(&b"x"[..])
        );
    }
}
