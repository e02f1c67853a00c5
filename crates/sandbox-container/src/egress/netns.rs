//! Proving that the network namespace the rules go into is the container's.
//!
//! The engine reports the container's first process as a host pid. That pid means the
//! container's process only when this process shares the engine's pid namespace: a library
//! running inside a container with the host's engine socket, or a client of Docker
//! Desktop's VM, sees some other process under that number (possibly one in the host's
//! own network namespace). Rules loaded there, and read back from there, would pass every
//! check while the sandbox ran with no rules at all.
//!
//! So before anything is loaded, the namespace is opened and held (the file keeps naming
//! that one namespace, whatever happens to the pid afterwards), and the process the pid
//! names must sit in a cgroup whose path carries the container's full id (every engine
//! names the container's cgroup after it: `/docker/<id>`, `docker-<id>.scope`,
//! `libpod-<id>`, …). The pid's namespace is then checked to still be the one held, and
//! `nft` enters the held file itself (through this process's `/proc/<pid>/fd/<n>`), never
//! the pid again.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// Shortest container id the cgroup check accepts: a shorter one could be a fragment of
/// another container's id or of an unrelated path.
const MIN_ID_LEN: usize = 32;

/// Most of `/proc/<pid>/cgroup` read (a few hundred bytes in practice; the process may be
/// the container's, whose cgroup names it controls nothing of, but the bound costs nothing).
const MAX_CGROUP_FILE: u64 = 64 * 1024;

/// A container's network namespace, held open.
#[derive(Debug)]
pub(crate) struct NetNs {
    file: File,
    inode: u64,
}

impl NetNs {
    /// The path `nsenter --net=` enters: this process's descriptor of the held namespace.
    pub(crate) fn path(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.file.as_raw_fd()
        ))
    }

    /// The namespace's inode (what `/proc/<pid>/ns/net` of its processes resolves to).
    pub(crate) fn inode(&self) -> u64 {
        self.inode
    }
}

/// The path of the network namespace of host pid `pid`.
pub(crate) fn of_pid(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/net"))
}

/// The network namespace of `pid`, held open, once `pid` is proven to be a process of the
/// container `container_id`; otherwise why not.
pub(crate) fn of_container(pid: u32, container_id: &str) -> Result<NetNs, String> {
    let ns_path = of_pid(pid);
    let file = File::open(&ns_path).map_err(|e| {
        format!(
            "cannot open the network namespace of pid {pid} ({}): {e}",
            ns_path.display()
        )
    })?;
    let inode = file
        .metadata()
        .map_err(|e| format!("cannot read the network namespace of pid {pid}: {e}"))?
        .ino();
    let cgroup = read_cgroup(pid)?;
    if !names_container(&cgroup, container_id) {
        return Err(format!(
            "pid {pid}, which the engine reports for container {}, is not in that \
             container's cgroup here: this process does not see the engine's pids (is it \
             running in a container, or against an engine in a VM?), so the rules would \
             land in another namespace",
            short(container_id)
        ));
    }
    let now = std::fs::metadata(&ns_path)
        .map_err(|e| format!("pid {pid} went away while its namespace was checked: {e}"))?
        .ino();
    if now != inode {
        return Err(format!(
            "pid {pid} changed network namespace while it was checked"
        ));
    }
    Ok(NetNs { file, inode })
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

fn read_cgroup(pid: u32) -> Result<String, String> {
    let path = format!("/proc/{pid}/cgroup");
    let mut text = String::new();
    File::open(&path)
        .and_then(|f| f.take(MAX_CGROUP_FILE).read_to_string(&mut text))
        .map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(text)
}

/// Whether a `/proc/<pid>/cgroup` listing puts the process in a cgroup named after
/// `container_id`: some path component holds the whole id, not next to another letter or
/// digit (so a longer id that merely starts with it does not count).
fn names_container(cgroup: &str, container_id: &str) -> bool {
    if container_id.len() < MIN_ID_LEN || !container_id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return false;
    }
    cgroup
        .lines()
        // `hierarchy-id:controllers:path`; the path may itself hold colons.
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .flat_map(|path| path.split('/'))
        .any(|component| holds_whole(component, container_id))
}

fn holds_whole(component: &str, id: &str) -> bool {
    component.match_indices(id).any(|(at, _)| {
        let before = component[..at].chars().next_back();
        let after = component[at + id.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric())
            && !after.is_some_and(|c| c.is_ascii_alphanumeric())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c2a9be0d84b7c9e2d6a1f0b3c5d7e9f1a2b3c4d5e6f708192a3b4c5d6e7f8";

    #[test]
    fn engine_cgroup_names_are_recognised() {
        for listing in [
            format!("12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n"),
            format!("0::/system.slice/docker-{ID}.scope\n"),
            format!("3:cpu:/libpod_parent/libpod-{ID}\n"),
            format!("0::/machine.slice/libpod-{ID}.scope/container\n"),
            format!("1:name=systemd:/../../docker/{ID}\n"),
        ] {
            assert!(names_container(&listing, ID), "{listing}");
        }
    }

    #[test]
    fn other_cgroups_are_not_the_container() {
        let longer = format!("{ID}aa");
        let prefix = &ID[..20];
        for listing in [
            "0::/user.slice/user-0.slice/session-1.scope\n".to_string(),
            "12:pids:/\n".to_string(),
            format!("12:pids:/docker/{longer}\n"),
            format!("12:pids:/docker/x{ID}\n"),
            // The id in the controller list, not the path.
            format!("12:{ID}:/\n"),
            String::new(),
        ] {
            assert!(!names_container(&listing, ID), "{listing}");
        }
        // Too short to identify anything.
        assert!(!names_container(
            &format!("12:pids:/docker/{prefix}\n"),
            prefix
        ));
        assert!(!names_container("12:pids:/docker/\n", ""));
        // A path-like id is not an id.
        assert!(!names_container(
            "12:pids:/docker/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/b\n",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/b"
        ));
    }

    #[test]
    fn this_process_is_not_a_container() {
        // The test runs on the host (or in CI's own container): either way its cgroup is
        // not named after this made-up id.
        let e = of_container(std::process::id(), ID).unwrap_err();
        assert!(e.contains("is not in that container's cgroup"), "{e}");
    }

    #[test]
    fn a_pid_that_does_not_exist_is_refused() {
        let e = of_container(u32::MAX, ID).unwrap_err();
        assert!(e.contains("cannot open the network namespace"), "{e}");
    }
}
