//! Contract trials: egress allowlists and the always-blocked set.
//!
//! Every server a trial dials is one the suite started on this machine (the canary, or a
//! listener a trial binds itself); every name is one only the adapter's test resolver
//! (or the host's `/etc/hosts`) knows ([`Probes::egress_names`](crate::Probes::egress_names)).
//! Nothing leaves the machine.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, Command, ErrorCode, ExecResult, NetworkPolicy, Sandbox};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::ctx::{Canary, Ctx, Need, Skip, must_code, run, token};
use crate::probes::EgressNames;

const AREA: &str = "egress";

/// Longest a blocked connect may take: a blocked connect is rejected, not dropped, so a
/// caller learns at once instead of waiting out its own timeout.
const FAST_FAILURE: Duration = Duration::from_secs(1);

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let net = Need::Cap(C::NETWORK_POLICY | C::RUN_COMMAND);
    // Without EGRESS_ALLOWLIST each allowlist trial proves the refusal instead (before
    // anything is provisioned), which needs nothing.
    let declared = ctx.caps.contains(C::EGRESS_ALLOWLIST);
    let list_canary: &[Need] = if declared { &[net, Need::Canary] } else { &[] };
    let list_kernel: &[Need] = if declared {
        &[net, Need::Canary, Need::KernelEvidence]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "allowlisted_name_reachable",
            list_canary,
            allowlisted_name_reachable,
        ),
        ctx.trial(
            AREA,
            "allowlisted_cidr_reachable",
            list_canary,
            allowlisted_cidr_reachable,
        ),
        ctx.trial(
            AREA,
            "unlisted_name_refused_by_dns",
            list_canary,
            unlisted_name_refused_by_dns,
        ),
        ctx.trial(
            AREA,
            "unlisted_address_rejected_fast",
            list_canary,
            unlisted_address_rejected_fast,
        ),
        ctx.trial(
            AREA,
            "allowlist_blocks_bridge_and_metadata",
            list_kernel,
            allowlist_blocks_bridge_and_metadata,
        ),
        ctx.trial(
            AREA,
            "listed_network_cannot_open_the_host",
            list_kernel,
            listed_network_cannot_open_the_host,
        ),
        ctx.trial(
            AREA,
            "allow_blocks_bridge_and_metadata",
            &[net, Need::Canary, Need::KernelEvidence],
            allow_blocks_bridge_and_metadata,
        ),
        ctx.trial(
            AREA,
            "allow_cannot_reach_another_sandbox",
            &[net, Need::Canary, Need::KernelEvidence],
            allow_cannot_reach_another_sandbox,
        ),
        ctx.trial(
            AREA,
            "root_cannot_undo_the_rules",
            list_kernel,
            root_cannot_undo_the_rules,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// The adapter's test names; without them the trial is ignored with the reason.
/// Where the backend does not declare `EGRESS_ALLOWLIST`: an allowlist is refused with
/// `CapabilityNotSupported` and provisions nothing. `Ok(true)` when that was proven (the
/// trial is done), `Ok(false)` when the capability is declared.
async fn refused_when_undeclared(ctx: &Ctx, c: &str) -> anyhow::Result<bool> {
    if ctx.caps.contains(C::EGRESS_ALLOWLIST) {
        return Ok(false);
    }
    let r = ctx
        .backend
        .create(
            ctx.opts(c)
                .network(NetworkPolicy::allow_list(["192.0.2.1"])),
        )
        .await;
    must_code(r, ErrorCode::CapabilityNotSupported)?;
    if ctx.backend.as_reapable().is_some() {
        let left = ctx.listed(c).await?;
        ensure!(left.is_empty(), "a refused allowlist provisioned {left:?}");
    }
    Ok(true)
}

/// Where `Allow` is documentedly unavailable (`Probes::egress_allow`): it is refused with
/// `Configuration`. `Ok(true)` when that was proven.
async fn allow_refused_when_unavailable(ctx: &Ctx, c: &str) -> anyhow::Result<bool> {
    if ctx.probes.egress_allow() {
        return Ok(false);
    }
    let r = ctx
        .backend
        .create(ctx.opts(c).network(NetworkPolicy::allow()))
        .await;
    must_code(r, ErrorCode::Configuration)?;
    Ok(true)
}

fn names(ctx: &Ctx) -> anyhow::Result<EgressNames> {
    match ctx.probes.egress_names() {
        Some(n) => Ok(n),
        None => Err(Skip("no egress_names probe".into()).into()),
    }
}

/// `nc -w 10 HOST PORT`, the suite's egress probe. The wait only matters for a connect
/// that should succeed (a refused one fails at once, and the trials that need a fast
/// refusal time it themselves): 3 s flaked on a loaded 2-core CI machine, where one lost
/// SYN is retransmitted only after 1 s and again after 3 s.
fn dial(host: &str, port: u16) -> Command {
    Command::Argv(vec![
        "nc".into(),
        "-w".into(),
        "10".into(),
        host.into(),
        port.to_string(),
    ])
}

fn reached(r: &ExecResult, token: &str) -> bool {
    r.stdout_text().contains(token)
}

async fn expect_reached(sb: &dyn Sandbox, cmd: Command, canary: &Canary) -> anyhow::Result<()> {
    let r = run(sb, cmd.clone()).await?;
    ensure!(
        reached(&r, &canary.token),
        "{cmd:?} did not reach the canary: exit {} stdout {:?} stderr {:?}",
        r.exit_code,
        r.stdout_text(),
        r.stderr_text()
    );
    Ok(())
}

/// Runs `cmd`, requires it to fail (not a missing tool) without `token`, and returns how
/// much longer than a bare `true` it took (the exec's own cost taken out), the least of
/// up to three attempts.
async fn expect_blocked(sb: &dyn Sandbox, cmd: Command, token: &str) -> anyhow::Result<Duration> {
    // The best of up to three attempts: a dropped connect is slow every time (nc waits
    // its 10 s), while a 2-core machine under load can stall any one exec past the
    // bound. Every attempt must be blocked.
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        run(sb, ["true"]).await?;
        let baseline = t0.elapsed();
        let t1 = Instant::now();
        let r = run(sb, cmd.clone()).await?;
        let took = t1.elapsed().saturating_sub(baseline);
        ensure!(
            !reached(&r, token),
            "{cmd:?} got through: {:?}",
            r.stdout_text()
        );
        ensure!(r.exit_code != 0, "{cmd:?} exited 0 while blocked");
        ensure!(
            r.exit_code != 127,
            "{cmd:?}: the tool is missing (127), nothing was proven"
        );
        best = best.min(took);
        if best < FAST_FAILURE {
            break;
        }
    }
    Ok(best)
}

/// A listed name resolves and its address is reachable.
async fn allowlisted_name_reachable(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allowlisted_name_reachable");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = names(&ctx)?;
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list([names.listed.clone()])),
        )
        .await?;
    expect_reached(&*sb, dial(&names.listed, canary.port), &canary).await?;
    sb.kill().await
}

/// A listed CIDR is reachable by address, with no name involved.
async fn allowlisted_cidr_reachable(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allowlisted_cidr_reachable");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let ip: IpAddr = canary
        .spec
        .dial_host
        .parse()
        .context("the canary's dial_host must be an IP address for the CIDR trial")?;
    let cidr = match ip {
        IpAddr::V4(v4) => {
            let net = Ipv4Addr::from(u32::from(v4) & 0xffff_ff00);
            format!("{net}/24")
        }
        IpAddr::V6(_) => format!("{ip}/128"),
    };
    let sb = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::allow_list([cidr])))
        .await?;
    expect_reached(&*sb, dial(&canary.spec.dial_host, canary.port), &canary).await?;
    sb.kill().await
}

/// A name off the list does not resolve (the resolver refuses it), although it names the
/// very address a listed name reaches.
async fn unlisted_name_refused_by_dns(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("unlisted_name_refused_by_dns");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = names(&ctx)?;
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list([names.listed.clone()])),
        )
        .await?;
    let r = run(&*sb, dial(&names.unlisted, canary.port)).await?;
    ensure!(
        !reached(&r, &canary.token),
        "an unlisted name reached the canary"
    );
    ensure!(
        r.exit_code != 0 && r.exit_code != 127,
        "nc exit {} for an unlisted name",
        r.exit_code
    );
    // busybox nc says "bad address" when the name does not resolve: the refusal came
    // from DNS, not from a connect the firewall rejected.
    ensure!(
        r.stderr_text().to_lowercase().contains("bad address"),
        "the unlisted name was not refused by DNS: {:?}",
        r.stderr_text()
    );
    // The listed name still works in the same sandbox.
    expect_reached(&*sb, dial(&names.listed, canary.port), &canary).await?;
    sb.kill().await
}

/// An address off the list is rejected within a second (rejected, not dropped), even
/// with a server listening there.
async fn unlisted_address_rejected_fast(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("unlisted_address_rejected_fast");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    // TEST-NET-1 (RFC 5737) is listed: never routed, so nothing leaves this machine.
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list(["192.0.2.1"])),
        )
        .await?;
    let took = expect_blocked(
        &*sb,
        dial(&canary.spec.dial_host, canary.port),
        &canary.token,
    )
    .await?;
    ensure!(
        took < FAST_FAILURE,
        "a blocked connect took {took:?} (beyond the exec's own cost): dropped, not rejected"
    );
    sb.kill().await
}

/// A server on every host address (0.0.0.0), so the sandbox's gateway — the host's bridge
/// address — has one listening. Serves `token` to each client.
async fn host_listener(token: String) -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let l = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
        .await
        .context("bind a host listener on 0.0.0.0")?;
    let port = l.local_addr()?.port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let t = token.clone();
            tokio::spawn(async move {
                let _ = s.write_all(format!("{t}\n").as_bytes()).await;
            });
        }
    });
    // The server is alive: the host reaches it.
    let mut probe = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let _ = probe.shutdown().await;
    Ok((port, task))
}

/// The sandbox's default gateway (the host's address on its network), from
/// `/proc/net/route`.
async fn default_gateway(sb: &dyn Sandbox) -> anyhow::Result<Ipv4Addr> {
    let r = run(sb, ["cat", "/proc/net/route"]).await?;
    for line in r.stdout_text().lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 2 && f[1] == "00000000" {
            let hex = u32::from_str_radix(f[2], 16)?;
            // /proc/net/route prints the address in host (little-endian) order.
            return Ok(Ipv4Addr::from(hex.swap_bytes()));
        }
    }
    bail!("no default route in /proc/net/route: {:?}", r.stdout_text())
}

/// The host's bridge address (with a server listening on it) and the metadata address
/// are rejected fast from `sb`.
async fn bridge_and_metadata_blocked(sb: &dyn Sandbox) -> anyhow::Result<()> {
    let t = token("sbx-bridge-");
    let (port, task) = host_listener(t.clone()).await?;
    let gw = default_gateway(sb).await?;
    let took = expect_blocked(sb, dial(&gw.to_string(), port), &t)
        .await
        .with_context(|| format!("the host's bridge address {gw}"))?;
    ensure!(
        took < FAST_FAILURE,
        "the bridge address took {took:?} to refuse"
    );
    // Link-local / cloud metadata: a refusal from the sandbox's own rules is immediate.
    let took = expect_blocked(sb, dial("169.254.169.254", 80), "ami-id")
        .await
        .context("the metadata address")?;
    ensure!(took < FAST_FAILURE, "metadata took {took:?} to refuse");
    task.abort();
    Ok(())
}

/// Under an allowlist, the host's bridge address and link-local/metadata are blocked.
async fn allowlist_blocks_bridge_and_metadata(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allowlist_blocks_bridge_and_metadata");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let names = names(&ctx)?;
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list([names.listed])),
        )
        .await?;
    bridge_and_metadata_blocked(&*sb).await?;
    sb.kill().await
}

/// The host's bridge address cannot be listed (`Configuration` before provisioning), and
/// a listed network that contains it, or link-local, leaves them blocked while the rest
/// of the list (the canary) is reachable: the blocked set is evaluated first.
async fn listed_network_cannot_open_the_host(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("listed_network_cannot_open_the_host");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = names(&ctx)?;
    let probe = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list([names.listed])),
        )
        .await?;
    let gw = default_gateway(&*probe).await?;
    probe.kill().await?;
    let r = ctx
        .backend
        .create(
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list([format!("{gw}/32")])),
        )
        .await;
    must_code(r, ErrorCode::Configuration).context("listing the host's bridge address")?;
    if ctx.backend.as_reapable().is_some() {
        let left = ctx.listed(&c).await?;
        ensure!(left.is_empty(), "a refused allowlist provisioned {left:?}");
    }
    // The /8 around the gateway holds the host's bridge address and the engine's
    // networks; 169.254.0.0/15 holds link-local and the metadata address.
    let around = format!("{}.0.0.0/8", gw.octets()[0]);
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c).network(NetworkPolicy::allow_list([
                around.clone(),
                "169.254.0.0/15".to_string(),
                canary.spec.dial_host.clone(),
            ])),
        )
        .await?;
    expect_reached(&*sb, canary.probe_command(), &canary).await?;
    bridge_and_metadata_blocked(&*sb)
        .await
        .with_context(|| format!("with {around} and 169.254.0.0/15 listed"))?;
    sb.kill().await
}

/// Under `Allow` the canary (an ordinary address) is reachable, while the host's bridge
/// address and link-local/metadata are not.
async fn allow_blocks_bridge_and_metadata(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allow_blocks_bridge_and_metadata");
    if allow_refused_when_unavailable(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let sb = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::allow()))
        .await?;
    expect_reached(&*sb, canary.probe_command(), &canary).await?;
    bridge_and_metadata_blocked(&*sb).await?;
    sb.kill().await
}

/// The sandbox's own non-loopback IPv4 addresses, from `/proc/net/fib_trie`.
async fn own_addresses(sb: &dyn Sandbox) -> anyhow::Result<Vec<Ipv4Addr>> {
    let r = run(sb, ["cat", "/proc/net/fib_trie"]).await?;
    let text = r.stdout_text();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for w in lines.windows(2) {
        if w[1].contains("/32 host LOCAL")
            && let Some(a) = w[0].trim().strip_prefix("|-- ")
            && let Ok(ip) = a.trim().parse::<Ipv4Addr>()
            && !ip.is_loopback()
            && !out.contains(&ip)
        {
            out.push(ip);
        }
    }
    ensure!(
        !out.is_empty(),
        "no address in /proc/net/fib_trie: {text:?}"
    );
    Ok(out)
}

/// Under `Allow`, one sandbox cannot connect to a server in another.
async fn allow_cannot_reach_another_sandbox(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allow_cannot_reach_another_sandbox");
    if allow_refused_when_unavailable(&ctx, &c).await? {
        return Ok(());
    }
    let target = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::allow()))
        .await?;
    let t = token("sbx-peer-");
    let port = 18080;
    // A server in the target that answers every connection with the token.
    let serve = format!("while true; do echo {t} | nc -l -p {port}; done");
    let mut server = target.stream(
        Command::Shell(serve),
        sandbox_core::RunOptions::default().timeout(Duration::from_secs(120)),
    )?;
    // A stream starts on first poll or an explicit start; nothing polls this one.
    server
        .start()
        .await
        .map_err(|e| anyhow::anyhow!("start the peer server: {}", e.render()))?;
    let ip = own_addresses(&*target).await?[0];
    // The server works: the target reaches it on its own address.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = run(&*target, dial(&ip.to_string(), port)).await?;
        if reached(&r, &t) {
            break;
        }
        if Instant::now() >= deadline {
            bail!("the peer server never answered inside its own sandbox");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let other = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::allow()))
        .await?;
    expect_blocked(&*other, dial(&ip.to_string(), port), &t)
        .await
        .context("another sandbox's server")?;
    let _ = server.kill().await;
    other.kill().await?;
    target.kill().await
}

/// Root inside an allowlisted sandbox holds neither NET_ADMIN nor NET_RAW, cannot change
/// routes or rules, and after trying is still blocked.
async fn root_cannot_undo_the_rules(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("root_cannot_undo_the_rules");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::allow_list(["192.0.2.1"])),
        )
        .await?;
    let status = run(&*sb, ["cat", "/proc/self/status"]).await?.stdout_text();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(str::trim)
        .context("no CapEff in /proc/self/status")?;
    let caps = u64::from_str_radix(cap_eff, 16)?;
    const CAP_NET_ADMIN: u64 = 1 << 12;
    const CAP_NET_RAW: u64 = 1 << 13;
    ensure!(
        caps & (CAP_NET_ADMIN | CAP_NET_RAW) == 0,
        "the workload holds NET_ADMIN or NET_RAW (CapEff {cap_eff})"
    );
    for attempt in [
        "ip route del default",
        "ip link set lo down",
        "nft flush ruleset",
        "iptables -F",
    ] {
        let r = run(&*sb, Command::Shell(attempt.into())).await?;
        ensure!(
            r.exit_code != 0,
            "`{attempt}` succeeded as root inside the sandbox"
        );
    }
    // Whatever the attempts did, the canary is still out of reach.
    expect_blocked(&*sb, canary.probe_command(), &canary.token).await?;
    sb.kill().await
}
