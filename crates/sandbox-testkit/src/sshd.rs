//! An `sshd` the ssh:// engine tests start on loopback, with host and client keys they
//! generate, and the ssh config a tunnel needs to reach it (`known_hosts` pinned to the
//! generated host key: nothing is accepted blindly). Nothing leaves the machine. The
//! trials that use it live with the other trials (`trials::ssh`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A running loopback sshd; killed and its files removed when dropped.
#[derive(Debug)]
pub struct TestSshd {
    child: std::process::Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for TestSshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Host alias of the server in [`TestSshd::ssh_config`].
pub const HOST_ALIAS: &str = "sbx-test-sshd";

impl TestSshd {
    /// Starts one, or says why it cannot (no `sshd`/`ssh-keygen` installed: `cargo xtask
    /// setup` installs openssh-server).
    pub fn start() -> Result<TestSshd, String> {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .ok_or("no sshd (apt-get install openssh-server; `cargo xtask setup` does)")?;
        let dir = std::env::temp_dir().join(format!("sbx-sshd-{}", unique_suffix()));
        std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        match Self::start_in(sshd, &dir) {
            Ok((child, port)) => Ok(TestSshd { child, dir, port }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Keys, configs and the server, in `d`.
    fn start_in(sshd: &str, d: &Path) -> Result<(std::process::Child, u16), String> {
        for key in ["host_key", "id"] {
            let out = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "sbx-test", "-f"])
                .arg(d.join(key))
                .output()
                .map_err(|e| format!("ssh-keygen: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "ssh-keygen failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let read = |name: &str| {
            std::fs::read_to_string(d.join(name)).map_err(|e| format!("reading {name}: {e}"))
        };
        std::fs::write(d.join("authorized_keys"), read("id.pub")?)
            .map_err(|e| format!("authorized_keys: {e}"))?;
        // The privilege-separation directory sshd insists on (absent until the service
        // first ran).
        let _ = std::fs::create_dir_all("/run/sshd");
        let port = free_port()?;
        let user = whoami();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile {pid}\n\
             AuthorizedKeysFile {ak}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUsePAM no\n\
             StrictModes no\nAllowStreamLocalForwarding local\nAllowTcpForwarding local\n\
             AllowUsers {user}\nLogLevel ERROR\n",
            hk = d.join("host_key").display(),
            pid = d.join("sshd.pid").display(),
            ak = d.join("authorized_keys").display(),
        );
        std::fs::write(d.join("sshd_config"), config).map_err(|e| format!("sshd_config: {e}"))?;
        let host_pub = read("host_key.pub")?;
        std::fs::write(
            d.join("known_hosts"),
            format!("[127.0.0.1]:{port} {}", host_pub.trim()),
        )
        .map_err(|e| format!("known_hosts: {e}"))?;
        let client = format!(
            "Host {HOST_ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  \
             IdentityFile {id}\n  IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n  \
             StrictHostKeyChecking yes\n  HostKeyAlias [127.0.0.1]:{port}\n",
            id = d.join("id").display(),
            kh = d.join("known_hosts").display(),
        );
        std::fs::write(d.join("ssh_config"), client).map_err(|e| format!("ssh_config: {e}"))?;
        let child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting sshd: {e}"))?;
        let mut child = child;
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            let failed = match child.try_wait() {
                Ok(Some(status)) => Some(format!("sshd exited at once ({status})")),
                _ if Instant::now() > until => Some("sshd did not listen within 10 s".into()),
                _ => None,
            };
            if let Some(why) = failed {
                let _ = child.kill();
                let _ = child.wait();
                return Err(why);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok((child, port))
    }

    /// The client config that reaches this server as [`HOST_ALIAS`].
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.join("ssh_config")
    }

    /// A client config for the same server whose known hosts do not hold its key: a
    /// tunnel through it must fail (host key verification), never prompt or accept.
    pub fn ssh_config_with_unknown_host_key(&self) -> PathBuf {
        let path = self.dir.join("ssh_config_unknown");
        let text = std::fs::read_to_string(self.ssh_config())
            .unwrap_or_default()
            .replace(
                &format!(
                    "UserKnownHostsFile {}",
                    self.dir.join("known_hosts").display()
                ),
                "UserKnownHostsFile /dev/null",
            );
        let _ = std::fs::write(&path, text);
        path
    }

    /// `ssh://<alias><socket>`.
    pub fn endpoint(&self, socket: &str) -> String {
        format!("ssh://{HOST_ALIAS}{socket}")
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// `<pid>-<n>`: unique among the servers of this process and of every other one alive.
fn unique_suffix() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("free port: {e}"))
}

fn whoami() -> String {
    Command::new("id")
        .arg("-un")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "root".into())
}

/// A started server, or `None` after printing why on a developer's machine; under
/// `CI=true` a missing sshd fails the test.
#[allow(clippy::print_stdout)]
pub fn server_or_skip() -> Option<TestSshd> {
    match TestSshd::start() {
        Ok(s) => Some(s),
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("the ssh:// tests need an sshd under CI=true: {why}")
        }
        Err(why) => {
            println!("skipping: {why}");
            None
        }
    }
}

/// Whether an `ssh` process for [`HOST_ALIAS`] still runs (a tunnel that outlived its
/// engine).
pub fn tunnel_processes() -> usize {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .filter(|c| {
                    let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                    args.first().is_some_and(|a| a.ends_with(b"ssh"))
                        && args.iter().any(|a| *a == HOST_ALIAS.as_bytes())
                })
                .count()
        })
        .unwrap_or(0)
}
