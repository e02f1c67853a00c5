//! `cargo xtask contract <fake|docker|podman>`: one adapter's conformance suite, i.e.
//! `$CARGO test -p sandbox-<backend> --test contract`.
//!
//! An engine that does not answer is a skip with the reason printed locally, and a loud
//! failure when `CI=true` or `SBX_CONTRACT_REQUIRED=1` (SPEC §10): CI must never go green
//! because Docker was not there.

use std::str::FromStr;

use anyhow::{Result, bail};

use crate::daemons;
use crate::process;

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

/// Whether a missing engine must fail rather than skip.
pub fn engines_required() -> bool {
    let set =
        |var: &str| std::env::var(var).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    set("CI") || set("SBX_CONTRACT_REQUIRED")
}

/// Runs the suite; `passthrough` goes to the test binary (e.g. a trial name filter).
pub fn run(backend: Backend, passthrough: &[String]) -> Result<()> {
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
    let mut cmd = process::cargo();
    cmd.args(["test", "-p", &backend.package(), "--test", "contract"]);
    if !passthrough.is_empty() {
        cmd.arg("--").args(passthrough);
    }
    println!("contract {}: {}", backend.name(), process::describe(&cmd));
    process::run(&mut cmd)
}
