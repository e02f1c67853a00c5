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
    /// The deadline in force, as the host records it: the one set at create, moved by
    /// every `Sandbox::extend` of any process on this host. Labels cannot change after
    /// create, so `io.sandbox-rs.deadline` keeps the first one. `None` where the backend
    /// does not say (then the labels are all there is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<SystemTime>,
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
            deadline: None,
        }
    }

    /// The record with the deadline in force (see [`ManagedSandbox::deadline`]).
    pub fn with_deadline(mut self, deadline: Option<SystemTime>) -> Self {
        self.deadline = deadline;
        self
    }
}
