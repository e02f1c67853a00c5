//! The two engine daemons `setup` manages — `dockerd` and the Podman API service — and how to
//! tell whether an engine endpoint answers.
//!
//! Neither runs by default on the CI machines (no systemd), so `setup` starts them detached
//! with `setsid` (they outlive xtask), records their pids under `/run/sandbox-rs/`, and
//! `teardown` stops exactly those pids, never anything found by name.
//!
//! Each daemon runs in a working directory of its own under `/run/sandbox-rs/`, never the
//! directory `setup` was called from: conmon, which the Podman service spawns per container,
//! writes an `oom` marker into its inherited working directory when a container is
//! OOM-killed, and a service started from the checkout left that file in the repository.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::process;

/// Where `setup` records the pids of the daemons it started.
pub const STATE_DIR: &str = "/run/sandbox-rs";

/// How long a freshly started daemon may take to answer. Measured here: dockerd ≈ 1 s,
/// the Podman service ≈ 0.5 s; the margin is for loaded CI machines.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// dockerd drains running containers on SIGTERM (10 s stop timeout each, in parallel).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Raises the open-files soft limit to the hard one, then execs its arguments.
const RAISE_NOFILE_AND_EXEC: &str = r#"ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$@""#;

/// A daemon serving an engine API on a unix socket.
pub struct Daemon {
    /// Name in messages and in the pid/log file names.
    pub name: &'static str,
    /// The API socket.
    pub socket: &'static str,
    /// A cheap GET answered with 200 once the API serves requests.
    ping_path: &'static str,
    /// The program and its arguments.
    program: &'static str,
    args: &'static [&'static str],
    /// argv words that identify this daemon in `/proc/<pid>/cmdline`.
    identity: &'static [&'static str],
    /// A pid file the daemon writes itself, if any.
    own_pid_file: Option<&'static str>,
}

/// The Docker engine.
pub const DOCKERD: Daemon = Daemon {
    name: "dockerd",
    socket: "/var/run/docker.sock",
    ping_path: "/_ping",
    program: "dockerd",
    args: &[],
    identity: &["dockerd"],
    own_pid_file: Some("/var/run/docker.pid"),
};

/// The Podman REST API (libpod + Docker-compatible), which the Podman adapter talks to.
/// `--time=0`: never exit when idle (the default is 5 s).
pub const PODMAN: Daemon = Daemon {
    name: "podman",
    socket: "/run/podman/podman.sock",
    ping_path: "/v4.0.0/libpod/_ping",
    program: "podman",
    args: &[
        "system",
        "service",
        "--time=0",
        "unix:///run/podman/podman.sock",
    ],
    identity: &["podman", "system", "service"],
    own_pid_file: None,
};

impl Daemon {
    /// The pid file `setup` writes for a daemon it started.
    pub fn pid_file(&self) -> PathBuf {
        Path::new(STATE_DIR).join(format!("{}.pid", self.name))
    }

    /// The working directory `setup` starts the daemon in: its own, so whatever the daemon
    /// or its children write relative to their cwd (conmon's `oom` marker) lands there.
    pub fn work_dir(&self) -> PathBuf {
        Path::new(STATE_DIR).join(self.name)
    }

    /// The daemon's log when `setup` started it.
    pub fn log_file(&self) -> PathBuf {
        PathBuf::from(format!("/var/log/sandbox-rs-{}.log", self.name))
    }

    /// Whether the API answers its ping right now.
    pub fn answers(&self) -> bool {
        matches!(
            http_get_unix(Path::new(self.socket), self.ping_path),
            Ok((200, _))
        )
    }

    /// The pid of a running instance: the one `setup` recorded, the daemon's own pid file,
    /// or any process whose command line identifies it.
    pub fn running_pid(&self) -> Option<u32> {
        self.recorded_pid()
            .or_else(|| {
                let own = self.own_pid_file?;
                read_pid(Path::new(own)).filter(|&pid| self.is(pid))
            })
            .or_else(|| live_pids().find(|&pid| self.is(pid)))
    }

    /// The pid `setup` recorded, if that process is still this daemon (a reused pid is not).
    pub fn recorded_pid(&self) -> Option<u32> {
        read_pid(&self.pid_file()).filter(|&pid| self.is(pid))
    }

    /// Whether a running instance (`pid`) was started from somewhere other than
    /// [`work_dir`](Self::work_dir), e.g. by an older `setup` that ran it in the checkout.
    /// `Some(cwd)` names where it runs; `None` when it runs in its own directory or its cwd
    /// cannot be read.
    pub fn foreign_cwd(&self, pid: u32) -> Option<PathBuf> {
        let cwd = fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
        (cwd != self.work_dir()).then_some(cwd)
    }

    fn is(&self, pid: u32) -> bool {
        is_alive(pid) && cmdline_matches(pid, self.identity)
    }

    /// The daemon's open-files limit (soft), from `/proc/<pid>/limits`.
    pub fn open_files_limit(pid: u32) -> Option<u64> {
        let limits = fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        line.split_whitespace().nth(3)?.parse().ok()
    }

    /// Starts the daemon detached (own session, so it survives xtask and the terminal),
    /// records its pid and waits until the API answers.
    pub fn start(&self) -> Result<u32> {
        fs::create_dir_all(STATE_DIR)?;
        let work_dir = self.work_dir();
        fs::create_dir_all(&work_dir)?;
        if let Some(dir) = Path::new(self.socket).parent() {
            fs::create_dir_all(dir)?;
        }
        // A socket file left by a dead daemon makes the new one fail to bind.
        let _ = fs::remove_file(self.socket);
        let log_path = self.log_file();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        // `setsid` execs in place when its caller is not a process-group leader (a spawned
        // child never is), and so does the shell before it, so the child's pid is the
        // daemon's pid. The shell first raises the open-files soft limit to the hard one:
        // an engine keeps about a dozen descriptors per live container, and a soft limit
        // inherited from a login shell (often 1024) caps a machine at a few dozen
        // sandboxes.
        let mut child = Command::new("sh")
            .args(["-c", RAISE_NOFILE_AND_EXEC, "sh", "setsid", self.program])
            .args(self.args)
            .current_dir(&work_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", self.program))?;
        let pid = child.id();
        fs::write(self.pid_file(), format!("{pid}\n"))?;
        self.wait_until_answering(Some(&mut child))
            .with_context(|| {
                format!(
                    "log {}:\n{}",
                    log_path.display(),
                    process::log_tail(&log_path, 20)
                )
            })?;
        Ok(pid)
    }

    /// Polls the ping until it answers; fails early when `child` exits.
    pub fn wait_until_answering(&self, mut child: Option<&mut Child>) -> Result<()> {
        let start = Instant::now();
        while start.elapsed() < START_TIMEOUT {
            if self.answers() {
                return Ok(());
            }
            if let Some(child) = child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("{} exited during startup ({status})", self.name);
            }
            sleep(Duration::from_millis(100));
        }
        bail!(
            "{} did not answer on {} within {} s",
            self.name,
            self.socket,
            START_TIMEOUT.as_secs()
        )
    }

    /// Stops the instance `setup` started (SIGTERM, then SIGKILL after a grace period).
    /// Returns `None` when there is none, leaving any other instance alone.
    pub fn stop_recorded(&self) -> Result<Option<u32>> {
        let Some(pid) = self.recorded_pid() else {
            let _ = fs::remove_file(self.pid_file());
            return Ok(None);
        };
        process::send_signal(pid, "TERM")?;
        let start = Instant::now();
        while is_alive(pid) && start.elapsed() < STOP_TIMEOUT {
            sleep(Duration::from_millis(100));
        }
        if is_alive(pid) {
            process::send_signal(pid, "KILL")?;
            sleep(Duration::from_millis(500));
        }
        if is_alive(pid) {
            bail!("{} (pid {pid}) survived SIGKILL", self.name);
        }
        let _ = fs::remove_file(self.pid_file());
        Ok(Some(pid))
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Alive and not a zombie (a daemon that exited but was not reaped yet counts as gone).
fn is_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state letter follows the parenthesised command name, which may contain spaces.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// Whether every word of `identity` appears in the process's argv (the first compared by
/// file name, so `/usr/sbin/dockerd` matches `dockerd`).
fn cmdline_matches(pid: u32, identity: &[&str]) -> bool {
    let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let argv: Vec<String> = raw
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let Some((program, rest)) = argv.split_first() else {
        return false;
    };
    let program_name = Path::new(program).file_name().and_then(|n| n.to_str());
    let Some((first, others)) = identity.split_first() else {
        return false;
    };
    program_name == Some(*first) && others.iter().all(|word| rest.iter().any(|a| a == word))
}

fn live_pids() -> impl Iterator<Item = u32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

/// A minimal HTTP/1.0 GET over a unix socket (the server closes the connection after the
/// response, so reading to the end is the whole answer). Returns status and body.
pub fn http_get_unix(socket: &Path, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: d\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    parse_http_response(&String::from_utf8_lossy(&response))
}

fn parse_http_response(response: &str) -> std::io::Result<(u16, String)> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response");
    let status_line = response.lines().next().ok_or_else(bad)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Why the engine at `host` (a `DOCKER_HOST`/`CONTAINER_HOST` style URL) cannot be used, or
/// `None` when its API answers. TLS endpoints are only checked for a TCP connection.
pub fn unreachable_reason(host: &str, ping_path: &str) -> Option<String> {
    if let Some(path) = host.strip_prefix("unix://") {
        return match http_get_unix(Path::new(path), ping_path) {
            Ok((200, _)) => None,
            Ok((status, _)) => Some(format!("{host} answered {ping_path} with HTTP {status}")),
            Err(err) => Some(format!("{host}: {err}")),
        };
    }
    if let Some(addr) = host.strip_prefix("tcp://") {
        let addr = addr.trim_end_matches('/');
        return match TcpStream::connect(addr) {
            Ok(_) => None,
            Err(err) => Some(format!("{host}: {err}")),
        };
    }
    Some(format!(
        "{host}: unsupported endpoint (expected unix:// or tcp://)"
    ))
}

/// The Docker endpoint the adapters will use: `$DOCKER_HOST`, else the local socket.
pub fn docker_host() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| format!("unix://{}", DOCKERD.socket))
}

/// The Podman endpoint the adapters will use: `$CONTAINER_HOST`, else the rootful socket.
pub fn podman_host() -> String {
    std::env::var("CONTAINER_HOST").unwrap_or_else(|_| format!("unix://{}", PODMAN.socket))
}

/// The ping paths for [`unreachable_reason`].
pub const DOCKER_PING: &str = "/_ping";
/// The libpod ping: proves the libpod API (not only the Docker-compatible one) is served.
pub const PODMAN_PING: &str = "/v4.0.0/libpod/_ping";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_files_limit_is_read_from_proc_and_raised_by_the_start_shell() {
        let own = Daemon::open_files_limit(std::process::id()).expect("own limit");
        assert!(own > 0);
        // The start shell's exec keeps the pid and raises the soft limit to the hard one.
        let out = Command::new("sh")
            .args(["-c", "ulimit -Sn 64; exec \"$@\"", "sh"])
            .args(["sh", "-c", RAISE_NOFILE_AND_EXEC, "sh"])
            .args(["sh", "-c", "ulimit -n; ulimit -Hn"])
            .output()
            .expect("sh");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            lines[0], lines[1],
            "soft limit raised to the hard one: {text}"
        );
    }

    #[test]
    fn http_status_and_body_are_parsed() {
        let (status, body) =
            parse_http_response("HTTP/1.0 200 OK\r\nApi-Version: 1.41\r\n\r\nOK").unwrap();
        assert_eq!(status, 200);
        assert_eq!(body, "OK");
        assert!(parse_http_response("").is_err());
    }

    #[test]
    fn own_process_is_alive_and_matches_its_program_name() {
        let pid = std::process::id();
        assert!(is_alive(pid));
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap().to_string();
        assert!(cmdline_matches(pid, &[name.as_str()]));
        assert!(!cmdline_matches(pid, &["dockerd"]));
    }

    /// The repository checkout this xtask was built from.
    fn checkout() -> PathBuf {
        let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
    }

    /// Files in the checkout git does not know and does not ignore.
    fn untracked_files(checkout: &Path) -> std::collections::BTreeSet<String> {
        let output = Command::new("git")
            .args(["ls-files", "--others", "--exclude-standard", "-z"])
            .current_dir(checkout)
            .output()
            .expect("run git ls-files");
        assert!(output.status.success(), "git ls-files failed: {output:?}");
        output
            .stdout
            .split(|&b| b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| String::from_utf8_lossy(name).into_owned())
            .collect()
    }

    /// conmon writes an `oom` marker into the working directory it inherits from the Podman
    /// service. An OOM-killed container run through the service must leave no new file in
    /// the checkout, which fails whenever the service runs there (as `setup` once started it).
    #[test]
    fn oom_killed_podman_container_leaves_the_checkout_clean() {
        let host = podman_host();
        if let Some(why) = unreachable_reason(&host, PODMAN_PING) {
            assert!(
                !crate::contract::engines_required(),
                "CI=true requires the Podman service: {why}"
            );
            println!("skipped: Podman service not reachable ({why})");
            return;
        }
        let checkout = checkout();
        let before = untracked_files(&checkout);
        // conmon opens the marker with O_CREAT only, so one left by an earlier run would not
        // change and would hide a new one: it is itself the failure this test looks for.
        let stale: Vec<&String> = before
            .iter()
            .filter(|path| Path::new(path).file_name() == Some("oom".as_ref()))
            .collect();
        assert!(
            stale.is_empty(),
            "OOM markers {stale:?} are already in the checkout {}: a Podman service ran there; \
             delete them and restart the service with `cargo xtask setup`",
            checkout.display()
        );
        // busybox `dd` allocates a block of `bs` bytes: 256 MiB under a 32 MiB limit (no
        // swap) is OOM-killed as soon as the block is filled.
        let output = Command::new("podman")
            .args(["--remote", "--url", &host, "run", "--rm"])
            .args(["--label", "io.sandbox-rs.managed=true"])
            .args(["--label", "io.sandbox-rs.meta.test=xtask-oom-checkout"])
            .args([
                "--network",
                "none",
                "--memory",
                "32m",
                "--memory-swap",
                "32m",
            ])
            .args([
                "sandbox-rs/busybox:latest",
                "dd",
                "if=/dev/zero",
                "of=/dev/null",
            ])
            .args(["bs=256M", "count=1"])
            .stdin(Stdio::null())
            .output()
            .expect("run podman --remote");
        // 137 = SIGKILL: the kernel's OOM killer, so conmon did see an OOM kill.
        assert_eq!(
            output.status.code(),
            Some(137),
            "the workload was not OOM-killed, so this proves nothing: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let new: Vec<String> = untracked_files(&checkout)
            .difference(&before)
            .cloned()
            .collect();
        let service_cwd = PODMAN
            .running_pid()
            .and_then(|pid| fs::read_link(format!("/proc/{pid}/cwd")).ok());
        assert!(
            new.is_empty(),
            "an OOM-killed Podman container left {new:?} in the checkout {}; the Podman \
             service runs in {service_cwd:?}, it must run in {} (restart it with `cargo xtask \
             setup`)",
            checkout.display(),
            PODMAN.work_dir().display()
        );
    }

    #[test]
    fn missing_socket_is_unreachable_with_a_reason() {
        let reason = unreachable_reason("unix:///nonexistent/sandbox-rs.sock", DOCKER_PING);
        assert!(reason.unwrap().contains("/nonexistent/sandbox-rs.sock"));
        assert!(unreachable_reason("ssh://host", DOCKER_PING).is_some());
    }
}
