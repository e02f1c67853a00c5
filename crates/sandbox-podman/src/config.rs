//! Typed configuration: where the engine is ([`PodmanConfig`]) and the Podman-specific
//! per-sandbox options ([`PodmanOptions`]) that are **outside the portable contract**.
//!
//! Every option is checked by [`PodmanOptions::validate`] before anything is created;
//! every refusal is a [`SandboxError::Configuration`] with a hint.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use sandbox_container::endpoint::discovery::{
    EndpointSource, EnvSnapshot, discover_podman, is_plain_tcp,
};
use sandbox_container::endpoint::ssh::SshTarget;
use sandbox_container::{ContainerConfig, Runtime};
use sandbox_core::{IsolationTier, Result, SandboxError};

pub use sandbox_container::spec::hooks::{HookEvent, HookFn, Hooks};
pub use sandbox_container::spec::linux_capability::{
    GRANTABLE_CAPABILITIES, LinuxCapability, NEVER_GRANTABLE,
};
pub use sandbox_container::spec::mounts::{
    ENGINE_PATHS, Mount, MountMode, REFUSED_HOST_PATHS, Sharing,
};

/// Endpoint used when `CONTAINER_HOST` is unset and discovery finds nothing else (the
/// rootful libpod service).
pub const DEFAULT_ENDPOINT: &str = "unix:///run/podman/podman.sock";
/// Environment variable naming the endpoint, as Podman's own remote client reads it.
pub const ENDPOINT_ENV: &str = "CONTAINER_HOST";
/// Template used when `CreateOptions::template` is `None`.
pub const DEFAULT_TEMPLATE: &str = "sandbox-rs/python:3.11";
pub use sandbox_container::spec::cdi::CDI_SPEC_DIRS;

/// OCI annotation keys a caller may set. Annotations are privileged configuration read by
/// runtimes and hooks; anything else is refused.
pub const ANNOTATION_ALLOWLIST: [&str; 2] = ["krun.cpus", "krun.ram_mib"];

/// Where the engine is and what every sandbox of a backend defaults to.
#[derive(Clone, Debug)]
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

    /// Why [`PodmanConfig::resolved_endpoint`] is what it is.
    pub fn endpoint_source(&self) -> EndpointSource {
        self.endpoint_source.clone()
    }

    /// Refuses, before any connection, endpoints that would send secrets in the clear
    /// (`tcp://` unless [`PodmanConfig::allow_plain_tcp`]); an `ssh://` endpoint must be
    /// well-formed (its tunnel is opened by `PodmanEngine::connect`).
    pub(crate) fn check_endpoint(&self) -> Result<()> {
        self.ssh_target()?;
        if is_plain_tcp(&self.endpoint) && !self.allow_plain_tcp {
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
        SshTarget::of_endpoint(
            &self.endpoint,
            "/run/podman/podman.sock",
            self.ssh_config.clone(),
        )
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

    /// The endpoint in effect: the configured one, else the one discovered when this
    /// configuration was made.
    pub fn resolved_endpoint(&self) -> String {
        self.endpoint.clone()
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
    pub runtime: Option<Runtime>,
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
    pub fn runtime(mut self, r: Runtime) -> Self {
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
            Some(Runtime::Krun) | None => IsolationTier::Container,
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
        sandbox_container::spec::mounts::validate_all(&self.mounts)?;
        for (k, v) in &self.annotations {
            validate_annotation(k, v)?;
        }
        sandbox_container::spec::cdi::validate(&self.cdi_devices, cdi_dirs)?;
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
