//! Behaviour of the fake backend through its public API (the way users' tests drive it).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use sandbox_core::{
    Backend, Capability, CodeOptions, CreateOptions, ErrorCode, IsolationTier, NetworkPolicy,
    Resources, RunOptions, Sandbox, SandboxExt, StreamKind,
};
use sandbox_fake::{
    Call, CodeMatch, FakeBackend, FileOp, REDACTED, Response, RunMatch, SandboxHandle, Step,
};

async fn sandbox(b: &FakeBackend) -> Box<dyn Sandbox> {
    b.create(CreateOptions::default()).await.expect("create")
}

fn handle(sb: &dyn Sandbox) -> SandboxHandle {
    sb.native()
        .downcast_ref::<SandboxHandle>()
        .expect("native() is a SandboxHandle")
        .clone()
}

async fn sh(sb: &dyn Sandbox, cmd: &str) -> (i64, String, String) {
    let r = sb.exec(cmd).await.expect("run");
    (r.exit_code, r.stdout_text(), r.stderr_text())
}

// ---------------------------------------------------------------------------------------
// Identity, lifecycle

#[tokio::test]
async fn identity_and_declared_capabilities() {
    let b = FakeBackend::new();
    assert_eq!(b.name(), "fake");
    assert_eq!(b.isolation(), IsolationTier::Container);
    assert!(
        b.capabilities()
            .contains(Capability::STATEFUL_CODE | Capability::EGRESS_ALLOWLIST)
    );
    assert!(!b.capabilities().contains(Capability::GPU));
    assert!(b.as_reapable().is_some());
    let g = FakeBackend::builder()
        .isolation(IsolationTier::Gvisor)
        .build();
    assert_eq!(g.isolation(), IsolationTier::Gvisor);
}

#[tokio::test]
async fn kill_is_idempotent_and_later_use_is_gone() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    sb.kill().await.unwrap();
    sb.kill().await.unwrap();
    let e = sb.exec("true").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxGone);
    assert!(b.sandboxes().is_empty());
    let kills = b
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Kill { .. }))
        .count();
    assert_eq!(kills, 1);
}

#[tokio::test]
async fn dropping_the_handle_kills_the_sandbox() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let id = sb.id().to_string();
    drop(sb);
    assert!(sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(2)).await);
    assert!(b.sandbox(&id).is_none());
}

#[tokio::test]
async fn connect_reattaches_and_unknown_is_connect_error() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    sb.files()
        .unwrap()
        .write("x.txt", Bytes::from("hi"))
        .await
        .unwrap();
    let again = b.connect(sb.id()).await.unwrap();
    assert_eq!(sh(&*again, "cat x.txt").await.1, "hi");
    let e = b.connect("nope").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Connect);
    sb.kill().await.unwrap();
    assert_eq!(
        b.connect(again.id()).await.unwrap_err().code(),
        ErrorCode::Connect
    );
}

#[tokio::test]
async fn list_and_kill_managed() {
    let b = FakeBackend::new();
    let a = b
        .create(CreateOptions::default().metadata("team", "x"))
        .await
        .unwrap();
    let _other = sandbox(&b).await;
    let reaper = b.as_reapable().unwrap();
    let filter = [("team".to_string(), "x".to_string())].into();
    let listed = reaper.list_managed(&filter).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].labels["io.sandbox-rs.meta.team"], "x");
    assert_eq!(listed[0].labels["io.sandbox-rs.managed"], "true");
    assert!(reaper.kill_managed(a.id()).await.unwrap());
    assert!(!reaper.kill_managed(a.id()).await.unwrap());
}

#[tokio::test]
async fn debug_never_shows_secrets_and_calls_are_redacted() {
    let b = FakeBackend::new();
    let sb = b
        .create(
            CreateOptions::default()
                .secret("TOKEN", "hunter2")
                .env("PLAIN", "v"),
        )
        .await
        .unwrap();
    assert!(!format!("{sb:?}").contains("hunter2"));
    assert!(format!("{sb:?}").contains(sb.id()));
    // Visible to commands, absent from the engine-side env and the records.
    assert_eq!(sh(&*sb, "printenv TOKEN").await.1, "hunter2\n");
    assert!(
        !handle(&*sb)
            .engine_env()
            .iter()
            .any(|e| e.contains("hunter2"))
    );
    assert!(handle(&*sb).engine_env().contains(&"PLAIN=v".to_string()));
    let Some(Call::Create { options, .. }) = b.calls().into_iter().next() else {
        panic!("first call is create");
    };
    assert_eq!(options.secrets["TOKEN"].expose(), REDACTED);
    assert!(!format!("{:?}", b.calls()).contains("hunter2"));
}

#[tokio::test]
async fn refusals_happen_before_anything_is_created() {
    let b = FakeBackend::builder()
        .without(Capability::EGRESS_ALLOWLIST)
        .build();
    let e = b
        .create(CreateOptions::default().network(NetworkPolicy::allow_list(["a.org"])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::CapabilityNotSupported);
    let e = b
        .create(CreateOptions::default().require_isolation(IsolationTier::MicroVm))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
    assert!(b.sandboxes().is_empty());
    assert!(matches!(
        &b.calls()[0],
        Call::Create {
            outcome: Err(ErrorCode::CapabilityNotSupported),
            ..
        }
    ));
}

#[tokio::test]
async fn undeclared_capabilities_refuse() {
    let b = FakeBackend::builder()
        .capabilities(Capability::RUN_COMMAND | Capability::NETWORK_POLICY)
        .build();
    let sb = sandbox(&b).await;
    assert_eq!(
        sb.files().err().unwrap().code(),
        ErrorCode::CapabilityNotSupported
    );
    assert_eq!(
        sb.stream("true".into(), RunOptions::default())
            .unwrap_err()
            .code(),
        ErrorCode::CapabilityNotSupported
    );
    assert_eq!(
        sb.code("print(1)").await.unwrap_err().code(),
        ErrorCode::CapabilityNotSupported
    );
    assert_eq!(sh(&*sb, "echo ok").await.1, "ok\n");
}

#[tokio::test]
async fn ingress_ports_are_refused_since_nothing_can_serve() {
    let b = FakeBackend::new();
    assert!(!b.capabilities().contains(Capability::INGRESS_PORTS));
    for policy in [
        NetworkPolicy::deny().ingress_port(8080),
        NetworkPolicy::allow().ingress_port(8080),
    ] {
        let e = b
            .create(CreateOptions::default().network(policy))
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::CapabilityNotSupported);
    }
    assert!(b.sandboxes().is_empty(), "a refused create provisioned");
    let sb = sandbox(&b).await;
    assert_eq!(
        sb.ingress_address(8080).unwrap_err().code(),
        ErrorCode::CapabilityNotSupported
    );
}

// ---------------------------------------------------------------------------------------
// Built-in commands and the shell subset

#[tokio::test]
async fn vocabulary_commands() {
    let b = FakeBackend::new();
    let sb = b
        .create(CreateOptions::default().env("NAME", "world"))
        .await
        .unwrap();
    let run = |argv: &'static [&'static str]| {
        let sb = &sb;
        async move { sb.exec(argv).await.unwrap() }
    };
    assert_eq!(run(&["echo", "a", "b"]).await.stdout_text(), "a b\n");
    assert_eq!(
        run(&["printf", "%s=%d\\n\\033!%%", "a", "1"]).await.stdout,
        &b"a=1\n\x1b!%"[..]
    );
    assert_eq!(run(&["seq", "3"]).await.stdout_text(), "1\n2\n3\n");
    assert_eq!(run(&["seq", "2", "4"]).await.stdout_text(), "2\n3\n4\n");
    assert_eq!(run(&["pwd"]).await.stdout_text(), "/work\n");
    assert_eq!(run(&["printenv", "NAME"]).await.stdout_text(), "world\n");
    assert_eq!(run(&["printenv", "UNSET"]).await.exit_code, 1);
    assert_eq!(run(&["false"]).await.exit_code, 1);
    assert_eq!(run(&["/bin/true"]).await.exit_code, 0);
    assert_eq!(run(&["test", "-e", "/work"]).await.exit_code, 0);
    assert_eq!(run(&["test", "-e", "/nope"]).await.exit_code, 1);
    assert_eq!(run(&["ln", "-s", "/work", "w"]).await.exit_code, 0);
    assert_eq!(run(&["test", "-e", "w"]).await.exit_code, 0);
    let cat = run(&["cat", "/nope"]).await;
    assert_eq!(
        (cat.exit_code, cat.stderr_text().as_str()),
        (1, "cat: /nope: No such file or directory\n")
    );
    // An argv is never a shell: `;` is a literal argument.
    assert_eq!(
        run(&["echo", "a;", "echo", "b"]).await.stdout_text(),
        "a; echo b\n"
    );
}

#[tokio::test]
async fn outside_the_vocabulary_is_typed_never_guessed() {
    use sandbox_fake::vocabulary::{
        FORM_NOT_IN_VOCABULARY_EXIT, NOT_IN_VOCABULARY_EXIT, is_command,
    };
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    for argv in [&["ls"][..], &["python3", "-c", "print(1)"], &["exit", "3"]] {
        assert!(!is_command(argv[0]));
        let r = sb.exec(argv).await.unwrap();
        assert_eq!(r.exit_code, NOT_IN_VOCABULARY_EXIT, "{argv:?}");
        assert_eq!(
            r.stderr_text(),
            format!("fake: command not in vocabulary: {}\n", argv[0])
        );
    }
    let (code, _, err) = sh(&*sb, "mkdir -p a && echo no").await;
    assert_eq!(
        (code, err.as_str()),
        (127, "fake: command not in vocabulary: mkdir\n")
    );
    for argv in [
        &["echo"][..],
        &["kill", "-HUP", "1"],
        &["dd", "if=/dev/urandom"],
    ] {
        let r = sb.exec(argv).await.unwrap();
        let expected = if argv.len() == 1 {
            0
        } else {
            FORM_NOT_IN_VOCABULARY_EXIT
        };
        assert_eq!(r.exit_code, expected, "{argv:?}: {r:?}");
    }
    let r = sb.exec(["seq", "1", "2", "3"]).await.unwrap();
    assert_eq!(r.exit_code, FORM_NOT_IN_VOCABULARY_EXIT);
    assert!(
        r.stderr_text()
            .starts_with("fake: form not in vocabulary: seq")
    );
    for script in [
        "echo $(id)",
        "for i in 1 2; do echo $i; done",
        "(true)",
        "echo a | cat",
        "X=1",
        "cd /",
        "cat < f",
        "echo *",
        "echo ${NAME}",
    ] {
        let (code, _, err) = sh(&*sb, script).await;
        assert_eq!(code, FORM_NOT_IN_VOCABULARY_EXIT, "{script}");
        assert!(
            err.contains("not in the fake's vocabulary"),
            "{script}: {err}"
        );
    }
}

#[tokio::test]
async fn shell_forms() {
    let b = FakeBackend::new();
    let sb = b
        .create(CreateOptions::default().env("NAME", "world"))
        .await
        .unwrap();
    assert_eq!(
        sh(&*sb, "echo hello $NAME; echo \"$NAME!\" '$NAME'")
            .await
            .1,
        "hello world\nworld! $NAME\n"
    );
    assert_eq!(sh(&*sb, "false && echo no || echo yes").await.1, "yes\n");
    assert_eq!(
        sh(&*sb, "echo one && echo two; false || echo three")
            .await
            .1,
        "one\ntwo\nthree\n"
    );
    assert_eq!(sh(&*sb, "false; echo $?").await.1, "1\n");
    assert_eq!(sh(&*sb, "exit 7; echo never").await.0, 7);
    assert_eq!(sh(&*sb, "exit 3 # a comment").await.0, 3);
    let pid = sh(&*sb, "echo $$").await.1;
    assert!(pid.trim().parse::<u32>().is_ok_and(|p| p > 1), "{pid}");
    assert_eq!(sh(&*sb, "echo a > f; echo b >> f; cat f").await.1, "a\nb\n");
    let (_, out, err) = sh(&*sb, "echo to-err >&2; echo out 2>/dev/null").await;
    assert_eq!((out.as_str(), err.as_str()), ("out\n", "to-err\n"));
    let (_, out, err) = sh(&*sb, "cat missing 2>&1").await;
    assert_eq!(
        (out.as_str(), err.as_str()),
        ("cat: missing: No such file or directory\n", "")
    );
    assert_eq!(
        sh(&*sb, "cat nosuch 2> e.txt; cat e.txt").await.1,
        "cat: nosuch: No such file or directory\n"
    );
    assert_eq!(sh(&*sb, "echo x > /nodir/f").await.0, 1);
    assert_eq!(
        sh(&*sb, "exec echo replaced; echo never").await.1,
        "replaced\n"
    );
}

#[tokio::test]
async fn no_kernel_files_in_a_model() {
    let b = FakeBackend::new();
    let sb = b
        .create(CreateOptions::default().resources(Resources::default().memory_mb(256).pids(64)))
        .await
        .unwrap();
    for file in [
        "/proc/1/status",
        "/proc/net/dev",
        "/sys/fs/cgroup/memory.max",
    ] {
        assert_eq!(sh(&*sb, &format!("cat {file}")).await.0, 1, "{file}");
    }
    // The policy in effect is inspected on the handle and in the recorded calls instead.
    assert_eq!(handle(&*sb).resources().memory_mb, 256);
    assert_eq!(handle(&*sb).resources().pids, 64);
}

#[tokio::test]
async fn large_output_streams_in_chunks() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let r = sb
        .exec(["dd", "if=/dev/zero", "bs=1048576", "count=8"])
        .await
        .unwrap();
    assert_eq!(r.stdout.len(), 8 << 20);
    assert!(r.stdout.iter().all(|&x| x == 0));
    let e = sb
        .run(
            ["seq", "100000"].into(),
            RunOptions::default().output_cap(1000),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ResourceLimitExceeded);
}

// ---------------------------------------------------------------------------------------
// Network

#[tokio::test]
async fn nc_honours_the_egress_policy() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let _ = s.write_all(b"canary\n").await;
            });
        }
    });
    let b = FakeBackend::new();
    let cmd = format!("nc -w 3 127.0.0.1 {port}");
    let deny = sandbox(&b).await;
    let (code, _, err) = sh(&*deny, &cmd).await;
    assert_eq!(code, 1);
    assert!(err.contains("Network is unreachable"), "{err}");
    assert!(
        sh(&*deny, &format!("nc -w 3 example.org {port}"))
            .await
            .2
            .contains("bad address")
    );
    let allow = b
        .create(CreateOptions::default().network(NetworkPolicy::allow()))
        .await
        .unwrap();
    assert_eq!(sh(&*allow, &cmd).await.1, "canary\n");
    let listed = b
        .create(CreateOptions::default().network(NetworkPolicy::allow_list(["127.0.0.0/8"])))
        .await
        .unwrap();
    assert_eq!(sh(&*listed, &cmd).await.1, "canary\n");
    let other = b
        .create(CreateOptions::default().network(NetworkPolicy::allow_list(["10.0.0.1"])))
        .await
        .unwrap();
    assert!(sh(&*other, &cmd).await.2.contains("unreachable"));
}

// ---------------------------------------------------------------------------------------
// Python

#[tokio::test]
async fn snippet_table() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let code = |c: &'static str| {
        let sb = &sb;
        async move { sb.code(c).await.unwrap() }
    };
    assert_eq!(code("print(1)").await.stdout_text(), "1\n");
    assert_eq!(code("print(40 + 2)").await.stdout_text(), "42\n");
    assert_eq!(code("print(40+2)").await.stdout_text(), "42\n");
    assert_eq!(code("print(6 * 7)").await.stdout_text(), "42\n");
    assert_eq!(code("print(\"hello\")").await.stdout_text(), "hello\n");
    assert_eq!(code("print('tok-1')").await.stdout_text(), "tok-1\n");
    let err = code("import sys; sys.stderr.write(\"err\\n\")").await;
    assert_eq!(
        (err.stdout_text().as_str(), err.stderr_text().as_str()),
        ("", "err\n")
    );
    assert_eq!(
        code("import os; print(os.getcwd())").await.stdout_text(),
        "/work\n"
    );
    let syntax = code("def (:").await;
    assert!(syntax.exit_code == 1 && syntax.stderr_text().contains("SyntaxError"));
    let zero = code("1/0").await;
    assert!(
        zero.exit_code == 1
            && zero
                .stderr_text()
                .contains("ZeroDivisionError: division by zero")
    );
    assert!(
        code("raise ValueError(\"x\")")
            .await
            .stderr_text()
            .contains("ValueError: x")
    );
    assert!(
        code("print(undefined)")
            .await
            .stderr_text()
            .contains("NameError")
    );
    let big = code("print(9223372036854775807 + 1)").await;
    assert!(
        big.exit_code == 1 && big.stderr_text().contains("OverflowError"),
        "{big:?}"
    );
    // Not in the table: a typed answer, never an interpretation.
    let other = code("import json; print(json.dumps([1]))").await;
    assert_eq!(
        (other.exit_code, other.stderr_text().as_str()),
        (
            127,
            "fake: snippet not in table: import json; print(json.dumps([1]))\n"
        )
    );
}

/// The contract suite's pid-proving snippet: the interpreter's pid is a live process of
/// the sandbox (`kill -0` works) until the `run_code` is cancelled.
#[tokio::test(start_paused = true)]
async fn getpid_names_the_interpreter_until_run_code_is_dropped() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let snippet = "import os; open(\"/work/pyid\", \"w\").write(str(os.getpid()))\nimport time; time.sleep(1000)";
    let mut long = Box::pin(sb.code(snippet));
    let pid = loop {
        tokio::select! {
            r = &mut long => panic!("the sleeping code ended: {r:?}"),
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        let (code, out, _) = sh(&*sb, "cat /work/pyid").await;
        if code == 0 && !out.is_empty() {
            break out;
        }
    };
    let procs = handle(&*sb).running_processes();
    assert!(
        procs
            .iter()
            .any(|p| p.pid.to_string() == pid && p.command == "python3"),
        "pid {pid} is not the interpreter: {procs:?}"
    );
    assert_eq!(sh(&*sb, &format!("kill -0 {pid}")).await.0, 0);
    drop(long);
    assert!(sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(2)).await);
    tokio::task::yield_now().await;
    let (code, _, err) = sh(&*sb, &format!("kill -0 {pid}")).await;
    assert_ne!(code, 0, "the interpreter outlived its dropped run_code");
    assert!(err.contains("No such process"), "{err}");
    assert!(handle(&*sb).running_processes().is_empty());
    assert_eq!(sb.code("print(1)").await.unwrap().stdout_text(), "1\n");
}

#[tokio::test]
async fn contexts_keep_state_and_are_isolated() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let ctx = |id: &str| CodeOptions::default().context(id);
    sb.run_code("x = 41", ctx("a")).await.unwrap();
    assert_eq!(
        sb.run_code("print(x + 1)", ctx("a"))
            .await
            .unwrap()
            .stdout_text(),
        "42\n"
    );
    assert!(
        sb.run_code("print(x)", ctx("b"))
            .await
            .unwrap()
            .stderr_text()
            .contains("NameError")
    );
    assert!(
        sb.code("print(x)")
            .await
            .unwrap()
            .stderr_text()
            .contains("NameError")
    );
    assert_eq!(handle(&*sb).contexts(), ["a", "b"]);
}

#[tokio::test]
async fn templates_without_python_refuse_run_code() {
    let b = FakeBackend::new();
    let sb = b
        .create(CreateOptions::new("sandbox-rs/busybox:latest"))
        .await
        .unwrap();
    let e = sb.code("print(1)").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InterpreterMissing);
    assert!(e.to_string().contains("python3") && e.to_string().contains("busybox"));
}

// ---------------------------------------------------------------------------------------
// Files

#[tokio::test]
async fn file_system_semantics() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let f = sb.files().unwrap();
    let all: Vec<u8> = (0..=255).collect();
    f.write("bin/all.bin", Bytes::from(all.clone()))
        .await
        .unwrap();
    assert_eq!(f.read("/work/bin/all.bin").await.unwrap(), all);
    assert_eq!(sb.exec(["cat", "bin/all.bin"]).await.unwrap().stdout, all);
    assert_eq!(
        f.read("nope").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    assert_eq!(
        f.read("bin").await.unwrap_err().code(),
        ErrorCode::IsADirectory
    );
    assert_eq!(
        f.remove("nope").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    f.mkdir("d/e/f", true).await.unwrap();
    assert!(f.mkdir("x/y", false).await.is_err());
    let st = f.stat("bin/all.bin").await.unwrap();
    assert_eq!(
        (st.size, st.is_dir, st.name.as_str()),
        (256, false, "all.bin")
    );
    let names: Vec<String> = f
        .ls("/work")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["bin", "d"]);
    // Listing and removal do not confuse sibling prefixes (`/work/d` vs `/work/dd`).
    f.write("dd", Bytes::from("x")).await.unwrap();
    f.remove("d").await.unwrap();
    assert_eq!(f.read("dd").await.unwrap(), "x");
    assert_eq!(
        f.stat("d/e").await.unwrap_err().code(),
        ErrorCode::PathNotFound
    );
    assert!(b.calls().iter().any(|c| matches!(
        c,
        Call::File {
            op: FileOp::Write { len: 256 },
            ..
        }
    )));
}

#[tokio::test]
async fn upload_and_download_round_trip() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let f = sb.files().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a.txt"), "A").unwrap();
    std::fs::write(src.join("sub/b.bin"), vec![7u8; 3 << 20]).unwrap();
    f.upload(&src, "up").await.unwrap();
    assert_eq!(sh(&*sb, "cat up/a.txt").await.1, "A");
    assert_eq!(
        handle(&*sb).read_file("up/sub/b.bin").unwrap().len(),
        3 << 20
    );
    let out = dir.path().join("out");
    f.download("up", &out).await.unwrap();
    assert_eq!(
        std::fs::read(out.join("sub/b.bin")).unwrap(),
        vec![7u8; 3 << 20]
    );
    // A link that leaves the tree is refused before anything is written.
    sh(&*sb, "ln -s /etc/passwd up/evil").await;
    let e = f
        .download("up", &dir.path().join("out2"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnsafeArchiveEntry);
    assert!(!dir.path().join("out2").exists());
}

// ---------------------------------------------------------------------------------------
// Processes, streaming, timeouts (virtual time)

#[tokio::test(start_paused = true)]
async fn sleep_uses_virtual_time_and_timeouts_kill_only_that_process() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let started = tokio::time::Instant::now();
    sh(&*sb, "sleep 30").await;
    assert!(started.elapsed() >= Duration::from_secs(30));
    sh(&*sb, "sleep 1000 > /dev/null 2>&1 & echo $! > bg.pid").await;
    let bg: u32 = String::from_utf8(handle(&*sb).read_file("bg.pid").unwrap().to_vec())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(handle(&*sb).is_running(bg));
    let e = sb
        .run(
            "sleep 100".into(),
            RunOptions::default().timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ExecutionTimeout);
    assert!(handle(&*sb).is_running(bg), "the background job survives");
    assert_eq!(
        sh(&*sb, &format!("kill -0 {bg} && kill {bg}; kill -0 {bg}"))
            .await
            .0,
        1
    );
    assert!(handle(&*sb).running_processes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn streamed_output_arrives_as_produced() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let mut p = sb
        .stream(
            "echo first; sleep 5; echo second >&2".into(),
            RunOptions::default(),
        )
        .unwrap();
    let t0 = tokio::time::Instant::now();
    let first = p.next().await.unwrap().unwrap();
    assert_eq!(
        (first.stream, &first.data[..]),
        (StreamKind::Stdout, &b"first\n"[..])
    );
    assert!(t0.elapsed() < Duration::from_secs(1));
    let second = p.next().await.unwrap().unwrap();
    assert_eq!(second.stream, StreamKind::Stderr);
    assert!(t0.elapsed() >= Duration::from_secs(5));
    assert_eq!(p.wait().await.unwrap().exit_code, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_stream_kills_its_process_tree() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let mut p = sb
        .stream(
            "sleep 500 & echo started; sleep 600".into(),
            RunOptions::default(),
        )
        .unwrap();
    assert_eq!(&p.next().await.unwrap().unwrap().data[..], b"started\n");
    assert_eq!(
        handle(&*sb).running_processes().len(),
        2,
        "shell + background job"
    );
    drop(p);
    assert!(sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(2)).await);
    tokio::task::yield_now().await;
    assert!(handle(&*sb).running_processes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn lifetime_expiry_makes_the_sandbox_gone() {
    let b = FakeBackend::new();
    let sb = b
        .create(CreateOptions::default().timeout(Duration::from_secs(60)))
        .await
        .unwrap();
    // A command without a timeout inherits the lifetime; the sandbox's end is not a timeout.
    let e = sb.exec("sleep 1000").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxGone);
    assert!(b.sandboxes().is_empty());
    let e = sb.exec("true").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxGone);
}

// ---------------------------------------------------------------------------------------
// Scripting

#[tokio::test(start_paused = true)]
async fn scripted_responses_take_precedence() {
    let b = FakeBackend::new();
    b.on_run(["git", "status"], Response::ok("clean\n"));
    b.on_run(
        RunMatch::prefix(["pip"]),
        Response::output(1, "", "no network\n"),
    );
    b.on_run_once("echo hi", Response::ok("scripted\n"));
    b.on_run(
        RunMatch::when(|argv| argv.first().is_some_and(|a| a == "slow")),
        Response::steps([
            Step::stdout("a"),
            Step::sleep(Duration::from_secs(10)),
            Step::stdout("b"),
        ])
        .exit_code(4),
    );
    b.on_run(["hang"], Response::hang());
    b.on_run(
        ["boom"],
        Response::error(|| sandbox_core::SandboxError::rate_limit("fake", None)),
    );
    b.on_run_code(CodeMatch::contains("import torch"), Response::ok("2.1.0\n"));
    let sb = sandbox(&b).await;
    assert_eq!(
        sb.exec(["git", "status"]).await.unwrap().stdout_text(),
        "clean\n"
    );
    assert_eq!(
        sh(&*sb, "git status").await.1,
        "clean\n",
        "scripts apply inside sh -c too"
    );
    assert_eq!(sb.exec(["pip", "install", "x"]).await.unwrap().exit_code, 1);
    assert_eq!(sh(&*sb, "echo hi").await.1, "scripted\n");
    assert_eq!(
        sh(&*sb, "echo hi").await.1,
        "hi\n",
        "once rules are consumed"
    );
    let t0 = tokio::time::Instant::now();
    let slow = sb.exec(["slow"]).await.unwrap();
    assert_eq!((slow.exit_code, slow.stdout_text().as_str()), (4, "ab"));
    assert!(t0.elapsed() >= Duration::from_secs(10));
    let e = sb
        .run(
            ["hang"].into(),
            RunOptions::default().timeout(Duration::from_secs(3)),
        )
        .await
        .unwrap_err();
    assert!(e.is_timeout());
    assert_eq!(
        sb.exec(["boom"]).await.unwrap_err().code(),
        ErrorCode::RateLimit
    );
    assert_eq!(
        sb.code("import torch; print(torch.__version__)")
            .await
            .unwrap()
            .stdout_text(),
        "2.1.0\n"
    );
    b.clear_scripts();
    assert_eq!(sb.exec(["git", "status"]).await.unwrap().exit_code, 127);
}

#[tokio::test]
async fn recorded_calls_carry_the_policy() {
    let b = FakeBackend::new();
    let sb = b
        .create(CreateOptions::default().network(NetworkPolicy::allow()))
        .await
        .unwrap();
    sb.run(
        "echo x".into(),
        RunOptions::default()
            .env("K", "secret-value")
            .timeout(Duration::from_secs(9)),
    )
    .await
    .unwrap();
    let calls = b.calls_for(sb.id());
    let run = calls
        .iter()
        .find(|c| matches!(c, Call::Run { .. }))
        .unwrap();
    let Call::Run {
        argv,
        env_keys,
        timeout,
        policy,
        ..
    } = run
    else {
        unreachable!()
    };
    assert_eq!(argv, &["sh", "-c", "echo x"]);
    assert_eq!(env_keys, &["K"]);
    assert_eq!(*timeout, Some(Duration::from_secs(9)));
    assert_eq!(policy, &NetworkPolicy::allow());
    assert!(!format!("{calls:?}").contains("secret-value"));
}

// ---------------------------------------------------------------------------------------
// Faults

#[tokio::test]
async fn create_faults() {
    let b = FakeBackend::new();
    b.faults().set_missing_credential(Some("FAKE_API_KEY"));
    let e = b.create(CreateOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Auth);
    assert!(e.hint().contains("FAKE_API_KEY"));
    b.faults().heal();
    b.faults().set_provider_failure(true);
    assert_eq!(
        b.create(CreateOptions::default()).await.unwrap_err().code(),
        ErrorCode::Creation
    );
    b.faults().heal();
    let known = FakeBackend::builder().known_templates(["only"]).build();
    assert_eq!(
        known
            .create(CreateOptions::new("other"))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Creation
    );
    assert!(b.create(CreateOptions::default()).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn slow_create_can_be_dropped_without_leaking() {
    let b = FakeBackend::new();
    b.faults().set_create_delay(Duration::from_secs(10));
    let r = tokio::time::timeout(Duration::from_secs(1), b.create(CreateOptions::default())).await;
    assert!(r.is_err(), "create still starting");
    assert!(sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(6)).await);
    assert!(b.sandboxes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn kill_faults_are_bounded_and_retriable() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    b.faults().set_kill_failure(true);
    let e = sb.kill().await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Connect);
    assert!(e.hint().contains("sandbox reap"));
    b.faults().heal();
    b.faults().set_kill_hang(true);
    let t0 = tokio::time::Instant::now();
    assert_eq!(sb.kill().await.unwrap_err().code(), ErrorCode::Connect);
    assert!(t0.elapsed() <= sandbox_core::teardown::teardown_grace() + Duration::from_secs(1));
    assert!(handle(&*sb).is_alive());
    b.faults().heal();
    sb.kill().await.unwrap();
    assert!(!handle(&*sb).is_alive());
}

#[tokio::test]
async fn own_faults_do_not_leak_into_other_handles() {
    let b = FakeBackend::new();
    let other = b.with_own_faults();
    other.faults().set_kill_failure(true);
    let sb = sandbox(&b).await;
    sb.kill().await.unwrap();
    let sb2 = other.create(CreateOptions::default()).await.unwrap();
    assert!(sb2.kill().await.is_err());
    other.faults().heal();
    sb2.kill().await.unwrap();
}

#[tokio::test]
async fn expire_now_is_sandbox_gone() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    assert!(b.expire(sb.id()));
    assert_eq!(
        sb.exec("true").await.unwrap_err().code(),
        ErrorCode::SandboxGone
    );
    assert!(!b.expire(sb.id()));
    assert!(
        b.as_reapable()
            .unwrap()
            .list_managed(&Default::default())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn backend_is_usable_as_a_trait_object() {
    let b: Arc<dyn Backend> = Arc::new(FakeBackend::new());
    let sb = b.create(CreateOptions::default()).await.unwrap();
    assert_eq!(sb.backend(), "fake");
    sb.kill().await.unwrap();
}

#[test]
fn matchers() {
    let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(RunMatch::from(["git", "status"]).matches(&argv(&["git", "status"])));
    assert!(!RunMatch::from(["git"]).matches(&argv(&["git", "status"])));
    assert!(RunMatch::prefix(["git"]).matches(&argv(&["git", "status"])));
    assert!(RunMatch::from("echo hi").matches(&argv(&["sh", "-c", "echo hi"])));
    assert!(RunMatch::when(|a| a.len() == 3).matches(&argv(&["a", "b", "c"])));
    assert!(CodeMatch::from("print(1)").matches("  print(1)\n"));
    assert!(CodeMatch::contains("import").matches("import os"));
}

/// A command that produces endless output into /dev/null (which never applies
/// backpressure) still yields, so its timeout fires and kills it.
#[tokio::test]
async fn endless_output_to_dev_null_still_times_out() {
    let b = FakeBackend::new();
    let sb = sandbox(&b).await;
    let started = std::time::Instant::now();
    let e = sb
        .run(
            "seq 1 999999999999 > /dev/null".into(),
            RunOptions::default().timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ExecutionTimeout);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(handle(&*sb).running_processes().is_empty());
}

/// `VOCABULARY.md` lists every command form and snippet form of the tables.
#[test]
fn vocabulary_md_matches_the_tables() {
    use sandbox_fake::vocabulary::{COMMANDS, SNIPPETS, is_command};
    let md = include_str!("../VOCABULARY.md");
    for c in COMMANDS {
        for form in c.forms {
            assert!(
                md.contains(&format!("`{form}`")),
                "VOCABULARY.md lacks `{form}`"
            );
        }
    }
    for s in SNIPPETS {
        let shown = s.form.replace('\n', "⏎");
        assert!(
            md.contains(&format!("`{shown}`")),
            "VOCABULARY.md lacks `{shown}`"
        );
    }
    assert!(is_command("/bin/echo") && is_command("/usr/bin/echo"));
    assert!(!is_command("bash") && !is_command("python3") && !is_command("ls"));
}
