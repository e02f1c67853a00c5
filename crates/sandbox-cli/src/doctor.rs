//! `sandbox doctor`: health of every engine, with a fix for each problem.
//!
//! Exit 0 when the default engine (Docker, when compiled in) is healthy — or, with
//! `--engine`, when every selected engine is; else 1. The fake is always healthy, so it
//! never makes a broken Docker setup look fine.

use std::time::Duration;

use sandbox::{EngineReport, SandboxError};
use serde::Serialize;

use crate::cli::DoctorArgs;
use crate::exit_code;
use crate::output::{Out, redact_endpoint};

/// How long one engine may take to answer.
pub const ENGINE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize)]
struct Image {
    name: String,
    present: bool,
}

#[derive(Debug, Serialize)]
struct Problem {
    problem: String,
    fix: String,
}

/// One engine in `doctor --json`.
#[derive(Debug, Serialize)]
struct Engine {
    backend: String,
    default: bool,
    healthy: bool,
    reachable: bool,
    version: Option<String>,
    endpoint: String,
    /// Why this endpoint (`DOCKER_HOST`, "docker context `x`", "rootless socket", "default").
    #[serde(skip_serializing_if = "Option::is_none")]
    endpoint_reason: Option<String>,
    runtimes: Vec<String>,
    images: Vec<Image>,
    tier: String,
    /// Whether egress allowlists (`--allow-host`) can be enforced on this engine from
    /// this host; `null` when the engine was not reached.
    egress_allowlist: Option<bool>,
    /// How to make them available, when they are not.
    #[serde(skip_serializing_if = "Option::is_none")]
    egress_allowlist_fix: Option<String>,
    /// How `--disk-mb` (`Resources::disk_mb`) is enforced on this engine, or `"refused"`;
    /// `null` when the engine was not reached.
    disk_limit: Option<String>,
    /// Whether forks with memory (`sandbox fork`, `Sandbox::fork`) work on this engine as
    /// configured; `null` when the engine was not reached.
    forks: Option<bool>,
    /// What forks would need, when they are not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    forks_fix: Option<String>,
    /// Whether SSH agent forwarding (`sandbox run --ssh-agent`, `CreateOptions::ssh_agent`)
    /// works on this engine as configured; `null` when the engine was not reached.
    ssh_agent: Option<bool>,
    /// What it would need, when it is not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    ssh_agent_fix: Option<String>,
    /// Whether the git gate (`sandbox run --git-repo`, `CreateOptions::git_repo`) works on
    /// this engine as configured and git's HTTP backend is on this host; `null` when the
    /// engine was not reached.
    git_gate: Option<bool>,
    /// What it would need, when it is not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    git_gate_fix: Option<String>,
    /// Whether brokered credentials (`--credential`, `CreateOptions::credential`) work on
    /// this engine as configured; `null` when the engine was not reached.
    credentials: Option<bool>,
    /// What they would need, when they are not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    credentials_fix: Option<String>,
    problems: Vec<Problem>,
}

#[derive(Debug, Serialize)]
struct DoctorReport {
    ok: bool,
    default_engine: String,
    engines: Vec<Engine>,
}

pub async fn doctor(args: DoctorArgs, out: Out) -> sandbox::Result<u8> {
    let selected = selected_engines(&args.engines)?;
    let mut engines = Vec::new();
    for scheme in &selected {
        let (report, caps) = diagnose(scheme).await;
        let mut engine = to_engine(report, scheme == sandbox::DEFAULT_SCHEME);
        let allowlist = caps.map(|c| c.contains(sandbox::Capability::EGRESS_ALLOWLIST));
        engine.egress_allowlist = allowlist;
        engine.disk_limit = caps.map(|c| {
            if c.contains(sandbox::Capability::DISK_LIMIT) {
                DISK_LIMIT_MECHANISM.to_string()
            } else {
                "refused".to_string()
            }
        });
        if allowlist == Some(false) && scheme != "fake" {
            engine.egress_allowlist_fix = Some(ALLOWLIST_FIX.to_string());
        }
        engine.forks = caps.map(|c| c.contains(sandbox::Capability::SNAPSHOT_FORK));
        if engine.forks == Some(false) {
            engine.forks_fix = Some(forks_fix(scheme).to_string());
        }
        engine.ssh_agent = caps.map(|c| c.contains(sandbox::Capability::SSH_AGENT));
        if engine.ssh_agent == Some(false) {
            engine.ssh_agent_fix = Some(SSH_AGENT_FIX.to_string());
        }
        let backend = sandbox::git_gate::http_backend();
        engine.git_gate =
            caps.map(|c| c.contains(sandbox::Capability::GIT_GATE) && backend.is_some());
        engine.git_gate_fix = match (
            caps.map(|c| c.contains(sandbox::Capability::GIT_GATE)),
            &backend,
        ) {
            (Some(false), _) => Some(GIT_GATE_FIX.to_string()),
            (Some(true), None) => Some(GIT_BACKEND_FIX.to_string()),
            _ => None,
        };
        engine.credentials = caps.map(|c| c.contains(sandbox::Capability::CREDENTIALS));
        if engine.credentials == Some(false) {
            engine.credentials_fix = Some(CREDENTIALS_FIX.to_string());
        }
        engines.push(engine);
    }
    let ok = if args.engines.is_empty() {
        let default = engines.iter().find(|e| e.default);
        match default {
            Some(d) => d.healthy,
            None => engines.iter().any(|e| e.healthy),
        }
    } else {
        engines.iter().all(|e| e.healthy)
    };
    let report = DoctorReport {
        ok,
        default_engine: sandbox::DEFAULT_SCHEME.to_string(),
        engines,
    };
    if out.json {
        out.json_value(&report);
    } else {
        print_human(&report, &out);
    }
    Ok(if ok {
        exit_code::OK
    } else {
        exit_code::FAILURE
    })
}

/// `--engine` names (validated against what this build has), or every scheme.
pub fn selected_engines(requested: &[String]) -> sandbox::Result<Vec<String>> {
    let all = sandbox::schemes();
    if requested.is_empty() {
        return Ok(all);
    }
    for r in requested {
        if !all.contains(r) {
            return Err(SandboxError::backend_not_found(
                r.clone(),
                all,
                ["docker", "podman", "fake"]
                    .contains(&r.as_str())
                    .then(|| r.clone()),
            ));
        }
    }
    Ok(requested.to_vec())
}

/// What egress allowlists need (docs/network.md): the rules are loaded from this host
/// into each sandbox's network namespace.
/// What SSH agent forwarding needs, when a backend does not declare it.
const CREDENTIALS_FIX: &str = "brokered credentials need the sandbox's own nftables rules \
(they force the bound hosts' traffic through the proxy): Docker (runc) or Podman on this \
machine, run as root with nftables and util-linux; see docs/credentials.md";

const SSH_AGENT_FIX: &str = "SSH agent forwarding needs the in-sandbox agent, which relays the \
socket over its channel: Docker or Podman with the agent on (SBX_AGENT unset) and an engine that \
can attach; see docs/credentials.md";

/// What the git gate needs, when a backend does not declare it.
const GIT_GATE_FIX: &str = "the git gate needs the in-sandbox agent, which forwards the gate's \
port over its channel: Docker or Podman with the agent on (SBX_AGENT unset); see \
docs/credentials.md";

/// What the git gate needs on the host.
const GIT_BACKEND_FIX: &str = "git's HTTP backend (git http-backend) was not found on this \
host: install git (Debian/Ubuntu: apt-get install git)";

/// What forks with memory need on `scheme`, when its backend does not declare them.
fn forks_fix(scheme: &str) -> &'static str {
    match scheme {
        "podman" => {
            "Podman checkpoints through CRIU, which fails on this kernel; fork on Docker with \
             gVisor instead (SBX_DOCKER_RUNTIME=runsc)"
        }
        _ => {
            "forks need Docker with the gVisor runtime (SBX_DOCKER_RUNTIME=runsc), dockerd's \
             experimental features (`sudo cargo xtask setup` writes \"experimental\": true into \
             /etc/docker/daemon.json), the overlay2 storage driver, and sandbox-rs running as \
             root on the engine's host (a unix socket)"
        }
    }
}

const ALLOWLIST_FIX: &str = "run sandbox-rs as root on the engine's own host (a unix socket, \
not a remote endpoint) with nftables and nsenter installed (`sudo apt-get install -y nftables \
util-linux`), with a runtime other than runsc (gVisor's netstack bypasses the rules); see \
docs/network.md";

/// How the container engines enforce a disk limit (there is no storage quota on their
/// overlay drivers here; `ContainerSpec::scratch_paths`).
const DISK_LIMIT_MECHANISM: &str = "read-only root filesystem; the workdir, /tmp and /dev/shm are RAM-backed, each at most disk_mb";

/// Connects (bounded) and asks the backend; a failure to connect is reported as an
/// unreachable engine with the error's hint as the fix. Also the backend's capabilities
/// (`None` when it was not reached).
async fn diagnose(scheme: &str) -> (EngineReport, Option<sandbox::Capability>) {
    let target = format!("{scheme}://");
    let connected = tokio::time::timeout(ENGINE_TIMEOUT, sandbox::backend(target.as_str())).await;
    let backend = match connected {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return (unreachable(scheme, &e), None),
        Err(_) => {
            let e = SandboxError::engine_unavailable(
                scheme.to_string(),
                "unknown",
                format!("check that the {scheme} engine is running and responsive"),
            );
            return (unreachable(scheme, &e), None);
        }
    };
    let caps = backend.capabilities();
    let report = match tokio::time::timeout(ENGINE_TIMEOUT, backend.diagnose()).await {
        Ok(r) => r,
        Err(_) => {
            let mut r = EngineReport::new(scheme, "unknown");
            r.problems.push(sandbox::Problem::new(
                format!("the {scheme} engine did not answer within {ENGINE_TIMEOUT:?}"),
                format!("restart the {scheme} engine"),
            ));
            r
        }
    };
    (report, Some(caps))
}

fn unreachable(scheme: &str, e: &SandboxError) -> EngineReport {
    let endpoint = match e {
        SandboxError::EngineUnavailable { endpoint, .. } => endpoint.clone(),
        _ => "unknown".to_string(),
    };
    let mut r = EngineReport::new(scheme, endpoint);
    r.problems.push(sandbox::Problem::new(
        format!("{} ({})", e, e.code()),
        e.hint(),
    ));
    r
}

fn to_engine(r: EngineReport, default: bool) -> Engine {
    Engine {
        healthy: r.healthy(),
        default,
        backend: r.backend,
        reachable: r.reachable,
        version: r.version,
        endpoint: redact_endpoint(&r.endpoint),
        endpoint_reason: r.endpoint_reason,
        runtimes: r.runtimes,
        images: r
            .images
            .into_iter()
            .map(|(name, present)| Image { name, present })
            .collect(),
        tier: r.tier.to_string(),
        egress_allowlist: None,
        egress_allowlist_fix: None,
        disk_limit: None,
        forks: None,
        forks_fix: None,
        ssh_agent: None,
        ssh_agent_fix: None,
        git_gate: None,
        git_gate_fix: None,
        credentials: None,
        credentials_fix: None,
        problems: r
            .problems
            .into_iter()
            .map(|p| Problem {
                problem: p.problem,
                fix: p.fix,
            })
            .collect(),
    }
}

fn print_human(report: &DoctorReport, out: &Out) {
    // Versions, runtime names and problem texts come from the engine (a remote one, with
    // DOCKER_HOST): shown escaped, like everything that is not ours.
    use crate::terminal::escape_text as esc;
    for e in &report.engines {
        let state = if e.healthy {
            out.green("healthy")
        } else if e.reachable {
            out.yellow("degraded")
        } else {
            out.red("unreachable")
        };
        let default = if e.default { " (default)" } else { "" };
        out.line(format!("{}{default}: {state}", out.bold(&e.backend)));
        match &e.endpoint_reason {
            Some(why) => out.line(format!("  endpoint: {} ({})", esc(&e.endpoint), esc(why))),
            None => out.line(format!("  endpoint: {}", esc(&e.endpoint))),
        }
        if let Some(v) = &e.version {
            out.line(format!("  version:  {}", esc(v)));
        }
        if !e.runtimes.is_empty() {
            out.line(format!("  runtimes: {}", esc(&e.runtimes.join(", "))));
        }
        for i in &e.images {
            let mark = if i.present {
                out.green("present")
            } else {
                out.red("missing")
            };
            out.line(format!("  image:    {} ({mark})", i.name));
        }
        out.line(format!("  tier:     {}", e.tier));
        match e.egress_allowlist {
            Some(true) => out.line(format!("  allowlist: {}", out.green("available"))),
            Some(false) => {
                out.line(format!("  allowlist: {}", out.yellow("unavailable")));
                if let Some(fix) = &e.egress_allowlist_fix {
                    out.line(format!("  {}     {}", out.bold("fix:"), fix));
                }
            }
            None => {}
        }
        if let Some(d) = &e.disk_limit {
            out.line(format!("  disk limit: {d}"));
        }
        match e.forks {
            Some(true) => out.line(format!("  forks:    {}", out.green("available"))),
            Some(false) => {
                out.line(format!("  forks:    {}", out.yellow("unavailable")));
                if let Some(fix) = &e.forks_fix {
                    out.line(format!("  {}     {}", out.bold("fix:"), fix));
                }
            }
            None => {}
        }
        match e.ssh_agent {
            Some(true) => out.line(format!("  ssh agent: {}", out.green("available"))),
            Some(false) => {
                out.line(format!("  ssh agent: {}", out.yellow("unavailable")));
                if let Some(fix) = &e.ssh_agent_fix {
                    out.line(format!("  {}     {}", out.bold("fix:"), fix));
                }
            }
            None => {}
        }
        match e.git_gate {
            Some(true) => out.line(format!(
                "  git gate: {} (git http-backend found)",
                out.green("available")
            )),
            Some(false) => {
                out.line(format!("  git gate: {}", out.yellow("unavailable")));
                if let Some(fix) = &e.git_gate_fix {
                    out.line(format!("  {}     {}", out.bold("fix:"), fix));
                }
            }
            None => {}
        }
        match e.credentials {
            Some(true) => out.line(format!("  credentials: {}", out.green("available"))),
            Some(false) => {
                out.line(format!("  credentials: {}", out.yellow("unavailable")));
                if let Some(fix) = &e.credentials_fix {
                    out.line(format!("  {}     {}", out.bold("fix:"), fix));
                }
            }
            None => {}
        }
        for p in &e.problems {
            out.line(format!("  {} {}", out.red("problem:"), esc(&p.problem)));
            out.line(format!("  {}     {}", out.bold("fix:"), esc(&p.fix)));
        }
    }
    out.line(if report.ok {
        out.green("doctor: ok")
    } else {
        out.red("doctor: problems found")
    });
}
