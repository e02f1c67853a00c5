//! What an engine test does when its engine does not answer: it skips with a printed
//! reason on a developer's machine, and fails under `CI=true`, where a pass by skipping
//! would hide a broken setup.

use sandbox_core::ErrorCode;

/// The value `connected` holds, or `None` (after printing why) when the engine is
/// unavailable and `CI=true` is not set. Panics when the engine is unavailable under
/// `CI=true`, and on any other connect error. `engine` names it in the messages
/// (`"Docker"`).
#[allow(clippy::print_stdout)]
pub fn unless_connected<T>(engine: &str, connected: sandbox_core::Result<T>) -> Option<T> {
    match connected {
        Ok(v) => Some(v),
        Err(e) if e.code() == ErrorCode::EngineUnavailable => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{engine} engine required under CI=true: {}", e.render());
            }
            println!("skipping: {engine} engine unavailable: {}", e.render());
            None
        }
        Err(e) => panic!("connect failed: {}", e.render()),
    }
}
