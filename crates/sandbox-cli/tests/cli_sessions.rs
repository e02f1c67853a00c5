//! `sandbox create / exec / cp / ls / kill`, stdin passthrough, secrets and SIGTERM,
//! through the built binary. The fake cannot be reached from a second process (it lives in
//! the memory of the process that created it), so the round trips run on Docker and
//! Podman; each is skipped with a printed reason when its engine is missing, and fails
//! instead under `CI=true`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Ids of containers (running or not) with this id.
fn containers(engine: &str, id: &str) -> String {
    let o = Command::new(engine)
        .args([
            "ps",
            "-a",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("id={id}"),
        ])
        .output()
        .expect("engine cli");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// create → ls → exec (stdin, exit code, secret) → cp both ways → kill → gone.
fn round_trip(engine: &str) {
    let dsn = format!("{engine}://sandbox-rs/busybox:latest");
    let started = Instant::now();
    let o = run(&["create", "--json", "--timeout", "120", &dsn]);
    assert_eq!(code(&o), 0, "create: {}", stderr(&o));
    let v = json(&o);
    let id = v["sandbox"]["id"].as_str().expect("id").to_string();
    assert_eq!(v["timeout_s"], 120);
    // `create` returned while the sandbox lives on.
    assert_eq!(
        containers(engine, &id),
        id,
        "the sandbox outlives `sandbox create`"
    );
    // The DSN's template is the image (not the engine's default one).
    let image = Command::new(engine)
        .args(["inspect", "--format", "{{.Config.Image}}", &id])
        .output()
        .expect("inspect");
    let image = String::from_utf8_lossy(&image.stdout).trim().to_string();
    assert!(image.ends_with("sandbox-rs/busybox:latest"), "{image}");

    // Another sandbox-rs process (this one starts a backend, whose startup sweep removes
    // sandboxes of dead owners) must not sweep it: its owner, the holder, is alive.
    let o = run(&["ls", "--json", "--engine", engine]);
    assert_eq!(code(&o), 0, "ls: {}", stderr(&o));
    let listed = json(&o);
    let mine = listed["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .find(|s| s["id"] == id.as_str())
        .unwrap_or_else(|| panic!("ls lists the sandbox: {listed:#}"))
        .clone();
    let expires = mine["expires_in_s"].as_u64().expect("expires_in_s");
    // The engine's deadline is rounded up to the next second (7fece7f), so right after
    // create a 120 s lifetime can show 121.
    assert!((100..=121).contains(&expires), "{mine:#}");
    assert!(mine["age_s"].as_u64().is_some_and(|a| a < 60), "{mine:#}");
    // Created without max_lifetime or idle_timeout: the deadline is final, no idle limit.
    assert_eq!(mine["max_deadline"], mine["deadline"], "{mine:#}");
    assert!(mine["idle_timeout_s"].is_null(), "{mine:#}");
    // The agent is required by default where the engine offers it, and both the create's
    // report and `ls` say the sandbox runs on it (unless the suite runs with SBX_AGENT=off).
    let want = if std::env::var("SBX_AGENT").is_ok_and(|a| a == "off") {
        "exec"
    } else {
        "agent"
    };
    assert_eq!(v["sandbox"]["exec_path"], want, "{v:#}");
    assert_eq!(mine["exec_path"], want, "{mine:#}");

    // A unique prefix works; stdin reaches the command; its exit code is ours.
    let prefix = &id[..12];
    let o = run_with_stdin(
        &["exec", prefix, "--", "sh", "-c", "cat; exit 3"],
        b"piped in\n",
    );
    assert_eq!(code(&o), 3, "exec: {}", stderr(&o));
    assert_eq!(stdout(&o), "piped in\n");

    // `exec` reattaches: on Docker it takes the agent over (the engine keeps the agent's
    // stdin open across attaches), on Podman — whose attach ends close it — it keeps to
    // the engine's exec path; either way its report says which.
    let o = run(&["exec", "--json", &id, "--", "true"]);
    assert_eq!(code(&o), 0, "exec --json: {}", stderr(&o));
    let reattached = if want == "agent" && engine == "docker" {
        "agent"
    } else {
        "exec"
    };
    let v = json(&o);
    assert_eq!(v["sandbox"]["exec_path"], reattached, "{v:#}");

    // State persists between execs: it is the same sandbox.
    let o = run(&["exec", &id, "--", "sh", "-c", "echo kept > state.txt"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&["exec", &id, "--", "cat", "state.txt"]);
    assert_eq!(stdout(&o), "kept\n", "{}", stderr(&o));

    // A secret comes from our environment, never from argv.
    let o = sandbox(&[
        "exec",
        "--secret",
        "SBX_TEST_TOKEN",
        &id,
        "--",
        "printenv",
        "SBX_TEST_TOKEN",
    ])
    .env("SBX_TEST_TOKEN", "tok-42")
    .output()
    .expect("spawn");
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "tok-42\n".to_string()),
        "{}",
        stderr(&o)
    );

    // cp host → sandbox → host.
    let dir = std::env::temp_dir().join(format!("sbx-cp-{}-{engine}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let up = dir.join("up.bin");
    let payload: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    std::fs::write(&up, &payload).expect("write");
    let remote = format!("{id}:/work/up.bin");
    let o = run(&["cp", up.to_str().expect("utf8"), &remote]);
    assert_eq!(code(&o), 0, "cp up: {}", stderr(&o));
    let o = run(&["exec", &id, "--", "wc", "-c", "/work/up.bin"]);
    assert!(
        stdout(&o).trim_start().starts_with("100000"),
        "{}",
        stdout(&o)
    );
    let down = dir.join("down.bin");
    let o = run(&["cp", &remote, down.to_str().expect("utf8")]);
    assert_eq!(code(&o), 0, "cp down: {}", stderr(&o));
    assert_eq!(std::fs::read(&down).expect("read"), payload);
    let _ = std::fs::remove_dir_all(&dir);

    // Paused between commands (each reattaches): exec fails at once with SBX_E1206, a
    // second pause is fine, and after resume the sandbox runs commands again.
    let o = run(&["pause", "--json", &id]);
    assert_eq!(code(&o), 0, "pause: {}", stderr(&o));
    assert_eq!(json(&o)["state"], "paused");
    let t0 = std::time::Instant::now();
    let o = run(&["exec", &id, "--", "true"]);
    assert_eq!(code(&o), 1, "exec while paused fails: {}", stdout(&o));
    assert!(stderr(&o).contains("SBX_E1206"), "{}", stderr(&o));
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "refused at once"
    );
    let o = run(&["pause", &id]);
    assert_eq!(code(&o), 0, "pause again: {}", stderr(&o));
    let o = run(&["resume", &id]);
    assert_eq!(code(&o), 0, "resume: {}", stderr(&o));
    let o = run(&["exec", &id, "--", "cat", "state.txt"]);
    assert_eq!(stdout(&o), "kept\n", "after resume: {}", stderr(&o));

    // Stopped between commands: exec fails at once with SBX_E1207, `ls` shows it stopped,
    // the holder keeps it (past its poll), and after start its files are still there.
    let o = run(&["stop", "--json", &id]);
    assert_eq!(code(&o), 0, "stop: {}", stderr(&o));
    assert_eq!(json(&o)["state"], "stopped");
    let t0 = std::time::Instant::now();
    let o = run(&["exec", &id, "--", "true"]);
    assert_eq!(code(&o), 1, "exec while stopped fails: {}", stdout(&o));
    assert!(stderr(&o).contains("SBX_E1207"), "{}", stderr(&o));
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "refused at once"
    );
    std::thread::sleep(std::time::Duration::from_secs(3));
    let o = run(&["ls", "--json", "--engine", engine]);
    let listed = json(&o)["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .find(|s| s["id"] == id.as_str())
        .map(|s| s["state"].clone());
    assert_eq!(
        listed,
        Some(serde_json::json!("stopped")),
        "ls shows the stopped session (its holder kept it): {}",
        stdout(&o)
    );
    let o = run(&["start", "--json", &id]);
    assert_eq!(code(&o), 0, "start: {}", stderr(&o));
    assert_eq!(json(&o)["state"], "running");
    let o = run(&["exec", &id, "--", "cat", "state.txt"]);
    assert_eq!(stdout(&o), "kept\n", "after start: {}", stderr(&o));

    let o = run(&["kill", "--json", &id]);
    assert_eq!(code(&o), 0, "kill: {}", stderr(&o));
    assert_eq!(json(&o)["killed"], true);
    assert_eq!(containers(engine, &id), "", "killed and removed");
    let o = run(&["exec", &id, "--", "true"]);
    assert_eq!(code(&o), 1, "exec after kill fails: {}", stdout(&o));
    assert!(stderr(&o).contains("SBX_E1202"), "{}", stderr(&o));
    eprintln!("{engine} round trip: {:?}", started.elapsed());
}

#[test]
fn docker_create_exec_cp_kill_round_trip() {
    if engine_available("docker", "docker_create_exec_cp_kill_round_trip") {
        round_trip("docker");
    }
}

#[test]
fn podman_create_exec_cp_kill_round_trip() {
    if engine_available("podman", "podman_create_exec_cp_kill_round_trip") {
        round_trip("podman");
    }
}

#[test]
fn docker_run_passes_piped_stdin() {
    if !docker_available("docker_run_passes_piped_stdin") {
        return;
    }
    let o = run_with_stdin(
        &[
            "run",
            "docker://sandbox-rs/python:3.11",
            "--",
            "python3",
            "-",
        ],
        b"print(6*7)\n",
    );
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "42\n".to_string()),
        "{}",
        stderr(&o)
    );
}

#[test]
fn docker_create_lifetime_ends_the_sandbox() {
    if !docker_available("docker_create_lifetime_ends_the_sandbox") {
        return;
    }
    let o = run(&[
        "create",
        "--timeout",
        "3",
        "docker://sandbox-rs/busybox:latest",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let id = stdout(&o).trim().to_string();
    assert_eq!(containers("docker", &id), id);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !containers("docker", &id).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(containers("docker", &id), "", "gone after its 3 s lifetime");
}

/// SIGTERM (systemd, Kubernetes, CI cancellation) tears down like Ctrl-C.
#[test]
fn docker_sigterm_to_run_leaves_no_container() {
    if !docker_available("docker_sigterm_to_run_leaves_no_container") {
        return;
    }
    let mut child = sandbox(&[
        "run",
        "docker://sandbox-rs/busybox:latest",
        "--",
        "sh",
        "-c",
        "echo ready; sleep 60",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert_eq!(line, "ready\n");
    let pid = child.id();
    let mine = || -> Vec<String> {
        let o = Command::new("docker")
            .args([
                "ps",
                "-a",
                "--filter",
                "label=io.sandbox-rs.meta.command=run",
                "--format",
                "{{.ID}} {{.Labels}}",
            ])
            .output()
            .expect("docker");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains(&format!("/{pid}/")))
            .map(|l| l.split(' ').next().unwrap_or("").to_string())
            .collect()
    };
    let before = mine();
    let start = Instant::now();
    // Signal first, assert after: a failed assertion must not leave the child running.
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill")
            .success()
    );
    assert_eq!(before.len(), 1, "the run's container exists while it runs");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130));
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(mine().is_empty(), "container removed after SIGTERM");
}

#[test]
fn fake_create_prints_an_id_and_exec_of_an_unknown_id_is_a_connect_error() {
    // The fake lives in the holder's memory: `create` works, other processes cannot see it.
    let o = run(&["create", "--timeout", "2", "fake://"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let id = stdout(&o).trim().to_string();
    assert!(
        !id.is_empty() && !id.contains(char::is_whitespace),
        "{id:?}"
    );
    let o = run(&["exec", "--engine", "fake", "no-such-sandbox", "--", "true"]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("SBX_E1202"), "{}", stderr(&o));
    let o = run(&["kill", "--json", "--engine", "fake", "no-such-sandbox"]);
    assert_eq!(code(&o), 1);
    assert_eq!(json(&o)["error"]["code"], "SBX_E1202");
}

#[test]
fn create_usage_errors_come_back_without_a_holder() {
    let o = run(&["create", "--json", "nosuch://x"]);
    assert_eq!(code(&o), 2);
    assert_eq!(json(&o)["error"]["code"], "SBX_E1001");
    let o = sandbox(&["create", "--json", "--runtime", "runsc", "fake://"])
        .output()
        .expect("spawn");
    assert_eq!(code(&o), 2, "{}", stdout(&o));
}

#[test]
fn secret_missing_from_the_environment_is_a_usage_error_naming_it() {
    let o = sandbox(&[
        "run",
        "--json",
        "--secret",
        "SBX_SURELY_UNSET_VAR",
        "fake://",
        "--",
        "true",
    ])
    .env_remove("SBX_SURELY_UNSET_VAR")
    .output()
    .expect("spawn");
    assert_eq!(code(&o), 2);
    let v = json(&o);
    assert_eq!(v["error"]["code"], "SBX_E1000");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("SBX_SURELY_UNSET_VAR"))
    );
}

#[test]
fn secret_reaches_a_run_command_on_the_fake() {
    let o = sandbox(&[
        "run",
        "--secret",
        "SBX_TEST_SECRET",
        "fake://",
        "--",
        "printenv",
        "SBX_TEST_SECRET",
    ])
    .env("SBX_TEST_SECRET", "v-123")
    .output()
    .expect("spawn");
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "v-123\n".to_string()),
        "{}",
        stderr(&o)
    );
}

#[test]
fn completions_are_generated_for_bash() {
    let o = run(&["completions", "bash"]);
    assert_eq!(code(&o), 0);
    let script = stdout(&o);
    for sub in ["create", "exec", "cp", "ls", "kill", "mcp"] {
        assert!(script.contains(sub), "{sub}");
    }
}

#[test]
fn require_isolation_is_refused_before_anything_is_created() {
    let o = run(&[
        "run",
        "--json",
        "--require-isolation",
        "microvm",
        "fake://",
        "--",
        "true",
    ]);
    assert_eq!(code(&o), 2);
    assert_eq!(json(&o)["error"]["code"], "SBX_E1000");
}

/// `--runtime runsc` selects gVisor, which satisfies `--require-isolation gvisor`; runc
/// does not. Skipped when Docker has no `runsc` runtime registered.
#[test]
fn docker_runtime_runsc_satisfies_require_isolation_gvisor() {
    if !docker_available("docker_runtime_runsc_satisfies_require_isolation_gvisor") {
        return;
    }
    let runtimes = Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()
        .expect("docker info");
    if !String::from_utf8_lossy(&runtimes.stdout).contains("runsc") {
        eprintln!(
            "SKIPPED docker_runtime_runsc_satisfies_require_isolation_gvisor: no runsc runtime registered in Docker"
        );
        return;
    }
    let busybox = "docker://sandbox-rs/busybox:latest";
    let o = run(&[
        "run",
        "--json",
        "--require-isolation",
        "gvisor",
        busybox,
        "--",
        "true",
    ]);
    assert_eq!(code(&o), 2, "runc is not gVisor: {}", stdout(&o));
    let o = run(&[
        "run",
        "--json",
        "--runtime",
        "runsc",
        "--require-isolation",
        "gvisor",
        busybox,
        "--",
        "true",
    ]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert_eq!(json(&o)["sandbox"]["tier"], "gvisor");
}

/// Ctrl-C while `create` waits leaves nothing behind: the holder sees `create` go away
/// before the hand-over and kills what it made.
#[test]
fn docker_create_interrupted_leaves_no_container() {
    if !docker_available("docker_create_interrupted_leaves_no_container") {
        return;
    }
    interrupted_create_leaves_no_container("interrupted", None);
}

/// The same when the holder's kill outlasts the teardown grace (a loaded engine; forced
/// here with a 1 ms grace): the holder must finish the removal before it exits, not
/// abandon it to a background task that dies with it (seen in CI).
#[test]
fn docker_create_interrupted_with_a_slow_kill_leaves_no_container() {
    if !docker_available("docker_create_interrupted_with_a_slow_kill_leaves_no_container") {
        return;
    }
    interrupted_create_leaves_no_container("interrupted-slow", Some("0.001"));
}

fn interrupted_create_leaves_no_container(name: &str, grace: Option<&str>) {
    let tag = format!("{name}-{}", std::process::id());
    let label = format!("cli-test={tag}");
    let mut cmd = sandbox(&[
        "create",
        "--label",
        &label,
        "docker://sandbox-rs/busybox:latest",
    ]);
    if let Some(g) = grace {
        cmd.env("SBX_TEARDOWN_GRACE", g);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Mid-create: the holder is starting or creating.
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill")
            .success()
    );
    let status = child.wait().expect("wait");
    let labelled = || {
        let o = Command::new("docker")
            .args([
                "ps",
                "-a",
                "-q",
                "--filter",
                &format!("label=io.sandbox-rs.meta.cli-test={tag}"),
            ])
            .output()
            .expect("docker");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // The holder (this command again, detached, with the same arguments) may still be
    // creating: the verdict is what is left once it has exited, not a look before its
    // container exists.
    let holder_alive = || {
        Command::new("pgrep")
            .args(["-f", &label])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while holder_alive() {
        assert!(
            Instant::now() < deadline,
            "the holder did not exit within 90 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(status.code(), Some(130), "interrupted");
    assert_eq!(labelled(), "", "the interrupted create left a container");
}

/// Removes a session's container when a test ends, passed or failed (its holder notices
/// within its poll and exits).
struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `sandbox create --timeout 10 --max-lifetime 120` on Docker: its id, the guard that
/// removes it, and when `create` returned.
fn short_extendable_session() -> (String, RemoveOnDrop, Instant) {
    let o = run(&[
        "create",
        "--json",
        "--timeout",
        "10",
        "--max-lifetime",
        "120",
        "docker://sandbox-rs/busybox:latest",
    ]);
    assert_eq!(code(&o), 0, "create: {}", stderr(&o));
    let created = Instant::now();
    let id = json(&o)["sandbox"]["id"].as_str().expect("id").to_string();
    (id.clone(), RemoveOnDrop(id), created)
}

/// `sandbox extend ID 25` from its own process; the new deadline (Unix seconds).
fn extend_by_25(id: &str) -> u64 {
    let o = run(&["extend", "--json", id, "25"]);
    assert_eq!(code(&o), 0, "extend: {}", stderr(&o));
    let v = json(&o);
    let left = v["expires_in_s"].as_u64().expect("expires_in_s");
    assert!((28..=37).contains(&left), "10 s + 25 s from create: {v:#}");
    v["deadline"].as_u64().expect("deadline")
}

/// Waits until `when` after `since`.
fn sleep_until(since: Instant, when: Duration) {
    if let Some(left) = (since + when).checked_duration_since(Instant::now()) {
        std::thread::sleep(left);
    }
}

/// A session extended from another process (`sandbox extend`, through the holder, after
/// a `sandbox exec` took the agent over from it) is not ended at its old deadline by its
/// holder, and ends at the new one.
#[test]
fn docker_extend_from_another_process_moves_the_holders_deadline() {
    if !docker_available("docker_extend_from_another_process_moves_the_holders_deadline") {
        return;
    }
    let (id, _remove, created) = short_extendable_session();
    // An exec first takes the agent over from the holder (a reattached Docker handle
    // does): the holder takes it back to extend.
    let o = run(&["exec", &id, "--", "true"]);
    assert_eq!(code(&o), 0, "exec: {}", stderr(&o));
    let deadline = extend_by_25(&id);
    // Every process sees the moved deadline, not the labelled one of create.
    let o = run(&["ls", "--json", "--engine", "docker"]);
    let listed = json(&o)["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .find(|s| s["id"] == id.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("ls lists it: {}", stdout(&o)));
    assert_eq!(listed["deadline"], deadline, "{listed:#}");

    // Past the old deadline, its grace and the holder's poll: still there, still usable.
    sleep_until(created, Duration::from_secs(16));
    assert_eq!(
        containers("docker", &id),
        id,
        "ended at the deadline of create although it was extended"
    );
    let o = run(&["exec", &id, "--", "echo", "alive"]);
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "alive\n".to_string()),
        "{}",
        stderr(&o)
    );

    // The new deadline holds: gone soon after it, not long before.
    while !containers("docker", &id).is_empty() && created.elapsed() < Duration::from_secs(70) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let gone_after = created.elapsed();
    assert_eq!(containers("docker", &id), "", "gone after its new deadline");
    assert!(
        gone_after > Duration::from_secs(28),
        "ended {gone_after:?} after create, before its new deadline"
    );
}

/// A session extended, stopped and started again, each from another process: the agent
/// that `start` runs anew (its command line has the deadline of create) is given the
/// moved deadline by the reattached handle that started it.
#[test]
fn docker_start_through_another_process_keeps_the_extension() {
    if !docker_available("docker_start_through_another_process_keeps_the_extension") {
        return;
    }
    let (id, _remove, created) = short_extendable_session();
    extend_by_25(&id);
    let o = run(&["stop", &id]);
    assert_eq!(code(&o), 0, "stop: {}", stderr(&o));
    let o = run(&["start", &id]);
    assert_eq!(code(&o), 0, "start: {}", stderr(&o));
    sleep_until(created, Duration::from_secs(16));
    let o = run(&["exec", &id, "--", "echo", "alive"]);
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "alive\n".to_string()),
        "the restarted sandbox ended at the deadline of create: {}",
        stderr(&o)
    );
    let o = run(&["kill", &id]);
    assert_eq!(code(&o), 0, "kill: {}", stderr(&o));
    assert_eq!(containers("docker", &id), "", "killed and removed");
}

/// On Podman a reattached handle keeps to the engine's exec path and cannot move the
/// agent's deadline; `sandbox extend` asks the session's holder instead, whose handle
/// holds the agent: the extension holds past the deadline of create, and `ls` shows it.
#[test]
fn podman_extend_goes_through_the_holder() {
    if !engine_available("podman", "podman_extend_goes_through_the_holder") {
        return;
    }
    let o = run(&[
        "create",
        "--json",
        "--timeout",
        "10",
        "--max-lifetime",
        "120",
        "podman://sandbox-rs/busybox:latest",
    ]);
    assert_eq!(code(&o), 0, "create: {}", stderr(&o));
    let created = Instant::now();
    let id = json(&o)["sandbox"]["id"].as_str().expect("id").to_string();
    let o = run(&["extend", "--json", &id, "25"]);
    let extended = (code(&o), json(&o));
    sleep_until(created, Duration::from_secs(16));
    let alive = run(&["exec", &id, "--", "echo", "alive"]);
    let listed = run(&["ls", "--json", "--engine", "podman"]);
    let killed = run(&["kill", &id]);
    assert_eq!(extended.0, 0, "extend: {}", extended.1);
    let left = extended.1["expires_in_s"].as_u64().expect("expires_in_s");
    assert!(
        (28..=37).contains(&left),
        "10 s + 25 s from create: {}",
        extended.1
    );
    assert_eq!(
        (code(&alive), stdout(&alive)),
        (0, "alive\n".to_string()),
        "ended at the deadline of create although it was extended: {}",
        stderr(&alive)
    );
    let entry = json(&listed)["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .find(|s| s["id"] == id.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("ls lists it: {}", stdout(&listed)));
    assert_eq!(entry["deadline"], extended.1["deadline"], "{entry:#}");
    assert_eq!(code(&killed), 0, "kill: {}", stderr(&killed));
    assert_eq!(containers("podman", &id), "", "killed and removed");
}

/// `sandbox ls` in another process reads each sandbox's egress policy; on Docker a
/// reattached handle takes the in-sandbox agent over from its owner, so reading through
/// one ended the session of every program holding a sandbox ("another handle took this
/// sandbox's agent over", found by the load benchmark). The owner must go on running
/// commands after a listing.
#[test]
fn ls_leaves_the_owners_agent_session_alone() {
    if !docker_available("ls_leaves_the_owners_agent_session_alone") {
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let opts = sandbox::CreateOptions::default().timeout(Duration::from_secs(120));
        let sb = sandbox::create("docker://sandbox-rs/busybox:latest", opts)
            .await
            .expect("create");
        let before = sb.run("true".into(), Default::default()).await;
        let o = tokio::task::spawn_blocking(|| run(&["ls", "--json", "--engine", "docker"]))
            .await
            .expect("ls");
        let after = sb.run("true".into(), Default::default()).await;
        let _ = sb.kill().await;
        assert_eq!(code(&o), 0, "ls: {}", stderr(&o));
        assert_eq!(before.expect("run before ls").exit_code, 0);
        let after = after.unwrap_or_else(|e| panic!("run after `sandbox ls`: {}", e.render()));
        assert_eq!(after.exit_code, 0);
    });
}

/// Whether Docker here can fork with memory: gVisor registered and experimental features
/// on (what `sandbox doctor` checks for `--runtime runsc`). Under `CI=true` setup provides
/// both, so a missing one fails.
fn docker_forks(test: &str) -> bool {
    let o = Command::new("docker")
        .args([
            "info",
            "--format",
            "{{json .Runtimes}} {{.ExperimentalBuild}}",
        ])
        .output()
        .expect("docker info");
    let info = String::from_utf8_lossy(&o.stdout).to_string();
    if info.contains("runsc") && info.trim_end().ends_with("true") {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: Docker cannot fork here ({info}); CI's setup registers runsc with experimental features"
    );
    eprintln!("SKIPPED {test}: Docker cannot fork here (needs runsc and experimental features)");
    false
}

/// `sandbox fork` asks the session's holder, which alone has the original's handle, for
/// forks with memory, and then holds them: each fork has the original's files, diverges on
/// its own, outlives `sandbox kill` of the original, and ends with its own kill.
#[test]
fn docker_fork_through_the_session_holder() {
    if !docker_available("docker_fork_through_the_session_holder")
        || !docker_forks("docker_fork_through_the_session_holder")
    {
        return;
    }
    let o = run(&[
        "create",
        "--json",
        "--runtime",
        "runsc",
        "--timeout",
        "120",
        "docker://sandbox-rs/busybox:latest",
    ]);
    assert_eq!(code(&o), 0, "create: {}", stderr(&o));
    let id = json(&o)["sandbox"]["id"].as_str().expect("id").to_string();
    let _remove = RemoveOnDrop(id.clone());
    let o = run(&["exec", &id, "--", "sh", "-c", "echo before > /tmp/state"]);
    assert_eq!(code(&o), 0, "exec: {}", stderr(&o));

    let o = run(&["fork", "--json", "-n", "2", &id]);
    assert_eq!(code(&o), 0, "fork: {}{}", stdout(&o), stderr(&o));
    let v = json(&o);
    assert_eq!(v["sandbox"], id.as_str(), "{v:#}");
    let forks: Vec<String> = v["forks"]
        .as_array()
        .expect("forks")
        .iter()
        .map(|f| f["id"].as_str().expect("fork id").to_string())
        .collect();
    let _removes: Vec<RemoveOnDrop> = forks.iter().cloned().map(RemoveOnDrop).collect();
    assert_eq!(forks.len(), 2, "{v:#}");
    assert!(forks.iter().all(|f| f != &id), "{v:#}");

    // Each fork starts from the original's files and diverges on its own.
    let o = run(&[
        "exec",
        &forks[0],
        "--",
        "sh",
        "-c",
        "cat /tmp/state; echo fork0 > /tmp/state",
    ]);
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "before\n".to_string()),
        "{}",
        stderr(&o)
    );
    let o = run(&["exec", &forks[1], "--", "cat", "/tmp/state"]);
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "before\n".to_string()),
        "{}",
        stderr(&o)
    );
    let o = run(&["exec", &id, "--", "cat", "/tmp/state"]);
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "before\n".to_string()),
        "{}",
        stderr(&o)
    );

    // The original's end does not end its forks: the holder keeps them.
    let o = run(&["kill", &id]);
    assert_eq!(code(&o), 0, "kill: {}", stderr(&o));
    assert_eq!(containers("docker", &id), "", "original removed");
    std::thread::sleep(Duration::from_secs(5));
    for f in &forks {
        assert_eq!(
            containers("docker", f),
            *f,
            "a fork ended with its original"
        );
    }
    let o = run(&["exec", &forks[1], "--", "echo", "alive"]);
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "alive\n".to_string()),
        "{}",
        stderr(&o)
    );
    // Once the original is gone there is nothing to fork from, and the answer says so.
    let o = run(&["fork", "--json", &forks[0]]);
    assert_ne!(
        code(&o),
        0,
        "a fork has no holder socket of its own: {}",
        stdout(&o)
    );
    for f in &forks {
        let o = run(&["kill", f]);
        assert_eq!(code(&o), 0, "kill fork: {}", stderr(&o));
        assert_eq!(containers("docker", f), "", "fork removed");
    }
    // With nothing left to hold the holder ends and removes its socket.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !std::path::Path::new(&format!("/run/sandbox-rs/holder/{id}.sock")).exists(),
        "the holder's control socket outlived it"
    );
}

/// A fork the engine cannot make comes back as the library's typed refusal, and a
/// sandbox no holder answers for gets an error saying where forks are made.
#[test]
fn docker_fork_refusals_are_typed() {
    if !docker_available("docker_fork_refusals_are_typed") {
        return;
    }
    let (id, _remove, _) = short_extendable_session();
    // runc cannot checkpoint memory: the holder answers with the capability refusal.
    let o = run(&["fork", "--json", &id]);
    assert_ne!(code(&o), 0, "{}", stdout(&o));
    assert_eq!(json(&o)["error"]["code"], "SBX_E1101", "{}", stdout(&o));
    let o = run(&["fork", "--json", "-n", "0", &id]);
    assert_eq!(code(&o), 2, "count 0 is a usage error: {}", stdout(&o));
    let o = run(&["kill", &id]);
    assert_eq!(code(&o), 0, "kill: {}", stderr(&o));
}

/// `sandbox create --idle-timeout`: a session nobody uses ends at its idle limit and is
/// removed then (not kept stopped until its deadline), and its holder ends with it. With
/// `exec_first`, a `sandbox exec` ran in it first (on Docker it takes the agent over from
/// the holder, whose session then no longer sees the agent's end).
fn an_idle_session_is_removed_on(engine: &str, exec_first: bool) {
    let o = run(&[
        "create",
        "--json",
        "--timeout",
        "120",
        "--idle-timeout",
        "2",
        &format!("{engine}://sandbox-rs/busybox:latest"),
    ]);
    assert_eq!(code(&o), 0, "create: {}", stderr(&o));
    let created = Instant::now();
    let id = json(&o)["sandbox"]["id"].as_str().expect("id").to_string();
    let socket = format!("/run/sandbox-rs/holder/{id}.sock");
    assert!(std::path::Path::new(&socket).exists(), "the holder listens");
    let created = if exec_first {
        let o = run(&["exec", &id, "--", "echo", "used"]);
        assert_eq!(
            (code(&o), stdout(&o)),
            (0, "used\n".to_string()),
            "{}",
            stderr(&o)
        );
        Instant::now()
    } else {
        created
    };
    // Ended within a second of the limit, removed by the holder's backend at once; the
    // holder sees it gone at its next check (every 2 s).
    let removed = loop {
        let gone = containers(engine, &id).is_empty() && !std::path::Path::new(&socket).exists();
        if gone || created.elapsed() > Duration::from_secs(20) {
            break gone;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let took = created.elapsed();
    let (container, holder) = (
        containers(engine, &id),
        std::path::Path::new(&socket).exists(),
    );
    if !removed {
        let _ = run(&["kill", &id]);
    }
    assert!(
        removed,
        "20 s after create with a 2 s idle limit: container {container:?}, holder socket there: {holder}"
    );
    assert!(
        took >= Duration::from_secs(2),
        "ended before its idle limit: {took:?}"
    );
}

#[test]
fn docker_idle_session_is_removed() {
    if !docker_available("docker_idle_session_is_removed") {
        return;
    }
    an_idle_session_is_removed_on("docker", false);
}

#[test]
fn docker_idle_session_is_removed_after_an_exec() {
    if !docker_available("docker_idle_session_is_removed_after_an_exec") {
        return;
    }
    an_idle_session_is_removed_on("docker", true);
}

#[test]
fn podman_idle_session_is_removed() {
    if !engine_available("podman", "podman_idle_session_is_removed") {
        return;
    }
    an_idle_session_is_removed_on("podman", false);
}

#[test]
fn podman_idle_session_is_removed_after_an_exec() {
    if !engine_available("podman", "podman_idle_session_is_removed_after_an_exec") {
        return;
    }
    an_idle_session_is_removed_on("podman", true);
}
