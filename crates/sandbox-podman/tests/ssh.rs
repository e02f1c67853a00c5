//! `ssh://` Podman endpoints against an sshd the test starts on loopback (keys and host
//! key generated here; `sandbox_container::testing::ssh`), forwarding this machine's own
//! Podman socket. They skip (with a printed reason) without sshd or Podman, and fail
//! under `CI=true`.

use sandbox_container::testing::skip::unless_connected;
use sandbox_container::testing::ssh::{self, server_or_skip};
use sandbox_podman::{PodmanBackend, PodmanConfig};

const SOCKET: &str = "/run/podman/podman.sock";

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_runs_through_an_ssh_endpoint() {
    let Some(sshd) = server_or_skip() else { return };
    let config = PodmanConfig::from_env()
        .endpoint(sshd.endpoint(SOCKET))
        .ssh_config(sshd.ssh_config())
        .startup_sweep(false);
    let Some(b) = unless_connected("Podman", PodmanBackend::connect(config).await) else {
        return;
    };
    ssh::sandbox_through_the_tunnel(b).await;
}

/// A host key that is not in known hosts fails the connect at once with ssh's reason:
/// never a prompt, never a key accepted blindly.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_host_key_is_refused() {
    let Some(sshd) = server_or_skip() else { return };
    let config = PodmanConfig::from_env()
        .endpoint(sshd.endpoint(SOCKET))
        .ssh_config(sshd.ssh_config_with_unknown_host_key())
        .startup_sweep(false);
    ssh::unknown_host_key_is_refused(PodmanBackend::connect(config)).await;
}
