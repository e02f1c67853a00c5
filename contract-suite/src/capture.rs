//! The suite's global `tracing` subscriber and what it records for the trials to assert:
//! teardown events (the "orphaned sandbox" warning, target `sandbox::teardown`) and, through
//! [`SpanCapture`], every span and event with all its fields (the observability trials).
//!
//! Installed once per process by [`install`] (from [`crate::run`] / [`crate::build`]). When
//! another global subscriber was installed first, capture is unavailable and the trials
//! that need it fail with that reason.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

use sandbox_core::teardown::TEARDOWN_TARGET;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedEvent {
    /// `tracing` target.
    pub target: String,
    /// Level.
    pub level: Level,
    /// The `message` field.
    pub message: String,
    /// All other fields, rendered with `Debug`/`Display`.
    pub fields: BTreeMap<String, String>,
}

static EVENTS: Mutex<Vec<CapturedEvent>> = Mutex::new(Vec::new());
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Installs the capture layer as the global default subscriber (once). With `RUST_LOG`
/// set, events are also printed to stderr through a `fmt` layer filtered by it. Returns
/// whether capture is active.
pub fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        let fmt = std::env::var("RUST_LOG").ok().map(|_| {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::EnvFilter::from_default_env())
        });
        let subscriber = tracing_subscriber::registry()
            .with(CaptureLayer)
            .with(SpanCapture)
            .with(fmt);
        tracing::subscriber::set_global_default(subscriber).is_ok()
    })
}

/// Whether the capture layer is the global subscriber.
pub fn is_installed() -> bool {
    INSTALLED.get().copied().unwrap_or(false)
}

/// Every recorded teardown event so far.
pub fn events() -> Vec<CapturedEvent> {
    EVENTS.lock().map(|e| e.clone()).unwrap_or_default()
}

/// Recorded "orphaned sandbox" warnings whose `sandbox_id` starts with `id` (a process
/// orphan is named `<sandbox>/<exec>`).
pub fn orphan_warnings_for(id: &str) -> Vec<CapturedEvent> {
    events()
        .into_iter()
        .filter(|e| {
            e.level == Level::WARN
                && e.message == sandbox_core::teardown::ORPHAN_MESSAGE
                && e.fields
                    .get("sandbox_id")
                    .is_some_and(|v| v == id || v.starts_with(&format!("{id}/")))
        })
        .collect()
}

struct CaptureLayer;

impl<S: Subscriber> Layer<S> for CaptureLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        if meta.target() != TEARDOWN_TARGET {
            return;
        }
        let mut v = FieldVisitor::default();
        event.record(&mut v);
        let rec = CapturedEvent {
            target: meta.target().to_string(),
            level: *meta.level(),
            message: v.message,
            fields: v.fields,
        };
        if let Ok(mut events) = EVENTS.lock() {
            // Bounded: a runaway adapter must not grow the suite's memory without limit.
            if events.len() < 100_000 {
                events.push(rec);
            }
        }
    }
}

#[derive(Default)]
struct FieldVisitor {
    message: String,
    fields: BTreeMap<String, String>,
}

impl Visit for FieldVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.fields
                .insert(field.name().to_string(), value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        if field.name() == "message" {
            self.message = s;
        } else {
            self.fields.insert(field.name().to_string(), s);
        }
    }
}

/// A closed span as the capture saw it.
#[derive(Debug, Clone)]
pub struct CapturedSpan {
    /// Span name (`sandbox.run`).
    pub name: &'static str,
    /// `tracing` target.
    pub target: String,
    /// Every field recorded at creation or later, rendered.
    pub fields: BTreeMap<String, String>,
}

/// An event (log line) as the capture saw it: target, message and every field.
#[derive(Debug, Clone)]
pub struct CapturedLine {
    /// `tracing` target.
    pub target: String,
    /// Message and fields, rendered.
    pub fields: BTreeMap<String, String>,
}

/// Bound on what the capture keeps: a runaway adapter must not grow the suite's memory.
const CAPTURE_LIMIT: usize = 500_000;

static SPANS: Mutex<Vec<CapturedSpan>> = Mutex::new(Vec::new());
static LINES: Mutex<Vec<CapturedLine>> = Mutex::new(Vec::new());

/// Closed spans captured so far.
pub fn spans() -> Vec<CapturedSpan> {
    SPANS.lock().map(|s| s.clone()).unwrap_or_default()
}

/// Events captured so far (every target and level).
pub fn lines() -> Vec<CapturedLine> {
    LINES.lock().map(|s| s.clone()).unwrap_or_default()
}

/// How many spans have closed so far (what [`spans`] would return, without copying it).
pub(crate) fn closed_span_count() -> usize {
    SPANS.lock().map(|s| s.len()).unwrap_or(0)
}

/// Records every span (on close) and every event, with all their fields.
#[derive(Debug, Default, Clone, Copy)]
pub struct SpanCapture;

struct OpenSpan {
    name: &'static str,
    target: String,
    fields: BTreeMap<String, String>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        self.0.insert(field.name().to_string(), s);
    }
}

fn push<T>(store: &Mutex<Vec<T>>, item: T) {
    if let Ok(mut v) = store.lock()
        && v.len() < CAPTURE_LIMIT
    {
        v.push(item);
    }
}

impl<S> tracing_subscriber::Layer<S> for SpanCapture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(OpenSpan {
                name: attrs.metadata().name(),
                target: attrs.metadata().target().to_string(),
                fields,
            });
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(open) = span.extensions_mut().get_mut::<OpenSpan>()
        {
            values.record(&mut Fields(&mut open.fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        push(
            &LINES,
            CapturedLine {
                target: event.metadata().target().to_string(),
                fields,
            },
        );
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id)
            && let Some(open) = span.extensions_mut().remove::<OpenSpan>()
        {
            push(
                &SPANS,
                CapturedSpan {
                    name: open.name,
                    target: open.target,
                    fields: open.fields,
                },
            );
        }
    }
}
