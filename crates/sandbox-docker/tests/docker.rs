//! Integration tests against the real Docker engine. They skip (with a printed reason)
//! when no engine answers, and fail loudly when `CI=true`.
#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sandbox_core::{
    Backend, CodeOptions, Command, ErrorCode, NetworkPolicy, ReapableBackend, Resources,
    RunOptions, SandboxExt,
};
use sandbox_docker::{DockerBackend, DockerConfig, DockerNative};
use sandbox_testkit::skip::unless_connected;
use sandbox_testkit::{managed_ids, test_options};

const PY: &str = "sandbox-rs/python:3.11";
const BUSYBOX: &str = "sandbox-rs/busybox:latest";

async fn backend() -> Option<DockerBackend> {
    unless_connected(
        "Docker",
        DockerBackend::connect(DockerConfig::from_env()).await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn run_basics_env_secrets_and_missing_binary() {
    let Some(b) = backend().await else { return };
    let s = b
        .create(
            test_options(BUSYBOX, "run_basics")
                .env("PLAIN", "visible")
                .secret("TOKEN", "hunter2"),
        )
        .await
        .unwrap();
    let r = s.exec(["echo", "hi"]).await.unwrap();
    assert_eq!((r.exit_code, r.stdout_text().as_str()), (0, "hi\n"));
    let r = s.exec("echo out; echo err >&2; exit 3").await.unwrap();
    assert_eq!(r.exit_code, 3);
    assert_eq!(r.stdout_text(), "out\n");
    assert_eq!(r.stderr_text(), "err\n");
    let r = s.exec(["echo", "$HOME;", "x"]).await.unwrap();
    assert_eq!(
        r.stdout_text(),
        "$HOME; x\n",
        "a list never goes through a shell"
    );
    let r = s.exec("printenv PLAIN; printenv TOKEN; pwd").await.unwrap();
    assert_eq!(r.stdout_text(), "visible\nhunter2\n/work\n");
    let r = s
        .run(
            Command::from(["printenv", "X"]),
            RunOptions::default().env("X", "1"),
        )
        .await
        .unwrap();
    assert_eq!(r.stdout_text(), "1\n");
    // Secrets are injected per exec, never stored in the container configuration.
    let native = s.native().downcast_ref::<DockerNative>().unwrap();
    let c = native
        .engine
        .client()
        .inspect_container(&native.container_id, None)
        .await
        .unwrap();
    let env = c.config.unwrap().env.unwrap_or_default();
    assert!(env.iter().any(|e| e == "PLAIN=visible"));
    assert!(!env.iter().any(|e| e.contains("hunter2")), "{env:?}");
    assert!(!format!("{s:?}").contains("hunter2"));
    // Missing executable: exit 127, message on stderr (argv and shell forms).
    let r = s.exec(["no-such-binary"]).await.unwrap();
    assert_eq!(r.exit_code, 127, "{r:?}");
    assert!(r.stderr_text().contains("no-such-binary"), "{r:?}");
    assert!(r.stdout.is_empty());
    let r = s.exec("no-such-binary").await.unwrap();
    assert_eq!(r.exit_code, 127);
    assert!(r.stderr_text().contains("not found"), "{r:?}");
    s.kill().await.unwrap();
    s.kill().await.unwrap();
    let e = s.exec(["true"]).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxGone);
}

#[tokio::test(flavor = "multi_thread")]
async fn hardening_visible_from_inside() {
    let Some(b) = backend().await else { return };
    let s = b
        .create(
            test_options(BUSYBOX, "hardening")
                .resources(Resources::default().memory_mb(96).pids(64)),
        )
        .await
        .unwrap();
    let status = s
        .exec(["cat", "/proc/1/status"])
        .await
        .unwrap()
        .stdout_text();
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    let dev = s
        .exec(["cat", "/proc/net/dev"])
        .await
        .unwrap()
        .stdout_text();
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, vec!["lo"]);
    let mem = s
        .exec("cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
        .await
        .unwrap()
        .stdout_text();
    assert_eq!(mem.trim(), (96u64 * 1024 * 1024).to_string());
    let pids = s
        .exec("cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max")
        .await
        .unwrap()
        .stdout_text();
    assert_eq!(pids.trim(), "64");
    let r = s.exec("nc -w 2 10.0.0.1 80").await.unwrap();
    assert!(r.exit_code != 0 && r.exit_code != 127, "{r:?}");
    s.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_kills_only_that_process() {
    let Some(b) = backend().await else { return };
    let s = b.create(test_options(BUSYBOX, "timeout")).await.unwrap();
    let bg = s
        .exec("sleep 300 & echo $! > /tmp/bg.pid; echo started")
        .await
        .unwrap();
    assert_eq!(bg.stdout_text(), "started\n");
    let t = Instant::now();
    let e = s
        .run(
            Command::from("sleep 60 & sleep 60; echo never"),
            RunOptions::default().timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ExecutionTimeout);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The timed-out tree is gone, the unrelated background process survives.
    let ps = s.exec("ps -o pid,args").await.unwrap().stdout_text();
    assert_eq!(ps.matches("sleep 60").count(), 0, "{ps}");
    let alive = s
        .exec("kill -0 $(cat /tmp/bg.pid) && echo alive")
        .await
        .unwrap();
    assert_eq!(alive.stdout_text(), "alive\n");
    // A dropped run future kills its process too.
    let fut = s.exec("sleep 77");
    let _ = tokio::time::timeout(Duration::from_millis(700), fut).await;
    assert!(sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(5)).await);
    let ps = s.exec("ps -o pid,args").await.unwrap().stdout_text();
    assert!(!ps.contains("sleep 77"), "{ps}");
    s.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_delivers_before_exit() {
    use futures::StreamExt;
    let Some(b) = backend().await else { return };
    let s = b.create(test_options(BUSYBOX, "stream")).await.unwrap();
    let mut p = s
        .stream(
            Command::from("echo first; sleep 1; echo second"),
            RunOptions::default(),
        )
        .unwrap();
    let t = Instant::now();
    let first = p.next().await.unwrap().unwrap();
    assert_eq!(&first.data[..], b"first\n");
    assert!(t.elapsed() < Duration::from_millis(900));
    let r = p.wait().await.unwrap();
    assert!(r.streamed && r.exit_code == 0);
    s.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn run_code_and_stateful_contexts() {
    let Some(b) = backend().await else { return };
    let s = b.create(test_options(PY, "code")).await.unwrap();
    let r = s.code("print(1)").await.unwrap();
    assert_eq!((r.exit_code, r.stdout_text().as_str()), (0, "1\n"));
    let r = s.code("1/0").await.unwrap();
    assert!(r.exit_code != 0 && r.stderr_text().contains("ZeroDivisionError"));
    let r = s.code("def (:").await.unwrap();
    assert!(r.exit_code != 0 && r.stderr_text().contains("SyntaxError"));
    let r = s.code("import os; print(os.getcwd())").await.unwrap();
    assert_eq!(r.stdout_text(), "/work\n");
    let big = format!("x = '{}'\nprint(len(x))", "a".repeat(200_000));
    assert_eq!(s.code(&big).await.unwrap().stdout_text(), "200000\n");

    let c1 = CodeOptions::default().context("one");
    let c2 = CodeOptions::default().context("two");
    let r = s.run_code("x = 41", c1.clone()).await.unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let r = s.run_code("print(x + 1)", c1.clone()).await.unwrap();
    assert_eq!(r.stdout_text(), "42\n", "{r:?}");
    let r = s.run_code("print(x)", c2.clone()).await.unwrap();
    assert!(
        r.exit_code != 0 && r.stderr_text().contains("NameError"),
        "{r:?}"
    );
    let r = s
        .run_code(
            "import os, sys; sys.stderr.write('e\\n'); os.system('echo sub')",
            c1.clone(),
        )
        .await
        .unwrap();
    assert_eq!(
        (r.stdout_text().as_str(), r.stderr_text().as_str()),
        ("sub\n", "e\n")
    );
    let e = s
        .run_code(
            "import time; time.sleep(30)",
            c1.clone().timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ExecutionTimeout);
    // The context's interpreter was killed: its state is gone, a fresh one serves it.
    let r = s.run_code("print('x' in globals())", c1).await.unwrap();
    assert_eq!(r.stdout_text(), "False\n");
    s.kill().await.unwrap();

    let bb = b
        .create(test_options(BUSYBOX, "code-missing"))
        .await
        .unwrap();
    let e = bb.code("print(1)").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InterpreterMissing);
    assert!(e.to_string().contains("python3") && e.to_string().contains(BUSYBOX));
    bb.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn files_round_trip_on_busybox() {
    let Some(b) = backend().await else { return };
    let s = b.create(test_options(BUSYBOX, "files")).await.unwrap();
    let f = s.files().unwrap();
    let all: Vec<u8> = (0..=255u8).collect();
    f.write("bin.dat", Bytes::from(all.clone())).await.unwrap();
    assert_eq!(f.read("/work/bin.dat").await.unwrap(), all);
    let r = s.exec(["wc", "-c", "bin.dat"]).await.unwrap();
    assert!(
        r.stdout_text().starts_with("256"),
        "relative = run's workdir"
    );
    f.write("deep/er/t.txt", Bytes::from_static(b"t"))
        .await
        .unwrap();
    assert_eq!(&f.read("deep/er/t.txt").await.unwrap()[..], b"t");
    let st = f.stat("bin.dat").await.unwrap();
    assert_eq!(
        (st.size, st.is_dir, st.path.as_str()),
        (256, false, "/work/bin.dat")
    );
    assert!(st.modified.is_some());
    assert!(f.stat("deep").await.unwrap().is_dir);
    f.mkdir("a/b/c", true).await.unwrap();
    f.mkdir("a/b/c", true).await.unwrap();
    assert_eq!(
        f.mkdir("x/y", false).await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    let mut names: Vec<String> = f
        .ls(".")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    names.sort();
    assert_eq!(names, vec!["a", "bin.dat", "deep"]);
    assert_eq!(
        f.read("nope").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    assert_eq!(
        f.stat("nope").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    assert_eq!(
        f.ls("nope").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    assert_eq!(
        f.read("deep").await.unwrap_err().code(),
        ErrorCode::IsADirectory
    );
    f.remove("a").await.unwrap();
    assert_eq!(
        f.remove("a").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );

    let tmp = tempfile::tempdir().unwrap();
    let up = tmp.path().join("up");
    std::fs::create_dir_all(up.join("sub")).unwrap();
    std::fs::write(up.join("sub/x.txt"), b"x").unwrap();
    f.upload(&up, "uploaded").await.unwrap();
    assert_eq!(&f.read("uploaded/sub/x.txt").await.unwrap()[..], b"x");
    let down = tmp.path().join("down");
    f.download("uploaded", &down).await.unwrap();
    assert_eq!(std::fs::read(down.join("sub/x.txt")).unwrap(), b"x");
    // A symlink pointing out of the tree is refused on download; nothing lands outside.
    s.exec("mkdir -p esc && ln -s /etc esc/evil").await.unwrap();
    let e = f
        .download("esc", &tmp.path().join("esc"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnsafeArchiveEntry);
    s.kill().await.unwrap();
}

fn rss_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn large_transfers_stream_with_bounded_memory() {
    let Some(b) = backend().await else { return };
    let s = b
        .create(test_options(BUSYBOX, "large").resources(Resources::default().memory_mb(128)))
        .await
        .unwrap();
    let f = s.files().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("big.bin");
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(&src).unwrap());
        let block: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
        for _ in 0..256 {
            w.write_all(&block).unwrap();
        }
    }
    let base = rss_kib("VmRSS:");
    let t = Instant::now();
    f.upload(&src, "big.bin").await.unwrap();
    let up = t.elapsed();
    let after_up = rss_kib("VmHWM:");
    assert_eq!(f.stat("big.bin").await.unwrap().size, 256 * 1024 * 1024);
    let t = Instant::now();
    let dst = tmp.path().join("back.bin");
    f.download("big.bin", &dst).await.unwrap();
    let down = t.elapsed();
    let after_down = rss_kib("VmHWM:");
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), 256 * 1024 * 1024);
    println!(
        "256 MiB: upload {up:?}, download {down:?}; RSS base {base} KiB, peak after upload {after_up} KiB (+{} KiB), after download {after_down} KiB (+{} KiB)",
        after_up.saturating_sub(base),
        after_down.saturating_sub(base)
    );
    assert!(
        after_down.saturating_sub(base) < 32 * 1024,
        "peak RSS grew by more than 32 MiB"
    );
    s.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn lifetime_backstop_removes_the_container() {
    let Some(b) = backend().await else { return };
    let s = b
        .create(test_options(BUSYBOX, "lifetime").timeout(Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(s.exec(["true"]).await.unwrap().ok());
    let id = s.id().to_string();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(
        s.exec(["true"]).await.unwrap_err().code(),
        ErrorCode::SandboxGone
    );
    // Stopped at the deadline; the host removes it (the deadline timer) shortly after.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while managed_ids(&b, "lifetime").await.contains(&id) {
        assert!(
            std::time::Instant::now() < deadline,
            "not removed at its deadline (the host removes a stopped container)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(b.connect(&id).await.unwrap_err().code(), ErrorCode::Connect);
    s.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn reaping_and_connect() {
    let Some(b) = backend().await else { return };
    let s = b.create(test_options(BUSYBOX, "reap")).await.unwrap();
    let id = s.id().to_string();
    let again = b.connect(&id).await.unwrap();
    assert_eq!(
        again.exec(["echo", "x"]).await.unwrap().stdout_text(),
        "x\n"
    );
    std::mem::forget(again); // keep the handle's drop from killing it here
    assert!(managed_ids(&b, "reap").await.contains(&id));
    assert!(b.kill_managed(&id).await.unwrap());
    assert!(!b.kill_managed(&id).await.unwrap());
    assert_eq!(
        b.connect("does-not-exist").await.unwrap_err().code(),
        ErrorCode::Connect
    );
    s.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_image_holds_no_secret_no_agent_and_only_its_own_labels() {
    let Some(b) = backend().await else { return };
    sandbox_testkit::trials::snapshot::snapshot_image_holds_no_secret_no_agent_and_only_its_own_labels(
        &b,
        BUSYBOX,
        |image| sandbox_testkit::trials::snapshot::cli_evidence("docker", image),
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

#[tokio::test(flavor = "multi_thread")]
async fn startup_sweep_removes_gone_owners_and_expired() {
    let Some(_b) = backend().await else { return };
    sandbox_testkit::trials::sweep::startup_sweep_removes_gone_owners_and_expired(
        "docker",
        "docker",
        DockerBackend::connect(DockerConfig::from_env()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abandoned_sandbox_is_removed_at_its_deadline() {
    let Some(_b) = backend().await else { return };
    sandbox_testkit::trials::sweep::an_abandoned_sandbox_is_removed_at_its_deadline(
        "docker",
        DockerBackend::connect(DockerConfig::from_env().agent(false).startup_sweep(false)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn periodic_sweep_removes_expired_leftovers() {
    let Some(_b) = backend().await else { return };
    sandbox_testkit::trials::sweep::periodic_sweep_removes_expired_leftovers(
        "docker",
        "docker",
        DockerBackend::connect(
            DockerConfig::from_env()
                .startup_sweep(false)
                .sweep_interval(Some(sandbox_container::MIN_SWEEP_INTERVAL)),
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_managed_refuses_an_unmanaged_container() {
    let Some(b) = backend().await else { return };
    sandbox_testkit::trials::sweep::kill_managed_refuses_an_unmanaged_container(&b, "docker").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_engine_is_engine_unavailable() {
    let e =
        DockerBackend::connect(DockerConfig::default().endpoint("unix:///tmp/sbx-no-such.sock"))
            .await
            .unwrap_err();
    assert_eq!(e.code(), ErrorCode::EngineUnavailable);
    assert!(e.hint().contains("sudo cargo xtask setup"), "{}", e.hint());
    assert!(std::error::Error::source(&e).is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_before_provisioning() {
    let Some(b) = backend().await else { return };
    for (o, code) in [
        (
            // A disk limit makes the root read-only: the workdir cannot be `/`.
            test_options(BUSYBOX, "refuse")
                .resources(Resources::default().disk_mb(10))
                .workdir("/"),
            ErrorCode::Configuration,
        ),
        (
            test_options(BUSYBOX, "refuse").resources(Resources::default().gpu(1)),
            ErrorCode::CapabilityNotSupported,
        ),
        (
            // An allowlist entry that is neither a host name nor a CIDR.
            test_options(BUSYBOX, "refuse").network(NetworkPolicy::allow_list(["exa mple.com"])),
            ErrorCode::Configuration,
        ),
        (
            // Never: a pull would ask Docker Hub, and tests stay on this machine.
            test_options("sandbox-rs/no-such-image:0", "refuse")
                .pull(sandbox_core::PullPolicy::Never),
            ErrorCode::ImageUnavailable,
        ),
    ] {
        assert_eq!(b.create(o).await.unwrap_err().code(), code);
    }
    assert!(managed_ids(&b, "refuse").await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn diagnose_reports_engine() {
    let Some(b) = backend().await else { return };
    let r = b.diagnose().await;
    assert!(r.reachable && r.version.is_some());
    assert!(r.runtimes.iter().any(|x| x == "runc"));
    println!("{r:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ingress_ports_published_on_loopback() {
    use tokio::io::AsyncReadExt;
    let Some(b) = backend().await else { return };
    for (name, net) in [
        ("ingress-deny", NetworkPolicy::deny().ingress_port(8080)),
        ("ingress-allow", NetworkPolicy::allow().ingress_port(8080)),
    ] {
        let s = b
            .create(test_options(BUSYBOX, name).network(net))
            .await
            .unwrap();
        let native = s.native().downcast_ref::<DockerNative>().unwrap();
        let addr = native.ingress[&8080];
        assert!(addr.ip().is_loopback(), "{name}: {addr}");
        let r = s
            .exec("nc -l -p 8080 -e echo hello-ingress >/dev/null 2>&1 &")
            .await
            .unwrap();
        assert_eq!(r.exit_code, 0);
        let mut got = String::new();
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Ok(mut c) = tokio::net::TcpStream::connect(addr).await else {
                continue;
            };
            got.clear();
            let _ = c.read_to_string(&mut got).await;
            if !got.is_empty() {
                break;
            }
        }
        assert_eq!(got, "hello-ingress\n", "{name}");
        s.kill().await.unwrap();
    }
}

/// Writing `1` into every file under /dev/shm, /tmp and /run (and pre-creating
/// pidfile-looking directories) cannot redirect a timeout's kill: the timeout kills only
/// that command, never PID 1, and the sandbox stays usable.
#[tokio::test(flavor = "multi_thread")]
async fn forged_pidfiles_cannot_redirect_a_kill() {
    let Some(b) = backend().await else { return };
    let s = b
        .create(test_options(BUSYBOX, "forged-pidfile"))
        .await
        .unwrap();
    let forge = "for d in /dev/shm /tmp /run; do mkdir -p $d/.sbx.x $d/.sbx.bench; \
                 for f in $d/* $d/.*; do [ -f \"$f\" ] && echo 1 > \"$f\"; done; done; \
                 for i in $(seq 0 50); do echo 1 > /dev/shm/.sbx.$i; echo 1 > /tmp/.sbx.$i; done; sleep 60";
    let e = s
        .run(
            Command::from(forge),
            RunOptions::default().timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ExecutionTimeout, "{e}");
    let r = s.exec(["echo", "alive"]).await.unwrap();
    assert_eq!(r.stdout_text(), "alive\n", "the sandbox survived the kill");
    let ps = s.exec("ps -o pid,args").await.unwrap().stdout_text();
    assert!(
        !ps.contains("sleep 60"),
        "the forging command was killed: {ps}"
    );
    s.kill().await.unwrap();
}

/// A timeout kills the exec's whole tree, background and `setsid` children
/// included, and leaves unrelated processes alone.
#[tokio::test(flavor = "multi_thread")]
async fn timeout_kills_background_and_setsid_children() {
    let Some(b) = backend().await else { return };
    let s = b.create(test_options(BUSYBOX, "tree-kill")).await.unwrap();
    let keep = s.exec("sleep 310 >/dev/null 2>&1 & echo ok").await.unwrap();
    assert_eq!(keep.stdout_text(), "ok\n");
    // `sleep 310` above outlived its own exec on purpose: it is not part of the next one.
    let e = s
        .run(
            Command::from("sleep 301 & sleep 302 & setsid sleep 303 & (sleep 304 &); sleep 305"),
            RunOptions::default().timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ExecutionTimeout);
    let ps = s.exec("ps -o pid,args").await.unwrap().stdout_text();
    for n in 301..=305 {
        assert!(
            !ps.contains(&format!("sleep {n}")),
            "sleep {n} survived: {ps}"
        );
    }
    assert!(
        ps.contains("sleep 310"),
        "an unrelated process was killed: {ps}"
    );
    s.kill().await.unwrap();
}

/// Reading a 3 GiB sparse file is refused by size, with bounded host memory.
#[tokio::test(flavor = "multi_thread")]
async fn huge_sparse_file_read_is_refused_with_bounded_memory() {
    let Some(b) = backend().await else { return };
    let s = b.create(test_options(BUSYBOX, "huge-read")).await.unwrap();
    let r = s
        .exec("truncate -s 3G /work/huge && echo ok")
        .await
        .unwrap();
    assert_eq!(r.stdout_text(), "ok\n", "{r:?}");
    let base = rss_kib("VmHWM:");
    let t = Instant::now();
    let e = s.files().unwrap().read("/work/huge").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ResourceLimitExceeded, "{e}");
    assert!(e.to_string().contains("files().read cap"), "{e}");
    assert!(
        e.hint().contains("download"),
        "names the streaming alternative: {}",
        e.hint()
    );
    let grew = rss_kib("VmHWM:").saturating_sub(base);
    println!(
        "3 GiB sparse read refused in {:?}, peak RSS growth {grew} KiB",
        t.elapsed()
    );
    assert!(grew < 32 * 1024, "peak RSS grew by {grew} KiB");
    assert!(t.elapsed() < Duration::from_secs(5));
    s.kill().await.unwrap();
}

#[allow(dead_code)]
fn _arc(b: DockerBackend) -> Arc<dyn Backend> {
    Arc::new(b)
}

/// Latency medians over 30 runs (run with `--ignored --nocapture`).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "measurement, not a check"]
async fn measure_latency() {
    let Some(b) = backend().await else { return };
    fn median(mut v: Vec<Duration>) -> Duration {
        v.sort();
        v[v.len() / 2]
    }
    let n = 30;
    let (mut create, mut kill) = (vec![], vec![]);
    for _ in 0..n {
        let t = Instant::now();
        let s = b.create(test_options(PY, "latency")).await.unwrap();
        create.push(t.elapsed());
        let t = Instant::now();
        s.kill().await.unwrap();
        kill.push(t.elapsed());
    }
    let s = b.create(test_options(PY, "latency")).await.unwrap();
    let (mut run, mut code, mut files, mut ctx) = (vec![], vec![], vec![], vec![]);
    let mib = Bytes::from(vec![7u8; 1024 * 1024]);
    s.code("pass").await.unwrap();
    for _ in 0..n {
        let t = Instant::now();
        assert!(s.exec(["true"]).await.unwrap().ok());
        run.push(t.elapsed());
        let t = Instant::now();
        assert_eq!(s.code("print(1)").await.unwrap().stdout_text(), "1\n");
        code.push(t.elapsed());
        let t = Instant::now();
        s.run_code("print(1)", CodeOptions::default().context("bench"))
            .await
            .unwrap();
        ctx.push(t.elapsed());
        let t = Instant::now();
        s.files()
            .unwrap()
            .write("m.bin", mib.clone())
            .await
            .unwrap();
        assert_eq!(
            s.files().unwrap().read("m.bin").await.unwrap().len(),
            mib.len()
        );
        files.push(t.elapsed());
    }
    s.kill().await.unwrap();
    println!(
        "medians over {n}: create {:?}, kill {:?}, run([\"true\"]) {:?}, run_code(\"print(1)\") {:?}, stateful run_code {:?}, 1 MiB write+read {:?}",
        median(create),
        median(kill),
        median(run),
        median(code),
        median(ctx),
        median(files)
    );
}

/// A fake engine socket that answers the handshake (`/_ping`, `/version`) and then
/// accepts every other request without ever answering: a wedged engine.
async fn wedged_engine() -> std::path::PathBuf {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let path = std::env::temp_dir().join(format!("sbx-wedged-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                loop {
                    let Ok(n) = conn.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    let head = String::from_utf8_lossy(&buf[..n]).to_string();
                    let body = if head.contains("/_ping") {
                        "OK".to_string()
                    } else if head.contains("/version") {
                        r#"{"ApiVersion":"1.41","MinAPIVersion":"1.12","Version":"20.10.0"}"#
                            .to_string()
                    } else {
                        // Wedged: keep the connection, never answer.
                        std::future::pending::<()>().await;
                        return;
                    };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nApi-Version: 1.41\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if conn.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    path
}

/// Against an engine that accepts and never answers, `create` fails with
/// `CreateTimeout` (SBX_E1203) within its bound, and other calls fail within theirs.
#[tokio::test(flavor = "multi_thread")]
async fn wedged_engine_fails_calls_in_bounded_time() {
    let sock = wedged_engine().await;
    let b = DockerBackend::connect(
        DockerConfig::default()
            .endpoint(format!("unix://{}", sock.display()))
            .startup_sweep(false)
            .call_timeout(Duration::from_secs(1))
            .create_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let t = Instant::now();
    let e = b.create(test_options(BUSYBOX, "wedged")).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::CreateTimeout, "{e}");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    let t = Instant::now();
    let e = b.list_managed(&BTreeMap::new()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::EngineUnavailable, "{e}");
    let e = b.connect("abc").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::EngineUnavailable, "{e}");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    let _ = std::fs::remove_file(sock);
}

/// 50 concurrent create + run + kill (run with `--ignored --nocapture`): every operation
/// should succeed; the slowest kill is reported. Known to fail today on a 2-core host: a
/// few force-removals take longer than the 5 s teardown grace under this load.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "load measurement (50 containers at once); fails while removals outlast the grace"]
async fn fifty_concurrent_create_run_kill() {
    let Some(b) = backend().await else { return };
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let b = b.clone();
            tokio::spawn(async move {
                let s = b
                    .create(test_options(BUSYBOX, "load"))
                    .await
                    .map_err(|e| format!("create: {}", e.render()))?;
                s.exec(["true"])
                    .await
                    .map_err(|e| format!("run: {}", e.render()))?;
                let t = Instant::now();
                let id = s.id().to_string();
                s.kill().await.map_err(|e| {
                    let mut chain = e.render();
                    let mut src = std::error::Error::source(&e);
                    while let Some(inner) = src {
                        chain.push_str(&format!(" <- {inner}"));
                        src = inner.source();
                    }
                    format!("kill of {id} after {:?}: {chain}", t.elapsed())
                })?;
                Ok::<Duration, String>(t.elapsed())
            })
        })
        .collect();
    let mut errors = Vec::new();
    let mut slowest = Duration::ZERO;
    for t in tasks {
        match t.await.unwrap() {
            Ok(d) => slowest = slowest.max(d),
            Err(e) => errors.push(e),
        }
    }
    println!("slowest kill {slowest:?}; errors: {errors:#?}");
    assert!(sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(30)).await);
    assert!(errors.is_empty(), "{errors:#?}");
}

/// The `read_cap` and `download_caps` a user sets are the ones enforced.
#[tokio::test(flavor = "multi_thread")]
async fn configured_transfer_caps_apply() {
    use sandbox_testkit::trials::caps;
    let Some(b) = unless_connected(
        "Docker",
        DockerBackend::connect(
            DockerConfig::from_env()
                .read_cap(caps::CAPPED_BYTES)
                .download_caps(caps::CAPPED_BYTES, caps::CAPPED_ENTRIES),
        )
        .await,
    ) else {
        return;
    };
    caps::configured_caps_apply(&b, BUSYBOX).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_volume_is_bounded_scratch_under_a_disk_limit() {
    let Some(b) = backend().await else { return };
    sandbox_testkit::trials::disk::an_image_volume_is_bounded_scratch(&b, "docker", BUSYBOX).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pid1_output_is_not_logged_on_the_exec_path() {
    let Some(_b) = backend().await else { return };
    let b = DockerBackend::connect(DockerConfig::from_env().agent(false))
        .await
        .unwrap();
    sandbox_testkit::trials::disk::pid1_output_is_not_logged_on_the_exec_path(
        &b, "docker", BUSYBOX,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_volume_goes_with_its_sandbox() {
    let Some(b) = backend().await else { return };
    sandbox_testkit::trials::disk::an_image_volume_goes_with_its_sandbox(&b, "docker", BUSYBOX)
        .await;
}

/// A backend whose every sandbox gets `options`, or `None` (skipped) without Docker.
async fn backend_with(options: sandbox_docker::DockerOptions) -> Option<DockerBackend> {
    unless_connected(
        "Docker",
        DockerBackend::connect(DockerConfig::from_env().options(options)).await,
    )
}

/// Docker's typed mounts and hooks: a sealed copy lands with its contents and leaves no
/// mount, a read-only bind is readable and not writable, the hooks fire once each around
/// start, and a failing or panicking hook fails the create and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_options_mounts_and_hooks() {
    use sandbox_docker::{DockerOptions, Hooks, Mount};
    use std::sync::atomic::{AtomicUsize, Ordering};
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
        })
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
        });
    let options = DockerOptions::new()
        .mount(Mount::copy(&seed, "/opt/deep/seed"))
        .mount(Mount::bind(&shared, "/shared"))
        .hooks(hooks);
    let Some(b) = backend_with(options).await else {
        return;
    };
    let sb = b
        .create(test_options(BUSYBOX, "docker-options"))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 111, "each start hook once");
    let copied = sb.exec("cat /opt/deep/seed/inner/file.txt").await.unwrap();
    assert_eq!(copied.stdout_text(), "copied");
    let mounts = sb.exec("cat /proc/mounts").await.unwrap().stdout_text();
    assert!(
        !mounts.contains("/opt/deep/seed"),
        "a copy leaves no mount: {mounts}"
    );
    assert_eq!(
        sb.exec("cat /shared/ro.txt").await.unwrap().stdout_text(),
        "ro"
    );
    let w = sb
        .exec("echo x > /shared/new 2>/dev/null; echo $?")
        .await
        .unwrap();
    assert_ne!(w.stdout_text().trim(), "0", "the bind is read-only");
    assert!(!shared.join("new").exists());
    sb.kill().await.unwrap();
    sb.kill().await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1111,
        "post_stop once, after the kill"
    );
    // Under a disk limit the root filesystem is read-only, which Docker's uploads refuse:
    // a copy is refused before anything is made; a read-only bind is a planned mount.
    let limited =
        test_options(BUSYBOX, "docker-options").resources(Resources::default().disk_mb(64));
    let e = b.create(limited.clone()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration, "{e}");
    assert!(e.to_string().contains("copied mount"), "{e}");
    assert!(managed_ids(&b, "docker-options").await.is_empty());
    let Some(b) = backend_with(DockerOptions::new().mount(Mount::bind(&shared, "/shared"))).await
    else {
        return;
    };
    let sb = b.create(limited).await.unwrap();
    assert_eq!(
        sb.exec("cat /shared/ro.txt").await.unwrap().stdout_text(),
        "ro"
    );
    sb.kill().await.unwrap();

    for (hooks, says) in [
        (
            Hooks::new().pre_start(|_| async { Err("nope".into()) }),
            "pre_start hook failed: nope",
        ),
        (
            Hooks::new().post_start(|_| async { panic!("boom") }),
            "post_start hook panicked",
        ),
        (
            Hooks::new().ready(|_| async { Err("not ready".into()) }),
            "ready hook failed: not ready",
        ),
    ] {
        let Some(b) = backend_with(DockerOptions::new().hooks(hooks)).await else {
            return;
        };
        let e = b
            .create(test_options(BUSYBOX, "docker-hookfail"))
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Creation);
        assert!(e.to_string().contains(says), "{e}");
        let left = managed_ids(&b, "docker-hookfail").await;
        assert!(left.is_empty(), "a failed hook left {left:?}");
    }
}

/// Docker cannot make a bind `nosuid`: a writable bind is refused before anything is
/// created, with the way out (read-only, a copy, or Podman).
#[tokio::test(flavor = "multi_thread")]
async fn a_writable_bind_is_refused_on_docker() {
    use sandbox_docker::{DockerOptions, Mount};
    let tmp = tempfile::tempdir().unwrap();
    let options = DockerOptions::new().mount(Mount::bind(tmp.path(), "/data").read_only(false));
    let e = DockerBackend::connect(DockerConfig::from_env().options(options))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
    assert!(e.to_string().contains("nosuid"), "{e}");
    assert!(e.hint().contains("MountMode::Copy"), "{e:?}");
}

/// The attack: a host tmpfs mounted below a read-only bind's source, written, given a
/// setuid file and a device node by sandbox root. Docker's bind is non-recursive, so the
/// nested mount is out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_bind_reaches_no_nested_host_mount() {
    use sandbox_docker::{DockerOptions, Mount};
    use sandbox_testkit::trials::binds;
    let mut host = binds::NestedHostMount::new("docker-ro");
    let options = DockerOptions::new().mount(Mount::bind(host.source(), binds::TARGET));
    let Some(b) = backend_with(options).await else {
        return;
    };
    let sb = b
        .create(test_options(BUSYBOX, "docker-nested-ro"))
        .await
        .unwrap();
    binds::a_read_only_bind_reaches_no_nested_host_mount(&*sb, &mut host).await;
}
