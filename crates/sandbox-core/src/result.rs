//! What running work returns: `ExecResult`, output chunks and rich results.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{Result, SandboxError};

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One piece of streamed output.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct OutputChunk {
    /// Which stream.
    pub stream: StreamKind,
    /// The bytes, exactly as produced.
    #[cfg_attr(feature = "serde", serde(with = "crate::serialization::bytes_text"))]
    pub data: Bytes,
}

impl OutputChunk {
    /// A stdout chunk.
    pub fn stdout(data: impl Into<Bytes>) -> Self {
        OutputChunk {
            stream: StreamKind::Stdout,
            data: data.into(),
        }
    }
    /// A stderr chunk.
    pub fn stderr(data: impl Into<Bytes>) -> Self {
        OutputChunk {
            stream: StreamKind::Stderr,
            data: data.into(),
        }
    }
}

/// A typed rich result of `run_code` (e.g. an image), identified by MIME type.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct RichResult {
    /// MIME type, e.g. `text/plain`, `image/png`.
    pub mime: String,
    /// The payload.
    #[cfg_attr(feature = "serde", serde(with = "crate::serialization::bytes_text"))]
    pub data: Bytes,
}

impl RichResult {
    /// A rich result.
    pub fn new(mime: impl Into<String>, data: impl Into<Bytes>) -> Self {
        RichResult {
            mime: mime.into(),
            data: data.into(),
        }
    }
}

/// The outcome of `run`, `run_code` or `Process::wait`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default)
)]
#[non_exhaustive]
pub struct ExecResult {
    /// Exit code of the process.
    pub exit_code: i64,
    /// Captured stdout (empty when `streamed`).
    #[cfg_attr(feature = "serde", serde(with = "crate::serialization::bytes_text"))]
    pub stdout: Bytes,
    /// Captured stderr (empty when `streamed`).
    #[cfg_attr(feature = "serde", serde(with = "crate::serialization::bytes_text"))]
    pub stderr: Bytes,
    /// True when the output was delivered through a stream instead.
    pub streamed: bool,
    /// Typed rich results (`run_code` only; empty when the backend has none).
    pub results: Vec<RichResult>,
}

impl ExecResult {
    /// A buffered result.
    pub fn new(exit_code: i64, stdout: impl Into<Bytes>, stderr: impl Into<Bytes>) -> Self {
        ExecResult {
            exit_code,
            stdout: stdout.into(),
            stderr: stderr.into(),
            streamed: false,
            results: vec![],
        }
    }

    /// The result of a streamed process (empty stdout/stderr).
    pub fn streamed(exit_code: i64) -> Self {
        ExecResult {
            exit_code,
            streamed: true,
            ..Default::default()
        }
    }

    /// Whether the exit code is 0.
    pub fn ok(&self) -> bool {
        self.exit_code == 0
    }

    /// `Ok(self)` on exit 0, else [`SandboxError::Execution`] carrying the exit code and
    /// stderr.
    pub fn raise_for_status(self) -> Result<Self> {
        if self.ok() {
            Ok(self)
        } else {
            Err(SandboxError::Execution {
                exit_code: self.exit_code,
                stderr: self.stderr,
            })
        }
    }

    /// Stdout as (lossy) UTF-8.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Stderr as (lossy) UTF-8.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}
