//! Typed configuration: where the engine is ([`PodmanConfig`]) and the Podman-specific
//! per-sandbox options ([`PodmanOptions`]) that are **outside the portable contract**.
//!
//! Every option is checked by [`PodmanOptions::validate`] before anything is created;
//! every refusal is a [`SandboxError::Configuration`] with a hint.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use sandbox_container::ContainerConfig;
use sandbox_container::discovery::{EndpointSource, EnvSnapshot, discover_podman};
use sandbox_container::ssh::SshTarget;
use sandbox_core::{BoxError, IsolationTier, Result, SandboxError};

/// Default libpod endpoint (rootful service).
pub const DEFAULT_ENDPOINT: &str = "unix:///run/podman/podman.sock";
/// Environment variable naming the endpoint, as Podman's own remote client reads it.
pub const CONTAINER_HOST_ENV: &str = "CONTAINER_HOST";
/// Template used when `CreateOptions::template` is `None`.
pub const DEFAULT_TEMPLATE: &str = "sandbox-rs/python:3.11";
/// Directories where CDI device specs live (checked before a CDI device is requested).
pub const CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// Linux capabilities a sandbox may be granted on top of the empty set (after
/// `cap_drop ALL`): exactly the variants of [`LinuxCapability`]. `NET_ADMIN`, `NET_RAW` and
/// `SYS_ADMIN` are never grantable: either would let sandbox root rewrite or bypass the
/// network policy or escape mount isolation. `PERFMON` is not grantable either: it opens
/// `perf_event_open` and BPF tracing of the host kernel to sandbox root.
pub const GRANTABLE_CAPABILITIES: [LinuxCapability; 10] = [
    LinuxCapability::AuditWrite,
    LinuxCapability::Chown,
    LinuxCapability::DacOverride,
    LinuxCapability::Fowner,
    LinuxCapability::Fsetid,
    LinuxCapability::Kill,
    LinuxCapability::NetBindService,
    LinuxCapability::Setgid,
    LinuxCapability::Setuid,
    LinuxCapability::SysChroot,
];

/// A Linux capability a sandbox may be granted. Only vetted capabilities have a variant,
/// so a dangerous one cannot even be named; [`LinuxCapability::parse`] explains refusals of
/// names given as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LinuxCapability {
    /// `CAP_AUDIT_WRITE`: write to the kernel audit log (some `login`-like tools need it).
    AuditWrite,
    /// `CAP_CHOWN`: change file owners.
    Chown,
    /// `CAP_DAC_OVERRIDE`: bypass file permission checks (inside the sandbox's own files).
    DacOverride,
    /// `CAP_FOWNER`: act as the owner of any file.
    Fowner,
    /// `CAP_FSETID`: keep set-id bits when modifying files.
    Fsetid,
    /// `CAP_KILL`: signal processes of other users in the sandbox.
    Kill,
    /// `CAP_NET_BIND_SERVICE`: bind ports below 1024.
    NetBindService,
    /// `CAP_SETGID`: change group ids.
    Setgid,
    /// `CAP_SETUID`: change user ids.
    Setuid,
    /// `CAP_SYS_CHROOT`: `chroot(2)`.
    SysChroot,
}

impl LinuxCapability {
    /// The name Podman expects (`CHOWN`, without the `CAP_` prefix).
    pub fn as_str(self) -> &'static str {
        match self {
            LinuxCapability::AuditWrite => "AUDIT_WRITE",
            LinuxCapability::Chown => "CHOWN",
            LinuxCapability::DacOverride => "DAC_OVERRIDE",
            LinuxCapability::Fowner => "FOWNER",
            LinuxCapability::Fsetid => "FSETID",
            LinuxCapability::Kill => "KILL",
            LinuxCapability::NetBindService => "NET_BIND_SERVICE",
            LinuxCapability::Setgid => "SETGID",
            LinuxCapability::Setuid => "SETUID",
            LinuxCapability::SysChroot => "SYS_CHROOT",
        }
    }

    /// Parses `chown`, `CHOWN` or `CAP_CHOWN`. A never-grantable or unlisted capability is
    /// a `Configuration` error that says why.
    pub fn parse(name: &str) -> Result<LinuxCapability> {
        let up = name.trim().to_ascii_uppercase();
        let up = up.strip_prefix("CAP_").unwrap_or(&up);
        if let Some(c) = GRANTABLE_CAPABILITIES.iter().find(|c| c.as_str() == up) {
            return Ok(*c);
        }
        if NEVER_GRANTABLE.contains(&up) {
            return Err(SandboxError::config(
                format!("capability {up} is never grantable"),
                "NET_ADMIN/NET_RAW would let sandbox root rewrite or bypass the network policy and SYS_ADMIN defeats mount isolation; do that work on the host side",
            ));
        }
        Err(SandboxError::config(
            format!(
                "capability {:?} is not on the vetted allowlist",
                up.chars().take(64).collect::<String>()
            ),
            format!(
                "grant only one of: {}",
                GRANTABLE_CAPABILITIES
                    .map(LinuxCapability::as_str)
                    .join(", ")
            ),
        ))
    }
}

impl fmt::Display for LinuxCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for LinuxCapability {
    type Err = SandboxError;
    fn from_str(s: &str) -> Result<Self> {
        LinuxCapability::parse(s)
    }
}

/// Capabilities refused with a dedicated explanation.
pub const NEVER_GRANTABLE: [&str; 3] = ["NET_ADMIN", "NET_RAW", "SYS_ADMIN"];

/// OCI annotation keys a caller may set. Annotations are privileged configuration read by
/// runtimes and hooks; anything else is refused.
pub const ANNOTATION_ALLOWLIST: [&str; 2] = ["krun.cpus", "krun.ram_mib"];

/// Where the engine is and what every sandbox of a backend defaults to.
#[derive(Clone)]
pub struct PodmanConfig {
    pub(crate) endpoint: String,
    pub(crate) endpoint_source: EndpointSource,
    pub(crate) allow_plain_tcp: bool,
    pub(crate) ssh_config: Option<std::path::PathBuf>,
    pub(crate) options: PodmanOptions,
    /// The engine-independent settings (template, sweep, bounds, caps, agent), set with
    /// this type's builder methods of the same names.
    pub(crate) layer: ContainerConfig,
}

/// How long one engine call may take before it fails with a timeout (a wedged engine must
/// not hang the caller). Streamed bodies are bounded per chunk, not in total.
pub use sandbox_container::DEFAULT_CALL_TIMEOUT;

sandbox_container::layer_settings!(PodmanConfig, layer);

impl Default for PodmanConfig {
    /// `unix:///run/podman/podman.sock`, template `sandbox-rs/python:3.11`, default
    /// [`PodmanOptions`], startup sweep on. Ignores `CONTAINER_HOST` (see
    /// [`PodmanConfig::from_env`]).
    fn default() -> Self {
        PodmanConfig {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            endpoint_source: EndpointSource::Default,
            allow_plain_tcp: false,
            ssh_config: None,
            options: PodmanOptions::default(),
            layer: ContainerConfig::new(DEFAULT_TEMPLATE),
        }
    }
}

impl fmt::Debug for PodmanConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodmanConfig")
            .field("endpoint", &self.endpoint)
            .field("endpoint_source", &self.endpoint_source)
            .field("allow_plain_tcp", &self.allow_plain_tcp)
            .field("ssh_config", &self.ssh_config)
            .field("options", &self.options)
            .field("layer", &self.layer)
            .finish()
    }
}

impl PodmanConfig {
    /// Like [`Default`], but the endpoint is discovered from the environment now (see
    /// [`PodmanConfig::from_env_snapshot`]).
    pub fn from_env() -> Self {
        PodmanConfig::from_env_snapshot(&EnvSnapshot::capture())
    }

    /// Like [`Default`], but the endpoint is discovered from `env` in Podman's order:
    /// `CONTAINER_HOST`; `$XDG_RUNTIME_DIR/podman/podman.sock` if it exists and the process
    /// is not root; [`DEFAULT_ENDPOINT`]. `SBX_AGENT=off` forces the engine's exec path
    /// ([`PodmanConfig::agent`]).
    pub fn from_env_snapshot(env: &EnvSnapshot) -> Self {
        let found = discover_podman(env);
        PodmanConfig {
            endpoint: found.endpoint,
            endpoint_source: found.source,
            ..PodmanConfig::default()
        }
        .agent(sandbox_container::agent_enabled_in(env))
    }

    /// Sets the endpoint (`unix:///path` or `tcp://host:port`).
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = endpoint.into();
        self.endpoint_source = EndpointSource::Configured;
        self
    }

    /// Accepts `tcp://` (always plain HTTP for Podman) — default `false`: exec bodies carry
    /// the caller's environment, secrets included, in the clear. Only for loopback or an
    /// otherwise trusted network.
    pub fn allow_plain_tcp(mut self, on: bool) -> Self {
        self.allow_plain_tcp = on;
        self
    }

    /// Why [`PodmanConfig::endpoint_str`] is what it is.
    pub fn endpoint_source(&self) -> &EndpointSource {
        &self.endpoint_source
    }

    /// Refuses, before any connection, endpoints that would send secrets in the clear
    /// (`tcp://` unless [`PodmanConfig::allow_plain_tcp`]); an `ssh://` endpoint must be
    /// well-formed (its tunnel is opened by `PodmanEngine::connect`).
    pub(crate) fn check_endpoint(&self) -> Result<()> {
        if self.ssh_target()?.is_some() {
            return Ok(());
        }
        let lower = self.endpoint.trim().to_ascii_lowercase();
        if (lower.starts_with("tcp://") || lower.starts_with("http://")) && !self.allow_plain_tcp {
            return Err(SandboxError::config(
                "tcp:// Podman endpoints are plain HTTP: exec bodies (secrets included) would cross the network in the clear",
                "reach the engine over SSH instead (CONTAINER_HOST=ssh://user@host/run/podman/podman.sock), or PodmanConfig::allow_plain_tcp(true) for a trusted loopback",
            ));
        }
        Ok(())
    }

    /// Where an `ssh://` endpoint points (`None` for other schemes); a malformed one is
    /// a `Configuration` error. Without a path, the rootful socket is forwarded.
    pub(crate) fn ssh_target(&self) -> Result<Option<SshTarget>> {
        if !self
            .endpoint
            .trim()
            .to_ascii_lowercase()
            .starts_with("ssh://")
        {
            return Ok(None);
        }
        let mut target = SshTarget::parse(&self.endpoint, "/run/podman/podman.sock")?;
        target.config_file = self.ssh_config.clone();
        Ok(Some(target))
    }

    /// Uses `path` as the ssh config of an `ssh://` endpoint's tunnel (`ssh -F`), instead
    /// of the user's `~/.ssh/config` (or `SBX_SSH_CONFIG`).
    pub fn ssh_config(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.ssh_config = Some(path.into());
        self
    }

    /// Sets the Podman options every sandbox of this backend gets (unless
    /// `PodmanBackend::create_with` gives others).
    pub fn options(mut self, options: PodmanOptions) -> Self {
        self.options = options;
        self
    }

    /// The endpoint in effect.
    pub fn endpoint_str(&self) -> &str {
        &self.endpoint
    }
}

/// OCI runtime, chosen from a vetted set by name (never a path): the shared enum of
/// `sandbox-container`, so Docker and Podman parse and label runtimes alike.
pub use sandbox_container::Runtime as PodmanRuntime;

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
/// one is refused (so is any unix socket).
pub const ENGINE_PATHS: [&str; 10] = [
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
        let refused = || {
            SandboxError::config(
                format!(
                    "mount target {:?} is not allowed",
                    c.chars().take(256).collect::<String>()
                ),
                "use an absolute sandbox path without `..`, `.`, commas or control characters, outside /, /proc, /sys and /dev",
            )
        };
        if !c.starts_with('/') || c.chars().any(|ch| ch.is_control()) || c.contains(',') {
            return Err(refused());
        }
        let parts: Vec<&str> = c.split('/').filter(|s| !s.is_empty()).collect();
        if parts.iter().any(|s| *s == "." || *s == "..") {
            return Err(refused());
        }
        let target = format!("/{}", parts.join("/"));
        let covered = |r: &str| {
            target == r || (r != "/" && target.starts_with(r) && target[r.len()..].starts_with('/'))
        };
        if RESERVED_TARGETS.iter().any(|r| covered(r)) {
            return Err(refused());
        }
        Ok(target)
    }

    fn validate(&self) -> Result<()> {
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

/// What a lifecycle hook is told.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HookEvent {
    /// Engine id of the container.
    pub container_id: String,
    /// Template (image) of the sandbox.
    pub template: String,
}

/// An async lifecycle callback. An error aborts the creation (the container is removed).
pub type HookFn =
    Arc<dyn Fn(HookEvent) -> BoxFuture<'static, std::result::Result<(), BoxError>> + Send + Sync>;

/// Lifecycle hooks: `pre_start` runs after the container was created (and copy mounts
/// injected) but before it starts; `post_start` after it started and `/work` exists.
#[derive(Clone, Default)]
pub struct Hooks {
    pub(crate) pre_start: Option<HookFn>,
    pub(crate) post_start: Option<HookFn>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("pre_start", &self.pre_start.is_some())
            .field("post_start", &self.post_start.is_some())
            .finish()
    }
}

impl Hooks {
    /// No hooks.
    pub fn new() -> Self {
        Hooks::default()
    }

    /// Sets the `pre_start` hook.
    pub fn pre_start<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(HookEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        self.pre_start = Some(Arc::new(move |e| Box::pin(f(e))));
        self
    }

    /// Sets the `post_start` hook.
    pub fn post_start<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(HookEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        self.post_start = Some(Arc::new(move |e| Box::pin(f(e))));
        self
    }
}

/// Podman-specific options of one sandbox. **Outside the portable contract**: other
/// backends have no equivalent, and these may change in minor releases.
#[derive(Clone)]
#[non_exhaustive]
pub struct PodmanOptions {
    /// Host trees made visible in the sandbox.
    pub mounts: Vec<Mount>,
    /// OCI runtime (`None`: the engine's default, reported as `Container`).
    pub runtime: Option<PodmanRuntime>,
    /// Extra capabilities (only vetted ones can be named).
    pub capabilities: Vec<LinuxCapability>,
    /// OCI annotations, keys from [`ANNOTATION_ALLOWLIST`].
    pub annotations: BTreeMap<String, String>,
    /// Lifecycle hooks.
    pub hooks: Hooks,
    /// `true` (default): the container is removed as soon as its lifetime ends.
    /// `false` (retained): it is kept, stopped, for inspection until `sandbox reap`.
    /// An explicit `kill()` always removes.
    pub ephemeral: bool,
    /// CDI device names (e.g. `nvidia.com/gpu=0`); refused when the host has no CDI spec.
    pub cdi_devices: Vec<String>,
}

impl Default for PodmanOptions {
    fn default() -> Self {
        PodmanOptions {
            mounts: vec![],
            runtime: None,
            capabilities: vec![],
            annotations: BTreeMap::new(),
            hooks: Hooks::default(),
            ephemeral: true,
            cdi_devices: vec![],
        }
    }
}

impl fmt::Debug for PodmanOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodmanOptions")
            .field("mounts", &self.mounts)
            .field("runtime", &self.runtime)
            .field("capabilities", &self.capabilities)
            .field(
                "annotation_keys",
                &self.annotations.keys().collect::<Vec<_>>(),
            )
            .field("hooks", &self.hooks)
            .field("ephemeral", &self.ephemeral)
            .field("cdi_devices", &self.cdi_devices)
            .finish()
    }
}

impl PodmanOptions {
    /// Defaults: no mounts, engine runtime, no extra capabilities, ephemeral.
    pub fn new() -> Self {
        PodmanOptions::default()
    }
    /// Adds a mount.
    pub fn mount(mut self, m: Mount) -> Self {
        self.mounts.push(m);
        self
    }
    /// Selects the OCI runtime.
    pub fn runtime(mut self, r: PodmanRuntime) -> Self {
        self.runtime = Some(r);
        self
    }
    /// Grants one extra capability (text names: [`LinuxCapability::parse`]).
    pub fn capability(mut self, c: LinuxCapability) -> Self {
        self.capabilities.push(c);
        self
    }
    /// Adds an OCI annotation (key checked against [`ANNOTATION_ALLOWLIST`]).
    pub fn annotation(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }
    /// Sets the lifecycle hooks.
    pub fn hooks(mut self, h: Hooks) -> Self {
        self.hooks = h;
        self
    }
    /// Ephemeral (`true`, default) or retained (`false`) after the lifetime ends.
    pub fn ephemeral(mut self, on: bool) -> Self {
        self.ephemeral = on;
        self
    }
    /// Requests a GPU by CDI device name.
    pub fn cdi_device(mut self, name: impl Into<String>) -> Self {
        self.cdi_devices.push(name.into());
        self
    }

    /// The isolation tier these options give. `krun` is reported as `Container` until the
    /// adapter verifies the guest kernel itself: a tier is a promise.
    pub fn tier(&self) -> IsolationTier {
        match self.runtime {
            Some(PodmanRuntime::Krun) | None => IsolationTier::Container,
            Some(r) => r.tier(),
        }
    }

    /// Checks every option against the allowlists and the host (mount paths, CDI specs in
    /// [`CDI_SPEC_DIRS`]). Called before anything is created.
    pub fn validate(&self) -> Result<()> {
        let dirs: Vec<&Path> = CDI_SPEC_DIRS.iter().map(Path::new).collect();
        self.validate_with_cdi_dirs(&dirs)
    }

    /// [`PodmanOptions::validate`] with explicit CDI spec directories (for tests).
    pub fn validate_with_cdi_dirs(&self, cdi_dirs: &[&Path]) -> Result<()> {
        for m in &self.mounts {
            m.validate()?;
        }
        let mut targets: Vec<String> = self
            .mounts
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
        for (k, v) in &self.annotations {
            validate_annotation(k, v)?;
        }
        for d in &self.cdi_devices {
            validate_cdi_name(d)?;
        }
        if !self.cdi_devices.is_empty() && !host_has_cdi_specs(cdi_dirs) {
            return Err(SandboxError::config(
                "a CDI GPU device was requested but this host has no CDI specs in /etc/cdi or /var/run/cdi",
                "generate one, e.g. `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`, or drop cdi_device",
            ));
        }
        Ok(())
    }
}

fn validate_annotation(k: &str, v: &str) -> Result<()> {
    if k.chars().any(|c| c.is_control()) || v.chars().any(|c| c.is_control()) {
        return Err(SandboxError::config(
            "annotation key or value contains control characters",
            "remove control characters (newlines, tabs, escapes) from annotations",
        ));
    }
    if !ANNOTATION_ALLOWLIST.contains(&k) {
        return Err(SandboxError::config(
            format!(
                "annotation key {:?} is not on the allowlist",
                k.chars().take(64).collect::<String>()
            ),
            format!("use only: {}", ANNOTATION_ALLOWLIST.join(", ")),
        ));
    }
    if v.len() > 1024 {
        return Err(SandboxError::config(
            format!("annotation `{k}` value is over 1024 bytes"),
            "shorten the value",
        ));
    }
    Ok(())
}

fn validate_cdi_name(d: &str) -> Result<()> {
    // vendor/class=name, e.g. nvidia.com/gpu=0 or nvidia.com/gpu=all
    let ok = d.len() <= 253
        && d.split_once('=').is_some_and(|(kind, name)| {
            kind.split_once('/').is_some_and(|(vendor, class)| {
                !vendor.is_empty()
                    && !class.is_empty()
                    && vendor
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c))
                    && class
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
            }) && !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
        });
    if !ok {
        return Err(SandboxError::config(
            format!(
                "{:?} is not a CDI device name",
                d.chars().take(64).collect::<String>()
            ),
            "use vendor/class=name, e.g. nvidia.com/gpu=0",
        ));
    }
    Ok(())
}

/// Whether any of `dirs` holds a CDI spec file (`*.json`, `*.yaml`, `*.yml`).
pub(crate) fn host_has_cdi_specs(dirs: &[&Path]) -> bool {
    dirs.iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|rd| {
            rd.flatten().any(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.ends_with(".json") || n.ends_with(".yaml") || n.ends_with(".yml")
            })
        })
    })
}
