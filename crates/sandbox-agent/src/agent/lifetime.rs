//! When the sandbox ends: the deadline, which the host may move later (never past the
//! maximum given on the command line at start), and the idle limit (no frame from the
//! host and no process below the agent for that long). One thread watches both; when
//! either is reached it sends the deadline notice, kills everything and exits, which as
//! PID 1 ends the container.
//!
//! The maximum is an argument, not a message: nothing that reaches the agent's stdin
//! later (the host, or under gVisor sandboxed root writing to `/proc/1/fd/0`) can move
//! the end past it. A move and the end are decided under one lock, so a move that was
//! answered is never overtaken by the old deadline.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::protocol::{AGENT_ID, ErrorKind, Frame, Reply};

use super::Out;
use super::spawn::Processes;

/// How often the watcher looks at the clock and, with an idle limit, at the processes.
const TICK: Duration = Duration::from_secs(1);

/// A tick that took this much longer than [`TICK`] means the agent did not run in
/// between: the sandbox was paused (the cgroup freezer stops the agent too). A resume is
/// a call on the sandbox, so the idle clock starts again.
const FROZEN_GAP: Duration = Duration::from_secs(2);

/// The deadline and the idle limit of this agent.
pub(crate) struct Lifetime {
    state: Mutex<State>,
    /// The latest deadline a move may set.
    max: SystemTime,
    idle: Option<Duration>,
}

struct State {
    /// The deadline in wall-clock time, as the host gave it (whole seconds).
    deadline: SystemTime,
    /// The same moment on the monotonic clock, which the watcher sleeps on.
    at: Instant,
    /// Last frame from the host, or last moment something ran below the agent.
    active: Instant,
    /// Set once the watcher decided to end: no move is accepted after it.
    ended: bool,
}

/// Why the sandbox ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The deadline passed.
    Deadline,
    /// Nothing happened for the idle limit.
    Idle,
}

/// The monotonic moment of a wall-clock `deadline`, seen from now.
fn instant_of(deadline: SystemTime) -> Instant {
    let left = deadline
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Instant::now() + left
}

impl Lifetime {
    /// A lifetime ending at `deadline`, movable up to `max` (never below `deadline`),
    /// with an optional idle limit.
    pub(crate) fn new(
        deadline: SystemTime,
        max: SystemTime,
        idle: Option<Duration>,
    ) -> Arc<Lifetime> {
        Arc::new(Lifetime {
            state: Mutex::new(State {
                deadline,
                at: instant_of(deadline),
                active: Instant::now(),
                ended: false,
            }),
            max: max.max(deadline),
            idle,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // PID 1 must keep going; a poisoned lock only means a thread panicked mid-update.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Something came from the host: the sandbox is in use.
    pub(crate) fn touch(&self) {
        self.lock().active = Instant::now();
    }

    /// Moves the deadline to `deadline_unix`, refused past the maximum or once the end
    /// was decided. Earlier than the current deadline is allowed (it only shortens the
    /// life, which the host can do anyway by removing the container).
    pub(crate) fn set_deadline(&self, deadline_unix: u64) -> Result<u64, (ErrorKind, String)> {
        let deadline = UNIX_EPOCH + Duration::from_secs(deadline_unix);
        if deadline > self.max {
            let max = self
                .max
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            return Err((
                ErrorKind::Limit,
                format!("deadline {deadline_unix} is past the maximum {max}"),
            ));
        }
        let mut s = self.lock();
        if s.ended {
            return Err((
                ErrorKind::InvalidRequest,
                "the sandbox is ending".to_string(),
            ));
        }
        s.deadline = deadline;
        s.at = instant_of(deadline);
        Ok(deadline_unix)
    }

    /// Decides whether the sandbox ends now. `busy` says whether anything runs below the
    /// agent; it is asked only with an idle limit. `gap` is how long the last tick took.
    fn due(&self, busy: impl FnOnce() -> bool, gap: Duration) -> Option<End> {
        // Asked before the lock: a /proc scan must not hold up a move.
        let busy = self.idle.is_some() && busy();
        let mut s = self.lock();
        let now = Instant::now();
        let end = if now >= s.at {
            Some(End::Deadline)
        } else if let Some(idle) = self.idle {
            if busy || gap >= TICK + FROZEN_GAP {
                s.active = now;
            }
            (now.saturating_duration_since(s.active) >= idle).then_some(End::Idle)
        } else {
            None
        };
        if end.is_some() {
            s.ended = true;
        }
        end
    }

    /// How long the watcher sleeps before its next look.
    fn next_sleep(&self) -> Duration {
        let s = self.lock();
        s.at.saturating_duration_since(Instant::now()).min(TICK)
    }
}

/// The agent's exit status for an end: the host removes a sandbox that ended idle.
fn exit_status(why: End) -> i32 {
    match why {
        End::Deadline => 0,
        End::Idle => crate::protocol::IDLE_EXIT_STATUS,
    }
}

/// Starts the watcher thread: at the end it sends the deadline notice (for an idle end
/// too: for the host either way the sandbox is gone), kills every process and exits.
pub(crate) fn watch(life: Arc<Lifetime>, procs: Processes, out: Out) {
    let _ = std::thread::Builder::new()
        .name("lifetime".into())
        .spawn(move || {
            let why: End = loop {
                let before = Instant::now();
                // Steps of at most a second: the exit stays within a second of the
                // deadline even if this thread is delayed, and a moved deadline is seen.
                std::thread::sleep(life.next_sleep());
                if let Some(end) = life.due(|| procs.busy(), before.elapsed()) {
                    break end;
                }
            };
            // The notice before the kill: a process the deadline kills must not look
            // like it exited by itself (the host reports the sandbox gone, not an exit
            // status). Never blocking on it: the end must not wait for the host.
            out.try_send(Frame::control(AGENT_ID, &Reply::Deadline));
            procs.kill_everything();
            std::thread::sleep(Duration::from_millis(50));
            // As PID 1 this ends the container: the kernel kills what is left in the
            // namespace. The status tells the host why (an idle sandbox is removed).
            std::process::exit(exit_status(why));
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(t: SystemTime) -> u64 {
        t.duration_since(UNIX_EPOCH).unwrap().as_secs()
    }

    #[test]
    fn a_move_holds_up_to_the_maximum_and_no_further() {
        let now = SystemTime::now();
        let life = Lifetime::new(
            now + Duration::from_secs(10),
            now + Duration::from_secs(100),
            None,
        );
        let later = unix(now) + 50;
        assert_eq!(life.set_deadline(later), Ok(later));
        let too_far = unix(now) + 200;
        assert_eq!(life.set_deadline(too_far).unwrap_err().0, ErrorKind::Limit);
        assert_eq!(
            unix(life.lock().deadline),
            later,
            "a refused move changes nothing"
        );
    }

    #[test]
    fn the_old_deadline_no_longer_ends_a_moved_one() {
        let now = SystemTime::now();
        let life = Lifetime::new(now, now + Duration::from_secs(100), None);
        assert_eq!(life.due(|| false, TICK), Some(End::Deadline));
        // Once decided, nothing moves it.
        assert!(life.set_deadline(unix(now) + 50).is_err());
        let life = Lifetime::new(now, now + Duration::from_secs(100), None);
        life.set_deadline(unix(now) + 50).unwrap();
        assert_eq!(life.due(|| false, TICK), None);
    }

    #[test]
    fn idle_ends_only_without_activity_and_without_processes() {
        let now = SystemTime::now();
        let idle = Duration::from_millis(30);
        let life = Lifetime::new(
            now + Duration::from_secs(100),
            now + Duration::from_secs(100),
            Some(idle),
        );
        assert_eq!(life.due(|| false, TICK), None);
        std::thread::sleep(idle * 2);
        // A process below the agent keeps it, and restarts the idle clock.
        assert_eq!(life.due(|| true, TICK), None);
        assert_eq!(life.due(|| false, TICK), None);
        std::thread::sleep(idle * 2);
        // So does a frame from the host, and a thaw (a tick far longer than a tick).
        life.touch();
        assert_eq!(life.due(|| false, TICK), None);
        std::thread::sleep(idle * 2);
        assert_eq!(life.due(|| false, TICK * 10), None);
        std::thread::sleep(idle * 2);
        assert_eq!(life.due(|| false, TICK), Some(End::Idle));
    }

    #[test]
    fn an_idle_end_exits_with_its_own_status() {
        assert_eq!(exit_status(End::Deadline), 0);
        assert_eq!(exit_status(End::Idle), crate::protocol::IDLE_EXIT_STATUS);
        assert_ne!(crate::protocol::IDLE_EXIT_STATUS, 0);
    }

    #[test]
    fn without_an_idle_limit_processes_are_never_scanned() {
        let now = SystemTime::now();
        let life = Lifetime::new(now + Duration::from_secs(100), now, None);
        assert_eq!(
            life.due(|| panic!("scanned without an idle limit"), TICK),
            None
        );
    }
}
