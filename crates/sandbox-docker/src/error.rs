//! The only place that sees bollard errors: mapping them into `sandbox-container`'s
//! [`EngineError`] (the container layer decides what each kind means for the operation,
//! and keeps the bollard error as the source), and the start hint of an engine that does
//! not answer.

use sandbox_container::engine::engine_text as bounded;
use sandbox_container::{EngineError, EngineErrorKind};

/// Backend name used in every error and label.
pub(crate) const BACKEND: &str = "docker";

/// Classifies a bollard error and keeps it as the source.
pub(crate) fn engine_error(op: &str, e: bollard::errors::Error) -> EngineError {
    use bollard::errors::Error as B;
    let (kind, message) = match &e {
        B::DockerResponseServerError {
            status_code,
            message,
        } => (
            EngineErrorKind::from_status(*status_code),
            format!("{op}: HTTP {status_code}: {}", bounded(message)),
        ),
        B::RequestTimeoutError => (EngineErrorKind::Timeout, format!("{op}: timed out")),
        B::IOError { .. }
        | B::HyperLegacyError { .. }
        | B::HyperResponseError { .. }
        | B::SocketNotFoundError(_) => (
            EngineErrorKind::Unavailable,
            format!("{op}: {}", bounded(&e.to_string())),
        ),
        _ => (
            EngineErrorKind::Other,
            format!("{op}: {}", bounded(&e.to_string())),
        ),
    };
    EngineError::new(kind, message).with_source(e)
}

/// A failed pull: the registry's refusals and missing images are told apart by the
/// daemon's text (it reports both as a stream error or a 404/500 with a message), so the
/// container layer can name the fix.
pub(crate) fn pull_error(e: bollard::errors::Error) -> EngineError {
    sandbox_container::image::classify_pull_failure(engine_error("pull image", e))
}

/// A closure for `map_err` naming `op`.
pub(crate) fn during(op: &'static str) -> impl Fn(bollard::errors::Error) -> EngineError {
    move |e| engine_error(op, e)
}

/// The exact command that starts an engine at `endpoint`.
pub(crate) fn start_hint(endpoint: &str) -> String {
    if endpoint.starts_with("unix://") || !endpoint.contains("://") {
        format!(
            "start the Docker engine: `sudo cargo xtask setup` (or `sudo dockerd &`), then check \
             `docker -H {endpoint} info`"
        )
    } else {
        format!(
            "check that the Docker engine at {endpoint} is up and reachable \
             (`docker -H {endpoint} info`; for TLS set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(status_code: u16, message: &str) -> bollard::errors::Error {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message: message.into(),
        }
    }

    #[test]
    fn statuses_map_to_kinds() {
        assert_eq!(
            engine_error("x", server(404, "No such container: c1")).kind,
            EngineErrorKind::NotFound
        );
        assert_eq!(
            engine_error("x", server(409, "Container c1 is not running")).kind,
            EngineErrorKind::Conflict
        );
        assert_eq!(
            engine_error("x", server(400, "bad")).kind,
            EngineErrorKind::InvalidRequest
        );
        let e = engine_error("x", server(500, "boom"));
        assert_eq!(e.kind, EngineErrorKind::Other);
        assert!(std::error::Error::source(&e).is_some(), "source kept");
    }

    #[test]
    fn pull_refusals_and_missing_images_are_told_apart() {
        let stream = |m: &str| bollard::errors::Error::DockerStreamError { error: m.into() };
        assert_eq!(
            pull_error(stream(
                "Head \"http://127.0.0.1:5000/v2/x/manifests/1\": no basic auth credentials"
            ))
            .kind,
            EngineErrorKind::Unauthorized
        );
        assert_eq!(
            pull_error(server(500, "unauthorized: authentication required")).kind,
            EngineErrorKind::Unauthorized
        );
        assert_eq!(
            pull_error(server(
                404,
                "manifest for 127.0.0.1:5000/x:9 not found: manifest unknown"
            ))
            .kind,
            EngineErrorKind::NotFound
        );
        assert_eq!(
            pull_error(stream("write /var/lib/docker/tmp: no space left on device")).kind,
            EngineErrorKind::Other
        );
    }

    #[test]
    fn unreachable_engine_is_unavailable_and_messages_are_bounded() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = engine_error("ping", bollard::errors::Error::IOError { err: io });
        assert_eq!(e.kind, EngineErrorKind::Unavailable);
        let e = engine_error("x", server(500, &format!("a\n{}", "y".repeat(10_000))));
        assert!(e.message.len() < 400 && !e.message.contains('\n'));
        assert!(start_hint("unix:///var/run/docker.sock").contains("sudo cargo xtask setup"));
    }
}
