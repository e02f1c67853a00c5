//! Attacks on the in-sandbox agent (PID 1 of every agent-mode sandbox) against the real
//! Docker engine: `sandbox_testkit::trials::agent`, written once for every engine.
//! `SBX_DOCKER_RUNTIME=runsc` runs them under gVisor (where the trials that need the
//! kernel's PID-1 protection skip with the reason). They skip (with a printed reason) when
//! no engine answers, and fail when `CI=true`.

use sandbox_docker::{DockerConfig, DockerEngine, Runtime};
use sandbox_testkit::skip::unless_connected;

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

sandbox_testkit::agent_trials!(engine: engine().await, cli: "docker");
