//! The static agent as PID 1 of a real Docker or Podman container
//! (`sandbox-rs/busybox:latest`, no network, no capabilities, no-new-privileges), driven
//! over the engine CLI's `start -ai` (the attach stream of PID 1).
//!
//! Skipped with a printed reason when an engine is unavailable; a failure under `CI=true`.

use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use sandbox_agent::client::{AgentClient, ClientOptions, ProcessEvent};
use sandbox_agent::protocol::SpawnSpec;
use sandbox_core::ErrorCode;
use tokio::process::{Child, Command};

const IMAGE: &str = "sandbox-rs/busybox:latest";

/// The tests run one at a time: the latency measure must not share the CPU with the
/// other test's container start.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn engine_available(engine: &str) -> bool {
    let ok = StdCommand::new(engine)
        .args(["image", "inspect", IMAGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let why = format!("{engine} or the image {IMAGE} is not available");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{why} (CI=true)"
        );
        eprintln!("skipped: {why}");
    }
    ok
}

/// Builds the static agent exactly as `cargo xtask agent` does (own target dir, so the
/// workspace's build lock is not contended). A no-op when up to date.
fn static_agent() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = "x86_64-unknown-linux-gnu";
    let status = StdCommand::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "-p",
            "sandbox-rs-agent",
            "--bin",
            "sandbox-agent",
        ])
        .args(["--no-default-features", "--target", target, "--target-dir"])
        .arg(root.join("target/agent"))
        .args(["--config", "profile.release.strip=true"])
        .args(["--config", "profile.release.lto=true"])
        .args(["--config", "profile.release.codegen-units=1"])
        .args(["--config", "profile.release.opt-level=\"s\""])
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the static agent failed");
    root.join("target/agent")
        .join(target)
        .join("release/sandbox-agent")
}

/// A container removed on drop, whatever happened.
struct Container {
    engine: &'static str,
    id: String,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = StdCommand::new(self.engine)
            .args(["rm", "-f", &self.id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

struct Sandbox {
    container: Container,
    attach: Child,
    client: AgentClient,
    started: Instant,
}

async fn sandbox(engine: &'static str, lifetime_s: u64) -> Sandbox {
    let agent = static_agent();
    let out = StdCommand::new(engine)
        .args(["create", "-i", "--network", "none", "--cap-drop", "ALL"])
        .args(["--security-opt", "no-new-privileges", "--pids-limit", "256"])
        .args(["--label", "io.sandbox-rs.managed=true"])
        .args(["--label", "io.sandbox-rs.test=sandbox-agent"])
        .args(["--entrypoint", "/sandbox-agent", IMAGE])
        .args(["--timeout", &lifetime_s.to_string()])
        .output()
        .expect("docker create runs");
    assert!(
        out.status.success(),
        "docker create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let container = Container {
        engine,
        id: String::from_utf8(out.stdout).unwrap().trim().to_string(),
    };
    let cp = StdCommand::new(engine)
        .arg("cp")
        .arg(&agent)
        .arg(format!("{}:/sandbox-agent", container.id))
        .status()
        .unwrap();
    assert!(cp.success());
    let mut attach = Command::new(engine)
        .args(["start", "-ai", &container.id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = Instant::now();
    let (r, w) = (attach.stdout.take().unwrap(), attach.stdin.take().unwrap());
    let client = AgentClient::connect(r, w, container.id.clone(), ClientOptions::default())
        .await
        .expect("agent hello through the attach stream");
    Sandbox {
        container,
        attach,
        client,
        started,
    }
}

fn sh(cmd: &str) -> SpawnSpec {
    SpawnSpec {
        argv: vec!["sh".into(), "-c".into(), cmd.into()],
        ..SpawnSpec::default()
    }
}

fn running(engine: &str, id: &str) -> bool {
    let out = StdCommand::new(engine)
        .args(["inspect", "-f", "{{.State.Running}}", id])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "true"
}

async fn spawns_fast_and_kills_setsid_descendants(engine: &'static str) {
    let _serial = SERIAL.lock().await;
    if !engine_available(engine) {
        return;
    }
    let s = sandbox(engine, 120).await;
    let rtt = s.client.ping().await.unwrap();
    // Warm-up, then 100 measured runs of `true`.
    let t = SpawnSpec {
        argv: vec!["true".into()],
        ..SpawnSpec::default()
    };
    for _ in 0..10 {
        s.client
            .spawn(t.clone())
            .await
            .unwrap()
            .output(1024)
            .await
            .unwrap();
    }
    let mut lat = Vec::with_capacity(100);
    for _ in 0..100 {
        let t0 = Instant::now();
        let out = s
            .client
            .spawn(t.clone())
            .await
            .unwrap()
            .output(1024)
            .await
            .unwrap();
        lat.push(t0.elapsed());
        assert_eq!(out.status.exit_code(), 0);
    }
    lat.sort();
    let (p50, p90, max) = (lat[49], lat[89], lat[99]);
    eprintln!(
        "{engine}: ping {rtt:?}; spawn `true` over 100 runs: p50 {p50:?}, p90 {p90:?}, max {max:?}"
    );
    // The target is 3 ms (met here on a quiet machine: 2.1-2.4 ms); the assertion is a
    // regression guard loose enough for a loaded 2-core CI box, the printed number is the
    // measure.
    assert!(p50 <= Duration::from_millis(10), "p50 {p50:?}");

    // A descendant that left the process group and session dies with the kill.
    let mut p = s
        .client
        .spawn(sh("setsid sleep 300 & echo $!; exec sleep 300"))
        .await
        .unwrap();
    let pid = match p.next_event().await.unwrap() {
        Some(ProcessEvent::Stdout(b)) => String::from_utf8_lossy(&b).trim().to_string(),
        other => panic!("{other:?}"),
    };
    let alive = |pid: String| {
        let c = s.client.clone();
        async move {
            let out = c
                .spawn(sh(&format!("kill -0 {pid}")))
                .await
                .unwrap()
                .output(1024)
                .await
                .unwrap();
            out.status.exit_code() == 0
        }
    };
    assert!(alive(pid.clone()).await, "setsid descendant did not start");
    let t0 = Instant::now();
    p.kill().await.unwrap();
    while let Some(ev) = p.next_event().await.unwrap() {
        if let ProcessEvent::Exit(st) = ev {
            assert_eq!(st.signal, Some(9));
        }
    }
    let kill_took = t0.elapsed();
    eprintln!("{engine}: kill of a spawn with a setsid descendant reported in {kill_took:?}");
    assert!(!alive(pid).await, "setsid descendant survived the kill");
    assert!(kill_took < Duration::from_millis(500));

    // The channel is out of sandboxed root's reach: PID 1 is undumpable and there is no
    // CAP_SYS_PTRACE, so its fds cannot be opened (their numbers can still be listed).
    let out = s
        .client
        .spawn(sh(
            "echo x > /proc/1/fd/1 && exit 11; head -c 0 /proc/1/fd/0 && exit 12; \
             head -c 1 /proc/1/mem && exit 13; readlink /proc/1/fd/0 && exit 14; exit 10",
        ))
        .await
        .unwrap()
        .output(4096)
        .await
        .unwrap();
    assert_eq!(out.status.exit_code(), 10, "stderr: {:?}", out.stderr);
    s.client.ping().await.unwrap();
    drop(s.attach);
    drop(s.container);
}

async fn stop_and_kill_of_pid1_from_inside_cannot_stop_the_deadline(engine: &'static str) {
    let _serial = SERIAL.lock().await;
    if !engine_available(engine) {
        return;
    }
    let lifetime = 6;
    let mut s = sandbox(engine, lifetime).await;
    // Root inside, every signal at PID 1 and then at everything.
    let out = s
        .client
        .spawn(sh(
            "kill -STOP 1; kill -9 1; kill -TERM 1; kill -INT 1; sleep 0.2; echo survived",
        ))
        .await
        .unwrap()
        .output(4096)
        .await
        .unwrap();
    assert_eq!(&out.stdout[..], b"survived\n");
    s.client
        .ping()
        .await
        .expect("PID 1 still answers after STOP/KILL from inside");
    // A long-running job that tries to stop PID 1 in a loop does not delay the end.
    let _bg = s
        .client
        .spawn(sh(
            "while true; do kill -STOP 1; kill -9 1; sleep 0.05; done",
        ))
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(lifetime + 10), s.attach.wait())
        .await
        .expect("the container ended by its deadline")
        .unwrap();
    let ended = s.started.elapsed();
    eprintln!(
        "{engine}: container ended {ended:?} after start (lifetime {lifetime} s), attach {status}"
    );
    assert!(ended >= Duration::from_secs(lifetime - 1));
    assert!(ended <= Duration::from_secs(lifetime + 3));
    let e = s.client.ping().await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxGone);
    let t = Instant::now();
    while running(engine, &s.container.id) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "container still running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_agent_as_pid1_spawns_fast_and_kills_setsid_descendants() {
    spawns_fast_and_kills_setsid_descendants("docker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_stop_and_kill_of_pid1_from_inside_cannot_stop_the_deadline() {
    stop_and_kill_of_pid1_from_inside_cannot_stop_the_deadline("docker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_agent_as_pid1_spawns_fast_and_kills_setsid_descendants() {
    spawns_fast_and_kills_setsid_descendants("podman").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_stop_and_kill_of_pid1_from_inside_cannot_stop_the_deadline() {
    stop_and_kill_of_pid1_from_inside_cannot_stop_the_deadline("podman").await;
}
