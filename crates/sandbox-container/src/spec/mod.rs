//! What a container is made of, as typed, vetted values: the OCI runtime, extra Linux
//! capabilities, CDI devices, mounts and lifecycle hooks. Adapters take these in their
//! options and the engine trait carries them in its create spec; nothing here talks to an
//! engine.

use std::collections::BTreeMap;
use std::time::Duration;

use sandbox_core::EffectiveResources;

pub mod cdi;
pub mod hooks;
pub mod linux_capability;
pub mod mounts;
mod network;
pub mod runtime;

pub use network::{NetworkInfo, NetworkMode, NetworkSpec, Subnet};

/// Everything the container layer asks the engine to create. The adapter translates it into
/// its create body and MUST apply every field, or refuse the create with
/// [`EngineErrorKind::InvalidRequest`]: a field silently dropped is a security bug.
///
/// Always applied, whatever the fields say (the security defaults no caller can opt out
/// of): all capabilities dropped, `no-new-privileges`, swap disabled (memory+swap ==
/// memory), no privileged mode, no auto-published ports, and no log driver (whatever PID 1
/// writes, root inside can write through `/proc/1/fd/1`; an engine log would keep it on
/// the engine's disk, past every limit).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ContainerSpec {
    /// Container name (the guard removes by name while a create is in flight).
    pub name: String,
    /// Image reference.
    pub image: String,
    /// The main process (entrypoint + args): the lifetime backstop; it ends at the
    /// deadline, which ends the container.
    pub command: Vec<String>,
    /// Whether the engine's init should be PID 1 (reaps zombies).
    pub init: bool,
    /// Non-secret environment (secrets are injected per exec, never stored here).
    pub env: Vec<(String, String)>,
    /// Working directory, created at start.
    pub workdir: String,
    /// Labels, including the `io.sandbox-rs.*` ones.
    pub labels: BTreeMap<String, String>,
    /// Resource limits to apply (cpu, memory, pids, disk).
    pub resources: EffectiveResources,
    /// Networking.
    pub network: NetworkMode,
    /// The sandbox lifetime (the deadline is `now + lifetime`).
    pub lifetime: Duration,
    /// The main process is the in-sandbox agent, whose channel is its stdin and stdout
    /// ([`ContainerEngine::attach`]): keep its stdin open across attaches (`OpenStdin` on,
    /// `StdinOnce` off, no TTY). Its output is the channel, not a log (no container is
    /// logged).
    pub attach_stdin: bool,
    /// A host file holding the agent binary, to bind-mount read-only at the agent's path
    /// (`/.sandbox-agent`) instead of uploading it before start. Set only when
    /// [`ContainerEngine::supports_agent_mount`] says the engine applies it.
    pub agent_mount: Option<std::path::PathBuf>,
    /// The volumes the image declares (`VOLUME`), normalised, as the container layer read
    /// them ([`ContainerEngine::image_volumes`]) — only under a disk limit, where each is
    /// one of the [`scratch_paths`](Self::scratch_paths): a sized RAM-backed filesystem
    /// at that path takes the place of the engine's anonymous volume on its own disk.
    /// Empty otherwise (the engine then keeps its default for them).
    pub image_volumes: Vec<String>,
    /// The container's hostname (`CreateOptions::hostname`, validated); `None`: the
    /// engine's default. An engine must apply it or refuse the spec (`check_spec`).
    pub hostname: Option<String>,
}

impl ContainerSpec {
    /// A spec for `image` running `command` with `resources` for `lifetime`: init as PID 1,
    /// workdir `/work`, no env, no labels, no network. The other fields are public, so an
    /// adapter's tests (and a third-party engine's) can build any spec without the layer.
    pub fn new(
        name: impl Into<String>,
        image: impl Into<String>,
        command: Vec<String>,
        resources: EffectiveResources,
        lifetime: Duration,
    ) -> Self {
        ContainerSpec {
            name: name.into(),
            image: image.into(),
            command,
            init: true,
            env: Vec::new(),
            workdir: sandbox_core::options::DEFAULT_WORKDIR.to_string(),
            labels: BTreeMap::new(),
            resources,
            network: NetworkMode::None,
            lifetime,
            attach_stdin: false,
            agent_mount: None,
            image_volumes: Vec::new(),
            hostname: None,
        }
    }

    /// With `resources.disk_mb` set: the only writable places, each a RAM-backed
    /// filesystem of [`scratch_bytes`](Self::scratch_bytes) mounted over a **read-only**
    /// root filesystem — the workdir, `/tmp` and each of the
    /// [`image_volumes`](Self::image_volumes), each path once. An adapter whose engine
    /// cannot apply all of it does not declare `DISK_LIMIT`. Empty without a disk limit.
    ///
    /// RAM-backed on purpose: writes never reach the engine's disk, and the pages are
    /// charged to the container's memory limit, so several of them cannot add up beyond it.
    pub fn scratch_paths(&self) -> Vec<&str> {
        if self.resources.disk_mb.is_none() {
            return Vec::new();
        }
        let mut paths: Vec<&str> = Vec::new();
        let same = |a: &str, b: &str| a.trim_end_matches('/') == b.trim_end_matches('/');
        let candidates = [self.workdir.as_str(), SCRATCH_TMP]
            .into_iter()
            .chain(self.image_volumes.iter().map(String::as_str));
        for path in candidates {
            if !paths.iter().any(|p| same(p, path)) {
                paths.push(path);
            }
        }
        paths
    }

    /// The size of each of [`scratch_paths`](Self::scratch_paths) in bytes (also the cap
    /// on `/dev/shm`); `None` without a disk limit.
    pub fn scratch_bytes(&self) -> Option<u64> {
        self.resources
            .disk_mb
            .map(|mb| mb.saturating_mul(1024 * 1024))
    }

    /// The memory limit in bytes, saturating (never wrapping to a negative = unlimited).
    pub fn memory_bytes(&self) -> i64 {
        i64::try_from(self.resources.memory_mb)
            .unwrap_or(i64::MAX)
            .saturating_mul(1024 * 1024)
    }

    /// The engine pids limit for this spec under `runtime` (`None`: the engine's default
    /// runtime, no headroom), clamped (see [`crate::spec::runtime::pids_limit`]).
    pub fn pids_limit(&self, runtime: Option<crate::Runtime>) -> i64 {
        match runtime {
            Some(r) => r.pids_limit(self.resources.pids),
            None => crate::spec::runtime::pids_limit(self.resources.pids),
        }
    }
}

/// The writable temporary directory every sandbox with a disk limit keeps.
const SCRATCH_TMP: &str = "/tmp";

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::Resources;

    fn spec(r: Resources) -> ContainerSpec {
        ContainerSpec::new(
            "sbx-t-0",
            "img",
            vec!["sleep".into()],
            r.effective().unwrap(),
            Duration::from_secs(1),
        )
    }

    #[test]
    fn image_volumes_are_scratch_paths_under_a_disk_limit_only() {
        let mut s = spec(Resources::default());
        s.image_volumes = vec!["/data".into()];
        assert!(s.scratch_paths().is_empty(), "no disk limit, no scratch");
        let mut s = spec(Resources::default().disk_mb(10));
        s.image_volumes = vec![
            "/data".into(),
            "/tmp".into(),
            "/work".into(),
            "/data".into(),
        ];
        assert_eq!(
            s.scratch_paths(),
            ["/work", "/tmp", "/data"],
            "each path once"
        );
        s.workdir = "/tmp/".into();
        assert_eq!(s.scratch_paths(), ["/tmp/", "/data", "/work"]);
    }
}
