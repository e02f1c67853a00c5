//! What `Sandbox::fork` takes: how many forks, their lifetime and their labels.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::labels::validate_metadata;
use crate::{Result, SandboxError};

/// Most forks one `fork` call makes: each is a whole sandbox (a container restored from
/// the checkpoint, with its memory), so a runaway count would exhaust the host.
pub const MAX_FORKS: usize = 16;

/// How [`Sandbox::fork`](crate::Sandbox::fork) makes its forks.
///
/// Each fork is a new sandbox with an id of its own, continuing the original's processes,
/// interpreter contexts and files from the instant of the fork; the original goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForkOptions {
    /// How many forks, 1 to [`MAX_FORKS`].
    pub count: usize,
    /// Each fork's lifetime counted from the fork; `None`: the original's deadline in
    /// force at the fork. Never past the original's maximum lifetime
    /// (`CreateOptions::max_lifetime` counted from the original's create): a longer one is
    /// refused with `ResourceLimitExceeded` before anything is made. A fork's deadline is
    /// its own: `extend` on one moves no other.
    pub timeout: Option<Duration>,
    /// Metadata labels added to the forks' (beside the original's, which they keep).
    pub metadata: BTreeMap<String, String>,
}

impl ForkOptions {
    /// `count` forks with the original's deadline and labels.
    pub fn new(count: usize) -> Self {
        ForkOptions {
            count,
            timeout: None,
            metadata: BTreeMap::new(),
        }
    }

    /// Each fork's lifetime from the fork.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Adds a metadata label to the forks.
    pub fn metadata(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.metadata.insert(k.into(), v.into());
        self
    }

    /// A count outside 1..=[`MAX_FORKS`], a zero or over-long timeout, or a bad metadata
    /// key is a `Configuration` error.
    pub fn validate(&self) -> Result<()> {
        if self.count == 0 || self.count > MAX_FORKS {
            return Err(SandboxError::config(
                format!("fork count {} is outside 1..={MAX_FORKS}", self.count),
                format!("ask for 1 to {MAX_FORKS} forks per call (call fork again for more)"),
            ));
        }
        if let Some(t) = self.timeout {
            crate::options::validate_lifetime(t)?;
        }
        validate_metadata(&self.metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_outside_the_bounds_is_a_configuration_error() {
        for n in [0, MAX_FORKS + 1] {
            let e = ForkOptions::new(n).validate().unwrap_err();
            assert_eq!(e.code(), crate::ErrorCode::Configuration, "{n}");
        }
        ForkOptions::new(1).validate().unwrap();
        ForkOptions::new(MAX_FORKS)
            .timeout(Duration::from_secs(30))
            .metadata("branch", "a")
            .validate()
            .unwrap();
        let e = ForkOptions::new(1)
            .timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Configuration);
        let e = ForkOptions::new(1)
            .metadata("k", "a\nb")
            .validate()
            .unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Configuration);
    }
}
