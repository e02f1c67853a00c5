//! Contract trials: the egress policy of a running sandbox, changed and read back
//! (`LIVE_EGRESS`), and its tiers (exceptions over the deny list over the allow list over
//! the default).
//!
//! What a declared `LIVE_EGRESS` promises: `set_egress` replaces the policy of the
//! running sandbox and it is in force when the call returns — a host reachable before is
//! unreachable right after (within a second), an open connection to it is cut, a host
//! added becomes reachable, `Deny` and back works; the tiers decide most specific first;
//! the policy read back, from this handle or a reattached one, is the one set; root
//! inside changes none of it. Without `LIVE_EGRESS` each trial proves the refusal
//! instead (`CapabilityNotSupported` from `set_egress` and `egress`).
//!
//! Every server dialed is one the suite started (the canary, or a listener bound where
//! the adapter binds the canary); every name is one only the adapter's test resolver
//! knows. Nothing leaves the machine.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt;
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, Command, Egress, EgressRule, EgressTiers, ErrorCode, NetworkPolicy,
    RunOptions, Sandbox,
};
use tokio::io::AsyncWriteExt;

use crate::ctx::{Canary, Ctx, Need, Sbx, Skip, must_code, run, sbx};
use crate::probes::EgressNames;

const AREA: &str = "egress_live";

/// How soon after `set_egress` returns a forbidden host must be out of reach.
const CUT_WITHIN: Duration = Duration::from_secs(1);

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let declared = ctx.caps.contains(C::LIVE_EGRESS);
    let needs: &[Need] = if declared {
        &[
            Need::Cap(C::NETWORK_POLICY | C::RUN_COMMAND | C::EGRESS_ALLOWLIST),
            Need::Canary,
        ]
    } else {
        &[]
    };
    let streaming: &[Need] = if declared {
        &[
            Need::Cap(C::NETWORK_POLICY | C::RUN_COMMAND | C::STREAMING | C::EGRESS_ALLOWLIST),
            Need::Canary,
        ]
    } else {
        &[]
    };
    let plain: &[Need] = if declared {
        &[Need::Cap(C::NETWORK_POLICY.union(C::RUN_COMMAND))]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "a_forbidden_host_is_cut_within_a_second",
            streaming,
            a_forbidden_host_is_cut_within_a_second,
        ),
        ctx.trial(
            AREA,
            "an_added_host_becomes_reachable_and_deny_again_closes_it",
            needs,
            an_added_host_becomes_reachable_and_deny_again_closes_it,
        ),
        ctx.trial(AREA, "deny_beats_allow", needs, deny_beats_allow),
        ctx.trial(
            AREA,
            "an_exception_beats_deny",
            needs,
            an_exception_beats_deny,
        ),
        ctx.trial(
            AREA,
            "allow_all_except_blocks_exactly_the_listed_names",
            needs,
            allow_all_except_blocks_exactly_the_listed_names,
        ),
        ctx.trial(
            AREA,
            "the_policy_read_back_is_the_one_set",
            needs,
            the_policy_read_back_is_the_one_set,
        ),
        ctx.trial(
            AREA,
            "root_inside_cannot_change_the_policy",
            needs,
            root_inside_cannot_change_the_policy,
        ),
        ctx.trial(
            AREA,
            "a_sandbox_created_without_network_stays_closed",
            plain,
            a_sandbox_created_without_network_stays_closed,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

fn rule(entry: &str) -> anyhow::Result<EgressRule> {
    EgressRule::parse(entry).map_err(|e| anyhow::anyhow!("{entry}: {}", e.render()))
}

fn names(ctx: &Ctx) -> anyhow::Result<EgressNames> {
    match ctx.probes.egress_names() {
        Some(n) => Ok(n),
        None => Err(Skip("no egress_names probe".into()).into()),
    }
}

/// Where `LIVE_EGRESS` is not declared: a sandbox refuses `set_egress` and `egress` with
/// `CapabilityNotSupported`. `Ok(true)` when that was proven (the trial is done).
async fn refused_when_undeclared(ctx: &Ctx, c: &str) -> anyhow::Result<bool> {
    if ctx.caps.contains(C::LIVE_EGRESS) {
        return Ok(false);
    }
    let sb = ctx.sandbox(c).await?;
    must_code(
        sb.set_egress(Egress::Deny).await,
        ErrorCode::CapabilityNotSupported,
    )
    .context("set_egress where LIVE_EGRESS is undeclared")?;
    must_code(sb.egress().await, ErrorCode::CapabilityNotSupported)
        .context("egress where LIVE_EGRESS is undeclared")?;
    sb.kill().await?;
    Ok(true)
}

/// A sandbox whose egress can change: created with `policy`.
async fn live(ctx: &Ctx, c: &str, tiers: EgressTiers) -> anyhow::Result<Sbx> {
    ctx.create(c, ctx.opts(c).network(NetworkPolicy::tiers(tiers)))
        .await
}

/// `nc -w 5 HOST PORT`.
fn dial(host: &str, port: u16) -> Command {
    Command::Argv(vec![
        "nc".into(),
        "-w".into(),
        "5".into(),
        host.into(),
        port.to_string(),
    ])
}

/// Whether dialing `host` reaches the canary.
async fn reaches(sb: &dyn Sandbox, host: &str, canary: &Canary) -> anyhow::Result<bool> {
    let r = run(sb, dial(host, canary.port)).await?;
    ensure!(
        r.exit_code != 127,
        "nc is missing in the sandbox: nothing was proven"
    );
    Ok(r.stdout_text().contains(&canary.token))
}

async fn expect_reached(
    sb: &dyn Sandbox,
    host: &str,
    canary: &Canary,
    when: &str,
) -> anyhow::Result<()> {
    ensure!(
        reaches(sb, host, canary).await?,
        "{host} was not reached {when}"
    );
    Ok(())
}

async fn expect_blocked(
    sb: &dyn Sandbox,
    host: &str,
    canary: &Canary,
    when: &str,
) -> anyhow::Result<()> {
    ensure!(
        !reaches(sb, host, canary).await?,
        "{host} was reached {when}"
    );
    Ok(())
}

/// A name is refused by DNS (busybox nc: "bad address"), not merely by a connect.
async fn expect_name_refused(
    sb: &dyn Sandbox,
    host: &str,
    canary: &Canary,
    when: &str,
) -> anyhow::Result<()> {
    let r = run(sb, dial(host, canary.port)).await?;
    ensure!(
        !r.stdout_text().contains(&canary.token),
        "{host} was reached {when}"
    );
    ensure!(
        r.stderr_text().to_lowercase().contains("bad address"),
        "{host} still resolved {when}: {:?}",
        r.stderr_text()
    );
    Ok(())
}

/// A server where the adapter binds the canary that writes a line every 100 ms to each
/// client for up to 30 s (an open connection to watch being cut). Returns its port.
async fn ticking_server(
    ctx: &Ctx,
    canary: &Canary,
) -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
    let mut spec = canary.spec.clone();
    spec.bind = SocketAddr::new(spec.bind.ip(), 0);
    let l = ctx.probes.bind_canary(&spec).await?;
    l.set_nonblocking(true)?;
    let l = tokio::net::TcpListener::from_std(l)?;
    let port = l.local_addr()?.port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                for i in 0..300 {
                    if s.write_all(format!("tick {i}\n").as_bytes()).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
    });
    Ok((port, task))
}

/// A host reachable before `set_egress` is unreachable right after it, and a connection
/// open to it is cut within a second (its stream ends, long before the server stops).
async fn a_forbidden_host_is_cut_within_a_second(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("a_forbidden_host_is_cut_within_a_second");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = names(&ctx)?;
    let sb = live(
        &ctx,
        &c,
        EgressTiers::deny_by_default().allow(rule(&names.listed)?),
    )
    .await?;
    expect_reached(&*sb, &names.listed, &canary, "while allowed").await?;
    let (port, server) = ticking_server(&ctx, &canary).await?;
    let cmd = Command::Argv(vec![
        "nc".into(),
        "-w".into(),
        "30".into(),
        names.listed.clone(),
        port.to_string(),
    ]);
    let mut p = sbx(
        sb.stream(cmd, RunOptions::default().timeout(Duration::from_secs(60))),
        "stream nc",
    )?;
    let mut seen = String::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !seen.contains("tick 2\n") {
            match p.next().await {
                Some(Ok(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk.data)),
                Some(Err(e)) => bail!("the connection's stream failed: {}", e.render()),
                None => bail!("the connection ended before the change: {seen:?}"),
            }
        }
        Ok(())
    })
    .await
    .context("the open connection never delivered")??;
    sbx(sb.set_egress(Egress::Deny).await, "set_egress(Deny)")?;
    let ended = tokio::time::timeout(CUT_WITHIN, async {
        while let Some(item) = p.next().await {
            if let Ok(chunk) = item {
                seen.push_str(&String::from_utf8_lossy(&chunk.data));
            }
        }
    })
    .await;
    let _ = p.kill().await;
    server.abort();
    ensure!(
        ended.is_ok(),
        "the connection opened while allowed was still open {CUT_WITHIN:?} after set_egress(Deny) returned: {seen:?}"
    );
    let t0 = Instant::now();
    expect_blocked(&*sb, &names.listed, &canary, "after set_egress(Deny)").await?;
    expect_blocked(
        &*sb,
        &canary.spec.dial_host,
        &canary,
        "by address after set_egress(Deny)",
    )
    .await?;
    ensure!(
        t0.elapsed() < CUT_WITHIN * 3,
        "a refused dial after the change took {:?} (dropped, not refused)",
        t0.elapsed()
    );
    sb.kill().await
}

/// A sandbox created closed (tiers denying everything) opens to a host added live, and
/// `Deny` set live closes it again: names stop resolving, addresses stop connecting.
async fn an_added_host_becomes_reachable_and_deny_again_closes_it(
    ctx: Arc<Ctx>,
) -> anyhow::Result<()> {
    let c = case("an_added_host_becomes_reachable_and_deny_again_closes_it");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = names(&ctx)?;
    let sb = live(&ctx, &c, EgressTiers::deny_by_default()).await?;
    expect_name_refused(&*sb, &names.listed, &canary, "while closed").await?;
    sbx(
        sb.set_egress(Egress::AllowList(vec![names.listed.clone()]))
            .await,
        "set_egress(allow list)",
    )?;
    expect_reached(&*sb, &names.listed, &canary, "after it was added").await?;
    expect_name_refused(&*sb, &names.unlisted, &canary, "although unlisted").await?;
    sbx(sb.set_egress(Egress::Deny).await, "set_egress(Deny)")?;
    expect_name_refused(&*sb, &names.listed, &canary, "after Deny").await?;
    expect_blocked(
        &*sb,
        &canary.spec.dial_host,
        &canary,
        "by address after Deny",
    )
    .await?;
    sbx(
        sb.set_egress(Egress::AllowList(vec![canary.spec.dial_host.clone()]))
            .await,
        "set_egress(the canary's address)",
    )?;
    expect_reached(
        &*sb,
        &canary.spec.dial_host,
        &canary,
        "after Deny and open again",
    )
    .await?;
    sb.kill().await
}

/// A deny entry wins over an allow entry for the same host, and a deny network over an
/// allow network that holds it.
async fn deny_beats_allow(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("deny_beats_allow");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = names(&ctx)?;
    let ip: IpAddr = canary
        .spec
        .dial_host
        .parse()
        .context("the canary's dial_host must be an IP address")?;
    let sb = live(&ctx, &c, EgressTiers::deny_by_default()).await?;
    sbx(
        sb.set_egress(Egress::Tiers(
            EgressTiers::deny_by_default()
                .allow(rule(&names.listed)?)
                .allow(rule(&names.unlisted)?)
                .deny(rule(&names.unlisted)?),
        ))
        .await,
        "set_egress(allow both names, deny one)",
    )?;
    expect_reached(&*sb, &names.listed, &canary, "allowed and not denied").await?;
    expect_name_refused(&*sb, &names.unlisted, &canary, "allowed but denied").await?;
    let wide = match ip {
        IpAddr::V4(v4) => format!(
            "{}/24",
            std::net::Ipv4Addr::from(u32::from(v4) & 0xffff_ff00)
        ),
        IpAddr::V6(_) => format!("{ip}/128"),
    };
    sbx(
        sb.set_egress(Egress::Tiers(
            EgressTiers::deny_by_default()
                .allow(rule(&wide)?)
                .deny(rule(&ip.to_string())?),
        ))
        .await,
        "set_egress(allow the network, deny the address)",
    )?;
    expect_blocked(
        &*sb,
        &canary.spec.dial_host,
        &canary,
        "inside an allowed network but denied",
    )
    .await?;
    sb.kill().await
}

/// An exception wins over a deny entry: the excepted host is reachable, the rest of
/// what is denied is not.
async fn an_exception_beats_deny(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("an_exception_beats_deny");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = names(&ctx)?;
    let sb = live(&ctx, &c, EgressTiers::deny_by_default()).await?;
    sbx(
        sb.set_egress(Egress::Tiers(
            EgressTiers::allow_by_default()
                .deny(rule(&names.listed)?)
                .deny(rule(&names.unlisted)?)
                .except(rule(&names.listed)?),
        ))
        .await,
        "set_egress(deny both names, except one)",
    )?;
    expect_reached(&*sb, &names.listed, &canary, "denied but excepted").await?;
    expect_name_refused(&*sb, &names.unlisted, &canary, "denied, no exception").await?;
    let ip = canary.spec.dial_host.clone();
    sbx(
        sb.set_egress(Egress::Tiers(
            EgressTiers::deny_by_default()
                .deny(rule(&ip)?)
                .except(rule(&ip)?),
        ))
        .await,
        "set_egress(deny the address, except it)",
    )?;
    expect_reached(&*sb, &ip, &canary, "an address denied but excepted").await?;
    sb.kill().await
}

/// Under "everything except these names", exactly the denied name does not resolve;
/// another name and a bare address are reachable.
async fn allow_all_except_blocks_exactly_the_listed_names(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("allow_all_except_blocks_exactly_the_listed_names");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = names(&ctx)?;
    let sb = live(&ctx, &c, EgressTiers::deny_by_default()).await?;
    sbx(
        sb.set_egress(Egress::Tiers(
            EgressTiers::allow_by_default().deny(rule(&names.unlisted)?),
        ))
        .await,
        "set_egress(everything except one name)",
    )?;
    expect_name_refused(&*sb, &names.unlisted, &canary, "denied").await?;
    expect_reached(&*sb, &names.listed, &canary, "not denied").await?;
    expect_reached(
        &*sb,
        &canary.spec.dial_host,
        &canary,
        "by address, not denied",
    )
    .await?;
    sb.kill().await
}

/// The policy read back equals the one set, after create and after each change, through
/// this handle and a reattached one.
async fn the_policy_read_back_is_the_one_set(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("the_policy_read_back_is_the_one_set");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let names = names(&ctx)?;
    let first = EgressTiers::deny_by_default().allow(rule(&names.listed)?);
    let sb = live(&ctx, &c, first.clone()).await?;
    let read = sbx(sb.egress().await, "egress after create")?;
    ensure!(read == Egress::Tiers(first.clone()), "after create: {read}");
    let second = Egress::Tiers(
        EgressTiers::allow_by_default()
            .deny(rule(&names.unlisted)?)
            .except(rule(&names.listed)?),
    );
    sbx(sb.set_egress(second.clone()).await, "set_egress")?;
    let read = sbx(sb.egress().await, "egress after set_egress")?;
    ensure!(read == second, "read back {read}, set {second}");
    let other = sbx(ctx.backend.connect(sb.id()).await, "reattach")?;
    let read = sbx(other.egress().await, "egress through a reattached handle")?;
    ensure!(
        read == second,
        "a reattached handle read {read}, set {second}"
    );
    sbx(
        other.set_egress(Egress::Deny).await,
        "set_egress through the reattached handle",
    )?;
    let read = sbx(sb.egress().await, "egress after the other handle's change")?;
    ensure!(
        read == Egress::Deny,
        "after the other handle set Deny: {read}"
    );
    drop(other);
    sb.kill().await
}

/// Root inside cannot change the policy in force: after its attempts on the rules and
/// the resolver's inputs, what was set is what holds and what reads back.
async fn root_inside_cannot_change_the_policy(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("root_inside_cannot_change_the_policy");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = names(&ctx)?;
    let sb = live(
        &ctx,
        &c,
        EgressTiers::deny_by_default().allow(rule(&names.listed)?),
    )
    .await?;
    let set = Egress::AllowList(vec!["192.0.2.1".into()]);
    sbx(sb.set_egress(set.clone()).await, "set_egress")?;
    let ip = &canary.spec.dial_host;
    for attempt in [
        "nft flush ruleset".to_string(),
        "iptables -F".to_string(),
        "ip route del default".to_string(),
        format!("echo '{ip} {}' >> /etc/hosts", names.unlisted),
    ] {
        let _ = run(&*sb, Command::Shell(attempt)).await?;
    }
    expect_blocked(&*sb, ip, &canary, "after root's attempts").await?;
    expect_blocked(
        &*sb,
        &names.listed,
        &canary,
        "(no longer allowed) after root's attempts",
    )
    .await?;
    let read = sbx(sb.egress().await, "egress after root's attempts")?;
    ensure!(
        read == set,
        "read back {read} after root's attempts, set {set}"
    );
    sb.kill().await
}

/// A sandbox created with egress `Deny` has no interface: `Deny` can be set on it, any
/// other policy is refused (`Configuration`, saying how to create one that can open),
/// and it reads back `Deny`.
async fn a_sandbox_created_without_network_stays_closed(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("a_sandbox_created_without_network_stays_closed");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let sb = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::deny()))
        .await?;
    sbx(
        sb.set_egress(Egress::Deny).await,
        "set_egress(Deny) on a Deny sandbox",
    )?;
    let e = must_code(
        sb.set_egress(Egress::AllowList(vec!["192.0.2.1".into()]))
            .await,
        ErrorCode::Configuration,
    )
    .context("opening a sandbox created with Deny")?;
    ensure!(
        e.hint().contains("deny_by_default"),
        "the refusal does not say how to create one that opens: {}",
        e.render()
    );
    let read = sbx(sb.egress().await, "egress")?;
    ensure!(read == Egress::Deny, "read back {read}");
    sb.kill().await
}
