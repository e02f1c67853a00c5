//! Timed steps: each prints what it did and how long it took, so CI logs show where the
//! minutes go.

use std::time::{Duration, Instant};

use anyhow::Result;

/// Runs one named step. `f` returns its value and a one-line outcome ("installed X",
/// "image present, skipped"), printed with the elapsed time.
pub fn step<T>(scope: &str, name: &str, f: impl FnOnce() -> Result<(T, String)>) -> Result<T> {
    let start = Instant::now();
    match f() {
        Ok((value, outcome)) => {
            println!(
                "{scope}: {name:<30} {outcome} [{}]",
                seconds(start.elapsed())
            );
            Ok(value)
        }
        Err(err) => Err(err.context(format!(
            "{scope}: {name} failed after {}",
            seconds(start.elapsed())
        ))),
    }
}

/// Prints progress inside a long step ("debootstrap bookworm ...").
pub fn note(scope: &str, message: &str) {
    println!("{scope}:   {message}");
}

/// `1.23 s`.
pub fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}
