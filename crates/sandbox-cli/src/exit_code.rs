//! The process exit codes of `sandbox`, and which error maps to which: every command
//! returns one of these. `sandbox run` and `sandbox exec` otherwise exit with the
//! sandboxed command's own exit code. The `--help` text lists the codes for users in its
//! own words (`cli.rs`), so the grammar depends on nothing else in this crate; change both
//! together.

use sandbox::{ErrorCode, SandboxError};

/// Success.
pub const OK: u8 = 0;
/// A failure (engine error, unhealthy engine, failed demo step, failed kill).
pub const FAILURE: u8 = 1;
/// Bad usage: clap parse errors, and configuration errors (bad DSN, unknown scheme, bad
/// option values).
pub const USAGE: u8 = 2;
/// `sandbox run`: the command ran past `--timeout` and was killed. The value `timeout(1)`
/// uses, so scripts written for it read it the same way.
pub const TIMEOUT: u8 = 124;
/// Interrupted by Ctrl-C, SIGTERM or SIGHUP (after the sandbox was torn down): 128 + SIGINT,
/// as shells report it.
pub const INTERRUPTED: u8 = 130;

/// The exit code of a command that failed with `e`: configuration errors are usage errors,
/// a timeout is [`TIMEOUT`], everything else is a failure.
pub fn for_error(e: &SandboxError) -> u8 {
    match e.code() {
        ErrorCode::Configuration | ErrorCode::BackendNotFound => USAGE,
        ErrorCode::ExecutionTimeout => TIMEOUT,
        _ => FAILURE,
    }
}
