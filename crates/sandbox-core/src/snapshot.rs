//! What `Sandbox::snapshot` returns and `ReapableBackend::list_snapshots` reports: a
//! template made from a sandbox's filesystem.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;

/// A filesystem snapshot of a sandbox: a template [`CreateOptions::template`] accepts.
///
/// It holds the sandbox's files at the moment of the snapshot, never its secrets
/// (injected per command, never stored) and never the in-sandbox agent. It stays until
/// removed with [`ReapableBackend::remove_snapshot`] (or `sandbox reap --kill`): killing
/// the sandbox it was made from does not remove it.
///
/// [`CreateOptions::template`]: crate::CreateOptions::template
/// [`ReapableBackend::remove_snapshot`]: crate::ReapableBackend::remove_snapshot
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Snapshot {
    /// The template to create sandboxes from (an engine image reference for container
    /// backends).
    pub template: String,
    /// Backend name.
    pub backend: String,
    /// Id of the sandbox it was made from.
    pub source: String,
    /// When it was made, when known.
    pub created_at: Option<SystemTime>,
    /// All its engine labels (`io.sandbox-rs.*` ones included).
    pub labels: BTreeMap<String, String>,
}

impl Snapshot {
    /// A record.
    pub fn new(
        template: impl Into<String>,
        backend: impl Into<String>,
        source: impl Into<String>,
        created_at: Option<SystemTime>,
        labels: BTreeMap<String, String>,
    ) -> Self {
        Snapshot {
            template: template.into(),
            backend: backend.into(),
            source: source.into(),
            created_at,
            labels,
        }
    }
}
