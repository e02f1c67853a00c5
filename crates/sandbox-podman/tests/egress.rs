//! Egress allowlists on a real Podman engine, beyond the contract suite: the rules in
//! force read from the host, the library network's isolation, and a failing apply that
//! must leave no container. The trials are written once in
//! `sandbox_testkit::trials::egress`; Podman's part is reading its own API.

use sandbox_container::egress::NETWORK_NAME;
use sandbox_core::Sandbox;
use sandbox_podman::{PodmanBackend, PodmanConfig, PodmanEngine, PodmanNative};
use sandbox_testkit::skip::{unless_answering, unless_connected};
use sandbox_testkit::trials::egress::HostView;

async fn backend() -> Option<PodmanBackend> {
    let config = PodmanConfig::from_env().startup_sweep(false);
    unless_connected("Podman", PodmanBackend::connect(config).await)
}

async fn engine() -> Option<PodmanEngine> {
    unless_answering("Podman", PodmanEngine::new(&PodmanConfig::from_env())).await
}

/// What Podman's API says about `sb` and the library network.
async fn host_view(b: &PodmanBackend, sb: &dyn Sandbox) -> HostView {
    let native = sb.native().downcast_ref::<PodmanNative>().unwrap();
    let c = b
        .client()
        .containers()
        .get(&native.container_id)
        .inspect()
        .await
        .unwrap();
    let net = b
        .client()
        .networks()
        .get(NETWORK_NAME)
        .inspect()
        .await
        .unwrap();
    HostView {
        pid: c.state.unwrap().pid.unwrap(),
        network_options: net.options.unwrap_or_default(),
        network_labels: net.labels.unwrap_or_default(),
    }
}

sandbox_testkit::egress_trials! {
    backend: backend().await,
    engine: engine().await,
    cli: "podman --remote",
    isolation: ("isolate", "true"),
    host_view: host_view,
}
