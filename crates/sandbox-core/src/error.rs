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
    Configuration {
        /// What is wrong.
        message: String,
        /// The exact fix.
        hint: Option<String>,
    },
    /// The DSN scheme names no compiled-in or registered backend.
    #[error("no backend for scheme `{scheme}` (available: {})", available.join(", "))]
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
    BackendNotInstalled {
        /// Backend name.
        backend: String,
        /// Install command.
        hint: String,
    },
    /// The engine's API did not answer.
    #[error("engine `{backend}` unavailable at {endpoint}")]
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
    Connect {
        /// Sandbox id.
        id: String,
        /// What failed.
        message: String,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The sandbox did not become usable in time.
    #[error("creating a sandbox on `{backend}` timed out after {after:?}")]
    CreateTimeout {
        /// Backend name.
        backend: String,
        /// Time waited.
        after: Duration,
    },
    /// The sandbox no longer exists.
    #[error("sandbox `{id}` is gone (killed or past its lifetime)")]
    SandboxGone {
        /// Sandbox id.
        id: String,
    },
    /// A command exited non-zero (from `raise_for_status`).
    #[error("command exited with status {exit_code}")]
    Execution {
        /// The exit code.
        exit_code: i64,
        /// The captured stderr (never part of the message).
        stderr: bytes::Bytes,
    },
    /// A command ran past its timeout; its process tree was killed.
    #[error("execution timed out after {after:?}")]
    ExecutionTimeout {
        /// The timeout.
        after: Duration,
    },
    /// `run_code` needs an interpreter the template lacks.
    #[error("interpreter `{interpreter}` not found in template `{template}`")]
    InterpreterMissing {
        /// Interpreter looked for.
        interpreter: String,
        /// Template (image) of the sandbox.
        template: String,
    },
    /// Network access outside the policy.
    #[error("network policy violation: {message}")]
    NetworkPolicyViolation {
        /// What was refused.
        message: String,
    },
    /// A named limit was reached.
    #[error("resource limit exceeded: {limit}")]
    ResourceLimitExceeded {
        /// The limit, e.g. `"stdout buffer (64 MiB)"`.
        limit: String,
        /// How to raise it.
        hint: Option<String>,
    },
    /// A credential is missing or rejected.
    #[error("authentication failed; set {env_var}")]
    Auth {
        /// The environment variable that carries the credential.
        env_var: String,
    },
    /// Rate limited by the provider.
    #[error("rate limited by `{backend}`")]
    RateLimit {
        /// Backend name.
        backend: String,
        /// Suggested wait.
        retry_after: Option<Duration>,
    },
    /// The audit sink failed.
    #[error("audit sink failed: {message}")]
    AuditSink {
        /// What failed.
        message: String,
        /// Underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// A sandbox file operation failed.
    #[error("file operation on `{path}` failed: {message}")]
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
    PathNotFound {
        /// Sandbox path.
        path: String,
    },
    /// A file operation was given a directory.
    #[error("`{path}` is a directory")]
    IsADirectory {
        /// Sandbox path.
        path: String,
    },
    /// A downloaded archive tried to write outside its target.
    #[error("unsafe archive entry `{entry}` refused")]
    UnsafeArchiveEntry {
        /// The entry name.
        entry: String,
    },
    /// Any other engine error; the source is kept.
    #[error("engine `{backend}` error: {message}")]
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
            CreateTimeout { .. } => ErrorCode::CreateTimeout,
            SandboxGone { .. } => ErrorCode::SandboxGone,
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
            BackendNotInstalled { hint, .. } | EngineUnavailable { hint, .. } => hint.clone(),
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
            Auth { env_var } => format!("export {env_var}=<credential>"),
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

    /// Shorthand for a [`SandboxError::Configuration`] with a hint.
    pub fn config(message: impl Into<String>, hint: impl Into<String>) -> Self {
        SandboxError::Configuration {
            message: message.into(),
            hint: Some(hint.into()),
        }
    }

    /// Shorthand for [`SandboxError::CapabilityNotSupported`], filling in the first-party
    /// backends known to declare `capability`.
    pub fn unsupported(capability: Capability, backend: impl Into<String>) -> Self {
        SandboxError::CapabilityNotSupported {
            capability,
            backend: backend.into(),
            supported_by: first_party_support(capability),
        }
    }

    /// A one-line rendering with code, message and hint, for CLIs and logs:
    /// `SBX_E1204: sandbox `x` is gone … (hint: …)`.
    pub fn render(&self) -> String {
        format!("{}: {} (hint: {})", self.code(), self, self.hint())
    }
}

/// First-party backends that declare a capability (used in `CapabilityNotSupported`).
pub fn first_party_support(capability: Capability) -> Vec<String> {
    let container = Capability::RUN_COMMAND
        | Capability::RUN_CODE
        | Capability::STATEFUL_CODE
        | Capability::STREAMING
        | Capability::FILESYSTEM
        | Capability::UPLOAD_DOWNLOAD
        | Capability::NETWORK_POLICY
        | Capability::INGRESS_PORTS;
    let fake = container | Capability::EGRESS_ALLOWLIST;
    let mut out = Vec::new();
    for (name, caps) in [("docker", container), ("podman", container), ("fake", fake)] {
        if !capability.is_empty() && caps.contains(capability) {
            out.push(name.to_string());
        }
    }
    out
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
            SandboxError::unsupported(Capability::EGRESS_ALLOWLIST, "docker"),
            SandboxError::SandboxGone { id: "abc".into() },
            SandboxError::Execution {
                exit_code: 3,
                stderr: bytes::Bytes::from_static(b"secret stderr"),
            },
            SandboxError::ExecutionTimeout {
                after: Duration::from_millis(1500),
            },
            SandboxError::PathNotFound {
                path: "/work/x".into(),
            },
            SandboxError::Connect {
                id: "abc".into(),
                message: "kill failed".into(),
                source: None,
            },
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
        let e = SandboxError::Engine {
            backend: "docker".into(),
            message: "inspect failed".into(),
            source: Some(Box::new(io)),
        };
        let src = std::error::Error::source(&e).expect("source kept");
        assert_eq!(src.to_string(), "socket closed");
    }
}
