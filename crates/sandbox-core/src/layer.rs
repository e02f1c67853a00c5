//! The one enforcement layer every backend is wrapped in.
//!
//! Like OpenDAL's layers around its services, [`enforce`] (or a configured [`Layer`])
//! wraps any [`Backend`] — first- or third-party — and every [`Sandbox`] it returns, so
//! adapters do not repeat what must behave the same everywhere:
//!
//! - **create**: options validated, `require_isolation` checked and the capabilities the
//!   requested policy needs checked ([`policy::check_create`])
//!   *before* the adapter is called; the new sandbox's tier must equal its backend's tier
//!   (else it is killed and `Creation` is returned).
//! - **run / run_code / stream / files**: undeclared capabilities are refused with
//!   `CapabilityNotSupported` naming the capability before the adapter is called
//!   (`RUN_COMMAND`, `RUN_CODE`, `STATEFUL_CODE` for a context, `STREAMING`, `FILESYSTEM`,
//!   `UPLOAD_DOWNLOAD`, `INGRESS_PORTS`); commands and options are validated; a zero
//!   timeout is refused and `timeout: None` is resolved against the sandbox's remaining
//!   lifetime, so the adapter always receives a bounded `Some(timeout)`.
//! - **kill**: idempotent — a second `kill` returns `Ok` without calling the adapter; any
//!   operation after a successful kill is `SandboxGone` without calling the adapter.
//! - **observability**: one `tracing` span per operation and one [`AuditRecord`] per
//!   operation to every [`AuditSink`], redacted once. Span names and fields are listed in
//!   `docs/observability.md`.
//!
//! # Why `Arc<dyn Backend>` in, `Arc<dyn Backend>` out
//!
//! The facade and the contract suite hold backends as `Arc<dyn Backend>` (selected at run
//! time), so the layer takes and returns exactly that rather than a typed `Layered<B>`:
//! no caller has to change type, and a typed wrapper would not help callers who only have
//! a trait object. The concrete type is still reachable: [`Backend::as_enforced`] returns
//! the [`EnforcedBackend`], and [`Sandbox::native`] of a wrapped sandbox is the adapter's
//! own native object.
//!
//! # Wrapping twice
//!
//! [`Layer::wrap`] of a backend that already is an [`EnforcedBackend`] does not add a
//! second layer: the existing one is returned, or, when the new [`Layer`] adds sinks or
//! stricter settings, one layer with both configurations merged replaces it. So the facade
//! can apply the layer unconditionally to a backend the user already wrapped with their
//! own audit sinks.
//!
//! ```
//! use std::sync::Arc;
//! use sandbox_core::layer::{Layer, MemorySink};
//! # use sandbox_core::*;
//! # #[derive(Debug)] struct Mine;
//! # #[async_trait]
//! # impl Backend for Mine {
//! #     fn name(&self) -> &str { "mine" }
//! #     fn capabilities(&self) -> Capability { Capability::empty() }
//! #     fn isolation(&self) -> IsolationTier { IsolationTier::Container }
//! #     async fn create(&self, _: CreateOptions) -> Result<Box<dyn Sandbox>> { Err(SandboxError::configuration("x")) }
//! #     async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> { Err(SandboxError::connect(id, "x")) }
//! # }
//! let audit = Arc::new(MemorySink::new());
//! let backend = Layer::new().audit(audit.clone()).strict(true).wrap(Arc::new(Mine));
//! let again = sandbox_core::layer::enforce(backend.clone());
//! assert!(Arc::ptr_eq(&backend, &again), "wrapping twice is detected");
//! ```

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use tracing::Instrument as _;
use tracing::field::Empty;

use crate::audit::Redactor;
use crate::options::MAX_SANDBOX_TIMEOUT;
use crate::{
    Backend, Capability, CodeOptions, Command, CreateOptions, EngineReport, ExecResult, FileInfo,
    FileSystem, IsolationTier, ManagedSandbox, Process, ReapableBackend, Result, RunOptions,
    Sandbox, SandboxError, policy,
};

pub use crate::audit::{AuditRecord, AuditSink, JsonLinesSink, MemorySink, NoopSink, Outcome};

/// `tracing` target of the layer's spans and events.
pub const TARGET: &str = "sandbox";

/// The shortest timeout an inherited (`None`) timeout resolves to, even when the layer's
/// own estimate of the remaining lifetime is zero: it leaves the adapter time to answer
/// `SandboxGone` for an expired sandbox instead of a spurious `ExecutionTimeout`.
pub const MIN_INHERITED_TIMEOUT: Duration = Duration::from_secs(1);

/// Which backends declare a capability; filled into `CapabilityNotSupported` errors that
/// carry none. Core knows no first-party list; the `sandbox` facade supplies one.
pub type SupportDirectory = fn(Capability) -> Vec<String>;

/// Wraps `backend` in the enforcement layer with the default configuration (no audit
/// sink). Wrapping an already wrapped backend returns it unchanged.
pub fn enforce(backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
    Layer::new().wrap(backend)
}

/// Configuration of the enforcement layer: audit sinks, strictness, code recording.
#[derive(Clone, Default)]
pub struct Layer {
    sinks: Vec<Arc<dyn AuditSink>>,
    strict: bool,
    record_code: bool,
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

    /// Wraps `backend`. When it is already an [`EnforcedBackend`], no second layer is
    /// added: it is returned as is when this layer adds nothing, else one layer with both
    /// configurations merged (sinks of both, strict if either is) replaces it.
    pub fn wrap(self, backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
        if let Some(existing) = enforced_self(&backend) {
            if self.adds_nothing_to(&existing.layer) {
                return backend;
            }
            let mut merged = Layer::clone(&existing.layer);
            merged.sinks.extend(self.sinks);
            merged.strict |= self.strict;
            merged.record_code |= self.record_code;
            merged.directory = merged.directory.or(self.directory);
            return Arc::new(EnforcedBackend {
                inner: existing.inner.clone(),
                layer: Arc::new(merged),
            });
        }
        Arc::new(EnforcedBackend {
            inner: backend,
            layer: Arc::new(self),
        })
    }

    fn adds_nothing_to(&self, other: &Layer) -> bool {
        self.sinks.is_empty()
            && (!self.strict || other.strict)
            && (!self.record_code || other.record_code)
            && (self.directory.is_none() || other.directory.is_some())
    }

    /// Writes `record` to every sink, redacted once. In strict mode the first failure is
    /// returned as `AuditSink`; otherwise failures are warnings.
    fn emit(&self, redactor: &Redactor, mut record: AuditRecord) -> Result<()> {
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
                    strict = self.strict,
                    "audit sink failed"
                );
                if first_failure.is_none() {
                    first_failure = Some(e);
                }
            }
        }
        match first_failure {
            Some(e) if self.strict => Err(SandboxError::audit_sink(format!(
                "could not record `{}`",
                record.operation
            ))
            .with_source(e)),
            _ => Ok(()),
        }
    }

    fn fill_support(&self, e: SandboxError) -> SandboxError {
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

/// The backend `b` points at, when it is itself an `EnforcedBackend` (not merely a
/// decorator forwarding `as_enforced` of one it wraps, whose own behaviour the layer
/// would then not cover).
fn enforced_self(b: &Arc<dyn Backend>) -> Option<&EnforcedBackend> {
    let e = b.as_enforced()?;
    let same = std::ptr::eq(
        e as *const EnforcedBackend as *const (),
        Arc::as_ptr(b) as *const (),
    );
    same.then_some(e)
}

/// A backend wrapped in the enforcement layer. Built by [`enforce`] or [`Layer::wrap`].
pub struct EnforcedBackend {
    inner: Arc<dyn Backend>,
    layer: Arc<Layer>,
}

impl fmt::Debug for EnforcedBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnforcedBackend")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl EnforcedBackend {
    /// The adapter's backend, unwrapped (calls on it bypass every check).
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    /// The layer's configuration.
    pub fn layer(&self) -> &Layer {
        &self.layer
    }

    fn wrap_sandbox(
        &self,
        sb: Box<dyn Sandbox>,
        redactor: Redactor,
        deadline: Option<tokio::time::Instant>,
    ) -> EnforcedSandbox {
        let shared = Arc::new(Shared {
            id: sb.id().to_string(),
            backend: self.inner.name().to_string(),
            tier: self.inner.isolation(),
            inner: sb,
            layer: self.layer.clone(),
            redactor,
            deadline,
            killed: AtomicBool::new(false),
            kill_lock: tokio::sync::Mutex::new(()),
        });
        EnforcedSandbox {
            files: EnforcedFiles {
                shared: shared.clone(),
            },
            shared,
        }
    }

    /// Refuses a new sandbox whose tier differs from its backend's (and kills it, since no
    /// caller will hold it): a weaker sandbox behind a stronger backend tier would silently
    /// defeat `require_isolation`. (`connect` refuses a mismatch too, but never kills a
    /// sandbox it did not create; the adapter's handle decides what its drop does.)
    async fn check_tier(&self, sb: Box<dyn Sandbox>) -> Result<Box<dyn Sandbox>> {
        let want = self.inner.isolation();
        let got = sb.isolation();
        if got == want {
            return Ok(sb);
        }
        let id = sb.id().to_string();
        let _ = sb.kill().await;
        Err(SandboxError::creation(
            self.inner.name(),
            format!(
                "sandbox `{id}` reports isolation tier `{got}` but its backend declares `{want}`; it was killed"
            ),
        ))
    }
}

/// One operation in flight: its span, start time and record.
struct Op {
    span: tracing::Span,
    started: Instant,
    record: AuditRecord,
}

macro_rules! op_span {
    ($name:literal, $backend:expr, $tier:expr) => {
        tracing::info_span!(
            target: "sandbox",
            $name,
            backend = %$backend,
            sandbox_id = Empty,
            tier = %$tier,
            exit_code = Empty,
            duration_us = Empty,
            bytes = Empty,
            error_code = Empty,
            path = Empty,
            command_sha256 = Empty,
            code_sha256 = Empty,
            noop = Empty,
        )
    };
}

impl Op {
    fn new(
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

    fn sandbox(mut self, id: &str) -> Self {
        self.span.record("sandbox_id", id);
        self.record.sandbox_id = Some(id.to_string());
        self
    }

    fn path(mut self, redactor: &Redactor, path: &str) -> Self {
        let shown = redactor.redact(path);
        self.span.record("path", shown.as_str());
        self.record.path = Some(shown);
        self
    }

    fn command(mut self, cmd: &Command) -> Self {
        let digest = command_digest(cmd);
        self.span.record("command_sha256", digest.as_str());
        self.record.command_sha256 = Some(digest);
        self
    }

    fn bytes(&mut self, n: u64) {
        self.span.record("bytes", n);
        self.record.bytes = Some(n);
    }

    fn exit_code(&mut self, code: i64) {
        self.span.record("exit_code", code);
        self.record.exit_code = Some(code);
    }

    fn noop(&mut self) {
        self.span.record("noop", true);
        self.record.noop = true;
    }

    /// Records the outcome on the span and in the record, writes the record, and returns
    /// the operation's result — or `AuditSink` when a strict sink failed.
    fn finish<T>(
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
    fn end<T>(self, layer: &Layer, redactor: &Redactor, result: Result<T>) -> Result<T> {
        match self.finish(layer, redactor, result) {
            (Ok(v), Ok(())) => Ok(v),
            (Ok(_), Err(audit)) => Err(audit),
            (Err(e), _) => Err(e),
        }
    }
}

fn command_digest(cmd: &Command) -> String {
    sha256_hex(cmd.to_argv().join("\0").as_bytes())
}

/// The SHA-256 of `data` as 64 lower-case hex digits: names code and commands in spans and
/// audit records without storing them.
fn sha256_hex(data: &[u8]) -> String {
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

fn output_bytes(r: &ExecResult) -> u64 {
    (r.stdout.len() + r.stderr.len()) as u64
}

#[async_trait]
impl Backend for EnforcedBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capability {
        self.inner.capabilities()
    }
    fn isolation(&self) -> IsolationTier {
        self.inner.isolation()
    }

    async fn create(&self, options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.create", name, tier);
        let op = Op::new(span.clone(), "sandbox.create", name, tier);
        let mut redactor = Redactor::default();
        redactor.extend(options.secrets.values().map(|s| s.expose()));
        redactor.extend(options.env.values().map(String::as_str));
        async move {
            let checked =
                policy::check_create(name, self.inner.capabilities(), tier, &options).map(|_| ());
            if let Err(e) = checked {
                return op.end(&self.layer, &redactor, Err(e));
            }
            // The lifetime starts no later than now, so a deadline counted from here is
            // never past the adapter's.
            let deadline = tokio::time::Instant::now() + options.timeout;
            let created = match self.inner.create(options).await {
                Ok(sb) => self.check_tier(sb).await,
                Err(e) => Err(e),
            };
            let sb = match created {
                Ok(sb) => sb,
                Err(e) => return op.end(&self.layer, &redactor, Err(e)),
            };
            let op = op.sandbox(sb.id());
            let wrapped = self.wrap_sandbox(sb, redactor.clone(), Some(deadline));
            match op.finish(&self.layer, &redactor, Ok(())) {
                (_, Ok(())) => Ok(Box::new(wrapped) as Box<dyn Sandbox>),
                (_, Err(audit)) => {
                    // Nobody will hold the handle: kill the sandbox rather than leak it.
                    let _ = wrapped.shared.inner.kill().await;
                    wrapped.shared.killed.store(true, Ordering::SeqCst);
                    Err(audit)
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.connect", name, tier);
        let op = Op::new(span.clone(), "sandbox.connect", name, tier).sandbox(id);
        let redactor = Redactor::default();
        async move {
            let connected = match self.inner.connect(id).await {
                Ok(sb) if sb.isolation() != tier => Err(SandboxError::connect(
                    id,
                    format!(
                        "sandbox reports isolation tier `{}` but this backend declares `{tier}`; connect through a backend configured for its runtime",
                        sb.isolation()
                    ),
                )),
                other => other,
            };
            let sb = match connected {
                Ok(sb) => sb,
                Err(e) => return op.end(&self.layer, &redactor, Err(e)),
            };
            // The lifetime of a sandbox created elsewhere is unknown here; the adapter's
            // own remaining lifetime bounds it when it reports one.
            let wrapped = self.wrap_sandbox(sb, redactor.clone(), None);
            op.end(&self.layer, &redactor, Ok(()))?;
            Ok(Box::new(wrapped) as Box<dyn Sandbox>)
        }
        .instrument(span)
        .await
    }

    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        self.inner
            .as_reapable()
            .map(|_| self as &dyn ReapableBackend)
    }

    async fn diagnose(&self) -> EngineReport {
        self.inner.diagnose().await
    }

    fn as_enforced(&self) -> Option<&EnforcedBackend> {
        Some(self)
    }
}

#[async_trait]
impl ReapableBackend for EnforcedBackend {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.list_managed", name, tier);
        let op = Op::new(span.clone(), "sandbox.list_managed", name, tier);
        let redactor = Redactor::default();
        async move {
            let r = match self.inner.as_reapable() {
                Some(r) => r.list_managed(labels).await,
                None => Err(SandboxError::configuration(format!(
                    "backend `{name}` cannot list managed sandboxes"
                ))),
            };
            op.end(&self.layer, &redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn kill_managed(&self, id: &str) -> Result<bool> {
        let (name, tier) = (self.inner.name(), self.inner.isolation());
        let span = op_span!("sandbox.kill_managed", name, tier);
        let op = Op::new(span.clone(), "sandbox.kill_managed", name, tier).sandbox(id);
        let redactor = Redactor::default();
        async move {
            let r = match self.inner.as_reapable() {
                Some(r) => r.kill_managed(id).await,
                None => Err(SandboxError::configuration(format!(
                    "backend `{name}` cannot kill managed sandboxes"
                ))),
            };
            op.end(&self.layer, &redactor, r)
        }
        .instrument(span)
        .await
    }
}

/// State shared by a wrapped sandbox and its file system.
struct Shared {
    inner: Box<dyn Sandbox>,
    id: String,
    backend: String,
    tier: IsolationTier,
    layer: Arc<Layer>,
    redactor: Redactor,
    /// End of the lifetime as the layer knows it (`None` after `connect`).
    deadline: Option<tokio::time::Instant>,
    killed: AtomicBool,
    /// Serialises kills, so two concurrent kills call the adapter once.
    kill_lock: tokio::sync::Mutex<()>,
}

impl Shared {
    fn op(&self, span: tracing::Span, operation: &'static str) -> Op {
        Op::new(span, operation, &self.backend, self.tier).sandbox(&self.id)
    }

    fn require(&self, needed: Capability) -> Result<()> {
        policy::require(self.inner.capabilities(), needed, &self.backend)
    }

    fn alive(&self) -> Result<()> {
        if self.killed.load(Ordering::SeqCst) {
            Err(SandboxError::gone(&self.id))
        } else {
            Ok(())
        }
    }

    /// What `timeout: None` resolves to: the remaining lifetime (never unbounded), at
    /// least [`MIN_INHERITED_TIMEOUT`].
    fn remaining(&self) -> Duration {
        let left = match self.deadline {
            Some(d) => d.saturating_duration_since(tokio::time::Instant::now()),
            None => MAX_SANDBOX_TIMEOUT,
        };
        left.max(MIN_INHERITED_TIMEOUT)
    }

    fn run_options(&self, cmd: &Command, mut options: RunOptions) -> Result<RunOptions> {
        cmd.validate()?;
        if options.stdin.is_some() || options.interactive {
            self.require(Capability::STDIN)?;
        }
        if options.pty.is_some() {
            self.require(Capability::PTY)?;
        }
        let timeout = options.validate(self.remaining())?;
        options.timeout = Some(timeout);
        Ok(options)
    }

    fn code_options(&self, mut options: CodeOptions) -> Result<CodeOptions> {
        // The most specific missing capability is named: a context needs STATEFUL_CODE
        // (which implies code), so that refusal names it even when RUN_CODE is missing too.
        if options.context_id.is_some() {
            self.require(Capability::STATEFUL_CODE)?;
        }
        self.require(Capability::RUN_CODE)?;
        let timeout = options.validate(self.remaining())?;
        options.timeout = Some(timeout);
        Ok(options)
    }
}

/// A sandbox wrapped in the enforcement layer.
pub struct EnforcedSandbox {
    shared: Arc<Shared>,
    files: EnforcedFiles,
}

impl fmt::Debug for EnforcedSandbox {
    // The adapter's own `Debug` (which shows the id and never secrets): the layer adds
    // nothing a reader needs, and must not hide an adapter that leaks.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.shared.inner, f)
    }
}

#[async_trait]
impl Sandbox for EnforcedSandbox {
    fn id(&self) -> &str {
        &self.shared.id
    }
    fn backend(&self) -> &str {
        &self.shared.backend
    }
    fn capabilities(&self) -> Capability {
        self.shared.inner.capabilities()
    }
    fn isolation(&self) -> IsolationTier {
        self.shared.inner.isolation()
    }

    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult> {
        let s = &self.shared;
        let span = op_span!("sandbox.run", s.backend, s.tier);
        let mut op = s.op(span.clone(), "sandbox.run").command(&cmd);
        let redactor = s.redactor.with(options.env.values().map(String::as_str));
        async move {
            let checked = s
                .require(Capability::RUN_COMMAND)
                .and_then(|()| s.alive())
                .and_then(|()| s.run_options(&cmd, options));
            let r = match checked {
                Ok(options) => s.inner.run(cmd, options).await,
                Err(e) => Err(e),
            };
            if let Ok(r) = &r {
                op.exit_code(r.exit_code);
                op.bytes(output_bytes(r));
            }
            op.end(&s.layer, &redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        let s = &self.shared;
        let span = op_span!("sandbox.run_code", s.backend, s.tier);
        let mut op = s.op(span.clone(), "sandbox.run_code");
        let digest = sha256_hex(code.as_bytes());
        op.span.record("code_sha256", digest.as_str());
        op.record.code_sha256 = Some(digest);
        if s.layer.record_code {
            op.record.code = Some(code.to_string());
        }
        async move {
            let checked = s.alive().and_then(|()| s.code_options(options));
            let r = match checked {
                Ok(options) => s.inner.run_code(code, options).await,
                Err(e) => Err(e),
            };
            if let Ok(r) = &r {
                op.exit_code(r.exit_code);
                op.bytes(output_bytes(r));
            }
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        let s = &self.shared;
        let span = op_span!("sandbox.stream", s.backend, s.tier);
        let _entered = span.enter();
        let op = s.op(span.clone(), "sandbox.stream").command(&cmd);
        let redactor = s.redactor.with(options.env.values().map(String::as_str));
        // The span covers starting the stream; the process runs after this returns, and
        // its output is the caller's (it starts on first poll).
        let r = s
            .require(Capability::STREAMING)
            .and_then(|()| s.alive())
            .and_then(|()| s.run_options(&cmd, options))
            .and_then(|options| s.inner.stream(cmd, options));
        op.end(&s.layer, &redactor, r)
    }

    fn files(&self) -> Result<&dyn FileSystem> {
        let s = &self.shared;
        match s.require(Capability::FILESYSTEM) {
            Ok(()) => Ok(&self.files),
            Err(e) => {
                // A refused `files()` is an operation too: it gets its span and record.
                let span = op_span!("sandbox.files", s.backend, s.tier);
                let _entered = span.enter();
                let op = s.op(span.clone(), "sandbox.files");
                op.end(&s.layer, &s.redactor, Err(e))
            }
        }
    }

    async fn kill(&self) -> Result<()> {
        let s = &self.shared;
        let span = op_span!("sandbox.kill", s.backend, s.tier);
        let mut op = s.op(span.clone(), "sandbox.kill");
        async move {
            let _serial = s.kill_lock.lock().await;
            if s.killed.load(Ordering::SeqCst) {
                op.noop();
                return op.end(&s.layer, &s.redactor, Ok(()));
            }
            let r = s.inner.kill().await;
            if r.is_ok() {
                s.killed.store(true, Ordering::SeqCst);
            }
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    fn ingress_address(&self, port: u16) -> Result<std::net::SocketAddr> {
        let s = &self.shared;
        s.require(Capability::INGRESS_PORTS)
            .and_then(|()| s.alive())
            .and_then(|()| s.inner.ingress_address(port))
            .map_err(|e| s.layer.fill_support(e))
    }

    fn native(&self) -> &dyn Any {
        self.shared.inner.native()
    }
}

/// The file system of a wrapped sandbox: each call is gated, spanned and audited, then
/// forwarded to the adapter's file system.
struct EnforcedFiles {
    shared: Arc<Shared>,
}

impl EnforcedFiles {
    fn inner(&self) -> Result<&dyn FileSystem> {
        self.shared.alive()?;
        self.shared.inner.files()
    }
}

fn check_path(path: &str) -> Result<()> {
    if path.is_empty() || path.contains('\0') {
        return Err(SandboxError::file_system(path, "empty path or NUL byte"));
    }
    Ok(())
}

macro_rules! file_op {
    ($self:ident, $name:literal, $path:expr, $body:expr, $bytes:expr) => {{
        let s = &$self.shared;
        let span = op_span!($name, s.backend, s.tier);
        let mut op = s.op(span.clone(), $name).path(&s.redactor, $path);
        async move {
            let r = match check_path($path) {
                Ok(()) => $body.await,
                Err(e) => Err(e),
            };
            if let Ok(v) = &r {
                if let Some(n) = ($bytes)(v) {
                    op.bytes(n);
                }
            }
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }};
}

#[async_trait]
impl FileSystem for EnforcedFiles {
    async fn read(&self, path: &str) -> Result<Bytes> {
        file_op!(
            self,
            "sandbox.files.read",
            path,
            async { self.inner()?.read(path).await },
            |b: &Bytes| Some(b.len() as u64)
        )
    }

    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        let n = data.len() as u64;
        file_op!(
            self,
            "sandbox.files.write",
            path,
            async { self.inner()?.write(path, data).await },
            |_: &()| Some(n)
        )
    }

    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        file_op!(
            self,
            "sandbox.files.upload",
            remote,
            async {
                self.shared.require(Capability::UPLOAD_DOWNLOAD)?;
                self.inner()?.upload(local, remote).await
            },
            |_: &()| local_size(local)
        )
    }

    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        file_op!(
            self,
            "sandbox.files.download",
            remote,
            async {
                self.shared.require(Capability::UPLOAD_DOWNLOAD)?;
                self.inner()?.download(remote, local).await
            },
            |_: &()| local_size(local)
        )
    }

    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        file_op!(
            self,
            "sandbox.files.ls",
            path,
            async { self.inner()?.ls(path).await },
            |_: &Vec<FileInfo>| None
        )
    }

    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        file_op!(
            self,
            "sandbox.files.mkdir",
            path,
            async { self.inner()?.mkdir(path, parents).await },
            |_: &()| None
        )
    }

    async fn remove(&self, path: &str) -> Result<()> {
        file_op!(
            self,
            "sandbox.files.remove",
            path,
            async { self.inner()?.remove(path).await },
            |_: &()| None
        )
    }

    async fn stat(&self, path: &str) -> Result<FileInfo> {
        file_op!(
            self,
            "sandbox.files.stat",
            path,
            async { self.inner()?.stat(path).await },
            |_: &FileInfo| None
        )
    }
}

/// Size of a host file, or of the files under a host directory (what was moved).
fn local_size(path: &Path) -> Option<u64> {
    fn walk(p: &Path, depth: usize) -> u64 {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return 0;
        };
        if meta.is_file() {
            return meta.len();
        }
        if !meta.is_dir() || depth > 64 {
            return 0;
        }
        std::fs::read_dir(p)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| walk(&e.path(), depth + 1))
                    .sum()
            })
            .unwrap_or(0)
    }
    std::fs::symlink_metadata(path).ok()?;
    Some(walk(path, 0))
}

#[cfg(test)]
pub(crate) mod tests;
