//! The catalog of stable error codes: the single source the docs pages are generated from.
//!
//! One table ([`catalog!`] below) defines every code: its variant, its string form and its
//! documentation. The enum, [`ErrorCode::ALL`], [`ErrorCode::as_str`] and
//! [`ErrorCode::doc`] are generated from it, so a code cannot be added to one list and
//! forgotten in another. `cargo xtask docs` renders `docs/errors/` from the same table.

/// Documentation of one code, as rendered into `docs/errors/<CODE>.md`.
#[derive(Debug, Clone, Copy)]
pub struct CodeDoc {
    /// Short title.
    pub title: &'static str,
    /// When the error is raised.
    pub meaning: &'static str,
    /// What to do about it in general (variants may give a more exact hint).
    pub fix: &'static str,
}

/// Base of [`ErrorCode::url`].
pub const DOCS_BASE_URL: &str = "https://github.com/sandbox-rs/sandbox-rs/blob/main/docs/errors/";

macro_rules! catalog {
    ($($name:ident = $code:literal { title: $title:literal, meaning: $meaning:literal, fix: $fix:literal, },)+) => {
        /// A stable error code (`SBX_E1000` …). Codes never change meaning once released.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $(
                #[doc = concat!($code, ": ", $title, ".")]
                $name,
            )+
        }

        impl ErrorCode {
            /// Every code, in numeric order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name),+];

            /// The stable string form (`"SBX_E1000"`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$name => $code,)+
                }
            }

            /// Title, meaning and general fix.
            pub fn doc(self) -> CodeDoc {
                match self {
                    $(ErrorCode::$name => CodeDoc { title: $title, meaning: $meaning, fix: $fix },)+
                }
            }
        }
    };
}

catalog! {
    Configuration = "SBX_E1000" {
        title: "Configuration error",
        meaning: "An option, DSN or environment setting is invalid: a zero or negative limit, a zero or unbounded timeout, a reserved or malformed label or env key, an unknown DSN parameter, or requiring the `unknown` isolation tier. Raised before anything is provisioned.",
        fix: "Correct the named setting; the hint says which value is accepted.",
    },
    BackendNotFound = "SBX_E1001" {
        title: "Backend not found",
        meaning: "The DSN scheme names no backend compiled into this build or registered at run time.",
        fix: "Use one of the listed schemes, enable the cargo feature that adds it (e.g. `features = [\"podman\"]`), or register a third-party adapter.",
    },
    BackendNotInstalled = "SBX_E1002" {
        title: "Backend not installed",
        meaning: "The backend is compiled in but the engine it drives is not installed on this host.",
        fix: "Install and start the engine; on Debian run `cargo xtask setup` as root.",
    },
    EngineUnavailable = "SBX_E1003" {
        title: "Engine unavailable",
        meaning: "The engine's API socket did not answer (daemon stopped, wrong `DOCKER_HOST` / `CONTAINER_HOST`, or permissions).",
        fix: "Start the engine (the hint gives the exact command) or point the environment variable at a running one; `sandbox doctor` checks.",
    },
    CapabilityNotSupported = "SBX_E1101" {
        title: "Capability not supported",
        meaning: "The operation needs a capability this sandbox does not declare. Adapters never emulate or silently ignore an undeclared capability.",
        fix: "Pick a backend that declares the capability (the message lists them) or drop the option.",
    },
    Creation = "SBX_E1201" {
        title: "Sandbox creation failed",
        meaning: "The engine refused or failed to create or start the sandbox (missing image, invalid runtime, resource exhaustion).",
        fix: "Read the source error; check the template image exists (`cargo xtask setup` builds the test images).",
    },
    Connect = "SBX_E1202" {
        title: "Connect failed",
        meaning: "`connect` found no live sandbox with that id, or a kill could not reach the engine.",
        fix: "Check the id with `sandbox reap`; a sandbox whose kill failed is removed with `sandbox reap --kill`.",
    },
    CreateTimeout = "SBX_E1203" {
        title: "Create timed out",
        meaning: "The sandbox did not become usable in time; anything provisioned was removed.",
        fix: "Retry; check engine load with `sandbox doctor`.",
    },
    SandboxGone = "SBX_E1204" {
        title: "Sandbox gone",
        meaning: "The sandbox no longer exists: it was killed, or its lifetime (`CreateOptions::timeout`) ended.",
        fix: "Create a new sandbox; raise `timeout` if the lifetime was too short.",
    },
    ImageUnavailable = "SBX_E1205" {
        title: "Image unavailable",
        meaning: "The template image is not on the engine and could not be pulled: the registry has no such image or tag, the registry could not be reached, or the pull policy is `never`. The message names the image and the registry.",
        fix: "Check the image name and tag, build it from `images/` (see docs/images.md), pull it with the engine's CLI, or allow pulls (`PullPolicy::Missing`).",
    },
    SandboxPaused = "SBX_E1206" {
        title: "Sandbox paused",
        meaning: "The sandbox is paused (`Sandbox::pause`): every process in it is frozen, so nothing but `resume` and `kill` can be done with it. The call was refused at once instead of waiting.",
        fix: "Call `resume()` first (`sandbox resume <id>` on a session), or `kill()` it.",
    },
    SandboxStopped = "SBX_E1207" {
        title: "Sandbox stopped",
        meaning: "The sandbox is stopped (`Sandbox::stop`): no process runs in it, so nothing but `start`, `kill` and a snapshot can be done with it. Its files, id, policy and labels are kept; its interpreter contexts are gone. The call was refused at once instead of waiting.",
        fix: "Call `start()` first (`sandbox start <id>` on a session), or `kill()` it.",
    },
    Execution = "SBX_E1301" {
        title: "Command failed",
        meaning: "`ExecResult::raise_for_status` found a non-zero exit code.",
        fix: "Inspect `stderr` of the result carried by the error.",
    },
    ExecutionTimeout = "SBX_E1302" {
        title: "Execution timed out",
        meaning: "The command ran past its timeout; its process tree was killed and the sandbox is still usable.",
        fix: "Raise `RunOptions::timeout` or make the command finish sooner.",
    },
    InterpreterMissing = "SBX_E1303" {
        title: "Interpreter missing",
        meaning: "`run_code` needs an interpreter the sandbox template does not contain.",
        fix: "Use a template with the interpreter (e.g. `sandbox-rs/python:3.11`).",
    },
    NetworkPolicyViolation = "SBX_E1401" {
        title: "Network policy violation",
        meaning: "The requested network access is outside the sandbox's network policy.",
        fix: "Allow the host in `NetworkPolicy` if the backend supports it.",
    },
    ResourceLimitExceeded = "SBX_E1402" {
        title: "Resource limit exceeded",
        meaning: "A named limit was reached (memory, pids, output buffer cap, a sandbox's maximum lifetime when `extend` would pass it).",
        fix: "Raise the named limit, or use `stream` for unbounded output.",
    },
    Auth = "SBX_E1501" {
        title: "Authentication failed",
        meaning: "A credential the backend needs is missing or rejected.",
        fix: "Set the named environment variable.",
    },
    RateLimit = "SBX_E1502" {
        title: "Rate limited",
        meaning: "The provider refused the request for rate reasons.",
        fix: "Retry later with backoff.",
    },
    AuditSink = "SBX_E1601" {
        title: "Audit sink failed",
        meaning: "The configured audit sink could not record an operation.",
        fix: "Check the sink's destination (file permissions, disk space).",
    },
    FileSystem = "SBX_E1700" {
        title: "File system error",
        meaning: "A sandbox file operation failed.",
        fix: "Read the source error and the path.",
    },
    PathNotFound = "SBX_E1701" {
        title: "Path not found",
        meaning: "The sandbox path does not exist.",
        fix: "Check the path; relative paths resolve against the sandbox workdir (`/work`).",
    },
    IsADirectory = "SBX_E1702" {
        title: "Is a directory",
        meaning: "A file operation (read) was given a directory.",
        fix: "Use `ls` or `download` for directories.",
    },
    UnsafeArchiveEntry = "SBX_E1703" {
        title: "Unsafe archive entry",
        meaning: "A downloaded archive held an absolute, `..` or symlink-escaping entry; nothing was written outside the target.",
        fix: "Treat the sandbox as hostile; download individual files instead.",
    },
    Engine = "SBX_E1800" {
        title: "Engine error",
        meaning: "The engine returned an error no more specific code describes. The source error is kept.",
        fix: "Read the source error; `sandbox doctor` checks the engine.",
    },
}

impl ErrorCode {
    /// Looks a code up by its string form.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// The documentation page for this code.
    pub fn url(self) -> String {
        format!("{DOCS_BASE_URL}{}.md", self.as_str())
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn codes_are_unique_ordered_and_parse_back() {
        let set: BTreeSet<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(set.len(), ErrorCode::ALL.len());
        let in_order: Vec<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert!(
            in_order.windows(2).all(|w| w[0] < w[1]),
            "table is in numeric order"
        );
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(c.as_str()), Some(*c));
            assert!(c.url().ends_with(&format!("{}.md", c.as_str())));
            assert!(!c.doc().title.is_empty() && !c.doc().fix.is_empty());
        }
    }
}
