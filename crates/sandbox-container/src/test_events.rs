//! An active [`EventReporter`] and the memory sink behind it, for unit tests of the audit
//! records a sandbox's relays write. It is taken the way a backend takes it: during the
//! `create` of a layer with a sink (a backend that keeps the reporter and refuses).

use std::sync::{Arc, Mutex};

use sandbox_core::layer::{EventReporter, Layer, MemorySink};
use sandbox_core::{
    Backend, Capability, CreateOptions, IsolationTier, Result, Sandbox, SandboxError, async_trait,
};

/// Keeps the reporter its `create` sees.
#[derive(Debug, Default)]
struct Taker(Mutex<Option<EventReporter>>);

#[async_trait]
impl Backend for Taker {
    fn name(&self) -> &str {
        "unit"
    }
    fn capabilities(&self) -> Capability {
        Capability::all()
    }
    fn isolation(&self) -> IsolationTier {
        IsolationTier::Container
    }
    async fn create(&self, _: CreateOptions) -> Result<Box<dyn Sandbox>> {
        *self.0.lock().unwrap() = Some(EventReporter::current());
        Err(SandboxError::configuration(
            "a unit test's backend takes the reporter only",
        ))
    }
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        Err(SandboxError::connect(
            id,
            "a unit test's backend has no sandboxes",
        ))
    }
}

/// A reporter writing to the returned sink (which also holds the refused create's
/// record: filter by operation).
pub(crate) async fn audited() -> (EventReporter, Arc<MemorySink>) {
    let sink = Arc::new(MemorySink::new());
    let taker = Arc::new(Taker::default());
    let backend = Layer::new().audit(sink.clone()).wrap(taker.clone());
    let _ = backend.create(CreateOptions::new("unit")).await;
    let events = taker
        .0
        .lock()
        .unwrap()
        .take()
        .expect("create reached the backend");
    assert!(events.is_active());
    (events, sink)
}
