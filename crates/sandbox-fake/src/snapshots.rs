//! The snapshot templates the fake engine holds: a copy of a sandbox's in-memory
//! filesystem under a template name that `create` accepts, listed and removed like the
//! container engines' snapshot images. Nothing else is copied: not the environment, not
//! the secrets, not the contexts or processes.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sandbox_core::Snapshot;

use crate::memfs::MemFs;

/// Prefix of every fake snapshot template: a template with it that the engine does not
/// hold (removed) fails `create`, whatever `known_templates` says.
pub const SNAPSHOT_PREFIX: &str = "fake-snapshot:";

/// One held snapshot.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) fs: MemFs,
    pub(crate) has_python: bool,
    pub(crate) record: Snapshot,
}

/// Snapshots by template.
#[derive(Debug, Default)]
pub(crate) struct Snapshots {
    held: Mutex<BTreeMap<String, Held>>,
    seq: AtomicU64,
}

impl Snapshots {
    /// A fresh template name for a snapshot of `source`.
    pub(crate) fn name(&self, source: &str) -> String {
        let n = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        format!("{SNAPSHOT_PREFIX}{source}-{n}")
    }

    pub(crate) fn insert(&self, held: Held) {
        lock(&self.held).insert(held.record.template.clone(), held);
    }

    pub(crate) fn get(&self, template: &str) -> Option<Held> {
        lock(&self.held).get(template).cloned()
    }

    pub(crate) fn list(&self) -> Vec<Snapshot> {
        lock(&self.held)
            .values()
            .map(|h| h.record.clone())
            .collect()
    }

    pub(crate) fn remove(&self, template: &str) -> bool {
        lock(&self.held).remove(template).is_some()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
