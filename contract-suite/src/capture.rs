//! A global `tracing` layer that records teardown events, so trials can assert the
//! "orphaned sandbox" warning (target `sandbox::teardown`).
//!
//! Installed once per process by [`install`] (from [`crate::run`] / [`crate::build`]). When
//! another global subscriber was installed first, capture is unavailable and the trials
//! that need it fail with that reason.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

use sandbox_core::teardown::TEARDOWN_TARGET;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

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
            .with(crate::observability::SpanCapture)
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
