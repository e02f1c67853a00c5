//! Egress allowlists on a real Docker engine, beyond the contract suite: the rules in
//! force read from the host, the library network's isolation, and a failing apply that
//! must leave no container. The tests are written once in
//! `sandbox_container::testing::egress`; Docker's part is reading its own API.

use sandbox_container::egress::NETWORK_NAME;
use sandbox_container::testing::egress::{self as tests, HostView};
use sandbox_container::testing::skip::unless_connected;
use sandbox_docker::{DockerBackend, DockerConfig, DockerNative};

async fn backend() -> Option<DockerBackend> {
    let config = DockerConfig::from_env().startup_sweep(false);
    unless_connected("Docker", DockerBackend::connect(config).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_apply_leaves_no_container() {
    let Some(b) = backend().await else { return };
    tests::a_failing_apply_leaves_no_container(&b).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rules_in_force_are_the_ones_loaded() {
    let Some(b) = backend().await else { return };
    let isolation = ("com.docker.network.bridge.enable_icc", "false");
    tests::the_rules_in_force_are_the_ones_loaded(&b, isolation, async |sb| {
        let native = sb.native().downcast_ref::<DockerNative>().unwrap();
        let client = b.engine().client();
        let c = client
            .inspect_container(&native.container_id, None)
            .await
            .unwrap();
        let host = c.host_config.unwrap();
        // Joined by id (Docker allows duplicate names); the network is ours.
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
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn network_removed_during_create_is_recreated() {
    let config = DockerConfig::from_env().startup_sweep(false);
    let Some(engine) = unless_connected(
        "Docker",
        sandbox_docker::DockerEngine::connect(config).await,
    ) else {
        return;
    };
    tests::network_removed_during_create_is_recreated(engine).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_network_of_our_name_is_refused() {
    let Some(b) = backend().await else { return };
    tests::a_foreign_network_of_our_name_is_refused(&**b.engine(), "docker").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn host_addresses_are_blocked_under_allow() {
    let Some(b) = backend().await else { return };
    tests::host_addresses_are_blocked_under_allow(&b).await;
}
