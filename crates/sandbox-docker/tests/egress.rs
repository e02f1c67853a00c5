//! Egress allowlists on a real Docker engine, beyond the contract suite: the rules in
//! force read from the host, the library network's isolation, and a failing apply that
//! must leave no container. The trials are written once in
//! `sandbox_testkit::trials::egress`; Docker's part is reading its own API.

use sandbox_container::egress::NETWORK_NAME;
use sandbox_core::Sandbox;
use sandbox_docker::{DockerBackend, DockerConfig, DockerEngine, DockerNative};
use sandbox_testkit::skip::unless_connected;
use sandbox_testkit::trials::egress::HostView;

async fn backend() -> Option<DockerBackend> {
    let config = DockerConfig::from_env().startup_sweep(false);
    unless_connected("Docker", DockerBackend::connect(config).await)
}

async fn engine() -> Option<DockerEngine> {
    let config = DockerConfig::from_env().startup_sweep(false);
    unless_connected("Docker", DockerEngine::connect(config).await)
}

/// What Docker's API says about `sb`: joined by id (Docker allows duplicate names), to
/// the library's network, with every capability dropped.
async fn host_view(b: &DockerBackend, sb: &dyn Sandbox) -> HostView {
    let native = sb.native().downcast_ref::<DockerNative>().unwrap();
    let client = b.engine().client();
    let c = client
        .inspect_container(&native.container_id, None)
        .await
        .unwrap();
    let host = c.host_config.unwrap();
    let joined = client
        .inspect_network(host.network_mode.as_deref().unwrap(), None)
        .await
        .unwrap();
    assert_eq!(joined.name.as_deref(), Some(NETWORK_NAME));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
    HostView {
        pid: c.state.unwrap().pid.unwrap(),
        network_options: joined.options.unwrap_or_default(),
        network_labels: joined.labels.unwrap_or_default(),
    }
}

sandbox_testkit::egress_trials! {
    backend: backend().await,
    engine: engine().await,
    cli: "docker",
    isolation: ("com.docker.network.bridge.enable_icc", "false"),
    host_view: host_view,
}
