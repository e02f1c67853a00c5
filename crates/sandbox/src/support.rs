//! What the facade knows and core must not: which first-party backends declare which
//! capability (asked of the adapters themselves), and the enforcement layer every backend
//! the facade hands out is wrapped in.

use std::sync::Arc;

use sandbox_core::layer::Layer;
use sandbox_core::{Backend, Capability};

/// First-party backends and what each can declare, as each adapter declares it:
/// `sandbox_docker::CAPABILITIES`, `sandbox_podman::CAPABILITIES` (with `GPU` for sandboxes
/// created with CDI devices), `sandbox_fake::full_capabilities`. An adapter this build
/// leaves out is still named in refusals, from its declaration as recorded here.
fn first_party() -> [(&'static str, Capability); 3] {
    [("docker", DOCKER), ("podman", PODMAN), ("fake", fake())]
}

#[cfg(feature = "docker")]
const DOCKER: Capability = sandbox_docker::CAPABILITIES;
#[cfg(not(feature = "docker"))]
const DOCKER: Capability = recorded::DOCKER;

#[cfg(feature = "podman")]
const PODMAN: Capability = sandbox_podman::CAPABILITIES;
#[cfg(not(feature = "podman"))]
const PODMAN: Capability = recorded::PODMAN;

#[cfg(feature = "fake")]
fn fake() -> Capability {
    sandbox_fake::full_capabilities()
}
#[cfg(not(feature = "fake"))]
fn fake() -> Capability {
    recorded::FAKE
}

/// The adapters' declarations for builds without them: a build with the `docker` feature
/// off must still tell a caller that Docker has what it asked for. Tests compare each
/// record with the adapter's own declaration whenever both are compiled (as
/// `cargo test -p sandbox-rs` compiles them all), so a record cannot drift unnoticed.
#[cfg(any(
    test,
    not(all(feature = "docker", feature = "podman", feature = "fake"))
))]
mod recorded {
    use sandbox_core::Capability;

    /// What Docker and Podman sandboxes can declare: the container layer's set, the
    /// egress allowlist and its live change, a disk limit, the agent with its terminals,
    /// moved deadlines and idle limits, pause and resume, filesystem snapshots, stop and
    /// start, the reset of processes.
    const CONTAINER: Capability = Capability::RUN_COMMAND
        .union(Capability::RUN_CODE)
        .union(Capability::STATEFUL_CODE)
        .union(Capability::STREAMING)
        .union(Capability::FILESYSTEM)
        .union(Capability::UPLOAD_DOWNLOAD)
        .union(Capability::NETWORK_POLICY)
        .union(Capability::EGRESS_ALLOWLIST)
        .union(Capability::LIVE_EGRESS)
        .union(Capability::HOST_PORTS)
        .union(Capability::CREDENTIALS)
        .union(Capability::INGRESS_PORTS)
        .union(Capability::STDIN)
        .union(Capability::DISK_LIMIT)
        .union(Capability::PTY)
        .union(Capability::AGENT)
        .union(Capability::PAUSE_RESUME)
        .union(Capability::EXTEND_LIFETIME)
        .union(Capability::IDLE_TIMEOUT)
        .union(Capability::SNAPSHOT)
        .union(Capability::RESET_PROCESSES)
        .union(Capability::STOP_START)
        .union(Capability::SSH_AGENT)
        .union(Capability::GIT_GATE);

    /// `sandbox_docker::CAPABILITIES`: plus forks with memory (under gVisor with
    /// dockerd's experimental features).
    #[cfg(any(test, not(feature = "docker")))]
    pub(super) const DOCKER: Capability = CONTAINER.union(Capability::SNAPSHOT_FORK);

    /// `sandbox_podman::CAPABILITIES`: the container set, plus GPUs through CDI devices.
    #[cfg(any(test, not(feature = "podman")))]
    pub(super) const PODMAN: Capability = CONTAINER.union(Capability::GPU);

    /// `sandbox_fake::full_capabilities()`: an egress allowlist and its live change,
    /// pause/resume, snapshots, stop/start and forks (files and contexts), but no ingress
    /// ports, no disk, no terminals, no agent, no reset of processes and no brokered
    /// credentials.
    #[cfg(any(test, not(feature = "fake")))]
    pub(super) const FAKE: Capability = CONTAINER
        .union(Capability::SNAPSHOT_FORK)
        .difference(Capability::INGRESS_PORTS)
        .difference(Capability::DISK_LIMIT)
        .difference(Capability::PTY)
        .difference(Capability::AGENT)
        .difference(Capability::RESET_PROCESSES)
        .difference(Capability::SSH_AGENT)
        .difference(Capability::GIT_GATE)
        .difference(Capability::CREDENTIALS);
}

/// First-party backends that can declare `capability` (what `CapabilityNotSupported`
/// errors list in `supported_by`). Empty for an empty or multi-flag set no backend has.
pub fn first_party_support(capability: Capability) -> Vec<String> {
    first_party()
        .into_iter()
        .filter(|(_, caps)| !capability.is_empty() && caps.contains(capability))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The layer the facade applies to every backend: core's checks, spans and audit, plus
/// the first-party directory for refusals.
pub(crate) fn enforce(backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
    Layer::new()
        .support_directory(first_party_support)
        .wrap(backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_matches_what_adapters_declare() {
        assert_eq!(first_party_support(Capability::GPU), ["podman"]);
        assert_eq!(
            first_party_support(Capability::EGRESS_ALLOWLIST),
            ["docker", "podman", "fake"]
        );
        assert_eq!(
            first_party_support(Capability::DISK_LIMIT),
            ["docker", "podman"]
        );
        assert_eq!(
            first_party_support(Capability::INGRESS_PORTS),
            ["docker", "podman"]
        );
        assert_eq!(
            first_party_support(Capability::STATEFUL_CODE),
            ["docker", "podman", "fake"]
        );
        assert_eq!(first_party_support(Capability::PTY), ["docker", "podman"]);
        assert_eq!(first_party_support(Capability::AGENT), ["docker", "podman"]);
        assert_eq!(
            first_party_support(Capability::PAUSE_RESUME),
            ["docker", "podman", "fake"]
        );
        assert_eq!(
            first_party_support(Capability::SNAPSHOT),
            ["docker", "podman", "fake"]
        );
        assert_eq!(
            first_party_support(Capability::RESET_PROCESSES),
            ["docker", "podman"]
        );
        assert_eq!(
            first_party_support(Capability::STOP_START),
            ["docker", "podman", "fake"]
        );
        assert_eq!(
            first_party_support(Capability::SNAPSHOT_FORK),
            ["docker", "fake"]
        );
        assert_eq!(
            first_party_support(Capability::SSH_AGENT),
            ["docker", "podman"]
        );
        assert_eq!(
            first_party_support(Capability::GIT_GATE),
            ["docker", "podman"]
        );
        assert!(first_party_support(Capability::empty()).is_empty());
    }

    #[cfg(feature = "docker")]
    #[test]
    fn dockers_record_is_its_own_declaration() {
        assert_eq!(recorded::DOCKER, sandbox_docker::CAPABILITIES);
    }

    #[cfg(feature = "podman")]
    #[test]
    fn podmans_record_is_its_own_declaration() {
        assert_eq!(recorded::PODMAN, sandbox_podman::CAPABILITIES);
    }

    #[cfg(feature = "fake")]
    #[test]
    fn the_fakes_record_is_its_own_declaration() {
        assert_eq!(recorded::FAKE, sandbox_fake::full_capabilities());
    }
}
