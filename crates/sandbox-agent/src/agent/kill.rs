//! Which processes belong to a spawn, read from /proc.
//!
//! A process below the agent belongs to the killed spawn S when, checked in this order:
//! 1. it is S's root (while the root is unreaped, its pid is still S's) — yes;
//! 2. it is the unreaped root of another spawn — no;
//! 3. its parent is not the agent: it belongs exactly when its parent does. Parentage is
//!    exact and cannot be forged from inside, so a descendant of S is killed whatever
//!    group, session or marker it set itself;
//! 4. otherwise it is an orphan, re-parented to the agent, and its parentage is lost:
//!    a. in S's process group (while that number is still S's), or carrying S's marker —
//!    yes;
//!    b. carrying the marker of another spawn still in the agent's table, whose root had
//!    started by the time the orphan started — no (the marker is only honoured when the
//!    agent issued it to a spawn that could have started the orphan);
//!    c. started while S's root ran, and no other spawn's root (in the table, or one that
//!    ended recently) ran at that moment — yes;
//!    d. otherwise — no.
//!
//! Rule 4c is a heuristic and says no when in doubt (two spawns running at once); cgroups
//! would be exact but are read-only in a sandbox with no capabilities. See docs/agent.md.

use std::collections::HashMap;

use super::spawn::Entry;

/// One row of /proc/<pid>/stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) ppid: u32,
    pub(crate) pgrp: u32,
    pub(crate) start: u64,
    pub(crate) zombie: bool,
}

/// Parses /proc/<pid>/stat. The command name may contain anything, `)` and spaces
/// included, so fields are taken after its *last* `)`.
pub(crate) fn parse_stat(s: &str) -> Option<Stat> {
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // After the name: state(0) ppid(1) pgrp(2) session(3) ... starttime(19).
    Some(Stat {
        zombie: *f.first()? == "Z",
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

fn read_stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

pub(crate) fn start_ticks(pid: u32) -> Option<u64> {
    read_stat(pid).map(|s| s.start)
}

/// Now, in the clock of `/proc/<pid>/stat` starttime (ticks since boot).
pub(crate) fn now_ticks() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let hz = rustix::param::clock_ticks_per_second();
    (t.tv_sec as u64) * hz + (t.tv_nsec as u64) * hz / 1_000_000_000
}

fn all_processes() -> HashMap<u32, Stat> {
    let mut m = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return m;
    };
    for e in dir.flatten() {
        if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())
            && let Some(st) = read_stat(pid)
        {
            m.insert(pid, st);
        }
    }
    m
}

/// Processes below the agent (in a container: all but PID 1), zombies excluded.
fn descendants(procs: &HashMap<u32, Stat>) -> Vec<u32> {
    let me = std::process::id();
    let mut out = Vec::new();
    for (&pid, st) in procs {
        if st.zombie || pid == me {
            continue;
        }
        let mut cur = st.ppid;
        // Bounded walk: a cycle cannot exist in /proc, but a racing scan can look odd.
        for _ in 0..4096 {
            if cur == me {
                out.push(pid);
                break;
            }
            match procs.get(&cur) {
                Some(p) if cur != 0 && cur != p.ppid => cur = p.ppid,
                _ => break,
            }
        }
    }
    out
}

pub(crate) fn all_descendants() -> Vec<u32> {
    descendants(&all_processes())
}

/// The values of every marker variable in an environment block (`/proc/<pid>/environ`).
/// A process may list the variable more than once; each value counts.
fn markers_in(environ: &[u8]) -> Vec<&[u8]> {
    let prefix = format!("{}=", super::MARKER_VAR);
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .collect()
}

fn read_environ(pid: u32) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/environ")).ok()
}

/// Another spawn, as the kill sees it: one still in the agent's table, or one that ended
/// recently (only its run time is kept, so that a leftover of it is not mistaken for an
/// orphan of the target when both roots ran at the same moment).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Other<'a> {
    /// The root's pid while the root is unreaped (after that the number may be anyone's).
    pub(crate) root: Option<u32>,
    /// The marker the agent issued to it; `None` once the spawn left the table.
    pub(crate) marker: Option<&'a str>,
    /// When its root started, in the clock of `/proc/<pid>/stat` starttime.
    pub(crate) start_ticks: u64,
    /// When its root was reaped; `None` while it runs.
    pub(crate) exit_ticks: Option<u64>,
}

/// Whether a root that started at `start` and was reaped at `exit` ran at tick `at`.
fn ran_at(start: u64, exit: Option<u64>, at: u64) -> bool {
    start <= at && exit.is_none_or(|x| x >= at)
}

/// The spawn being killed.
#[derive(Debug, Clone, Copy)]
struct Target<'a> {
    pid: u32,
    marker: &'a str,
    start_ticks: u64,
    exit_ticks: Option<u64>,
}

/// One kill's view: the process table at one moment and the spawns the agent knows.
struct Scan<'a, F> {
    target: Target<'a>,
    others: &'a [Other<'a>],
    procs: &'a HashMap<u32, Stat>,
    /// The agent's pid: a process whose parent it is, and is no spawn's root, is an orphan.
    me: u32,
    /// Whether process group `target.pid` is the target's: true while its root is unreaped,
    /// and after that while no process has that pid (the kernel does not reuse a number
    /// still in use as a group id, so a process holding it means the group is gone).
    group_is_targets: bool,
    environ: F,
}

/// The live processes that belong to `target`.
pub(crate) fn victims(target: &Entry, others: &[Other<'_>]) -> Vec<u32> {
    let procs = all_processes();
    let mine = descendants(&procs);
    let scan = Scan {
        target: Target {
            pid: target.pid,
            marker: &target.marker,
            start_ticks: target.start_ticks,
            exit_ticks: target.exit_ticks,
        },
        others,
        procs: &procs,
        me: std::process::id(),
        group_is_targets: target.exit_ticks.is_none() || !procs.contains_key(&target.pid),
        environ: read_environ,
    };
    scan.victims(&mine)
}

impl<F: Fn(u32) -> Option<Vec<u8>>> Scan<'_, F> {
    fn victims(&self, candidates: &[u32]) -> Vec<u32> {
        let mut memo = HashMap::new();
        candidates
            .iter()
            .copied()
            .filter(|&pid| self.belongs(pid, &mut memo, 0))
            .collect()
    }

    fn belongs(&self, pid: u32, memo: &mut HashMap<u32, bool>, depth: u32) -> bool {
        if let Some(&b) = memo.get(&pid) {
            return b;
        }
        let Some(st) = self.procs.get(&pid) else {
            return false;
        };
        let b = if pid == self.target.pid && self.target.exit_ticks.is_none() {
            true
        } else if self.others.iter().any(|o| o.root == Some(pid)) {
            false
        } else if st.ppid != self.me {
            // Bounded walk: a cycle cannot exist in /proc, but a racing scan can look odd.
            depth < 4096 && self.belongs(st.ppid, memo, depth + 1)
        } else {
            self.orphan_belongs(pid, st)
        };
        memo.insert(pid, b);
        b
    }

    fn orphan_belongs(&self, pid: u32, st: &Stat) -> bool {
        let target = self.target;
        let environ = (self.environ)(pid).unwrap_or_default();
        let markers = markers_in(&environ);
        let carries = |m: &str| markers.contains(&m.as_bytes());
        if (self.group_is_targets && st.pgrp == target.pid) || carries(target.marker) {
            return true;
        }
        // Only a marker the agent issued, to a spawn whose root had started by then (its
        // processes cannot be older than it): any other value is a string the process
        // chose, and proves nothing.
        if self
            .others
            .iter()
            .any(|o| o.marker.is_some_and(carries) && o.start_ticks <= st.start)
        {
            return false;
        }
        ran_at(target.start_ticks, target.exit_ticks, st.start)
            && !self
                .others
                .iter()
                .any(|o| ran_at(o.start_ticks, o.exit_ticks, st.start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_last_paren() {
        let s = "42 (evil) 1 2 3) S 7 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0";
        let st = parse_stat(s).unwrap();
        assert_eq!(
            (st.ppid, st.pgrp, st.start, st.zombie),
            (7, 42, 12345, false)
        );
    }

    #[test]
    fn malformed_stat_is_none() {
        assert_eq!(parse_stat("no paren"), None);
        assert_eq!(parse_stat("1 (x) Z"), None);
    }

    const ME: u32 = 1;
    const T: Target<'static> = Target {
        pid: 10,
        marker: "n-1",
        start_ticks: 100,
        exit_ticks: None,
    };
    const B: Other<'static> = Other {
        root: Some(20),
        marker: Some("n-2"),
        start_ticks: 105,
        exit_ticks: None,
    };

    fn st(ppid: u32, pgrp: u32, start: u64) -> Stat {
        Stat {
            ppid,
            pgrp,
            start,
            zombie: false,
        }
    }

    /// `procs`: (pid, ppid, pgrp, start, marker values); the target and B's roots are
    /// added. Returns the victims among all processes, sorted.
    fn victims_of(
        target: Target<'_>,
        others: &[Other<'_>],
        procs: &[(u32, u32, u32, u64, &[&str])],
    ) -> Vec<u32> {
        let mut table = HashMap::new();
        let mut env: HashMap<u32, Vec<u8>> = HashMap::new();
        if target.exit_ticks.is_none() {
            table.insert(target.pid, st(ME, target.pid, target.start_ticks));
        }
        for o in others {
            if let Some(root) = o.root {
                table.insert(root, st(ME, root, o.start_ticks));
            }
        }
        for &(pid, ppid, pgrp, start, markers) in procs {
            table.insert(pid, st(ppid, pgrp, start));
            let mut e = b"PATH=/bin".to_vec();
            for m in markers {
                e.extend_from_slice(format!("\0{}={m}", super::super::MARKER_VAR).as_bytes());
            }
            env.insert(pid, e);
        }
        let scan = Scan {
            target,
            others,
            procs: &table,
            me: ME,
            group_is_targets: target.exit_ticks.is_none() || !table.contains_key(&target.pid),
            environ: |pid| env.get(&pid).cloned(),
        };
        let all: Vec<u32> = table.keys().copied().collect();
        let mut v = scan.victims(&all);
        v.sort();
        v
    }

    #[test]
    fn a_descendant_is_the_targets_whatever_it_set_itself() {
        // 11: own session and another live spawn's marker; 12: below it, no marker;
        // 13: a made-up marker.
        let procs: &[(u32, u32, u32, u64, &[&str])] = &[
            (11, 10, 11, 110, &["n-2"]),
            (12, 11, 12, 111, &[]),
            (13, 10, 13, 110, &["x"]),
        ];
        assert_eq!(victims_of(T, &[B], procs), vec![10, 11, 12, 13]);
    }

    #[test]
    fn a_descendant_of_another_spawn_is_never_the_targets() {
        // Below B's root, even in the target's group or with the target's marker.
        let procs: &[(u32, u32, u32, u64, &[&str])] =
            &[(21, 20, 20, 110, &["n-2"]), (22, 21, 10, 111, &["n-1"])];
        assert_eq!(victims_of(T, &[B], procs), vec![10]);
    }

    #[test]
    fn an_orphan_with_an_unissued_marker_is_judged_by_its_start() {
        // The only spawn ran at 110: taken. At 90 nothing of the target ran: left.
        let procs: &[(u32, u32, u32, u64, &[&str])] =
            &[(30, ME, 30, 110, &["n-9"]), (31, ME, 31, 90, &["n-9"])];
        assert_eq!(victims_of(T, &[], procs), vec![10, 30]);
    }

    #[test]
    fn an_orphan_with_a_live_spawns_marker_is_left_only_if_that_spawn_could_have_started_it() {
        // B started at 105: an orphan from 110 with B's marker may be B's; one from 102
        // predates B, so the marker is forged, and the target alone ran then.
        let procs: &[(u32, u32, u32, u64, &[&str])] =
            &[(30, ME, 30, 110, &["n-2"]), (31, ME, 31, 102, &["n-2"])];
        assert_eq!(victims_of(T, &[B], procs), vec![10, 31]);
    }

    #[test]
    fn the_targets_own_group_or_marker_wins_over_another_marker() {
        let procs: &[(u32, u32, u32, u64, &[&str])] = &[
            (30, ME, 10, 110, &["n-2"]),
            (31, ME, 31, 110, &["n-2", "n-1"]),
        ];
        assert_eq!(victims_of(T, &[B], procs), vec![10, 30, 31]);
    }

    #[test]
    fn an_orphan_started_while_an_ended_spawn_ran_is_left() {
        let ended = Other {
            root: None,
            marker: None,
            start_ticks: 90,
            exit_ticks: Some(100),
        };
        // Same tick as the target's start: the ended spawn ran then too.
        let procs: &[(u32, u32, u32, u64, &[&str])] =
            &[(30, ME, 30, 100, &[]), (31, ME, 31, 101, &[])];
        assert_eq!(victims_of(T, &[ended], procs), vec![10, 31]);
    }

    #[test]
    fn the_group_number_stops_counting_once_the_reaped_roots_pid_is_reused() {
        let reaped = Target {
            exit_ticks: Some(150),
            ..T
        };
        // 30 is in group 10 and started after the root ended.
        let kept: &[(u32, u32, u32, u64, &[&str])] = &[(30, ME, 10, 160, &[])];
        assert_eq!(victims_of(reaped, &[], kept), vec![30]);
        // Pid 10 belongs to a new process: group 10 is its group, not the target's.
        let reused: &[(u32, u32, u32, u64, &[&str])] =
            &[(10, ME, 10, 155, &[]), (30, ME, 10, 160, &[])];
        assert_eq!(victims_of(reaped, &[], reused), Vec::<u32>::new());
    }
}
