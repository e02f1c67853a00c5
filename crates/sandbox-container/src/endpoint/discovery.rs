//! Engine endpoint discovery, in the order the engines' own CLIs use, as a pure function of
//! an [`EnvSnapshot`] (environment variables plus whether the process is root), so tests
//! point `HOME` and `XDG_RUNTIME_DIR` at temporary directories instead of the real ones.
//!
//! Docker: `DOCKER_HOST`; the current context (`DOCKER_CONTEXT`, else `currentContext` of
//! `$DOCKER_CONFIG/config.json`, default `~/.docker`), resolved through
//! `contexts/meta/<sha256 of name>/meta.json`; the rootless socket
//! `$XDG_RUNTIME_DIR/docker.sock` if it exists; then `unix:///var/run/docker.sock`.
//!
//! Podman: `CONTAINER_HOST`; the rootless socket `$XDG_RUNTIME_DIR/podman/podman.sock` if it
//! exists and the process is not root; then `unix:///run/podman/podman.sock`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use sandbox_core::SandboxError;
use sha2::{Digest, Sha256};

/// Docker's rootful default endpoint.
pub const DOCKER_DEFAULT_ENDPOINT: &str = "unix:///var/run/docker.sock";
/// Podman's rootful default endpoint.
pub const PODMAN_DEFAULT_ENDPOINT: &str = "unix:///run/podman/podman.sock";

/// The environment discovery reads: variables, and whether the process runs as root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvSnapshot {
    vars: BTreeMap<String, String>,
    is_root: bool,
}

impl EnvSnapshot {
    /// The process environment now (non-UTF-8 values are skipped).
    pub fn capture() -> Self {
        EnvSnapshot {
            vars: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
            is_root: process_is_root(),
        }
    }

    /// An empty environment of a non-root process (for tests and embedders).
    pub fn empty() -> Self {
        EnvSnapshot::default()
    }

    /// Sets one variable.
    pub fn var(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.vars.insert(key.into(), value.into());
        self
    }

    /// Sets whether the process is root (rootless Podman sockets are skipped for root).
    pub fn root(mut self, is_root: bool) -> Self {
        self.is_root = is_root;
        self
    }

    /// A variable's value, trimmed; empty counts as unset (as the engines' CLIs treat it).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// Whether the process is root.
    pub fn is_root(&self) -> bool {
        self.is_root
    }

    /// Docker's configuration directory: `$DOCKER_CONFIG`, else `$HOME/.docker`.
    pub fn docker_config_dir(&self) -> Option<PathBuf> {
        self.get("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| self.get("HOME").map(|h| Path::new(h).join(".docker")))
    }
}

#[cfg(unix)]
fn process_is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    // `/proc/self` is owned by the process's effective uid: no `unsafe` geteuid needed.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[cfg(not(unix))]
fn process_is_root() -> bool {
    false
}

/// Why an endpoint was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointSource {
    /// Set explicitly in the configuration.
    Configured,
    /// From an environment variable (`DOCKER_HOST`, `CONTAINER_HOST`).
    EnvVar(String),
    /// From a Docker context of this name.
    DockerContext(String),
    /// The rootless socket under `$XDG_RUNTIME_DIR` exists.
    RootlessSocket,
    /// Nothing else applied: the rootful default.
    Default,
}

impl fmt::Display for EndpointSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointSource::Configured => f.write_str("configured"),
            EndpointSource::EnvVar(v) => f.write_str(v),
            EndpointSource::DockerContext(n) => write!(f, "docker context `{n}`"),
            EndpointSource::RootlessSocket => f.write_str("rootless socket"),
            EndpointSource::Default => f.write_str("default"),
        }
    }
}

/// An endpoint and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiscoveredEndpoint {
    /// `unix:///…`, `tcp://…`, `https://…` or `ssh://…` as found.
    pub endpoint: String,
    /// Why.
    pub source: EndpointSource,
}

impl DiscoveredEndpoint {
    /// An endpoint with its reason.
    pub fn new(endpoint: impl Into<String>, source: EndpointSource) -> Self {
        DiscoveredEndpoint {
            endpoint: endpoint.into(),
            source,
        }
    }
}

/// Discovery failed (a named context that does not resolve): the problem and its fix, kept
/// as text so configurations holding it stay `Clone + Eq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryError {
    /// What is wrong.
    pub problem: String,
    /// How to fix it.
    pub fix: String,
}

impl DiscoveryError {
    /// As a `Configuration` error.
    pub fn to_error(&self) -> SandboxError {
        SandboxError::config(self.problem.clone(), self.fix.clone())
    }
}

/// Docker's discovery order (see the module docs).
///
/// A context named by `DOCKER_CONTEXT` or `currentContext` that cannot be resolved is an
/// error rather than a fall-through: silently using another engine than the one the user
/// selected would run their code somewhere else.
pub fn discover_docker(
    env: &EnvSnapshot,
) -> std::result::Result<DiscoveredEndpoint, DiscoveryError> {
    if let Some(h) = env.get("DOCKER_HOST") {
        return Ok(DiscoveredEndpoint::new(
            h,
            EndpointSource::EnvVar("DOCKER_HOST".into()),
        ));
    }
    if let Some(found) = docker_context(env)? {
        return Ok(found);
    }
    if let Some(sock) = rootless_socket(env, "docker.sock") {
        return Ok(DiscoveredEndpoint::new(
            sock,
            EndpointSource::RootlessSocket,
        ));
    }
    Ok(DiscoveredEndpoint::new(
        DOCKER_DEFAULT_ENDPOINT,
        EndpointSource::Default,
    ))
}

/// Whether an engine that did not answer at `endpoint` is missing from this machine
/// rather than down: a local socket that does not exist, and none of `binaries` in a
/// directory of `PATH` as `env` has it. A remote endpoint, an existing socket or an
/// installed binary is an engine that is down (`EngineUnavailable`, with the start
/// command), never "not installed".
pub fn engine_missing(endpoint: &str, binaries: &[&str], env: &EnvSnapshot) -> bool {
    let Some(socket) = endpoint.strip_prefix("unix://") else {
        return false;
    };
    if Path::new(socket).exists() {
        return false;
    }
    let path = env.get("PATH").unwrap_or_default();
    !std::env::split_paths(path).any(|dir| binaries.iter().any(|b| dir.join(b).is_file()))
}

/// `e` as `BackendNotInstalled` (hint: `install`) when it says the engine did not answer
/// and the engine is missing from this machine ([`engine_missing`], read from the
/// process environment now); otherwise `e` unchanged. Both adapters call it on connect,
/// so a missing engine reads the same on either.
pub fn unavailable_or_missing(
    e: SandboxError,
    backend: &str,
    endpoint: &str,
    binaries: &[&str],
    install: &str,
) -> SandboxError {
    if e.code() == sandbox_core::ErrorCode::EngineUnavailable
        && engine_missing(endpoint, binaries, &EnvSnapshot::capture())
    {
        return SandboxError::backend_not_installed(backend, install);
    }
    e
}

/// Whether `endpoint` is plain HTTP over TCP (`tcp://` or `http://`, any case): exec
/// bodies, secrets included, would cross the network in the clear, so both adapters
/// refuse it unless the caller allows it for a trusted loopback.
pub fn is_plain_tcp(endpoint: &str) -> bool {
    let e = endpoint.trim();
    ["tcp://", "http://"].iter().any(|scheme| {
        e.get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    })
}

/// Podman's discovery order (see the module docs).
pub fn discover_podman(env: &EnvSnapshot) -> DiscoveredEndpoint {
    if let Some(h) = env.get("CONTAINER_HOST") {
        return DiscoveredEndpoint::new(h, EndpointSource::EnvVar("CONTAINER_HOST".into()));
    }
    // Root's rootless directory is not where a root Podman service listens.
    if !env.is_root()
        && let Some(sock) = rootless_socket(env, "podman/podman.sock")
    {
        return DiscoveredEndpoint::new(sock, EndpointSource::RootlessSocket);
    }
    DiscoveredEndpoint::new(PODMAN_DEFAULT_ENDPOINT, EndpointSource::Default)
}

/// `unix://$XDG_RUNTIME_DIR/<rel>` when that path exists.
fn rootless_socket(env: &EnvSnapshot, rel: &str) -> Option<String> {
    let dir = env.get("XDG_RUNTIME_DIR")?;
    let path = Path::new(dir).join(rel);
    path.exists()
        .then(|| format!("unix://{}", path.to_string_lossy()))
}

/// The endpoint of the current Docker context, `None` for the `default` context or none.
fn docker_context(
    env: &EnvSnapshot,
) -> std::result::Result<Option<DiscoveredEndpoint>, DiscoveryError> {
    let config_dir = env.docker_config_dir();
    let name = match env.get("DOCKER_CONTEXT") {
        Some(n) => n.to_string(),
        None => match config_dir.as_deref().and_then(current_context) {
            Some(n) => n,
            None => return Ok(None),
        },
    };
    // `default` is the CLI's name for "DOCKER_HOST or the default socket": no meta file.
    if name == "default" {
        return Ok(None);
    }
    let not_found = |why: String| {
        DiscoveryError {
        problem: format!("docker context `{name}` cannot be used: {why}"),
        fix: "list contexts with `docker context ls`; select one with `docker context use NAME`, or unset DOCKER_CONTEXT".to_string(),
    }
    };
    let Some(dir) = config_dir else {
        return Err(not_found("neither DOCKER_CONFIG nor HOME is set".into()));
    };
    let meta = dir
        .join("contexts")
        .join("meta")
        .join(context_dir_name(&name))
        .join("meta.json");
    let text = std::fs::read_to_string(&meta)
        .map_err(|e| not_found(format!("{}: {e}", meta.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| not_found(format!("{} is not JSON: {e}", meta.display())))?;
    let host = json
        .pointer("/Endpoints/docker/Host")
        .and_then(|h| h.as_str())
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .ok_or_else(|| not_found(format!("{} has no Endpoints.docker.Host", meta.display())))?;
    Ok(Some(DiscoveredEndpoint::new(
        host,
        EndpointSource::DockerContext(name),
    )))
}

/// `currentContext` of `<dir>/config.json`, if any (an unreadable file means none, as for
/// the CLI, which then uses the default context).
fn current_context(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("currentContext")?
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The Docker CLI stores a context's metadata under the hex SHA-256 of its name.
pub fn context_dir_name(name: &str) -> String {
    Sha256::digest(name.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_tcp_is_told_apart_from_other_schemes() {
        for e in ["tcp://h:2375", " HTTP://h", "Tcp://127.0.0.1:1"] {
            assert!(is_plain_tcp(e), "{e}");
        }
        for e in [
            "https://h",
            "unix:///run/x.sock",
            "ssh://h",
            "tcp:/",
            "",
            "é",
        ] {
            assert!(!is_plain_tcp(e), "{e}");
        }
    }

    #[test]
    fn a_missing_socket_and_binary_is_a_missing_engine() {
        let bin = tempfile::tempdir().unwrap();
        let path = bin.path().to_string_lossy().to_string();
        let env = EnvSnapshot::empty().var("PATH", &path);
        let gone = "unix:///nonexistent/sbx.sock";
        assert!(engine_missing(gone, &["podman"], &env));
        assert!(engine_missing(gone, &["podman"], &EnvSnapshot::empty()));
        std::fs::write(bin.path().join("dockerd"), "").unwrap();
        assert!(
            !engine_missing(gone, &["docker", "dockerd"], &env),
            "installed, down"
        );
        let sock = bin.path().join("engine.sock");
        std::fs::write(&sock, "").unwrap();
        let here = format!("unix://{}", sock.display());
        assert!(!engine_missing(&here, &["podman"], &env), "socket exists");
        assert!(
            !engine_missing("tcp://127.0.0.1:2375", &["podman"], &env),
            "remote"
        );
    }

    #[test]
    fn context_dir_name_is_sha256_hex() {
        // sha256("abc") from FIPS 180-2.
        assert_eq!(
            context_dir_name("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn empty_variable_counts_as_unset() {
        let env = EnvSnapshot::empty().var("DOCKER_HOST", "  ");
        assert_eq!(env.get("DOCKER_HOST"), None);
        assert_eq!(
            discover_docker(&env).unwrap().source,
            EndpointSource::Default
        );
    }
}
