//! What an engine call can fail with: a kind the container layer maps to the right
//! `SandboxError` for the operation, a bounded message, and the adapter's own error kept
//! as the source. Mapping an engine client's errors into these is each adapter's
//! `error.rs`; mapping these into `SandboxError` is the container layer's (`src/error.rs`).

use std::fmt;

use sandbox_core::BoxError;

/// Result of one engine call.
pub type EngineResult<T> = std::result::Result<T, EngineError>;

/// What kind of failure an engine call met; the container layer turns it into the right
/// `SandboxError` for the operation (a `NotFound` on exec is `SandboxGone`, on an archive
/// read it is `PathNotFound`, on create it is a missing image).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineErrorKind {
    /// The container, exec, path or image does not exist.
    NotFound,
    /// The object is in a state that refuses the call (already removing, not running…).
    Conflict,
    /// The engine cannot be reached (socket missing, connection refused or reset).
    Unavailable,
    /// The engine did not answer in time.
    Timeout,
    /// The engine refused the request as invalid (bad create body, unknown runtime…).
    InvalidRequest,
    /// A registry refused the pull's credentials, or demanded some and got none.
    Unauthorized,
    /// Anything else; the message and source say what.
    Other,
}

impl EngineErrorKind {
    /// The kind of an engine's HTTP error status, as Docker's and Podman's APIs use them:
    /// 404 `NotFound`, 409 `Conflict`, 400 `InvalidRequest`, anything else `Other` (a 500
    /// is read from its message by the adapter, if at all; a 401/403 comes from the
    /// engine's own authorisation, not a registry, so it is not `Unauthorized`).
    pub fn from_status(status: u16) -> EngineErrorKind {
        match status {
            404 => EngineErrorKind::NotFound,
            409 => EngineErrorKind::Conflict,
            400 => EngineErrorKind::InvalidRequest,
            _ => EngineErrorKind::Other,
        }
    }
}

/// An engine failure, as the adapter's `error.rs` describes it. Never shown to users as
/// is: the container layer wraps it into a `SandboxError` and keeps it as the `source`.
pub struct EngineError {
    /// The kind, which decides the `SandboxError` variant.
    pub kind: EngineErrorKind,
    /// The engine's message (bounded by the adapter; never contains secrets).
    pub message: String,
    /// The engine crate's error, kept for the source chain.
    pub source: Option<BoxError>,
}

impl EngineError {
    /// An error of `kind` with a message.
    pub fn new(kind: EngineErrorKind, message: impl Into<String>) -> Self {
        EngineError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// The same error with the engine crate's error as its source.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }
}

impl fmt::Debug for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .finish()
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Engine text as an [`EngineError`] message may quote it (the engine may echo what the
/// sandbox or the caller sent): one line, control characters blanked, at most 300
/// characters.
pub fn engine_text(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect()
}
