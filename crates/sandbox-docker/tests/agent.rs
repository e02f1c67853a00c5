//! Attacks on the in-sandbox agent (PID 1 of every agent-mode sandbox) against the real
//! Docker engine: `sandbox_container::agent_trials`, written once for every engine.
//! `SBX_DOCKER_RUNTIME=runsc` runs them under gVisor. They skip (with a printed reason)
//! when no engine answers, and fail when `CI=true`.
#![allow(clippy::print_stdout)]

use sandbox_container::ContainerBackend;
use sandbox_container::agent_trials as trials;
use sandbox_container::testing::skip::unless_connected;
use sandbox_docker::{DockerConfig, DockerEngine, Runtime};

fn runtime() -> Runtime {
    std::env::var("SBX_DOCKER_RUNTIME")
        .ok()
        .and_then(|r| Runtime::parse(&r))
        .unwrap_or(Runtime::Runc)
}

async fn engine() -> Option<DockerEngine> {
    let config = DockerConfig::from_env().runtime(runtime());
    unless_connected("Docker", DockerEngine::connect(config).await)
}

async fn backend() -> Option<ContainerBackend<DockerEngine>> {
    Some(trials::backend(engine().await?).await)
}

/// gVisor's sentry does not give a PID 1 the kernel's protection: root inside can stop
/// or kill it and open `/proc/1/fd/*` (measured with runsc here; docs/agent.md). These
/// promises hold on runc; under runsc they are skipped with this reason.
fn runc_only(test: &str) -> bool {
    if runtime() == Runtime::Runsc {
        println!(
            "skipping {test} under runsc: gVisor lets sandboxed root signal PID 1 and open \
             /proc/1/fd (docs/agent.md, \"gVisor\")"
        );
        return false;
    }
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn deadline_survives_stop_and_kill_from_inside() {
    if !runc_only("deadline_survives_stop_and_kill_from_inside") {
        return;
    }
    let Some(b) = backend().await else { return };
    trials::deadline_survives_stop_and_kill_from_inside(&b)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_channel_is_out_of_reach() {
    if !runc_only("agent_channel_is_out_of_reach") {
        return;
    }
    let Some(b) = backend().await else { return };
    trials::agent_channel_is_out_of_reach(&b).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_frame_on_stdout_is_only_output() {
    let Some(b) = backend().await else { return };
    trials::forged_frame_on_stdout_is_only_output(&b)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn detach_keys_in_the_channel_do_not_detach() {
    let Some(b) = backend().await else { return };
    trials::detach_keys_in_the_channel_do_not_detach(&b)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_is_mounted_read_only_or_uploaded() {
    let Some(b) = backend().await else { return };
    trials::agent_is_mounted_read_only_or_uploaded(&b)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn fifo_read_fails_within_the_call_timeout() {
    let Some(e) = engine().await else { return };
    trials::fifo_read_fails_within_the_call_timeout(e)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_interpreter_frames_kill_only_their_context() {
    let Some(b) = backend().await else { return };
    trials::forged_interpreter_frames_kill_only_their_context(&b)
        .await
        .unwrap();
}
