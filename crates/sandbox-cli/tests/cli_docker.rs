//! The CLI against the local Docker engine. Skipped (with a printed reason) when Docker is
//! missing, and failing instead when `CI=true`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const BUSYBOX: &str = "docker://sandbox-rs/busybox:latest";
const PYTHON: &str = "docker://sandbox-rs/python:3.11";

fn docker(args: &[&str]) -> String {
    let o = std::process::Command::new("docker")
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn docker_run_streams_and_exits_with_the_commands_code() {
    if !docker_available("docker_run_streams_and_exits_with_the_commands_code") {
        return;
    }
    let o = run(&[
        "run",
        BUSYBOX,
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!(code(&o), 7, "stderr: {}", stderr(&o));
    assert_eq!(stdout(&o), "out\n");
    assert_eq!(stderr(&o), "err\n");
}

#[test]
fn docker_run_disk_limit_holds() {
    if !docker_available("docker_run_disk_limit_holds") {
        return;
    }
    let o = run(&[
        "run",
        "--disk-mb",
        "4",
        BUSYBOX,
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/work/f bs=1048576 count=8 2>/dev/null; wc -c < /work/f; \
         touch /etc/x 2>/dev/null || echo read-only",
    ]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    assert_eq!(stdout(&o), "4194304\nread-only\n");
}

#[test]
fn docker_run_tty_is_an_interactive_terminal() {
    if !docker_available("docker_run_tty_is_an_interactive_terminal") {
        return;
    }
    use std::io::Write as _;
    // Our side is a pty of 33x111 (`script`); what we type arrives after the shell started.
    let line = format!(
        "stty cols 111 rows 33; '{}' run -t {BUSYBOX} -- sh",
        env!("CARGO_BIN_EXE_sandbox")
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    let mut stdin = child.stdin.take().unwrap();
    let typing = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        let _ = stdin.write_all(b"echo sbx-$((6*7)); stty size; test -t 0 && echo on-a-tty\r");
        std::thread::sleep(Duration::from_secs(2));
        let _ = stdin.write_all(b"exit 3\r");
        std::thread::sleep(Duration::from_secs(2));
    });
    let o = child.wait_with_output().unwrap();
    typing.join().unwrap();
    let seen = String::from_utf8_lossy(&o.stdout).replace('\r', "");
    assert_eq!(o.status.code(), Some(3), "{seen}");
    for expected in ["sbx-42\n", "33 111\n", "on-a-tty\n"] {
        assert!(seen.contains(expected), "no {expected:?} in {seen:?}");
    }
}

#[test]
fn docker_run_json_schema() {
    if !docker_available("docker_run_json_schema") {
        return;
    }
    let o = run(&[
        "run",
        "--json",
        "--memory",
        "128",
        BUSYBOX,
        "--",
        "sh",
        "-c",
        "echo hi; echo oops >&2",
    ]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    let mut v = json(&o);
    redact(&mut v);
    insta::assert_json_snapshot!("run_json_docker", v);
}

#[test]
fn docker_demo_passes_in_under_10s() {
    if !docker_available("docker_demo_passes_in_under_10s") {
        return;
    }
    let start = Instant::now();
    let o = run(&["demo", "--json", PYTHON]);
    let wall = start.elapsed();
    let mut v = json(&o);
    assert_eq!(code(&o), 0, "{v:#}");
    eprintln!("demo on docker: total_ms={} wall={wall:?}", v["total_ms"]);
    assert!(v["total_ms"].as_u64().unwrap() < 10_000);
    assert_eq!(v["egress"]["denied"], true, "{v:#}");
    assert_eq!(v["egress"]["interfaces"], serde_json::json!(["lo"]));
    let detail = v["steps"][3]["detail"]
        .as_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(detail.contains("network is unreachable"), "{detail}");
    redact_demo(&mut v);
    insta::assert_json_snapshot!("demo_json_docker", v);
}

#[test]
fn docker_ctrl_c_kills_the_sandbox_and_exits_130() {
    if !docker_available("docker_ctrl_c_kills_the_sandbox_and_exits_130") {
        return;
    }
    let mut child = sandbox(&["run", BUSYBOX, "--", "sh", "-c", "echo ready; sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    // The container this CLI process owns carries its pid in the owner label.
    let owner_filter = "label=io.sandbox-rs.meta.command=run";
    let mine = |pid: u32| -> Vec<String> {
        docker(&[
            "ps",
            "-a",
            "--filter",
            owner_filter,
            "--format",
            "{{.ID}} {{.Labels}}",
        ])
        .lines()
        .filter(|l| l.contains(&format!("/{pid}/")))
        .map(|l| l.split(' ').next().unwrap_or("").to_string())
        .collect()
    };
    let pid = child.id();
    let before = mine(pid);
    let start = Instant::now();
    // Interrupt first, assert after: a failed assertion must not leave the child running.
    assert!(
        std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(before.len(), 1, "the run's container exists while it runs");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(mine(pid).is_empty(), "container removed after Ctrl-C");
}

/// Starts a `sleep 120` container with these labels (and this name); returns its id.
fn labelled_container(name: Option<&str>, labels: &[(&str, String)]) -> String {
    let mut args = vec![
        "run".to_string(),
        "-d".into(),
        "--network".into(),
        "none".into(),
    ];
    if let Some(n) = name {
        args.extend(["--name".into(), n.to_string()]);
    }
    for (k, v) in labels {
        args.push("--label".into());
        args.push(format!("{k}={v}"));
    }
    args.extend([
        "sandbox-rs/busybox:latest".into(),
        "sleep".into(),
        "120".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = docker(&args).trim().to_string();
    assert!(!id.is_empty(), "docker run failed");
    id
}

#[test]
fn docker_reap_lists_and_kills_by_label_and_id() {
    if !docker_available("docker_reap_lists_and_kills_by_label_and_id") {
        return;
    }
    use sandbox::labels::{
        LABEL_BACKEND, LABEL_DEADLINE, LABEL_MANAGED, LABEL_OWNER, LABEL_SESSION, Owner, unix_now,
    };
    // A managed container as a client elsewhere would leave it: every label sandbox-rs
    // sets, an owner on another host (never proven gone, so the adapter's startup sweep
    // keeps it) and a deadline that has just passed (the sweep waits a grace beyond it;
    // `reap --kill` does not).
    let tag = format!("reap-{}", std::process::id());
    let elsewhere = Owner {
        host: "elsewhere".into(),
        ..Owner::current().clone()
    };
    let meta = "io.sandbox-rs.meta.cli-test";
    let id = labelled_container(
        Some(&format!("sbx-cli-{tag}")),
        &[
            (LABEL_MANAGED, "true".into()),
            (LABEL_BACKEND, "docker".into()),
            (LABEL_SESSION, "0123456789abcdef".into()),
            (LABEL_OWNER, elsewhere.to_label()),
            (LABEL_DEADLINE, (unix_now() - 1).to_string()),
            (meta, tag.clone()),
        ],
    );
    // One that only claims to be managed (as an image's labels can): foreign.
    let foreign_tag = format!("{tag}-foreign");
    let foreign = labelled_container(
        None,
        &[(LABEL_MANAGED, "true".into()), (meta, foreign_tag.clone())],
    );
    let label = format!("cli-test={tag}");

    let o = run(&["reap", "--json", "--engine", "docker", "--label", &label]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let v = json(&o);
    let listed = v["sandboxes"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{v:#}");
    assert!(id.starts_with(listed[0]["id"].as_str().unwrap()) || listed[0]["id"] == id.as_str());
    assert_eq!(
        listed[0]["killed"],
        serde_json::Value::Null,
        "listing never kills"
    );
    let mut snap = v.clone();
    redact(&mut snap);
    snap["sandboxes"][0]["labels"] = "[labels]".into();
    insta::assert_json_snapshot!("reap_json_docker_listed", snap);

    // Even --force leaves the foreign one alone.
    let foreign_label = format!("cli-test={foreign_tag}");
    let o = run(&[
        "reap",
        "--json",
        "--engine",
        "docker",
        "--kill",
        "--force",
        "--label",
        &foreign_label,
    ]);
    let v = json(&o);
    assert_eq!(v["sandboxes"][0]["verdict"], "foreign", "{v:#}");
    assert_eq!(
        v["sandboxes"][0]["killed"],
        serde_json::Value::Null,
        "{v:#}"
    );
    assert!(
        !docker(&["ps", "-q", "--filter", &format!("id={foreign}")])
            .trim()
            .is_empty()
    );
    docker(&["rm", "-f", &foreign]);

    let o = run(&[
        "reap",
        "--json",
        "--engine",
        "docker",
        "--kill",
        "--id",
        &id[..12],
    ]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let v = json(&o);
    assert_eq!(v["sandboxes"][0]["killed"], true, "{v:#}");
    assert!(
        docker(&["ps", "-aq", "--filter", &format!("id={id}")])
            .trim()
            .is_empty()
    );
}

#[test]
fn docker_doctor_reports_a_healthy_engine() {
    if !docker_available("docker_doctor_reports_a_healthy_engine") {
        return;
    }
    let o = run(&["doctor", "--json", "--engine", "docker"]);
    let mut v = json(&o);
    let e = &v["engines"][0];
    assert_eq!(e["reachable"], true, "{v:#}");
    assert!(e["version"].is_string());
    assert!(
        e["runtimes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "runc"),
        "{v:#}"
    );
    assert_eq!(code(&o), if e["healthy"] == true { 0 } else { 1 });
    redact(&mut v);
    v["engines"][0]["runtimes"] = "[runtimes]".into();
    v["engines"][0]["images"] = "[images]".into();
    v["engines"][0]["problems"] = "[problems]".into();
    v["engines"][0]["healthy"] = "[healthy]".into();
    v["engines"][0]["tier"] = "[tier]".into();
    // Forks depend on the runtime under test (SBX_DOCKER_RUNTIME) and dockerd's features.
    let forks = e_forks(&v);
    assert!(forks.is_some(), "doctor must say whether forks work: {v:#}");
    v["engines"][0]["forks"] = "[forks]".into();
    if let Some(o) = v["engines"][0].as_object_mut() {
        o.remove("forks_fix");
    }
    // SSH agent forwarding needs the agent, which SBX_AGENT=off turns off.
    let ssh_agent = v["engines"][0]["ssh_agent"].as_bool();
    assert!(
        ssh_agent.is_some(),
        "doctor must say whether ssh agent forwarding works: {v:#}"
    );
    if ssh_agent == Some(false) {
        assert!(
            v["engines"][0]["ssh_agent_fix"]
                .as_str()
                .is_some_and(|f| f.contains("agent")),
            "{v:#}"
        );
    }
    v["engines"][0]["ssh_agent"] = "[ssh_agent]".into();
    if let Some(o) = v["engines"][0].as_object_mut() {
        o.remove("ssh_agent_fix");
    }
    // Brokered credentials need the rules, which a runsc runtime under test bypasses.
    let credentials = v["engines"][0]["credentials"].as_bool();
    assert!(
        credentials.is_some(),
        "doctor must say whether brokered credentials work: {v:#}"
    );
    if credentials == Some(false) {
        assert!(
            v["engines"][0]["credentials_fix"]
                .as_str()
                .is_some_and(|f| f.contains("nftables")),
            "{v:#}"
        );
    }
    v["engines"][0]["credentials"] = "[credentials]".into();
    if let Some(o) = v["engines"][0].as_object_mut() {
        o.remove("credentials_fix");
    }
    v["ok"] = "[ok]".into();
    insta::assert_json_snapshot!("doctor_json_docker", v);
}

/// The doctor's `forks` answer, and when false, that a fix says what forks need.
fn e_forks(v: &serde_json::Value) -> Option<bool> {
    let e = &v["engines"][0];
    let forks = e["forks"].as_bool()?;
    if !forks {
        assert!(
            e["forks_fix"].as_str().is_some_and(|f| f.contains("runsc")),
            "{v:#}"
        );
    }
    Some(forks)
}

/// bollard logs every request body through the `log` crate at debug level, and an exec
/// body carries the command's environment, secrets included. The CLI must not forward
/// `log` records into its trace output, even at `SANDBOX_LOG=trace` (written before the
/// fix: the secret value was printed on stderr). Both exec paths: the agent's and the
/// engine's (`SBX_AGENT=off`).
#[test]
fn docker_trace_logs_never_carry_a_secret() {
    if !docker_available("docker_trace_logs_never_carry_a_secret") {
        return;
    }
    for agent in ["on", "off"] {
        let o = sandbox(&[
            "run",
            "--secret",
            "SBX_TRACE_SECRET",
            BUSYBOX,
            "--",
            "sh",
            "-c",
            "test -n \"$SBX_TRACE_SECRET\" && echo present",
        ])
        .env("SBX_TRACE_SECRET", "s3cr3t-trace-value-9f1c")
        .env("SANDBOX_LOG", "trace")
        .env("SBX_AGENT", agent)
        .output()
        .expect("spawn");
        assert_eq!(code(&o), 0, "agent {agent}: {}", stderr(&o));
        assert_eq!(stdout(&o), "present\n", "agent {agent}");
        assert!(
            !stderr(&o).contains("s3cr3t-trace-value-9f1c"),
            "agent {agent}: the secret reached the trace output"
        );
        assert!(
            stderr(&o).contains("TRACE") || stderr(&o).contains("DEBUG"),
            "agent {agent}: SANDBOX_LOG=trace produced no trace output, so the check proves nothing"
        );
    }
}
