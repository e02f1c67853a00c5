//! Remote Docker over TLS: the test starts its own `dockerd` listening only on
//! a loopback TLS port with `--tlsverify` and certificates it generates (a CA, a server
//! certificate for 127.0.0.1, a client certificate), loads the busybox image into it, and
//! drives a sandbox through the adapter over that port: create, exec (whose bodies carry
//! secrets, the reason plain TCP is refused), kill. A client certificate from another CA
//! is refused by the engine. Needs root, `dockerd` and `openssl`; skips with a printed
//! reason without them (fails under `CI=true`). Everything it starts is stopped and its
//! directory removed.
//!
//! `cargo test -p sandbox-rs-docker --features tls --test tls -- --nocapture`
#![cfg(feature = "tls")]
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_core::{Backend, CreateOptions, ErrorCode, SandboxExt};
use sandbox_docker::{DockerBackend, DockerConfig};

const BUSYBOX: &str = "sandbox-rs/busybox:latest";

fn skip(why: &str) -> bool {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("TLS trial required under CI=true: {why}");
    }
    println!("skipping: {why}");
    true
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A CA, and a certificate signed by it with `ext` (`subjectAltName`, key usage), as
/// `<name>.pem` / `<name>-key.pem` in `dir`.
fn make_ca(dir: &Path, ca: &str) -> Result<(), String> {
    run(Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", &format!("/CN={ca}")])
        .arg("-keyout")
        .arg(dir.join(format!("{ca}-key.pem")))
        .arg("-out")
        .arg(dir.join(format!("{ca}.pem"))))
}

fn make_cert(dir: &Path, ca: &str, name: &str, cn: &str, ext: &str) -> Result<(), String> {
    let csr = dir.join(format!("{name}.csr"));
    let extfile = dir.join(format!("{name}.ext"));
    std::fs::write(&extfile, ext).map_err(|e| e.to_string())?;
    run(Command::new("openssl")
        .args(["req", "-newkey", "rsa:2048", "-nodes"])
        .args(["-subj", &format!("/CN={cn}")])
        .arg("-keyout")
        .arg(dir.join(format!("{name}-key.pem")))
        .arg("-out")
        .arg(&csr))?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "1", "-CAcreateserial"])
        .arg("-in")
        .arg(&csr)
        .arg("-CA")
        .arg(dir.join(format!("{ca}.pem")))
        .arg("-CAkey")
        .arg(dir.join(format!("{ca}-key.pem")))
        .arg("-extfile")
        .arg(&extfile)
        .arg("-out")
        .arg(dir.join(format!("{name}.pem"))))
}

/// A client certificate directory as `DOCKER_CERT_PATH` expects it.
fn client_dir(dir: &Path, ca: &str, client: &str, out: &str) -> Result<PathBuf, String> {
    let d = dir.join(out);
    std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    for (from, to) in [
        (format!("{ca}.pem"), "ca.pem"),
        (format!("{client}.pem"), "cert.pem"),
        (format!("{client}-key.pem"), "key.pem"),
    ] {
        std::fs::copy(dir.join(from), d.join(to)).map_err(|e| e.to_string())?;
    }
    Ok(d)
}

/// A `dockerd` of this test's own: its data, exec root, pidfile and containerd under
/// `dir`, no iptables changes (it shares the host with the main engine), listening only on
/// `127.0.0.1:port` with `--tlsverify`. Its default bridge is one this test creates and
/// removes ([`TEST_BRIDGE`]): with `--bridge=none` dockerd deletes the host's `docker0`,
/// which the main engine's default network needs. Stopped (SIGTERM, then SIGKILL), its
/// bridge deleted and its directory removed when dropped.
struct TlsDaemon {
    child: Child,
    dir: PathBuf,
    port: u16,
}

/// The bridge the test's dockerd uses as its default bridge (never `docker0`).
const TEST_BRIDGE: &str = "sbx-tls0";

/// Runs `ip ARGS`; whether it succeeded.
fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl TlsDaemon {
    fn start(dir: &Path) -> Result<TlsDaemon, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let log = std::fs::File::create(dir.join("dockerd.log")).map_err(|e| e.to_string())?;
        let stderr = log.try_clone().map_err(|e| e.to_string())?;
        // A leftover of an interrupted run goes first.
        ip(&["link", "del", TEST_BRIDGE]);
        if !ip(&["link", "add", TEST_BRIDGE, "type", "bridge"])
            || !ip(&["addr", "add", "198.18.251.1/24", "dev", TEST_BRIDGE])
        {
            ip(&["link", "del", TEST_BRIDGE]);
            return Err(format!("cannot create the test bridge {TEST_BRIDGE}"));
        }
        let child = Command::new("dockerd")
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .args(["-H", &format!("tcp://127.0.0.1:{port}")])
            .arg("--tlsverify")
            .arg("--tlscacert")
            .arg(dir.join("ca.pem"))
            .arg("--tlscert")
            .arg(dir.join("server.pem"))
            .arg("--tlskey")
            .arg(dir.join("server-key.pem"))
            .args([
                format!("--bridge={TEST_BRIDGE}").as_str(),
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
            ])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|e| {
                ip(&["link", "del", TEST_BRIDGE]);
                format!("cannot start dockerd: {e}")
            })?;
        Ok(TlsDaemon {
            child,
            dir: dir.to_path_buf(),
            port,
        })
    }

    /// The engine CLI against this daemon with the client certificates of `certs`.
    fn cli(&self, certs: &Path) -> Command {
        let mut c = Command::new("docker");
        c.arg("--tlsverify")
            .arg("--tlscacert")
            .arg(certs.join("ca.pem"))
            .arg("--tlscert")
            .arg(certs.join("cert.pem"))
            .arg("--tlskey")
            .arg(certs.join("key.pem"))
            .args(["-H", &format!("tcp://127.0.0.1:{}", self.port)]);
        c
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for TlsDaemon {
    fn drop(&mut self) {
        // SIGTERM first: dockerd then stops its own containerd.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        ip(&["link", "del", TEST_BRIDGE]);
    }
}

/// Removes the test's directory after the daemon is gone.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_engine_runs_sandboxes_and_refuses_a_foreign_client_certificate() {
    let root = std::env::var("USER").as_deref() == Ok("root")
        || std::fs::read_to_string("/proc/self/status")
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")));
    if !root && skip("starting a dockerd needs root") {
        return;
    }
    for tool in ["dockerd", "openssl", "docker"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        if !found && skip(&format!("`{tool}` is not installed")) {
            return;
        }
    }
    let dir = std::env::temp_dir().join(format!("sbx-tls-trial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scratch = Scratch(dir.clone());
    make_ca(&dir, "ca").unwrap();
    make_cert(
        &dir,
        "ca",
        "server",
        "127.0.0.1",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    make_cert(
        &dir,
        "ca",
        "client",
        "sbx-client",
        "extendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    make_ca(&dir, "other-ca").unwrap();
    make_cert(
        &dir,
        "other-ca",
        "stranger",
        "sbx-stranger",
        "extendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    let good = client_dir(&dir, "ca", "client", "good").unwrap();
    // Trusts the engine's CA, but presents a certificate the engine's CA never signed.
    let foreign = dir.join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::copy(dir.join("ca.pem"), foreign.join("ca.pem")).unwrap();
    std::fs::copy(dir.join("stranger.pem"), foreign.join("cert.pem")).unwrap();
    std::fs::copy(dir.join("stranger-key.pem"), foreign.join("key.pem")).unwrap();

    let daemon = TlsDaemon::start(&dir).unwrap();
    let host = format!("tcp://127.0.0.1:{}", daemon.port);
    let started = Instant::now();
    let backend = loop {
        let config = DockerConfig::default()
            .endpoint(host.clone())
            .tls(&good)
            .startup_sweep(false);
        match DockerBackend::connect(config).await {
            Ok(b) => break b,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("{}\ndockerd log:\n{}", e.render(), daemon.log_tail()),
        }
    };
    println!("TLS engine answered after {:?}", started.elapsed());
    let report = backend.diagnose().await;
    assert!(report.reachable, "{report:?}");
    assert!(report.version.is_some(), "{report:?}");
    assert!(backend.endpoint().starts_with("tcp://127.0.0.1:"));

    // The image, loaded over TLS with the engine's own CLI.
    let mut save = Command::new("docker")
        .args(["save", BUSYBOX])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let archive = save.stdout.take().unwrap();
    let loaded = daemon
        .cli(&good)
        .arg("load")
        .stdin(archive)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(save.wait().unwrap().success(), "docker save");
    assert!(loaded.success(), "docker load over TLS");

    let t = Instant::now();
    let sb = backend
        .create(
            CreateOptions::new(BUSYBOX)
                .timeout(Duration::from_secs(60))
                .secret("TLS_SECRET", "over-tls-only")
                .metadata("test", "tls"),
        )
        .await
        .unwrap_or_else(|e| panic!("{}\ndockerd log:\n{}", e.render(), daemon.log_tail()));
    let r = sb.exec("printenv TLS_SECRET").await.unwrap();
    assert_eq!(r.stdout_text(), "over-tls-only\n");
    sb.kill().await.unwrap();
    println!("create + exec + kill over TLS: {:?}", t.elapsed());

    let e = DockerBackend::connect(
        DockerConfig::default()
            .endpoint(host.clone())
            .tls(&foreign)
            .startup_sweep(false),
    )
    .await
    .expect_err("a client certificate from another CA is refused");
    assert_eq!(e.code(), ErrorCode::EngineUnavailable, "{}", e.render());

    // Plain TCP to the same port is refused by the adapter before connecting.
    let e = DockerBackend::connect(DockerConfig::default().endpoint(host).startup_sweep(false))
        .await
        .expect_err("plain tcp is refused");
    assert_eq!(e.code(), ErrorCode::Configuration, "{}", e.render());

    drop(backend);
    drop(daemon);
    drop(scratch);
}
