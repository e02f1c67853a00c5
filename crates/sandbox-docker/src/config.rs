//! Typed configuration of the Docker backend.

use sandbox_core::IsolationTier;

/// Environment variable naming the engine endpoint (`unix://…`, `tcp://…`, `https://…`).
pub const DOCKER_HOST_ENV: &str = "DOCKER_HOST";
/// Endpoint used when `DOCKER_HOST` is unset.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";
/// Template used when `CreateOptions::template` is `None`.
pub const DEFAULT_TEMPLATE: &str = "sandbox-rs/python:3.11";
/// Test images `sandbox doctor` checks for.
pub const TEST_IMAGES: [&str; 2] = ["sandbox-rs/python:3.11", "sandbox-rs/busybox:latest"];

/// Host threads an idle gVisor sandbox (sentry + gofer) needs on top of the sandbox's own
/// processes; measured at 45 here, more under load. Under runsc the engine's (cgroup) pids
/// limit counts those threads, so a limit of e.g. 64 would kill the sandbox on its first
/// exec: the adapter sets `requested + RUNSC_PIDS_HEADROOM` (see
/// [`Runtime::pids_headroom`]).
pub const RUNSC_PIDS_HEADROOM: u64 = 256;

/// The OCI runtime a sandbox runs under, from a vetted allowlist (never a path).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Runtime {
    /// `runc`: Linux namespaces and cgroups on the host kernel ([`IsolationTier::Container`]).
    #[default]
    Runc,
    /// `runsc` (gVisor): a user-space kernel ([`IsolationTier::Gvisor`]). The engine must
    /// register it (`/etc/docker/daemon.json` `runtimes.runsc`, with `--network=none`).
    Runsc,
}

impl Runtime {
    /// The runtime name the engine knows it by.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Runsc => "runsc",
        }
    }

    /// The isolation tier sandboxes get under this runtime.
    pub fn tier(self) -> IsolationTier {
        match self {
            Runtime::Runc => IsolationTier::Container,
            Runtime::Runsc => IsolationTier::Gvisor,
        }
    }

    /// What the adapter adds to the requested pids limit under this runtime before
    /// setting the engine's limit: 0 for runc, [`RUNSC_PIDS_HEADROOM`] for runsc.
    pub fn pids_headroom(self) -> u64 {
        match self {
            Runtime::Runc => 0,
            Runtime::Runsc => RUNSC_PIDS_HEADROOM,
        }
    }

    /// Parses `runc` / `runsc` (case-insensitive); anything else is `None`.
    pub fn parse(s: &str) -> Option<Runtime> {
        match s.trim().to_ascii_lowercase().as_str() {
            "runc" => Some(Runtime::Runc),
            "runsc" | "gvisor" => Some(Runtime::Runsc),
            _ => None,
        }
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Configuration of a [`DockerBackend`](crate::DockerBackend).
///
/// ```
/// use sandbox_docker::{DockerConfig, Runtime};
/// let cfg = DockerConfig::default()
///     .host("unix:///var/run/docker.sock")
///     .runtime(Runtime::Runc)
///     .default_template("sandbox-rs/python:3.11");
/// assert_eq!(cfg.runtime_kind(), Runtime::Runc);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DockerConfig {
    /// Engine endpoint; `None` means `DOCKER_HOST`, else [`DEFAULT_DOCKER_HOST`].
    pub host: Option<String>,
    /// OCI runtime of every sandbox.
    pub runtime: Runtime,
    /// Image used when `CreateOptions::template` is `None`.
    pub default_template: String,
    /// Whether [`DockerBackend::connect`](crate::DockerBackend::connect) removes this host's
    /// sandboxes whose owning process is proven gone (default `true`).
    pub startup_sweep: bool,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            host: None,
            runtime: Runtime::Runc,
            default_template: DEFAULT_TEMPLATE.to_string(),
            startup_sweep: true,
        }
    }
}

impl DockerConfig {
    /// The default configuration with the endpoint taken from `DOCKER_HOST` now.
    pub fn from_env() -> Self {
        DockerConfig {
            host: std::env::var(DOCKER_HOST_ENV)
                .ok()
                .filter(|h| !h.trim().is_empty()),
            ..DockerConfig::default()
        }
    }

    /// Sets the engine endpoint (`unix:///path`, `tcp://host:2376`, `https://…`).
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Selects the OCI runtime.
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = runtime;
        self
    }

    /// Sets the image used when no template is given.
    pub fn default_template(mut self, template: impl Into<String>) -> Self {
        self.default_template = template.into();
        self
    }

    /// Enables or disables the startup sweep of dead owners' sandboxes.
    pub fn startup_sweep(mut self, on: bool) -> Self {
        self.startup_sweep = on;
        self
    }

    /// The runtime in effect.
    pub fn runtime_kind(&self) -> Runtime {
        self.runtime
    }

    /// The endpoint in effect: the configured host, else `DOCKER_HOST`, else the default
    /// socket.
    pub fn endpoint(&self) -> String {
        self.host
            .clone()
            .or_else(|| {
                std::env::var(DOCKER_HOST_ENV)
                    .ok()
                    .filter(|h| !h.trim().is_empty())
            })
            .unwrap_or_else(|| DEFAULT_DOCKER_HOST.to_string())
    }
}

/// The endpoint with any `user:password@` credentials removed, for reports and errors.
pub(crate) fn redact_endpoint(endpoint: &str) -> String {
    match endpoint.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((_, host)) => format!("{scheme}://{host}"),
            None => endpoint.to_string(),
        },
        None => endpoint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_maps_to_tier() {
        assert_eq!(Runtime::Runc.tier(), IsolationTier::Container);
        assert_eq!(Runtime::Runsc.tier(), IsolationTier::Gvisor);
        assert_eq!(Runtime::parse("RUNSC"), Some(Runtime::Runsc));
        assert_eq!(Runtime::parse("/usr/bin/runc"), None, "never a path");
    }

    #[test]
    fn builder_and_endpoint() {
        let c = DockerConfig::default()
            .host("unix:///tmp/x.sock")
            .runtime(Runtime::Runsc)
            .default_template("img:1");
        assert_eq!(c.endpoint(), "unix:///tmp/x.sock");
        assert_eq!(c.default_template, "img:1");
        assert_eq!(c.runtime_kind(), Runtime::Runsc);
        assert_eq!(DockerConfig::default().default_template, DEFAULT_TEMPLATE);
    }

    #[test]
    fn endpoint_credentials_redacted() {
        assert_eq!(
            redact_endpoint("tcp://user:pw@host:2376"),
            "tcp://host:2376"
        );
        assert_eq!(
            redact_endpoint("unix:///var/run/docker.sock"),
            "unix:///var/run/docker.sock"
        );
    }
}
