//! The only place that sees `podman-api` errors: mapping them into [`SandboxError`], and
//! keeping the crate's panics from ever reaching a caller.
//!
//! podman-api 0.11's frame decoder `panic!`s on a stream number it does not know
//! (`containers_api::conn::tty::decode_chunk`); every crate call this adapter makes goes
//! through [`guard`] (futures) or [`guard_stream`] (streams), which turn such a panic into
//! [`SandboxError::Engine`].

use std::future::Future;
use std::panic::AssertUnwindSafe;

use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use sandbox_container::{EngineError, EngineErrorKind, EngineResult};
use sandbox_core::{BoxError, SandboxError};

use crate::rest::RestError;

/// Backend name used in every error.
pub(crate) const BACKEND: &str = "podman";

/// Start command printed in `EngineUnavailable` hints.
pub(crate) const START_HINT: &str = "sudo cargo xtask setup podman   # or: mkdir -p /run/podman && podman system service --time=0 unix:///run/podman/podman.sock &";

/// A podman-api error kept as a `source` (podman-api's error is `Send + Sync`).
pub(crate) fn boxed(e: podman_api::Error) -> BoxError {
    Box::new(e)
}

/// HTTP status of a podman-api error, when the engine answered with one.
pub(crate) fn status_of(e: &podman_api::Error) -> Option<u16> {
    match e {
        podman_api::Error::Fault { code, .. } => Some(code.as_u16()),
        _ => None,
    }
}

/// Whether the error says "no such container / exec" (HTTP 404).
pub(crate) fn is_not_found(e: &podman_api::Error) -> bool {
    status_of(e) == Some(404)
}

/// Whether the error means the container exists no more or is no longer running:
/// 404, or 409 "container is not running / stopped" from exec create.
pub(crate) fn is_gone(e: &podman_api::Error) -> bool {
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
pub(crate) fn is_transport(e: &podman_api::Error) -> bool {
    matches!(e, podman_api::Error::Error(_) | podman_api::Error::IO(_))
}

/// Maps any other podman-api error to [`SandboxError::Engine`] with the source kept.
pub(crate) fn engine(what: &str, e: podman_api::Error) -> SandboxError {
    SandboxError::Engine {
        backend: BACKEND.into(),
        message: format!("{what} failed"),
        source: Some(boxed(e)),
    }
}

/// Maps an error of an operation on a live sandbox: gone → `SandboxGone`, else `Engine`.
pub(crate) fn on_sandbox(id: &str, what: &str, e: podman_api::Error) -> SandboxError {
    if is_gone(&e) {
        SandboxError::SandboxGone { id: id.to_string() }
    } else {
        engine(what, e)
    }
}

/// A free-form engine error without a podman-api source.
pub(crate) fn engine_msg(message: impl Into<String>) -> SandboxError {
    SandboxError::Engine {
        backend: BACKEND.into(),
        message: message.into(),
        source: None,
    }
}

fn panicked(what: &str) -> SandboxError {
    tracing::error!(
        backend = BACKEND,
        operation = what,
        "podman-api panicked; mapped to an engine error"
    );
    engine_msg(format!(
        "{what}: the podman-api client panicked (unexpected engine data)"
    ))
}

/// Runs a podman-api future, turning a panic inside it into [`SandboxError::Engine`].
pub(crate) async fn guard<T, F>(what: &str, fut: F) -> Result<T, SandboxError>
where
    F: Future<Output = Result<T, SandboxError>>,
{
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(r) => r,
        Err(_) => Err(panicked(what)),
    }
}

/// Wraps a podman-api stream so a panic while polling it becomes one
/// [`SandboxError::Engine`] item, after which the stream ends.
pub(crate) fn guard_stream<S, T>(
    what: &'static str,
    stream: S,
) -> impl Stream<Item = Result<T, SandboxError>> + Send
where
    S: Stream<Item = Result<T, SandboxError>> + Send,
{
    AssertUnwindSafe(stream)
        .catch_unwind()
        .map(move |item| match item {
            Ok(r) => r,
            Err(_) => Err(panicked(what)),
        })
}

/// Longest engine message kept in an [`EngineError`] (the engine may echo user input).
const MAX_MESSAGE: usize = 512;

fn bounded(m: &str) -> String {
    m.chars().take(MAX_MESSAGE).collect()
}

/// The [`EngineErrorKind`] of a podman-api error.
pub(crate) fn kind_of(e: &podman_api::Error) -> EngineErrorKind {
    match status_of(e) {
        Some(404) => EngineErrorKind::NotFound,
        Some(409) => EngineErrorKind::Conflict,
        Some(400) => EngineErrorKind::InvalidRequest,
        Some(500) if is_gone(e) => EngineErrorKind::Conflict,
        Some(_) => EngineErrorKind::Other,
        None if is_transport(e) => EngineErrorKind::Unavailable,
        None => EngineErrorKind::Other,
    }
}

/// A podman-api error as an [`EngineError`], the source kept.
pub(crate) fn from_api(what: &str, e: podman_api::Error) -> EngineError {
    EngineError::new(kind_of(&e), bounded(&format!("{what}: {e}"))).with_source(boxed(e))
}

/// A REST bypass error as an [`EngineError`], the source kept.
pub(crate) fn from_rest(what: &str, e: RestError) -> EngineError {
    let kind = match &e {
        RestError::Status { status: 404, .. } => EngineErrorKind::NotFound,
        RestError::Status { status: 409, .. } => EngineErrorKind::Conflict,
        RestError::Status { status: 400, .. } => EngineErrorKind::InvalidRequest,
        RestError::Status { .. } | RestError::Invalid(_) => EngineErrorKind::Other,
        RestError::Transport(_) => EngineErrorKind::Unavailable,
    };
    EngineError::new(kind, bounded(&format!("{what}: {e}"))).with_source(e)
}

/// A refusal of this adapter's own checks (options, spec assembly) as an [`EngineError`].
pub(crate) fn refused(what: &str, e: SandboxError) -> EngineError {
    EngineError::new(
        EngineErrorKind::InvalidRequest,
        bounded(&format!("{what}: {e}; {}", e.hint())),
    )
    .with_source(e)
}

/// Runs one engine call bounded by `limit`, with a panic inside podman-api turned into an
/// [`EngineError`] (its frame decoder panics on unexpected frames). A wedged engine fails
/// the call with [`EngineErrorKind::Timeout`] instead of hanging the caller.
pub(crate) async fn call<T, F>(what: &str, limit: Duration, fut: F) -> EngineResult<T>
where
    F: Future<Output = EngineResult<T>>,
{
    match tokio::time::timeout(limit, AssertUnwindSafe(fut).catch_unwind()).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(engine_panicked(what)),
        Err(_) => Err(EngineError::new(
            EngineErrorKind::Timeout,
            format!("{what}: the engine did not answer within {limit:?}"),
        )),
    }
}

/// A podman-api panic as an [`EngineError`] (logged once).
pub(crate) fn engine_panicked(what: &str) -> EngineError {
    tracing::error!(
        backend = BACKEND,
        operation = what,
        "podman-api panicked; mapped to an engine error"
    );
    EngineError::new(
        EngineErrorKind::Other,
        format!("{what}: the podman-api client panicked (unexpected engine data)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorCode;

    #[tokio::test]
    async fn engine_call_panic_and_hang_are_engine_errors() {
        let r: EngineResult<()> = call("exec start", Duration::from_secs(5), async {
            panic!("invalid stream number from podman daemon: '7'")
        })
        .await;
        assert_eq!(r.unwrap_err().kind, EngineErrorKind::Other);
        let t = std::time::Instant::now();
        let r: EngineResult<()> = call(
            "container create",
            Duration::from_millis(50),
            std::future::pending(),
        )
        .await;
        assert_eq!(r.unwrap_err().kind, EngineErrorKind::Timeout);
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn rest_errors_map_to_kinds() {
        let k = |status| {
            from_rest(
                "x",
                RestError::Status {
                    status,
                    message: "m".into(),
                },
            )
            .kind
        };
        assert_eq!(k(404), EngineErrorKind::NotFound);
        assert_eq!(k(409), EngineErrorKind::Conflict);
        assert_eq!(k(400), EngineErrorKind::InvalidRequest);
        assert_eq!(k(500), EngineErrorKind::Other);
        let long = "y".repeat(10_000);
        let e = from_rest(
            "x",
            RestError::Status {
                status: 500,
                message: long,
            },
        );
        assert!(e.message.len() <= MAX_MESSAGE);
    }

    #[tokio::test]
    async fn panic_in_crate_future_is_an_engine_error() {
        let r: Result<(), _> = guard("exec start", async { panic!("invalid stream number") }).await;
        assert_eq!(r.unwrap_err().code(), ErrorCode::Engine);
    }

    #[tokio::test]
    async fn panic_in_crate_stream_is_an_engine_error_then_ends() {
        let s = futures::stream::iter(0..3).map(|i| {
            if i == 1 {
                panic!("invalid stream number from podman daemon: '7'");
            }
            Ok::<_, SandboxError>(i)
        });
        let items: Vec<_> = guard_stream("exec output", s).collect().await;
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        assert_eq!(items[1].as_ref().unwrap_err().code(), ErrorCode::Engine);
    }
}
