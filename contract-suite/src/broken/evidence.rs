//! The flaws that model a skipped kernel setting (capabilities kept, limits unset, no
//! init, swap on, no CPU quota) by rewriting what the sandbox reports about itself: the
//! trials must read and judge that evidence.

use bytes::Bytes;
use sandbox_core::{Command, ExecResult};

use super::flaw::Flaw;

/// Replaces the value of `field:` lines in a `/proc/<pid>/status` text.
fn with_status_field(text: &str, field: &str, value: &str) -> String {
    text.lines()
        .map(|l| match l.split_once(':') {
            Some((k, _)) if k.trim() == field => format!("{k}:\t{value}"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// What a command reads, for the flaws that model kernel settings.
fn reads(cmd: &Command, what: &str) -> bool {
    match cmd {
        Command::Argv(v) => v.iter().any(|a| a.contains(what)),
        Command::Shell(s) => s.contains(what),
    }
}

/// What the sandbox reports about itself under the kernel-setting flaws.
pub(super) fn rewrite_evidence(flaw: Flaw, cmd: &Command, mut r: ExecResult) -> ExecResult {
    match flaw {
        Flaw::KeepCapabilities if reads(cmd, "/status") => {
            // Root's full bounding and permitted sets (CAP_LAST_CAP 40).
            let mut text = r.stdout_text();
            for set in ["CapPrm", "CapEff", "CapBnd"] {
                text = with_status_field(&text, set, "000001ffffffffff");
            }
            r.stdout = Bytes::from(text);
            r
        }
        Flaw::UnlimitedDefaults
            if r.exit_code == 0
                && (reads(cmd, "memory.max")
                    || reads(cmd, "pids.max")
                    || reads(cmd, "memory.limit_in_bytes")) =>
        {
            r.stdout = Bytes::from_static(b"max\n");
            r
        }
        Flaw::NoInit if r.exit_code == 0 && reads(cmd, "/proc/1/comm") => {
            r.stdout = Bytes::from_static(b"sleep\n");
            r
        }
        Flaw::SwapEnabled if r.exit_code == 0 && reads(cmd, "memory.swap.max") => {
            r.stdout = Bytes::from_static(b"max\n");
            r
        }
        Flaw::NoCpuQuota if r.exit_code == 0 && reads(cmd, "cpu.max") => {
            r.stdout = Bytes::from_static(b"max 100000\n");
            r
        }
        _ => r,
    }
}
