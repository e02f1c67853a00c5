//! The only place that sees `podman-api` errors (the REST bypass makes its own
//! [`EngineError`]s): mapping them into
//! `sandbox-container`'s [`EngineError`], and keeping the crate's panics from ever reaching
//! a caller.
//!
//! podman-api 0.11's frame decoder `panic!`s on a stream number it does not know
//! (`containers_api::conn::tty::decode_chunk`): the multiplexed streams (exec, attach) go
//! through the REST bypass and the container layer's own demultiplexer instead, and every
//! other crate call runs under `sandbox_container::engine::transfer::bounded_call` (also bounded
//! in time), which turns a panic into an error.

use sandbox_container::engine::engine_text as bounded;
use sandbox_container::{EngineError, EngineErrorKind};
use sandbox_core::{BoxError, SandboxError};

/// Backend name used in every error.
pub(crate) const BACKEND: &str = "podman";

/// The command that starts the engine, printed in `EngineUnavailable` hints: the same for
/// every endpoint (a remote one's service is started so on its own host).
pub(crate) fn start_hint(_endpoint: &str) -> String {
    "sudo cargo xtask setup podman   # or: mkdir -p /run/podman && podman system service --time=0 unix:///run/podman/podman.sock &".to_string()
}

/// A podman-api error kept as a `source` (podman-api's error is `Send + Sync`).
fn boxed(e: podman_api::Error) -> BoxError {
    Box::new(e)
}

/// Whether an engine message says the container exists no more or is no longer running
/// (Podman answers an exec create on such a container with 409 or 500 and this text).
fn says_gone(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "not running",
        "stopped",
        "no such container",
        "exited",
        "improper state",
        "being removed",
    ]
    .iter()
    .any(|gone| m.contains(gone))
}

/// The [`EngineErrorKind`] of an engine answer with `status` and `message`: a 500 saying
/// the container is gone is a `Conflict`, as a 409 is; a 500 saying the image is unknown
/// (libpod's create answers a missing image so, Docker with a 404) is `NotFound`.
pub(crate) fn answer_kind(status: u16, message: &str) -> EngineErrorKind {
    match status {
        500 if message.contains("image not known") => EngineErrorKind::NotFound,
        500 if says_gone(message) => EngineErrorKind::Conflict,
        status => EngineErrorKind::from_status(status),
    }
}

/// The [`EngineErrorKind`] of a podman-api error.
fn kind_of(e: &podman_api::Error) -> EngineErrorKind {
    match e {
        podman_api::Error::Fault { code, .. } => answer_kind(code.as_u16(), &e.to_string()),
        podman_api::Error::Error(_) | podman_api::Error::IO(_) => EngineErrorKind::Unavailable,
        _ => EngineErrorKind::Other,
    }
}

/// A podman-api error as an [`EngineError`], the source kept.
pub(crate) fn engine_error(what: &str, e: podman_api::Error) -> EngineError {
    EngineError::new(kind_of(&e), bounded(&format!("{what}: {e}"))).with_source(boxed(e))
}

/// A closure for `map_err` naming `what`.
pub(crate) fn during(what: &'static str) -> impl Fn(podman_api::Error) -> EngineError {
    move |e| engine_error(what, e)
}

/// A refusal of this adapter's own checks (options, spec assembly) as an [`EngineError`].
pub(crate) fn refused(what: &str, e: SandboxError) -> EngineError {
    EngineError::new(
        EngineErrorKind::InvalidRequest,
        bounded(&format!("{what}: {e}; {}", e.hint())),
    )
    .with_source(e)
}

/// An engine error outside the container layer (connect's ping) as a `SandboxError`:
/// unreachable or wedged engine → `EngineUnavailable` with the start command, anything
/// else → `Engine`, the source kept.
pub(crate) fn to_sandbox_error(endpoint: &str, what: &str, e: EngineError) -> SandboxError {
    match e.kind {
        EngineErrorKind::Unavailable | EngineErrorKind::Timeout => {
            SandboxError::engine_unavailable(BACKEND, endpoint, start_hint(endpoint)).with_source(e)
        }
        _ => SandboxError::engine(BACKEND, format!("{what} failed")).with_source(e),
    }
}
