//! Filesystem snapshots: a sandbox's container exported as one flat tar stream, the
//! agent left out on the way ([`tar_filter`]), imported as a new image whose whole
//! configuration is set here; and the listing and removal of those images.
//!
//! Why export and import rather than the engines' commit: a commit merges the
//! container's configuration into the image, and neither engine can take a key out
//! again. The container's labels (owner, session, deadline, metadata) and its create-time
//! env would be inherited by every container later made from the image. An import takes
//! only the configuration it is given: the source image's env, command, entrypoint,
//! workdir, user and non-sandbox-rs labels, plus the snapshot's own labels. The price is
//! one layer holding the whole filesystem (no layer shared with the source image).
//!
//! What is not in the container's own filesystem is not in the export: bind mounts,
//! volumes and tmpfs mounts. A sandbox with a disk limit keeps its workdir in a sized
//! tmpfs, so it does not declare `SNAPSHOT`; a sandbox whose image declares volumes is
//! refused at the snapshot (their content would be silently missing).
//!
//! The container is frozen while its filesystem is read (as a commit does), unless it
//! already is: the snapshot is one instant. It is thawed afterwards, also when the
//! snapshot fails or is dropped.

pub(crate) mod tar_filter;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_core::labels::{
    LABEL_CREATED, LABEL_MANAGED, LABEL_PREFIX, LABEL_SNAPSHOT_OF, snapshot_labels,
};
use sandbox_core::{Capability, Result, SandboxError, Snapshot};

use crate::engine::{
    ContainerEngine, EngineErrorKind, ImageConfig, ImageImport, ImageInfo, transfer,
};
use crate::error;
use crate::sandbox::agent::AGENT_PATH;
use crate::sandbox::shared::Shared;

/// On a container created with a disk limit (its workdir and the image's volumes are
/// tmpfs mounts an export does not see): a handle reattached to it does not declare
/// `SNAPSHOT` either.
pub const LABEL_DISK_LIMITED: &str = "io.sandbox-rs.disk-limited";

/// What a sandbox declares: `caps` without `SNAPSHOT` when it is disk-limited.
pub(crate) fn instance_caps(caps: Capability, disk_limited: bool) -> Capability {
    if disk_limited {
        caps.difference(Capability::SNAPSHOT)
    } else {
        caps
    }
}

/// Repository of every snapshot image. Under `localhost/`: a name that never resolves to
/// a public registry, so a create from a removed snapshot never pulls from elsewhere.
pub const SNAPSHOT_REPOSITORY: &str = "localhost/sandbox-rs/snapshot";

/// Longest wait for the next piece of the export or for the import to take it.
const TRANSFER_IDLE: Duration = Duration::from_secs(60);

/// Takes a snapshot of the sandbox of `shared`.
pub(crate) async fn take<E: ContainerEngine>(shared: &Arc<Shared<E>>) -> Result<Snapshot> {
    let eng = &*shared.engine;
    let backend = eng.backend();
    sandbox_core::policy::require(shared.caps, Capability::SNAPSHOT, backend)?;
    let id = shared.id.as_str();
    let volumes = shared
        .call("inspect image", eng.image_volumes(&shared.template))
        .await
        .map_err(|e| error::engine(eng, "read the image's volumes", e))?;
    if !volumes.is_empty() {
        return Err(SandboxError::config(
            format!(
                "image `{}` declares volumes ({}): their content lives outside the sandbox's filesystem and would be missing from a snapshot",
                shared.template,
                volumes.join(", ")
            ),
            "snapshot sandboxes of an image without VOLUME declarations (rebuild it without them)",
        ));
    }
    let base = shared
        .call("inspect image", eng.image_config(&shared.template))
        .await
        .map_err(|e| error::engine(eng, "read the image's configuration", e))?;
    let created = SystemTime::now();
    let created_unix = created
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let labels = snapshot_labels(backend, id, created_unix);
    let import = ImageImport::new(reference(id), snapshot_config(base, &labels));
    let freeze = Freeze::begin(shared).await?;
    let made = export_and_import(shared, &import).await;
    freeze.end().await;
    made?;
    tracing::debug!(sandbox_id = %id, template = %import.reference, "snapshot taken");
    Ok(Snapshot::new(
        import.reference,
        backend,
        id,
        Some(created),
        labels,
    ))
}

/// The export, filtered, streamed into the import.
async fn export_and_import<E: ContainerEngine>(
    shared: &Shared<E>,
    import: &ImageImport,
) -> Result<String> {
    let eng = &*shared.engine;
    let body = match shared.call("export", eng.export(&shared.id)).await {
        Ok(b) => b,
        Err(e) if e.kind == EngineErrorKind::NotFound => {
            return Err(error::gone(&shared.id).with_source(e));
        }
        Err(e) => return Err(error::on_sandbox(eng, &shared.id, "export container", e)),
    };
    let agent = AGENT_PATH.trim_start_matches('/');
    let body = tar_filter::without_entries(transfer::idle_bounded(body, TRANSFER_IDLE), &[agent]);
    eng.import_image(body, import)
        .await
        .map_err(|e| error::engine(eng, "import the snapshot image", e))
}

/// The snapshot image's whole configuration: the source image's, with its sandbox-rs
/// labels replaced by `labels`.
fn snapshot_config(mut base: ImageConfig, labels: &BTreeMap<String, String>) -> ImageConfig {
    base.labels.retain(|k, _| !k.starts_with(LABEL_PREFIX));
    base.labels
        .extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    base
}

/// A fresh reference: the source container, this process's session and a counter.
fn reference(id: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let short: String = id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    format!(
        "{SNAPSHOT_REPOSITORY}:{short}-{}-{n}",
        sandbox_core::labels::session_id()
    )
}

/// The container frozen for the snapshot, when this snapshot froze it.
struct Freeze<E: ContainerEngine> {
    shared: Option<Arc<Shared<E>>>,
}

impl<E: ContainerEngine> Freeze<E> {
    /// Freezes the container unless it is paused already or the engine cannot freeze.
    /// While frozen it counts as paused, so a removal meanwhile thaws it first.
    async fn begin(shared: &Arc<Shared<E>>) -> Result<Self> {
        // A stopped container has nothing to freeze: its files are still.
        if shared.paused.load(Ordering::SeqCst)
            || shared.stopped.load(Ordering::SeqCst)
            || !shared.caps.contains(Capability::PAUSE_RESUME)
        {
            return Ok(Freeze { shared: None });
        }
        match shared.call("pause", shared.engine.pause(&shared.id)).await {
            Ok(()) => {
                shared.paused.store(true, Ordering::SeqCst);
                Ok(Freeze {
                    shared: Some(shared.clone()),
                })
            }
            // Paused by someone else: it stays as they left it.
            Err(e) if e.kind == EngineErrorKind::Conflict => Ok(Freeze { shared: None }),
            Err(e) if e.kind == EngineErrorKind::NotFound => {
                Err(error::gone(&shared.id).with_source(e))
            }
            Err(e) => Err(error::on_sandbox(&*shared.engine, &shared.id, "pause", e)),
        }
    }

    /// Thaws what [`Freeze::begin`] froze.
    async fn end(mut self) {
        if let Some(shared) = self.shared.take() {
            thaw(&shared).await;
        }
    }
}

async fn thaw<E: ContainerEngine>(shared: &Shared<E>) {
    match shared
        .call("unpause", shared.engine.unpause(&shared.id))
        .await
    {
        Ok(()) => shared.paused.store(false, Ordering::SeqCst),
        Err(e) => {
            tracing::warn!(sandbox_id = %shared.id, error = %e, "thaw after the snapshot failed")
        }
    }
}

impl<E: ContainerEngine> Drop for Freeze<E> {
    fn drop(&mut self) {
        // The snapshot was dropped mid-way: the thaw still happens, in the background.
        if let Some(shared) = self.shared.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move { thaw(&shared).await });
        }
    }
}

/// The snapshot record of a listed image.
pub(crate) fn listed(backend: &str, image: ImageInfo) -> Snapshot {
    let template = image
        .references
        .iter()
        .find(|r| r.starts_with(SNAPSHOT_REPOSITORY))
        .or(image.references.first())
        .cloned()
        .unwrap_or(image.id);
    let source = image
        .labels
        .get(LABEL_SNAPSHOT_OF)
        .cloned()
        .unwrap_or_default();
    let created_at = image
        .labels
        .get(LABEL_CREATED)
        .and_then(|s| s.parse::<u64>().ok())
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
        .or(image.created_at);
    Snapshot::new(template, backend, source, created_at, image.labels)
}

/// The label filter of snapshot images.
pub(crate) fn snapshot_filter(backend: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (
            sandbox_core::labels::LABEL_BACKEND.to_string(),
            backend.to_string(),
        ),
    ])
}

/// Whether labels mark a sandbox-rs snapshot image.
pub(crate) fn is_snapshot(labels: &BTreeMap<String, String>) -> bool {
    labels.get(LABEL_MANAGED).map(String::as_str) == Some("true")
        && labels.contains_key(LABEL_SNAPSHOT_OF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_keeps_the_images_and_only_the_snapshots_own_labels() {
        let base = ImageConfig {
            env: vec!["PATH=/usr/bin".into()],
            cmd: Some(vec!["sh".into()]),
            labels: BTreeMap::from([
                ("org.opencontainers.image.title".into(), "busybox".into()),
                ("io.sandbox-rs.owner".into(), "host/1/2/x/3".into()),
                ("io.sandbox-rs.snapshot-of".into(), "older".into()),
            ]),
            ..ImageConfig::default()
        };
        let labels = snapshot_labels("docker", "abc", 7);
        let c = snapshot_config(base, &labels);
        assert_eq!(c.env, ["PATH=/usr/bin"]);
        assert_eq!(c.cmd.as_deref(), Some(&["sh".to_string()][..]));
        let keys: Vec<&str> = c.labels.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "io.sandbox-rs.backend",
                "io.sandbox-rs.created",
                "io.sandbox-rs.managed",
                "io.sandbox-rs.snapshot-of",
                "org.opencontainers.image.title"
            ]
        );
        assert_eq!(c.labels["io.sandbox-rs.snapshot-of"], "abc");
        assert!(is_snapshot(&c.labels));
    }

    #[test]
    fn references_are_fresh_and_local() {
        let (a, b) = (reference("0123456789abcdef"), reference("0123456789abcdef"));
        assert_ne!(a, b);
        assert!(
            a.starts_with("localhost/sandbox-rs/snapshot:0123456789ab-"),
            "{a}"
        );
        let tag = a.rsplit(':').next().unwrap();
        assert!(tag.len() <= 128 && tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }
}
