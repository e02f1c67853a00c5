//! Typed configuration of the Docker backend.

use std::path::{Path, PathBuf};

use bollard::Docker;
use sandbox_container::endpoint::discovery::{
    DiscoveredEndpoint, DiscoveryError, EndpointSource, EnvSnapshot, discover_docker, is_plain_tcp,
};
use sandbox_container::endpoint::ssh::SshTarget;
use sandbox_container::{ContainerConfig, Runtime};
use sandbox_core::{Result, SandboxError};

pub use sandbox_container::spec::hooks::{HookEvent, HookFn, Hooks};
pub use sandbox_container::spec::mounts::{Mount, MountMode, Sharing};

/// Environment variable naming the engine endpoint (`unix://…`, `tcp://…`, `https://…`).
pub const ENDPOINT_ENV: &str = "DOCKER_HOST";
/// Environment variable that, when set to a non-empty value other than `0`, requires TLS
/// with client certificates for `tcp://` endpoints (as the Docker CLI reads it).
pub const DOCKER_TLS_VERIFY_ENV: &str = "DOCKER_TLS_VERIFY";
/// Environment variable naming the directory of `ca.pem`, `cert.pem` and `key.pem`
/// (default `~/.docker`, as for the Docker CLI).
pub const DOCKER_CERT_PATH_ENV: &str = "DOCKER_CERT_PATH";
/// Endpoint used when `DOCKER_HOST` is unset and discovery finds nothing else.
pub const DEFAULT_ENDPOINT: &str = "unix:///var/run/docker.sock";
/// Template used when `CreateOptions::template` is `None`.
pub const DEFAULT_TEMPLATE: &str = "sandbox-rs/python:3.11";
/// Test images `sandbox doctor` checks for.
pub const TEST_IMAGES: [&str; 2] = ["sandbox-rs/python:3.11", "sandbox-rs/busybox:latest"];

/// Configuration of a [`DockerBackend`](crate::DockerBackend).
///
/// ```
/// use sandbox_docker::{DockerConfig, Runtime};
/// let cfg = DockerConfig::default()
///     .endpoint("unix:///var/run/docker.sock")
///     .runtime(Runtime::Runc)
///     .default_template("sandbox-rs/python:3.11");
/// assert_eq!(cfg.runtime_kind(), Runtime::Runc);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DockerConfig {
    /// Engine endpoint; `None` means discovered from the environment at connect time
    /// (`DOCKER_HOST`, the current Docker context, the rootless socket, then
    /// [`DEFAULT_ENDPOINT`]).
    pub endpoint: Option<String>,
    /// Why `endpoint` is what it is ([`EndpointSource::Configured`] for
    /// [`DockerConfig::endpoint`]).
    pub endpoint_source: EndpointSource,
    /// Require TLS with client certificates on `tcp://`/`http://` endpoints
    /// (`DOCKER_TLS_VERIFY`). `https://` always requires TLS.
    pub tls_verify: bool,
    /// Directory of `ca.pem`, `cert.pem`, `key.pem` (`DOCKER_CERT_PATH`; `None`: `~/.docker`).
    pub cert_path: Option<PathBuf>,
    /// Accept `tcp://`/`http://` without TLS (default `false`): exec bodies carry the
    /// caller's environment, secrets included, so plain TCP must be an explicit choice.
    pub allow_plain_tcp: bool,
    /// ssh config file for an `ssh://` endpoint's tunnel (`ssh -F`; `None`: the user's,
    /// or `SBX_SSH_CONFIG`).
    pub ssh_config: Option<PathBuf>,
    /// OCI runtime of every sandbox.
    pub runtime: Runtime,
    /// The engine-independent settings: default template, startup sweep, call and create
    /// bounds, read and download caps, agent (set them with this type's builder methods
    /// of the same names; `from_env` reads `SBX_AGENT=off`).
    pub layer: ContainerConfig,
    /// Mounts and lifecycle hooks every sandbox of the backend gets
    /// ([`DockerConfig::options`]).
    pub options: DockerOptions,
    /// A selected Docker context that did not resolve: reported at connect, never silently
    /// replaced by another engine.
    discovery_error: Option<DiscoveryError>,
    /// `HOME` at discovery time, for the default certificate directory.
    home: Option<PathBuf>,
}

sandbox_container::layer_settings!(DockerConfig, layer);

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            endpoint: None,
            endpoint_source: EndpointSource::Default,
            tls_verify: false,
            cert_path: None,
            allow_plain_tcp: false,
            ssh_config: None,
            runtime: Runtime::Runc,
            layer: ContainerConfig::new(DEFAULT_TEMPLATE),
            options: DockerOptions::default(),
            discovery_error: None,
            home: None,
        }
    }
}

impl DockerConfig {
    /// The default configuration with the endpoint discovered from the environment now
    /// (see [`DockerConfig::from_env_snapshot`]).
    pub fn from_env() -> Self {
        DockerConfig::from_env_snapshot(&EnvSnapshot::capture())
    }

    /// The default configuration with the endpoint discovered from `env`, in the Docker
    /// CLI's order: `DOCKER_HOST`; the current context (`DOCKER_CONTEXT`, else
    /// `currentContext` of `~/.docker/config.json`); `$XDG_RUNTIME_DIR/docker.sock` if it
    /// exists; [`DEFAULT_ENDPOINT`]. TLS settings come from `DOCKER_TLS_VERIFY` and
    /// `DOCKER_CERT_PATH`. A selected context that does not resolve fails at connect.
    /// `SBX_AGENT=off` forces the engine's exec path ([`DockerConfig::agent`]).
    pub fn from_env_snapshot(env: &EnvSnapshot) -> Self {
        DockerConfig::default()
            .agent(sandbox_container::agent_enabled_in(env))
            .discover(env)
    }

    /// Fills the endpoint (when not configured) and TLS settings from `env`.
    fn discover(mut self, env: &EnvSnapshot) -> Self {
        if self.endpoint.is_none() {
            match discover_docker(env) {
                Ok(DiscoveredEndpoint {
                    endpoint, source, ..
                }) => {
                    self.endpoint = Some(endpoint);
                    self.endpoint_source = source;
                }
                Err(e) => self.discovery_error = Some(e),
            }
        }
        if !self.tls_verify {
            // The Docker CLI treats any non-empty value as "on", `0` included; we read `0`
            // as off too, since refusing to connect is the safe side of that ambiguity.
            self.tls_verify = env.get(DOCKER_TLS_VERIFY_ENV).is_some_and(|v| v != "0");
        }
        if self.cert_path.is_none() {
            self.cert_path = env.get(DOCKER_CERT_PATH_ENV).map(PathBuf::from);
        }
        if self.home.is_none() {
            self.home = env.get("HOME").map(PathBuf::from);
        }
        self
    }

    /// Sets the engine endpoint (`unix:///path`, `tcp://host:2376`, `https://…`).
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self.endpoint_source = EndpointSource::Configured;
        self.discovery_error = None;
        self
    }

    /// Requires TLS with the client certificates in `dir` (`ca.pem`, `cert.pem`,
    /// `key.pem`), as `DOCKER_TLS_VERIFY=1 DOCKER_CERT_PATH=dir` do. Needs the `tls` feature.
    pub fn tls(mut self, dir: impl Into<PathBuf>) -> Self {
        self.tls_verify = true;
        self.cert_path = Some(dir.into());
        self
    }

    /// Accepts `tcp://` without TLS (default `false`). Only for a loopback or otherwise
    /// trusted network: exec bodies carry secrets in the clear.
    pub fn allow_plain_tcp(mut self, on: bool) -> Self {
        self.allow_plain_tcp = on;
        self
    }

    /// Uses `path` as the ssh config of an `ssh://` endpoint's tunnel (`ssh -F`), instead
    /// of the user's `~/.ssh/config`.
    pub fn ssh_config(mut self, path: impl Into<PathBuf>) -> Self {
        self.ssh_config = Some(path.into());
        self
    }

    /// Sets the mounts and lifecycle hooks every sandbox of the backend gets (checked by
    /// [`DockerBackend::connect`](crate::DockerBackend::connect)).
    pub fn options(mut self, options: DockerOptions) -> Self {
        self.options = options;
        self
    }

    /// Selects the OCI runtime.
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = runtime;
        self
    }

    /// The engine-independent part, for the container layer.
    pub(crate) fn container_config(&self) -> ContainerConfig {
        self.layer.clone()
    }

    /// The runtime in effect.
    pub fn runtime_kind(&self) -> Runtime {
        self.runtime
    }

    /// The endpoint in effect: the configured or discovered one, else discovered from the
    /// environment now.
    pub fn resolved_endpoint(&self) -> String {
        self.resolved()
            .endpoint
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
    }

    /// Why [`DockerConfig::resolved_endpoint`] is what it is.
    pub fn endpoint_source(&self) -> EndpointSource {
        self.resolved().endpoint_source
    }

    /// This configuration with the endpoint discovered when it was left unset: what
    /// `connect` uses.
    pub(crate) fn resolved(&self) -> DockerConfig {
        if self.endpoint.is_some() || self.discovery_error.is_some() {
            return self.clone();
        }
        self.clone().discover(&EnvSnapshot::capture())
    }

    /// How `connect` will reach the engine, decided without connecting: refused
    /// (`Configuration`, naming the fix) when it would be insecure or unsupported — plain
    /// `tcp://` unless [`DockerConfig::allow_plain_tcp`], TLS without the `tls` feature or
    /// with a certificate file missing, a malformed `ssh://` endpoint, a selected context
    /// that does not resolve. TLS is never downgraded to plain HTTP.
    pub fn transport(&self) -> Result<Transport> {
        if let Some(e) = &self.discovery_error {
            return Err(e.to_error());
        }
        let endpoint = self.resolved_endpoint();
        let ssh =
            SshTarget::of_endpoint(&endpoint, "/var/run/docker.sock", self.ssh_config.clone());
        if let Some(target) = ssh? {
            return Ok(Transport::Ssh(target));
        }
        let shown = redact_endpoint(&endpoint);
        let plain = is_plain_tcp(&endpoint);
        if endpoint.to_ascii_lowercase().starts_with("https://") || (self.tls_verify && plain) {
            if !cfg!(feature = "tls") {
                return Err(SandboxError::config(
                    format!(
                        "{shown} needs TLS, but sandbox-docker was built without its `tls` feature"
                    ),
                    "enable it: sandbox-docker = { version = \"…\", features = [\"tls\"] } (the `sandbox` CLI has it); never fall back to plain HTTP",
                ));
            }
            return self.tls_transport(&endpoint);
        }
        if plain {
            if !self.allow_plain_tcp {
                return Err(SandboxError::config(
                    format!(
                        "{shown} is plain TCP without TLS: exec bodies (secrets included) would cross the network in the clear"
                    ),
                    "set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH (ca.pem, cert.pem, key.pem) with the `tls` feature, or DockerConfig::allow_plain_tcp(true) for a trusted loopback",
                ));
            }
            return Ok(Transport::PlainTcp(endpoint));
        }
        Ok(Transport::Local(endpoint))
    }

    fn tls_transport(&self, endpoint: &str) -> Result<Transport> {
        let dir = match (&self.cert_path, &self.home) {
            (Some(d), _) => d.clone(),
            (None, Some(h)) => h.join(".docker"),
            (None, None) => {
                return Err(SandboxError::config(
                    "TLS is required but neither DOCKER_CERT_PATH nor HOME is set",
                    "set DOCKER_CERT_PATH to the directory holding ca.pem, cert.pem and key.pem",
                ));
            }
        };
        let file = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(SandboxError::config(
                    format!("TLS client file {} is missing", p.display()),
                    format!(
                        "put ca.pem, cert.pem and key.pem in {} or point DOCKER_CERT_PATH at the directory holding them",
                        dir.display()
                    ),
                ))
            }
        };
        Ok(Transport::Tls {
            endpoint: endpoint.to_string(),
            ca: file("ca.pem")?,
            cert: file("cert.pem")?,
            key: file("key.pem")?,
        })
    }
}

/// How the engine is reached, decided before connecting ([`DockerConfig::transport`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// A local socket (`unix://`, or a scheme bollard resolves itself).
    Local(String),
    /// `tcp://` without TLS, explicitly allowed.
    PlainTcp(String),
    /// `ssh://`: the remote engine's socket, forwarded by the OpenSSH client
    /// ([`sandbox_container::endpoint::ssh`]); the engine opens the tunnel, then speaks to its local
    /// end as to a [`Transport::Local`] socket.
    Ssh(SshTarget),
    /// TLS with client certificates.
    Tls {
        /// The endpoint, as configured.
        endpoint: String,
        /// The CA certificate the engine's certificate must chain to.
        ca: PathBuf,
        /// The client certificate.
        cert: PathBuf,
        /// The client certificate's key.
        key: PathBuf,
    },
}

/// Seconds bollard waits for one request (its own default).
const BOLLARD_TIMEOUT_SECS: u64 = 120;

impl Transport {
    /// A bollard client (no connection is made yet; a missing socket fails here).
    pub(crate) fn client(&self) -> std::result::Result<Docker, bollard::errors::Error> {
        match self {
            // `connect_with_host` would switch `tcp://` to TLS on its own reading of the
            // environment; local sockets are all it is given.
            Transport::Local(e) => Docker::connect_with_host(e),
            Transport::PlainTcp(e) => {
                Docker::connect_with_http(e, BOLLARD_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
            }
            Transport::Tls {
                endpoint,
                ca,
                cert,
                key,
            } => tls_client(endpoint, ca, cert, key),
            // The engine replaces it with the tunnel's local socket before asking.
            Transport::Ssh(t) => Err(bollard::errors::Error::UnsupportedURISchemeError {
                uri: format!("ssh://{} (open the tunnel first)", t.host),
            }),
        }
    }
}

#[cfg(feature = "tls")]
fn tls_client(
    endpoint: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> std::result::Result<Docker, bollard::errors::Error> {
    Docker::connect_with_ssl(
        endpoint,
        key,
        cert,
        ca,
        BOLLARD_TIMEOUT_SECS,
        bollard::API_DEFAULT_VERSION,
    )
}

#[cfg(not(feature = "tls"))]
fn tls_client(
    endpoint: &str,
    _ca: &Path,
    _cert: &Path,
    _key: &Path,
) -> std::result::Result<Docker, bollard::errors::Error> {
    // `transport()` refuses TLS endpoints without the feature; this keeps that true even
    // if a `Transport::Tls` were built another way.
    Err(bollard::errors::Error::UnsupportedURISchemeError {
        uri: endpoint.to_string(),
    })
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

/// Docker-specific options of every sandbox of a backend: typed mounts (read-only bind
/// mounts, or sealed copies injected before start) and lifecycle hooks. **Outside the
/// portable contract**, like Podman's `PodmanOptions`, whose mounts and hooks these are.
///
/// Docker cannot mount a bind `nosuid`: sandbox root is host root on a bind mount (a
/// rootful engine without a user namespace), so a *writable* bind would let code in the
/// sandbox leave a setuid-root program on the host. Writable binds are refused; use
/// [`MountMode::Copy`] (a sealed copy, nothing written reaches the host) or a read-only
/// bind.
///
/// ```
/// use sandbox_docker::{DockerOptions, Mount};
/// let opts = DockerOptions::new().mount(Mount::copy("/srv/fixtures", "/work/fixtures"));
/// # let _ = opts;
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DockerOptions {
    /// Host trees made visible in each sandbox.
    pub mounts: Vec<Mount>,
    /// Lifecycle hooks around each sandbox's start.
    pub hooks: Hooks,
}

impl std::fmt::Debug for DockerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerOptions")
            .field("mounts", &self.mounts)
            .field("hooks", &self.hooks)
            .finish()
    }
}

impl DockerOptions {
    /// No mounts, no hooks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a mount.
    pub fn mount(mut self, m: Mount) -> Self {
        self.mounts.push(m);
        self
    }

    /// Sets the lifecycle hooks.
    pub fn hooks(mut self, h: Hooks) -> Self {
        self.hooks = h;
        self
    }

    /// Checks every mount (host paths that give the host away, kernel interfaces inside,
    /// two mounts on one target) and refuses writable bind mounts, which Docker cannot
    /// make `nosuid`. Called before anything is created.
    pub fn validate(&self) -> Result<()> {
        sandbox_container::spec::mounts::validate_all(&self.mounts)?;
        if let Some(m) = self
            .mounts
            .iter()
            .find(|m| m.mode == MountMode::Bind && !m.read_only)
        {
            return Err(SandboxError::config(
                format!(
                    "the writable bind mount at {} cannot be made nosuid on Docker: code in \
                     the sandbox, root on the host's filesystem there, could leave a \
                     setuid-root program on the host",
                    m.container
                ),
                "mount it read-only (Mount::read_only(true)), or as a sealed copy \
                 (MountMode::Copy), or use the Podman backend, whose binds are nosuid",
            ));
        }
        Ok(())
    }
}
