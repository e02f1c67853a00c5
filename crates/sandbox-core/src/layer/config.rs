//! The layer's configuration ([`Layer`]): which audit sinks get every operation's record,
//! whether a failing sink fails the operation, whether code text is recorded, who fills
//! `supported_by` — and the writing of one record to those sinks. How a layer wraps a
//! backend is the parent module's; what it checks is the wrappers'.

use std::fmt;
use std::sync::Arc;

use crate::audit::{AuditRecord, AuditSink, Redactor};
use crate::{Capability, Result, SandboxError};

/// `tracing` target of the layer's spans and events.
pub const TARGET: &str = "sandbox";

/// Which backends declare a capability; filled into `CapabilityNotSupported` errors that
/// carry none. Core knows no first-party list; the `sandbox` facade supplies one.
pub type SupportDirectory = fn(Capability) -> Vec<String>;

/// Configuration of the enforcement layer: audit sinks, strictness, code recording.
#[derive(Clone, Default)]
pub struct Layer {
    sinks: Vec<Arc<dyn AuditSink>>,
    strict: bool,
    pub(super) record_code: bool,
    directory: Option<SupportDirectory>,
}

impl fmt::Debug for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layer")
            .field("sinks", &self.sinks)
            .field("strict", &self.strict)
            .field("record_code", &self.record_code)
            .field("directory", &self.directory.is_some())
            .finish()
    }
}

impl Layer {
    /// The default layer: every check, spans, no audit sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an audit sink; every operation's record goes to each sink in order.
    pub fn audit(mut self, sink: Arc<dyn AuditSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// In strict mode a failing sink fails the operation with `SBX_E1601`
    /// ([`SandboxError::AuditSink`]); a `create` whose record fails kills the new sandbox
    /// first. Off by default: a failing sink is then a `tracing` warning only.
    pub fn strict(mut self, on: bool) -> Self {
        self.strict = on;
        self
    }

    /// Keeps the (redacted) code text of `run_code` in audit records. Off by default: only
    /// its SHA-256 is recorded. Spans never carry code text.
    pub fn record_code(mut self, on: bool) -> Self {
        self.record_code = on;
        self
    }

    /// Fills the `supported_by` list of `CapabilityNotSupported` errors that have none.
    pub fn support_directory(mut self, directory: SupportDirectory) -> Self {
        self.directory = Some(directory);
        self
    }

    /// Whether wrapping a backend already enforced by `other` with this layer would change
    /// nothing.
    pub(super) fn adds_nothing_to(&self, other: &Layer) -> bool {
        self.sinks.is_empty()
            && (!self.strict || other.strict)
            && (!self.record_code || other.record_code)
            && (self.directory.is_none() || other.directory.is_some())
    }

    /// `existing` with this layer's settings added: sinks of both, strict or recording code
    /// if either is, `existing`'s support directory first.
    pub(super) fn merged_into(self, existing: &Layer) -> Layer {
        let mut merged = Layer::clone(existing);
        merged.sinks.extend(self.sinks);
        merged.strict |= self.strict;
        merged.record_code |= self.record_code;
        merged.directory = merged.directory.or(self.directory);
        merged
    }

    /// Writes `record` to every sink, redacted once. In strict mode the first failure is
    /// returned as `AuditSink`; otherwise failures are warnings.
    pub(super) fn emit(&self, redactor: &Redactor, record: AuditRecord) -> Result<()> {
        self.emit_to_sinks(redactor, record, self.strict)
    }

    /// Writes `record` like [`Self::emit`], but a failing sink is only a warning, strict or
    /// not (for events no call is waiting on).
    pub(super) fn emit_lenient(&self, redactor: &Redactor, record: AuditRecord) -> Result<()> {
        self.emit_to_sinks(redactor, record, false)
    }

    /// Whether no record of this layer reaches anything.
    pub(super) fn has_no_sinks(&self) -> bool {
        self.sinks.is_empty()
    }

    fn emit_to_sinks(
        &self,
        redactor: &Redactor,
        mut record: AuditRecord,
        strict: bool,
    ) -> Result<()> {
        if self.sinks.is_empty() {
            return Ok(());
        }
        redactor.redact_record(&mut record);
        let mut first_failure = None;
        for sink in &self.sinks {
            if let Err(e) = sink.record(&record) {
                tracing::warn!(
                    target: TARGET,
                    operation = record.operation,
                    sink = ?sink,
                    error_code = crate::ErrorCode::AuditSink.as_str(),
                    strict,
                    "audit sink failed"
                );
                if first_failure.is_none() {
                    first_failure = Some(e);
                }
            }
        }
        match first_failure {
            Some(e) if strict => Err(SandboxError::audit_sink(format!(
                "could not record `{}`",
                record.operation
            ))
            .with_source(e)),
            _ => Ok(()),
        }
    }

    /// `e` with its `supported_by` list filled from the support directory, when it is a
    /// `CapabilityNotSupported` error without one.
    pub(super) fn fill_support(&self, e: SandboxError) -> SandboxError {
        match (e, self.directory) {
            (
                SandboxError::CapabilityNotSupported {
                    capability,
                    backend,
                    supported_by,
                },
                Some(dir),
            ) if supported_by.is_empty() => {
                SandboxError::capability_not_supported(capability, backend, dir(capability))
            }
            (e, _) => e,
        }
    }
}
