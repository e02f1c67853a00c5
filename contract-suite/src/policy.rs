//! Contract trials: policy (egress deny/allow/allowlist, resource caps read back from
//! inside, refusals before provisioning).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, Command, CreateOptions, ErrorCode, IsolationTier, NetworkPolicy, Resources,
    RunOptions, Sandbox,
};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::ctx::{CASE_LABEL, Canary, Ctx, Need, Sbx, Skip, must_code, run, sbx, token};
use crate::limits::{PidsEvidence, expect_memory_limit, expect_pids_limit};

const AREA: &str = "policy";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let r = Need::Cap(C::RUN_COMMAND);
    let net = Need::Cap(C::NETWORK_POLICY | C::RUN_COMMAND);
    // A declared capability is proven by exercising it (which needs commands and, for
    // the allowlist, the canary); an undeclared one by its refusal, which needs nothing.
    let allowlist_needs: &[Need] = if ctx.caps.contains(C::EGRESS_ALLOWLIST) {
        &[net, Need::Canary]
    } else {
        &[]
    };
    let ingress_needs: &[Need] = if ctx.caps.contains(C::INGRESS_PORTS) {
        &[net, Need::Canary]
    } else {
        &[]
    };
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
            &[net, Need::KernelEvidence],
            deny_leaves_only_loopback,
        ),
        ctx.trial(
            AREA,
            "allow_adds_an_interface",
            &[net, Need::Canary, Need::KernelEvidence],
            allow_adds_an_interface,
        ),
        ctx.trial(
            AREA,
            "allowlist_enforced_or_refused",
            allowlist_needs,
            allowlist_enforced_or_refused,
        ),
        ctx.trial(
            AREA,
            "memory_cap_read_back",
            &[r, Need::KernelEvidence],
            memory_cap_read_back,
        ),
        ctx.trial(
            AREA,
            "pids_cap_read_back",
            &[r, Need::KernelEvidence],
            pids_cap_read_back,
        ),
        ctx.trial(
            AREA,
            "caps_cannot_be_unset",
            &[r, Need::KernelEvidence],
            caps_cannot_be_unset,
        ),
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
            "ingress_published_or_refused",
            ingress_needs,
            ingress_published_or_refused,
        ),
        ctx.trial(
            AREA,
            "ingress_port_listed_twice_refused",
            &[],
            ingress_port_listed_twice_refused,
        ),
        ctx.trial(
            AREA,
            "allowlist_cannot_open_the_blocked_set",
            &[],
            allowlist_cannot_open_the_blocked_set,
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
            "label_key_with_control_chars_refused",
            &[],
            label_key_with_control_chars_refused,
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

/// Creates a sandbox with egress `Allow`. Where the adapter says its sandboxes can get a
/// network on this engine (`Probes::egress_allow`, the default) this must work: refusing
/// `Allow` — with an error, or silently by denying — is a broken policy. Where the adapter
/// documents that they cannot (Docker on a `runsc` registered with `--network=none`),
/// `Allow` must be refused with `Configuration` before anything is provisioned, and
/// `None` is returned; a create that succeeds there fails the trial too.
async fn create_allow(ctx: &Ctx, c: &str, opts: CreateOptions) -> anyhow::Result<Option<Sbx>> {
    if ctx.probes.egress_allow() {
        let sb = ctx
            .create(c, opts)
            .await
            .context("egress Allow must work where NETWORK_POLICY is declared")?;
        return Ok(Some(sb));
    }
    refused_before_provisioning(
        ctx,
        c,
        opts.metadata(CASE_LABEL, c),
        ErrorCode::Configuration,
    )
    .await
    .context("the adapter says egress Allow is unavailable on this engine")?;
    Ok(None)
}

/// Connects to the canary server from this process (not from a sandbox) and requires
/// its token: proves the server is alive when no sandbox can reach it.
async fn canary_answers_the_host(canary: &Canary) -> anyhow::Result<()> {
    let ip = if canary.spec.bind.ip().is_unspecified() {
        canary
            .spec
            .dial_host
            .parse()
            .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
    } else {
        canary.spec.bind.ip()
    };
    let addr = SocketAddr::new(ip, canary.port);
    let mut conn = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .with_context(|| format!("connecting to the canary at {addr} timed out"))?
        .with_context(|| format!("the canary server at {addr} is not reachable from the host"))?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut buf))
        .await
        .with_context(|| format!("the canary at {addr} sent no EOF within 5 s"))??;
    ensure!(
        String::from_utf8_lossy(&buf).contains(&canary.token),
        "the canary at {addr} answered {buf:?}, not its token"
    );
    Ok(())
}

/// Egress deny really denies: an `Allow` sandbox fetches the canary token (the probe
/// works), and a `Deny` sandbox fails for the right reason (no route), not a missing tool.
async fn egress_deny_really_denies(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("egress_deny_really_denies");
    let canary = ctx.canary()?.clone();
    match create_allow(&ctx, &c, ctx.opts(&c).network(NetworkPolicy::allow())).await? {
        Some(allow) => {
            let r = run(&*allow, canary.probe_command()).await?;
            ensure!(
                r.stdout_text().contains(&canary.token),
                "an Allow sandbox could not reach the canary (the probe itself is broken): \
                 exit {} stdout {:?} stderr {:?}",
                r.exit_code,
                r.stdout_text(),
                r.stderr_text()
            );
            allow.kill().await?;
        }
        // Allow is (documentedly) refused here: the host proves the canary alive.
        None => canary_answers_the_host(&canary).await?,
    }
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
    // ENETUNREACH ("Network is unreachable", runc: no interface but lo), EHOSTUNREACH
    // ("No route to host", gVisor's netstack), or a name that cannot resolve.
    let err = r.stderr_text().to_lowercase();
    ensure!(
        err.contains("unreachable")
            || err.contains("no route to host")
            || err.contains("bad address"),
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
/// vacuous), and the sandbox reaches the canary: `Allow` is never refused, nor silently
/// turned into a deny.
async fn allow_adds_an_interface(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allow_adds_an_interface");
    let canary = ctx.canary()?.clone();
    let Some(sb) = create_allow(&ctx, &c, ctx.opts(&c).network(NetworkPolicy::allow())).await?
    else {
        return Ok(());
    };
    let ifs = interfaces(&*sb).await?;
    ensure!(
        ifs.iter().any(|i| i != "lo"),
        "interfaces under allow: {ifs:?}"
    );
    let r = run(&*sb, canary.probe_command()).await?;
    ensure!(
        r.stdout_text().contains(&canary.token),
        "an Allow sandbox could not reach the canary: exit {} stderr {:?}",
        r.exit_code,
        r.stderr_text()
    );
    sb.kill().await
}

/// An allowlist is enforced or refused: with `EGRESS_ALLOWLIST` a listed host is
/// reachable and an unlisted one is not; without it, an allowlist is
/// `CapabilityNotSupported` before provisioning.
async fn allowlist_enforced_or_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allowlist_enforced_or_refused");
    if !ctx.caps.contains(C::EGRESS_ALLOWLIST) {
        refused_before_provisioning(
            &ctx,
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list(["example.org"])),
            ErrorCode::CapabilityNotSupported,
        )
        .await?;
        return Ok(());
    }
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

/// A 256 MiB memory cap reads back as 268435456 bytes inside the sandbox: the cgroup
/// file, or — only when no cgroup memory file exists inside (gVisor) — `/proc/meminfo`
/// `MemTotal`, which gVisor sizes to the limit (see `limits.rs`).
async fn memory_cap_read_back(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("memory_cap_read_back");
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c).resources(Resources::default().memory_mb(256)),
        )
        .await?;
    expect_memory_limit(&*sb, 256).await?;
    sb.kill().await
}

/// A pids cap of 100 reads back as 100 inside the sandbox. A gVisor sandbox has no cgroup
/// view inside: the engine must hold 100 + the adapter's documented runtime headroom
/// (`Probes::engine_limits`), and — the behavioural half — spawning more processes than
/// even that engine limit must fail inside (a fork error, or the runtime ending the
/// sandbox: under gVisor the limit counts the sentry's host threads, so exceeding it kills
/// the whole sandbox, reported as `SandboxGone`).
async fn pids_cap_read_back(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("pids_cap_read_back");
    let sb = ctx
        .create(&c, ctx.opts(&c).resources(Resources::default().pids(100)))
        .await?;
    if let PidsEvidence::Engine { engine_pids } =
        expect_pids_limit(&ctx, &*sb, 100, SPEC_DEFAULT_MEMORY_MB).await?
    {
        spawning_past_the_limit_fails(&*sb, engine_pids).await?;
    }
    sb.kill().await
}

/// Starts `engine_pids + 1` sleeping processes: with any pids limit in force that cannot
/// all succeed — either a fork fails (the shell exits non-zero before printing the marker)
/// or the runtime ends the sandbox (`SandboxGone`).
async fn spawning_past_the_limit_fails(sb: &dyn Sandbox, engine_pids: u64) -> anyhow::Result<()> {
    let n = engine_pids + 1;
    let script: Command =
        format!("i=0; while [ $i -lt {n} ]; do sleep 120 & i=$((i+1)); done; echo sbx-spawned-all")
            .into();
    let r = sb
        .run(
            script,
            RunOptions::default().timeout(Duration::from_secs(90)),
        )
        .await;
    match r {
        Ok(r) => ensure!(
            r.exit_code != 0 || !r.stdout_text().contains("sbx-spawned-all"),
            "{n} processes started in a sandbox whose engine pids limit is {engine_pids}: \
             the limit is not enforced"
        ),
        Err(e) if e.code() == ErrorCode::SandboxGone => {}
        Err(e) => bail!(
            "spawning {n} processes failed with neither a fork error nor SandboxGone: {}",
            e.render()
        ),
    }
    Ok(())
}

/// The documented default memory limit (MiB) when none is requested.
const SPEC_DEFAULT_MEMORY_MB: u64 = 512;
/// The documented default pids limit when none is requested.
const SPEC_DEFAULT_PIDS: u64 = 512;

/// Default resources are concrete limits inside (512 MiB, 512 pids), never "max" (with
/// the same gVisor evidence as the two cases above).
async fn caps_cannot_be_unset(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("caps_cannot_be_unset");
    let sb = ctx
        .create(&c, ctx.opts(&c).resources(Resources::default()))
        .await?;
    expect_memory_limit(&*sb, SPEC_DEFAULT_MEMORY_MB)
        .await
        .context("default memory limit")?;
    expect_pids_limit(&ctx, &*sb, SPEC_DEFAULT_PIDS, SPEC_DEFAULT_MEMORY_MB)
        .await
        .context("default pids limit")?;
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

/// An ingress port listed twice is a `Configuration` error before provisioning, on
/// every backend (whether or not it publishes ports): an engine would publish it twice,
/// or silently once.
async fn ingress_port_listed_twice_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("ingress_port_listed_twice_refused");
    let network = NetworkPolicy::deny().ingress_port(8080).ingress_port(8080);
    let e = refused_before_provisioning(
        &ctx,
        &c,
        ctx.opts(&c).network(network),
        ErrorCode::Configuration,
    )
    .await?;
    ensure!(
        e.to_string().contains("8080"),
        "the error names the port: {e}"
    );
    Ok(())
}

/// An allowlist entry inside the always-blocked set (link-local, cloud metadata) or wider
/// than any one destination (`0.0.0.0/0`) is a `Configuration` error before
/// provisioning, on every backend: the policy is judged before the capability, so a
/// backend without `EGRESS_ALLOWLIST` refuses it the same way.
async fn allowlist_cannot_open_the_blocked_set(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allowlist_cannot_open_the_blocked_set");
    for entry in [
        "169.254.169.254/32",
        "169.254.169.254",
        "fe80::1",
        "fd00:ec2::254",
        "100.100.100.200",
        "0.0.0.0/0",
        "::/0",
    ] {
        let network = NetworkPolicy::allow_list(["192.0.2.1", entry]);
        refused_before_provisioning(
            &ctx,
            &c,
            ctx.opts(&c).network(network),
            ErrorCode::Configuration,
        )
        .await
        .with_context(|| format!("allowlist entry {entry}"))?;
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

/// Ingress ports are published or refused — never ignored: with `INGRESS_PORTS`, a
/// one-shot server inside a sandbox (egress deny, then allow) answers on
/// `ingress_address(8080)`, a loopback address, the canary stays unreachable under deny
/// and reachable under allow, and an unrequested port is a `Configuration` error; without
/// it, asking for a port is `CapabilityNotSupported` before provisioning.
async fn ingress_published_or_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("ingress_published_or_refused");
    let policies = [
        ("deny", NetworkPolicy::deny().ingress_port(INGRESS_PORT)),
        ("allow", NetworkPolicy::allow().ingress_port(INGRESS_PORT)),
    ];
    if !ctx.caps.contains(C::INGRESS_PORTS) {
        for (_, policy) in policies {
            refused_before_provisioning(
                &ctx,
                &c,
                ctx.opts(&c).network(policy),
                ErrorCode::CapabilityNotSupported,
            )
            .await?;
        }
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    for (egress, policy) in policies {
        let opts = ctx.opts(&c).network(policy);
        let sb = if egress == "allow" {
            match create_allow(&ctx, &c, opts).await? {
                Some(sb) => sb,
                None => continue,
            }
        } else {
            ctx.create(&c, opts).await?
        };
        ingress_serves(&*sb)
            .await
            .with_context(|| format!("egress {egress} with ingress port {INGRESS_PORT}"))?;
        // Publishing a port must not open egress.
        let r = run(&*sb, canary.probe_command()).await?;
        let reached = r.stdout_text().contains(&canary.token);
        if egress == "deny" {
            ensure!(
                !reached && r.exit_code != 0 && r.exit_code != 127,
                "an ingress port opened egress under Deny (nc exit {})",
                r.exit_code
            );
        } else {
            ensure!(
                reached,
                "egress Allow with an ingress port cannot reach the canary"
            );
        }
        sb.kill().await?;
    }
    Ok(())
}

/// The container port the ingress trial publishes.
const INGRESS_PORT: u16 = 8080;

/// Starts a one-shot server on [`INGRESS_PORT`] inside `sb` (busybox `nc -l -p`) that
/// sends a random token, and fetches the token from the host through
/// `ingress_address(INGRESS_PORT)`.
async fn ingress_serves(sb: &dyn Sandbox) -> anyhow::Result<()> {
    let addr = sbx(
        sb.ingress_address(INGRESS_PORT),
        &format!("ingress_address({INGRESS_PORT})"),
    )?;
    ensure!(
        addr.ip().is_loopback(),
        "ingress_address({INGRESS_PORT}) is {addr}, not a loopback address"
    );
    must_code(sb.ingress_address(9999), ErrorCode::Configuration)
        .context("ingress_address(9999) of a port that was not requested")?;
    let tok = token("sbx-ingress-");
    let server: Command = format!(
        "printf {tok} > /work/ingress-token; nc -l -p {INGRESS_PORT} < /work/ingress-token"
    )
    .into();
    let opts = RunOptions::default().timeout(Duration::from_secs(90));
    let fetch = fetch_token(addr, &tok);
    if sb.capabilities().contains(C::STREAMING) {
        let mut p = sbx(sb.stream(server, opts), "stream the server")?;
        sbx(p.start().await, "start the server")?;
        let got = fetch.await;
        // Kills the server if it is still listening.
        drop(p);
        got
    } else {
        let serving = sb.run(server, opts);
        tokio::pin!(serving, fetch);
        tokio::select! {
            got = &mut fetch => got,
            r = &mut serving => {
                // The one-shot server ends right after serving; let the reader finish.
                tokio::time::timeout(Duration::from_secs(5), fetch)
                    .await
                    .with_context(|| format!("the server ended ({r:?}) and nothing arrived"))?
            }
        }
    }
}

/// Connects to `addr` until it sends `token` (the server may still be starting, and a
/// forwarder may accept before the server listens), for at most 30 s.
async fn fetch_token(addr: SocketAddr, token: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = match tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr))
            .await
        {
            Ok(Ok(mut conn)) => {
                let mut buf = Vec::new();
                let read =
                    tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut buf)).await;
                if String::from_utf8_lossy(&buf).contains(token) {
                    return Ok(());
                }
                match read {
                    Ok(Ok(_)) => format!("connected, received {buf:?}"),
                    Ok(Err(e)) => format!("connected, read failed: {e}"),
                    Err(_) => format!("connected, no EOF within 5 s (got {buf:?})"),
                }
            }
            Ok(Err(e)) => format!("connect failed: {e}"),
            Err(_) => "connect timed out".into(),
        };
        if Instant::now() >= deadline {
            bail!("the in-sandbox server's token never arrived at {addr}: last attempt {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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

/// Metadata (label) keys with control characters are a `Configuration` error before
/// provisioning.
async fn label_key_with_control_chars_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("label_key_with_control_chars_refused");
    for key in ["bad\nkey", "bad\u{7}key", "tab\tkey", "nul\u{0}key"] {
        refused_before_provisioning(
            &ctx,
            &c,
            ctx.opts(&c).metadata(key, "v"),
            ErrorCode::Configuration,
        )
        .await
        .with_context(|| format!("metadata key {key:?}"))?;
    }
    Ok(())
}
