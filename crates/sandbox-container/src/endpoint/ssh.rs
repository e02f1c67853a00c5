//! `ssh://[user@]host[:port][/remote/socket]` engine endpoints: the engine's socket is
//! forwarded to a private local socket by the system's OpenSSH client
//! (`ssh -nNT -L local:remote`), which the adapter then speaks to as to a local socket.
//!
//! Why the OpenSSH client and not an SSH library: it is what `docker -H ssh://` and
//! `podman --url ssh://` use, so a user's keys, agent, `~/.ssh/config` (jump hosts,
//! ports, identities) and `known_hosts` work unchanged. It runs with `BatchMode=yes` (a
//! missing key or an unknown host key fails at once instead of prompting; host keys are
//! never accepted blindly) and `ExitOnForwardFailure=yes`. `SBX_SSH_CONFIG` names an
//! ssh config file to use instead of the user's (`-F`).
//!
//! The tunnel lives as long as the engine that opened it: dropping the last handle kills
//! the `ssh` process and removes the socket's private directory. The engine is remote
//! for every other purpose ([`crate::ContainerEngine::is_local`] is false): no bind mount
//! of a host file, no netfilter rules from this host.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sandbox_core::{Result, SandboxError};
use tokio::io::AsyncReadExt;

/// Environment variable naming an ssh config file for engine tunnels (`ssh -F`).
pub const SSH_CONFIG_ENV: &str = "SBX_SSH_CONFIG";

/// Longest wait for the tunnel's local socket (authentication included).
const OPEN_TIMEOUT: Duration = Duration::from_secs(20);

/// Bytes of the ssh client's stderr kept for an error message.
const STDERR_KEPT: usize = 4096;

/// Where an `ssh://` endpoint points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// The remote user, when the URL names one (otherwise ssh's own default).
    pub user: Option<String>,
    /// The remote host (a name or an address; never starting with `-`).
    pub host: String,
    /// The remote port, when the URL names one.
    pub port: Option<u16>,
    /// The engine's socket on the remote host.
    pub remote_socket: String,
    /// An ssh config file to use instead of the user's (`ssh -F`); `None` reads
    /// [`SSH_CONFIG_ENV`] when the tunnel opens.
    pub config_file: Option<PathBuf>,
}

impl SshTarget {
    /// The target of `endpoint` when it is an `ssh://` one (any case), with `config_file`
    /// as its ssh config; `None` for every other scheme. A malformed `ssh://` endpoint is
    /// a `Configuration` error, as in [`SshTarget::parse`].
    pub fn of_endpoint(
        endpoint: &str,
        default_socket: &str,
        config_file: Option<PathBuf>,
    ) -> Result<Option<SshTarget>> {
        let scheme = endpoint.trim().get(..6).unwrap_or_default();
        if !scheme.eq_ignore_ascii_case("ssh://") {
            return Ok(None);
        }
        let mut target =
            SshTarget::parse(&format!("ssh://{}", &endpoint.trim()[6..]), default_socket)?;
        target.config_file = config_file;
        Ok(Some(target))
    }

    /// Parses `ssh://[user@]host[:port][/path]`; without a path the engine's default
    /// socket `default_socket` is forwarded.
    pub fn parse(endpoint: &str, default_socket: &str) -> Result<SshTarget> {
        let bad = |why: &str| {
            SandboxError::config(
                format!("invalid ssh endpoint: {why}"),
                "use ssh://user@host[:port][/path/to/engine.sock]",
            )
        };
        let rest = endpoint
            .trim()
            .strip_prefix("ssh://")
            .ok_or_else(|| bad("it does not start with ssh://"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (user, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (host, port) = match hostport.strip_prefix('[') {
            // [v6]:port
            Some(v6) => {
                let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
                (h, after.strip_prefix(':'))
            }
            None => match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            },
        };
        let port = match port {
            Some(p) => Some(
                p.parse::<u16>()
                    .map_err(|_| bad("the port is not a number"))?,
            ),
            None => None,
        };
        // The host and user become arguments of `ssh`: nothing that could read as an
        // option or a second argument.
        let plain = |s: &str| {
            !s.is_empty()
                && !s.starts_with('-')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-:%".contains(c))
        };
        if !plain(host) {
            return Err(bad("the host is empty or has characters ssh would misread"));
        }
        if let Some(u) = user
            && !plain(u)
        {
            return Err(bad("the user is empty or has characters ssh would misread"));
        }
        let remote_socket = if path.is_empty() || path == "/" {
            default_socket.to_string()
        } else {
            path.to_string()
        };
        if remote_socket.chars().any(|c| c.is_control() || c == ':') {
            return Err(bad("the socket path has a ':' or a control character"));
        }
        Ok(SshTarget {
            user: user.map(str::to_string),
            host: host.to_string(),
            port,
            remote_socket,
            config_file: None,
        })
    }

    /// The `ssh` arguments that forward the remote socket to `local`.
    pub fn ssh_args(&self, local: &Path, config: Option<&Path>) -> Vec<String> {
        let mut a: Vec<String> = ["-nNT", "-o", "BatchMode=yes", "-o"]
            .into_iter()
            .map(String::from)
            .collect();
        a.push("ExitOnForwardFailure=yes".into());
        a.extend(["-o".into(), "StreamLocalBindUnlink=yes".into()]);
        a.extend(["-o".into(), "ServerAliveInterval=15".into()]);
        if let Some(c) = config {
            a.extend(["-F".into(), c.display().to_string()]);
        }
        if let Some(p) = self.port {
            a.extend(["-p".into(), p.to_string()]);
        }
        if let Some(u) = &self.user {
            a.extend(["-l".into(), u.clone()]);
        }
        a.extend([
            "-L".into(),
            format!("{}:{}", local.display(), self.remote_socket),
        ]);
        a.extend(["--".into(), self.host.clone()]);
        a
    }
}

/// A running `ssh` forwarding an engine socket to a private local one.
#[derive(Debug)]
pub struct SshTunnel {
    child: tokio::process::Child,
    dir: PathBuf,
    local: PathBuf,
}

impl Drop for SshTunnel {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl SshTunnel {
    /// Starts `ssh` for `target` and waits (bounded) until the local socket accepts.
    /// Failures are `EngineUnavailable`-worthy and carry ssh's own words; the caller maps
    /// them. `backend` names the engine in errors.
    pub async fn open(backend: &str, target: &SshTarget) -> Result<SshTunnel> {
        let dir = private_dir()?;
        let local = dir.join("engine.sock");
        let config = target
            .config_file
            .clone()
            .or_else(|| std::env::var_os(SSH_CONFIG_ENV).map(PathBuf::from));
        let args = target.ssh_args(&local, config.as_deref());
        let spawned = tokio::process::Command::new("ssh")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(SandboxError::config(
                    format!("cannot run the OpenSSH client for {}: {e}", target.host),
                    "install it (`apt-get install openssh-client`), or forward the engine \
                     socket yourself and use a unix:// endpoint",
                )
                .with_source(e));
            }
        };
        let stderr = child.stderr.take();
        // From here the handle owns the process and the directory (Drop cleans both).
        let t = SshTunnel { child, dir, local };
        finish(backend, target, t, stderr).await
    }

    /// The local endpoint, `unix://…/engine.sock`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.local.display())
    }
}

/// Waits until the tunnel's socket accepts, or ssh exits (its stderr is the reason).
async fn finish(
    backend: &str,
    target: &SshTarget,
    mut t: SshTunnel,
    stderr: Option<tokio::process::ChildStderr>,
) -> Result<SshTunnel> {
    let deadline = tokio::time::Instant::now() + OPEN_TIMEOUT;
    loop {
        if let Ok(Some(status)) = t.child.try_wait() {
            let mut said = Vec::new();
            if let Some(mut e) = stderr {
                let _ = (&mut e)
                    .take(STDERR_KEPT as u64)
                    .read_to_end(&mut said)
                    .await;
            }
            let said = String::from_utf8_lossy(&said).trim().to_string();
            return Err(unavailable(
                backend,
                target,
                format!("ssh exited ({status}): {said}"),
            ));
        }
        if tokio::net::UnixStream::connect(&t.local).await.is_ok() {
            // Later diagnostics (a dropped connection) go to the log, bounded per line.
            if let Some(e) = stderr {
                let host = target.host.clone();
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(e.take(1 << 20));
                    let mut line = String::new();
                    while tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut line)
                        .await
                        .is_ok_and(|n| n > 0)
                    {
                        let shown: String = line.trim_end().chars().take(512).collect();
                        tracing::debug!(host = %host, ssh = %shown, "ssh tunnel");
                        line.clear();
                    }
                });
            }
            return Ok(t);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(unavailable(
                backend,
                target,
                format!("the tunnel was not up within {OPEN_TIMEOUT:?}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn unavailable(backend: &str, target: &SshTarget, why: String) -> SandboxError {
    let who = match &target.user {
        Some(u) => format!("{u}@{}", target.host),
        None => target.host.clone(),
    };
    SandboxError::engine_unavailable(
        backend,
        format!("ssh://{who}{}", target.remote_socket),
        format!(
            "{why}. Check that `ssh {who}` logs in without a prompt (key or agent; the host \
             key in known_hosts) and that {} exists there",
            target.remote_socket
        ),
    )
}

/// A fresh directory only this user can enter, for the tunnel's socket.
fn private_dir() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    for _ in 0..8 {
        let dir = base.join(format!(
            "sandbox-rs-ssh-{}",
            crate::sandbox::exec::new_token()
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(SandboxError::config(
                    format!(
                        "cannot create a directory for the ssh tunnel in {}: {e}",
                        base.display()
                    ),
                    "set XDG_RUNTIME_DIR or TMPDIR to a writable directory",
                ));
            }
        }
    }
    Err(SandboxError::config(
        "cannot create a fresh directory for the ssh tunnel",
        "set XDG_RUNTIME_DIR or TMPDIR to a writable directory",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(e: &str) -> Result<SshTarget> {
        SshTarget::parse(e, "/var/run/docker.sock")
    }

    #[test]
    fn only_ssh_endpoints_have_a_target() {
        let of = |e: &str| SshTarget::of_endpoint(e, "/run/e.sock", Some("/cfg".into()));
        let target = of(" SSH://me@host:2222").unwrap().unwrap();
        assert_eq!(target.host, "host");
        assert_eq!(target.port, Some(2222));
        assert_eq!(target.remote_socket, "/run/e.sock");
        assert_eq!(target.config_file, Some(PathBuf::from("/cfg")));
        for other in ["unix:///run/e.sock", "tcp://h:1", "ss", "", "sshx://h"] {
            assert_eq!(of(other).unwrap(), None, "{other}");
        }
        assert!(of("ssh://-oProxyCommand=x").is_err());
    }

    #[test]
    fn parses_user_host_port_and_path() {
        assert_eq!(
            t("ssh://me@build-1.example:2222/run/podman/podman.sock").unwrap(),
            SshTarget {
                user: Some("me".into()),
                host: "build-1.example".into(),
                port: Some(2222),
                remote_socket: "/run/podman/podman.sock".into(),
                config_file: None,
            }
        );
        let d = t("ssh://host").unwrap();
        assert_eq!((d.user, d.port), (None, None));
        assert_eq!(d.remote_socket, "/var/run/docker.sock");
        let v6 = t("ssh://root@[::1]:22").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", Some(22)));
    }

    /// Whatever the URL says becomes an argument of `ssh`, never an option of it.
    #[test]
    fn refuses_what_ssh_would_read_as_an_option() {
        for bad in [
            "ssh://-oProxyCommand=sh",
            "ssh://me@",
            "ssh://-l@host",
            "ssh://host:notaport",
            "ssh://a b@host",
            "ssh://host/sock:evil",
            "tcp://host",
        ] {
            assert!(t(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn args_end_with_the_host_after_a_double_dash() {
        let target = t("ssh://me@host:2200/run/e.sock").unwrap();
        let a = target.ssh_args(Path::new("/tmp/x/engine.sock"), Some(Path::new("/c")));
        assert!(a.contains(&"BatchMode=yes".to_string()));
        assert!(a.contains(&"ExitOnForwardFailure=yes".to_string()));
        assert!(a.windows(2).any(|w| w == ["-F", "/c"]));
        assert!(a.windows(2).any(|w| w == ["-p", "2200"]));
        assert!(a.windows(2).any(|w| w == ["-l", "me"]));
        assert!(
            a.windows(2)
                .any(|w| w == ["-L", "/tmp/x/engine.sock:/run/e.sock"])
        );
        assert_eq!(&a[a.len() - 2..], ["--", "host"]);
    }

    /// A tunnel that cannot log in fails fast with ssh's reason, and leaves no directory.
    #[tokio::test]
    async fn a_failing_login_is_unavailable_with_the_reason() {
        if std::process::Command::new("ssh")
            .arg("-V")
            .output()
            .is_err()
        {
            return;
        }
        // Port 1 on loopback: connection refused at once.
        let target = t("ssh://nobody@127.0.0.1:1/x.sock").unwrap();
        let e = SshTunnel::open("docker", &target).await.unwrap_err();
        assert_eq!(e.code(), sandbox_core::ErrorCode::EngineUnavailable);
        let text = e.render();
        assert!(text.contains("ssh exited"), "{text}");
    }
}
