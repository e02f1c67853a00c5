//! Mapping of bollard errors into [`SandboxError`]. The only module that looks inside
//! `bollard::errors::Error`; every mapping keeps the engine error as the `source`.

use sandbox_core::SandboxError;

/// The engine error type, named once here.
pub(crate) type EngineError = bollard::errors::Error;

/// Backend name used in every error and label.
pub(crate) const BACKEND: &str = "docker";

/// How an engine error should be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// HTTP 404 from the engine.
    NotFound,
    /// HTTP 409 saying the container is not running (stopped, paused, being removed).
    NotRunning,
    /// Other HTTP 409.
    Conflict,
    /// The engine did not answer (socket missing, connection refused, reset, timeout).
    Unreachable,
    /// Anything else.
    Other,
}

/// Classifies an engine error.
pub(crate) fn kind(e: &EngineError) -> Kind {
    use bollard::errors::Error as E;
    match e {
        E::DockerResponseServerError {
            status_code: 404, ..
        } => Kind::NotFound,
        E::DockerResponseServerError {
            status_code: 409,
            message,
        } => {
            let m = message.to_ascii_lowercase();
            if m.contains("not running")
                || m.contains("is paused")
                || m.contains("removal")
                || m.contains("is restarting")
                || m.contains("is dead")
            {
                Kind::NotRunning
            } else {
                Kind::Conflict
            }
        }
        E::IOError { .. }
        | E::HyperLegacyError { .. }
        | E::HyperResponseError { .. }
        | E::SocketNotFoundError(_)
        | E::RequestTimeoutError => Kind::Unreachable,
        _ => Kind::Other,
    }
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

/// The engine did not answer at `endpoint`.
pub(crate) fn unavailable(endpoint: &str, e: EngineError) -> SandboxError {
    SandboxError::EngineUnavailable {
        backend: BACKEND.into(),
        endpoint: endpoint.to_string(),
        hint: start_hint(endpoint),
        source: Some(Box::new(e)),
    }
}

/// Any engine error during `op`, source kept.
pub(crate) fn engine(op: &str, e: EngineError) -> SandboxError {
    SandboxError::Engine {
        backend: BACKEND.into(),
        message: format!("{op} failed"),
        source: Some(Box::new(e)),
    }
}

/// An engine error while operating on a live sandbox: a missing or stopped container is
/// `SandboxGone`, everything else an engine error.
pub(crate) fn for_sandbox(id: &str, op: &str, e: EngineError) -> SandboxError {
    match kind(&e) {
        Kind::NotFound | Kind::NotRunning => SandboxError::SandboxGone { id: id.to_string() },
        _ => engine(op, e),
    }
}

/// An engine error while creating a sandbox.
pub(crate) fn for_create(template: &str, op: &str, e: EngineError) -> SandboxError {
    let message = match kind(&e) {
        Kind::NotFound if op == "create container" => format!(
            "image `{template}` not found on the engine (build the test images with `sudo cargo \
             xtask setup`, or `docker pull {template}`)"
        ),
        _ => format!("{op} failed"),
    };
    SandboxError::Creation {
        backend: BACKEND.into(),
        message,
        source: Some(Box::new(e)),
    }
}

/// An engine error from `connect(id)`.
pub(crate) fn for_connect(id: &str, e: EngineError) -> SandboxError {
    let message = match kind(&e) {
        Kind::NotFound => "no such sandbox".to_string(),
        _ => "inspecting the sandbox failed".to_string(),
    };
    SandboxError::Connect {
        id: id.to_string(),
        message,
        source: Some(Box::new(e)),
    }
}

/// An engine error on a sandbox path: 404 is `PathNotFound` unless the container itself is
/// gone (the caller checks that first where it matters).
pub(crate) fn for_path(path: &str, op: &str, e: EngineError) -> SandboxError {
    match kind(&e) {
        Kind::NotFound => SandboxError::PathNotFound {
            path: path.to_string(),
        },
        _ => SandboxError::FileSystem {
            path: path.to_string(),
            message: format!("{op} failed"),
            source: Some(Box::new(e)),
        },
    }
}

/// Whether a 404 names a missing container (as opposed to a missing path).
pub(crate) fn is_missing_container(e: &EngineError) -> bool {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            message,
        } => message.to_ascii_lowercase().contains("no such container"),
        _ => false,
    }
}

/// A local I/O failure during a transfer.
pub(crate) fn local_io(path: &std::path::Path, op: &str, e: std::io::Error) -> SandboxError {
    SandboxError::FileSystem {
        path: path.display().to_string(),
        message: format!("{op} failed"),
        source: Some(Box::new(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorCode;

    fn server(status_code: u16, message: &str) -> EngineError {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message: message.into(),
        }
    }

    #[test]
    fn gone_container_is_sandbox_gone() {
        let e = for_sandbox("c1", "exec", server(404, "No such container: c1"));
        assert_eq!(e.code(), ErrorCode::SandboxGone);
        let e = for_sandbox("c1", "exec", server(409, "Container c1 is not running"));
        assert_eq!(e.code(), ErrorCode::SandboxGone);
        let e = for_sandbox("c1", "exec", server(500, "boom"));
        assert_eq!(e.code(), ErrorCode::Engine);
        assert!(std::error::Error::source(&e).is_some(), "source kept");
    }

    #[test]
    fn unreachable_engine_has_start_hint() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = bollard::errors::Error::IOError { err: io };
        assert_eq!(kind(&e), Kind::Unreachable);
        let e = unavailable("unix:///var/run/docker.sock", e);
        assert_eq!(e.code(), ErrorCode::EngineUnavailable);
        assert!(e.hint().contains("sudo cargo xtask setup"));
        assert!(e.hint().contains("sudo dockerd &"));
        assert!(std::error::Error::source(&e).is_some());
    }

    #[test]
    fn paths_and_connect() {
        assert_eq!(
            for_path("/x", "read", server(404, "Could not find the file /x")).code(),
            ErrorCode::PathNotFound
        );
        assert_eq!(
            for_connect("nope", server(404, "No such container: nope")).code(),
            ErrorCode::Connect
        );
        assert!(is_missing_container(&server(404, "No such container: a")));
        assert!(!is_missing_container(&server(
            404,
            "Could not find the file"
        )));
        let e = for_create(
            "img:1",
            "create container",
            server(404, "No such image: img:1"),
        );
        assert_eq!(e.code(), ErrorCode::Creation);
        assert!(e.to_string().contains("img:1"));
    }
}
