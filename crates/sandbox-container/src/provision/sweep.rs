//! The startup sweep: removing leftovers whose owner is proven gone, or that outlived
//! their deadline.

use std::collections::BTreeMap;

use sandbox_core::labels::{LABEL_BACKEND, LABEL_DEADLINE, LABEL_OWNER, Owner};

use crate::engine::{ContainerEngine, ContainerInfo};
use crate::provision::backend::ContainerBackend;
use crate::provision::config::{NAME_PREFIX, SWEEP_PAST_DEADLINE};

/// Why a container is swept, or `None` to keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SweepReason {
    OwnerGone,
    Expired,
}

/// Decides about one container. Provenance first: only containers named by this crate
/// and labelled for `backend` are ours to remove (labels alone can come from an image).
pub(crate) fn verdict(c: &ContainerInfo, backend: &str, now_unix: u64) -> Option<SweepReason> {
    if !c.name.trim_start_matches('/').starts_with(NAME_PREFIX)
        || c.labels.get(LABEL_BACKEND).map(String::as_str) != Some(backend)
    {
        return None;
    }
    let expired = c
        .labels
        .get(LABEL_DEADLINE)
        .and_then(|d| d.parse::<u64>().ok())
        .is_some_and(|d| d.saturating_add(SWEEP_PAST_DEADLINE.as_secs()) < now_unix);
    if expired {
        return Some(SweepReason::Expired);
    }
    let owner_gone = c
        .labels
        .get(LABEL_OWNER)
        .and_then(|o| Owner::parse(o))
        .is_some_and(|o| o.is_proven_gone());
    owner_gone.then_some(SweepReason::OwnerGone)
}

/// Runs the sweep; returns how many containers it removed. Failures are logged.
pub(crate) async fn sweep<E: ContainerEngine>(b: &ContainerBackend<E>) -> usize {
    let list = match b.list_raw(&BTreeMap::new()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "startup sweep could not list sandboxes");
            return 0;
        }
    };
    let backend = b.engine().backend();
    let now = sandbox_core::labels::unix_now();
    let mut removed = 0;
    let listed = list.len();
    for c in list {
        let Some(reason) = verdict(&c, backend, now) else {
            continue;
        };
        match b.remove(&c.id).await {
            Ok(()) => {
                removed += 1;
                tracing::info!(sandbox_id = %c.id, ?reason, "startup sweep removed a sandbox");
            }
            Err(e) => tracing::warn!(sandbox_id = %c.id, error = %e, "startup sweep failed"),
        }
    }
    // The egress network goes once no managed container is left (the engine refuses
    // while any container uses it, so a concurrent create elsewhere keeps it).
    if removed == listed && crate::egress::remove_network_if_unused(&**b.engine()).await {
        tracing::info!("startup sweep removed the egress network");
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::SandboxState;
    use sandbox_core::labels::{LABEL_MANAGED, sandbox_labels};

    fn info(name: &str, labels: BTreeMap<String, String>) -> ContainerInfo {
        ContainerInfo::new("id1", name, SandboxState::Running, labels)
    }

    #[test]
    fn expired_is_swept_even_with_a_live_owner() {
        let l = sandbox_labels("docker", 1_000, &BTreeMap::new());
        let c = info("sbx-abc-1", l);
        assert_eq!(
            verdict(&c, "docker", 1_000 + 61),
            Some(SweepReason::Expired)
        );
        assert_eq!(
            verdict(&c, "docker", 1_000 + 59),
            None,
            "own live sandbox kept"
        );
    }

    #[test]
    fn gone_owner_is_swept() {
        let mut l = sandbox_labels("docker", u64::MAX, &BTreeMap::new());
        let me = Owner::current();
        let reused = Owner {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        l.insert(LABEL_OWNER.into(), reused.to_label());
        assert_eq!(
            verdict(&info("/sbx-x-2", l), "docker", 0),
            Some(SweepReason::OwnerGone)
        );
    }

    #[test]
    fn foreign_provenance_is_never_swept() {
        // An image can carry managed=true and a past deadline: without our name prefix
        // and backend label it is not ours.
        let mut l = BTreeMap::new();
        l.insert(LABEL_MANAGED.to_string(), "true".to_string());
        l.insert(LABEL_DEADLINE.to_string(), "1".to_string());
        l.insert(LABEL_BACKEND.to_string(), "docker".to_string());
        assert_eq!(
            verdict(&info("postgres", l.clone()), "docker", 10_000),
            None
        );
        assert_eq!(verdict(&info("sbx-a-1", l.clone()), "podman", 10_000), None);
        let foreign_owner = Owner {
            host: "elsewhere".into(),
            pid: 1,
            start_time: 1,
            ..Owner::current().clone()
        };
        let mut l = sandbox_labels("docker", u64::MAX, &BTreeMap::new());
        l.insert(LABEL_OWNER.into(), foreign_owner.to_label());
        assert_eq!(
            verdict(&info("sbx-a-1", l), "docker", 0),
            None,
            "foreign host kept"
        );
    }
}
