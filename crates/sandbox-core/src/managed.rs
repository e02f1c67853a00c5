//! What `ReapableBackend::list_managed` reports.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;

/// Lifecycle state of a managed sandbox as the engine reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum SandboxState {
    /// Being created.
    Creating,
    /// Running.
    Running,
    /// Paused.
    Paused,
    /// Stopped but still held by the engine.
    Stopped,
    /// Anything else.
    Unknown,
}

/// A sandbox the engine holds under sandbox-rs's label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ManagedSandbox {
    /// Sandbox id.
    pub id: String,
    /// Backend name.
    pub backend: String,
    /// State.
    pub state: SandboxState,
    /// Creation time, when known.
    pub created_at: Option<SystemTime>,
    /// All engine labels (including `io.sandbox-rs.*`).
    pub labels: BTreeMap<String, String>,
}

impl ManagedSandbox {
    /// A record.
    pub fn new(
        id: impl Into<String>,
        backend: impl Into<String>,
        state: SandboxState,
        created_at: Option<SystemTime>,
        labels: BTreeMap<String, String>,
    ) -> Self {
        ManagedSandbox {
            id: id.into(),
            backend: backend.into(),
            state,
            created_at,
            labels,
        }
    }
}
