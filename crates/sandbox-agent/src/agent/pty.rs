//! Pseudo-terminals for spawns that ask for one (`SpawnSpec::pty`).
//!
//! The agent opens the terminal pair, keeps the controller side (its reads are the
//! process's output, its writes the process's input, its window size the terminal's) and
//! starts the process through itself in [`EXEC_FLAG`] mode with the terminal on stdin,
//! stdout and stderr. That short-lived child makes itself a session leader, takes the
//! terminal as its controlling tty and execs the program: the only way to do those two
//! steps between fork and exec without `unsafe` (std's `pre_exec` is unsafe, and the
//! workspace forbids it).

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use rustix::pty::OpenptFlags;

use crate::protocol::WindowSize;

/// First argument that makes the agent binary the terminal exec helper instead of PID 1.
pub const EXEC_FLAG: &str = "--pty-exec";

/// `TERM` for a process on a terminal when the spawn does not set one.
pub(crate) const DEFAULT_TERM: &str = "xterm-256color";

/// A new terminal pair of `size`: (controller, user side). Both close on exec; the user
/// side is handed to the child as its stdio (std duplicates it onto 0, 1 and 2).
pub(crate) fn open(size: WindowSize) -> io::Result<(File, File)> {
    let controller =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&controller)?;
    rustix::pty::unlockpt(&controller)?;
    let name = rustix::pty::ptsname(&controller, Vec::new())?;
    let name = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(name.as_bytes()));
    let user = OpenOptions::new()
        .read(true)
        .write(true)
        // Not the agent's controlling terminal: only the child takes it.
        .custom_flags(rustix::fs::OFlags::NOCTTY.bits() as i32)
        .open(&name)?;
    let controller = File::from(controller);
    resize(&controller, size)?;
    Ok((controller, user))
}

/// Sets the window size (the foreground process group gets `SIGWINCH`).
pub(crate) fn resize(controller: &File, size: WindowSize) -> io::Result<()> {
    rustix::termios::tcsetwinsize(
        controller,
        rustix::termios::Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    Ok(())
}

/// The [`EXEC_FLAG`] helper: `args` is the program and its arguments. Becomes a session
/// leader, takes stdin (the terminal) as the controlling tty and execs; returns only on
/// failure, with the exit code a shell would give (127 not found, 126 otherwise).
pub fn exec_helper(mut args: impl Iterator<Item = OsString>) -> i32 {
    let Some(program) = args.next() else {
        return 126;
    };
    if rustix::process::setsid().is_err() {
        return 126;
    }
    if rustix::process::ioctl_tiocsctty(io::stdin().as_fd()).is_err() {
        return 126;
    }
    let e = Command::new(&program).args(args).exec();
    let _ = io::Write::write_all(
        &mut io::stderr(),
        format!("sandbox-agent: {}: {e}\r\n", program.to_string_lossy()).as_bytes(),
    );
    if e.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}
