//! The host's view of a sandbox's pids limit, for the engine's exec path: when the engine
//! could not start a command, the container's pids cgroup (read on the host, where code in
//! the sandbox cannot forge it) says whether the limit being exhausted is why, so the
//! caller gets `ResourceLimitExceeded` instead of the engine's exit code.
//!
//! The agent path needs none of this: the agent sees the refused fork itself.

use std::io::Read as _;

use crate::engine::ContainerEngine;
use crate::sandbox::shared::Shared;

/// Most bytes read of one `/proc` or cgroup file (a cgroup listing is a few lines).
const MAX_FILE: u64 = 64 * 1024;

/// `Some("32 of 32 in use")` when the container's pids cgroup is at its limit; `None` when
/// it is not, has no limit, or cannot be seen from here (a remote engine, a runtime
/// without the cgroup, an error): the caller then reports what the engine said.
pub(crate) async fn exhausted_on_host<E: ContainerEngine>(sh: &Shared<E>) -> Option<String> {
    if !sh.engine.is_local() {
        return None;
    }
    let pid = sh
        .engine
        .inspect(&sh.id)
        .await
        .ok()?
        .pid
        .filter(|p| *p > 0)?;
    let cgroup = read(&format!("/proc/{pid}/cgroup"))?;
    let dir = pids_dir(&cgroup)?;
    let max = read(&format!("{dir}/pids.max"))?;
    let current = read(&format!("{dir}/pids.current"))?;
    let (max, current) = (max.trim(), current.trim());
    let at_limit = matches!(
        (current.parse::<u64>(), max.parse::<u64>()),
        (Ok(c), Ok(m)) if c >= m
    );
    at_limit.then(|| format!("{current} of {max} in use"))
}

/// The directory of the pids controller's cgroup in a `/proc/<pid>/cgroup` listing: the
/// v1 `pids` hierarchy, else the v2 unified one.
fn pids_dir(listing: &str) -> Option<String> {
    let entry = |want: &dyn Fn(&str, &str) -> bool| {
        listing.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            want(id, controllers).then(|| path.to_string())
        })
    };
    if let Some(path) = entry(&|_, c| c.split(',').any(|c| c == "pids")) {
        return Some(format!("/sys/fs/cgroup/pids{path}"));
    }
    entry(&|id, c| id == "0" && c.is_empty()).map(|path| format!("/sys/fs/cgroup{path}"))
}

fn read(path: &str) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE).read_to_string(&mut text))
        .ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_pids_hierarchy_wins_and_v2_is_the_fallback() {
        let v1 = "12:pids:/libpod_parent/libpod-abc\n11:memory:/libpod_parent/libpod-abc\n0::/\n";
        assert_eq!(
            pids_dir(v1).as_deref(),
            Some("/sys/fs/cgroup/pids/libpod_parent/libpod-abc")
        );
        let v2 = "0::/system.slice/docker-abc.scope\n";
        assert_eq!(
            pids_dir(v2).as_deref(),
            Some("/sys/fs/cgroup/system.slice/docker-abc.scope")
        );
        assert_eq!(pids_dir("3:cpu:/x\n"), None);
    }
}
