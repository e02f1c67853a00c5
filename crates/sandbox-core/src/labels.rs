//! Engine labels: the reserved `io.sandbox-rs.` namespace, owner identity and validation.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Result, SandboxError};

/// Prefix reserved for sandbox-rs labels.
pub const LABEL_PREFIX: &str = "io.sandbox-rs.";
/// `io.sandbox-rs.managed=true` marks every container sandbox-rs creates.
pub const LABEL_MANAGED: &str = "io.sandbox-rs.managed";
/// Random id of the creating process's session.
pub const LABEL_SESSION: &str = "io.sandbox-rs.session";
/// Owner: `<host>/<pid>/<process start time>/<boot id>/<pid namespace inode>` (see
/// [`Owner`]; the old `<host>/<pid>/<start>` form is still parsed, as unverifiable).
pub const LABEL_OWNER: &str = "io.sandbox-rs.owner";
/// Deadline, Unix seconds.
pub const LABEL_DEADLINE: &str = "io.sandbox-rs.deadline";
/// The latest deadline the sandbox can reach, Unix seconds: its deadline at create
/// moved by every extension `CreateOptions::max_lifetime` allows. Engine labels cannot
/// change after create, so an extended sandbox's [`LABEL_DEADLINE`] is stale; cleanups
/// that judge a sandbox from its labels (another process's sweep, `sandbox reap`) count
/// it expired only past this one, so they never remove a sandbox its owner extended.
/// Absent on sandboxes created before extensions existed: [`LABEL_DEADLINE`] then.
pub const LABEL_MAX_DEADLINE: &str = "io.sandbox-rs.max-deadline";
/// The idle limit (`CreateOptions::idle_timeout`) in seconds, when one is set.
pub const LABEL_IDLE_TIMEOUT: &str = "io.sandbox-rs.idle-timeout";
/// Backend name.
pub const LABEL_BACKEND: &str = "io.sandbox-rs.backend";
/// Which way the creator's commands go, set by backends that have an in-sandbox agent:
/// [`EXEC_PATH_AGENT`] or [`EXEC_PATH_EXEC`]. Absent: the backend has no agent.
pub const LABEL_EXEC_PATH: &str = "io.sandbox-rs.exec-path";
/// [`LABEL_EXEC_PATH`] of a sandbox whose commands go through its agent.
pub const EXEC_PATH_AGENT: &str = "agent";
/// [`LABEL_EXEC_PATH`] of a sandbox created without its agent (the engine's exec path).
pub const EXEC_PATH_EXEC: &str = "exec";
/// The protocol versions of the agent a sandbox runs as PID 1 (comma-separated, e.g.
/// `1,2,3`), set with [`EXEC_PATH_AGENT`]. A later handle (`connect`) learns from it,
/// outside the agent's stream, whether the agent takes a new host session over: an agent
/// that does not would read the takeover as a broken frame.
pub const LABEL_AGENT_PROTOCOL: &str = "io.sandbox-rs.agent-protocol";
/// On a snapshot image: the id of the sandbox whose filesystem it holds. It marks the
/// image as a snapshot (with [`LABEL_MANAGED`]).
pub const LABEL_SNAPSHOT_OF: &str = "io.sandbox-rs.snapshot-of";
/// On a fork made by `Sandbox::fork`: the id of the sandbox it was forked from.
pub const LABEL_FORK_OF: &str = "io.sandbox-rs.fork-of";
/// On a snapshot image: when it was made, Unix seconds.
pub const LABEL_CREATED: &str = "io.sandbox-rs.created";
/// Prefix of user metadata labels.
pub const LABEL_META_PREFIX: &str = "io.sandbox-rs.meta.";

/// Refuses empty keys, `=`, and control characters in env keys.
pub fn validate_env_key(k: &str) -> Result<()> {
    if k.is_empty() || k.contains('=') || k.chars().any(|c| c.is_control()) {
        return Err(SandboxError::config(
            format!("env key {k:?} is invalid"),
            "env keys are non-empty, without `=` or control characters",
        ));
    }
    Ok(())
}

/// Refuses reserved keys and control characters in metadata.
pub fn validate_metadata(meta: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in meta {
        if k.starts_with(LABEL_PREFIX) {
            return Err(SandboxError::config(
                format!("metadata key `{k}` is in the reserved `io.sandbox-rs.` namespace"),
                "choose a key without the `io.sandbox-rs.` prefix",
            ));
        }
        let key_ok = !k.is_empty()
            && k.len() <= 128
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c));
        if !key_ok {
            return Err(SandboxError::config(
                format!("metadata key {k:?} is invalid"),
                "use 1-128 characters from [A-Za-z0-9._-/]",
            ));
        }
        if v.chars().any(|c| c.is_control()) || v.len() > 1024 {
            return Err(SandboxError::config(
                format!("metadata value of `{k}` has control characters or is over 1024 bytes"),
                "remove control characters",
            ));
        }
    }
    Ok(())
}

/// Who created a sandbox: host, pid and that process's start time (so a reused pid is
/// never mistaken for the owner), plus the boot id and the pid namespace, without which a
/// pid means nothing: the same hostname is shared by processes in other pid namespaces
/// (`--network host` containers, hostNetwork pods, CI runners with the engine socket
/// mounted), and pids and start times restart at every boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Process start time in clock ticks since boot (Linux `/proc/<pid>/stat` field 22).
    pub start_time: u64,
    /// Kernel boot id (`/proc/sys/kernel/random/boot_id`); `None` in an old-format label
    /// or when it could not be read.
    pub boot_id: Option<String>,
    /// Inode of the owner's pid namespace (the `/proc/self/ns/pid` link target
    /// `pid:[N]`); `None` in an old-format label or when it could not be read.
    pub pid_ns: Option<u64>,
}

/// What the owner check found about one pid in our `/proc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PidState {
    /// No such process in our pid namespace.
    Absent,
    /// Alive (or a zombie) with this start time.
    Alive(u64),
    /// Present but unreadable, or unparseable: nothing can be concluded.
    Unknown,
}

/// What this process can observe about the processes around it. The real one reads
/// `/proc`; tests substitute hidepid, foreign namespaces and the like.
trait ProcView {
    /// Whether an absent `/proc/<pid>` really means "no such process": `/proc` is mounted
    /// for our own pid namespace and without `hidepid` (which hides other users' pids).
    fn pid_table_trusted(&self) -> bool;
    fn lookup(&self, pid: u32) -> PidState;
}

/// The machine's `/proc`.
struct LiveProc;

impl ProcView for LiveProc {
    fn pid_table_trusted(&self) -> bool {
        proc_is_ours() && !proc_hides_pids()
    }

    fn lookup(&self, pid: u32) -> PidState {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => parse_start_time(&stat).map_or(PidState::Unknown, PidState::Alive),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // `stat` can be missing while the directory exists (a race with exit):
                // only a missing directory is absence.
                match std::fs::symlink_metadata(format!("/proc/{pid}")) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => PidState::Absent,
                    _ => PidState::Unknown,
                }
            }
            Err(_) => PidState::Unknown,
        }
    }
}

/// `/proc/self` names our pid: otherwise `/proc` belongs to another pid namespace and
/// its pid table says nothing about ours.
fn proc_is_ours() -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str().and_then(|s| s.parse::<u32>().ok()))
        == Some(std::process::id())
}

/// Whether the `/proc` mount has `hidepid` set (any value but `0`/`off`). Unreadable
/// mount information counts as hiding: what cannot be checked is not trusted.
fn proc_hides_pids() -> bool {
    match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(info) => mount_hides_pids(&info, "/proc"),
        Err(_) => true,
    }
}

/// Parses `mountinfo` for the mount at `mount_point` (the last one wins, as it shadows
/// the others): whether its super options hide pids. No such mount counts as hiding.
fn mount_hides_pids(mountinfo: &str, mount_point: &str) -> bool {
    let mut hides = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.get(4) != Some(&mount_point) {
            continue;
        }
        // Optional fields end at "-"; then fstype, source, super options.
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            hides = Some(true);
            continue;
        };
        let fstype = fields.get(dash + 1).copied().unwrap_or("");
        let options = fields.get(dash + 3).copied().unwrap_or("");
        let hidden = fstype != "proc"
            || options.split(',').any(|o| {
                o.strip_prefix("hidepid=")
                    .is_some_and(|v| v != "0" && v != "off")
            });
        hides = Some(hidden);
    }
    hides.unwrap_or(true)
}

impl Owner {
    /// The current process.
    pub fn current() -> &'static Owner {
        static OWNER: OnceLock<Owner> = OnceLock::new();
        OWNER.get_or_init(|| {
            let pid = std::process::id();
            Owner {
                host: host_name(),
                pid,
                start_time: process_start_time(pid).unwrap_or(0),
                boot_id: boot_id(),
                pid_ns: pid_namespace(),
            }
        })
    }

    /// Label value `<host>/<pid>/<start>/<boot id>/<pid namespace inode>`; an unknown
    /// boot id or namespace is left empty (such an owner is never proven gone).
    pub fn to_label(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}",
            self.host,
            self.pid,
            self.start_time,
            self.boot_id.as_deref().unwrap_or(""),
            self.pid_ns.map(|n| n.to_string()).unwrap_or_default()
        )
    }

    /// Parses a label value: the current format, or the old `<host>/<pid>/<start>`
    /// (parsed with no boot id and no namespace, so it is unverifiable).
    pub fn parse(s: &str) -> Option<Owner> {
        Owner::parse_current(s).or_else(|| Owner::parse_old(s))
    }

    fn parse_current(s: &str) -> Option<Owner> {
        let mut it = s.rsplitn(5, '/');
        let pid_ns = match it.next()? {
            "" => None,
            n => Some(n.parse().ok()?),
        };
        let boot_id = match it.next()? {
            "" => None,
            b if valid_boot_id(b) => Some(b.to_string()),
            _ => return None,
        };
        let start_time = it.next()?.parse().ok()?;
        let pid = it.next()?.parse().ok()?;
        let host = it.next()?.to_string();
        Some(Owner {
            host,
            pid,
            start_time,
            boot_id,
            pid_ns,
        })
    }

    fn parse_old(s: &str) -> Option<Owner> {
        let mut it = s.rsplitn(3, '/');
        let start_time = it.next()?.parse().ok()?;
        let pid = it.next()?.parse().ok()?;
        let host = it.next()?.to_string();
        Some(Owner {
            host,
            pid,
            start_time,
            boot_id: None,
            pid_ns: None,
        })
    }

    /// Whether this owner is *proven* gone: same host, same boot and same pid namespace
    /// as this process, a `/proc` that can see every pid of that namespace, and the pid
    /// absent or alive with another start time. Anything unverifiable (an old-format
    /// label, a missing field, another boot or namespace, `hidepid`, an unreadable
    /// process) is foreign: never proven gone.
    pub fn is_proven_gone(&self) -> bool {
        self.is_proven_gone_in(Owner::current(), &LiveProc)
    }

    fn is_proven_gone_in(&self, me: &Owner, view: &dyn ProcView) -> bool {
        let (Some(boot), Some(ns)) = (&self.boot_id, self.pid_ns) else {
            return false;
        };
        let same_place = self.host == me.host
            && me.boot_id.as_ref() == Some(boot)
            && me.pid_ns == Some(ns)
            && self.start_time != 0;
        if !same_place || !view.pid_table_trusted() {
            return false;
        }
        match view.lookup(self.pid) {
            PidState::Absent => true,
            PidState::Alive(t) => t != self.start_time,
            PidState::Unknown => false,
        }
    }
}

/// A boot id as the kernel writes it: a UUID (hex and dashes).
fn valid_boot_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| valid_boot_id(s))
}

/// The inode in the `pid:[N]` target of `/proc/self/ns/pid`.
fn pid_namespace() -> Option<u64> {
    let target = std::fs::read_link("/proc/self/ns/pid").ok()?;
    target
        .to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Start time of a process (field 22 of `/proc/<pid>/stat`), `None` if unreadable.
pub fn process_start_time(pid: u32) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// A random session id for this process (hex), stable for its lifetime.
pub fn session_id() -> &'static str {
    static SESSION: OnceLock<String> = OnceLock::new();
    SESSION.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mix = nanos ^ ((std::process::id() as u128) << 64);
        format!(
            "{:016x}",
            (mix as u64) ^ ((mix >> 64) as u64).rotate_left(17)
        )
    })
}

/// The full label set for a new sandbox: managed marker, session, owner, backend, deadline
/// and the user's metadata under `io.sandbox-rs.meta.`.
pub fn sandbox_labels(
    backend: &str,
    deadline_unix: u64,
    metadata: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(LABEL_MANAGED.to_string(), "true".to_string());
    l.insert(LABEL_SESSION.to_string(), session_id().to_string());
    l.insert(LABEL_OWNER.to_string(), Owner::current().to_label());
    l.insert(LABEL_BACKEND.to_string(), backend.to_string());
    l.insert(LABEL_DEADLINE.to_string(), deadline_unix.to_string());
    for (k, v) in metadata {
        l.insert(format!("{LABEL_META_PREFIX}{k}"), v.clone());
    }
    l
}

/// Adds the lifetime limits to a sandbox's labels ([`sandbox_labels`]): the latest
/// deadline extensions can reach ([`LABEL_MAX_DEADLINE`]) and the idle limit
/// ([`LABEL_IDLE_TIMEOUT`], whole seconds rounded up) when there is one.
pub fn add_lifetime_limits(
    labels: &mut BTreeMap<String, String>,
    max_deadline_unix: u64,
    idle_timeout: Option<std::time::Duration>,
) {
    labels.insert(
        LABEL_MAX_DEADLINE.to_string(),
        max_deadline_unix.to_string(),
    );
    if let Some(idle) = idle_timeout {
        let secs = idle.as_secs() + u64::from(idle.subsec_nanos() > 0);
        labels.insert(LABEL_IDLE_TIMEOUT.to_string(), secs.to_string());
    }
}

/// The latest deadline a sandbox can reach by its labels, Unix seconds:
/// [`LABEL_MAX_DEADLINE`], else (a sandbox from before extensions) [`LABEL_DEADLINE`].
/// What a process that did not create the sandbox must assume, since the owner may have
/// moved the labelled deadline. Does not judge provenance (see `Provenance`).
pub fn latest_deadline(labels: &BTreeMap<String, String>) -> Option<u64> {
    let get = |k: &str| labels.get(k).and_then(|v| v.parse::<u64>().ok());
    let deadline = get(LABEL_DEADLINE)?;
    Some(get(LABEL_MAX_DEADLINE).map_or(deadline, |m| m.max(deadline)))
}

/// The only labels a snapshot image carries: managed marker, backend, the sandbox it was
/// made from and when. None of the sandbox's own (owner, session, deadline, metadata):
/// whoever runs the image later must not inherit them.
pub fn snapshot_labels(backend: &str, source: &str, created_unix: u64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_BACKEND.to_string(), backend.to_string()),
        (LABEL_SNAPSHOT_OF.to_string(), source.to_string()),
        (LABEL_CREATED.to_string(), created_unix.to_string()),
    ])
}

/// Turns a user label filter (`k=v` on metadata) into engine label filters.
pub fn metadata_filter(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| {
            if k.starts_with(LABEL_PREFIX) {
                (k.clone(), v.clone())
            } else {
                (format!("{LABEL_META_PREFIX}{k}"), v.clone())
            }
        })
        .collect()
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc` as the tests want it.
    struct View {
        trusted: bool,
        pids: Vec<(u32, PidState)>,
    }

    impl ProcView for View {
        fn pid_table_trusted(&self) -> bool {
            self.trusted
        }
        fn lookup(&self, pid: u32) -> PidState {
            self.pids
                .iter()
                .find(|(p, _)| *p == pid)
                .map_or(PidState::Absent, |(_, s)| *s)
        }
    }

    const BOOT: &str = "86a361f4-0463-4241-8e3c-d3666e5df88f";

    fn me() -> Owner {
        Owner {
            host: "builder".into(),
            pid: 100,
            start_time: 5000,
            boot_id: Some(BOOT.into()),
            pid_ns: Some(4026531836),
        }
    }

    /// An owner on our host, boot and namespace, pid 200 started at tick 7000.
    fn neighbour() -> Owner {
        Owner {
            pid: 200,
            start_time: 7000,
            ..me()
        }
    }

    fn proc_with(pid: PidState) -> View {
        View {
            trusted: true,
            pids: vec![(200, pid)],
        }
    }

    #[test]
    fn owner_whose_pid_is_absent_is_proven_gone() {
        assert!(neighbour().is_proven_gone_in(&me(), &proc_with(PidState::Absent)));
    }

    #[test]
    fn owner_whose_pid_was_reused_is_proven_gone() {
        assert!(neighbour().is_proven_gone_in(&me(), &proc_with(PidState::Alive(9000))));
    }

    #[test]
    fn live_owner_is_not_gone() {
        assert!(!neighbour().is_proven_gone_in(&me(), &proc_with(PidState::Alive(7000))));
    }

    #[test]
    fn unreadable_owner_process_is_not_proven_gone() {
        assert!(!neighbour().is_proven_gone_in(&me(), &proc_with(PidState::Unknown)));
    }

    #[test]
    fn owner_in_another_pid_namespace_with_our_hostname_is_foreign() {
        // The attack: a `--network host` container (same hostname) whose owner pid does
        // not exist in our namespace; the old check removed its live sandboxes.
        let other = Owner {
            pid_ns: Some(4026532000),
            ..neighbour()
        };
        assert!(!other.is_proven_gone_in(&me(), &proc_with(PidState::Absent)));
    }

    #[test]
    fn owner_from_another_boot_is_foreign() {
        let other = Owner {
            boot_id: Some("00000000-0000-0000-0000-000000000000".into()),
            ..neighbour()
        };
        assert!(!other.is_proven_gone_in(&me(), &proc_with(PidState::Absent)));
    }

    #[test]
    fn owner_on_another_host_is_foreign() {
        let other = Owner {
            host: "elsewhere".into(),
            ..neighbour()
        };
        assert!(!other.is_proven_gone_in(&me(), &proc_with(PidState::Absent)));
    }

    #[test]
    fn owner_with_missing_fields_is_unverifiable() {
        let view = proc_with(PidState::Absent);
        for o in [
            Owner {
                boot_id: None,
                ..neighbour()
            },
            Owner {
                pid_ns: None,
                ..neighbour()
            },
            Owner {
                start_time: 0,
                ..neighbour()
            },
        ] {
            assert!(!o.is_proven_gone_in(&me(), &view), "{o:?}");
        }
        // And when *we* could not read our own boot id or namespace.
        let blind = Owner {
            boot_id: None,
            pid_ns: None,
            ..me()
        };
        assert!(!neighbour().is_proven_gone_in(&blind, &view));
    }

    #[test]
    fn old_format_label_parses_as_unverifiable() {
        let old = Owner::parse("builder/200/7000").unwrap();
        assert_eq!(
            (old.host.as_str(), old.pid, old.start_time),
            ("builder", 200, 7000)
        );
        assert_eq!((old.boot_id.as_deref(), old.pid_ns), (None, None));
        assert!(!old.is_proven_gone_in(&me(), &proc_with(PidState::Absent)));
    }

    #[test]
    fn hidepid_makes_absence_unprovable() {
        let hidden = View {
            trusted: false,
            pids: vec![],
        };
        assert!(!neighbour().is_proven_gone_in(&me(), &hidden));
    }

    #[test]
    fn mountinfo_hidepid_detection() {
        let plain = "22 27 0:21 / /proc rw,relatime - proc proc rw\n";
        assert!(!mount_hides_pids(plain, "/proc"));
        for opt in [
            "hidepid=2",
            "hidepid=invisible",
            "hidepid=1",
            "hidepid=noaccess",
        ] {
            let info = format!("22 27 0:21 / /proc rw,relatime shared:12 - proc proc rw,{opt}\n");
            assert!(mount_hides_pids(&info, "/proc"), "{opt}");
        }
        assert!(!mount_hides_pids(
            "22 27 0:21 / /proc rw - proc proc rw,hidepid=off,subset=pid\n",
            "/proc"
        ));
        // The last mount on /proc shadows the earlier one.
        let stacked = format!("{plain}30 27 0:40 / /proc rw - proc proc rw,hidepid=2\n");
        assert!(mount_hides_pids(&stacked, "/proc"));
        // No /proc mount, or something else mounted there: nothing can be trusted.
        assert!(mount_hides_pids("", "/proc"));
        assert!(mount_hides_pids(
            "22 27 0:21 / /proc rw - tmpfs tmpfs rw\n",
            "/proc"
        ));
    }

    #[test]
    fn labels_round_trip_in_both_formats() {
        for o in [
            me(),
            Owner {
                boot_id: None,
                pid_ns: None,
                ..me()
            },
        ] {
            assert_eq!(Owner::parse(&o.to_label()), Some(o));
        }
        for bad in [
            "",
            "h",
            "h/x/1",
            "h/1/x",
            "h/1/2/not-a-uuid!/3",
            "h/1/2/abc/x",
        ] {
            let parsed = Owner::parse(bad);
            assert!(
                parsed.as_ref().is_none_or(|o| o.boot_id.is_none()),
                "{bad}: {parsed:?}"
            );
        }
    }

    #[test]
    fn start_time_parsing_survives_hostile_command_names() {
        let stat = "42 (a) b) (c) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 777 0 0";
        assert_eq!(parse_start_time(stat), Some(777));
        assert_eq!(parse_start_time("42 (x)"), None);
        assert_eq!(parse_start_time("42 (x"), None);
    }

    #[test]
    fn this_process_is_identified_fully_and_alive() {
        let me = Owner::current();
        assert!(me.start_time > 0);
        assert!(me.boot_id.is_some() && me.pid_ns.is_some(), "{me:?}");
        assert_eq!(Owner::parse(&me.to_label()).as_ref(), Some(me));
        assert!(!me.is_proven_gone());
    }

    #[test]
    fn an_exited_child_is_proven_gone_on_this_machine() {
        // End to end against the real /proc (this machine mounts it without hidepid).
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let owner = Owner {
            pid: child.id(),
            start_time: process_start_time(child.id()).expect("child start time"),
            ..Owner::current().clone()
        };
        assert!(!owner.is_proven_gone(), "alive");
        let reused = Owner {
            start_time: owner.start_time + 1,
            ..owner.clone()
        };
        assert!(reused.is_proven_gone(), "same pid, other start time");
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert!(owner.is_proven_gone(), "exited and reaped");
    }

    #[test]
    fn labels_carry_metadata() {
        let mut m = BTreeMap::new();
        m.insert("team".to_string(), "x".to_string());
        let l = sandbox_labels("docker", 10, &m);
        assert_eq!(l["io.sandbox-rs.meta.team"], "x");
        assert_eq!(l[LABEL_MANAGED], "true");
    }
}
