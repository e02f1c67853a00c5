//! The only place that sees `podman-api` errors (the REST bypass makes its own
//! [`EngineError`]s): mapping them into
//! `sandbox-container`'s [`EngineError`], and keeping the crate's panics from ever reaching
//! a caller.
//!
//! podman-api 0.11's frame decoder `panic!`s on a stream number it does not know
//! (`containers_api::conn::tty::decode_chunk`); every crate call the engine makes goes
//! through `sandbox_container::transfer` (`bounded_call` for futures, also bounded in
//! time; `unwind_safe` for streams), which turns such a panic into an error.

use sandbox_container::engine::engine_text as bounded;
use sandbox_container::{EngineError, EngineErrorKind};
use sandbox_core::{BoxError, SandboxError};

/// Backend name used in every error.
pub(crate) const BACKEND: &str = "podman";

/// Start command printed in `EngineUnavailable` hints.
pub(crate) const START_HINT: &str = "sudo cargo xtask setup podman   # or: mkdir -p /run/podman && podman system service --time=0 unix:///run/podman/podman.sock &";

/// A podman-api error kept as a `source` (podman-api's error is `Send + Sync`).
fn boxed(e: podman_api::Error) -> BoxError {
    Box::new(e)
}

/// HTTP status of a podman-api error, when the engine answered with one.
fn status_of(e: &podman_api::Error) -> Option<u16> {
    match e {
        podman_api::Error::Fault { code, .. } => Some(code.as_u16()),
        _ => None,
    }
}

/// Whether the error means the container exists no more or is no longer running:
/// 404, or 409/500 "container is not running / stopped" from exec create.
fn is_gone(e: &podman_api::Error) -> bool {
    match status_of(e) {
        Some(404) => true,
        Some(409) | Some(500) => {
            let m = e.to_string().to_ascii_lowercase();
            m.contains("not running")
                || m.contains("stopped")
                || m.contains("no such container")
                || m.contains("exited")
                || m.contains("improper state")
                || m.contains("being removed")
        }
        _ => false,
    }
}

/// Whether the engine could not be reached at all (transport error).
fn is_transport(e: &podman_api::Error) -> bool {
    matches!(e, podman_api::Error::Error(_) | podman_api::Error::IO(_))
}

/// The [`EngineErrorKind`] of a podman-api error.
pub(crate) fn kind_of(e: &podman_api::Error) -> EngineErrorKind {
    match status_of(e) {
        Some(500) if is_gone(e) => EngineErrorKind::Conflict,
        Some(status) => EngineErrorKind::from_status(status),
        None if is_transport(e) => EngineErrorKind::Unavailable,
        None => EngineErrorKind::Other,
    }
}

/// A podman-api error as an [`EngineError`], the source kept.
pub(crate) fn from_api(what: &str, e: podman_api::Error) -> EngineError {
    EngineError::new(kind_of(&e), bounded(&format!("{what}: {e}"))).with_source(boxed(e))
}

/// An error of a multiplexed connection (exec output) as an [`EngineError`]. An I/O
/// error is kept as the source itself (podman-api's wrappers are transparent and would
/// hide it), so the container layer can tell a peer's reset from other failures.
pub(crate) fn from_conn(what: &str, e: podman_api::conn::Error) -> EngineError {
    match e {
        podman_api::conn::Error::IO(io) => EngineError::new(
            EngineErrorKind::Unavailable,
            bounded(&format!("{what}: {io}")),
        )
        .with_source(io),
        e => from_api(what, podman_api::Error::from(e)),
    }
}

/// A refusal of this adapter's own checks (options, spec assembly) as an [`EngineError`].
pub(crate) fn refused(what: &str, e: SandboxError) -> EngineError {
    EngineError::new(
        EngineErrorKind::InvalidRequest,
        bounded(&format!("{what}: {e}; {}", e.hint())),
    )
    .with_source(e)
}

/// An engine error outside the container layer (connect's ping, `engine_env`) as a
/// `SandboxError`: unreachable or wedged engine → `EngineUnavailable` with the start
/// command, anything else → `Engine`, the source kept.
pub(crate) fn to_sandbox_error(endpoint: &str, what: &str, e: EngineError) -> SandboxError {
    match e.kind {
        EngineErrorKind::Unavailable | EngineErrorKind::Timeout => {
            SandboxError::engine_unavailable(BACKEND, endpoint, START_HINT).with_source(e)
        }
        _ => SandboxError::engine(BACKEND, format!("{what} failed")).with_source(e),
    }
}
