//! The `ssh://` endpoint trials both adapters run against a
//! [`TestSshd`](crate::sshd::TestSshd) forwarding this machine's own engine socket: a
//! sandbox lives and dies through the tunnel, and a host key that is not in known hosts
//! is refused at once.

use std::time::{Duration, Instant};

use crate::sshd::tunnel_processes;

/// The trial both adapters run: a sandbox created, used and killed through an `ssh://`
/// endpoint (`backend` connected to [`TestSshd::endpoint`]; the engine is remote as far
/// as the library knows, so the agent is uploaded, not bind-mounted), and the tunnel gone
/// once the backend is dropped.
///
/// [`TestSshd::endpoint`]: crate::sshd::TestSshd::endpoint
pub async fn sandbox_through_the_tunnel<B: sandbox_core::Backend>(backend: B) {
    use sandbox_core::{Command, RunOptions};
    let s = backend
        .create(crate::tagged::test_options(
            "sandbox-rs/busybox:latest",
            "ssh_tunnel",
        ))
        .await
        .unwrap_or_else(|e| panic!("create over ssh: {}", e.render()));
    let r = s
        .run(
            Command::from(vec!["echo", "over ssh"]),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.stdout_text(), "over ssh\n");
    let fs = s.files().unwrap();
    fs.write("/tmp/through-ssh.txt", b"bytes".to_vec().into())
        .await
        .unwrap();
    assert_eq!(
        &fs.read("/tmp/through-ssh.txt").await.unwrap()[..],
        b"bytes"
    );
    s.kill().await.unwrap();
    assert!(
        tunnel_processes() >= 1,
        "no ssh process: not through the tunnel?"
    );
    drop(s);
    drop(backend);
    let until = Instant::now() + Duration::from_secs(5);
    while tunnel_processes() > 0 {
        assert!(
            Instant::now() < until,
            "the ssh tunnel outlived its backend"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The other trial both adapters run: `connect` (to [`TestSshd::endpoint`] with
/// [`TestSshd::ssh_config_with_unknown_host_key`]) fails within 10 s as
/// `EngineUnavailable` carrying ssh's reason: never a prompt, never a key accepted blindly.
///
/// [`TestSshd::endpoint`]: crate::sshd::TestSshd::endpoint
/// [`TestSshd::ssh_config_with_unknown_host_key`]: crate::sshd::TestSshd::ssh_config_with_unknown_host_key
pub async fn unknown_host_key_is_refused<T, F>(connect: F)
where
    F: std::future::Future<Output = sandbox_core::Result<T>>,
{
    let t = Instant::now();
    let Err(e) = connect.await else {
        panic!("connected through a host key that is not in known hosts");
    };
    assert_eq!(
        e.code(),
        sandbox_core::ErrorCode::EngineUnavailable,
        "{}",
        e.render()
    );
    assert!(
        e.render().contains("Host key verification failed"),
        "{}",
        e.render()
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// Lists the ssh trials as `#[tokio::test]`s of the calling test binary.
///
/// `engine:` the engine's name in skip messages (`"Docker"`); `socket:` the engine socket
/// on this host the tunnel forwards; `connect:` a function `(endpoint: String, ssh_config:
/// PathBuf) -> impl Future<Output = sandbox_core::Result<B>>` connecting the adapter's
/// backend to that `ssh://` endpoint with that ssh config (and no startup sweep). They
/// skip without sshd ([`crate::sshd::server_or_skip`]) or engine.
#[macro_export]
macro_rules! ssh_trials {
    (engine: $engine:literal, socket: $socket:expr, connect: $connect:path $(,)?) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn a_sandbox_runs_through_an_ssh_endpoint() {
            let Some(sshd) = $crate::sshd::server_or_skip() else {
                return;
            };
            let connected = $connect(sshd.endpoint($socket), sshd.ssh_config()).await;
            let Some(b) = $crate::skip::unless_connected($engine, connected) else {
                return;
            };
            $crate::trials::ssh::sandbox_through_the_tunnel(b).await;
        }

        /// A host key that is not in known hosts fails the connect at once with ssh's
        /// reason: never a prompt, never a key accepted blindly.
        #[tokio::test(flavor = "multi_thread")]
        async fn an_unknown_host_key_is_refused() {
            let Some(sshd) = $crate::sshd::server_or_skip() else {
                return;
            };
            $crate::trials::ssh::unknown_host_key_is_refused($connect(
                sshd.endpoint($socket),
                sshd.ssh_config_with_unknown_host_key(),
            ))
            .await;
        }
    };
}
