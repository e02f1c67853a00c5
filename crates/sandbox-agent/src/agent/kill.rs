//! Which processes belong to a spawn, read from /proc.
//!
//! A process belongs to spawn S when any of these holds (checked in this order):
//! 1. it is S's root, or in S's process group (catches `&`, `nohup`, double forks);
//! 2. its environment carries S's marker (catches `setsid`, whatever its parent did);
//! 3. its parent belongs to S (catches everything forked below a member);
//! 4. it is an orphan re-parented to the agent, matched by none of the above (it called
//!    `setsid` *and* cleared its environment), started while S's root ran, and S is the
//!    only spawn whose root ran at that moment.
//!
//! Rule 4 is a heuristic and says no when in doubt (two spawns running at once); cgroups
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

fn has_marker(pid: u32, marker: &str) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let want = format!("{}={marker}", super::MARKER_VAR);
    env.split(|b| *b == 0).any(|kv| kv == want.as_bytes())
}

/// Whether `pid` carries a spawn marker other than `marker` (any spawn's, including
/// spawns that already ended).
fn has_other_marker(pid: u32, marker: &str) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let prefix = format!("{}=", super::MARKER_VAR);
    env.split(|b| *b == 0).any(|kv| {
        kv.strip_prefix(prefix.as_bytes())
            .is_some_and(|value| value != marker.as_bytes())
    })
}

/// The live processes that belong to `target`.
pub(crate) fn victims(target: &Entry, others: &[&Entry]) -> Vec<u32> {
    let procs = all_processes();
    let me = std::process::id();
    let mine = descendants(&procs);
    let other_roots: Vec<u32> = others.iter().map(|e| e.pid).collect();
    let mut memo: HashMap<u32, bool> = HashMap::new();
    let mut out = Vec::new();
    for &pid in &mine {
        if belongs(pid, target, others, &other_roots, &procs, me, &mut memo, 0) {
            out.push(pid);
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn belongs(
    pid: u32,
    target: &Entry,
    others: &[&Entry],
    other_roots: &[u32],
    procs: &HashMap<u32, Stat>,
    me: u32,
    memo: &mut HashMap<u32, bool>,
    depth: u32,
) -> bool {
    if let Some(&b) = memo.get(&pid) {
        return b;
    }
    let Some(st) = procs.get(&pid) else {
        return false;
    };
    let root_alive = target.exit_ticks.is_none();
    // Other spawns first: once the target's root is reaped its pid may be reused by
    // another spawn's root (whose group id is then that same number).
    let b = if other_roots.contains(&pid) || others.iter().any(|o| st.pgrp == o.pid) {
        false
    } else if (pid == target.pid && root_alive)
        || st.pgrp == target.pid
        || has_marker(pid, &target.marker)
    {
        true
    } else if has_other_marker(pid, &target.marker) {
        // Another spawn's process, live or finished: a background process an earlier
        // command left running is not part of this one, even when it was reparented to
        // the agent within the same clock tick as this spawn started (start times have a
        // 10 ms resolution, and a spawn through the agent takes less).
        false
    } else if st.ppid == me {
        orphan_of_target(st.start, target, others)
    } else if depth < 4096 {
        belongs(
            st.ppid,
            target,
            others,
            other_roots,
            procs,
            me,
            memo,
            depth + 1,
        )
    } else {
        false
    };
    memo.insert(pid, b);
    b
}

fn orphan_of_target(start: u64, target: &Entry, others: &[&Entry]) -> bool {
    let ran_at = |e: &Entry| e.start_ticks <= start && e.exit_ticks.is_none_or(|x| x >= start);
    ran_at(target) && !others.iter().any(|o| ran_at(o))
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
}
