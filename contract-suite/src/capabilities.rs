//! Contract trials: capability honesty (every declared flag has trials; every undeclared
//! flag, when invoked, refuses with `CapabilityNotSupported`).

use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, CodeOptions, ErrorCode, NetworkPolicy, Resources, RunOptions};

use crate::ctx::{Ctx, must_code};

const AREA: &str = "capabilities";

/// Which areas hold the positive trials of each capability flag the suite can test.
/// Flags missing here (GPU, TUNNELS) have no positive
/// trials yet, so an adapter must not declare them.
pub const COVERED: &[(C, &str)] = &[
    (C::RUN_COMMAND, "run, lifecycle, cancellation, hardening"),
    (C::RUN_CODE, "run_code"),
    (C::STATEFUL_CODE, "run_code"),
    (C::STREAMING, "streaming, cancellation"),
    (C::FILESYSTEM, "files"),
    (C::UPLOAD_DOWNLOAD, "files"),
    (C::NETWORK_POLICY, "policy, hardening"),
    (C::EGRESS_ALLOWLIST, "policy, egress"),
    (C::INGRESS_PORTS, "policy"),
    (C::STDIN, "run, streaming"),
    (C::DISK_LIMIT, "disk"),
    (C::PTY, "pty"),
    (C::PAUSE_RESUME, "pause"),
    (C::SNAPSHOT, "snapshot"),
    (C::SNAPSHOT_FORK, "fork"),
    (C::AGENT, "lifecycle"),
    (C::EXTEND_LIFETIME, "lifetime"),
    (C::IDLE_TIMEOUT, "lifetime"),
    (C::RESET_PROCESSES, "hostile"),
    (C::LIVE_EGRESS, "egress_live"),
    (C::STOP_START, "stopstart"),
    (C::HOST_PORTS, "host_ports"),
    (C::SSH_AGENT, "ssh_agent"),
    (C::GIT_GATE, "git_gate"),
    (C::CREDENTIALS, "credentials"),
];

/// The flags [`COVERED`] lists.
pub fn covered_flags() -> C {
    COVERED.iter().fold(C::empty(), |acc, (c, _)| acc | *c)
}

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    vec![
        ctx.trial(
            AREA,
            "declared_flags_have_trials",
            &[],
            declared_flags_have_trials,
        ),
        ctx.trial(
            AREA,
            "every_undeclared_flag_refuses",
            &[],
            every_undeclared_flag_refuses,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// Every flag the backend or a default sandbox declares has positive trials in this suite.
async fn declared_flags_have_trials(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("declared_flags_have_trials")).await?;
    let declared = ctx.caps | sb.capabilities();
    sb.kill().await?;
    let untested = declared - covered_flags();
    ensure!(
        untested.is_empty(),
        "declared capabilities without contract trials: {untested} (a declared flag MUST \
         have passing contract trials; add trials or stop declaring it)"
    );
    Ok(())
}

/// A refusal names the capability it lacks (the typed field, not the message), and its
/// hint names every backend the error lists as having it.
fn names_the_flag(e: &sandbox_core::SandboxError, flag: C) -> anyhow::Result<()> {
    let sandbox_core::SandboxError::CapabilityNotSupported {
        capability,
        supported_by,
        ..
    } = e
    else {
        bail!("not a CapabilityNotSupported: {}", e.render());
    };
    ensure!(
        capability.contains(flag),
        "the refusal of {flag} names {capability} instead"
    );
    let hint = e.hint();
    for b in supported_by {
        ensure!(
            hint.contains(b.as_str()),
            "the hint of the {flag} refusal does not name {b}, which has it"
        );
    }
    Ok(())
}

/// Every undeclared flag with an entry point refuses with `CapabilityNotSupported` from
/// that entry point (run, run with stdin, run on a terminal, run_code, run_code with a context, stream,
/// files, upload, download, pause, resume, extend, set_egress, egress, snapshot, fork, stop, start, reset_processes, create with an allowlist / a host port / ingress port / GPU /
/// disk limit / a required agent / an idle limit / a maximum lifetime / ssh agent forwarding / a credential / any policy).
async fn every_undeclared_flag_refuses(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("every_undeclared_flag_refuses");
    let mut checked = Vec::new();
    // Creation-time flags (backend level).
    let create_flags = [
        (
            C::EGRESS_ALLOWLIST,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list(["example.org"])),
        ),
        (
            C::INGRESS_PORTS,
            ctx.opts(&c)
                .network(NetworkPolicy::deny().ingress_port(8080)),
        ),
        (C::GPU, ctx.opts(&c).resources(Resources::default().gpu(1))),
        (
            C::DISK_LIMIT,
            ctx.opts(&c).resources(Resources::default().disk_mb(64)),
        ),
        (C::AGENT, ctx.opts(&c).require_agent(true)),
        (
            C::IDLE_TIMEOUT,
            ctx.opts(&c).idle_timeout(std::time::Duration::from_secs(3)),
        ),
        (
            C::EXTEND_LIFETIME,
            ctx.opts(&c)
                .max_lifetime(ctx.opts(&c).timeout + std::time::Duration::from_secs(60)),
        ),
        (
            C::HOST_PORTS,
            ctx.opts(&c).network(NetworkPolicy::deny().host_port(
                sandbox_core::HostPort::new(8080).map_err(|e| anyhow::anyhow!("{}", e.render()))?,
            )),
        ),
        (
            C::SSH_AGENT,
            // Refused before the agent is looked for: no agent needs to run.
            ctx.opts(&c)
                .ssh_agent(sandbox_core::SshAgentOptions::all_keys()),
        ),
        (
            C::GIT_GATE,
            // Refused before the repository is looked at: the capability comes first.
            ctx.opts(&c).git_repo(sandbox_core::GitRepo::new(
                std::env::temp_dir(),
                sandbox_core::GitAccess::ReadOnly,
            )),
        ),
        (
            C::CREDENTIALS,
            // Egress Allow: the only other flag it needs is NETWORK_POLICY's.
            ctx.opts(&c)
                .network(NetworkPolicy::allow())
                .credential(sandbox_core::Credential::new(
                    "API_KEY",
                    "not-a-real-secret",
                    ["api.example.com"],
                    sandbox_core::Placement::header("X-Api-Key"),
                )),
        ),
        (C::NETWORK_POLICY, ctx.opts(&c)),
    ];
    for (flag, opts) in create_flags {
        if ctx.caps.contains(flag) {
            continue;
        }
        let e = must_code(
            ctx.backend.create(opts).await,
            ErrorCode::CapabilityNotSupported,
        )
        .with_context(|| format!("create needing undeclared {flag}"))?;
        names_the_flag(&e, flag)?;
        checked.push(flag);
    }
    if !ctx.caps.contains(C::NETWORK_POLICY) {
        // Nothing can be created; the instance-level flags cannot be reached.
        return all_reachable_checked(ctx.caps, C::empty(), &checked);
    }
    // Instance-level flags.
    let sb = ctx.sandbox(&c).await?;
    let caps = sb.capabilities();
    let refused = |flag: C, r: sandbox_core::Result<()>| -> anyhow::Result<()> {
        let e = must_code(r, ErrorCode::CapabilityNotSupported)
            .with_context(|| format!("invoking undeclared {flag}"))?;
        names_the_flag(&e, flag)
    };
    if !caps.contains(C::RUN_COMMAND) {
        refused(
            C::RUN_COMMAND,
            sb.run(["true"].into(), RunOptions::default())
                .await
                .map(|_| ()),
        )?;
        checked.push(C::RUN_COMMAND);
    }
    if !caps.contains(C::RUN_CODE) {
        refused(
            C::RUN_CODE,
            sb.run_code("print(1)", CodeOptions::default())
                .await
                .map(|_| ()),
        )?;
        checked.push(C::RUN_CODE);
    }
    if !caps.contains(C::STATEFUL_CODE) {
        refused(
            C::STATEFUL_CODE,
            sb.run_code("x = 1", CodeOptions::default().context("cap-check"))
                .await
                .map(|_| ()),
        )?;
        checked.push(C::STATEFUL_CODE);
    }
    if caps.contains(C::RUN_COMMAND) && !caps.contains(C::STDIN) {
        refused(
            C::STDIN,
            sb.run(["cat"].into(), RunOptions::default().stdin("x"))
                .await
                .map(|_| ()),
        )?;
        checked.push(C::STDIN);
    }
    if caps.contains(C::RUN_COMMAND) && !caps.contains(C::PTY) {
        refused(
            C::PTY,
            sb.run(
                ["true"].into(),
                RunOptions::default().pty(sandbox_core::PtySize::default()),
            )
            .await
            .map(|_| ()),
        )?;
        checked.push(C::PTY);
    }
    if !caps.contains(C::STREAMING) {
        refused(
            C::STREAMING,
            sb.stream(["true"].into(), RunOptions::default())
                .map(|_| ()),
        )?;
        checked.push(C::STREAMING);
    }
    match sb.files() {
        Err(e) => {
            ensure!(
                !caps.contains(C::FILESYSTEM),
                "files() fails although FILESYSTEM is declared: {}",
                e.render()
            );
            ensure!(
                e.code() == ErrorCode::CapabilityNotSupported,
                "files() without FILESYSTEM: {}",
                e.render()
            );
            checked.push(C::FILESYSTEM);
        }
        Ok(f) => {
            if !caps.contains(C::FILESYSTEM) {
                bail!("files() returned a filesystem although FILESYSTEM is undeclared");
            }
            if !caps.contains(C::UPLOAD_DOWNLOAD) {
                let dir = tempfile::tempdir()?;
                let local = dir.path().join("x");
                std::fs::write(&local, "x")?;
                refused(C::UPLOAD_DOWNLOAD, f.upload(&local, "/work/x").await)?;
                f.write("/work/y", Bytes::from("y"))
                    .await
                    .map_err(|e| anyhow::anyhow!("write: {}", e.render()))?;
                refused(
                    C::UPLOAD_DOWNLOAD,
                    f.download("/work/y", &dir.path().join("y")).await,
                )?;
                checked.push(C::UPLOAD_DOWNLOAD);
            }
        }
    }
    if !caps.contains(C::LIVE_EGRESS) {
        refused(
            C::LIVE_EGRESS,
            sb.set_egress(sandbox_core::Egress::Deny).await,
        )?;
        refused(C::LIVE_EGRESS, sb.egress().await.map(|_| ()))?;
        checked.push(C::LIVE_EGRESS);
    }
    if !caps.contains(C::PAUSE_RESUME) {
        refused(C::PAUSE_RESUME, sb.pause().await)?;
        refused(C::PAUSE_RESUME, sb.resume().await)?;
        checked.push(C::PAUSE_RESUME);
    }
    if !caps.contains(C::EXTEND_LIFETIME) {
        refused(
            C::EXTEND_LIFETIME,
            sb.extend(std::time::Duration::from_secs(1))
                .await
                .map(|_| ()),
        )?;
        checked.push(C::EXTEND_LIFETIME);
    }
    if !caps.contains(C::SNAPSHOT) {
        refused(C::SNAPSHOT, sb.snapshot().await.map(|_| ()))?;
        checked.push(C::SNAPSHOT);
    }
    if !caps.contains(C::RESET_PROCESSES) {
        refused(C::RESET_PROCESSES, sb.reset_processes().await.map(|_| ()))?;
        checked.push(C::RESET_PROCESSES);
    }
    if !caps.contains(C::STOP_START) {
        refused(C::STOP_START, sb.stop().await)?;
        refused(C::STOP_START, sb.start().await)?;
        checked.push(C::STOP_START);
    }
    if !caps.contains(C::SNAPSHOT_FORK) {
        refused(
            C::SNAPSHOT_FORK,
            sb.fork(sandbox_core::ForkOptions::new(1)).await.map(|_| ()),
        )?;
        checked.push(C::SNAPSHOT_FORK);
    }
    // TUNNELS has no entry point in the traits yet, so an undeclared one cannot be
    // invoked at all.
    let files_refused = sb.files().is_err();
    sb.kill().await?;
    let mut unreachable = if files_refused {
        C::UPLOAD_DOWNLOAD
    } else {
        C::empty()
    };
    if !caps.contains(C::RUN_COMMAND) {
        // Input and terminals are options of `run`: refused as RUN_COMMAND first.
        unreachable |= C::STDIN | C::PTY;
    }
    all_reachable_checked(ctx.caps | caps, unreachable, &checked)
}

/// Every flag with an entry point that is neither declared nor unreachable must have been
/// invoked and refused: a check that silently covers fewer flags proves less.
fn all_reachable_checked(declared: C, unreachable: C, checked: &[C]) -> anyhow::Result<()> {
    let with_entry_point = C::RUN_COMMAND
        | C::RUN_CODE
        | C::STATEFUL_CODE
        | C::STREAMING
        | C::FILESYSTEM
        | C::UPLOAD_DOWNLOAD
        | C::NETWORK_POLICY
        | C::EGRESS_ALLOWLIST
        | C::INGRESS_PORTS
        | C::GPU
        | C::STDIN
        | C::DISK_LIMIT
        | C::PTY
        | C::PAUSE_RESUME
        | C::AGENT
        | C::EXTEND_LIFETIME
        | C::IDLE_TIMEOUT
        | C::SNAPSHOT
        | C::RESET_PROCESSES
        | C::LIVE_EGRESS
        | C::STOP_START
        | C::SNAPSHOT_FORK
        | C::HOST_PORTS
        | C::SSH_AGENT
        | C::GIT_GATE
        | C::CREDENTIALS;
    let expected = with_entry_point - declared - unreachable;
    let got = checked.iter().fold(C::empty(), |acc, c| acc | *c);
    ensure!(
        got == expected,
        "undeclared flags refused: {got}; expected every undeclared flag with an entry point: \
         {expected}"
    );
    Ok(())
}
