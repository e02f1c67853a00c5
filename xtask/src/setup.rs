//! `cargo xtask setup`: makes a Debian 12 (or Ubuntu) machine ready for the whole test suite —
//! packages, engine configuration, running daemons, local test images — and proves it by
//! running hardened containers. Idempotent: a second run only checks (a few seconds).
//! What it does and why is documented in `docs/engines.md`.

use std::fs;
use std::time::Instant;

use anyhow::{Result, bail};

use crate::daemons::{DOCKERD, Daemon, PODMAN};
use crate::engine_config::{self, Applied};
use crate::images::{self, BUSYBOX, PYTHON};
use crate::process;
use crate::report::{self, seconds, step};
use crate::{packages, verify};

const SCOPE: &str = "setup";

/// Flags of `cargo xtask setup`.
#[derive(Default)]
pub struct Options {
    /// Re-import both images and re-run debootstrap even when current ones exist.
    pub rebuild_images: bool,
    /// Only start (or fix) the two daemons: no packages, configuration, images or checks.
    /// For a machine already set up whose daemons are gone (`/run` is cleared at boot) or
    /// run from the wrong directory.
    pub daemons_only: bool,
}

/// Runs every step in order; the first failure stops setup with the step's name.
pub fn run(options: &Options) -> Result<()> {
    let start = Instant::now();
    step(SCOPE, "preflight", preflight)?;
    if options.daemons_only {
        let unchanged = Applied {
            containers_conf_changed: false,
            daemon_json_changed: false,
        };
        step(SCOPE, "dockerd", || ensure_dockerd(&unchanged))?;
        step(SCOPE, "podman service", || {
            ensure_podman_service(&unchanged)
        })?;
        println!("{SCOPE}: daemons done in {}", seconds(start.elapsed()));
        return Ok(());
    }
    step(SCOPE, "packages", || Ok(((), packages::ensure()?)))?;
    let applied = step(SCOPE, "engine config", engine_config::apply)?;
    step(SCOPE, "dockerd", || ensure_dockerd(&applied))?;
    step(SCOPE, "podman service", || ensure_podman_service(&applied))?;
    for image in [&BUSYBOX, &PYTHON] {
        step(SCOPE, image.reference, || {
            images::ensure(image, options.rebuild_images)
        })?;
    }
    step(SCOPE, "verify docker + podman", verify::run)?;
    step(SCOPE, "gVisor (docker --runtime runsc)", verify::gvisor)?;
    step(SCOPE, "versions", versions)?;
    println!("{SCOPE}: done in {}", seconds(start.elapsed()));
    Ok(())
}

/// Root on Debian/Ubuntu, or a message saying exactly what to do instead.
fn preflight() -> Result<((), String)> {
    if !is_root() {
        bail!(
            "setup installs packages and starts daemons, so it needs root: run `sudo -E cargo xtask setup` (or as root)"
        );
    }
    let os_release = fs::read_to_string("/etc/os-release").unwrap_or_default();
    let field = |key: &str| {
        os_release
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default()
    };
    let (id, like, pretty) = (field("ID"), field("ID_LIKE"), field("PRETTY_NAME"));
    let apt_based = id == "debian" || id == "ubuntu" || like.split(' ').any(|l| l == "debian");
    if !apt_based || process::find_in_path("apt-get").is_none() {
        bail!(
            "setup supports Debian and Ubuntu (apt) only; this is {:?}. Install docker, podman, \
             catatonit, runsc, debootstrap and busybox (static) by hand and follow docs/engines.md",
            if pretty.is_empty() {
                "an unknown system"
            } else {
                &pretty
            }
        );
    }
    Ok(((), format!("root on {pretty}")))
}

fn is_root() -> bool {
    // The real uid, from the first field of `Uid:` (std has no getuid without libc).
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next().map(|id| id == "0"))
        })
        .unwrap_or(false)
}

fn ensure_dockerd(applied: &Applied) -> Result<((), String)> {
    if DOCKERD.answers() {
        // Restarting dockerd would stop every container on it, and nothing is known to
        // write into its cwd, so an instance running elsewhere is only reported.
        if let Some(cwd) = DOCKERD.running_pid().and_then(|p| DOCKERD.foreign_cwd(p)) {
            report::note(
                SCOPE,
                &format!(
                    "note: dockerd runs in {}; `cargo xtask teardown && cargo xtask setup` moves it to {}",
                    cwd.display(),
                    DOCKERD.work_dir().display()
                ),
            );
        }
        let pid = DOCKERD
            .running_pid()
            .map_or_else(|| "pid unknown".into(), |p| format!("pid {p}"));
        if !applied.daemon_json_changed {
            return Ok(((), format!("already running ({pid})")));
        }
        // `experimental` is read only at start: a daemon without it is restarted (when
        // setup started it) so checkpoints work; its containers stop with it.
        if !docker_is_experimental()? {
            let Some(old) = DOCKERD.stop_recorded()? else {
                report::note(
                    SCOPE,
                    "WARNING: dockerd runs without experimental features and was not started by setup, so it was not restarted; forks with memory stay unavailable until it is",
                );
                return Ok(((), format!("already running ({pid}); experimental off")));
            };
            let new_pid = DOCKERD.start()?;
            wait_for_runsc_runtime()?;
            return Ok((
                (),
                format!("restarted for experimental features (pid {old} -> {new_pid})"),
            ));
        }
        // dockerd reloads `runtimes` from daemon.json on SIGHUP; no restart needed.
        let Some(daemon_pid) = DOCKERD.running_pid() else {
            bail!("daemon.json changed but dockerd's pid is unknown; restart dockerd by hand");
        };
        process::send_signal(daemon_pid, "HUP")?;
        wait_for_runsc_runtime()?;
        return Ok((
            (),
            format!("already running ({pid}); reloaded daemon.json (SIGHUP)"),
        ));
    }
    start_or_await(&DOCKERD)
}

fn ensure_podman_service(applied: &Applied) -> Result<((), String)> {
    if !PODMAN.answers() {
        return start_or_await(&PODMAN);
    }
    // conmon drops its `oom` marker into the service's cwd (see daemons.rs), so a service
    // an older setup started from the checkout must move. Restarting the service is cheap
    // (≈ 0.5 s) and keeps its containers: each one's conmon is independent of it.
    // Setup's own instance moves from anywhere; someone else's (systemd's runs in `/`) is
    // only worth a warning when it runs in the checkout setup is called from.
    let misplaced = PODMAN
        .running_pid()
        .and_then(|p| PODMAN.foreign_cwd(p))
        .filter(|cwd| {
            PODMAN.recorded_pid().is_some()
                || std::env::current_dir().is_ok_and(|here| cwd.starts_with(here))
        });
    let reason = match (applied.containers_conf_changed, &misplaced) {
        (true, _) => "the new containers.conf".to_string(),
        (false, Some(cwd)) => format!("its own directory (it ran in {})", cwd.display()),
        (false, None) => {
            let pid = PODMAN
                .running_pid()
                .map_or_else(|| "pid unknown".into(), |p| format!("pid {p}"));
            return Ok(((), format!("already running ({pid})")));
        }
    };
    // Only a service setup started is restarted; someone else's is left alone, with the fix.
    let Some(pid) = PODMAN.stop_recorded()? else {
        report::note(
            SCOPE,
            &format!(
                "WARNING: the running Podman service was not started by setup, so it was not restarted for {reason}; restart it from {} yourself",
                PODMAN.work_dir().display()
            ),
        );
        return Ok(((), "already running (not restarted)".into()));
    };
    let new_pid = PODMAN.start()?;
    Ok((
        (),
        format!(
            "restarted for {reason} (pid {pid} -> {new_pid}, cwd {})",
            PODMAN.work_dir().display()
        ),
    ))
}

/// Starts `daemon`, unless an instance is already starting (process alive, socket not yet
/// answering), in which case that one is awaited.
fn start_or_await(daemon: &Daemon) -> Result<((), String)> {
    if let Some(pid) = daemon.running_pid() {
        daemon.wait_until_answering(None)?;
        return Ok(((), format!("was starting (pid {pid}); now answers")));
    }
    let pid = daemon.start()?;
    Ok((
        (),
        format!(
            "started (pid {pid}, log {}, pid file {})",
            daemon.log_file().display(),
            daemon.pid_file().display()
        ),
    ))
}

/// Whether the running dockerd has experimental features (checkpoints) turned on.
fn docker_is_experimental() -> Result<bool> {
    let answer = process::stdout_of(images::DOCKER.cli().args([
        "version",
        "--format",
        "{{.Server.Experimental}}",
    ]))?;
    Ok(answer.trim() == "true")
}

/// SIGHUP is asynchronous: wait until `docker info` lists the runtime.
fn wait_for_runsc_runtime() -> Result<()> {
    let start = Instant::now();
    loop {
        let runtimes = process::stdout_of(images::DOCKER.cli().args([
            "info",
            "--format",
            "{{json .Runtimes}}",
        ]))?;
        if runtimes.contains("\"runsc\"") {
            return Ok(());
        }
        if start.elapsed().as_secs() >= 10 {
            bail!(
                "dockerd did not load the runsc runtime after SIGHUP; see {}",
                DOCKERD.log_file().display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Engine and API versions, the facts adapter authors ask for first.
fn versions() -> Result<((), String)> {
    let docker = process::stdout_of(images::DOCKER.cli().args([
        "info",
        "--format",
        "docker {{.ServerVersion}}, cgroup v{{.CgroupVersion}} ({{.CgroupDriver}}), default runtime {{.DefaultRuntime}}",
    ]))?;
    let docker_api = process::stdout_of(images::DOCKER.cli().args([
        "version",
        "--format",
        "API {{.Server.APIVersion}} (min {{.Server.MinAPIVersion}})",
    ]))?;
    let podman = process::stdout_of(images::PODMAN.cli().args([
        "info",
        "--format",
        "podman {{.Version.Version}} (API {{.Version.APIVersion}}), cgroup {{.Host.CgroupsVersion}} ({{.Host.CgroupManager}}), runtime {{.Host.OCIRuntime.Name}}",
    ]))?;
    // Each live container holds about a dozen of its engine's descriptors
    // (docs/benchmarks.md), so this bounds how many sandboxes the machine can hold.
    let open_files = [&DOCKERD, &PODMAN]
        .iter()
        .map(|d| {
            let limit = d
                .running_pid()
                .and_then(Daemon::open_files_limit)
                .map_or_else(|| "unknown".to_string(), |n| n.to_string());
            format!("{} {limit}", d.name)
        })
        .collect::<Vec<_>>()
        .join(", ");
    Ok((
        (),
        format!("{docker}, {docker_api}; {podman}; open files: {open_files}"),
    ))
}
