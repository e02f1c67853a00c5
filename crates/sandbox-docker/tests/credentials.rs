//! Brokered credentials on a real Docker engine (runc): the trials are written once in
//! `sandbox_testkit::trials::credentials`, against servers in the egress lab.

use sandbox_docker::{DockerBackend, DockerConfig};
use sandbox_testkit::skip::unless_connected;

async fn backend() -> Option<DockerBackend> {
    let config = DockerConfig::from_env().startup_sweep(false);
    unless_connected("Docker", DockerBackend::connect(config).await)
}

sandbox_testkit::credentials_trials! {
    backend: backend().await,
}
