//! Images pulled on create, against a registry each trial starts on 127.0.0.1 serving the
//! local busybox image plus a marker layer: nothing leaves the machine. The trials are
//! `sandbox_testkit::trials::pull`, written once for every engine. They skip (with a
//! printed reason) when no engine answers, and fail loudly when `CI=true`. Every image a
//! trial pulls is removed by it.

use sandbox_docker::{DockerConfig, DockerEngine};
use sandbox_testkit::skip::unless_connected;

async fn engine() -> Option<DockerEngine> {
    unless_connected(
        "Docker",
        DockerEngine::connect(DockerConfig::from_env()).await,
    )
}

sandbox_testkit::pull_trials! {
    engine: engine().await,
    cli: "docker",
    credentials: credentials_from_docker_config_are_used from DockerConfig,
}
