//! The catalog of stable error codes: the single source the docs pages are generated from.

/// A stable error code (`SBX_E1000` …). Codes never change meaning once released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ErrorCode {
    /// SBX_E1000
    Configuration,
    /// SBX_E1001
    BackendNotFound,
    /// SBX_E1002
    BackendNotInstalled,
    /// SBX_E1003
    EngineUnavailable,
    /// SBX_E1101
    CapabilityNotSupported,
    /// SBX_E1201
    Creation,
    /// SBX_E1202
    Connect,
    /// SBX_E1203
    CreateTimeout,
    /// SBX_E1204
    SandboxGone,
    /// SBX_E1301
    Execution,
    /// SBX_E1302
    ExecutionTimeout,
    /// SBX_E1303
    InterpreterMissing,
    /// SBX_E1401
    NetworkPolicyViolation,
    /// SBX_E1402
    ResourceLimitExceeded,
    /// SBX_E1501
    Auth,
    /// SBX_E1502
    RateLimit,
    /// SBX_E1601
    AuditSink,
    /// SBX_E1700
    FileSystem,
    /// SBX_E1701
    PathNotFound,
    /// SBX_E1702
    IsADirectory,
    /// SBX_E1703
    UnsafeArchiveEntry,
    /// SBX_E1800
    Engine,
}

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

impl ErrorCode {
    /// Every code, in numeric order.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::Configuration,
        ErrorCode::BackendNotFound,
        ErrorCode::BackendNotInstalled,
        ErrorCode::EngineUnavailable,
        ErrorCode::CapabilityNotSupported,
        ErrorCode::Creation,
        ErrorCode::Connect,
        ErrorCode::CreateTimeout,
        ErrorCode::SandboxGone,
        ErrorCode::Execution,
        ErrorCode::ExecutionTimeout,
        ErrorCode::InterpreterMissing,
        ErrorCode::NetworkPolicyViolation,
        ErrorCode::ResourceLimitExceeded,
        ErrorCode::Auth,
        ErrorCode::RateLimit,
        ErrorCode::AuditSink,
        ErrorCode::FileSystem,
        ErrorCode::PathNotFound,
        ErrorCode::IsADirectory,
        ErrorCode::UnsafeArchiveEntry,
        ErrorCode::Engine,
    ];

    /// The stable string form (`"SBX_E1000"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Configuration => "SBX_E1000",
            ErrorCode::BackendNotFound => "SBX_E1001",
            ErrorCode::BackendNotInstalled => "SBX_E1002",
            ErrorCode::EngineUnavailable => "SBX_E1003",
            ErrorCode::CapabilityNotSupported => "SBX_E1101",
            ErrorCode::Creation => "SBX_E1201",
            ErrorCode::Connect => "SBX_E1202",
            ErrorCode::CreateTimeout => "SBX_E1203",
            ErrorCode::SandboxGone => "SBX_E1204",
            ErrorCode::Execution => "SBX_E1301",
            ErrorCode::ExecutionTimeout => "SBX_E1302",
            ErrorCode::InterpreterMissing => "SBX_E1303",
            ErrorCode::NetworkPolicyViolation => "SBX_E1401",
            ErrorCode::ResourceLimitExceeded => "SBX_E1402",
            ErrorCode::Auth => "SBX_E1501",
            ErrorCode::RateLimit => "SBX_E1502",
            ErrorCode::AuditSink => "SBX_E1601",
            ErrorCode::FileSystem => "SBX_E1700",
            ErrorCode::PathNotFound => "SBX_E1701",
            ErrorCode::IsADirectory => "SBX_E1702",
            ErrorCode::UnsafeArchiveEntry => "SBX_E1703",
            ErrorCode::Engine => "SBX_E1800",
        }
    }

    /// Looks a code up by its string form.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// The documentation page for this code.
    pub fn url(self) -> String {
        format!("{DOCS_BASE_URL}{}.md", self.as_str())
    }

    /// Title, meaning and general fix.
    pub fn doc(self) -> CodeDoc {
        let (title, meaning, fix) = match self {
            ErrorCode::Configuration => (
                "Configuration error",
                "An option, DSN or environment setting is invalid: a zero or negative limit, a zero or unbounded timeout, a reserved or malformed label or env key, an unknown DSN parameter, or requiring the `unknown` isolation tier. Raised before anything is provisioned.",
                "Correct the named setting; the hint says which value is accepted.",
            ),
            ErrorCode::BackendNotFound => (
                "Backend not found",
                "The DSN scheme names no backend compiled into this build or registered at run time.",
                "Use one of the listed schemes, enable the cargo feature that adds it (e.g. `features = [\"podman\"]`), or register a third-party adapter.",
            ),
            ErrorCode::BackendNotInstalled => (
                "Backend not installed",
                "The backend is compiled in but the engine it drives is not installed on this host.",
                "Install and start the engine; on Debian run `cargo xtask setup` as root.",
            ),
            ErrorCode::EngineUnavailable => (
                "Engine unavailable",
                "The engine's API socket did not answer (daemon stopped, wrong `DOCKER_HOST` / `CONTAINER_HOST`, or permissions).",
                "Start the engine (the hint gives the exact command) or point the environment variable at a running one; `sandbox doctor` checks.",
            ),
            ErrorCode::CapabilityNotSupported => (
                "Capability not supported",
                "The operation needs a capability this sandbox does not declare. Adapters never emulate or silently ignore an undeclared capability.",
                "Pick a backend that declares the capability (the message lists them) or drop the option.",
            ),
            ErrorCode::Creation => (
                "Sandbox creation failed",
                "The engine refused or failed to create or start the sandbox (missing image, invalid runtime, resource exhaustion).",
                "Read the source error; check the template image exists (`cargo xtask setup` builds the test images).",
            ),
            ErrorCode::Connect => (
                "Connect failed",
                "`connect` found no live sandbox with that id, or a kill could not reach the engine.",
                "Check the id with `sandbox reap`; a sandbox whose kill failed is removed with `sandbox reap --kill`.",
            ),
            ErrorCode::CreateTimeout => (
                "Create timed out",
                "The sandbox did not become usable in time; anything provisioned was removed.",
                "Retry; check engine load with `sandbox doctor`.",
            ),
            ErrorCode::SandboxGone => (
                "Sandbox gone",
                "The sandbox no longer exists: it was killed, or its lifetime (`CreateOptions::timeout`) ended.",
                "Create a new sandbox; raise `timeout` if the lifetime was too short.",
            ),
            ErrorCode::Execution => (
                "Command failed",
                "`ExecResult::raise_for_status` found a non-zero exit code.",
                "Inspect `stderr` of the result carried by the error.",
            ),
            ErrorCode::ExecutionTimeout => (
                "Execution timed out",
                "The command ran past its timeout; its process tree was killed and the sandbox is still usable.",
                "Raise `RunOptions::timeout` or make the command finish sooner.",
            ),
            ErrorCode::InterpreterMissing => (
                "Interpreter missing",
                "`run_code` needs an interpreter the sandbox template does not contain.",
                "Use a template with the interpreter (e.g. `sandbox-rs/python:3.11`).",
            ),
            ErrorCode::NetworkPolicyViolation => (
                "Network policy violation",
                "The requested network access is outside the sandbox's network policy.",
                "Allow the host in `NetworkPolicy` if the backend supports it.",
            ),
            ErrorCode::ResourceLimitExceeded => (
                "Resource limit exceeded",
                "A named limit was reached (memory, pids, output buffer cap).",
                "Raise the named limit, or use `stream` for unbounded output.",
            ),
            ErrorCode::Auth => (
                "Authentication failed",
                "A credential the backend needs is missing or rejected.",
                "Set the named environment variable.",
            ),
            ErrorCode::RateLimit => (
                "Rate limited",
                "The provider refused the request for rate reasons.",
                "Retry later with backoff.",
            ),
            ErrorCode::AuditSink => (
                "Audit sink failed",
                "The configured audit sink could not record an operation.",
                "Check the sink's destination (file permissions, disk space).",
            ),
            ErrorCode::FileSystem => (
                "File system error",
                "A sandbox file operation failed.",
                "Read the source error and the path.",
            ),
            ErrorCode::PathNotFound => (
                "Path not found",
                "The sandbox path does not exist.",
                "Check the path; relative paths resolve against the sandbox workdir (`/work`).",
            ),
            ErrorCode::IsADirectory => (
                "Is a directory",
                "A file operation (read) was given a directory.",
                "Use `ls` or `download` for directories.",
            ),
            ErrorCode::UnsafeArchiveEntry => (
                "Unsafe archive entry",
                "A downloaded archive held an absolute, `..` or symlink-escaping entry; nothing was written outside the target.",
                "Treat the sandbox as hostile; download individual files instead.",
            ),
            ErrorCode::Engine => (
                "Engine error",
                "The engine returned an error no more specific code describes. The source error is kept.",
                "Read the source error; `sandbox doctor` checks the engine.",
            ),
        };
        CodeDoc {
            title,
            meaning,
            fix,
        }
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
    fn codes_are_unique_and_parse_back() {
        let set: BTreeSet<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(set.len(), ErrorCode::ALL.len());
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(c.as_str()), Some(*c));
            assert!(c.url().ends_with(&format!("{}.md", c.as_str())));
        }
    }
}
