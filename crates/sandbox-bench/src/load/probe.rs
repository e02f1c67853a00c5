//! What the load benchmark reads from the host: available memory, the proportional memory
//! (PSS) and open descriptors of the engine's daemons, of its per-container helpers (shim,
//! conmon), of the containers' own processes and of this process, the containers' cgroup
//! memory, and the inventory a leak would show up in (containers, networks, volumes,
//! checkpoint and state directories, host processes).
//!
//! Processes are attributed to a set of container ids: a helper or container process
//! counts only when its command line or cgroup names one of them, so containers other
//! programs run on the same daemons at the same time are not charged to this run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

/// The engine whose processes are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Docker,
    Podman,
}

impl Engine {
    pub fn parse(name: &str) -> Option<Engine> {
        match name {
            "docker" => Some(Engine::Docker),
            "podman" => Some(Engine::Podman),
            _ => None,
        }
    }

    /// The long-running daemons every container of this engine goes through.
    fn is_daemon(self, comm: &str) -> bool {
        match self {
            Engine::Docker => comm == "dockerd" || comm == "containerd",
            // The API service the adapters talk to (the CLI is not running while sampled).
            Engine::Podman => comm == "podman",
        }
    }

    /// The per-container host process the engine keeps beside each container.
    fn is_helper(self, comm: &str) -> bool {
        match self {
            // `containerd-shim-runc-v2`, truncated to 15 bytes in `comm`.
            Engine::Docker => comm.starts_with("containerd-shim"),
            Engine::Podman => comm == "conmon",
        }
    }
}

/// Which part of the host a process belongs to, for one engine and one set of containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// dockerd + containerd, or the Podman API service.
    Daemon,
    /// containerd-shim or conmon of one of the containers.
    Helper,
    /// A process inside one of the containers (the agent, `sleep`, an init).
    Container,
    /// This process: the library and everything it holds.
    Us,
}

/// Totals of one role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    pub processes: usize,
    pub pss_kib: u64,
    pub rss_kib: u64,
    pub fds: usize,
}

impl Usage {
    fn add(&mut self, p: &Proc) {
        self.processes += 1;
        self.pss_kib += p.pss_kib;
        self.rss_kib += p.rss_kib;
        self.fds += p.fds;
    }
}

/// One reading of the host.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    /// `MemAvailable` of `/proc/meminfo`.
    pub mem_available_kib: u64,
    pub roles: BTreeMap<Role, Usage>,
    /// Sum of the containers' memory cgroups' usage (page cache and kernel memory
    /// charged to them included).
    pub cgroup_kib: u64,
}

impl Snapshot {
    pub fn usage(&self, role: Role) -> Usage {
        self.roles.get(&role).copied().unwrap_or_default()
    }

    /// PSS of every counted role.
    pub fn pss_total_kib(&self) -> u64 {
        self.roles.values().map(|u| u.pss_kib).sum()
    }

    /// Open descriptors of every counted role.
    pub fn fds_total(&self) -> usize {
        self.roles.values().map(|u| u.fds).sum()
    }
}

/// One process as read from `/proc`.
#[derive(Debug, Clone)]
struct Proc {
    pid: u32,
    comm: String,
    cmdline: String,
    cgroup: String,
    pss_kib: u64,
    rss_kib: u64,
    fds: usize,
}

fn read_proc(pid: u32) -> Option<Proc> {
    let dir = Path::new("/proc").join(pid.to_string());
    let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
    let cmdline = std::fs::read(dir.join("cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    let cgroup = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
    Some(Proc {
        pid,
        comm: comm.trim().to_string(),
        cmdline,
        cgroup,
        pss_kib: 0,
        rss_kib: 0,
        fds: 0,
    })
}

/// Fills in memory and descriptors (only for the processes that are counted: reading
/// `smaps_rollup` walks every mapping).
fn measure(p: &mut Proc) {
    let dir = Path::new("/proc").join(p.pid.to_string());
    let rollup = std::fs::read_to_string(dir.join("smaps_rollup")).unwrap_or_default();
    p.pss_kib = kib_field(&rollup, "Pss:").unwrap_or(0);
    p.rss_kib = kib_field(&rollup, "Rss:").unwrap_or(0);
    p.fds = std::fs::read_dir(dir.join("fd"))
        .map(|d| d.count())
        .unwrap_or(0);
}

/// The value in KiB of a `Name:   123 kB` line.
pub fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The role of `p`, if it is counted for `engine` and the containers `ids`.
fn role_of(p: &Proc, engine: Engine, ids: &BTreeSet<String>, me: u32) -> Option<Role> {
    if p.pid == me {
        return Some(Role::Us);
    }
    if engine.is_daemon(&p.comm) {
        return Some(Role::Daemon);
    }
    let names_one = |s: &str| ids.iter().any(|id| s.contains(id.as_str()));
    if engine.is_helper(&p.comm) {
        return names_one(&p.cmdline).then_some(Role::Helper);
    }
    names_one(&p.cgroup).then_some(Role::Container)
}

/// `MemAvailable` now, in KiB.
pub fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| kib_field(&m, "MemAvailable:"))
        .unwrap_or(0)
}

/// The memory cgroup directory of a process, from its `/proc/<pid>/cgroup` text
/// (cgroup v1 `memory` controller, else the v2 unified hierarchy).
pub fn memory_cgroup_dir(cgroup: &str) -> Option<String> {
    let v1 = cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| format!("/sys/fs/cgroup/memory{path}"))
    });
    v1.or_else(|| {
        cgroup
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(|path| format!("/sys/fs/cgroup{path}"))
    })
}

fn cgroup_usage_kib(dir: &str) -> u64 {
    ["memory.usage_in_bytes", "memory.current"]
        .iter()
        .find_map(|f| {
            std::fs::read_to_string(Path::new(dir).join(f))
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|b| b / 1024)
        .unwrap_or(0)
}

/// Reads the host for `engine` and the containers `ids`.
pub fn snapshot(engine: Engine, ids: &BTreeSet<String>) -> Snapshot {
    let me = std::process::id();
    let mut out = Snapshot {
        mem_available_kib: mem_available_kib(),
        ..Snapshot::default()
    };
    let mut cgroups = BTreeSet::new();
    for pid in all_pids() {
        let Some(mut p) = read_proc(pid) else {
            continue;
        };
        let Some(role) = role_of(&p, engine, ids, me) else {
            continue;
        };
        measure(&mut p);
        out.roles.entry(role).or_default().add(&p);
        if role == Role::Container
            && let Some(dir) = memory_cgroup_dir(&p.cgroup)
        {
            cgroups.insert(dir);
        }
    }
    out.cgroup_kib = cgroups.iter().map(|d| cgroup_usage_kib(d)).sum();
    out
}

/// This process's resident memory (KiB), open descriptors and threads.
pub fn own() -> (u64, usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss = kib_field(&status, "VmRSS:").unwrap_or(0);
    let threads = kib_field(&status, "Threads:").unwrap_or(0) as usize;
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds, threads)
}

/// Host processes that would outlive a leaked container: the engine's per-container
/// helpers (all of them, whoever started the container) and processes inside any of the
/// containers `ids` ever named.
pub fn host_processes(engine: Engine, ids: &BTreeSet<String>) -> (usize, usize) {
    let mut helpers = 0;
    let mut inside = 0;
    for pid in all_pids() {
        let Some(p) = read_proc(pid) else {
            continue;
        };
        if engine.is_helper(&p.comm) {
            helpers += 1;
        } else if ids.iter().any(|id| p.cgroup.contains(id.as_str())) {
            inside += 1;
        }
    }
    (helpers, inside)
}

/// Entries in a directory (0 when it does not exist).
pub fn entries(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Checkpoint directories Docker keeps under its containers
/// (`/var/lib/docker/containers/<id>/checkpoints/<name>`); Podman keeps none outside
/// exported archives.
pub fn checkpoint_dirs(engine: Engine) -> usize {
    if engine != Engine::Docker {
        return 0;
    }
    std::fs::read_dir("/var/lib/docker/containers")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| entries(&e.path().join("checkpoints").to_string_lossy()))
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kib_fields() {
        let t = "Rss:                1234 kB\nPss:                 567 kB\n";
        assert_eq!(kib_field(t, "Pss:"), Some(567));
        assert_eq!(kib_field(t, "Rss:"), Some(1234));
        assert_eq!(kib_field(t, "Swap:"), None);
    }

    #[test]
    fn memory_cgroups_v1_and_v2() {
        let v1 = "9:name=systemd:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        assert_eq!(
            memory_cgroup_dir(v1).as_deref(),
            Some("/sys/fs/cgroup/memory/docker/abc")
        );
        let v2 = "0::/machine.slice/libpod-abc.scope\n";
        assert_eq!(
            memory_cgroup_dir(v2).as_deref(),
            Some("/sys/fs/cgroup/machine.slice/libpod-abc.scope")
        );
    }

    fn proc(pid: u32, comm: &str, cmdline: &str, cgroup: &str) -> Proc {
        Proc {
            pid,
            comm: comm.into(),
            cmdline: cmdline.into(),
            cgroup: cgroup.into(),
            pss_kib: 0,
            rss_kib: 0,
            fds: 0,
        }
    }

    #[test]
    fn only_the_runs_containers_are_charged() {
        let ids: BTreeSet<String> = ["aaaa".to_string()].into();
        let d = Engine::Docker;
        let shim = |id: &str| {
            proc(
                10,
                "containerd-shim",
                &format!("containerd-shim-runc-v2 -namespace moby -id {id}"),
                "",
            )
        };
        assert_eq!(role_of(&shim("aaaa"), d, &ids, 1), Some(Role::Helper));
        assert_eq!(role_of(&shim("bbbb"), d, &ids, 1), None);
        let inside = proc(11, "sandbox-agent", "", "4:memory:/docker/aaaa\n");
        assert_eq!(role_of(&inside, d, &ids, 1), Some(Role::Container));
        let other = proc(12, "sleep", "", "4:memory:/docker/bbbb\n");
        assert_eq!(role_of(&other, d, &ids, 1), None);
        assert_eq!(
            role_of(&proc(13, "dockerd", "", ""), d, &ids, 1),
            Some(Role::Daemon)
        );
        assert_eq!(
            role_of(&proc(1, "sandbox-bench", "", ""), d, &ids, 1),
            Some(Role::Us)
        );
        // conmon's cgroup names the container too; it is the helper, not a container
        // process.
        let conmon = proc(
            14,
            "conmon",
            "conmon --api-version 1 -c aaaa",
            "libpod-conmon-aaaa",
        );
        assert_eq!(
            role_of(&conmon, Engine::Podman, &ids, 1),
            Some(Role::Helper)
        );
    }
}
