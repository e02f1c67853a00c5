//! Typed configuration of the Docker backend.

use std::time::Duration;

use sandbox_container::{ContainerConfig, Runtime};

/// Environment variable naming the engine endpoint (`unix://…`, `tcp://…`, `https://…`).
pub const DOCKER_HOST_ENV: &str = "DOCKER_HOST";
/// Endpoint used when `DOCKER_HOST` is unset.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";
/// Template used when `CreateOptions::template` is `None`.
pub const DEFAULT_TEMPLATE: &str = "sandbox-rs/python:3.11";
/// Test images `sandbox doctor` checks for.
pub const TEST_IMAGES: [&str; 2] = ["sandbox-rs/python:3.11", "sandbox-rs/busybox:latest"];

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
    /// leftovers: sandboxes whose owning process is proven gone, or long past their deadline
    /// (default `true`).
    pub startup_sweep: bool,
    /// Bound of one engine call (default 30 s): a wedged engine fails the call.
    pub call_timeout: Duration,
    /// Bound of a whole `create` (default 60 s; `CreateTimeout`, SBX_E1203, past it).
    pub create_timeout: Duration,
    /// Largest file `files().read` returns (default 64 MiB; `ResourceLimitExceeded` past it).
    pub read_cap: u64,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            host: None,
            runtime: Runtime::Runc,
            default_template: DEFAULT_TEMPLATE.to_string(),
            startup_sweep: true,
            call_timeout: sandbox_container::DEFAULT_CALL_TIMEOUT,
            create_timeout: sandbox_container::DEFAULT_CREATE_TIMEOUT,
            read_cap: sandbox_container::DEFAULT_READ_CAP,
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

    /// Sets the bound of one engine call.
    pub fn call_timeout(mut self, t: Duration) -> Self {
        self.call_timeout = t;
        self
    }

    /// Sets the bound of a whole `create`.
    pub fn create_timeout(mut self, t: Duration) -> Self {
        self.create_timeout = t;
        self
    }

    /// Sets the `files().read` cap.
    pub fn read_cap(mut self, bytes: u64) -> Self {
        self.read_cap = bytes;
        self
    }

    /// The engine-independent part, for the container layer.
    pub(crate) fn container_config(&self) -> ContainerConfig {
        ContainerConfig::new(self.default_template.clone())
            .startup_sweep(self.startup_sweep)
            .call_timeout(self.call_timeout)
            .create_timeout(self.create_timeout)
            .read_cap(self.read_cap)
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
