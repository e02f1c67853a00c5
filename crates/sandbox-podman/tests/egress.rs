//! Egress allowlists on a real Podman engine, beyond the contract suite: the rules in
//! force read from the host, the library network's isolation, and a failing apply that
//! must leave no container. The tests are written once in
//! `sandbox_container::testing::egress`; Podman's part is reading its own API.

use sandbox_container::egress::NETWORK_NAME;
use sandbox_container::testing::egress::{self as tests, HostView};
use sandbox_container::testing::skip::unless_connected;
use sandbox_podman::{PodmanBackend, PodmanConfig, PodmanNative};

async fn backend() -> Option<PodmanBackend> {
    let config = PodmanConfig::from_env().startup_sweep(false);
    unless_connected("Podman", PodmanBackend::connect(config).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_apply_leaves_no_container() {
    let Some(b) = backend().await else { return };
    tests::a_failing_apply_leaves_no_container(&b).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rules_in_force_are_the_ones_loaded() {
    let Some(b) = backend().await else { return };
    tests::the_rules_in_force_are_the_ones_loaded(&b, ("isolate", "true"), async |sb| {
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
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn network_removed_during_create_is_recreated() {
    let engine =
        sandbox_podman::PodmanEngine::new(&PodmanConfig::from_env()).expect("podman endpoint");
    if let Err(e) = sandbox_container::ContainerEngine::ping(&engine).await {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "Podman service required under CI=true: {e}"
        );
        #[allow(clippy::print_stdout)]
        {
            println!("skipping: Podman service unavailable: {e}");
        }
        return;
    }
    tests::network_removed_during_create_is_recreated(engine).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_network_of_our_name_is_refused() {
    let Some(b) = backend().await else { return };
    tests::a_foreign_network_of_our_name_is_refused(&**b.engine(), "podman --remote").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn host_addresses_are_blocked_under_allow() {
    let Some(b) = backend().await else { return };
    tests::host_addresses_are_blocked_under_allow(&b).await;
}
