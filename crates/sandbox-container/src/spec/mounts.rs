//! Host trees made visible in a sandbox, as vetted, typed mounts: a bind mount, or a
//! sealed copy injected before the container starts (`copy_in`). Every host path is
//! canonicalised and refused when it gives the host away (system paths, engine sockets
//! and state, any unix socket); every sandbox path is normalised and refused when it
//! covers a kernel interface. Written once for every engine that offers mounts (Podman's
//! `PodmanOptions::mount`).

use std::path::{Path, PathBuf};

use sandbox_core::{Result, SandboxError};

/// Who else may use a mounted directory (drives SELinux relabelling: `Z` vs `z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Sharing {
    /// Exclusive to this sandbox (`Z`).
    #[default]
    Private,
    /// Shared with other containers (`z`).
    Shared,
}

/// How a host tree reaches the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MountMode {
    /// A bind mount (changes are visible both ways).
    #[default]
    Bind,
    /// A sealed copy injected before the container starts: parents are created, the
    /// host tree's *contents* land at `container`, and no bind mount is left behind.
    Copy,
}

/// A host directory or file made visible in the sandbox.
///
/// The engine is rootful and has no user namespace, so sandbox root is host root on a bind
/// mount: bind mounts are read-only unless [`Mount::read_only`]`(false)` says otherwise,
/// always `nosuid,nodev` (a setuid binary or device node written through a writable mount
/// stays inert on the host), and never of a host path that gives the host away (see
/// [`REFUSED_HOST_PATHS`] and [`ENGINE_PATHS`]).
///
/// A bind mount is non-recursive and private: it shares the one filesystem its source
/// lies on. A host mount nested below the source (a tmpfs, another disk, a share), which
/// the bind's `ro,nosuid,nodev` would not cover, is not visible in the sandbox (the
/// directory it covers on the host is), nor is one the host makes there after start.
/// Bind each filesystem of a tree separately to share them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Absolute host path (must exist; canonicalised before use).
    pub host: PathBuf,
    /// Absolute path inside the sandbox.
    pub container: String,
    /// Private or shared.
    pub sharing: Sharing,
    /// Read-only (bind mounts only). Default `true` for bind mounts.
    pub read_only: bool,
    /// Bind or copy.
    pub mode: MountMode,
}

/// Host paths that are never mounted or copied into a sandbox, nor anything under them
/// (`/` itself only exactly): host configuration and credentials, kernel interfaces and
/// devices, the boot files and root's home.
pub const REFUSED_HOST_PATHS: [&str; 7] = ["/", "/etc", "/proc", "/sys", "/dev", "/boot", "/root"];

/// Container-engine sockets and state: a sandbox that reaches one of these controls the
/// engine, hence the host. A host path that is one of these, lies under one, or contains
/// one is refused (so is any unix socket). The library's own state on the host
/// (`/run/sandbox-rs`: the egress policies in force, the sandboxes' hosts file) with them.
pub const ENGINE_PATHS: [&str; 11] = [
    "/run/sandbox-rs",
    "/run/podman",
    "/run/docker.sock",
    "/run/docker",
    "/run/containerd",
    "/run/crio",
    "/run/containers",
    "/run/user",
    "/var/lib/containers",
    "/var/lib/docker",
    "/var/lib/containerd",
];

/// Sandbox paths a mount may not cover (nor anything under them).
const RESERVED_TARGETS: [&str; 5] = ["/", "/proc", "/sys", "/dev", "/run/podman-init"];

impl Mount {
    /// A private, **read-only** bind mount (`read_only(false)` makes it writable).
    pub fn bind(host: impl Into<PathBuf>, container: impl Into<String>) -> Self {
        Mount {
            host: host.into(),
            container: container.into(),
            sharing: Sharing::Private,
            read_only: true,
            mode: MountMode::Bind,
        }
    }

    /// A sealed copy injected before start (writable by the sandbox, which owns the copy).
    pub fn copy(host: impl Into<PathBuf>, container: impl Into<String>) -> Self {
        Mount {
            mode: MountMode::Copy,
            read_only: false,
            ..Mount::bind(host, container)
        }
    }

    /// Sets read-only.
    pub fn read_only(mut self, ro: bool) -> Self {
        self.read_only = ro;
        self
    }

    /// Sets the sharing mode.
    pub fn sharing(mut self, sharing: Sharing) -> Self {
        self.sharing = sharing;
        self
    }

    /// The canonical host path (symlinks resolved), refused when it gives the host away.
    /// The create body uses this path, never the one given.
    pub fn resolved_host(&self) -> Result<PathBuf> {
        let given = self.host.to_string_lossy();
        if !self.host.is_absolute() || given.chars().any(|c| c.is_control()) {
            return Err(SandboxError::config(
                format!("mount host path {given:?} must be absolute, without control characters"),
                "give an absolute host path, e.g. Mount::bind(\"/srv/data\", \"/data\")",
            ));
        }
        let host = std::fs::canonicalize(&self.host).map_err(|_| {
            SandboxError::config(
                format!("mount host path {given:?} does not exist"),
                format!("create it first: mkdir -p {given}"),
            )
        })?;
        refuse_host_path(&host)?;
        Ok(host)
    }

    /// The sandbox path with repeated and trailing slashes removed (`//proc/` → `/proc`),
    /// refused when relative, reserved or containing `.`, `..`, commas or control
    /// characters.
    pub fn normalized_target(&self) -> Result<String> {
        let c = &self.container;
        normalize_target(c).ok_or_else(|| {
            SandboxError::config(
                format!(
                    "mount target {:?} is not allowed",
                    c.chars().take(256).collect::<String>()
                ),
                "use an absolute sandbox path without `..`, `.`, commas or control characters, outside /, /proc, /sys and /dev",
            )
        })
    }

    /// Checks host path, target and mode together (a copy mount cannot be read-only).
    pub fn validate(&self) -> Result<()> {
        self.resolved_host()?;
        let target = self.normalized_target()?;
        if self.mode == MountMode::Copy && self.read_only {
            return Err(SandboxError::config(
                format!(
                    "copy mount to {target:?} cannot be read-only (sandbox root owns copied files)"
                ),
                "use MountMode::Bind with read_only(true) for a read-only view",
            ));
        }
        Ok(())
    }
}

/// Refuses a canonical host path that is (or is under) a [`REFUSED_HOST_PATHS`] entry, is,
/// is under or contains an [`ENGINE_PATHS`] entry, or is a unix socket.
fn refuse_host_path(host: &Path) -> Result<()> {
    let shown = host.to_string_lossy().chars().take(256).collect::<String>();
    let refused = |why: &str| {
        SandboxError::config(
            format!("mount host path {shown:?} is refused: {why}"),
            "mount a dedicated data directory (e.g. /srv/sandbox-data), never host system paths or container-engine sockets",
        )
    };
    let inside =
        |p: &Path, root: &Path| p == root || (root != Path::new("/") && p.starts_with(root));
    for r in REFUSED_HOST_PATHS {
        if inside(host, Path::new(r)) {
            return Err(refused("it exposes host system files"));
        }
    }
    for e in ENGINE_PATHS {
        // The engine path's own symlinks are resolved too (`/var/run` → `/run`).
        let engine = std::fs::canonicalize(e).unwrap_or_else(|_| PathBuf::from(e));
        if inside(host, &engine) || engine.starts_with(host) {
            return Err(refused("it exposes a container engine"));
        }
    }
    if is_socket(host) {
        return Err(refused("it is a unix socket"));
    }
    Ok(())
}

#[cfg(unix)]
fn is_socket(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(not(unix))]
fn is_socket(_: &Path) -> bool {
    false
}

/// A sandbox path with repeated and trailing slashes removed (`//data/` → `/data`, the
/// path the engines clean it to), or `None` when it is relative, covers `/`, `/proc`,
/// `/sys`, `/dev` or the engine's init, or contains `.`, `..`, commas or control
/// characters: a path nothing of the caller's or the image's may be mounted at.
pub fn normalize_target(path: &str) -> Option<String> {
    if !path.starts_with('/') || path.chars().any(|ch| ch.is_control()) || path.contains(',') {
        return None;
    }
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if parts.iter().any(|s| *s == "." || *s == "..") {
        return None;
    }
    let target = format!("/{}", parts.join("/"));
    let covered = |r: &str| {
        target == r || (r != "/" && target.starts_with(r) && target[r.len()..].starts_with('/'))
    };
    if RESERVED_TARGETS.iter().any(|r| covered(r)) {
        return None;
    }
    Some(target)
}

/// Checks every mount and that no two share a sandbox target.
pub fn validate_all(mounts: &[Mount]) -> Result<()> {
    for m in mounts {
        m.validate()?;
    }
    let mut targets: Vec<String> = mounts
        .iter()
        .map(Mount::normalized_target)
        .collect::<Result<_>>()?;
    targets.sort_unstable();
    if targets.windows(2).any(|w| w[0] == w[1]) {
        return Err(SandboxError::config(
            "two mounts share one sandbox target",
            "give each mount its own container path",
        ));
    }
    Ok(())
}

/// What `mounts` cannot keep for `spec`, refused before anything is provisioned: with a
/// disk limit, a writable bind mount (host disk the limit cannot bound) or a sealed
/// copy-in under one of the spec's scratch paths (the scratch filesystem would hide it).
pub fn check_against_spec(mounts: &[Mount], spec: &crate::ContainerSpec) -> Result<()> {
    if spec.resources.disk_mb.is_none() {
        return Ok(());
    }
    if let Some(m) = mounts
        .iter()
        .find(|m| m.mode == MountMode::Bind && !m.read_only)
    {
        return Err(SandboxError::config(
            format!(
                "the writable bind mount at {} writes to the host's disk, which \
                 resources.disk_mb cannot bound",
                m.container
            ),
            "make the bind mount read-only (Mount::read_only(true)) or leave disk_mb unset",
        ));
    }
    for m in mounts.iter().filter(|m| m.mode == MountMode::Copy) {
        let target = m.normalized_target()?;
        if let Some(scratch) = spec.scratch_paths().into_iter().find(|p| under(&target, p)) {
            return Err(SandboxError::config(
                format!(
                    "the copied mount {target} lies under {scratch}, which resources.disk_mb \
                     turns into an empty scratch filesystem"
                ),
                "copy it elsewhere (e.g. /data), use MountMode::Bind, or leave disk_mb unset",
            ));
        }
    }
    Ok(())
}

/// Whether `path` is `dir` or lies below it (both normalised, absolute).
fn under(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path == dir || dir.is_empty() || path.starts_with(&format!("{dir}/"))
}
