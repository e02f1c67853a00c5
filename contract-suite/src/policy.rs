//! Contract trials: policy (egress deny/allow/allowlist, resource caps read back from
//! inside, refusals before provisioning).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, CreateOptions, ErrorCode, IsolationTier, NetworkPolicy, Resources, Sandbox,
};

use crate::ctx::{Ctx, Need, Skip, must_code, run};

const AREA: &str = "policy";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let r = Need::Cap(C::RUN_COMMAND);
    let net = Need::Cap(C::NETWORK_POLICY | C::RUN_COMMAND);
    vec![
        ctx.trial(
            AREA,
            "egress_deny_really_denies",
            &[net, Need::Canary],
            egress_deny_really_denies,
        ),
        ctx.trial(
            AREA,
            "deny_leaves_only_loopback",
            &[net],
            deny_leaves_only_loopback,
        ),
        ctx.trial(
            AREA,
            "allow_adds_an_interface",
            &[net],
            allow_adds_an_interface,
        ),
        ctx.trial(
            AREA,
            "allowlist_permits_only_listed_hosts",
            &[net, Need::Cap(C::EGRESS_ALLOWLIST), Need::Canary],
            allowlist_permits_only_listed_hosts,
        ),
        ctx.trial(
            AREA,
            "allowlist_refused_without_capability",
            &[Need::Lacks(C::EGRESS_ALLOWLIST)],
            allowlist_refused_without_capability,
        ),
        ctx.trial(AREA, "memory_cap_read_back", &[r], memory_cap_read_back),
        ctx.trial(AREA, "pids_cap_read_back", &[r], pids_cap_read_back),
        ctx.trial(AREA, "caps_cannot_be_unset", &[r], caps_cannot_be_unset),
        ctx.trial(AREA, "zero_resources_refused", &[], zero_resources_refused),
        ctx.trial(
            AREA,
            "gpu_refused_without_capability",
            &[Need::Lacks(C::GPU)],
            gpu_refused_without_capability,
        ),
        ctx.trial(
            AREA,
            "unbounded_lifetime_refused",
            &[],
            unbounded_lifetime_refused,
        ),
        ctx.trial(
            AREA,
            "ingress_ports_published",
            &[Need::Cap(C::INGRESS_PORTS)],
            ingress_ports_published,
        ),
        ctx.trial(
            AREA,
            "ingress_ports_refused_without_capability",
            &[Need::Lacks(C::INGRESS_PORTS)],
            ingress_ports_refused_without_capability,
        ),
        ctx.trial(
            AREA,
            "require_isolation_above_tier_refused_before_provisioning",
            &[],
            require_isolation_above_tier_refused_before_provisioning,
        ),
        ctx.trial(
            AREA,
            "env_key_with_control_chars_refused",
            &[],
            env_key_with_control_chars_refused,
        ),
        ctx.trial(
            AREA,
            "reserved_metadata_key_refused",
            &[],
            reserved_metadata_key_refused,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// Refuses `opts` with `code`, and (when the backend can list) provisions nothing.
async fn refused_before_provisioning(
    ctx: &Ctx,
    c: &str,
    opts: CreateOptions,
    code: ErrorCode,
) -> anyhow::Result<sandbox_core::SandboxError> {
    let e = must_code(ctx.backend.create(opts).await, code)?;
    if ctx.backend.as_reapable().is_some() {
        let left = ctx.listed(c).await?;
        ensure!(
            left.is_empty(),
            "a refused create provisioned {:?}",
            left.iter().map(|m| &m.id).collect::<Vec<_>>()
        );
    }
    Ok(e)
}

/// Interface names in `/proc/net/dev`.
async fn interfaces(sb: &dyn Sandbox) -> anyhow::Result<Vec<String>> {
    let r = run(sb, ["cat", "/proc/net/dev"]).await?;
    ensure!(r.exit_code == 0, "cat /proc/net/dev: {}", r.stderr_text());
    Ok(r.stdout_text()
        .lines()
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_string()))
        .filter(|n| !n.is_empty() && !n.contains('|'))
        .collect())
}

/// The first readable file among `paths`, trimmed.
pub(crate) async fn read_first(sb: &dyn Sandbox, paths: &[&str]) -> anyhow::Result<String> {
    for p in paths {
        let r = run(sb, ["cat", p]).await?;
        if r.exit_code == 0 {
            return Ok(r.stdout_text().trim().to_string());
        }
    }
    bail!("none of {paths:?} is readable inside the sandbox")
}

/// Memory limit in bytes as the sandbox sees it.
pub(crate) async fn memory_limit(sb: &dyn Sandbox) -> anyhow::Result<String> {
    read_first(
        sb,
        &[
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        ],
    )
    .await
}

/// Pids limit as the sandbox sees it.
pub(crate) async fn pids_limit(sb: &dyn Sandbox) -> anyhow::Result<String> {
    read_first(
        sb,
        &["/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"],
    )
    .await
}

/// Egress deny really denies: an `Allow` sandbox fetches the canary token (the probe
/// works), a `Deny` sandbox fails for the right reason (no route), not a missing tool.
async fn egress_deny_really_denies(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("egress_deny_really_denies");
    let canary = ctx.canary()?.clone();
    let allow = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::allow()))
        .await?;
    let r = run(&*allow, canary.probe_command()).await?;
    ensure!(
        r.stdout_text().contains(&canary.token),
        "an Allow sandbox could not reach the canary (the probe itself is broken): exit {} \
         stdout {:?} stderr {:?}",
        r.exit_code,
        r.stdout_text(),
        r.stderr_text()
    );
    allow.kill().await?;
    let deny = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::deny()))
        .await?;
    let r = run(&*deny, canary.probe_command()).await?;
    ensure!(
        !r.stdout_text().contains(&canary.token),
        "a Deny sandbox reached the canary server"
    );
    ensure!(r.exit_code != 0, "nc exited 0 under Deny");
    ensure!(
        r.exit_code != 127,
        "nc is missing (127): the denial was not proven"
    );
    let err = r.stderr_text().to_lowercase();
    ensure!(
        err.contains("unreachable") || err.contains("bad address"),
        "nc failed for another reason than no route: {:?}",
        r.stderr_text()
    );
    deny.kill().await
}

/// Under egress deny the only interface is `lo`.
async fn deny_leaves_only_loopback(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("deny_leaves_only_loopback");
    let sb = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::deny()))
        .await?;
    let ifs = interfaces(&*sb).await?;
    ensure!(ifs == ["lo"], "interfaces under deny: {ifs:?}");
    sb.kill().await
}

/// Under egress allow there is an interface besides `lo` (so the deny check is not
/// vacuous).
async fn allow_adds_an_interface(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allow_adds_an_interface");
    let sb = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::allow()))
        .await?;
    let ifs = interfaces(&*sb).await?;
    ensure!(
        ifs.iter().any(|i| i != "lo"),
        "interfaces under allow: {ifs:?}"
    );
    sb.kill().await
}

/// An allowlist reaches listed hosts only.
async fn allowlist_permits_only_listed_hosts(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allowlist_permits_only_listed_hosts");
    let canary = ctx.canary()?.clone();
    let listed = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list([canary.spec.dial_host.clone()])),
        )
        .await?;
    let r = run(&*listed, canary.probe_command()).await?;
    ensure!(
        r.stdout_text().contains(&canary.token),
        "allowlisted host not reachable: exit {} stderr {:?}",
        r.exit_code,
        r.stderr_text()
    );
    listed.kill().await?;
    // TEST-NET-1 (RFC 5737): never routed, so nothing leaves this machine.
    let other = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list(["192.0.2.1"])),
        )
        .await?;
    let r = run(&*other, canary.probe_command()).await?;
    ensure!(
        !r.stdout_text().contains(&canary.token),
        "a host outside the allowlist was reached"
    );
    ensure!(
        r.exit_code != 0 && r.exit_code != 127,
        "nc exit {} outside the allowlist",
        r.exit_code
    );
    other.kill().await
}

/// Without `EGRESS_ALLOWLIST`, an allowlist is `CapabilityNotSupported` before
/// provisioning.
async fn allowlist_refused_without_capability(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allowlist_refused_without_capability");
    refused_before_provisioning(
        &ctx,
        &c,
        ctx.opts(&c)
            .network(NetworkPolicy::allow_list(["example.org"])),
        ErrorCode::CapabilityNotSupported,
    )
    .await?;
    Ok(())
}

/// A 256 MiB memory cap reads back as 268435456 bytes inside the sandbox.
async fn memory_cap_read_back(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("memory_cap_read_back");
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c).resources(Resources::default().memory_mb(256)),
        )
        .await?;
    let m = memory_limit(&*sb).await?;
    ensure!(m == "268435456", "memory limit inside: {m:?}");
    sb.kill().await
}

/// A pids cap of 100 reads back as 100 inside the sandbox.
async fn pids_cap_read_back(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("pids_cap_read_back");
    let sb = ctx
        .create(&c, ctx.opts(&c).resources(Resources::default().pids(100)))
        .await?;
    let p = pids_limit(&*sb).await?;
    ensure!(p == "100", "pids limit inside: {p:?}");
    sb.kill().await
}

/// Default resources are concrete limits inside (512 MiB, 512 pids), never "max".
async fn caps_cannot_be_unset(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("caps_cannot_be_unset");
    let sb = ctx
        .create(&c, ctx.opts(&c).resources(Resources::default()))
        .await?;
    let m = memory_limit(&*sb).await?;
    ensure!(
        m == (512u64 * 1024 * 1024).to_string(),
        "default memory limit inside: {m:?}"
    );
    let p = pids_limit(&*sb).await?;
    ensure!(p == "512", "default pids limit inside: {p:?}");
    sb.kill().await
}

/// Zero resources are a `Configuration` error before provisioning.
async fn zero_resources_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("zero_resources_refused");
    for r in [
        Resources::default().memory_mb(0),
        Resources::default().pids(0),
        Resources::default().cpu(0.0),
    ] {
        refused_before_provisioning(
            &ctx,
            &c,
            ctx.opts(&c).resources(r),
            ErrorCode::Configuration,
        )
        .await?;
    }
    Ok(())
}

/// Without `GPU`, asking for one is `CapabilityNotSupported` before provisioning.
async fn gpu_refused_without_capability(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("gpu_refused_without_capability");
    refused_before_provisioning(
        &ctx,
        &c,
        ctx.opts(&c).resources(Resources::default().gpu(1)),
        ErrorCode::CapabilityNotSupported,
    )
    .await?;
    Ok(())
}

/// A zero or unbounded lifetime is a `Configuration` error before provisioning.
async fn unbounded_lifetime_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("unbounded_lifetime_refused");
    for t in [
        Duration::MAX,
        Duration::ZERO,
        Duration::from_secs(400 * 24 * 3600),
    ] {
        refused_before_provisioning(&ctx, &c, ctx.opts(&c).timeout(t), ErrorCode::Configuration)
            .await?;
    }
    Ok(())
}

/// With `INGRESS_PORTS`, a sandbox with a published port is created and usable.
async fn ingress_ports_published(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("ingress_ports_published");
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::deny().ingress_port(8080)),
        )
        .await?;
    if ctx.caps.contains(C::RUN_COMMAND) {
        let r = run(&*sb, ["true"]).await?;
        ensure!(r.exit_code == 0, "sandbox with an ingress port unusable");
    }
    sb.kill().await
}

/// Without `INGRESS_PORTS`, ingress ports are `CapabilityNotSupported` — never ignored.
async fn ingress_ports_refused_without_capability(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("ingress_ports_refused_without_capability");
    refused_before_provisioning(
        &ctx,
        &c,
        ctx.opts(&c)
            .network(NetworkPolicy::deny().ingress_port(8080)),
        ErrorCode::CapabilityNotSupported,
    )
    .await?;
    Ok(())
}

/// Requiring a tier above the backend's is refused before anything is provisioned.
async fn require_isolation_above_tier_refused_before_provisioning(
    ctx: Arc<Ctx>,
) -> anyhow::Result<()> {
    let c = case("require_isolation_above_tier_refused_before_provisioning");
    let above = match ctx.tier {
        IsolationTier::Unknown | IsolationTier::Container => IsolationTier::Gvisor,
        IsolationTier::Gvisor => IsolationTier::MicroVm,
        _ => {
            return Err(Skip(format!("backend tier {} has nothing above it", ctx.tier)).into());
        }
    };
    refused_before_provisioning(
        &ctx,
        &c,
        ctx.opts(&c).require_isolation(above),
        ErrorCode::Configuration,
    )
    .await?;
    refused_before_provisioning(
        &ctx,
        &c,
        ctx.opts(&c).require_isolation(IsolationTier::Unknown),
        ErrorCode::Configuration,
    )
    .await?;
    // Requiring exactly the backend's tier is fine.
    let sb = ctx
        .create(&c, ctx.opts(&c).require_isolation(ctx.tier))
        .await
        .context("requiring the backend's own tier")?;
    sb.kill().await
}

/// Env keys with control characters (or `=`) are refused before provisioning.
async fn env_key_with_control_chars_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("env_key_with_control_chars_refused");
    for key in ["BAD\nKEY", "BAD\u{1}", "A=B", ""] {
        refused_before_provisioning(
            &ctx,
            &c,
            ctx.opts(&c).env(key, "v"),
            ErrorCode::Configuration,
        )
        .await?;
    }
    if ctx.caps.contains(C::RUN_COMMAND) {
        let sb = ctx.sandbox(&c).await?;
        must_code(
            sb.run(
                ["true"].into(),
                sandbox_core::RunOptions::default().env("BAD\nKEY", "v"),
            )
            .await,
            ErrorCode::Configuration,
        )?;
        sb.kill().await?;
    }
    Ok(())
}

/// Metadata keys in the reserved `io.sandbox-rs.` namespace are refused.
async fn reserved_metadata_key_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("reserved_metadata_key_refused");
    for (k, v) in [
        ("io.sandbox-rs.managed", "false"),
        ("io.sandbox-rs.owner", "someone-else"),
        ("ok-key", "bad\nvalue"),
    ] {
        refused_before_provisioning(
            &ctx,
            &c,
            ctx.opts(&c).metadata(k, v),
            ErrorCode::Configuration,
        )
        .await?;
    }
    Ok(())
}
