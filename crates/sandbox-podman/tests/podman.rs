//! Integration tests against the real Podman service. They fail loudly when `CI=true` and
//! the engine is missing, and skip with a printed reason otherwise.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use sandbox_core::{
    Backend, CodeOptions, Command, CreateOptions, ErrorCode, NetworkPolicy, ReapableBackend,
    Resources, RunOptions, Sandbox, SandboxError, SandboxExt,
};
use sandbox_podman::{Hooks, Mount, PodmanBackend, PodmanConfig, PodmanOptions, PodmanSandbox};

const PY: &str = "sandbox-rs/python:3.11";
const BUSYBOX: &str = "sandbox-rs/busybox:latest";

async fn backend() -> Option<PodmanBackend> {
    match PodmanBackend::connect(PodmanConfig::from_env()).await {
        Ok(b) => Some(b),
        Err(e) => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true")
                || std::env::var("SBX_CONTRACT_REQUIRED").is_ok_and(|v| v == "1");
            if ci {
                panic!(
                    "Podman engine required (CI=true) but unavailable: {}",
                    e.render()
                );
            }
            eprintln!("SKIPPED: Podman engine unavailable: {}", e.render());
            None
        }
    }
}

fn opts(case: &str) -> CreateOptions {
    CreateOptions::new(PY)
        .metadata("test", case)
        .timeout(Duration::from_secs(120))
}

async fn sh(sb: &dyn Sandbox, s: &str) -> sandbox_core::ExecResult {
    sb.run(Command::from(s), RunOptions::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hardening_is_verified_from_inside() {
    let Some(b) = backend().await else { return };
    let sb = b
        .create(
            opts("hardening")
                .resources(Resources::default().memory_mb(128).pids(64))
                .secret("API_TOKEN", "s3cr3t-value"),
        )
        .await
        .unwrap();
    let st = sh(&*sb, "cat /proc/1/status").await.stdout_text();
    assert!(st.contains("NoNewPrivs:\t1"), "{st}");
    assert!(st.contains("CapEff:\t0000000000000000"), "{st}");
    let mem = sh(&*sb, "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes").await.stdout_text();
    assert_eq!(mem.trim(), (128u64 * 1024 * 1024).to_string());
    let sw = sh(&*sb, "cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.swap.max").await.stdout_text();
    assert!(
        sw.trim() == (128u64 * 1024 * 1024).to_string() || sw.trim() == "0",
        "swap {sw}"
    );
    let pids = sh(
        &*sb,
        "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max",
    )
    .await
    .stdout_text();
    assert_eq!(pids.trim(), "64");
    let dev = sh(&*sb, "cat /proc/net/dev").await.stdout_text();
    assert!(dev.contains("lo:") && !dev.contains("eth0"), "{dev}");
    assert_eq!(
        sh(&*sb, "printenv API_TOKEN").await.stdout_text(),
        "s3cr3t-value\n"
    );
    assert_eq!(sh(&*sb, "pwd").await.stdout_text(), "/work\n");
    let env = b.engine().engine_env(sb.id()).await.unwrap();
    assert!(
        env.iter()
            .all(|e| !e.contains("s3cr3t") && !e.starts_with("API_TOKEN")),
        "{env:?}"
    );
    assert!(!format!("{sb:?}").contains("s3cr3t"));
    sb.kill().await.unwrap();
    sb.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_basics_and_missing_binary() {
    let Some(b) = backend().await else { return };
    let sb = b.create(opts("exec-basics")).await.unwrap();
    let r = sb
        .exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        .await
        .unwrap();
    assert_eq!(
        (
            r.exit_code,
            r.stdout_text().as_str(),
            r.stderr_text().as_str()
        ),
        (3, "out\n", "err\n")
    );
    let r = sb.exec(["echo", "$HOME", "a b"]).await.unwrap();
    assert_eq!(
        r.stdout_text(),
        "$HOME a b\n",
        "argv never goes through a shell"
    );
    let r = sb.exec(["definitely-not-here"]).await.unwrap();
    assert_eq!(r.exit_code, 127);
    assert!(r.stderr_text().contains("not found"), "{}", r.stderr_text());
    let r = sb
        .run(
            Command::from("printenv X"),
            RunOptions::default().env("X", "y"),
        )
        .await
        .unwrap();
    assert_eq!(r.stdout_text(), "y\n");
    let r = sb
        .exec("dd if=/dev/zero bs=1048576 count=3 2>/dev/null")
        .await
        .unwrap();
    assert_eq!(r.stdout.len(), 3 * 1024 * 1024);
    sb.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_only_that_process() {
    let Some(b) = backend().await else { return };
    let sb = b.create(opts("timeout")).await.unwrap();
    let t = Instant::now();
    let e = sb
        .run(
            Command::from("sleep 30 & echo $! > /tmp/child; wait"),
            RunOptions::default().timeout(Duration::from_millis(800)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ExecutionTimeout, "{e}");
    assert!(t.elapsed() < Duration::from_secs(10));
    let child = sh(&*sb, "cat /tmp/child").await.stdout_text();
    let r = sh(
        &*sb,
        &format!("kill -0 {} 2>/dev/null; echo $?", child.trim()),
    )
    .await;
    assert_eq!(
        r.stdout_text().trim(),
        "1",
        "child of the timed-out command must be dead"
    );
    assert_eq!(sh(&*sb, "echo alive").await.stdout_text(), "alive\n");
    sb.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_run_and_process_kill_the_tree() {
    let Some(b) = backend().await else { return };
    let sb = b.create(opts("drop")).await.unwrap();
    {
        let fut = sb.run(
            Command::from("echo $$ > /tmp/p1; sleep 60"),
            RunOptions::default(),
        );
        let _ = tokio::time::timeout(Duration::from_millis(1500), fut).await;
    }
    let mut p = sb
        .stream(
            Command::from("echo $$ > /tmp/p2; echo first; sleep 60"),
            RunOptions::default(),
        )
        .unwrap();
    let first = p.next().await.unwrap().unwrap();
    assert_eq!(&first.data[..], b"first\n");
    drop(p);
    assert!(sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(10)).await);
    for f in ["/tmp/p1", "/tmp/p2"] {
        let pid = sh(&*sb, &format!("cat {f}")).await.stdout_text();
        let r = sh(
            &*sb,
            &format!("kill -0 {} 2>/dev/null; echo $?", pid.trim()),
        )
        .await;
        assert_eq!(r.stdout_text().trim(), "1", "{f} survived");
    }
    sb.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_code_stateless_and_stateful() {
    let Some(b) = backend().await else { return };
    let sb = b.create(opts("code")).await.unwrap();
    let r = sb.code("print(1)").await.unwrap();
    assert_eq!((r.exit_code, r.stdout_text().as_str()), (0, "1\n"));
    let r = sb.code("def (:").await.unwrap();
    assert!(r.exit_code != 0 && r.stderr_text().contains("SyntaxError"));
    let r = sb.code("1/0").await.unwrap();
    assert!(r.exit_code != 0 && r.stderr_text().contains("ZeroDivisionError"));
    let r = sb.code("import os; print(os.getcwd())").await.unwrap();
    assert_eq!(r.stdout_text(), "/work\n");
    let c = |id: &str| CodeOptions::default().context(id);
    assert_eq!(sb.run_code("x = 41", c("a")).await.unwrap().exit_code, 0);
    let r = sb.run_code("print(x + 1)", c("a")).await.unwrap();
    assert_eq!(r.stdout_text(), "42\n");
    let r = sb
        .run_code("import sys; sys.stderr.write('err\\n')", c("a"))
        .await
        .unwrap();
    assert_eq!(r.stderr_text(), "err\n");
    let r = sb.run_code("print(x)", c("b")).await.unwrap();
    assert!(
        r.exit_code != 0 && r.stderr_text().contains("NameError"),
        "{}",
        r.stderr_text()
    );
    let e = sb
        .run_code(
            "import time; time.sleep(30)",
            c("a").timeout(Duration::from_millis(800)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ExecutionTimeout, "{}", e.render());
    let r = sb.run_code("print(2)", c("a")).await.unwrap();
    assert_eq!(r.stdout_text(), "2\n", "context restarts after a timeout");
    let big = format!("s = '{}'\nprint(len(s))", "a".repeat(100_000));
    assert_eq!(sb.code(&big).await.unwrap().stdout_text(), "100000\n");
    sb.kill().await.unwrap();

    let sb = b.create(opts("no-python").template(BUSYBOX)).await.unwrap();
    for o in [CodeOptions::default(), c("z")] {
        let e = sb.run_code("print(1)", o).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::InterpreterMissing, "{e}");
    }
    sb.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_and_errors() {
    let Some(b) = backend().await else { return };
    let sb = b.create(opts("files").template(BUSYBOX)).await.unwrap();
    let fs = sb.files().unwrap();
    let all: Vec<u8> = (0..=255u8).collect();
    fs.write("bin.dat", Bytes::from(all.clone())).await.unwrap();
    assert_eq!(&fs.read("/work/bin.dat").await.unwrap()[..], &all[..]);
    assert_eq!(
        sh(&*sb, "wc -c bin.dat")
            .await
            .stdout_text()
            .split_whitespace()
            .next(),
        Some("256")
    );
    fs.write("deep/er/x.txt", Bytes::from_static(b"hi"))
        .await
        .unwrap();
    fs.mkdir("d1/d2", true).await.unwrap();
    let e = fs.mkdir("nope/x", false).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::PathNotFound);
    let names: Vec<String> = fs
        .ls(".")
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(names, ["bin.dat", "d1", "deep"]);
    let st = fs.stat("bin.dat").await.unwrap();
    assert_eq!((st.size, st.is_dir), (256, false));
    assert!(fs.stat("d1").await.unwrap().is_dir);
    assert_eq!(
        fs.read("missing").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    assert_eq!(
        fs.read("d1").await.unwrap_err().code(),
        ErrorCode::IsADirectory
    );
    assert_eq!(
        fs.stat("missing").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    assert_eq!(
        fs.remove("missing").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    fs.remove("deep").await.unwrap();
    assert_eq!(
        fs.ls("deep").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );

    // escaping symlink inside a downloaded tree
    sh(
        &*sb,
        "mkdir -p /work/t && echo a > /work/t/a && ln -s /etc/passwd /work/t/evil",
    )
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let e = fs.download("t", &tmp.path().join("t")).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnsafeArchiveEntry);
    sh(&*sb, "rm /work/t/evil").await;
    fs.download("t", &tmp.path().join("t")).await.unwrap();
    assert_eq!(std::fs::read(tmp.path().join("t/a")).unwrap(), b"a\n");
    // upload a tree
    let up = tmp.path().join("up");
    std::fs::create_dir_all(up.join("s")).unwrap();
    std::fs::write(up.join("s/f"), b"zz").unwrap();
    fs.upload(&up, "/work/up2").await.unwrap();
    assert_eq!(&fs.read("/work/up2/s/f").await.unwrap()[..], b"zz");
    sb.kill().await.unwrap();
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_transfer_has_bounded_memory() {
    let Some(b) = backend().await else { return };
    let sb = b.create(opts("large").template(BUSYBOX)).await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("big.bin");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&src).unwrap();
        let block = vec![0xA5u8; 1 << 20];
        for _ in 0..80 {
            f.write_all(&block).unwrap();
        }
    }
    let before = rss_kb();
    let fs = sb.files().unwrap();
    fs.upload(&src, "big.bin").await.unwrap();
    let dst = tmp.path().join("back.bin");
    fs.download("big.bin", &dst).await.unwrap();
    let growth_mb = (rss_kb().saturating_sub(before)) / 1024;
    println!("peak RSS growth for an 80 MiB upload+download: {growth_mb} MiB");
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), 80 << 20);
    assert!(growth_mb < 40, "peak RSS grew by {growth_mb} MiB");
    sb.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_image_holds_no_secret_no_agent_and_only_its_own_labels() {
    let Some(b) = backend().await else { return };
    sandbox_testkit::trials::snapshot::snapshot_image_holds_no_secret_no_agent_and_only_its_own_labels(
        &b,
        BUSYBOX,
        |image| sandbox_testkit::trials::snapshot::cli_evidence("podman", image),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reaping_the_last_networked_sandbox_removes_the_network() {
    let Some(b) = backend().await else { return };
    sandbox_testkit::trials::reap::reaping_the_last_networked_sandbox_removes_the_network(
        &b,
        &**b.engine(),
        BUSYBOX,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifetime_backstop_and_reaping() {
    let Some(b) = backend().await else { return };
    let sb = b
        .create(
            opts("lifetime")
                .template(BUSYBOX)
                .timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap();
    let id = sb.id().to_string();
    let listed = b
        .list_managed(&BTreeMap::from([(
            "test".to_string(),
            "lifetime".to_string(),
        )]))
        .await
        .unwrap();
    assert!(listed.iter().any(|m| m.id == id));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let e = sb.exec("true").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxGone, "{e}");
    let mut gone = false;
    for _ in 0..50 {
        if !b
            .list_managed(&BTreeMap::new())
            .await
            .unwrap()
            .iter()
            .any(|m| m.id == id)
        {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "ephemeral container removed after its lifetime");
    assert_eq!(b.connect(&id).await.unwrap_err().code(), ErrorCode::Connect);
    assert!(!b.kill_managed(&id).await.unwrap());
    sb.kill().await.unwrap();

    // retained: kept stopped, listed, then reaped
    let sb = b
        .create_with(
            opts("retained")
                .template(BUSYBOX)
                .timeout(Duration::from_secs(1)),
            PodmanOptions::new().ephemeral(false),
        )
        .await
        .unwrap();
    let id = sb.id().to_string();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let m = b.list_managed(&BTreeMap::new()).await.unwrap();
    let me = m
        .iter()
        .find(|m| m.id == id)
        .expect("retained container listed");
    assert_eq!(me.state, sandbox_core::SandboxState::Stopped);
    assert!(b.kill_managed(&id).await.unwrap());
    assert!(!b.kill_managed(&id).await.unwrap());
    drop(sb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_sweep_removes_gone_owners_and_expired() {
    let Some(_b) = backend().await else { return };
    sandbox_testkit::trials::sweep::startup_sweep_removes_gone_owners_and_expired(
        "podman",
        "podman",
        PodmanBackend::connect(PodmanConfig::from_env()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_sandbox_is_removed_at_its_deadline() {
    let Some(_b) = backend().await else { return };
    sandbox_testkit::trials::sweep::an_abandoned_sandbox_is_removed_at_its_deadline(
        "podman",
        PodmanBackend::connect(PodmanConfig::from_env().agent(false).startup_sweep(false)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_sweep_removes_expired_leftovers() {
    let Some(_b) = backend().await else { return };
    sandbox_testkit::trials::sweep::periodic_sweep_removes_expired_leftovers(
        "podman",
        "podman",
        PodmanBackend::connect(
            PodmanConfig::from_env()
                .startup_sweep(false)
                .sweep_interval(Some(sandbox_container::MIN_SWEEP_INTERVAL)),
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_managed_refuses_an_unmanaged_container() {
    let Some(b) = backend().await else { return };
    sandbox_testkit::trials::sweep::kill_managed_refuses_an_unmanaged_container(&b, "podman").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_reattaches_and_unknown_is_connect_error() {
    let Some(b) = backend().await else { return };
    let sb = b.create(opts("connect").template(BUSYBOX)).await.unwrap();
    sh(&*sb, "echo v > /work/f").await;
    let again = b.connect(sb.id()).await.unwrap();
    assert_eq!(sh(&*again, "cat f").await.stdout_text(), "v\n");
    assert_eq!(
        b.connect("0123456789abcdef").await.unwrap_err().code(),
        ErrorCode::Connect
    );
    sb.kill().await.unwrap();
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_options_mounts_hooks_and_caps() {
    let Some(b) = backend().await else { return };
    let tmp = tempfile::tempdir().unwrap();
    let seed = tmp.path().join("seed");
    std::fs::create_dir_all(seed.join("inner")).unwrap();
    std::fs::write(seed.join("inner/file.txt"), b"copied").unwrap();
    let shared = tmp.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("ro.txt"), b"ro").unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (c1, c2, c3, c4) = (calls.clone(), calls.clone(), calls.clone(), calls.clone());
    let hooks = Hooks::new()
        .ready(move |_| {
            let c = c3.clone();
            async move {
                c.fetch_add(100, Ordering::SeqCst);
                Ok(())
            }
        })
        .post_stop(move |_| {
            let c = c4.clone();
            async move {
                c.fetch_add(1000, Ordering::SeqCst);
                Ok(())
            }
        })
        .pre_start(move |ev| {
            let c = c1.clone();
            async move {
                assert!(!ev.container_id.is_empty());
                c.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
        .post_start(move |_| {
            let c = c2.clone();
            async move {
                c.fetch_add(10, Ordering::SeqCst);
                Ok(())
            }
        });
    let po = PodmanOptions::new()
        .mount(Mount::copy(&seed, "/opt/deep/seed"))
        .mount(Mount::bind(&shared, "/shared").read_only(true))
        .capability(sandbox_podman::LinuxCapability::Chown)
        .hooks(hooks);
    let sb = b
        .create_with(opts("options").template(BUSYBOX), po)
        .await
        .unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        111,
        "pre_start, post_start, ready once"
    );
    assert_eq!(
        sh(&sb, "cat /opt/deep/seed/inner/file.txt")
            .await
            .stdout_text(),
        "copied"
    );
    let mounts = sh(&sb, "cat /proc/mounts").await.stdout_text();
    assert!(
        !mounts.contains("/opt/deep/seed"),
        "copy mode leaves no bind mount"
    );
    assert_eq!(sh(&sb, "cat /shared/ro.txt").await.stdout_text(), "ro");
    let r = sh(&sb, "echo x > /shared/new 2>/dev/null; echo $?").await;
    assert_ne!(r.stdout_text().trim(), "0", "read-only bind mount");
    let st = sh(&sb, "cat /proc/1/status").await.stdout_text();
    assert!(st.contains("CapEff:\t0000000000000001"), "CHOWN only: {st}");
    sb.kill().await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1111,
        "post_stop once, after the kill"
    );

    // failing pre_start hook: creation error, nothing left behind
    let before = b
        .list_managed(&BTreeMap::from([(
            "test".to_string(),
            "hookfail".to_string(),
        )]))
        .await
        .unwrap()
        .len();
    assert_eq!(before, 0);
    // ... and a panicking post_start hook (the container already runs) as well.
    for (hooks, says) in [
        (
            Hooks::new().pre_start(|_| async { Err("nope".into()) }),
            "pre_start hook failed: nope",
        ),
        (
            Hooks::new().post_start(|_| async { panic!("boom") }),
            "post_start hook panicked",
        ),
    ] {
        let po = PodmanOptions::new().hooks(hooks);
        let e = b
            .create_with(opts("hookfail").template(BUSYBOX), po)
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Creation);
        assert!(e.to_string().contains(says), "{e}");
    }
    let after = b
        .list_managed(&BTreeMap::from([(
            "test".to_string(),
            "hookfail".to_string(),
        )]))
        .await
        .unwrap();
    assert!(after.is_empty(), "{after:?}");

    // refusals: before anything is created
    let e = b
        .create_with(
            opts("refused"),
            PodmanOptions::new().mount(Mount::bind("//run/podman", "/engine")),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
    let e = b
        .create_with(
            opts("refused"),
            PodmanOptions::new().cdi_device("nvidia.com/gpu=0"),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
    assert!(
        b.list_managed(&BTreeMap::from([(
            "test".to_string(),
            "refused".to_string()
        )]))
        .await
        .unwrap()
        .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_allow_has_an_interface_and_ingress_publishes_on_loopback() {
    let Some(b) = backend().await else { return };
    let sb = b
        .create(
            opts("ingress")
                .template(BUSYBOX)
                .network(NetworkPolicy::allow().ingress_port(18089)),
        )
        .await
        .unwrap();
    let dev = sh(&*sb, "cat /proc/net/dev").await.stdout_text();
    assert!(dev.contains("eth0"), "{dev}");
    let mut p = sb
        .stream(
            Command::from("echo ready; echo pong | nc -l -p 18089"),
            RunOptions::default(),
        )
        .unwrap();
    let _ = p.next().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Published on the host's loopback at a port the engine picks, never the same host
    // port (a sandbox must not take a well-known local port).
    let addr = sb.ingress_address(18089).unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 18089, "{addr}");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    use tokio::io::AsyncReadExt;
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert_eq!(buf, b"pong\n");
    drop(p);
    sb.kill().await.unwrap();

    // Deny: still only loopback, the adapter forwards the port itself.
    let sb = b
        .create_with(
            opts("ingress-deny")
                .template(BUSYBOX)
                .network(NetworkPolicy::deny().ingress_port(18091)),
            PodmanOptions::new(),
        )
        .await
        .unwrap();
    let addr = sb.ingress_address(18091).unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_eq!(
        sb.ingress_address(1).unwrap_err().code(),
        sandbox_core::ErrorCode::Configuration
    );
    let dev = sh(&sb, "cat /proc/net/dev").await.stdout_text();
    assert!(!dev.contains("eth0"), "{dev}");
    let mut p = sb
        .stream(
            Command::from("echo ready; echo pong | nc -l -p 18091"),
            RunOptions::default(),
        )
        .unwrap();
    let _ = p.next().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    assert_eq!(buf, b"pong\n");
    drop(p);
    sb.kill().await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "forwarder stopped with the sandbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagnose_reports_engine() {
    let Some(b) = backend().await else { return };
    let r = b.diagnose().await;
    assert!(r.reachable, "{r:?}");
    assert!(r.version.is_some());
    assert!(r.images.iter().all(|(_, present)| *present), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_gone_not_timeout_after_kill() {
    let Some(b) = backend().await else { return };
    let sb: PodmanSandbox = b
        .create_with(opts("gone").template(BUSYBOX), PodmanOptions::new())
        .await
        .unwrap();
    sb.kill().await.unwrap();
    let e = sb.exec("true").await.unwrap_err();
    assert!(matches!(e, SandboxError::SandboxGone { .. }), "{e}");
}

/// The attack: sandbox root copies a shell into a mounted host directory and makes it
/// setuid root. A default bind mount is read-only, and every bind mount is nosuid,nodev.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_mount_cannot_plant_a_setuid_file_on_the_host() {
    let Some(b) = backend().await else { return };
    let tmp = tempfile::tempdir().unwrap();
    let ro = tmp.path().join("ro");
    let rw = tmp.path().join("rw");
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::create_dir_all(&rw).unwrap();
    let po = PodmanOptions::new()
        .mount(Mount::bind(&ro, "/ro"))
        .mount(Mount::bind(&rw, "//rw/").read_only(false));
    let sb = b
        .create_with(opts("setuid-plant").template(BUSYBOX), po)
        .await
        .unwrap();
    let r = sh(&sb, "cp /bin/busybox /ro/sh && chmod 4755 /ro/sh; echo $?").await;
    assert_ne!(r.stdout_text().trim(), "0");
    assert!(!ro.join("sh").exists(), "a default bind mount is read-only");
    let mounts = sh(&sb, "cat /proc/mounts").await.stdout_text();
    for target in ["/ro", "/rw"] {
        let line = mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(target))
            .unwrap_or_else(|| panic!("{target} not mounted: {mounts}"));
        assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    }
    sb.kill().await.unwrap();
}

/// The attack: a host tmpfs mounted below a read-only bind's source, written, given a
/// setuid file and a device node by sandbox root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_bind_reaches_no_nested_host_mount() {
    use sandbox_testkit::trials::binds;
    let Some(b) = backend().await else { return };
    let mut host = binds::NestedHostMount::new("podman-ro");
    let po = PodmanOptions::new().mount(Mount::bind(host.source(), binds::TARGET));
    let sb = b
        .create_with(opts("nested-ro").template(BUSYBOX), po)
        .await
        .unwrap();
    binds::a_read_only_bind_reaches_no_nested_host_mount(&sb, &mut host).await;
}

/// The same through a writable bind: the nested host mount stays out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writable_bind_reaches_no_nested_host_mount() {
    use sandbox_testkit::trials::binds;
    let Some(b) = backend().await else { return };
    let mut host = binds::NestedHostMount::new("podman-rw");
    let po = PodmanOptions::new().mount(Mount::bind(host.source(), binds::TARGET).read_only(false));
    let sb = b
        .create_with(opts("nested-rw").template(BUSYBOX), po)
        .await
        .unwrap();
    binds::a_writable_bind_reaches_no_nested_host_mount(&sb, &mut host).await;
}

/// The attack: ask for 2^63 pids, which wrapped to a negative int64 ("unlimited" for
/// Podman), then fork-bomb the host. The limit read back from inside must be finite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_pids_request_is_clamped_never_unlimited() {
    let Some(b) = backend().await else { return };
    let sb = b
        .create(
            opts("pids-clamp")
                .template(BUSYBOX)
                .resources(Resources::default().pids(1 << 63)),
        )
        .await
        .unwrap();
    let pids = sh(
        &*sb,
        "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max",
    )
    .await
    .stdout_text();
    assert_eq!(pids.trim(), "4194304", "{pids}");
    sb.kill().await.unwrap();
}

/// The `read_cap` and `download_caps` a user sets are the ones enforced.
#[tokio::test(flavor = "multi_thread")]
async fn configured_transfer_caps_apply() {
    use sandbox_testkit::trials::caps;
    if backend().await.is_none() {
        return;
    }
    let b = PodmanBackend::connect(
        PodmanConfig::from_env()
            .read_cap(caps::CAPPED_BYTES)
            .download_caps(caps::CAPPED_BYTES, caps::CAPPED_ENTRIES),
    )
    .await
    .expect("connect with caps");
    caps::configured_caps_apply(&b, "sandbox-rs/busybox:latest").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_volume_is_bounded_scratch_under_a_disk_limit() {
    let Some(b) = backend().await else { return };
    sandbox_testkit::trials::disk::an_image_volume_is_bounded_scratch(
        &b,
        "podman --remote",
        BUSYBOX,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid1_output_is_not_logged_on_the_exec_path() {
    let Some(_b) = backend().await else { return };
    let b = PodmanBackend::connect(PodmanConfig::from_env().agent(false))
        .await
        .unwrap();
    sandbox_testkit::trials::disk::pid1_output_is_not_logged_on_the_exec_path(
        &b,
        "podman --remote",
        BUSYBOX,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_volume_goes_with_its_sandbox() {
    let Some(b) = backend().await else { return };
    sandbox_testkit::trials::disk::an_image_volume_goes_with_its_sandbox(
        &b,
        "podman --remote",
        BUSYBOX,
    )
    .await;
}
