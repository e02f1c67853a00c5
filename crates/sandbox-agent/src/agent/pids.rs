//! The sandbox's pids limit as the agent meets it: telling a spawn or thread creation that
//! failed because every pid of the limit is taken from any other failure, saying so with
//! the limit's numbers, and reserving the threads a request needs before it starts work.
//!
//! Threads count against the pids limit like processes do. A request whose helper thread
//! could not start would never be answered (a hang on the host), so every thread a request
//! needs is started first, parked on a channel, and the request is refused with a
//! [`ErrorKind::Pids`] error when one cannot be.

use std::io;
use std::sync::mpsc;

use crate::protocol::{ErrorKind, Reply};

/// The cgroup files (v2, then v1) that hold the limit and the count, as a container sees
/// them.
const MAX_FILES: [&str; 2] = ["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"];
const CURRENT_FILES: [&str; 2] = [
    "/sys/fs/cgroup/pids.current",
    "/sys/fs/cgroup/pids/pids.current",
];

/// Whether `e` is the kernel refusing a new process or thread for lack of pids
/// (`fork`/`clone` fail with `EAGAIN` at the cgroup limit or `RLIMIT_NPROC`).
pub(crate) fn exhausted(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::AGAIN.raw_os_error())
        || e.kind() == io::ErrorKind::WouldBlock
}

/// The reply for a request refused because no pid was left, with the limit's numbers
/// when the sandbox can see them.
pub(crate) fn refused(what: &str) -> Reply {
    Reply::Error {
        kind: ErrorKind::Pids,
        message: format!(
            "{what}: no process or thread can be started, the sandbox's pids limit is exhausted{}",
            numbers()
        ),
    }
}

/// `" (64 of 64 in use)"`, or nothing when the cgroup files are not visible (gVisor).
fn numbers() -> String {
    let read = |files: &[&str]| {
        files
            .iter()
            .find_map(|f| std::fs::read_to_string(f).ok())
            .map(|v| v.trim().to_string())
    };
    match (read(&CURRENT_FILES), read(&MAX_FILES)) {
        (Some(current), Some(max)) => format!(" ({current} of {max} in use)"),
        (None, Some(max)) => format!(" (limit {max})"),
        _ => String::new(),
    }
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A thread already running, parked until it is given its work. Dropped unused, it ends.
pub(crate) struct Reserved {
    work: mpsc::Sender<Job>,
}

impl Reserved {
    /// Starts a thread named `name` and parks it.
    pub(crate) fn start(name: &str) -> io::Result<Reserved> {
        let (work, jobs) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Ok(job) = jobs.recv() {
                    job();
                }
            })?;
        Ok(Reserved { work })
    }

    /// No thread: work given to it is dropped unrun. Only for a miscounted reservation,
    /// which must not take PID 1 down.
    pub(crate) fn none() -> Reserved {
        let (work, _) = mpsc::channel::<Job>();
        Reserved { work }
    }

    /// Starts `n` threads named `name`, all or none.
    pub(crate) fn start_many(name: &str, n: usize) -> io::Result<Vec<Reserved>> {
        (0..n).map(|_| Reserved::start(name)).collect()
    }

    /// Runs `job` on the reserved thread.
    pub(crate) fn run(self, job: impl FnOnce() + Send + 'static) {
        // The thread waits on the channel until this send or the drop of `work`, so the
        // send cannot fail.
        let _ = self.work.send(Box::new(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eagain_is_exhaustion_and_enoent_is_not() {
        assert!(exhausted(&io::Error::from_raw_os_error(11)));
        assert!(!exhausted(&io::Error::from_raw_os_error(2)));
    }

    #[test]
    fn a_reserved_thread_runs_its_job_and_an_unused_one_ends() {
        let (tx, rx) = mpsc::channel();
        Reserved::start("t")
            .unwrap()
            .run(move || tx.send(7).unwrap());
        assert_eq!(rx.recv().unwrap(), 7);
        drop(Reserved::start_many("t", 3).unwrap());
    }

    #[test]
    fn the_refusal_names_the_pids_limit() {
        let Reply::Error { kind, message } = refused("spawn") else {
            panic!("not an error")
        };
        assert_eq!(kind, ErrorKind::Pids);
        assert!(message.contains("pids limit is exhausted"), "{message}");
    }
}
