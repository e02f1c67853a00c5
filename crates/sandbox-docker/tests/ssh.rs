//! `ssh://` Docker endpoints against an sshd the test starts on loopback (keys and host
//! key generated here; `sandbox_container::testing::ssh`), forwarding this machine's own
//! Docker socket. They skip (with a printed reason) without sshd or Docker, and fail
//! under `CI=true`.

use sandbox_container::testing::skip::unless_connected;
use sandbox_container::testing::ssh::{self, server_or_skip};
use sandbox_docker::{DockerBackend, DockerConfig};

const SOCKET: &str = "/var/run/docker.sock";

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_runs_through_an_ssh_endpoint() {
    let Some(sshd) = server_or_skip() else { return };
    let config = DockerConfig::default()
        .endpoint(sshd.endpoint(SOCKET))
        .ssh_config(sshd.ssh_config())
        .startup_sweep(false);
    let Some(b) = unless_connected("Docker", DockerBackend::connect(config).await) else {
        return;
    };
    ssh::sandbox_through_the_tunnel(b).await;
}

/// A host key that is not in known hosts fails the connect at once with ssh's reason:
/// never a prompt, never a key accepted blindly.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_host_key_is_refused() {
    let Some(sshd) = server_or_skip() else { return };
    let config = DockerConfig::default()
        .endpoint(sshd.endpoint(SOCKET))
        .ssh_config(sshd.ssh_config_with_unknown_host_key())
        .startup_sweep(false);
    ssh::unknown_host_key_is_refused(DockerBackend::connect(config)).await;
}
