//! Linux capabilities a sandbox may be granted on top of the empty set, as a type: only
//! vetted capabilities have a variant, so a dangerous one cannot even be named. Engines
//! that offer extra capabilities (Podman's `PodmanOptions::capability`) take this type.

use std::fmt;

use sandbox_core::{Result, SandboxError};

/// Linux capabilities a sandbox may be granted on top of the empty set (after
/// `cap_drop ALL`): exactly the variants of [`LinuxCapability`]. `NET_ADMIN`, `NET_RAW` and
/// `SYS_ADMIN` are never grantable: either would let sandbox root rewrite or bypass the
/// network policy or escape mount isolation. `PERFMON` is not grantable either: it opens
/// `perf_event_open` and BPF tracing of the host kernel to sandbox root.
pub const GRANTABLE_CAPABILITIES: [LinuxCapability; 10] = [
    LinuxCapability::AuditWrite,
    LinuxCapability::Chown,
    LinuxCapability::DacOverride,
    LinuxCapability::Fowner,
    LinuxCapability::Fsetid,
    LinuxCapability::Kill,
    LinuxCapability::NetBindService,
    LinuxCapability::Setgid,
    LinuxCapability::Setuid,
    LinuxCapability::SysChroot,
];

/// A Linux capability a sandbox may be granted. Only vetted capabilities have a variant,
/// so a dangerous one cannot even be named; [`LinuxCapability::parse`] explains refusals of
/// names given as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum LinuxCapability {
    /// `CAP_AUDIT_WRITE`: write to the kernel audit log (some `login`-like tools need it).
    AuditWrite,
    /// `CAP_CHOWN`: change file owners.
    Chown,
    /// `CAP_DAC_OVERRIDE`: bypass file permission checks (inside the sandbox's own files).
    DacOverride,
    /// `CAP_FOWNER`: act as the owner of any file.
    Fowner,
    /// `CAP_FSETID`: keep set-id bits when modifying files.
    Fsetid,
    /// `CAP_KILL`: signal processes of other users in the sandbox.
    Kill,
    /// `CAP_NET_BIND_SERVICE`: bind ports below 1024.
    NetBindService,
    /// `CAP_SETGID`: change group ids.
    Setgid,
    /// `CAP_SETUID`: change user ids.
    Setuid,
    /// `CAP_SYS_CHROOT`: `chroot(2)`.
    SysChroot,
}

impl LinuxCapability {
    /// The name engines expect (`CHOWN`, without the `CAP_` prefix).
    pub fn as_str(self) -> &'static str {
        match self {
            LinuxCapability::AuditWrite => "AUDIT_WRITE",
            LinuxCapability::Chown => "CHOWN",
            LinuxCapability::DacOverride => "DAC_OVERRIDE",
            LinuxCapability::Fowner => "FOWNER",
            LinuxCapability::Fsetid => "FSETID",
            LinuxCapability::Kill => "KILL",
            LinuxCapability::NetBindService => "NET_BIND_SERVICE",
            LinuxCapability::Setgid => "SETGID",
            LinuxCapability::Setuid => "SETUID",
            LinuxCapability::SysChroot => "SYS_CHROOT",
        }
    }

    /// Parses `chown`, `CHOWN` or `CAP_CHOWN`. A never-grantable or unlisted capability is
    /// a `Configuration` error that says why.
    pub fn parse(name: &str) -> Result<LinuxCapability> {
        let up = name.trim().to_ascii_uppercase();
        let up = up.strip_prefix("CAP_").unwrap_or(&up);
        if let Some(c) = GRANTABLE_CAPABILITIES.iter().find(|c| c.as_str() == up) {
            return Ok(*c);
        }
        if NEVER_GRANTABLE.contains(&up) {
            return Err(SandboxError::config(
                format!("capability {up} is never grantable"),
                "NET_ADMIN/NET_RAW would let sandbox root rewrite or bypass the network policy and SYS_ADMIN defeats mount isolation; do that work on the host side",
            ));
        }
        Err(SandboxError::config(
            format!(
                "capability {:?} is not on the vetted allowlist",
                up.chars().take(64).collect::<String>()
            ),
            format!(
                "grant only one of: {}",
                GRANTABLE_CAPABILITIES
                    .map(LinuxCapability::as_str)
                    .join(", ")
            ),
        ))
    }
}

impl fmt::Display for LinuxCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for LinuxCapability {
    type Err = SandboxError;
    fn from_str(s: &str) -> Result<Self> {
        LinuxCapability::parse(s)
    }
}

/// Capabilities refused with a dedicated explanation.
pub const NEVER_GRANTABLE: [&str; 3] = ["NET_ADMIN", "NET_RAW", "SYS_ADMIN"];
