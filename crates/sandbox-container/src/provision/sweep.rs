//! The sweep, at a backend's start and periodically while it lives: removing leftovers
//! whose owner is proven gone, that outlived their deadline, or that their agent ended
//! for being idle. When the periodic one runs is `expiry.rs`'s.

use std::collections::BTreeMap;

use std::time::{Duration, SystemTime};

use sandbox_core::Provenance;
use sandbox_core::labels::{LABEL_BACKEND, LABEL_IDLE_TIMEOUT, LABEL_MANAGED};

use crate::engine::transfer::bounded;
use crate::engine::{ContainerEngine, ContainerInfo};
use crate::provision::config::{NAME_PREFIX, SWEEP_PAST_DEADLINE};
use crate::provision::teardown::remove_in_state;

/// Decides about one container: `Some` verdict when the sweep removes it. Provenance
/// first: only containers named by this crate and labelled for `backend` are ours to judge
/// (labels alone can come from an image); then the labels' verdict, the one `sandbox reap`
/// gives, with expiry counted [`SWEEP_PAST_DEADLINE`] after the deadline so the sweep never
/// races a sandbox's own end.
pub(crate) fn verdict(c: &ContainerInfo, backend: &str, now: SystemTime) -> Option<Provenance> {
    if !ours(c, backend) {
        return None;
    }
    let verdict = Provenance::of(&c.labels, c.created_at, now, SWEEP_PAST_DEADLINE);
    verdict.is_removable().then_some(verdict)
}

/// Whether a container the verdict keeps may still have ended idle: ours, with an idle
/// limit, stopped. Only those are inspected for their exit status (a list does not carry
/// it on every engine); the sweep removes the ones whose agent ended them idle, whoever
/// their owner is, as the owner's own timer would have.
fn may_have_ended_idle(c: &ContainerInfo, backend: &str) -> bool {
    ours(c, backend)
        && c.labels.contains_key(LABEL_IDLE_TIMEOUT)
        && c.state == sandbox_core::SandboxState::Stopped
}

/// Whether the sweep may judge `c` at all: named by this crate and labelled for `backend`
/// (labels alone can come from an image).
fn ours(c: &ContainerInfo, backend: &str) -> bool {
    c.name.trim_start_matches('/').starts_with(NAME_PREFIX)
        && c.labels.get(LABEL_BACKEND).map(String::as_str) == Some(backend)
}

/// Which sweep runs: the one a backend runs when it starts, or the one it repeats while it
/// lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// When the backend starts.
    Startup,
    /// Every `ContainerConfig::sweep_interval` while the backend lives.
    Periodic,
}

impl Sweep {
    fn name(self) -> &'static str {
        match self {
            Sweep::Startup => "startup sweep",
            Sweep::Periodic => "periodic sweep",
        }
    }
}

/// Runs the sweep on `engine`; returns how many containers it removed. Failures are
/// logged.
pub(crate) async fn sweep<E: ContainerEngine>(
    engine: &E,
    call_timeout: Duration,
    which: Sweep,
) -> usize {
    let sweep = which.name();
    let filter = BTreeMap::from([(LABEL_MANAGED.to_string(), "true".to_string())]);
    let list = match bounded(call_timeout, "list", engine.list(&filter)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, sweep, "the sweep could not list sandboxes");
            return 0;
        }
    };
    let backend = engine.backend();
    let now = SystemTime::now();
    let mut removed = 0;
    let listed = list.len();
    for c in list {
        let verdict = match verdict(&c, backend, now) {
            Some(v) => format!("{v:?}"),
            None if may_have_ended_idle(&c, backend)
                && bounded(call_timeout, "inspect", engine.inspect(&c.id))
                    .await
                    .is_ok_and(|i| i.ended_idle()) =>
            {
                "EndedIdle".to_string()
            }
            None => continue,
        };
        match remove_in_state(engine, call_timeout, &c.id, c.state).await {
            Ok(()) => {
                removed += 1;
                tracing::info!(sandbox_id = %c.id, %verdict, sweep, "the sweep removed a sandbox");
            }
            Err(e) => tracing::warn!(sandbox_id = %c.id, error = %e, sweep, "the sweep failed"),
        }
    }
    // The egress network goes once no managed container is left (the engine refuses
    // while any container uses it, so a concurrent create elsewhere keeps it). The
    // periodic sweep tries only after removing something: an idle backend does not race
    // its own creates for the network every interval.
    // Deadline records whose sandbox was removed outside this crate (`docker rm`): one
    // past its deadline by the sweep's margin ends nothing any more, whichever engine held
    // it.
    crate::provision::deadlines::Deadlines::default()
        .prune_past(now.checked_sub(SWEEP_PAST_DEADLINE).unwrap_or(now));
    let tries = removed == listed && (which == Sweep::Startup || removed > 0);
    if tries && crate::egress::remove_network_if_unused(engine).await {
        tracing::info!(sweep, "the sweep removed the egress network");
    }
    removed
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use sandbox_core::SandboxState;
    use sandbox_core::labels::{LABEL_DEADLINE, LABEL_MANAGED, LABEL_OWNER, Owner, sandbox_labels};

    use super::*;

    const CREATED: u64 = 1_000_000;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn info(name: &str, labels: BTreeMap<String, String>) -> ContainerInfo {
        let mut c = ContainerInfo::new("id1", name, SandboxState::Running, labels);
        c.created_at = Some(at(CREATED));
        c
    }

    #[test]
    fn expired_is_swept_even_with_a_live_owner() {
        let deadline = CREATED + 300;
        let c = info(
            "sbx-abc-1",
            sandbox_labels("docker", deadline, &BTreeMap::new()),
        );
        assert_eq!(
            verdict(&c, "docker", at(deadline + 61)),
            Some(Provenance::Expired)
        );
        assert_eq!(
            verdict(&c, "docker", at(deadline + 59)),
            None,
            "own live sandbox kept"
        );
    }

    #[test]
    fn only_our_stopped_sandboxes_with_an_idle_limit_are_asked_whether_they_ended_idle() {
        let mut l = sandbox_labels("docker", CREATED + 300, &BTreeMap::new());
        l.insert(LABEL_IDLE_TIMEOUT.into(), "3".into());
        let mut c = info("sbx-a-1", l.clone());
        c.state = SandboxState::Stopped;
        assert!(may_have_ended_idle(&c, "docker"));
        assert!(!may_have_ended_idle(&c, "podman"), "another backend's");
        c.state = SandboxState::Running;
        assert!(!may_have_ended_idle(&c, "docker"), "running");
        let mut foreign = info("postgres", l.clone());
        foreign.state = SandboxState::Stopped;
        assert!(!may_have_ended_idle(&foreign, "docker"), "not our name");
        l.remove(LABEL_IDLE_TIMEOUT);
        let mut no_limit = info("sbx-a-1", l);
        no_limit.state = SandboxState::Stopped;
        assert!(!may_have_ended_idle(&no_limit, "docker"), "no idle limit");
        // What the inspect then decides: stopped with the agent's idle status only.
        let mut i = info("sbx-a-1", BTreeMap::new());
        i.state = SandboxState::Stopped;
        i.exit_code = Some(i64::from(sandbox_agent::protocol::IDLE_EXIT_STATUS));
        assert!(i.ended_idle());
        i.exit_code = Some(0);
        assert!(!i.ended_idle(), "stopped at its deadline or by `stop`");
        i.exit_code = Some(i64::from(sandbox_agent::protocol::IDLE_EXIT_STATUS));
        i.state = SandboxState::Running;
        assert!(!i.ended_idle(), "started again");
    }

    #[test]
    fn gone_owner_is_swept() {
        let mut l = sandbox_labels("docker", CREATED + 300, &BTreeMap::new());
        let me = Owner::current();
        let reused = Owner {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        l.insert(LABEL_OWNER.into(), reused.to_label());
        assert_eq!(
            verdict(&info("/sbx-x-2", l), "docker", at(CREATED)),
            Some(Provenance::OwnerGone)
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
        let late = at(CREATED + 10_000);
        assert_eq!(verdict(&info("postgres", l.clone()), "docker", late), None);
        assert_eq!(verdict(&info("sbx-a-1", l.clone()), "podman", late), None);
        // Our name and backend, but a deadline an image baked in (far from the creation
        // time): the labels are not ours either.
        assert_eq!(verdict(&info("sbx-a-1", l), "docker", late), None);
        let foreign_owner = Owner {
            host: "elsewhere".into(),
            pid: 1,
            start_time: 1,
            ..Owner::current().clone()
        };
        let mut l = sandbox_labels("docker", CREATED + 300, &BTreeMap::new());
        l.insert(LABEL_OWNER.into(), foreign_owner.to_label());
        assert_eq!(
            verdict(&info("sbx-a-1", l), "docker", at(CREATED)),
            None,
            "foreign host kept"
        );
    }
}
