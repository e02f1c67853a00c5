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
/// `cap_drop ALL`). `NET_ADMIN`, `NET_RAW` and `SYS_ADMIN` are never grantable: either
/// would let sandbox root rewrite or bypass the network policy or escape mount isolation.
pub const GRANTABLE_CAPABILITIES: [&str; 11] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "PERFMON",
    "SETGID",
    "SETUID",
    "SYS_CHROOT",
];

/// Capabilities refused with a dedicated explanation.
pub const NEVER_GRANTABLE: [&str; 3] = ["NET_ADMIN", "NET_RAW", "SYS_ADMIN"];

/// OCI annotation keys a caller may set. Annotations are privileged configuration read by
/// runtimes and hooks; anything else is refused.
pub const ANNOTATION_ALLOWLIST: [&str; 2] = ["krun.cpus", "krun.ram_mib"];

/// Where the engine is and what every sandbox of a backend defaults to.
#[derive(Clone)]
pub struct PodmanConfig {
    pub(crate) endpoint: String,
    pub(crate) default_template: String,
    pub(crate) options: PodmanOptions,
    pub(crate) startup_sweep: bool,
}

impl Default for PodmanConfig {
    /// `unix:///run/podman/podman.sock`, template `sandbox-rs/python:3.11`, default
    /// [`PodmanOptions`], startup sweep on. Ignores `CONTAINER_HOST` (see
    /// [`PodmanConfig::from_env`]).
    fn default() -> Self {
        PodmanConfig {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            default_template: DEFAULT_TEMPLATE.to_string(),
            options: PodmanOptions::default(),
            startup_sweep: true,
        }
    }
}

impl fmt::Debug for PodmanConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PodmanConfig")
            .field("endpoint", &self.endpoint)
            .field("default_template", &self.default_template)
            .field("options", &self.options)
            .field("startup_sweep", &self.startup_sweep)
            .finish()
    }
}

impl PodmanConfig {
    /// Like [`Default`], but the endpoint comes from `CONTAINER_HOST` when it is set and
    /// non-empty.
    pub fn from_env() -> Self {
        let mut c = PodmanConfig::default();
        if let Ok(h) = std::env::var(CONTAINER_HOST_ENV) {
            if !h.trim().is_empty() {
                c.endpoint = h.trim().to_string();
            }
        }
        c
    }

    /// Sets the endpoint (`unix:///path` or `tcp://host:port`).
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = endpoint.into();
        self
    }

    /// Sets the template used when `CreateOptions::template` is `None`.
    pub fn default_template(mut self, template: impl Into<String>) -> Self {
        self.default_template = template.into();
        self
    }

    /// Sets the Podman options every sandbox of this backend gets (unless
    /// `PodmanBackend::create_with` gives others).
    pub fn options(mut self, options: PodmanOptions) -> Self {
        self.options = options;
        self
    }

    /// Whether `connect` removes containers whose owner process is proven gone (default on).
    pub fn startup_sweep(mut self, on: bool) -> Self {
        self.startup_sweep = on;
        self
    }

    /// The endpoint in effect.
    pub fn endpoint_str(&self) -> &str {
        &self.endpoint
    }
}

/// OCI runtime, chosen from a vetted set by name (never a path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PodmanRuntime {
    /// runc (the default on Debian 12 hosts).
    Runc,
    /// crun.
    Crun,
    /// gVisor's runsc: a user-space kernel ([`IsolationTier::Gvisor`]).
    Runsc,
    /// libkrun (KVM micro-VM). Reported as `Container` until the adapter verifies the
    /// guest kernel itself.
    Krun,
}

impl PodmanRuntime {
    /// The runtime name Podman resolves through its `[engine.runtimes]` table.
    pub fn as_str(self) -> &'static str {
        match self {
            PodmanRuntime::Runc => "runc",
            PodmanRuntime::Crun => "crun",
            PodmanRuntime::Runsc => "runsc",
            PodmanRuntime::Krun => "krun",
        }
    }

    /// The isolation tier sandboxes get with this runtime.
    pub fn tier(self) -> IsolationTier {
        match self {
            PodmanRuntime::Runsc => IsolationTier::Gvisor,
            _ => IsolationTier::Container,
        }
    }

    /// Parses a runtime *name*; paths and unknown names are refused.
    pub fn parse(name: &str) -> Result<PodmanRuntime> {
        match name {
            "runc" => Ok(PodmanRuntime::Runc),
            "crun" => Ok(PodmanRuntime::Crun),
            "runsc" => Ok(PodmanRuntime::Runsc),
            "krun" => Ok(PodmanRuntime::Krun),
            other => Err(SandboxError::config(
                format!(
                    "OCI runtime {:?} is not one of the vetted runtimes",
                    other.chars().take(64).collect::<String>()
                ),
                "use PodmanRuntime::{Runc, Crun, Runsc, Krun}; runtimes are chosen by name, never by path",
            )),
        }
    }
}

impl fmt::Display for PodmanRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Absolute host path (must exist).
    pub host: PathBuf,
    /// Absolute path inside the sandbox.
    pub container: String,
    /// Private or shared.
    pub sharing: Sharing,
    /// Read-only (bind mounts only).
    pub read_only: bool,
    /// Bind or copy.
    pub mode: MountMode,
}

impl Mount {
    /// A private, writable bind mount.
    pub fn bind(host: impl Into<PathBuf>, container: impl Into<String>) -> Self {
        Mount {
            host: host.into(),
            container: container.into(),
            sharing: Sharing::Private,
            read_only: false,
            mode: MountMode::Bind,
        }
    }

    /// A sealed copy injected before start.
    pub fn copy(host: impl Into<PathBuf>, container: impl Into<String>) -> Self {
        Mount {
            mode: MountMode::Copy,
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

    fn validate(&self) -> Result<()> {
        let host = self.host.to_string_lossy();
        if !self.host.is_absolute() || host.chars().any(|c| c.is_control()) {
            return Err(SandboxError::config(
                format!("mount host path {host:?} must be absolute, without control characters"),
                "give an absolute host path, e.g. Mount::bind(\"/srv/data\", \"/data\")",
            ));
        }
        if !self.host.exists() {
            return Err(SandboxError::config(
                format!("mount host path {host:?} does not exist"),
                format!("create it first: mkdir -p {host}"),
            ));
        }
        let c = &self.container;
        let reserved = ["/", "/proc", "/sys", "/dev", "/run/podman-init"];
        if !c.starts_with('/')
            || c.chars().any(|ch| ch.is_control())
            || c.split('/').any(|s| s == ".." || s == ".")
            || c.contains(',')
            || reserved.iter().any(|r| {
                let c = c.trim_end_matches('/');
                let c = if c.is_empty() { "/" } else { c };
                c == *r || (*r != "/" && c.starts_with(&format!("{r}/")))
            })
        {
            return Err(SandboxError::config(
                format!("mount target {c:?} is not allowed"),
                "use an absolute sandbox path without `..`, `.`, commas or control characters, outside /, /proc, /sys and /dev",
            ));
        }
        if self.mode == MountMode::Copy && self.read_only {
            return Err(SandboxError::config(
                format!("copy mount to {c:?} cannot be read-only (sandbox root owns copied files)"),
                "use MountMode::Bind with read_only(true) for a read-only view",
            ));
        }
        Ok(())
    }
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
    /// Extra capabilities, each from [`GRANTABLE_CAPABILITIES`].
    pub capabilities: Vec<String>,
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
    /// Grants one extra capability (checked against [`GRANTABLE_CAPABILITIES`]).
    pub fn capability(mut self, name: impl Into<String>) -> Self {
        self.capabilities.push(name.into());
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

    /// The isolation tier these options give.
    pub fn tier(&self) -> IsolationTier {
        self.runtime
            .map(PodmanRuntime::tier)
            .unwrap_or(IsolationTier::Container)
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
        let mut targets: Vec<&str> = self
            .mounts
            .iter()
            .map(|m| m.container.trim_end_matches('/'))
            .collect();
        targets.sort_unstable();
        if targets.windows(2).any(|w| w[0] == w[1]) {
            return Err(SandboxError::config(
                "two mounts share one sandbox target",
                "give each mount its own container path",
            ));
        }
        for c in &self.capabilities {
            normalize_capability(c)?;
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

/// `net_admin`, `CAP_NET_ADMIN` → `NET_ADMIN`, then checked against the allowlist.
pub(crate) fn normalize_capability(name: &str) -> Result<String> {
    let up = name.trim().to_ascii_uppercase();
    let up = up.strip_prefix("CAP_").unwrap_or(&up).to_string();
    if NEVER_GRANTABLE.contains(&up.as_str()) {
        return Err(SandboxError::config(
            format!("capability {up} is never grantable"),
            "NET_ADMIN/NET_RAW would let sandbox root rewrite or bypass the network policy and SYS_ADMIN defeats mount isolation; do that work on the host side",
        ));
    }
    if !GRANTABLE_CAPABILITIES.contains(&up.as_str()) {
        return Err(SandboxError::config(
            format!(
                "capability {:?} is not on the vetted allowlist",
                up.chars().take(64).collect::<String>()
            ),
            format!("grant only one of: {}", GRANTABLE_CAPABILITIES.join(", ")),
        ));
    }
    Ok(up)
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

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorCode;

    fn refused(o: PodmanOptions) -> SandboxError {
        let e = o
            .validate_with_cdi_dirs(&[Path::new("/nonexistent-cdi-dir")])
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration, "{e}");
        assert!(!e.hint().is_empty());
        e
    }

    #[test]
    fn defaults_are_valid_and_ephemeral() {
        let o = PodmanOptions::default();
        assert!(o.ephemeral);
        assert!(o.validate_with_cdi_dirs(&[]).is_ok());
        assert_eq!(o.tier(), IsolationTier::Container);
    }

    #[test]
    fn runtime_is_a_vetted_name_never_a_path() {
        assert_eq!(PodmanRuntime::parse("runsc").unwrap(), PodmanRuntime::Runsc);
        for bad in ["/usr/bin/runc", "./runc", "youki", "", "runc;rm -rf /"] {
            assert_eq!(
                PodmanRuntime::parse(bad).unwrap_err().code(),
                ErrorCode::Configuration
            );
        }
    }

    #[test]
    fn runtime_maps_to_tier() {
        assert_eq!(PodmanRuntime::Runsc.tier(), IsolationTier::Gvisor);
        assert_eq!(PodmanRuntime::Runc.tier(), IsolationTier::Container);
        assert_eq!(PodmanRuntime::Crun.tier(), IsolationTier::Container);
        assert_eq!(PodmanRuntime::Krun.tier(), IsolationTier::Container);
        assert_eq!(
            PodmanOptions::new().runtime(PodmanRuntime::Runsc).tier(),
            IsolationTier::Gvisor
        );
    }

    #[test]
    fn dangerous_capabilities_are_never_granted() {
        for c in ["NET_ADMIN", "net_raw", "CAP_SYS_ADMIN"] {
            let e = refused(PodmanOptions::new().capability(c));
            assert!(e.to_string().contains("never grantable"));
        }
    }

    #[test]
    fn unlisted_capabilities_are_refused() {
        for c in ["SYS_PTRACE", "SYS_MODULE", "ALL", "", "MKNOD"] {
            refused(PodmanOptions::new().capability(c));
        }
        assert!(
            PodmanOptions::new()
                .capability("cap_chown")
                .capability("PERFMON")
                .validate_with_cdi_dirs(&[])
                .is_ok()
        );
        assert_eq!(normalize_capability("cap_chown").unwrap(), "CHOWN");
    }

    #[test]
    fn annotations_need_allowlisted_keys_and_no_control_characters() {
        refused(PodmanOptions::new().annotation("io.podman.annotations.label", "disable"));
        refused(PodmanOptions::new().annotation("krun.cpus", "2\n"));
        refused(PodmanOptions::new().annotation("krun.cpus\u{1b}", "2"));
        refused(PodmanOptions::new().annotation("krun.cpus", "x".repeat(2000)));
        assert!(
            PodmanOptions::new()
                .annotation("krun.cpus", "2")
                .validate_with_cdi_dirs(&[])
                .is_ok()
        );
    }

    #[test]
    fn gpu_without_cdi_specs_is_refused() {
        let e = refused(PodmanOptions::new().cdi_device("nvidia.com/gpu=0"));
        assert!(e.hint().contains("nvidia-ctk"));
    }

    #[test]
    fn gpu_with_cdi_specs_is_accepted_and_names_are_checked() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("nvidia.yaml"), "cdiVersion: 0.5.0\n").unwrap();
        let o = PodmanOptions::new().cdi_device("nvidia.com/gpu=0");
        assert!(o.validate_with_cdi_dirs(&[d.path()]).is_ok());
        for bad in [
            "gpu0",
            "/dev/nvidia0",
            "nvidia.com/gpu=",
            "nvidia.com/gpu=0;x",
        ] {
            let e = PodmanOptions::new()
                .cdi_device(bad)
                .validate_with_cdi_dirs(&[d.path()])
                .unwrap_err();
            assert_eq!(e.code(), ErrorCode::Configuration, "{bad}");
        }
    }

    #[test]
    fn mounts_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let host = d.path().to_path_buf();
        refused(PodmanOptions::new().mount(Mount::bind("relative", "/data")));
        refused(PodmanOptions::new().mount(Mount::bind("/definitely/not/here", "/data")));
        for target in [
            "data",
            "/",
            "/proc",
            "/proc/sys",
            "/sys",
            "/dev/shm",
            "/a/../etc",
            "/a,b",
            "/a\nb",
        ] {
            refused(PodmanOptions::new().mount(Mount::bind(&host, target)));
        }
        refused(PodmanOptions::new().mount(Mount::copy(&host, "/data").read_only(true)));
        refused(
            PodmanOptions::new()
                .mount(Mount::bind(&host, "/data"))
                .mount(Mount::copy(&host, "/data/")),
        );
        assert!(
            PodmanOptions::new()
                .mount(
                    Mount::bind(&host, "/data")
                        .read_only(true)
                        .sharing(Sharing::Shared)
                )
                .mount(Mount::copy(&host, "/seed"))
                .validate_with_cdi_dirs(&[])
                .is_ok()
        );
    }

    #[test]
    fn from_env_honours_container_host() {
        // Only reads: the variable may or may not be set in the test environment.
        let c = PodmanConfig::from_env();
        match std::env::var(CONTAINER_HOST_ENV) {
            Ok(h) if !h.trim().is_empty() => assert_eq!(c.endpoint, h.trim()),
            _ => assert_eq!(c.endpoint, DEFAULT_ENDPOINT),
        }
        assert_eq!(c.default_template, DEFAULT_TEMPLATE);
        let c = PodmanConfig::default().endpoint("tcp://127.0.0.1:8888");
        assert_eq!(c.endpoint_str(), "tcp://127.0.0.1:8888");
    }
}
