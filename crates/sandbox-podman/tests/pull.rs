//! Images pulled on create, against a registry each trial starts on 127.0.0.1 serving the
//! local busybox image plus a marker layer: nothing leaves the machine (the adapter skips
//! TLS verification for loopback registries only, as Docker does). The trials are
//! `sandbox_testkit::trials::pull`, written once for every engine. They skip (with a
//! printed reason) when no engine answers, and fail loudly when `CI=true`. Every image a
//! trial pulls is removed by it.

use sandbox_podman::{PodmanConfig, PodmanEngine};
use sandbox_testkit::skip::unless_answering;

async fn engine() -> Option<PodmanEngine> {
    unless_answering("Podman", PodmanEngine::new(&PodmanConfig::from_env())).await
}

sandbox_testkit::pull_trials! {
    engine: engine().await,
    cli: "podman",
    credentials: credentials_from_registry_auth_file_are_used from RegistryAuthFile,
}
