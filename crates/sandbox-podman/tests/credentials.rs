//! Brokered credentials on a real Podman engine: the trials are written once in
//! `sandbox_testkit::trials::credentials`, against servers in the egress lab.

use sandbox_podman::{PodmanBackend, PodmanConfig};
use sandbox_testkit::skip::unless_connected;

async fn backend() -> Option<PodmanBackend> {
    let config = PodmanConfig::from_env().startup_sweep(false);
    unless_connected("Podman", PodmanBackend::connect(config).await)
}

sandbox_testkit::credentials_trials! {
    backend: backend().await,
}
