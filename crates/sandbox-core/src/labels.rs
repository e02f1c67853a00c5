//! Engine labels: the reserved `io.sandbox-rs.` namespace, owner identity and validation.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Result, SandboxError};

/// Prefix reserved for sandbox-rs labels.
pub const LABEL_PREFIX: &str = "io.sandbox-rs.";
/// `io.sandbox-rs.managed=true` marks every container sandbox-rs creates.
pub const LABEL_MANAGED: &str = "io.sandbox-rs.managed";
/// Random id of the creating process's session.
pub const LABEL_SESSION: &str = "io.sandbox-rs.session";
/// Owner: `<host>/<pid>/<process start time>`.
pub const LABEL_OWNER: &str = "io.sandbox-rs.owner";
/// Deadline, Unix seconds.
pub const LABEL_DEADLINE: &str = "io.sandbox-rs.deadline";
/// Backend name.
pub const LABEL_BACKEND: &str = "io.sandbox-rs.backend";
/// Prefix of user metadata labels.
pub const LABEL_META_PREFIX: &str = "io.sandbox-rs.meta.";

/// Refuses empty keys, `=`, and control characters in env keys.
pub fn validate_env_key(k: &str) -> Result<()> {
    if k.is_empty() || k.contains('=') || k.chars().any(|c| c.is_control()) {
        return Err(SandboxError::config(
            format!("env key {k:?} is invalid"),
            "env keys are non-empty, without `=` or control characters",
        ));
    }
    Ok(())
}

/// Refuses reserved keys and control characters in metadata.
pub fn validate_metadata(meta: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in meta {
        if k.starts_with(LABEL_PREFIX) {
            return Err(SandboxError::config(
                format!("metadata key `{k}` is in the reserved `io.sandbox-rs.` namespace"),
                "choose a key without the `io.sandbox-rs.` prefix",
            ));
        }
        let key_ok = !k.is_empty()
            && k.len() <= 128
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c));
        if !key_ok {
            return Err(SandboxError::config(
                format!("metadata key {k:?} is invalid"),
                "use 1-128 characters from [A-Za-z0-9._-/]",
            ));
        }
        if v.chars().any(|c| c.is_control()) || v.len() > 1024 {
            return Err(SandboxError::config(
                format!("metadata value of `{k}` has control characters or is over 1024 bytes"),
                "remove control characters",
            ));
        }
    }
    Ok(())
}

/// Who created a sandbox: host, pid and that process's start time (so a reused pid is
/// never mistaken for the owner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Process start time in clock ticks since boot (Linux `/proc/<pid>/stat` field 22).
    pub start_time: u64,
}

impl Owner {
    /// The current process.
    pub fn current() -> &'static Owner {
        static OWNER: OnceLock<Owner> = OnceLock::new();
        OWNER.get_or_init(|| {
            let pid = std::process::id();
            Owner {
                host: host_name(),
                pid,
                start_time: process_start_time(pid).unwrap_or(0),
            }
        })
    }

    /// Label value `<host>/<pid>/<start>`.
    pub fn to_label(&self) -> String {
        format!("{}/{}/{}", self.host, self.pid, self.start_time)
    }

    /// Parses a label value.
    pub fn parse(s: &str) -> Option<Owner> {
        let mut it = s.rsplitn(3, '/');
        let start_time = it.next()?.parse().ok()?;
        let pid = it.next()?.parse().ok()?;
        let host = it.next()?.to_string();
        Some(Owner {
            host,
            pid,
            start_time,
        })
    }

    /// Whether this owner is *proven* gone: same host, and the pid is absent or alive with
    /// another start time. Foreign hosts and unverifiable owners are never proven gone.
    pub fn is_proven_gone(&self) -> bool {
        if self.host != Owner::current().host || self.start_time == 0 {
            return false;
        }
        match process_start_time(self.pid) {
            None => {
                !std::path::Path::new(&format!("/proc/{}", self.pid)).exists()
                    && std::path::Path::new("/proc/self").exists()
            }
            Some(t) => t != self.start_time,
        }
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Start time of a process (field 22 of `/proc/<pid>/stat`), `None` if unreadable.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// A random session id for this process (hex), stable for its lifetime.
pub fn session_id() -> &'static str {
    static SESSION: OnceLock<String> = OnceLock::new();
    SESSION.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mix = nanos ^ ((std::process::id() as u128) << 64);
        format!(
            "{:016x}",
            (mix as u64) ^ ((mix >> 64) as u64).rotate_left(17)
        )
    })
}

/// The full label set for a new sandbox: managed marker, session, owner, backend, deadline
/// and the user's metadata under `io.sandbox-rs.meta.`.
pub fn sandbox_labels(
    backend: &str,
    deadline_unix: u64,
    metadata: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(LABEL_MANAGED.to_string(), "true".to_string());
    l.insert(LABEL_SESSION.to_string(), session_id().to_string());
    l.insert(LABEL_OWNER.to_string(), Owner::current().to_label());
    l.insert(LABEL_BACKEND.to_string(), backend.to_string());
    l.insert(LABEL_DEADLINE.to_string(), deadline_unix.to_string());
    for (k, v) in metadata {
        l.insert(format!("{LABEL_META_PREFIX}{k}"), v.clone());
    }
    l
}

/// Turns a user label filter (`k=v` on metadata) into engine label filters.
pub fn metadata_filter(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| {
            if k.starts_with(LABEL_PREFIX) {
                (k.clone(), v.clone())
            } else {
                (format!("{LABEL_META_PREFIX}{k}"), v.clone())
            }
        })
        .collect()
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_round_trip_and_liveness() {
        let me = Owner::current();
        assert!(me.start_time > 0);
        assert_eq!(Owner::parse(&me.to_label()).as_ref(), Some(me));
        assert!(!me.is_proven_gone());
        let reused = Owner {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(reused.is_proven_gone());
        let foreign = Owner {
            host: "elsewhere".into(),
            pid: 999_999,
            start_time: 1,
        };
        assert!(!foreign.is_proven_gone());
    }

    #[test]
    fn labels_carry_metadata() {
        let mut m = BTreeMap::new();
        m.insert("team".to_string(), "x".to_string());
        let l = sandbox_labels("docker", 10, &m);
        assert_eq!(l["io.sandbox-rs.meta.team"], "x");
        assert_eq!(l[LABEL_MANAGED], "true");
    }
}
