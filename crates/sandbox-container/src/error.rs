//! Turning an [`EngineError`] into the right `SandboxError` for the operation it failed in.
//!
//! The engine adapter says *what kind* of failure it met; only the operation knows what it
//! means (a `NotFound` on exec is `SandboxGone`, on an archive read `PathNotFound`, on create
//! a missing image). Every `SandboxError` this crate builds is built here, so the mapping
//! is written once and the engine error stays the `source`.

use std::time::Duration;

use sandbox_core::SandboxError;

use crate::engine::{ContainerEngine, EngineError, EngineErrorKind};

/// The engine did not answer (or did not answer in time).
pub(crate) fn unavailable<E: ContainerEngine + ?Sized>(engine: &E, e: EngineError) -> SandboxError {
    SandboxError::engine_unavailable(
        engine.backend(),
        engine.endpoint(),
        engine.unavailable_hint(),
    )
    .with_source(e)
}

fn is_unreachable(e: &EngineError) -> bool {
    matches!(
        e.kind,
        EngineErrorKind::Unavailable | EngineErrorKind::Timeout
    )
}

/// Any engine error during `op`, source kept.
pub(crate) fn engine<E: ContainerEngine + ?Sized>(
    engine: &E,
    op: &str,
    e: EngineError,
) -> SandboxError {
    if is_unreachable(&e) {
        return unavailable(engine, e);
    }
    SandboxError::engine(engine.backend(), format!("{op} failed")).with_source(e)
}

/// A failure of this crate's own machinery (no engine error behind it).
pub(crate) fn internal(backend: &str, message: impl Into<String>) -> SandboxError {
    SandboxError::engine(backend, message)
}

/// A local I/O failure during `op` on `backend`.
pub(crate) fn io(backend: &str, op: &str, e: std::io::Error) -> SandboxError {
    SandboxError::engine(backend, format!("{op} failed")).with_source(e)
}

/// An engine error on a live sandbox: a missing container, or one that refuses the call
/// because it is not running, is `SandboxGone`.
pub(crate) fn on_sandbox<E: ContainerEngine + ?Sized>(
    eng: &E,
    id: &str,
    op: &str,
    e: EngineError,
) -> SandboxError {
    match e.kind {
        EngineErrorKind::NotFound | EngineErrorKind::Conflict => gone(id).with_source(e),
        _ => engine(eng, op, e),
    }
}

/// The sandbox no longer exists.
pub(crate) fn gone(id: &str) -> SandboxError {
    SandboxError::gone(id.to_string())
}

/// An engine error while creating from `template`.
pub(crate) fn on_create<E: ContainerEngine + ?Sized>(
    eng: &E,
    template: &str,
    op: &str,
    e: EngineError,
) -> SandboxError {
    if is_unreachable(&e) {
        return unavailable(eng, e);
    }
    let message = match e.kind {
        EngineErrorKind::NotFound if op == "create container" => format!(
            "image `{template}` not found on the engine (build the test images with `sudo cargo \
             xtask setup`, or pull `{template}`)"
        ),
        _ => format!("{op} failed: {}", bounded_text(&e.message)),
    };
    SandboxError::creation(eng.backend(), message).with_source(e)
}

/// Whether `e` is a create failure whose engine error is `NotFound` (the image, or a
/// network, the engine no longer has).
pub(crate) fn says_not_found(e: &SandboxError) -> bool {
    e.code() == sandbox_core::ErrorCode::Creation
        && std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<EngineError>())
            .is_some_and(|s| s.kind == EngineErrorKind::NotFound)
}

/// What the engine refused before anything was provisioned.
pub(crate) fn refused_spec(e: EngineError) -> SandboxError {
    SandboxError::config(
        bounded_text(&e.message),
        "change the option the message names, or the engine configuration it depends on",
    )
}

/// `create` did not finish within its bound.
pub(crate) fn create_timeout(backend: &str, after: Duration) -> SandboxError {
    SandboxError::create_timeout(backend, after)
}

/// `connect` found no live sandbox under `id`.
pub(crate) fn connect(
    id: &str,
    message: impl Into<String>,
    source: Option<EngineError>,
) -> SandboxError {
    let err = SandboxError::connect(id, message);
    match source {
        Some(e) => err.with_source(e),
        None => err,
    }
}

/// A missing sandbox path.
pub(crate) fn path_not_found(path: &str) -> SandboxError {
    SandboxError::path_not_found(path.to_string())
}

/// A file operation given a directory.
pub(crate) fn is_a_directory(path: &str) -> SandboxError {
    SandboxError::is_a_directory(path.to_string())
}

/// A file operation that failed for a reason the message names.
pub(crate) fn file(
    path: &str,
    message: impl Into<String>,
    source: Option<sandbox_core::BoxError>,
) -> SandboxError {
    let err = SandboxError::file_system(path, message);
    match source {
        Some(e) => err.with_source(e),
        None => err,
    }
}

/// A named limit was reached; `hint` says how to raise it or what to use instead.
pub(crate) fn limit(limit: impl Into<String>, hint: impl Into<String>) -> SandboxError {
    SandboxError::resource_limit(limit, Some(hint.into()))
}

/// A timeout of user work.
pub(crate) fn execution_timeout(after: Duration) -> SandboxError {
    SandboxError::execution_timeout(after)
}

/// The template lacks the interpreter.
pub(crate) fn interpreter_missing(interpreter: &str, template: &str) -> SandboxError {
    SandboxError::interpreter_missing(interpreter, template)
}

/// Engine or sandbox text quoted in a message, cut to a bounded, single-line form (a
/// hostile sandbox controls some of it).
pub(crate) fn bounded_text(s: &str) -> String {
    const MAX: usize = 200;
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX)
        .collect();
    if s.chars().count() > MAX {
        out.push('…');
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_text_is_bounded_and_single_line() {
        let s = bounded_text(&format!("a\nb\x1b[31m{}", "x".repeat(10_000)));
        assert!(!s.contains('\n') && !s.contains('\x1b'));
        assert!(s.chars().count() <= 201);
    }
}
