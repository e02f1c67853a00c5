//! Virtual wall-clock time: `SystemTime` that follows tokio's clock, so a paused test
//! runtime (`#[tokio::test(start_paused = true)]`) moves file mtimes, creation times and
//! deadlines along with `tokio::time::advance`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// A wall clock anchored at creation and advanced by tokio's (possibly paused) clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    wall: SystemTime,
    mono: Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            wall: SystemTime::now(),
            mono: Instant::now(),
        }
    }

    /// The current virtual wall time.
    pub(crate) fn now(&self) -> SystemTime {
        self.wall + Instant::now().saturating_duration_since(self.mono)
    }

    /// Unix seconds of `now() + after`.
    pub(crate) fn unix_after(&self, after: Duration) -> u64 {
        (self.now() + after)
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}
