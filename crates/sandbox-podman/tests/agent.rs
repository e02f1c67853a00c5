//! Attacks on the in-sandbox agent (PID 1 of every agent-mode sandbox) against the real
//! Podman service: `sandbox_container::agent_trials`, written once for every engine. They
//! skip (with a printed reason) when no engine answers, and fail when `CI=true`.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use sandbox_container::agent_trials as trials;
use sandbox_container::{ContainerBackend, ContainerConfig};
use sandbox_core::CreateOptions;
use sandbox_podman::{PodmanConfig, PodmanEngine};

const BUSYBOX: &str = "sandbox-rs/busybox:latest";

async fn backend() -> Option<ContainerBackend<PodmanEngine>> {
    let engine = PodmanEngine::new(&PodmanConfig::from_env()).expect("podman endpoint");
    if let Err(e) = sandbox_container::ContainerEngine::ping(&engine).await {
        let ci = std::env::var("CI").as_deref() == Ok("true")
            || std::env::var("SBX_CONTRACT_REQUIRED").as_deref() == Ok("1");
        if ci {
            panic!("Podman service required under CI=true: {e}");
        }
        println!("skipping: Podman service unavailable: {e}");
        return None;
    }
    Some(
        ContainerBackend::new(
            engine,
            ContainerConfig::new(BUSYBOX)
                .startup_sweep(false)
                .agent(true),
        )
        .await,
    )
}

fn opts(test: &str, lifetime: Duration) -> CreateOptions {
    CreateOptions::new(BUSYBOX)
        .timeout(lifetime)
        .metadata("test", test)
}

#[tokio::test(flavor = "multi_thread")]
async fn deadline_survives_stop_and_kill_from_inside() {
    let Some(b) = backend().await else { return };
    let o = opts("agent_deadline", Duration::from_secs(6));
    trials::deadline_survives_stop_and_kill_from_inside(&b, o)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_channel_is_out_of_reach() {
    let Some(b) = backend().await else { return };
    let o = opts("agent_channel", Duration::from_secs(120));
    trials::agent_channel_is_out_of_reach(&b, o).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_frame_on_stdout_is_only_output() {
    let Some(b) = backend().await else { return };
    let o = opts("agent_forged_frame", Duration::from_secs(120));
    trials::forged_frame_on_stdout_is_only_output(&b, o)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn detach_keys_in_the_channel_do_not_detach() {
    let Some(b) = backend().await else { return };
    let o = opts("agent_detach_keys", Duration::from_secs(120));
    trials::detach_keys_in_the_channel_do_not_detach(&b, o)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_is_mounted_read_only_or_uploaded() {
    let Some(b) = backend().await else { return };
    let o = opts("agent_mount", Duration::from_secs(120));
    trials::agent_is_mounted_read_only_or_uploaded(&b, o)
        .await
        .unwrap();
}
