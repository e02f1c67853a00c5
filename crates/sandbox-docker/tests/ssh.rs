//! `ssh://` Docker endpoints against an sshd the test starts on loopback (keys and host
//! key generated here; `sandbox_testkit::trials::ssh`), forwarding this machine's own
//! Docker socket. They skip (with a printed reason) without sshd or Docker, and fail
//! under `CI=true`.

use std::path::PathBuf;

use sandbox_docker::{DockerBackend, DockerConfig};

/// The backend through the `ssh://` `endpoint`, with `ssh_config`.
async fn connect(endpoint: String, ssh_config: PathBuf) -> sandbox_core::Result<DockerBackend> {
    let config = DockerConfig::default()
        .endpoint(endpoint)
        .ssh_config(ssh_config)
        .startup_sweep(false);
    DockerBackend::connect(config).await
}

sandbox_testkit::ssh_trials! {
    engine: "Docker",
    socket: "/var/run/docker.sock",
    connect: connect,
}
