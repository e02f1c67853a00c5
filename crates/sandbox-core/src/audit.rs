//! Audit records: one per operation, redacted once, handed to every [`AuditSink`].
//!
//! The enforcement layer ([`crate::layer`]) builds one [`AuditRecord`] when an operation
//! ends (successfully or not), applies redaction once — every secret value and env value
//! the sandbox or the call was given is replaced by `***` in the free-text fields — and
//! then passes the same record to each sink. Code and commands are never stored: the
//! record carries their SHA-256 (`code_sha256`, `command_sha256`); code text is kept only
//! when the layer was built with [`Layer::record_code`](crate::layer::Layer::record_code).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::Serialize;

use crate::{BoxError, IsolationTier, Result, SandboxError, Secret};

/// What an operation ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The operation returned `Ok`.
    Ok,
    /// The operation returned an error (its code is in [`AuditRecord::error_code`]).
    Error,
}

/// One operation, as the audit trail sees it. Serialised as one JSON object per line by
/// [`JsonLinesSink`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AuditRecord {
    /// The span name of the operation (`sandbox.run`, `sandbox.files.read`, …).
    pub operation: &'static str,
    /// When the operation started, in milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// How long it took, in microseconds.
    pub duration_us: u64,
    /// Backend name.
    pub backend: String,
    /// Sandbox id, once known (absent for a refused `create`).
    pub sandbox_id: Option<String>,
    /// Isolation tier of the backend.
    pub tier: IsolationTier,
    /// `ok` or `error`.
    pub outcome: Outcome,
    /// The stable error code when the outcome is `error`.
    pub error_code: Option<&'static str>,
    /// The error message (redacted) when the outcome is `error`.
    pub error: Option<String>,
    /// Exit code of `run` / `run_code`.
    pub exit_code: Option<i64>,
    /// Bytes moved: output of `run`/`run_code`, file contents read or written.
    pub bytes: Option<u64>,
    /// Sandbox path of a file operation (redacted).
    pub path: Option<String>,
    /// SHA-256 (hex) of the command's argv joined by NUL bytes (`run`, `stream`).
    pub command_sha256: Option<String>,
    /// SHA-256 (hex) of the code text (`run_code`).
    pub code_sha256: Option<String>,
    /// The code text itself (redacted), only when recording code was opted into.
    pub code: Option<String>,
    /// True when the layer answered without calling the adapter (a second `kill`).
    pub noop: bool,
    /// The egress policy a `set_egress` set (its display form).
    pub egress: Option<String>,
    /// The destination host of a request the sandbox's credentials proxy took
    /// (`credentials.request`).
    pub host: Option<String>,
    /// That request's HTTP method.
    pub method: Option<String>,
    /// The HTTP status the sandbox was answered with (the host's, or the proxy's own
    /// refusal).
    pub status: Option<u16>,
    /// The variables of the credentials whose real value was put into that request
    /// (names only, never values).
    pub credentials: Option<Vec<String>>,
    /// The repository a request to the sandbox's git gate named (`git.request`): its name
    /// in the gate's URLs (`<name>.git`), never its path on the host.
    pub repo: Option<String>,
    /// What a request of the sandbox asked for: the git service of a `git.request`
    /// (`git-upload-pack`, a fetch or clone; `git-receive-pack`, a push), the message type
    /// of an `ssh_agent.request` (`list`, `sign`, `add_identity`, …, `type_<n>`).
    pub request: Option<String>,
    /// The refs a push through the git gate asked to update (`git.request`; written by
    /// the sandbox, so capped by the gate).
    pub refs: Option<Vec<String>>,
    /// The SHA-256 fingerprint (`SHA256:…`, as `ssh-add -l` prints it) of the key an
    /// `ssh_agent.request` asked to sign with; never more of the key.
    pub key: Option<String>,
}

impl AuditRecord {
    /// A record of `operation` on `backend`, started at `started`; everything else empty.
    pub fn new(
        operation: &'static str,
        backend: impl Into<String>,
        tier: IsolationTier,
        started: SystemTime,
    ) -> Self {
        AuditRecord {
            operation,
            started_at_ms: started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0),
            duration_us: 0,
            backend: backend.into(),
            sandbox_id: None,
            tier,
            outcome: Outcome::Ok,
            error_code: None,
            error: None,
            exit_code: None,
            bytes: None,
            path: None,
            command_sha256: None,
            code_sha256: None,
            code: None,
            noop: false,
            egress: None,
            host: None,
            method: None,
            status: None,
            credentials: None,
            repo: None,
            request: None,
            refs: None,
            key: None,
        }
    }

    /// `text` cut to at most `max` bytes (at a character boundary), marked with `…` when
    /// cut: for the fields a sandbox writes (a host, a path, a ref name), so that the
    /// host's audit trail does not grow by whatever the sandbox sends.
    pub fn capped(text: impl Into<String>, max: usize) -> String {
        let mut s = text.into();
        if s.len() > max {
            let mut end = max;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
            s.push('…');
        }
        s
    }

    /// The record as one line of JSON (no trailing newline).
    pub fn to_json(&self) -> String {
        // Serialising plain strings, numbers and enums cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Receives one record per operation, already redacted.
///
/// Synchronous on purpose: it is called from `Sandbox::stream` (a plain fn) as well as from
/// async operations, and a sink that needs I/O should buffer or hand off to its own task.
/// In strict mode ([`Layer::strict`](crate::layer::Layer::strict)) an error fails the
/// operation with `SBX_E1601` ([`SandboxError::AuditSink`]); otherwise it is reported as a
/// `tracing` warning and the operation's own result is returned.
pub trait AuditSink: Send + Sync + fmt::Debug {
    /// Records one operation.
    fn record(&self, record: &AuditRecord) -> std::result::Result<(), BoxError>;
}

/// The default sink: drops every record.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopSink;

impl AuditSink for NoopSink {
    fn record(&self, _record: &AuditRecord) -> std::result::Result<(), BoxError> {
        Ok(())
    }
}

/// Keeps records in memory, for tests and for callers that ship records themselves.
#[derive(Debug, Default)]
pub struct MemorySink {
    records: Mutex<Vec<AuditRecord>>,
}

impl MemorySink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every record so far, in order.
    pub fn records(&self) -> Vec<AuditRecord> {
        self.records
            .lock()
            .map(|r| r.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
}

impl AuditSink for MemorySink {
    fn record(&self, record: &AuditRecord) -> std::result::Result<(), BoxError> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record.clone());
        Ok(())
    }
}

/// Appends each record as one JSON object per line to a file (created with mode `0600`
/// on Unix, since records name sandboxes, paths and errors).
///
/// Each record is written with a single `write_all` of the whole line and flushed, so
/// concurrent operations never interleave inside a line.
#[derive(Debug)]
pub struct JsonLinesSink {
    path: PathBuf,
    file: Mutex<File>,
}

impl JsonLinesSink {
    /// Opens (creating or appending to) `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut opts = OpenOptions::new();
        opts.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            opts.mode(0o600);
        }
        let file = opts.open(&path).map_err(|e| {
            SandboxError::audit_sink(format!("cannot open audit log {}", path.display()))
                .with_source(e)
        })?;
        Ok(JsonLinesSink {
            path,
            file: Mutex::new(file),
        })
    }

    /// The file records are appended to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AuditSink for JsonLinesSink {
    fn record(&self, record: &AuditRecord) -> std::result::Result<(), BoxError> {
        let mut line = record.to_json();
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(line.as_bytes())?;
        file.flush()?;
        Ok(())
    }
}

/// The values redaction hides: secret values and env values of a sandbox and of a call.
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    values: Vec<Secret>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} values)", self.values.len())
    }
}

impl Redactor {
    /// Adds values to hide; empty ones are skipped (they would match everywhere).
    pub(crate) fn extend<'a>(&mut self, values: impl IntoIterator<Item = &'a str>) {
        for v in values {
            if !v.is_empty() && !self.values.iter().any(|s| s.expose() == v) {
                self.values.push(Secret::new(v));
            }
        }
        // Longest first, so a value that contains another is hidden whole.
        self.values
            .sort_by_key(|s| std::cmp::Reverse(s.expose().len()));
    }

    /// This redactor plus more values (for one call's env).
    pub(crate) fn with<'a>(&self, values: impl IntoIterator<Item = &'a str>) -> Redactor {
        let mut r = self.clone();
        r.extend(values);
        r
    }

    /// `text` with every known value replaced by `***`.
    pub(crate) fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for v in &self.values {
            if out.contains(v.expose()) {
                out = out.replace(v.expose(), "***");
            }
        }
        out
    }

    /// Applies redaction to every free-text field of a record, once, before any sink.
    pub(crate) fn redact_record(&self, record: &mut AuditRecord) {
        for field in [
            &mut record.error,
            &mut record.path,
            &mut record.code,
            &mut record.host,
            &mut record.method,
        ] {
            if let Some(text) = field.as_mut() {
                *text = self.redact(text);
            }
        }
        for text in record.refs.iter_mut().flatten() {
            *text = self.redact(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AuditRecord {
        let mut r = AuditRecord::new(
            "sandbox.run",
            "fake",
            IsolationTier::Container,
            SystemTime::UNIX_EPOCH,
        );
        r.sandbox_id = Some("sb-1".into());
        r.exit_code = Some(0);
        r
    }

    #[test]
    fn json_lines_sink_appends_one_object_per_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let sink = JsonLinesSink::open(&path).unwrap();
        sink.record(&record()).unwrap();
        let mut second = record();
        second.operation = "sandbox.kill";
        sink.record(&second).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["operation"], "sandbox.run");
        assert_eq!(lines[0]["sandbox_id"], "sb-1");
        assert_eq!(lines[0]["tier"], "container");
        assert_eq!(lines[0]["outcome"], "ok");
        assert_eq!(lines[1]["operation"], "sandbox.kill");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "audit log readable by others: {mode:o}");
        }
    }

    #[test]
    fn json_lines_sink_open_failure_is_audit_sink_error() {
        let e = JsonLinesSink::open("/nonexistent-dir-sbx/audit.jsonl").unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::AuditSink);
    }

    #[test]
    fn redaction_hides_values_longest_first() {
        let mut r = Redactor::default();
        r.extend(["hunter2", "hunter2-extended", ""]);
        assert_eq!(r.redact("a hunter2-extended b hunter2 c"), "a *** b *** c");
        let mut rec = record();
        rec.error = Some("failed with hunter2".into());
        rec.path = Some("/work/hunter2.txt".into());
        r.redact_record(&mut rec);
        assert_eq!(rec.error.as_deref(), Some("failed with ***"));
        assert_eq!(rec.path.as_deref(), Some("/work/***.txt"));
        assert!(!format!("{r:?}").contains("hunter2"));
    }

    #[test]
    fn ref_names_are_redacted_like_paths() {
        let mut r = Redactor::default();
        r.extend(["hunter2"]);
        let mut rec = record();
        rec.refs = Some(vec!["refs/heads/hunter2".into(), "refs/heads/x".into()]);
        r.redact_record(&mut rec);
        assert_eq!(
            rec.refs,
            Some(vec![
                "refs/heads/***".to_string(),
                "refs/heads/x".to_string()
            ])
        );
    }

    #[test]
    fn capped_text_is_cut_at_a_character_boundary() {
        assert_eq!(AuditRecord::capped("GET", 32), "GET");
        let cut = AuditRecord::capped("/".repeat(5000), 1024);
        assert_eq!(cut.len(), 1024 + '…'.len_utf8());
        assert!(cut.ends_with('…'));
        let cut = AuditRecord::capped("é".repeat(600), 1023);
        assert!(cut.len() <= 1023 + '…'.len_utf8() && cut.ends_with('…'));
    }

    #[test]
    fn every_field_is_in_the_json_even_when_empty() {
        let v: serde_json::Value = serde_json::from_str(&record().to_json()).unwrap();
        for field in ["host", "credentials", "repo", "request", "refs", "key"] {
            assert!(v.get(field).is_some_and(|f| f.is_null()), "{field}: {v}");
        }
    }
}
