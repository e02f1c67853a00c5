//! One operation of the layer as it is observed: its `tracing` span (opened by
//! `op_span!`), its timing and its audit record, finished once with the outcome. The
//! checks and the forwarding are the wrappers'; writing the record is the configuration's.

use std::time::{Instant, SystemTime};

use crate::audit::{AuditRecord, Outcome, Redactor};
use crate::{Command, ExecResult, IsolationTier, Result};

use super::config::Layer;

/// One operation in flight: its span, start time and record.
pub(super) struct Op {
    pub(super) span: tracing::Span,
    started: Instant,
    pub(super) record: AuditRecord,
}

/// The span of one operation: named for it, with every field the layer may record
/// declared up front (a `tracing` span cannot gain fields later).
macro_rules! op_span {
    ($name:literal, $backend:expr, $tier:expr) => {
        tracing::info_span!(
            target: "sandbox",
            $name,
            backend = %$backend,
            sandbox_id = ::tracing::field::Empty,
            tier = %$tier,
            exit_code = ::tracing::field::Empty,
            duration_us = ::tracing::field::Empty,
            bytes = ::tracing::field::Empty,
            error_code = ::tracing::field::Empty,
            path = ::tracing::field::Empty,
            command_sha256 = ::tracing::field::Empty,
            code_sha256 = ::tracing::field::Empty,
            noop = ::tracing::field::Empty,
            egress = ::tracing::field::Empty,
        )
    };
}
pub(super) use op_span;

impl Op {
    pub(super) fn new(
        span: tracing::Span,
        operation: &'static str,
        backend: &str,
        tier: IsolationTier,
    ) -> Self {
        Op {
            span,
            started: Instant::now(),
            record: AuditRecord::new(operation, backend, tier, SystemTime::now()),
        }
    }

    pub(super) fn sandbox(mut self, id: &str) -> Self {
        self.span.record("sandbox_id", id);
        self.record.sandbox_id = Some(id.to_string());
        self
    }

    pub(super) fn path(mut self, redactor: &Redactor, path: &str) -> Self {
        let shown = redactor.redact(path);
        self.span.record("path", shown.as_str());
        self.record.path = Some(shown);
        self
    }

    pub(super) fn command(mut self, cmd: &Command) -> Self {
        let digest = command_digest(cmd);
        self.span.record("command_sha256", digest.as_str());
        self.record.command_sha256 = Some(digest);
        self
    }

    pub(super) fn bytes(&mut self, n: u64) {
        self.span.record("bytes", n);
        self.record.bytes = Some(n);
    }

    pub(super) fn exit_code(&mut self, code: i64) {
        self.span.record("exit_code", code);
        self.record.exit_code = Some(code);
    }

    pub(super) fn egress(mut self, egress: &crate::Egress) -> Self {
        let shown = egress.to_string();
        self.span.record("egress", shown.as_str());
        self.record.egress = Some(shown);
        self
    }

    pub(super) fn noop(&mut self) {
        self.span.record("noop", true);
        self.record.noop = true;
    }

    /// Records the outcome on the span and in the record, writes the record, and returns
    /// the operation's result — or `AuditSink` when a strict sink failed.
    pub(super) fn finish<T>(
        mut self,
        layer: &Layer,
        redactor: &Redactor,
        result: Result<T>,
    ) -> (Result<T>, Result<()>) {
        let elapsed = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.span.record("duration_us", elapsed);
        self.record.duration_us = elapsed;
        let result = result.map_err(|e| layer.fill_support(e));
        if let Err(e) = &result {
            let code = e.code().as_str();
            self.span.record("error_code", code);
            self.record.outcome = Outcome::Error;
            self.record.error_code = Some(code);
            self.record.error = Some(e.to_string());
        }
        let audit = layer.emit(redactor, self.record);
        (result, audit)
    }

    /// [`Op::finish`] for operations with nothing to undo: a strict audit failure replaces
    /// a successful result.
    pub(super) fn end<T>(self, layer: &Layer, redactor: &Redactor, result: Result<T>) -> Result<T> {
        match self.finish(layer, redactor, result) {
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(audit)) => Err(audit),
            (Err(e), _) => Err(e),
        }
    }
}

/// Names a command in spans and records without storing it.
fn command_digest(cmd: &Command) -> String {
    sha256_hex(cmd.to_argv().join("\0").as_bytes())
}

/// The SHA-256 of `data` as 64 lower-case hex digits: names code and commands in spans and
/// audit records without storing them.
pub(super) fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    use std::fmt::Write as _;
    sha2::Sha256::digest(data)
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            // Writing to a String cannot fail.
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// What a run printed, in bytes (both streams).
pub(super) fn output_bytes(r: &ExecResult) -> u64 {
    (r.stdout.len() + r.stderr.len()) as u64
}
