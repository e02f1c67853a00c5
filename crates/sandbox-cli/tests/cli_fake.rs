//! The CLI against the in-memory fake (`fake://`): no engine needed.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn run_streams_output_and_exits_with_the_commands_code() {
    let o = run(&[
        "run",
        "fake://",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(code(&o), 3, "stderr: {}", stderr(&o));
    assert_eq!(stdout(&o), "out\n");
    assert_eq!(stderr(&o), "err\n");
}

/// Runs `sandbox ARGS` under a pseudo-terminal (`script`), returning what the terminal
/// received; `None` (with a printed reason) where `script` is missing.
fn on_a_terminal(args: &[&str]) -> Option<Vec<u8>> {
    let line = std::iter::once(env!("CARGO_BIN_EXE_sandbox"))
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let o = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output();
    match o {
        Ok(o) => Some(o.stdout),
        Err(e) => {
            eprintln!("SKIPPED: `script` (util-linux) is needed for a pseudo-terminal: {e}");
            None
        }
    }
}

#[test]
fn run_escapes_control_sequences_on_a_terminal() {
    // Clear the screen, set the window title, then forge a line.
    let attack = r"\033[2J\033]0;pwned\007\rok\n";
    let Some(seen) = on_a_terminal(&["run", "fake://", "--", "printf", attack]) else {
        return;
    };
    let text = String::from_utf8_lossy(&seen);
    assert!(
        !seen.contains(&0x1b) && !seen.contains(&0x07),
        "raw escape reached the terminal: {text:?}"
    );
    assert!(text.contains(r"\x1b[2J\x1b]0;pwned\x07\x0dok"), "{text:?}");
    // --raw passes the bytes through.
    let seen = on_a_terminal(&["run", "--raw", "fake://", "--", "printf", attack]).unwrap();
    assert!(seen.windows(4).any(|w| w == b"\x1b[2J"), "{seen:?}");
}

#[test]
fn run_writes_raw_bytes_into_a_pipe() {
    let o = run(&["run", "fake://", "--", "printf", r"\033[1mbold\n"]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    assert_eq!(o.stdout, b"\x1b[1mbold\n");
}

#[test]
fn run_passes_env_and_resource_flags() {
    let o = run(&[
        "run",
        "--env",
        "GREETING=hi",
        "--memory",
        "256",
        "--cpus",
        "0.5",
        "--network",
        "deny",
        "fake://",
        "--",
        "printenv",
        "GREETING",
    ]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    assert_eq!(stdout(&o), "hi\n");
}

#[test]
fn a_terminal_the_fake_cannot_give_is_refused() {
    let o = run(&["run", "-t", "fake://", "--", "true"]);
    assert_ne!(code(&o), 0, "a terminal on the fake was accepted");
    assert!(stderr(&o).contains("PTY"), "{}", stderr(&o));
    let o = run(&["run", "-t", "--json", "fake://", "--", "true"]);
    assert_eq!(code(&o), 2, "-t with --json is a usage error");
}

#[test]
fn disk_limit_the_fake_cannot_honour_is_refused() {
    let o = run(&["run", "--disk-mb", "8", "fake://", "--", "true"]);
    assert_ne!(code(&o), 0, "a disk limit on the fake was accepted");
    assert!(stderr(&o).contains("DISK_LIMIT"), "{}", stderr(&o));
}

#[test]
fn run_json_schema() {
    let o = run(&[
        "run",
        "--json",
        "fake://",
        "--",
        "sh",
        "-c",
        "echo hi; echo oops >&2",
    ]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    let mut v = json(&o);
    redact(&mut v);
    insta::assert_json_snapshot!("run_json_fake", v);
}

#[test]
fn run_timeout_exits_124() {
    let start = Instant::now();
    let o = run(&["run", "--timeout", "0.5", "fake://", "--", "sleep", "30"]);
    assert_eq!(code(&o), 124, "stderr: {}", stderr(&o));
    assert!(stderr(&o).contains("SBX_E1302"), "{}", stderr(&o));
    assert!(start.elapsed() < Duration::from_secs(15));
    let o = run(&[
        "run",
        "--json",
        "--timeout",
        "0.5",
        "fake://",
        "--",
        "sleep",
        "30",
    ]);
    assert_eq!(code(&o), 124);
    assert_eq!(json(&o)["timed_out"], true);
}

#[test]
fn unknown_scheme_is_a_usage_error_listing_compiled_in_backends() {
    let o = run(&["run", "nosuch://", "--", "true"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("SBX_E1001"), "{}", stderr(&o));
    let o = run(&["run", "--json", "nosuch://", "--", "true"]);
    assert_eq!(code(&o), 2);
    let v = json(&o);
    insta::assert_json_snapshot!("error_json_unknown_scheme", v);
}

#[test]
fn credential_in_dsn_is_refused_and_never_echoed() {
    let o = run(&["run", "--json", "fake://x?token=hunter2", "--", "true"]);
    assert_eq!(code(&o), 2);
    assert_eq!(json(&o)["error"]["code"], "SBX_E1000");
    assert!(!stdout(&o).contains("hunter2") && !stderr(&o).contains("hunter2"));
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["run", "fake://"][..],
        &["run", "--network", "sideways", "fake://", "--", "true"],
        &["run", "--timeout", "0", "fake://", "--", "true"],
        &["reap", "--older-than", "10"],
        &["reap", "--label", "novalue"],
        &["frobnicate"],
    ] {
        let o = run(args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
    }
    let o = run(&["run", "--memory", "0", "fake://", "--", "true"]);
    assert_eq!(code(&o), 2, "configuration error: {}", stderr(&o));
}

#[test]
fn help_documents_exit_codes() {
    let o = run(&["--help"]);
    assert_eq!(code(&o), 0);
    for needle in ["Exit codes", "130", "124", "NO_COLOR", "--json"] {
        assert!(stdout(&o).contains(needle), "{needle}");
    }
}

#[test]
fn demo_on_the_fake_passes_every_step() {
    let o = run(&["demo", "fake://"]);
    assert_eq!(
        code(&o),
        0,
        "stdout: {}\nstderr: {}",
        stdout(&o),
        stderr(&o)
    );
    let text = stdout(&o);
    for step in [
        "create",
        "run_code",
        "stream",
        "egress_denied",
        "teardown",
        "demo passed",
    ] {
        assert!(text.contains(step), "{step} missing in:\n{text}");
    }
    assert!(!text.contains('\x1b'), "NO_COLOR respected");
}

#[test]
fn demo_json_schema() {
    let o = run(&["demo", "--json", "fake://"]);
    assert_eq!(code(&o), 0, "stdout: {}", stdout(&o));
    let mut v = json(&o);
    assert!(v["total_ms"].as_u64().unwrap() < 10_000);
    redact_demo(&mut v);
    insta::assert_json_snapshot!("demo_json_fake", v);
}

#[test]
fn doctor_json_schema_for_the_fake() {
    let o = run(&["doctor", "--json", "--engine", "fake"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let mut v = json(&o);
    redact(&mut v);
    insta::assert_json_snapshot!("doctor_json_fake", v);
    let o = run(&["doctor", "--engine", "nosuch"]);
    assert_eq!(code(&o), 2);
}

#[test]
fn doctor_lists_every_compiled_in_engine() {
    let o = run(&["doctor", "--json"]);
    let v = json(&o);
    let names: Vec<&str> = v["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["backend"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"docker") && names.contains(&"fake"),
        "{names:?}"
    );
    for e in v["engines"].as_array().unwrap() {
        if !e["healthy"].as_bool().unwrap() {
            for p in e["problems"].as_array().unwrap() {
                assert!(
                    !p["fix"].as_str().unwrap().is_empty(),
                    "each problem has a fix"
                );
            }
        }
    }
}

#[test]
fn reap_json_schema_on_the_fake() {
    let o = run(&[
        "reap",
        "--json",
        "--engine",
        "fake",
        "--label",
        "team=x",
        "--older-than",
        "1h",
    ]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let v = json(&o);
    insta::assert_json_snapshot!("reap_json_fake_empty", v);
}

#[test]
fn reap_force_needs_kill() {
    let o = run(&["reap", "--engine", "fake", "--force"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

#[test]
fn reap_unknown_id_fails() {
    let o = run(&[
        "reap", "--json", "--engine", "fake", "--kill", "--id", "deadbeef",
    ]);
    assert_eq!(code(&o), 1);
    assert_eq!(json(&o)["not_found"][0], "deadbeef");
}

#[test]
fn ctrl_c_tears_down_and_exits_130() {
    let mut child = sandbox(&["run", "fake://", "--", "sh", "-c", "echo ready; sleep 30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    let start = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn doctor_reports_an_unreachable_engine_with_its_fix() {
    let o = sandbox(&["doctor", "--json", "--engine", "docker"])
        .env("DOCKER_HOST", "unix:///nonexistent/sandbox-rs-test.sock")
        .output()
        .unwrap();
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    let mut v = json(&o);
    // The problem and fix texts belong to the Docker adapter; pin that they exist.
    let p = &mut v["engines"][0]["problems"][0];
    assert!(p["problem"].as_str().unwrap().contains("SBX_E1003"), "{p}");
    assert!(!p["fix"].as_str().unwrap().is_empty());
    p["problem"] = "[problem]".into();
    p["fix"] = "[fix]".into();
    insta::assert_json_snapshot!("doctor_json_docker_unreachable", v);
    let o = sandbox(&["doctor", "--engine", "docker"])
        .env("DOCKER_HOST", "unix:///nonexistent/sandbox-rs-test.sock")
        .output()
        .unwrap();
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("unreachable") && stdout(&o).contains("fix:"));
}

/// A machine with neither the engine's socket nor its binaries has the engine missing,
/// not down: both adapters say `BackendNotInstalled` with the install command.
#[test]
fn doctor_reports_a_missing_engine_as_not_installed_on_both_engines() {
    for (engine, var, binary) in [
        ("docker", "DOCKER_HOST", "docker"),
        ("podman", "CONTAINER_HOST", "podman"),
    ] {
        let o = sandbox(&["doctor", "--json", "--engine", engine])
            .env("PATH", "/nonexistent/sandbox-rs-empty-path")
            .env(var, "unix:///nonexistent/sandbox-rs-test.sock")
            .output()
            .unwrap();
        assert_eq!(code(&o), 1, "{}", stdout(&o));
        let v = json(&o);
        let p = &v["engines"][0]["problems"][0];
        let problem = p["problem"].as_str().unwrap_or_default();
        assert!(problem.contains("SBX_E1002"), "{engine}: {p}");
        let fix = p["fix"].as_str().unwrap_or_default();
        assert!(
            fix.contains("install") && fix.contains(binary),
            "{engine}: {fix}"
        );
    }
}

#[test]
fn doctor_never_prints_credentials_from_the_endpoint() {
    let o = sandbox(&["doctor", "--json", "--engine", "docker"])
        .env("DOCKER_HOST", "tcp://user:hunter2@127.0.0.1:1")
        .output()
        .unwrap();
    assert!(!stdout(&o).contains("hunter2"), "{}", stdout(&o));
    assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));
}

/// `--secret` takes a NAME. A value pasted there by mistake is refused (usage error)
/// without being echoed into the terminal's scrollback or a CI log.
#[test]
fn a_secret_value_given_as_a_name_is_not_echoed() {
    let pasted = "sk-live-0123456789abcdef";
    for args in [
        &["run", "--secret", pasted, "fake://", "--", "true"][..],
        &["exec", "--secret", pasted, "some-id", "--", "true"][..],
    ] {
        let o = run(args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains(pasted), "{}", stderr(&o));
        assert!(!stdout(&o).contains(pasted), "{}", stdout(&o));
    }
}

#[test]
fn piped_stdin_reaches_the_command() {
    let o = run_with_stdin(&["run", "fake://", "--", "cat"], b"line one\nline two\n");
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    assert_eq!(stdout(&o), "line one\nline two\n");
}

#[test]
fn ssh_agent_is_refused_where_it_cannot_work_and_says_why() {
    // The fake has no channel to relay the agent over: refused, never ignored.
    let o = run(&["run", "--ssh-agent", "fake://", "--", "true"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("SSH_AGENT"), "{}", stderr(&o));
    // `create` hands the sandbox to a holder whose channel `exec` takes over.
    let o = run(&["create", "--ssh-agent", "fake://"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("sandbox run"), "{}", stderr(&o));
    // A key that is neither a fingerprint nor a readable public key file.
    let o = run(&["run", "--ssh-agent=SHA256:short", "fake://", "--", "true"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("fingerprint"), "{}", stderr(&o));
}

#[test]
fn git_repo_is_refused_where_it_cannot_work_and_says_why() {
    let repo = std::env::temp_dir().join(format!("sbx-cli-git-{}", std::process::id()));
    std::fs::create_dir_all(&repo).unwrap();
    let init = std::process::Command::new("git")
        .args(["init", "-q"])
        .arg(&repo)
        .status()
        .expect("git runs");
    assert!(init.success());
    let rw = format!("{}:rw", repo.display());
    // The fake has no channel to forward the gate over: refused, never ignored.
    let o = run(&["run", "--git-repo", &rw, "fake://", "--", "true"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("GIT_GATE"), "{}", stderr(&o));
    // `create` hands the sandbox to a holder whose channel `exec` takes over.
    let o = run(&["create", "--git-repo", &rw, "fake://"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("sandbox run"), "{}", stderr(&o));
    // A directory that is no repository, refused with what to do.
    let not_repo = std::env::temp_dir().join(format!("sbx-cli-nogit-{}", std::process::id()));
    std::fs::create_dir_all(&not_repo).unwrap();
    let o = run(&[
        "run",
        "--git-repo",
        not_repo.to_str().unwrap(),
        "fake://",
        "--",
        "true",
    ]);
    assert_ne!(code(&o), 0);
    assert!(
        stderr(&o).contains("not a git repository"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(repo);
    let _ = std::fs::remove_dir_all(not_repo);
}

#[test]
fn credential_is_refused_where_it_cannot_work_and_never_shows_the_secret() {
    let secret = "sk-cli-never-shown-4f1c";
    let with = |args: &[&str]| {
        common::sandbox(args)
            .env("CLI_TEST_API_KEY", secret)
            .output()
            .expect("spawn sandbox")
    };
    // The fake cannot force traffic through a proxy: refused, never ignored.
    let o = with(&[
        "run",
        "--network",
        "closed",
        "--credential",
        "api.example.com:Authorization=Bearer {CLI_TEST_API_KEY}",
        "fake://",
        "--",
        "true",
    ]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("CREDENTIALS"), "{}", stderr(&o));
    assert!(!stderr(&o).contains(secret) && !stdout(&o).contains(secret));
    // A malformed argument is not echoed (it may be a pasted secret).
    let o = with(&["run", "--credential", secret, "fake://", "--", "true"]);
    assert_ne!(code(&o), 0);
    assert!(stderr(&o).contains("--credential"), "{}", stderr(&o));
    assert!(!stderr(&o).contains(secret), "{}", stderr(&o));
    // The variable must be set in the calling shell.
    let o = with(&[
        "run",
        "--network",
        "closed",
        "--credential",
        "api.example.com:X-Api-Key=CLI_TEST_UNSET_VARIABLE",
        "fake://",
        "--",
        "true",
    ]);
    assert_ne!(code(&o), 0);
    assert!(
        stderr(&o).contains("CLI_TEST_UNSET_VARIABLE"),
        "{}",
        stderr(&o)
    );
}
