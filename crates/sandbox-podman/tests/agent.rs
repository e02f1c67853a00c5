//! Attacks on the in-sandbox agent (PID 1 of every agent-mode sandbox) against the real
//! Podman service: `sandbox_testkit::trials::agent`, written once for every engine. They
//! skip (with a printed reason) when no engine answers, and fail when `CI=true`.

use sandbox_podman::{PodmanConfig, PodmanEngine};
use sandbox_testkit::skip::unless_answering;

async fn engine() -> Option<PodmanEngine> {
    unless_answering("Podman", PodmanEngine::new(&PodmanConfig::from_env())).await
}

sandbox_testkit::agent_trials!(engine: engine().await, cli: "podman --remote");
