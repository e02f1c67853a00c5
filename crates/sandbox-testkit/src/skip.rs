//! What an engine test does when its engine does not answer: it skips with a printed
//! reason on a developer's machine, and fails under `CI=true` or `SBX_CONTRACT_REQUIRED=1`
//! (what `cargo xtask` sets when engines are required), where a pass by skipping would
//! hide a broken setup.

use sandbox_container::ContainerEngine;
use sandbox_core::ErrorCode;

/// Whether a missing engine must fail the test rather than skip it.
pub fn engines_required() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
        || std::env::var("SBX_CONTRACT_REQUIRED").as_deref() == Ok("1")
}

/// `None` after printing why `engine` (`"Docker"`) is unavailable; panics instead when
/// [`engines_required`].
#[allow(clippy::print_stdout)]
fn skipped<T>(engine: &str, why: &str) -> Option<T> {
    if engines_required() {
        panic!("{engine} engine required under CI=true: {why}");
    }
    println!("skipping: {engine} engine unavailable: {why}");
    None
}

/// The value `connected` holds, or `None` (after printing why) when the engine is
/// unavailable and [`engines_required`] is not. Panics when the engine is unavailable
/// and required, and on any other connect error. `engine` names it in the messages
/// (`"Docker"`).
pub fn unless_connected<T>(engine: &str, connected: sandbox_core::Result<T>) -> Option<T> {
    match connected {
        Ok(v) => Some(v),
        Err(e) if e.code() == ErrorCode::EngineUnavailable => skipped(engine, &e.render()),
        Err(e) => panic!("connect failed: {}", e.render()),
    }
}

/// `made` when it was made and answers a ping, else as [`unless_connected`]: for engines
/// whose constructor does not ping (Podman's).
pub async fn unless_answering<E: ContainerEngine>(
    engine: &str,
    made: sandbox_core::Result<E>,
) -> Option<E> {
    let e = match made {
        Ok(e) => e,
        Err(e) => return skipped(engine, &e.render()),
    };
    match e.ping().await {
        Ok(()) => Some(e),
        Err(why) => skipped(engine, &why.to_string()),
    }
}
