//! The OCI runtime a container sandbox runs under: one vetted enum for every engine.

use std::fmt;

use sandbox_core::IsolationTier;

/// Label carrying the OCI runtime name a sandbox was created with, so a reattached handle
/// reports the tier it really has (not the one the connecting process is configured for).
pub const LABEL_RUNTIME: &str = "io.sandbox-rs.runtime";

/// Host threads an idle gVisor sandbox (sentry + gofer) needs on top of the sandbox's own
/// processes; measured at 45 here, more under load. Under runsc the engine's (cgroup) pids
/// limit counts those threads, so a limit of e.g. 64 would kill the sandbox on its first
/// exec: adapters set `requested + RUNSC_PIDS_HEADROOM` (see [`Runtime::pids_headroom`]).
pub const RUNSC_PIDS_HEADROOM: u64 = 256;

/// The OCI runtime, from a vetted allowlist selected by name (never a path).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Runtime {
    /// `runc`: Linux namespaces and cgroups on the host kernel.
    #[default]
    Runc,
    /// `crun`: the same isolation as runc, in C.
    Crun,
    /// `runsc` (gVisor): a user-space kernel.
    Runsc,
    /// `krun` (libkrun): a micro-VM per container.
    Krun,
}

/// The largest value the kernel accepts in `pids.max` (`PID_MAX_LIMIT`, 2^22): no
/// container can hold more processes, so a larger request means this.
pub const MAX_PIDS: u64 = 4_194_304;

/// An engine pids limit for `n` processes, clamped to `1..=`[`MAX_PIDS`].
pub fn pids_limit(n: u64) -> i64 {
    n.clamp(1, MAX_PIDS) as i64
}

impl Runtime {
    /// Every runtime, in tier order.
    pub const ALL: [Runtime; 4] = [Runtime::Runc, Runtime::Crun, Runtime::Runsc, Runtime::Krun];

    /// The name engines know it by.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Crun => "crun",
            Runtime::Runsc => "runsc",
            Runtime::Krun => "krun",
        }
    }

    /// The isolation tier sandboxes get under this runtime.
    pub fn tier(self) -> IsolationTier {
        match self {
            Runtime::Runc | Runtime::Crun => IsolationTier::Container,
            Runtime::Runsc => IsolationTier::Gvisor,
            Runtime::Krun => IsolationTier::MicroVm,
        }
    }

    /// What an adapter adds to the requested pids limit before setting the engine's limit:
    /// [`RUNSC_PIDS_HEADROOM`] for runsc, 0 otherwise.
    pub fn pids_headroom(self) -> u64 {
        match self {
            Runtime::Runsc => RUNSC_PIDS_HEADROOM,
            Runtime::Runc | Runtime::Crun | Runtime::Krun => 0,
        }
    }

    /// The engine pids limit for `requested` sandbox processes under this runtime,
    /// clamped to `1..=`[`MAX_PIDS`] (a larger value could wrap to a negative `int64`,
    /// which engines read as "unlimited").
    pub fn pids_limit(self, requested: u64) -> i64 {
        pids_limit(requested.saturating_add(self.pids_headroom()))
    }

    /// Parses a runtime name, case-insensitively (`gvisor` is accepted for runsc); a path or
    /// any other name is `None`.
    pub fn parse(s: &str) -> Option<Runtime> {
        match s.trim().to_ascii_lowercase().as_str() {
            "runc" => Some(Runtime::Runc),
            "crun" => Some(Runtime::Crun),
            "runsc" | "gvisor" => Some(Runtime::Runsc),
            "krun" => Some(Runtime::Krun),
            _ => None,
        }
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_names_tiers_and_headroom() {
        for r in Runtime::ALL {
            assert_eq!(Runtime::parse(r.as_str()), Some(r));
            assert_eq!(Runtime::parse(&r.as_str().to_uppercase()), Some(r));
        }
        assert_eq!(Runtime::parse(" GVisor "), Some(Runtime::Runsc));
        assert_eq!(Runtime::parse("/usr/bin/runc"), None, "never a path");
        assert_eq!(Runtime::parse("kata"), None);
        assert_eq!(Runtime::Runc.tier(), IsolationTier::Container);
        assert_eq!(Runtime::Crun.tier(), IsolationTier::Container);
        assert_eq!(Runtime::Runsc.tier(), IsolationTier::Gvisor);
        assert_eq!(Runtime::Krun.tier(), IsolationTier::MicroVm);
        assert_eq!(Runtime::Runc.pids_limit(64), 64);
        assert_eq!(Runtime::Runsc.pids_limit(64), 64 + 256);
        assert_eq!(
            Runtime::Runc.pids_limit(u64::MAX),
            MAX_PIDS as i64,
            "clamped, not unlimited"
        );
        assert_eq!(pids_limit(0), 1);
    }
}
