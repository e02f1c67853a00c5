//! The one error type of sandbox-rs.
//!
//! Every variant answers [`SandboxError::code`], [`SandboxError::hint`] and
//! [`SandboxError::url`]. Adapters map every engine error into a variant and keep it as
//! the `source`. Messages never contain secrets, env values or user code.

use std::time::Duration;

use crate::{Capability, ErrorCode};

/// A boxed error kept as the source of a [`SandboxError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used across sandbox-rs.
pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// Everything that can go wrong. Match on [`SandboxError::code`] for stable handling.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// An option or setting is invalid; raised before anything is provisioned.
    #[error("invalid configuration: {message}")]
    #[non_exhaustive]
    Configuration {
        /// What is wrong.
        message: String,
        /// The exact fix.
        hint: Option<String>,
    },
    /// The DSN scheme names no compiled-in or registered backend.
    #[error("no backend for scheme `{scheme}` (available: {})", available.join(", "))]
    #[non_exhaustive]
    BackendNotFound {
        /// The scheme asked for.
        scheme: String,
        /// Schemes this build knows.
        available: Vec<String>,
        /// The cargo feature that adds the scheme, when it is a known first-party one.
        feature: Option<String>,
    },
    /// The engine behind a compiled-in backend is not installed.
    #[error("backend `{backend}` is not installed on this host")]
    #[non_exhaustive]
    BackendNotInstalled {
        /// Backend name.
        backend: String,
        /// Install command.
        hint: String,
    },
    /// The engine's API did not answer.
    #[error("engine `{backend}` unavailable at {endpoint}")]
    #[non_exhaustive]
    EngineUnavailable {
        /// Backend name.
        backend: String,
        /// The socket or URL tried.
        endpoint: String,
        /// The exact start command.
        hint: String,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The operation needs a capability the sandbox does not declare.
    #[error(
        "capability {capability} is not supported by backend `{backend}`{}",
        supported_by_text(supported_by)
    )]
    #[non_exhaustive]
    CapabilityNotSupported {
        /// The missing capability.
        capability: Capability,
        /// Backend that refused.
        backend: String,
        /// First-party backends that have it.
        supported_by: Vec<String>,
    },
    /// The engine failed to create or start the sandbox.
    #[error("creating a sandbox on `{backend}` failed: {message}")]
    #[non_exhaustive]
    Creation {
        /// Backend name.
        backend: String,
        /// What failed.
        message: String,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// `connect` found no live sandbox, or a kill could not reach the engine.
    #[error("sandbox `{id}`: {message}")]
    #[non_exhaustive]
    Connect {
        /// Sandbox id.
        id: String,
        /// What failed.
        message: String,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The template image is not on the engine and could not be pulled (no such image in
    /// the registry, registry unreachable, or pull policy `never`).
    #[error("image `{image}` is unavailable (registry {registry}): {message}")]
    #[non_exhaustive]
    ImageUnavailable {
        /// The image reference as given.
        image: String,
        /// The registry it is pulled from (`docker.io` for short names).
        registry: String,
        /// What failed.
        message: String,
        /// The exact fix.
        hint: String,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The sandbox did not become usable in time.
    #[error("creating a sandbox on `{backend}` timed out after {after:?}")]
    #[non_exhaustive]
    CreateTimeout {
        /// Backend name.
        backend: String,
        /// Time waited.
        after: Duration,
    },
    /// The sandbox no longer exists.
    #[error("sandbox `{id}` is gone (killed or past its lifetime)")]
    #[non_exhaustive]
    SandboxGone {
        /// Sandbox id.
        id: String,
        /// The engine's error, when one said so.
        #[source]
        source: Option<BoxError>,
    },
    /// The sandbox is paused: only `resume` and `kill` are accepted.
    #[error("sandbox `{id}` is paused: resume it before using it")]
    #[non_exhaustive]
    SandboxPaused {
        /// Sandbox id.
        id: String,
    },
    /// The sandbox is stopped: only `start`, `kill` and a snapshot are accepted.
    #[error("sandbox `{id}` is stopped: start it before using it")]
    #[non_exhaustive]
    SandboxStopped {
        /// Sandbox id.
        id: String,
    },
    /// A command exited non-zero (from `raise_for_status`).
    #[error("command exited with status {exit_code}")]
    #[non_exhaustive]
    Execution {
        /// The exit code.
        exit_code: i64,
        /// The captured stderr (never part of the message).
        stderr: bytes::Bytes,
    },
    /// A command ran past its timeout; its process tree was killed.
    #[error("execution timed out after {after:?}")]
    #[non_exhaustive]
    ExecutionTimeout {
        /// The timeout.
        after: Duration,
    },
    /// `run_code` needs an interpreter the template lacks.
    #[error("interpreter `{interpreter}` not found in template `{template}`")]
    #[non_exhaustive]
    InterpreterMissing {
        /// Interpreter looked for.
        interpreter: String,
        /// Template (image) of the sandbox.
        template: String,
    },
    /// Network access outside the policy.
    #[error("network policy violation: {message}")]
    #[non_exhaustive]
    NetworkPolicyViolation {
        /// What was refused.
        message: String,
    },
    /// A named limit was reached.
    #[error("resource limit exceeded: {limit}")]
    #[non_exhaustive]
    ResourceLimitExceeded {
        /// The limit, e.g. `"stdout buffer (64 MiB)"`.
        limit: String,
        /// How to raise it.
        hint: Option<String>,
    },
    /// A credential is missing or rejected.
    #[error("authentication failed{}; set {env_var}", detail_text(detail))]
    #[non_exhaustive]
    Auth {
        /// The environment variable that carries the credential (or names where it is
        /// read from, e.g. `DOCKER_CONFIG`).
        env_var: String,
        /// Who refused what (e.g. the registry and image), never the credential.
        detail: Option<String>,
        /// The exact fix, when more specific than setting `env_var`.
        hint: Option<String>,
    },
    /// Rate limited by the provider.
    #[error("rate limited by `{backend}`")]
    #[non_exhaustive]
    RateLimit {
        /// Backend name.
        backend: String,
        /// Suggested wait.
        retry_after: Option<Duration>,
    },
    /// The audit sink failed.
    #[error("audit sink failed: {message}")]
    #[non_exhaustive]
    AuditSink {
        /// What failed.
        message: String,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// A sandbox file operation failed.
    #[error("file operation on `{path}` failed: {message}")]
    #[non_exhaustive]
    FileSystem {
        /// Sandbox path.
        path: String,
        /// What failed.
        message: String,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The sandbox path does not exist.
    #[error("path not found: `{path}`")]
    #[non_exhaustive]
    PathNotFound {
        /// Sandbox path.
        path: String,
        /// The engine's error, when one said so.
        #[source]
        source: Option<BoxError>,
    },
    /// A file operation was given a directory.
    #[error("`{path}` is a directory")]
    #[non_exhaustive]
    IsADirectory {
        /// Sandbox path.
        path: String,
        /// The engine's error, when one said so.
        #[source]
        source: Option<BoxError>,
    },
    /// A downloaded archive tried to write outside its target.
    #[error("unsafe archive entry `{entry}` refused")]
    #[non_exhaustive]
    UnsafeArchiveEntry {
        /// The entry name.
        entry: String,
    },
    /// Any other engine error; the source is kept.
    #[error("engine `{backend}` error: {message}")]
    #[non_exhaustive]
    Engine {
        /// Backend name.
        backend: String,
        /// What failed.
        message: String,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
}

fn detail_text(d: &Option<String>) -> String {
    d.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
}

fn supported_by_text(v: &[String]) -> String {
    if v.is_empty() {
        String::new()
    } else {
        format!(" (supported by: {})", v.join(", "))
    }
}

impl SandboxError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        use SandboxError::*;
        match self {
            Configuration { .. } => ErrorCode::Configuration,
            BackendNotFound { .. } => ErrorCode::BackendNotFound,
            BackendNotInstalled { .. } => ErrorCode::BackendNotInstalled,
            EngineUnavailable { .. } => ErrorCode::EngineUnavailable,
            CapabilityNotSupported { .. } => ErrorCode::CapabilityNotSupported,
            Creation { .. } => ErrorCode::Creation,
            Connect { .. } => ErrorCode::Connect,
            ImageUnavailable { .. } => ErrorCode::ImageUnavailable,
            CreateTimeout { .. } => ErrorCode::CreateTimeout,
            SandboxGone { .. } => ErrorCode::SandboxGone,
            SandboxPaused { .. } => ErrorCode::SandboxPaused,
            SandboxStopped { .. } => ErrorCode::SandboxStopped,
            Execution { .. } => ErrorCode::Execution,
            ExecutionTimeout { .. } => ErrorCode::ExecutionTimeout,
            InterpreterMissing { .. } => ErrorCode::InterpreterMissing,
            NetworkPolicyViolation { .. } => ErrorCode::NetworkPolicyViolation,
            ResourceLimitExceeded { .. } => ErrorCode::ResourceLimitExceeded,
            Auth { .. } => ErrorCode::Auth,
            RateLimit { .. } => ErrorCode::RateLimit,
            AuditSink { .. } => ErrorCode::AuditSink,
            FileSystem { .. } => ErrorCode::FileSystem,
            PathNotFound { .. } => ErrorCode::PathNotFound,
            IsADirectory { .. } => ErrorCode::IsADirectory,
            UnsafeArchiveEntry { .. } => ErrorCode::UnsafeArchiveEntry,
            Engine { .. } => ErrorCode::Engine,
        }
    }

    /// The exact fix, as a command where one exists.
    pub fn hint(&self) -> String {
        use SandboxError::*;
        match self {
            Configuration { hint: Some(h), .. } => h.clone(),
            BackendNotFound {
                feature: Some(f), ..
            } => format!(
                "enable the `{f}` cargo feature of the `sandbox` crate, or use one of: {}",
                self.available_schemes().join(", ")
            ),
            BackendNotInstalled { hint, .. }
            | EngineUnavailable { hint, .. }
            | ImageUnavailable { hint, .. }
            | Auth {
                hint: Some(hint), ..
            } => hint.clone(),
            CapabilityNotSupported {
                capability,
                supported_by,
                ..
            } if *capability == Capability::AGENT => format!(
                "leave CreateOptions::require_agent unset (`--allow-engine-exec` on the CLI) to \
                 accept a sandbox without the agent, or use a backend whose agent is on{}",
                if supported_by.is_empty() {
                    " (Docker or Podman, with SBX_AGENT unset and ContainerConfig::agent(true), on x86_64)"
                        .to_string()
                } else {
                    format!(
                        " ({}, with SBX_AGENT unset and ContainerConfig::agent(true), on x86_64)",
                        supported_by.join(", ")
                    )
                }
            ),
            CapabilityNotSupported {
                capability,
                supported_by,
                ..
            } if *capability == Capability::SNAPSHOT => format!(
                "a sandbox created with resources.disk_mb keeps its writable places outside its \
                 filesystem and cannot be snapshotted: create it without disk_mb{}",
                if supported_by.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", on a backend that declares SNAPSHOT ({})",
                        supported_by.join(", ")
                    )
                }
            ),
            CapabilityNotSupported {
                capability,
                supported_by,
                ..
            } if !supported_by.is_empty() => format!(
                "use a backend that declares {capability}: {}",
                supported_by.join(", ")
            ),
            Connect { id, .. } => format!(
                "list managed sandboxes with `sandbox reap`; remove this one with `sandbox reap --kill --id {id}`"
            ),
            ResourceLimitExceeded { hint: Some(h), .. } => h.clone(),
            Auth { env_var, .. } => format!("export {env_var}=<credential>"),
            _ => self.code().doc().fix.to_string(),
        }
    }

    /// The documentation page of this error's code.
    pub fn url(&self) -> String {
        self.code().url()
    }

    /// Whether this is a timeout (`CreateTimeout` or `ExecutionTimeout`).
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            SandboxError::CreateTimeout { .. } | SandboxError::ExecutionTimeout { .. }
        )
    }

    fn available_schemes(&self) -> Vec<String> {
        match self {
            SandboxError::BackendNotFound { available, .. } => available.clone(),
            _ => vec![],
        }
    }

    /// A [`SandboxError::Configuration`] with the exact fix.
    pub fn config(message: impl Into<String>, hint: impl Into<String>) -> Self {
        SandboxError::Configuration {
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    /// A [`SandboxError::Configuration`] without a specific hint (the code's general fix
    /// is shown).
    pub fn configuration(message: impl Into<String>) -> Self {
        SandboxError::Configuration {
            message: message.into(),
            hint: None,
        }
    }

    /// A [`SandboxError::BackendNotFound`]; `feature` is the cargo feature that adds a known
    /// first-party scheme.
    pub fn backend_not_found(
        scheme: impl Into<String>,
        available: Vec<String>,
        feature: Option<String>,
    ) -> Self {
        SandboxError::BackendNotFound {
            scheme: scheme.into(),
            available,
            feature,
        }
    }

    /// A [`SandboxError::BackendNotInstalled`] with the install command.
    pub fn backend_not_installed(backend: impl Into<String>, hint: impl Into<String>) -> Self {
        SandboxError::BackendNotInstalled {
            backend: backend.into(),
            hint: hint.into(),
        }
    }

    /// A [`SandboxError::EngineUnavailable`] with the exact start command.
    pub fn engine_unavailable(
        backend: impl Into<String>,
        endpoint: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        SandboxError::EngineUnavailable {
            backend: backend.into(),
            endpoint: endpoint.into(),
            hint: hint.into(),
            source: None,
        }
    }

    /// A [`SandboxError::CapabilityNotSupported`] naming `capability`. Which backends have
    /// it is filled in by the facade's enforcement layer (core knows no first-party list).
    pub fn unsupported(capability: Capability, backend: impl Into<String>) -> Self {
        SandboxError::CapabilityNotSupported {
            capability,
            backend: backend.into(),
            supported_by: Vec::new(),
        }
    }

    /// A [`SandboxError::CapabilityNotSupported`] with the backends known to have it.
    pub fn capability_not_supported(
        capability: Capability,
        backend: impl Into<String>,
        supported_by: Vec<String>,
    ) -> Self {
        SandboxError::CapabilityNotSupported {
            capability,
            backend: backend.into(),
            supported_by,
        }
    }

    /// A [`SandboxError::Creation`].
    pub fn creation(backend: impl Into<String>, message: impl Into<String>) -> Self {
        SandboxError::Creation {
            backend: backend.into(),
            message: message.into(),
            source: None,
        }
    }

    /// A [`SandboxError::Connect`].
    pub fn connect(id: impl Into<String>, message: impl Into<String>) -> Self {
        SandboxError::Connect {
            id: id.into(),
            message: message.into(),
            source: None,
        }
    }

    /// A [`SandboxError::CreateTimeout`].
    pub fn create_timeout(backend: impl Into<String>, after: Duration) -> Self {
        SandboxError::CreateTimeout {
            backend: backend.into(),
            after,
        }
    }

    /// A [`SandboxError::SandboxGone`].
    pub fn gone(id: impl Into<String>) -> Self {
        SandboxError::SandboxGone {
            id: id.into(),
            source: None,
        }
    }

    /// A [`SandboxError::SandboxPaused`].
    pub fn paused(id: impl Into<String>) -> Self {
        SandboxError::SandboxPaused { id: id.into() }
    }

    /// A [`SandboxError::SandboxStopped`].
    pub fn stopped(id: impl Into<String>) -> Self {
        SandboxError::SandboxStopped { id: id.into() }
    }

    /// A [`SandboxError::Execution`] (what `raise_for_status` returns).
    pub fn execution(exit_code: i64, stderr: impl Into<bytes::Bytes>) -> Self {
        SandboxError::Execution {
            exit_code,
            stderr: stderr.into(),
        }
    }

    /// A [`SandboxError::ExecutionTimeout`].
    pub fn execution_timeout(after: Duration) -> Self {
        SandboxError::ExecutionTimeout { after }
    }

    /// A [`SandboxError::InterpreterMissing`].
    pub fn interpreter_missing(
        interpreter: impl Into<String>,
        template: impl Into<String>,
    ) -> Self {
        SandboxError::InterpreterMissing {
            interpreter: interpreter.into(),
            template: template.into(),
        }
    }

    /// A [`SandboxError::NetworkPolicyViolation`].
    pub fn network_policy_violation(message: impl Into<String>) -> Self {
        SandboxError::NetworkPolicyViolation {
            message: message.into(),
        }
    }

    /// A [`SandboxError::ResourceLimitExceeded`] naming the limit, with how to raise it.
    pub fn resource_limit(limit: impl Into<String>, hint: Option<String>) -> Self {
        SandboxError::ResourceLimitExceeded {
            limit: limit.into(),
            hint,
        }
    }

    /// A [`SandboxError::ResourceLimitExceeded`] for a sandbox whose pids limit is
    /// exhausted (`detail` says what could not start and the numbers), with the way back.
    pub fn pids_exhausted(detail: impl std::fmt::Display) -> Self {
        SandboxError::resource_limit(
            format!("pids: {detail}"),
            Some(
                "processes still running in the sandbox (left behind by earlier commands) \
                 hold every pid; end them with Sandbox::reset_processes (files are kept), or \
                 create the sandbox with a higher Resources::pids"
                    .into(),
            ),
        )
    }

    /// A [`SandboxError::Auth`] naming the environment variable of the credential.
    pub fn auth(env_var: impl Into<String>) -> Self {
        SandboxError::Auth {
            env_var: env_var.into(),
            detail: None,
            hint: None,
        }
    }

    /// A [`SandboxError::Auth`] saying who refused what (`detail`, never the credential)
    /// and the exact fix.
    pub fn auth_refused(
        env_var: impl Into<String>,
        detail: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        SandboxError::Auth {
            env_var: env_var.into(),
            detail: Some(detail.into()),
            hint: Some(hint.into()),
        }
    }

    /// A [`SandboxError::ImageUnavailable`] (no backend field: the variant stays within the
    /// size clippy allows an `Err`): `image` from `registry` could not be had, for
    /// the reason `message`; `hint` is the exact fix.
    pub fn image_unavailable(
        image: impl Into<String>,
        registry: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        SandboxError::ImageUnavailable {
            image: image.into(),
            registry: registry.into(),
            message: message.into(),
            hint: hint.into(),
            source: None,
        }
    }

    /// A [`SandboxError::RateLimit`].
    pub fn rate_limit(backend: impl Into<String>, retry_after: Option<Duration>) -> Self {
        SandboxError::RateLimit {
            backend: backend.into(),
            retry_after,
        }
    }

    /// A [`SandboxError::AuditSink`].
    pub fn audit_sink(message: impl Into<String>) -> Self {
        SandboxError::AuditSink {
            message: message.into(),
            source: None,
        }
    }

    /// A [`SandboxError::FileSystem`].
    pub fn file_system(path: impl Into<String>, message: impl Into<String>) -> Self {
        SandboxError::FileSystem {
            path: path.into(),
            message: message.into(),
            source: None,
        }
    }

    /// A [`SandboxError::PathNotFound`].
    pub fn path_not_found(path: impl Into<String>) -> Self {
        SandboxError::PathNotFound {
            path: path.into(),
            source: None,
        }
    }

    /// A [`SandboxError::IsADirectory`].
    pub fn is_a_directory(path: impl Into<String>) -> Self {
        SandboxError::IsADirectory {
            path: path.into(),
            source: None,
        }
    }

    /// A [`SandboxError::UnsafeArchiveEntry`].
    pub fn unsafe_archive_entry(entry: impl Into<String>) -> Self {
        SandboxError::UnsafeArchiveEntry {
            entry: entry.into(),
        }
    }

    /// A [`SandboxError::Engine`] (any engine error no more specific code describes).
    pub fn engine(backend: impl Into<String>, message: impl Into<String>) -> Self {
        SandboxError::Engine {
            backend: backend.into(),
            message: message.into(),
            source: None,
        }
    }

    /// Keeps `source` as the underlying error, on every variant that carries one
    /// (`EngineUnavailable`, `Creation`, `ImageUnavailable`, `Connect`, `SandboxGone`, `AuditSink`,
    /// `FileSystem`, `PathNotFound`, `IsADirectory`, `Engine`); other variants are
    /// returned unchanged.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        use SandboxError::*;
        match &mut self {
            EngineUnavailable { source: s, .. }
            | Creation { source: s, .. }
            | ImageUnavailable { source: s, .. }
            | Connect { source: s, .. }
            | SandboxGone { source: s, .. }
            | AuditSink { source: s, .. }
            | FileSystem { source: s, .. }
            | PathNotFound { source: s, .. }
            | IsADirectory { source: s, .. }
            | Engine { source: s, .. } => *s = Some(source.into()),
            _ => {}
        }
        self
    }

    /// A one-line rendering with code, message and hint, for CLIs and logs:
    /// `SBX_E1204: sandbox `x` is gone … (hint: …)`.
    pub fn render(&self) -> String {
        format!("{}: {} (hint: {})", self.code(), self, self.hint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<SandboxError> {
        vec![
            SandboxError::config("timeout must be positive", "set a timeout above zero"),
            SandboxError::BackendNotFound {
                scheme: "podman".into(),
                available: vec!["docker".into(), "fake".into()],
                feature: Some("podman".into()),
            },
            SandboxError::EngineUnavailable {
                backend: "docker".into(),
                endpoint: "unix:///var/run/docker.sock".into(),
                hint: "sudo cargo xtask setup".into(),
                source: None,
            },
            SandboxError::capability_not_supported(
                Capability::EGRESS_ALLOWLIST,
                "docker",
                vec!["fake".into()],
            ),
            SandboxError::gone("abc"),
            SandboxError::Execution {
                exit_code: 3,
                stderr: bytes::Bytes::from_static(b"secret stderr"),
            },
            SandboxError::ExecutionTimeout {
                after: Duration::from_millis(1500),
            },
            SandboxError::path_not_found("/work/x"),
            SandboxError::Connect {
                id: "abc".into(),
                message: "kill failed".into(),
                source: None,
            },
            SandboxError::image_unavailable(
                "127.0.0.1:5000/nope:1",
                "127.0.0.1:5000",
                "the registry has no such image",
                "check the name and tag",
            ),
            SandboxError::auth_refused(
                "DOCKER_CONFIG",
                "registry 127.0.0.1:5000 refused the credentials for `x`",
                "docker login 127.0.0.1:5000",
            ),
        ]
    }

    #[test]
    fn rendering_is_stable() {
        let rendered: Vec<String> = samples().iter().map(|e| e.render()).collect();
        insta::assert_snapshot!(rendered.join("\n"));
    }

    #[test]
    fn execution_message_hides_stderr() {
        let e = &samples()[5];
        assert!(!e.to_string().contains("secret"));
        assert_eq!(e.code().as_str(), "SBX_E1301");
    }

    #[test]
    fn timeouts_are_timeouts() {
        assert!(samples()[6].is_timeout());
        assert!(!samples()[4].is_timeout());
    }

    #[test]
    fn source_chain_is_kept() {
        let io = std::io::Error::other("socket closed");
        let e = SandboxError::engine("docker", "inspect failed").with_source(io);
        let src = std::error::Error::source(&e).expect("source kept");
        assert_eq!(src.to_string(), "socket closed");
    }

    #[test]
    fn engine_source_is_kept_on_gone_and_file_errors() {
        for e in [
            SandboxError::gone("abc"),
            SandboxError::path_not_found("/x"),
            SandboxError::is_a_directory("/x"),
        ] {
            let code = e.code();
            let e = e.with_source(std::io::Error::other("engine said 404"));
            assert_eq!(e.code(), code);
            let src = std::error::Error::source(&e).expect("source kept");
            assert_eq!(src.to_string(), "engine said 404");
        }
    }

    #[test]
    fn with_source_leaves_sourceless_variants_alone() {
        let e = SandboxError::execution_timeout(Duration::from_secs(1))
            .with_source(std::io::Error::other("x"));
        assert!(std::error::Error::source(&e).is_none());
        assert!(e.is_timeout());
    }
}
