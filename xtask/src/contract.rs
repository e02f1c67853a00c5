//! `cargo xtask contract <fake|docker|podman>`: one adapter's conformance suite, i.e.
//! `$CARGO test -p sandbox-<backend> --test contract`.
//!
//! An engine that does not answer is a skip with the reason printed locally, and a loud
//! failure when `CI=true` or `SBX_CONTRACT_REQUIRED=1` (SPEC §10): CI must never go green
//! because Docker was not there.
//!
//! Any ignored trial fails the run (an ignored security trial is an unproven one):
//! `--allow-ignored` tolerates them for local use by setting `SBX_CONTRACT_ALLOW_IGNORED=1`
//! for the test binary. Trials "not applicable" on an in-process backend (kernel evidence
//! on the fake) are counted apart and never fail it.
//!
//! Docker runs the suite twice: on `runc`, then on gVisor (`SBX_DOCKER_RUNTIME=runsc`)
//! when the engine registers a `runsc` runtime. Without it the gVisor run is a skip with
//! the reason locally and a failure in CI (`cargo xtask setup` registers it). Both runs
//! happen even when the first fails; each prints its duration.

use std::path::Path;
use std::process::Command;
use std::str::FromStr;
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

    fn package(self) -> String {
        format!("sandbox-{}", self.name())
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
    if backend != Backend::Docker {
        return run_once(backend, None, options, passthrough);
    }
    let mut failed = Vec::new();
    if let Err(err) = run_once(backend, Some("runc"), options, passthrough) {
        eprintln!("{err:#}");
        failed.push("runc");
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

/// One `cargo test -p sandbox-<backend> --test contract` run, with `SBX_DOCKER_RUNTIME`
/// set when `runtime` is given; prints the outcome and duration.
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
    let mut cmd = process::cargo();
    cmd.args(["test", "-p", &backend.package(), "--test", "contract"]);
    if let Some(r) = runtime {
        cmd.env("SBX_DOCKER_RUNTIME", r);
    }
    // The suite itself fails on ignored trials; only an explicit flag relaxes that, and
    // an inherited variable must not relax it silently.
    if options.allow_ignored {
        cmd.env("SBX_CONTRACT_ALLOW_IGNORED", "1");
    } else {
        cmd.env_remove("SBX_CONTRACT_ALLOW_IGNORED");
    }
    if !passthrough.is_empty() {
        cmd.arg("--").args(passthrough);
    }
    let mut env = runtime
        .map(|r| format!("SBX_DOCKER_RUNTIME={r} "))
        .unwrap_or_default();
    if options.allow_ignored {
        env.push_str("SBX_CONTRACT_ALLOW_IGNORED=1 ");
    }
    println!("contract {label}: {env}{}", process::describe(&cmd));
    let start = Instant::now();
    let result = process::run(&mut cmd);
    let took = seconds(start.elapsed());
    match &result {
        Ok(()) => println!("contract {label}: passed in {took}"),
        Err(_) => println!("contract {label}: FAILED after {took}"),
    }
    result.with_context(|| format!("contract {label}"))
}

/// Whether the Docker engine registers an OCI runtime named `name` (`GET /info`
/// `Runtimes`, over the unix socket; `docker info` for other endpoints).
fn docker_has_runtime(name: &str) -> Result<bool> {
    let host = daemons::docker_host();
    let runtimes = match host.strip_prefix("unix://") {
        Some(socket) => {
            let (status, body) = daemons::http_get_unix(Path::new(socket), "/info")
                .with_context(|| format!("GET /info on {host}"))?;
            if status != 200 {
                bail!("GET /info on {host}: HTTP {status}");
            }
            json_object(&body, "Runtimes")
                .with_context(|| format!("GET /info on {host} has no Runtimes object"))?
                .to_string()
        }
        None => process::stdout_of(Command::new("docker").args([
            "info",
            "--format",
            "{{json .Runtimes}}",
        ]))?,
    };
    Ok(runtimes.contains(&format!("\"{name}\":")))
}

/// The text of the JSON object value of the first `"key":` in `json` (braces balanced,
/// strings skipped). Enough for `/info`'s `Runtimes` without a JSON dependency.
fn json_object<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{key}\":"))?;
    let rest = &json[at + key.len() + 3..];
    let open = rest.find(|c: char| !c.is_whitespace())?;
    if !rest[open..].starts_with('{') {
        return None;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, c) in rest[open..].char_indices() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => in_string = false,
            (true, false, _) => {}
            (false, _, '"') => in_string = true,
            (false, _, '{') => depth += 1,
            (false, _, '}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(&rest[open..open + i + 1]);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_object_is_found_with_nested_braces_and_strings() {
        let info = r#"{"Name":"x","Runtimes":{"runc":{"path":"runc"},"runsc":{"path":"/usr/bin/runsc","runtimeArgs":["--network=none","}"]}},"Swarm":{}}"#;
        let r = json_object(info, "Runtimes").unwrap();
        assert!(r.starts_with("{\"runc\"") && r.ends_with("]}}"));
        assert!(r.contains("\"runsc\":"));
        assert!(json_object(r#"{"Runtimes": 3}"#, "Runtimes").is_none());
        assert!(json_object("{}", "Runtimes").is_none());
    }

    #[test]
    fn allow_ignored_is_explicit() {
        assert_eq!(Options::parse(&[]).unwrap(), Options::default());
        assert!(!Options::default().allow_ignored);
        assert!(Options::parse(&["--allow-ignored"]).unwrap().allow_ignored);
        assert!(Options::parse(&["--allow-ignore"]).is_err());
    }
}
