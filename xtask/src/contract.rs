//! `cargo xtask contract <fake|docker|podman>`: one adapter's conformance suite, i.e. the
//! `contract` test binary of `sandbox-<backend>`.
//!
//! The binaries are built with `cargo test --workspace --test contract --no-run`, not
//! `-p sandbox-rs-<backend>`: with `-p`, cargo unifies dependency features over that one
//! package, so every dependency (tokio, hyper, …) is compiled a second time next to the
//! `cargo test --workspace` build. That doubled the target directory and ran a CI machine
//! out of disk; built for the whole workspace, the suites reuse every artifact.
//!
//! An engine that does not answer is a skip with the reason printed locally, and a loud
//! failure when `CI=true` or `SBX_CONTRACT_REQUIRED=1`: CI must never go green
//! because Docker was not there.
//!
//! Any ignored trial fails the run (an ignored security trial is an unproven one):
//! `--allow-ignored` tolerates them for local use by setting `SBX_CONTRACT_ALLOW_IGNORED=1`
//! for the test binary. Trials "not applicable" on an in-process backend (kernel evidence
//! on the fake) are counted apart and never fail it.
//!
//! Every run uses the in-sandbox agent (the adapters' default; an inherited `SBX_AGENT`
//! is removed), except one per engine on the engine's exec path (`SBX_AGENT=off`), so
//! both paths stay conformant (docs/agent.md).
//!
//! Docker runs the suite three times: on `runc`, on runc's exec path, then on gVisor
//! (`SBX_DOCKER_RUNTIME=runsc`) when the engine registers a `runsc` runtime. Without it the gVisor run is a skip with
//! the reason locally and a failure in CI (`cargo xtask setup` registers it). Both runs
//! happen even when the first fails; each prints its duration.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::daemons;
use crate::process;
use crate::report::seconds;

/// A backend with a contract-suite entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `sandbox-fake`: in memory, always available.
    Fake,
    /// `sandbox-docker`: needs a Docker engine.
    Docker,
    /// `sandbox-podman`: needs the Podman API service.
    Podman,
}

impl Backend {
    /// All backends, in the order `cargo xtask test` runs them.
    pub const ALL: [Backend; 3] = [Backend::Fake, Backend::Docker, Backend::Podman];

    /// The lowercase name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Fake => "fake",
            Backend::Docker => "docker",
            Backend::Podman => "podman",
        }
    }

    /// The package's directory, relative to the workspace root.
    fn package_dir(self) -> PathBuf {
        Path::new("crates").join(format!("sandbox-{}", self.name()))
    }

    /// Why the backend's engine cannot be used right now, if it cannot.
    fn unavailable_reason(self) -> Option<String> {
        match self {
            Backend::Fake => None,
            Backend::Docker => {
                daemons::unreachable_reason(&daemons::docker_host(), daemons::DOCKER_PING)
                    .map(|why| format!("Docker engine not reachable ({why})"))
            }
            Backend::Podman => {
                daemons::unreachable_reason(&daemons::podman_host(), daemons::PODMAN_PING)
                    .map(|why| format!("Podman API service not reachable ({why})"))
            }
        }
    }
}

impl FromStr for Backend {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                anyhow::anyhow!("unknown backend {s:?}; expected fake, docker or podman")
            })
    }
}

/// How one contract run treats ignored trials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Tolerate ignored trials (`--allow-ignored`, for local use only).
    pub allow_ignored: bool,
}

impl Options {
    /// Parses the flags after the backend name.
    pub fn parse(flags: &[&str]) -> Result<Options> {
        let mut options = Options::default();
        for flag in flags {
            match *flag {
                "--allow-ignored" => options.allow_ignored = true,
                other => bail!("contract: unknown flag {other:?} (known: --allow-ignored)"),
            }
        }
        Ok(options)
    }
}

/// Whether a missing engine must fail rather than skip.
pub fn engines_required() -> bool {
    let set =
        |var: &str| std::env::var(var).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    set("CI") || set("SBX_CONTRACT_REQUIRED")
}

/// Runs the suite; `passthrough` goes to the test binary (e.g. a trial name filter).
/// Docker: once per runtime (runc, then runsc when registered).
pub fn run(backend: Backend, options: Options, passthrough: &[String]) -> Result<()> {
    if let Some(reason) = backend.unavailable_reason() {
        if engines_required() {
            bail!(
                "contract {}: {reason}. CI=true/SBX_CONTRACT_REQUIRED=1 requires it; \
                 fix: `sudo cargo xtask setup`",
                backend.name()
            );
        }
        println!(
            "contract {}: SKIPPED: {reason}. Run `sudo cargo xtask setup`; with CI=true this fails.",
            backend.name()
        );
        return Ok(());
    }
    if backend == Backend::Podman {
        let agent = run_once(backend, None, options, passthrough);
        let exec = run_once(backend, Some(EXEC_PATH), options, passthrough);
        return match (agent, exec) {
            (Ok(()), Ok(())) => Ok(()),
            (a, e) => {
                let failed: Vec<&str> = [("agent", a.is_err()), ("exec path", e.is_err())]
                    .into_iter()
                    .filter(|(_, f)| *f)
                    .map(|(n, _)| n)
                    .collect();
                bail!("contract podman failed on: {}", failed.join(", "))
            }
        };
    }
    if backend != Backend::Docker {
        return run_once(backend, None, options, passthrough);
    }
    let mut failed = Vec::new();
    if let Err(err) = run_once(backend, Some("runc"), options, passthrough) {
        eprintln!("{err:#}");
        failed.push("runc");
    }
    // The engine's exec path (the fallback for images the agent cannot run), on runc.
    if let Err(err) = run_once(backend, Some(EXEC_PATH), options, passthrough) {
        eprintln!("{err:#}");
        failed.push("exec path");
    }
    let registered = match docker_has_runtime("runsc") {
        Ok(true) => Ok(()),
        Ok(false) => Err("the Docker engine registers no `runsc` runtime".to_string()),
        Err(err) => Err(format!("cannot read the engine's runtimes: {err:#}")),
    };
    match registered {
        Ok(()) => {
            if let Err(err) = run_once(backend, Some("runsc"), options, passthrough) {
                eprintln!("{err:#}");
                failed.push("runsc");
            }
        }
        Err(why) if engines_required() => {
            eprintln!(
                "contract docker (runsc): FAILED: {why}. CI=true/SBX_CONTRACT_REQUIRED=1 \
                 requires the gVisor run; fix: `sudo cargo xtask setup` (installs runsc and \
                 registers it in /etc/docker/daemon.json)"
            );
            failed.push("runsc (not registered)");
        }
        Err(why) => println!(
            "contract docker (runsc): SKIPPED: {why}. Run `sudo cargo xtask setup`; with \
             CI=true this fails."
        ),
    }
    if !failed.is_empty() {
        bail!("contract docker failed on: {}", failed.join(", "));
    }
    Ok(())
}

/// The workspace root (xtask lives one level below it).
pub(crate) fn workspace_root() -> Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .context("xtask's manifest directory has no parent")
}

/// Builds every package's `contract` test binary once per xtask process (see the module
/// docs for why `--workspace`) and returns the one of `backend`.
fn contract_binary(backend: Backend) -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<BTreeMap<PathBuf, PathBuf>, String>> =
        OnceLock::new();
    let built = BUILT
        .get_or_init(|| build_contract_binaries().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let manifest = workspace_root()?
        .join(backend.package_dir())
        .join("Cargo.toml");
    built.get(&manifest).cloned().with_context(|| {
        format!(
            "cargo built no `contract` test binary for {} (looked for {})",
            backend.name(),
            manifest.display()
        )
    })
}

/// `cargo test --workspace --test contract --no-run`: manifest path → test executable.
fn build_contract_binaries() -> Result<BTreeMap<PathBuf, PathBuf>> {
    let mut cmd = process::cargo();
    cmd.current_dir(workspace_root()?).args([
        "test",
        "--workspace",
        "--test",
        "contract",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    println!("contract: building the suites: {}", process::describe(&cmd));
    // Diagnostics are rendered to stderr (inherited); stdout carries one JSON message per
    // line.
    let output = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{}`", process::describe(&cmd)))?;
    if !output.status.success() {
        bail!("`{}` failed ({})", process::describe(&cmd), output.status);
    }
    let stdout = String::from_utf8(output.stdout).context("cargo's JSON output is not UTF-8")?;
    let binaries = contract_executables(&stdout);
    if binaries.is_empty() {
        bail!(
            "`{}` reported no contract test binary",
            process::describe(&cmd)
        );
    }
    Ok(binaries)
}

/// The `contract` test executables in cargo's JSON messages, keyed by manifest path.
fn contract_executables(json_lines: &str) -> BTreeMap<PathBuf, PathBuf> {
    json_lines
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "contract")
        .filter_map(|m| {
            let manifest = m["manifest_path"].as_str()?;
            let exe = m["executable"].as_str()?;
            Some((PathBuf::from(manifest), PathBuf::from(exe)))
        })
        .collect()
}

/// The `runtime` of [`run_once`] that means "the engine's exec path" (`SBX_AGENT=off`)
/// rather than a Docker runtime.
const EXEC_PATH: &str = "exec path";

/// One run of `sandbox-<backend>`'s `contract` test binary, with `SBX_DOCKER_RUNTIME`
/// set when `runtime` is given (or `SBX_AGENT=off` for [`EXEC_PATH`]); prints the outcome
/// and duration.
fn run_once(
    backend: Backend,
    runtime: Option<&str>,
    options: Options,
    passthrough: &[String],
) -> Result<()> {
    let label = match runtime {
        Some(r) => format!("{} ({r})", backend.name()),
        None => backend.name().to_string(),
    };
    let binary = contract_binary(backend)?;
    let package_dir = workspace_root()?.join(backend.package_dir());
    let command = || suite_command(&binary, &package_dir, runtime, options);
    let mut cmd = command();
    if !passthrough.is_empty() {
        cmd.arg("--").args(passthrough);
    }
    let mut env = match runtime {
        Some(EXEC_PATH) => "SBX_AGENT=off ".to_string(),
        Some(r) => format!("SBX_DOCKER_RUNTIME={r} "),
        None => String::new(),
    };
    if options.allow_ignored {
        env.push_str("SBX_CONTRACT_ALLOW_IGNORED=1 ");
    }
    println!("contract {label}: {env}{}", process::describe(&cmd));
    let start = Instant::now();
    let digest_label = format!("contract {label}");
    let mut result = crate::digest::run_teed(&mut cmd, &digest_label);
    if result.is_err() {
        let failed = crate::digest::failed_in_log(&digest_label);
        if !failed.is_empty()
            && failed.len() <= MAX_RERUNS
            && rerun_alone(&command, &failed, &label)
        {
            crate::digest::note_flaky(&digest_label, &failed)?;
            result = Ok(());
        }
    }
    let took = seconds(start.elapsed());
    match &result {
        Ok(()) => println!("contract {label}: passed in {took}"),
        Err(_) => println!("contract {label}: FAILED after {took}"),
    }
    result.with_context(|| format!("contract {label}"))
}

/// Most failed trials a run reruns (about a sixth of the suite); more than that is not
/// a flake.
const MAX_RERUNS: usize = 40;

/// Reruns each of `failed` alone (`--exact`, one thread), once; true when every one
/// passes. Trials that fail only beside others on a loaded two-core CI machine (an
/// engine's removal slower than the teardown grace) pass here and are reported as flaky
/// in the digest; a trial that fails again fails the run, as does a run whose failure
/// was not a trial (the leak check, a crash).
fn rerun_alone(command: &dyn Fn() -> Command, failed: &[String], label: &str) -> bool {
    let mut all = true;
    for name in failed {
        let mut cmd = command();
        cmd.args(["--exact", "--test-threads", "1", name]);
        println!("contract {label}: rerunning alone: {name}");
        match process::run(&mut cmd) {
            Ok(()) => println!("contract {label}: FLAKY (passed alone): {name}"),
            Err(_) => {
                println!("contract {label}: failed again alone: {name}");
                all = false;
            }
        }
    }
    all
}

/// The contract binary's command for `runtime` (see [`run_once`]), without arguments.
fn suite_command(
    binary: &Path,
    package_dir: &Path,
    runtime: Option<&str>,
    options: Options,
) -> Command {
    let mut cmd = Command::new(binary);
    // What `cargo test` gives a test binary: the package directory as working directory
    // and as CARGO_MANIFEST_DIR.
    cmd.current_dir(package_dir)
        .env("CARGO_MANIFEST_DIR", package_dir);
    cmd.env_remove("SBX_AGENT");
    match runtime {
        Some(EXEC_PATH) => {
            cmd.env("SBX_AGENT", "off");
        }
        Some(r) => {
            cmd.env("SBX_DOCKER_RUNTIME", r);
        }
        None => {}
    }
    // The suite itself fails on ignored trials; only an explicit flag relaxes that, and
    // an inherited variable must not relax it silently.
    if options.allow_ignored {
        cmd.env("SBX_CONTRACT_ALLOW_IGNORED", "1");
    } else {
        cmd.env_remove("SBX_CONTRACT_ALLOW_IGNORED");
    }
    cmd
}

/// Whether the Docker engine registers an OCI runtime named `name` (`GET /info`
/// `Runtimes`, over the unix socket; `docker info` for other endpoints).
fn docker_has_runtime(name: &str) -> Result<bool> {
    let host = daemons::docker_host();
    let runtimes: serde_json::Value = match host.strip_prefix("unix://") {
        Some(socket) => {
            let (status, body) = daemons::http_get_unix(Path::new(socket), "/info")
                .with_context(|| format!("GET /info on {host}"))?;
            if status != 200 {
                bail!("GET /info on {host}: HTTP {status}");
            }
            let info: serde_json::Value = serde_json::from_str(&body)
                .with_context(|| format!("GET /info on {host}: not JSON"))?;
            info.get("Runtimes")
                .cloned()
                .with_context(|| format!("GET /info on {host} has no Runtimes object"))?
        }
        None => serde_json::from_str(&process::stdout_of(Command::new("docker").args([
            "info",
            "--format",
            "{{json .Runtimes}}",
        ]))?)
        .context("`docker info --format {{json .Runtimes}}`: not JSON")?,
    };
    registers_runtime(&runtimes, name)
}

/// Whether a `Runtimes` object names `name`; anything but an object is an error (a check
/// that cannot answer fails).
fn registers_runtime(runtimes: &serde_json::Value, name: &str) -> Result<bool> {
    let map = runtimes
        .as_object()
        .with_context(|| format!("the engine's Runtimes is not an object: {runtimes}"))?;
    Ok(map.contains_key(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_are_read_from_the_object_keys() {
        let info: serde_json::Value = serde_json::from_str(
            r#"{"runc":{"path":"runc"},"runsc-debug":{"path":"/usr/bin/runsc","runtimeArgs":["runsc"]}}"#,
        )
        .unwrap();
        assert!(registers_runtime(&info, "runc").unwrap());
        assert!(!registers_runtime(&info, "runsc").unwrap());
        assert!(registers_runtime(&serde_json::json!(3), "runc").is_err());
    }

    #[test]
    fn contract_executables_are_keyed_by_manifest() {
        let lines = concat!(
            r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/sandbox-fake/Cargo.toml","target":{"name":"contract"},"executable":"/w/target/debug/deps/contract-1"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/sandbox-fake/Cargo.toml","target":{"name":"sandbox_fake"},"executable":null}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
            "\nnot json\n",
        );
        let map = contract_executables(lines);
        assert_eq!(map.len(), 1);
        assert_eq!(
            map[Path::new("/w/crates/sandbox-fake/Cargo.toml")],
            Path::new("/w/target/debug/deps/contract-1")
        );
    }

    #[test]
    fn allow_ignored_is_explicit() {
        assert_eq!(Options::parse(&[]).unwrap(), Options::default());
        assert!(!Options::default().allow_ignored);
        assert!(Options::parse(&["--allow-ignored"]).unwrap().allow_ignored);
        assert!(Options::parse(&["--allow-ignore"]).is_err());
    }
}
