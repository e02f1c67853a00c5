//! Contract trials: single host ports (`HOST_PORTS`).
//!
//! What a declared `HOST_PORTS` promises: a TCP port of a service on the host, granted in
//! the egress policy, is reachable inside at `host.sandbox.internal` and at the host's
//! address on the sandbox's network (its default gateway); the neighbouring port of the
//! same host is not, the host's other addresses are not on any port, and root inside
//! cannot change that. It works with a default of deny (the port is the only way out) and
//! beside an allowlist, is part of the policy a live change replaces, and holds after a
//! stop and start. Without `HOST_PORTS` a granted port is refused with
//! `CapabilityNotSupported` before anything is provisioned.
//!
//! Every server dialed is one the trial binds on this machine (two listeners on every
//! host address, on two neighbouring ports); nothing leaves the machine.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use libtest_mimic::Trial;
use sandbox_core::{
    Capability as C, Command, Egress, EgressRule, EgressTiers, ErrorCode, ExecResult,
    HOST_SANDBOX_NAME, HostPort, MAX_HOST_PORTS, NetworkPolicy, Sandbox,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::ctx::{Ctx, Need, Skip, must_code, run, sbx, token};

const AREA: &str = "host_ports";

/// Longest a refused connect may take (refused, not dropped: the caller learns at once).
const FAST_FAILURE: Duration = Duration::from_secs(1);

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let declared = ctx.caps.contains(C::HOST_PORTS);
    let base = C::NETWORK_POLICY | C::RUN_COMMAND | C::EGRESS_ALLOWLIST | C::HOST_PORTS;
    // The gateway is read from the sandbox's /proc/net/route: kernel evidence.
    let needs: &[Need] = if declared {
        &[Need::Cap(base), Need::KernelEvidence]
    } else {
        &[]
    };
    let live: &[Need] = if declared {
        &[
            Need::Cap(base | C::LIVE_EGRESS),
            Need::Canary,
            Need::KernelEvidence,
        ]
    } else {
        &[]
    };
    let restart: &[Need] = if declared {
        &[Need::Cap(base | C::STOP_START), Need::KernelEvidence]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "a_granted_port_is_reachable_and_no_other_of_the_host",
            needs,
            a_granted_port_is_reachable_and_no_other_of_the_host,
        ),
        ctx.trial(
            AREA,
            "root_inside_cannot_open_the_neighbouring_port",
            needs,
            root_inside_cannot_open_the_neighbouring_port,
        ),
        ctx.trial(
            AREA,
            "host_ports_beside_an_allowlist_change_with_the_policy",
            live,
            host_ports_beside_an_allowlist_change_with_the_policy,
        ),
        ctx.trial(
            AREA,
            "host_ports_hold_after_stop_and_start",
            restart,
            host_ports_hold_after_stop_and_start,
        ),
        ctx.trial(
            AREA,
            "bad_host_ports_are_refused",
            &[],
            bad_host_ports_are_refused,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

fn port(p: u16) -> anyhow::Result<HostPort> {
    HostPort::new(p).map_err(|e| anyhow::anyhow!("{}", e.render()))
}

/// Where `HOST_PORTS` is not declared: a granted host port is refused with
/// `CapabilityNotSupported` and provisions nothing, at create and (where the policy can
/// change) live. `Ok(true)` when that was proven (the trial is done).
async fn refused_when_undeclared(ctx: &Ctx, c: &str) -> anyhow::Result<bool> {
    if ctx.caps.contains(C::HOST_PORTS) {
        return Ok(false);
    }
    let r = ctx
        .backend
        .create(
            ctx.opts(c)
                .network(NetworkPolicy::deny().host_port(port(8080)?)),
        )
        .await;
    must_code(r, ErrorCode::CapabilityNotSupported).context("a host port at create")?;
    if ctx.backend.as_reapable().is_some() {
        let left = ctx.listed(c).await?;
        ensure!(left.is_empty(), "a refused host port provisioned {left:?}");
    }
    if ctx.caps.contains(C::LIVE_EGRESS | C::EGRESS_ALLOWLIST) {
        let sb = ctx
            .create(
                c,
                ctx.opts(c)
                    .network(NetworkPolicy::tiers(EgressTiers::deny_by_default())),
            )
            .await?;
        let granted = Egress::Tiers(EgressTiers::deny_by_default().host_port(port(8080)?));
        must_code(
            sb.set_egress(granted).await,
            ErrorCode::CapabilityNotSupported,
        )
        .context("a host port set live")?;
        sb.kill().await?;
    }
    Ok(true)
}

/// Two servers on every host address (0.0.0.0), on neighbouring ports, each answering
/// every connection with its own token.
struct HostServers {
    granted: u16,
    neighbour: u16,
    granted_token: String,
    neighbour_token: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for HostServers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn serve(l: TcpListener, token: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let t = token.clone();
            tokio::spawn(async move {
                let _ = s.write_all(format!("{t}\n").as_bytes()).await;
            });
        }
    })
}

async fn host_servers() -> anyhow::Result<HostServers> {
    for _ in 0..50 {
        let a = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
            .await
            .context("bind a host listener on 0.0.0.0")?;
        let granted = a.local_addr()?.port();
        let Some(neighbour) = granted.checked_add(1) else {
            continue;
        };
        let Ok(b) = TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, neighbour))).await
        else {
            continue;
        };
        let granted_token = token("sbx-hostport-");
        let neighbour_token = token("sbx-neighbour-");
        let servers = HostServers {
            granted,
            neighbour,
            tasks: vec![
                serve(a, granted_token.clone()),
                serve(b, neighbour_token.clone()),
            ],
            granted_token,
            neighbour_token,
        };
        // Both serve: the host reaches them.
        for p in [granted, neighbour] {
            let mut probe = tokio::net::TcpStream::connect(("127.0.0.1", p)).await?;
            let _ = probe.shutdown().await;
        }
        return Ok(servers);
    }
    bail!("no two neighbouring ports could be bound on 0.0.0.0")
}

/// `nc -w 10 HOST PORT` (a refused connect fails at once; 10 s only matters for one that
/// should succeed on a loaded machine).
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

async fn expect_reached(
    sb: &dyn Sandbox,
    host: &str,
    port: u16,
    token: &str,
    what: &str,
) -> anyhow::Result<()> {
    let r = run(sb, dial(host, port)).await?;
    ensure!(
        reached(&r, token),
        "{what}: {host}:{port} was not reached: exit {} stdout {:?} stderr {:?}",
        r.exit_code,
        r.stdout_text(),
        r.stderr_text()
    );
    Ok(())
}

/// Dialing `host:port` fails (not a missing tool) without `token`, within
/// [`FAST_FAILURE`] beyond the exec's own cost (the best of up to three attempts, every
/// one blocked).
async fn expect_blocked(
    sb: &dyn Sandbox,
    host: &str,
    port: u16,
    token: &str,
    what: &str,
) -> anyhow::Result<()> {
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        run(sb, ["true"]).await?;
        let baseline = t0.elapsed();
        let t1 = Instant::now();
        let r = run(sb, dial(host, port)).await?;
        let took = t1.elapsed().saturating_sub(baseline);
        ensure!(
            !reached(&r, token),
            "{what}: {host}:{port} was reached: {:?}",
            r.stdout_text()
        );
        ensure!(
            r.exit_code != 0 && r.exit_code != 127,
            "{what}: nc exit {} for {host}:{port} (stderr {:?})",
            r.exit_code,
            r.stderr_text()
        );
        best = best.min(took);
        if best < FAST_FAILURE {
            return Ok(());
        }
    }
    bail!("{what}: {host}:{port} took {best:?} to refuse: dropped, not rejected")
}

/// The name does not resolve inside (busybox nc: "bad address").
async fn expect_name_refused(sb: &dyn Sandbox, port: u16, what: &str) -> anyhow::Result<()> {
    let r = run(sb, dial(HOST_SANDBOX_NAME, port)).await?;
    ensure!(
        r.exit_code != 0 && r.stderr_text().to_lowercase().contains("bad address"),
        "{what}: {HOST_SANDBOX_NAME} resolved with no host port granted: exit {} stdout {:?} stderr {:?}",
        r.exit_code,
        r.stdout_text(),
        r.stderr_text()
    );
    Ok(())
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

/// This host's own IPv4 addresses but loopback and `except` (from this process's
/// `/proc/net/fib_trie`): where the servers also listen.
fn other_host_addresses(except: Ipv4Addr) -> Vec<Ipv4Addr> {
    let text = std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for w in lines.windows(2) {
        if w[1].contains("/32 host LOCAL")
            && let Some(a) = w[0].trim().strip_prefix("|-- ")
            && let Ok(ip) = a.trim().parse::<Ipv4Addr>()
            && !ip.is_loopback()
            && ip != except
            && !out.contains(&ip)
        {
            out.push(ip);
        }
    }
    out
}

/// The granted port answers by name and at the gateway; the neighbouring port does not,
/// by name or address.
async fn only_the_granted_port(
    sb: &dyn Sandbox,
    s: &HostServers,
    gw: Ipv4Addr,
    what: &str,
) -> anyhow::Result<()> {
    let gw = gw.to_string();
    expect_reached(sb, HOST_SANDBOX_NAME, s.granted, &s.granted_token, what).await?;
    expect_reached(sb, &gw, s.granted, &s.granted_token, what).await?;
    expect_blocked(
        sb,
        HOST_SANDBOX_NAME,
        s.neighbour,
        &s.neighbour_token,
        &format!("{what}, the neighbouring port by name"),
    )
    .await?;
    expect_blocked(
        sb,
        &gw,
        s.neighbour,
        &s.neighbour_token,
        &format!("{what}, the neighbouring port at the gateway"),
    )
    .await
}

/// Under a default of deny with one host port granted: the port is reachable at
/// `host.sandbox.internal` and at the gateway, the neighbouring port is not, the host's
/// other addresses are not on the granted port, nor is the metadata address.
async fn a_granted_port_is_reachable_and_no_other_of_the_host(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("a_granted_port_is_reachable_and_no_other_of_the_host");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let s = host_servers().await?;
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::deny().host_port(port(s.granted)?)),
        )
        .await?;
    let gw = default_gateway(&*sb).await?;
    only_the_granted_port(&*sb, &s, gw, "deny by default, one host port").await?;
    for addr in other_host_addresses(gw) {
        expect_blocked(
            &*sb,
            &addr.to_string(),
            s.granted,
            &s.granted_token,
            "another address of the host, on the granted port",
        )
        .await?;
    }
    expect_blocked(
        &*sb,
        "169.254.169.254",
        s.granted,
        "ami-id",
        "the metadata address, on the granted port",
    )
    .await?;
    sb.kill().await
}

/// Root inside holds neither NET_ADMIN nor NET_RAW; its attempts to flush the rules, add
/// one for the neighbouring port, or point the name elsewhere fail, and afterwards the
/// neighbour is still refused and the granted port still answers.
async fn root_inside_cannot_open_the_neighbouring_port(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("root_inside_cannot_open_the_neighbouring_port");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let s = host_servers().await?;
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::deny().host_port(port(s.granted)?)),
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
    let gw = default_gateway(&*sb).await?;
    let n = s.neighbour;
    for attempt in [
        "nft flush ruleset".to_string(),
        format!("nft insert rule inet sbx_egress out ip daddr {gw} tcp dport {n} accept"),
        format!("nft add element inet sbx_egress hostports {{ {n} }}"),
        "iptables -I OUTPUT -j ACCEPT".to_string(),
        "ip route del default".to_string(),
    ] {
        let r = run(&*sb, Command::Shell(attempt.clone())).await?;
        ensure!(
            r.exit_code != 0,
            "`{attempt}` succeeded as root inside the sandbox"
        );
    }
    only_the_granted_port(&*sb, &s, gw, "after root's attempts").await?;
    sb.kill().await
}

/// Beside an allowlist the host port is one more way out, not a wider one; it is part of
/// the policy a live change replaces: set without it, the port is refused and the name
/// no longer resolves; set with the neighbouring port instead, that one answers and the
/// first is refused. The policy read back is the one set.
async fn host_ports_beside_an_allowlist_change_with_the_policy(
    ctx: Arc<Ctx>,
) -> anyhow::Result<()> {
    let c = case("host_ports_beside_an_allowlist_change_with_the_policy");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let names = match ctx.probes.egress_names() {
        Some(n) => n,
        None => return Err(Skip("no egress_names probe".into()).into()),
    };
    let listed = EgressRule::parse(&names.listed).map_err(|e| anyhow::anyhow!("{}", e.render()))?;
    let s = host_servers().await?;
    let list = EgressTiers::deny_by_default().allow(listed);
    let with_port = list.clone().host_port(port(s.granted)?);
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::tiers(with_port.clone())),
        )
        .await?;
    let gw = default_gateway(&*sb).await?;
    expect_reached(
        &*sb,
        &names.listed,
        canary.port,
        &canary.token,
        "the allowlisted name beside a host port",
    )
    .await?;
    only_the_granted_port(&*sb, &s, gw, "an allowlist and one host port").await?;
    let read = sbx(sb.egress().await, "egress")?;
    ensure!(
        read == Egress::Tiers(with_port.clone()),
        "read back {read}, created with {}",
        Egress::Tiers(with_port)
    );

    // The policy without the port: the port is closed, the name gone, the list kept.
    sbx(
        sb.set_egress(Egress::Tiers(list.clone())).await,
        "set_egress without the host port",
    )?;
    expect_blocked(
        &*sb,
        &gw.to_string(),
        s.granted,
        &s.granted_token,
        "the host port after a change without it",
    )
    .await?;
    expect_name_refused(&*sb, s.granted, "after a change without host ports").await?;
    expect_reached(
        &*sb,
        &names.listed,
        canary.port,
        &canary.token,
        "the allowlisted name after the change",
    )
    .await?;

    // The neighbouring port instead: it answers, the first does not.
    let swapped = list.host_port(port(s.neighbour)?);
    sbx(
        sb.set_egress(Egress::Tiers(swapped.clone())).await,
        "set_egress with the neighbouring port",
    )?;
    expect_reached(
        &*sb,
        HOST_SANDBOX_NAME,
        s.neighbour,
        &s.neighbour_token,
        "the newly granted port",
    )
    .await?;
    expect_blocked(
        &*sb,
        HOST_SANDBOX_NAME,
        s.granted,
        &s.granted_token,
        "the port no longer granted",
    )
    .await?;
    let read = sbx(sb.egress().await, "egress after the changes")?;
    ensure!(
        read == Egress::Tiers(swapped.clone()),
        "read back {read}, set {}",
        Egress::Tiers(swapped)
    );
    sb.kill().await
}

/// After a stop and a start (a new network namespace on a container engine) the granted
/// port answers again and the neighbouring one is still refused.
async fn host_ports_hold_after_stop_and_start(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("host_ports_hold_after_stop_and_start");
    if refused_when_undeclared(&ctx, &c).await? {
        return Ok(());
    }
    let s = host_servers().await?;
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .network(NetworkPolicy::deny().host_port(port(s.granted)?)),
        )
        .await?;
    let gw = default_gateway(&*sb).await?;
    only_the_granted_port(&*sb, &s, gw, "before the stop").await?;
    sbx(sb.stop().await, "stop")?;
    sbx(sb.start().await, "start")?;
    let gw = default_gateway(&*sb).await?;
    only_the_granted_port(&*sb, &s, gw, "after stop and start").await?;
    sb.kill().await
}

/// Port 0 is no host port, a port granted twice and more than [`MAX_HOST_PORTS`] are
/// refused with `Configuration` before anything is provisioned, on every backend.
async fn bad_host_ports_are_refused(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("bad_host_ports_are_refused");
    ensure!(
        HostPort::new(0).is_err_and(|e| e.code() == ErrorCode::Configuration),
        "port 0 was taken as a host port"
    );
    let p = port(8080)?;
    ensure!(
        EgressTiers::deny_by_default()
            .host_port(p)
            .host_port(p)
            .host_ports
            == vec![p],
        "granting a port twice through the builder listed it twice"
    );
    let mut twice = EgressTiers::deny_by_default();
    twice.host_ports = vec![p, p];
    let mut many = EgressTiers::deny_by_default();
    for i in 0..=MAX_HOST_PORTS {
        many = many.host_port(port(9000 + i as u16)?);
    }
    for (what, tiers) in [("a port twice", twice), ("too many ports", many)] {
        let r = ctx
            .backend
            .create(ctx.opts(&c).network(NetworkPolicy::tiers(tiers)))
            .await;
        must_code(r, ErrorCode::Configuration).context(what)?;
    }
    if ctx.backend.as_reapable().is_some() {
        let left = ctx.listed(&c).await?;
        ensure!(left.is_empty(), "a refused host port provisioned {left:?}");
    }
    Ok(())
}
