//! Audit records of what happens in a sandbox outside any call: a request its credentials
//! proxy, its git gate or its SSH agent relay answered or refused, seen by the backend
//! while no operation of the layer runs.
//!
//! The layer hands its sinks to the backend through [`EventReporter::current`]: while the
//! layer's `create` awaits the backend's, a task-local names the layer, the backend and
//! the create's redaction (its secrets, env values and credential values). A backend that
//! starts something long-lived during create (a proxy task) takes the reporter then and
//! keeps it; outside a layer's create the reporter is inactive and drops every record.
//! Records are written like the layer's own, redacted once, but a failing sink is only a
//! warning: there is no caller whose call it could fail.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::IsolationTier;
use crate::audit::{AuditRecord, Redactor};

use super::config::Layer;

tokio::task_local! {
    static CURRENT: EventReporter;
}

/// Where a backend reports events of a sandbox that no call of the layer covers. Cheap to
/// clone; inactive (dropping every record) when taken outside a layer's `create`.
#[derive(Clone, Default)]
pub struct EventReporter {
    to: Option<Arc<Target>>,
}

struct Target {
    layer: Layer,
    redactor: Redactor,
    backend: String,
    tier: IsolationTier,
}

impl fmt::Debug for EventReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.to {
            Some(t) => write!(f, "EventReporter({})", t.backend),
            None => f.write_str("EventReporter(inactive)"),
        }
    }
}

impl EventReporter {
    /// The reporter of the layer whose `create` is awaiting this backend's, or an inactive
    /// one. Take it during `create` (before any task is spawned: a spawned task does not
    /// see the layer's) and keep it for the sandbox's life.
    pub fn current() -> EventReporter {
        CURRENT.try_with(Clone::clone).unwrap_or_default()
    }

    /// Whether records reach any sink.
    pub fn is_active(&self) -> bool {
        self.to.is_some()
    }

    /// A record of `operation` that started at `started`, for sandbox `sandbox_id`, with
    /// the backend and tier filled in; fill the rest and pass it to [`Self::report`].
    pub fn record(
        &self,
        operation: &'static str,
        sandbox_id: &str,
        started: SystemTime,
    ) -> AuditRecord {
        let (backend, tier) = match &self.to {
            Some(t) => (t.backend.clone(), t.tier),
            None => (String::new(), IsolationTier::Unknown),
        };
        let mut record = AuditRecord::new(operation, backend, tier, started);
        record.sandbox_id = Some(sandbox_id.to_string());
        record.duration_us = started
            .elapsed()
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        record
    }

    /// Writes `record` to the layer's sinks, redacted with the create's values. A sink's
    /// failure is a warning (strict mode has no call to fail here).
    pub fn report(&self, record: AuditRecord) {
        if let Some(t) = &self.to {
            let _ = t.layer.emit_lenient(&t.redactor, record);
        }
    }

    /// This reporter, with `values` also replaced by `***` in every record it writes: a
    /// secret the backend minted itself (the git gate's token), which the create's
    /// redaction cannot know. Empty values are skipped.
    pub fn hiding<'a>(&self, values: impl IntoIterator<Item = &'a str>) -> EventReporter {
        match &self.to {
            Some(t) => EventReporter {
                to: Some(Arc::new(Target {
                    layer: t.layer.clone(),
                    redactor: t.redactor.with(values),
                    backend: t.backend.clone(),
                    tier: t.tier,
                })),
            },
            None => EventReporter::default(),
        }
    }

    /// The reporter of `layer` for a create on `backend`.
    pub(super) fn for_create(
        layer: &Layer,
        redactor: &Redactor,
        backend: &str,
        tier: IsolationTier,
    ) -> EventReporter {
        if layer.has_no_sinks() {
            return EventReporter::default();
        }
        EventReporter {
            to: Some(Arc::new(Target {
                layer: layer.clone(),
                redactor: redactor.clone(),
                backend: backend.to_string(),
                tier,
            })),
        }
    }

    /// Runs `fut` with this reporter as [`Self::current`].
    pub(super) async fn scope<F: Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::MemorySink;

    #[tokio::test]
    async fn a_reporter_hides_the_values_it_was_given_beside_the_creates() {
        let sink = Arc::new(MemorySink::new());
        let layer = Layer::new().audit(sink.clone());
        let mut redactor = Redactor::default();
        redactor.extend(["create-secret"]);
        let events = EventReporter::for_create(&layer, &redactor, "tiny", IsolationTier::Container)
            .scope(async { EventReporter::current() })
            .await
            .hiding(["minted-token", ""]);
        assert!(events.is_active());
        assert!(!format!("{events:?}").contains("minted-token"));
        let mut r = events.record("git.request", "sb-1", SystemTime::now());
        r.path = Some("/minted-token/create-secret".into());
        r.refs = Some(vec!["refs/heads/minted-token".into()]);
        events.report(r);
        let got = sink.records();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].path.as_deref(), Some("/***/***"));
        assert_eq!(got[0].refs, Some(vec!["refs/heads/***".to_string()]));
        assert_eq!(got[0].sandbox_id.as_deref(), Some("sb-1"));
        // Outside a create nothing is reported, hidden values or not.
        assert!(!EventReporter::current().hiding(["x"]).is_active());
    }
}
