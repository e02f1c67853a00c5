//! `ssh://` Podman endpoints against an sshd the test starts on loopback (keys and host
//! key generated here; `sandbox_testkit::trials::ssh`), forwarding this machine's own
//! Podman socket. They skip (with a printed reason) without sshd or Podman, and fail
//! under `CI=true`.

use std::path::PathBuf;

use sandbox_podman::{PodmanBackend, PodmanConfig};

/// The backend through the `ssh://` `endpoint`, with `ssh_config`.
async fn connect(endpoint: String, ssh_config: PathBuf) -> sandbox_core::Result<PodmanBackend> {
    let config = PodmanConfig::from_env()
        .endpoint(endpoint)
        .ssh_config(ssh_config)
        .startup_sweep(false);
    PodmanBackend::connect(config).await
}

sandbox_testkit::ssh_trials! {
    engine: "Podman",
    socket: "/run/podman/podman.sock",
    connect: connect,
}
