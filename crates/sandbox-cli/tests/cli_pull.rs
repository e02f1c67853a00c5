//! Pull on create from the CLI: with the image removed from the engine and present only in a
//! registry on this machine (the tests' loopback registry), `sandbox run
//! docker://127.0.0.1:<port>/…` and `podman://…` pull it and run it, drawing the pull
//! bar on a terminal (a pty from `script`) and keeping a piped stderr free of it.

mod common;

use std::process::{Command, Stdio};

use common::*;
use sandbox_testkit::engine_cli::{ImageCleanup, image_present};
use sandbox_testkit::registry::{TestRegistry, source_archive};

fn pull_and_run(engine: &'static str) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let archive = source_archive(engine).expect("source image archive");
    let reg = rt
        .block_on(TestRegistry::start(
            &archive,
            &[("sbx-cli/pulled", "1"), ("sbx-cli/pulled", "2")],
            None,
        ))
        .expect("registry");
    let plain = format!("{}/sbx-cli/pulled:1", reg.host());
    let tty = format!("{}/sbx-cli/pulled:2", reg.host());
    let _cleanup = ImageCleanup::new(engine, vec![plain.clone(), tty.clone()]);
    assert!(
        !image_present(engine, &plain),
        "{plain} is not on the engine yet"
    );

    // stderr piped: the command's output only, no bar.
    let o = run(&[
        "run",
        &format!("{engine}://{plain}"),
        "--",
        "cat",
        "/etc/sbx-test-registry",
    ]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    assert_eq!(stdout(&o), reg.marker(), "the pulled image ran");
    assert!(
        !stderr(&o).contains("pulling"),
        "a bar on a pipe: {}",
        stderr(&o)
    );
    assert!(image_present(engine, &plain), "the image was pulled");

    // On a terminal: the bar, then the pulled line.
    let bin = env!("CARGO_BIN_EXE_sandbox");
    let line = format!("{bin} run {engine}://{tty} -- true");
    let o = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .env("NO_COLOR", "1")
        .env_remove("SANDBOX_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run under script");
    let shown = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{shown}");
    assert!(
        shown.contains(&format!("pulling {tty}")),
        "no bar: {shown:?}"
    );
    assert!(
        shown.contains(&format!("pulled {tty}")),
        "no pulled line: {shown:?}"
    );
    assert!(reg.manifest_requests("sbx-cli/pulled") >= 2);
}

#[test]
fn docker_run_pulls_a_missing_image_with_a_bar_on_a_terminal() {
    if engine_available(
        "docker",
        "docker_run_pulls_a_missing_image_with_a_bar_on_a_terminal",
    ) {
        pull_and_run("docker");
    }
}

#[test]
fn podman_run_pulls_a_missing_image_with_a_bar_on_a_terminal() {
    if engine_available(
        "podman",
        "podman_run_pulls_a_missing_image_with_a_bar_on_a_terminal",
    ) {
        pull_and_run("podman");
    }
}
