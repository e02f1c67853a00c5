//! What the facade knows and core must not: which first-party backends declare which
//! capability, and the enforcement layer every backend the facade hands out is wrapped in.

use std::sync::Arc;

use sandbox_core::layer::Layer;
use sandbox_core::{Backend, Capability};

/// What Docker and Podman sandboxes can declare: the allowlist where the host can load
/// egress rules (nft, a runtime whose traffic netfilter sees), terminals where the agent
/// runs (not under runsc), the rest always.
const CONTAINER: Capability = Capability::RUN_COMMAND
    .union(Capability::RUN_CODE)
    .union(Capability::STATEFUL_CODE)
    .union(Capability::STREAMING)
    .union(Capability::FILESYSTEM)
    .union(Capability::UPLOAD_DOWNLOAD)
    .union(Capability::NETWORK_POLICY)
    .union(Capability::EGRESS_ALLOWLIST)
    .union(Capability::INGRESS_PORTS)
    .union(Capability::STDIN)
    .union(Capability::DISK_LIMIT)
    .union(Capability::PTY);

/// First-party backends and what each can declare. Podman adds `GPU` for sandboxes created
/// with CDI devices (`PodmanOptions::cdi_device`); the fake models an egress allowlist but
/// no ingress ports, no disk and no terminals (`sandbox_fake::full_capabilities`).
const FIRST_PARTY: &[(&str, Capability)] = &[
    ("docker", CONTAINER),
    ("podman", CONTAINER.union(Capability::GPU)),
    (
        "fake",
        CONTAINER
            .difference(Capability::INGRESS_PORTS)
            .difference(Capability::DISK_LIMIT)
            .difference(Capability::PTY),
    ),
];

/// First-party backends that can declare `capability` (what `CapabilityNotSupported`
/// errors list in `supported_by`). Empty for an empty or multi-flag set no backend has.
pub fn first_party_support(capability: Capability) -> Vec<String> {
    FIRST_PARTY
        .iter()
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
        assert!(first_party_support(Capability::PAUSE_RESUME).is_empty());
        assert!(first_party_support(Capability::empty()).is_empty());
    }

    #[cfg(feature = "fake")]
    #[test]
    fn fake_entry_is_the_fakes_own_declaration() {
        let fake = FIRST_PARTY.iter().find(|(n, _)| *n == "fake").unwrap().1;
        assert_eq!(fake, sandbox_fake::full_capabilities());
    }
}
