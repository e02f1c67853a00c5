//! The nftables ruleset loaded into a sandbox's network namespace, and the commands that
//! load it, read it back and add resolved addresses, all run from the host through
//! `nsenter --net=/proc/<pid>/ns/net nft …`, so the workload (which has no `NET_ADMIN`)
//! never holds the means to change them.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::Cidr;

/// The table every rule lives in (`inet`: one table for IPv4 and IPv6).
pub(crate) const TABLE: &str = "sbx_egress";

/// Longest one `nsenter … nft` call may take (measured: ~5 ms; a wedged one must not
/// hang `create` or a DNS answer).
const NFT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the ruleset of one sandbox says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ruleset {
    /// `true` when the default is allow (egress `Allow`, or tiers that default to allow):
    /// everything no rule refuses is accepted; `false`: only what a rule accepts.
    pub allow_all: bool,
    /// The networks of explicit blocked-set overrides: the only rules evaluated before
    /// `block`, so the only ones that can open it.
    pub exempt: Vec<Cidr>,
    /// Exception networks: accepted after `block`, before `deny`.
    pub except: Vec<Cidr>,
    /// Deny networks: refused after the exceptions, before `allow`.
    pub deny: Vec<Cidr>,
    /// Networks listed by CIDR: accepted after `block` and `deny`, so the blocked and
    /// denied addresses inside a listed network stay out of reach.
    pub allow: Vec<Cidr>,
    /// Always blocked unless in `exempt`: link-local, metadata, the engine's networks
    /// (other sandboxes and the host's bridge addresses) and the host's own addresses.
    pub block: Vec<Cidr>,
    /// Where DNS (port 53, UDP and TCP) is redirected: the library's resolver.
    pub resolver: Option<std::net::SocketAddr>,
    /// Addresses the resolver pinned for exception names (`xdyn` sets), carried over a
    /// change.
    pub pinned_except: Vec<IpAddr>,
    /// Addresses the resolver pinned for allowed names (`dyn` sets), carried over a
    /// change.
    pub pinned_allow: Vec<IpAddr>,
    /// TCP ports of the host granted to the sandbox: accepted to the host's address on
    /// the sandbox's network (the resolver's address) only, ahead of the blocked set that
    /// holds that address. Every other port and address of the host stays blocked.
    pub host_ports: Vec<u16>,
    /// The credentials proxy of this sandbox, when it has brokered credentials: TCP to
    /// the bound hosts' addresses on ports 80 and 443 is redirected to it, every other
    /// port of those addresses is refused, ahead of every accepting rule.
    pub proxy: Option<Proxy>,
}

/// Where a sandbox's traffic to its bound hosts goes instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proxy {
    /// The proxy's port on the host's address on the sandbox's network (the resolver's).
    pub port: u16,
    /// The bound hosts' IPv4 addresses, resolved at create (the resolver answers the
    /// bound names with these and nothing else).
    pub addrs: Vec<std::net::Ipv4Addr>,
}

/// The set of bound hosts' addresses (IPv4: the redirect goes to the IPv4 gateway).
const PROXIED_SET: &str = "proxied4";

fn elements(cidrs: &[Cidr], v4: bool) -> Vec<String> {
    cidrs
        .iter()
        .filter(|c| c.addr.is_ipv4() == v4)
        .map(|c| c.to_string())
        .collect()
}

fn addresses(addrs: &[IpAddr], v4: bool) -> Vec<String> {
    addrs
        .iter()
        .filter(|a| a.is_ipv4() == v4)
        .map(|a| a.to_string())
        .collect()
}

fn plain_set(out: &mut String, name: &str, ty: &str, elems: &[String]) {
    let _ = writeln!(out, "  set {name} {{");
    let _ = writeln!(out, "    type {ty};");
    if !elems.is_empty() {
        let _ = writeln!(out, "    elements = {{ {} }}", elems.join(", "));
    }
    let _ = writeln!(out, "  }}");
}

fn interval_set(out: &mut String, name: &str, ty: &str, elems: &[String]) {
    let _ = writeln!(out, "  set {name} {{");
    let _ = writeln!(out, "    type {ty}; flags interval; auto-merge;");
    if !elems.is_empty() {
        let _ = writeln!(out, "    elements = {{ {} }}", elems.join(", "));
    }
    let _ = writeln!(out, "  }}");
}

impl Ruleset {
    /// The `nft -f` text. The table is deleted and recreated in the same transaction, so
    /// loading is atomic: the namespace never runs with half a ruleset.
    pub(crate) fn text(&self) -> String {
        let mut t = String::new();
        // `add` then `delete` makes the delete succeed whether or not the table existed.
        let _ = writeln!(t, "add table inet {TABLE}");
        let _ = writeln!(t, "delete table inet {TABLE}");
        let _ = writeln!(t, "table inet {TABLE} {{");
        interval_set(
            &mut t,
            "exempt4",
            "ipv4_addr",
            &elements(&self.exempt, true),
        );
        interval_set(
            &mut t,
            "exempt6",
            "ipv6_addr",
            &elements(&self.exempt, false),
        );
        interval_set(&mut t, "allow4", "ipv4_addr", &elements(&self.allow, true));
        interval_set(&mut t, "allow6", "ipv6_addr", &elements(&self.allow, false));
        interval_set(&mut t, "block4", "ipv4_addr", &elements(&self.block, true));
        interval_set(&mut t, "block6", "ipv6_addr", &elements(&self.block, false));
        interval_set(
            &mut t,
            "except4",
            "ipv4_addr",
            &elements(&self.except, true),
        );
        interval_set(
            &mut t,
            "except6",
            "ipv6_addr",
            &elements(&self.except, false),
        );
        interval_set(&mut t, "deny4", "ipv4_addr", &elements(&self.deny, true));
        interval_set(&mut t, "deny6", "ipv6_addr", &elements(&self.deny, false));
        plain_set(
            &mut t,
            "dyn4",
            "ipv4_addr",
            &addresses(&self.pinned_allow, true),
        );
        plain_set(
            &mut t,
            "dyn6",
            "ipv6_addr",
            &addresses(&self.pinned_allow, false),
        );
        plain_set(
            &mut t,
            "xdyn4",
            "ipv4_addr",
            &addresses(&self.pinned_except, true),
        );
        plain_set(
            &mut t,
            "xdyn6",
            "ipv6_addr",
            &addresses(&self.pinned_except, false),
        );
        let ports: Vec<String> = self.host_ports.iter().map(ToString::to_string).collect();
        plain_set(&mut t, HOST_PORTS_SET, "inet_service", &ports);
        let proxied: Vec<String> = self
            .proxy
            .iter()
            .flat_map(|p| p.addrs.iter().map(ToString::to_string))
            .collect();
        plain_set(&mut t, PROXIED_SET, "ipv4_addr", &proxied);
        // DNS to anywhere goes to the resolver. Loopback is left alone: an engine's own
        // in-namespace DNS (Docker's 127.0.0.11) forwards to the configured server, which
        // is the resolver, from this namespace, so it is redirected on its way out.
        let _ = writeln!(t, "  chain dns {{");
        let _ = writeln!(t, "    type nat hook output priority -150; policy accept;");
        let _ = writeln!(t, "    oifname \"lo\" return");
        if let Some(rule) = self.redirect_rule() {
            let _ = writeln!(t, "    {rule}");
        }
        if let Some(r) = self.resolver {
            let (fam, to) = match r.ip() {
                IpAddr::V4(ip) => ("ipv4", format!("ip to {ip}:{}", r.port())),
                IpAddr::V6(ip) => ("ipv6", format!("ip6 to [{ip}]:{}", r.port())),
            };
            let _ = writeln!(t, "    meta nfproto {fam} udp dport 53 dnat {to}");
            let _ = writeln!(t, "    meta nfproto {fam} tcp dport 53 dnat {to}");
        }
        let _ = writeln!(t, "  }}");
        let _ = writeln!(t, "  chain out {{");
        let _ = writeln!(t, "    type filter hook output priority 0; policy drop;");
        let _ = writeln!(t, "    oifname \"lo\" accept");
        // Only the sandbox's answers on connections that came in (a published port) pass
        // without a look at their destination. Every packet of a connection the sandbox
        // opened is judged like its first, so a change that forbids a destination cuts
        // the connections already open to it: their next packet is refused.
        let _ = writeln!(t, "    ct direction reply accept");
        let _ = writeln!(t, "    ct state related accept");
        // The proxy, then the bound hosts' addresses refused on every port the redirect
        // did not take: ahead of every accepting rule, so no allowlist entry, override or
        // default of allow reaches a bound host except through the proxy.
        for rule in self.proxy_rules() {
            let _ = writeln!(t, "    {rule}");
        }
        if let Some(r) = self.resolver {
            let (m, ip) = match r.ip() {
                IpAddr::V4(ip) => ("ip", ip.to_string()),
                IpAddr::V6(ip) => ("ip6", ip.to_string()),
            };
            let _ = writeln!(t, "    {m} daddr {ip} udp dport {} accept", r.port());
            let _ = writeln!(t, "    {m} daddr {ip} tcp dport {} accept", r.port());
        }
        // Granted host ports: TCP to the granted ports of the host's address on this
        // network (where the resolver listens), nothing else of the host. Ahead of the
        // blocked set, which holds that address.
        if let Some(rule) = self.host_port_rule() {
            let _ = writeln!(t, "    {rule}");
        }
        // The blocked set comes before every listed network and every resolved address:
        // a CIDR that contains the host or the metadata service, or a name that resolves
        // into them, leaves them blocked. Only an explicit override goes first.
        for rule in OUT_ORDER {
            let _ = writeln!(t, "    {rule}");
        }
        if self.allow_all {
            let _ = writeln!(t, "    accept");
        }
        let _ = writeln!(t, "    jump refuse");
        let _ = writeln!(t, "  }}");
        // Rejected, not dropped: a blocked connect fails at once instead of timing out.
        let _ = writeln!(t, "  chain refuse {{");
        let _ = writeln!(t, "    meta l4proto tcp reject with tcp reset");
        let _ = writeln!(t, "    reject with icmpx type admin-prohibited");
        let _ = writeln!(t, "  }}");
        let _ = writeln!(t, "}}");
        t
    }

    /// The rule accepting the granted host ports (the same text `nft list` prints), when
    /// the ruleset has a resolver (the host's address on the network) to accept them at.
    fn host_port_rule(&self) -> Option<String> {
        let r = self.resolver?;
        let m = if r.ip().is_ipv4() { "ip" } else { "ip6" };
        Some(format!(
            "{m} daddr {} tcp dport @{HOST_PORTS_SET} accept",
            r.ip()
        ))
    }

    /// The redirect of the bound hosts' HTTP and HTTPS to the proxy (as `nft list`
    /// prints it), when there is a proxy and an IPv4 gateway to reach it at.
    fn redirect_rule(&self) -> Option<String> {
        let p = self.proxy.as_ref()?;
        let IpAddr::V4(gw) = self.resolver?.ip() else {
            return None;
        };
        Some(format!(
            "ip daddr @{PROXIED_SET} tcp dport {{ 80, 443 }} dnat ip to {gw}:{}",
            p.port
        ))
    }

    /// The output chain's proxy rules, in order: the proxy accepted, the bound hosts'
    /// addresses refused.
    fn proxy_rules(&self) -> Vec<String> {
        let (Some(p), Some(r)) = (&self.proxy, self.resolver) else {
            return Vec::new();
        };
        vec![
            format!("ip daddr {} tcp dport {} accept", r.ip(), p.port),
            format!("ip daddr @{PROXIED_SET} jump refuse"),
        ]
    }

    /// Every accepting line of the output chain as loaded (in the form `nft list` prints).
    fn accept_lines(&self) -> Vec<String> {
        let mut v: Vec<String> = [
            "oifname \"lo\" accept",
            "ct direction reply accept",
            "ct state related accept",
        ]
        .map(String::from)
        .to_vec();
        if let Some(r) = self.resolver {
            let m = if r.ip().is_ipv4() { "ip" } else { "ip6" };
            for proto in ["udp", "tcp"] {
                v.push(format!(
                    "{m} daddr {} {proto} dport {} accept",
                    r.ip(),
                    r.port()
                ));
            }
        }
        v.extend(self.host_port_rule());
        v.extend(self.proxy_rules().into_iter().take(1));
        v.extend(
            OUT_ORDER
                .iter()
                .filter(|r| r.ends_with(" accept"))
                .map(|r| r.to_string()),
        );
        if self.allow_all {
            v.push("accept".into());
        }
        v
    }

    /// Lines `nft list table` must show for this ruleset to be the one in force (nft
    /// prints its own normalised form, so the check is on the decisive statements).
    pub(crate) fn expected_listing(&self) -> Vec<String> {
        let mut v = vec![
            format!("table inet {TABLE}"),
            "type filter hook output priority filter; policy drop;".to_string(),
            "meta l4proto tcp reject with tcp reset".to_string(),
            "ct direction reply accept".to_string(),
        ];
        v.extend(OUT_ORDER.iter().map(|r| r.to_string()));
        if let Some(r) = self.resolver {
            v.push(format!("udp dport 53 dnat ip to {r}"));
            v.push(format!("tcp dport 53 dnat ip to {r}"));
        }
        v.extend(self.host_port_rule());
        v.extend(self.redirect_rule());
        v.extend(self.proxy_rules());
        v
    }
}

/// The lines of chain `name` in a trimmed `nft list table` listing (empty when absent).
fn chain_lines<'a>(lines: &[&'a str], name: &str) -> Vec<&'a str> {
    let head = format!("chain {name} {{");
    lines
        .iter()
        .skip_while(|l| **l != head)
        .skip(1)
        .take_while(|l| **l != "}")
        .copied()
        .collect()
}

/// The set of granted host ports (TCP, to the host's address on the sandbox's network).
const HOST_PORTS_SET: &str = "hostports";

/// The elements of the set `name` in a `nft list table` listing (as printed: `elements =
/// { 8080, 8081 }`, possibly over several lines); `None` when the set is not there.
fn listed_elements(listing: &str, name: &str) -> Option<Vec<String>> {
    let start = listing.find(&format!("set {name} {{"))?;
    let body = &listing[start..];
    let end = body.find('}')?;
    let body = &body[..end];
    let Some(at) = body.find("elements = {") else {
        return Some(Vec::new());
    };
    Some(
        body[at + "elements = {".len()..]
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// The set rules of the output chain, in the order they must be evaluated (and read
/// back): overrides, the blocked set, exceptions (listed and pinned), the deny list, then
/// listed networks and addresses pinned for allowed names.
const OUT_ORDER: [&str; 14] = [
    "ip daddr @exempt4 accept",
    "ip6 daddr @exempt6 accept",
    "ip daddr @block4 jump refuse",
    "ip6 daddr @block6 jump refuse",
    "ip daddr @except4 accept",
    "ip6 daddr @except6 accept",
    "ip daddr @xdyn4 accept",
    "ip6 daddr @xdyn6 accept",
    "ip daddr @deny4 jump refuse",
    "ip6 daddr @deny6 jump refuse",
    "ip daddr @allow4 accept",
    "ip6 daddr @allow6 accept",
    "ip daddr @dyn4 accept",
    "ip6 daddr @dyn6 accept",
];

/// The command entering the network namespace `ns` names (a held namespace's descriptor,
/// or `/proc/<pid>/ns/net`).
fn nsenter(ns: &Path) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(super::host::nsenter_path());
    let mut net = std::ffi::OsString::from("--net=");
    net.push(ns);
    c.arg(net)
        .arg("--")
        .arg(super::host::nft_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c
}

/// Runs `nft ARGS` in the namespace `ns` with `input` on stdin; its stdout, or its
/// stderr as the error.
pub(crate) async fn nft(ns: &Path, args: &[&str], input: &str) -> Result<String, String> {
    let run = async {
        let mut cmd = nsenter(ns);
        cmd.args(args);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run nsenter/nft: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .await
                .map_err(|e| format!("writing the ruleset to nft: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| format!("waiting for nft: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(format!(
                "nft {} failed ({}): {}",
                args.join(" "),
                out.status,
                err.chars().take(2000).collect::<String>().trim()
            ))
        }
    };
    match tokio::time::timeout(NFT_TIMEOUT, run).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "nft {} did not finish within {NFT_TIMEOUT:?}",
            args.join(" ")
        )),
    }
}

/// Loads `rules` into the namespace `ns`, then reads the table back and checks it.
pub(crate) async fn load(ns: &Path, rules: &Ruleset) -> Result<(), String> {
    nft(ns, &["-f", "-"], &rules.text()).await?;
    let listing = nft(ns, &["list", "table", "inet", TABLE], "").await?;
    verify(&listing, rules)
}

/// Checks a `nft list table` listing against what was loaded, the order of the output
/// chain's set rules included (an allowlist evaluated before the blocked set would open
/// it).
pub(crate) fn verify(listing: &str, rules: &Ruleset) -> Result<(), String> {
    let lines: Vec<&str> = listing.lines().map(str::trim).collect();
    for want in rules.expected_listing() {
        if !lines.iter().any(|l| l.contains(want.as_str())) {
            return Err(format!(
                "the egress rules read back without `{want}`: the ruleset in force is not the one loaded"
            ));
        }
    }
    let at = |rule: &str| lines.iter().position(|l| *l == rule);
    for pair in OUT_ORDER.windows(2) {
        if at(pair[0]) > at(pair[1]) {
            return Err(format!(
                "the egress rules read back with `{}` after `{}`: the ruleset in force is not the one loaded",
                pair[0], pair[1]
            ));
        }
    }
    let accepts_all = lines.contains(&"accept");
    if accepts_all != rules.allow_all {
        return Err("the egress rules read back with the wrong default".into());
    }
    // The host-port rule must run before the blocked set (else it opens nothing), and
    // the set must hold exactly the granted ports (one more would open another service
    // of the host).
    if let Some(rule) = rules.host_port_rule()
        && at(&rule) > at(OUT_ORDER[2]).min(at(OUT_ORDER[3]))
    {
        return Err(format!(
            "the egress rules read back with `{rule}` after the blocked set: the ruleset in force is not the one loaded"
        ));
    }
    // Nothing is accepted that was not loaded: an extra accept (the host's address on
    // every port, say) would open what the sets and their order keep shut.
    let known = rules.accept_lines();
    if let Some(extra) = chain_lines(&lines, "out")
        .into_iter()
        .find(|l| (l.ends_with(" accept") || *l == "accept") && !known.iter().any(|k| k == l))
    {
        return Err(format!(
            "the egress rules read back with `{extra}`, which was not loaded: the ruleset in force is not the one loaded"
        ));
    }
    verify_proxy(listing, &lines, rules)?;
    let mut want: Vec<String> = rules.host_ports.iter().map(ToString::to_string).collect();
    want.sort();
    let mut got = listed_elements(listing, HOST_PORTS_SET)
        .ok_or("the egress rules read back without the set of host ports")?;
    got.sort();
    if got != want {
        return Err(format!(
            "the egress rules read back with host ports {got:?}, {want:?} were loaded"
        ));
    }
    Ok(())
}

/// The credentials proxy's rules as read back: the redirect in the nat chain (the
/// expected lines already checked it is there, unaltered), the refusal of the bound
/// addresses ahead of every accepting rule but the proxy's own, and the set holding
/// exactly the bound addresses. A missing or altered redirect would let a bound host be
/// reached directly, or the proxy be skipped.
fn verify_proxy(listing: &str, lines: &[&str], rules: &Ruleset) -> Result<(), String> {
    let mut want: Vec<String> = rules
        .proxy
        .iter()
        .flat_map(|p| p.addrs.iter().map(ToString::to_string))
        .collect();
    want.sort();
    let mut got = listed_elements(listing, PROXIED_SET)
        .ok_or("the egress rules read back without the set of proxied addresses")?;
    got.sort();
    if got != want {
        return Err(format!(
            "the egress rules read back with proxied addresses {got:?}, {want:?} were loaded"
        ));
    }
    let out = chain_lines(lines, "out");
    let proxy = rules.proxy_rules();
    let Some(refuse) = proxy.get(1) else {
        // No proxy: nothing may be redirected.
        if let Some(l) = lines
            .iter()
            .find(|l| l.contains(&format!("@{PROXIED_SET}")) && !l.starts_with("set "))
        {
            return Err(format!(
                "the egress rules read back with `{l}`, which was not loaded: the ruleset in force is not the one loaded"
            ));
        }
        return Ok(());
    };
    let at = |rule: &str| out.iter().position(|l| *l == rule);
    let Some(refused_at) = at(refuse) else {
        return Err(format!(
            "the egress rules read back without `{refuse}`: the ruleset in force is not the one loaded"
        ));
    };
    if let Some(early) = out[..refused_at].iter().find(|l| {
        (l.ends_with(" accept") || **l == "accept")
            && !l.starts_with("ct ")
            && **l != "oifname \"lo\" accept"
            && **l != proxy[0]
    }) {
        return Err(format!(
            "the egress rules read back with `{early}` ahead of `{refuse}`: the ruleset in force is not the one loaded"
        ));
    }
    let nat = chain_lines(lines, "dns");
    if nat
        .iter()
        .filter(|l| l.contains(&format!("@{PROXIED_SET}")))
        .count()
        != 1
    {
        return Err(
            "the egress rules read back with a changed redirect to the credentials proxy: the ruleset in force is not the one loaded"
                .into(),
        );
    }
    Ok(())
}

/// Adds resolved addresses to the namespace's pinned sets: `dyn` for allowed names,
/// `xdyn` for exception names (`except`).
pub(crate) async fn allow_addresses(
    ns: &Path,
    addrs: &[IpAddr],
    except: bool,
) -> Result<(), String> {
    let prefix = if except { "xdyn" } else { "dyn" };
    let mut script = String::new();
    for (v4, fam) in [(true, "4"), (false, "6")] {
        let elems = addresses(addrs, v4);
        if !elems.is_empty() {
            let _ = writeln!(
                script,
                "add element inet {TABLE} {prefix}{fam} {{ {} }}",
                elems.join(", ")
            );
        }
    }
    if script.is_empty() {
        return Ok(());
    }
    nft(ns, &["-f", "-"], &script).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn sample(allow_all: bool) -> Ruleset {
        Ruleset {
            allow_all,
            exempt: vec![cidr("10.9.3.4/32")],
            except: vec![cidr("10.8.1.1/32")],
            deny: vec![cidr("10.8.0.0/16")],
            allow: vec![cidr("10.9.0.0/16"), cidr("fd00::/8")],
            block: vec![cidr("169.254.0.0/16"), cidr("fe80::/10")],
            resolver: Some("172.30.0.1:40000".parse().unwrap()),
            pinned_except: vec![],
            pinned_allow: vec!["198.18.0.7".parse().unwrap()],
            host_ports: vec![8080],
            proxy: None,
        }
    }

    #[test]
    fn the_ruleset_defaults_to_drop_and_rejects_the_rest() {
        let t = sample(false).text();
        assert!(t.contains("policy drop;"));
        assert!(t.contains("elements = { 10.9.0.0/16 }"));
        assert!(t.contains("elements = { fd00::/8 }"));
        assert!(t.contains("udp dport 53 dnat ip to 172.30.0.1:40000"));
        assert!(t.contains("ip daddr 172.30.0.1 tcp dport 40000 accept"));
        assert!(t.contains("elements = { 10.9.3.4/32 }"));
        assert!(!t.lines().any(|l| l.trim() == "accept"));
        assert!(sample(true).text().lines().any(|l| l.trim() == "accept"));
    }

    /// A listed CIDR that holds the metadata service or the host, and a name that
    /// resolves into them, must meet the blocked set first; only an explicit override is
    /// evaluated before it.
    #[test]
    fn the_blocked_set_is_evaluated_before_listed_and_resolved_addresses() {
        let t = sample(false).text();
        let at = |rule: &str| t.find(rule).unwrap_or_else(|| panic!("{rule} in {t}"));
        for (fam, n) in [("ip daddr", 4), ("ip6 daddr", 6)] {
            let exempt = at(&format!("{fam} @exempt{n} accept"));
            let block = at(&format!("{fam} @block{n} jump refuse"));
            let allow = at(&format!("{fam} @allow{n} accept"));
            let resolved = at(&format!("{fam} @dyn{n} accept"));
            assert!(exempt < block, "overrides go first");
            assert!(block < allow, "a listed CIDR opened the blocked set");
            assert!(block < resolved, "a resolved name opened the blocked set");
            let except = at(&format!("{fam} @except{n} accept"));
            let pinned_except = at(&format!("{fam} @xdyn{n} accept"));
            let deny = at(&format!("{fam} @deny{n} jump refuse"));
            assert!(
                block < except && except < deny,
                "exceptions: after block, before deny"
            );
            assert!(pinned_except < deny, "exception names before deny");
            assert!(deny < allow && deny < resolved, "deny beats allow");
        }
    }

    /// A table whose allowlist runs before the blocked set is not the one loaded.
    #[test]
    fn verify_catches_the_allowlist_ahead_of_the_blocked_set() {
        let r = sample(false);
        let good: String = r
            .text()
            .lines()
            .filter(|l| !l.starts_with("add table") && !l.starts_with("delete table"))
            .map(|l| l.replace("priority 0", "priority filter"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(verify(&good, &r), Ok(()));
        let swapped = good
            .replace("ip daddr @block4 jump refuse", "SWAP")
            .replace("ip daddr @allow4 accept", "ip daddr @block4 jump refuse")
            .replace("SWAP", "ip daddr @allow4 accept");
        let e = verify(&swapped, &r).unwrap_err();
        assert!(e.contains("@block4"), "{e}");
    }

    /// The listing `nft list table` would print for `r` (near enough for `verify`).
    fn listing(r: &Ruleset) -> String {
        r.text()
            .lines()
            .filter(|l| !l.starts_with("add table") && !l.starts_with("delete table"))
            .map(|l| l.replace("priority 0", "priority filter"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A granted host port is accepted to the host's address on the network (the
    /// resolver's) and that port only, before the blocked set that holds the address.
    #[test]
    fn host_ports_open_one_address_and_those_ports_only() {
        let r = sample(false);
        let t = r.text();
        let rule = "ip daddr 172.30.0.1 tcp dport @hostports accept";
        let at = |l: &str| t.find(l).unwrap_or_else(|| panic!("{l} in {t}"));
        assert!(at(rule) < at("ip daddr @block4 jump refuse"));
        assert!(at(rule) < at("ip6 daddr @block6 jump refuse"));
        assert!(
            t.contains("type inet_service;\n    elements = { 8080 }"),
            "{t}"
        );
        // No other rule names the host port set or the host's address.
        assert_eq!(t.matches("@hostports").count(), 1);
        assert_eq!(t.matches("172.30.0.1 tcp dport").count(), 2, "{t}");
        // None granted: the set is empty and opens nothing.
        let none = Ruleset {
            host_ports: vec![],
            ..sample(false)
        };
        assert!(!none.text().contains("elements = { 8080 }"));
        assert_eq!(verify(&listing(&none), &none), Ok(()));
    }

    /// A listing with another port in the set, or the host-port rule after the blocked
    /// set (or gone), is not the ruleset loaded.
    #[test]
    fn verify_catches_a_wrong_host_port_rule() {
        let r = sample(false);
        let good = listing(&r);
        assert_eq!(verify(&good, &r), Ok(()));
        let wider = good.replace("elements = { 8080 }", "elements = { 8080, 8081 }");
        let e = verify(&wider, &r).unwrap_err();
        assert!(e.contains("8081"), "{e}");
        let rule = "ip daddr 172.30.0.1 tcp dport @hostports accept";
        let late = good.replace(&format!("    {rule}\n"), "").replace(
            "    jump refuse\n  }",
            &format!("    {rule}\n    jump refuse\n  }}"),
        );
        assert!(late.contains(rule), "{late}");
        let e = verify(&late, &r).unwrap_err();
        assert!(e.contains("after the blocked set"), "{e}");
        let gone = good.replace(rule, "");
        assert!(verify(&gone, &r).is_err());
        // The host's address accepted on every port, beside the right rule.
        let whole = good.replace(
            &format!("    {rule}\n"),
            &format!("    {rule}\n    ip daddr 172.30.0.1 accept\n"),
        );
        let e = verify(&whole, &r).unwrap_err();
        assert!(e.contains("ip daddr 172.30.0.1 accept"), "{e}");
    }

    fn proxied() -> Ruleset {
        Ruleset {
            proxy: Some(Proxy {
                port: 40001,
                addrs: vec!["198.18.0.1".parse().unwrap()],
            }),
            ..sample(true)
        }
    }

    /// The bound hosts' HTTP and HTTPS go to the proxy, their other ports are refused,
    /// and both come before every accepting rule (a default of allow included).
    #[test]
    fn bound_hosts_are_redirected_to_the_proxy_ahead_of_every_accept() {
        let r = proxied();
        let t = r.text();
        let at = |l: &str| t.find(l).unwrap_or_else(|| panic!("{l} in {t}"));
        assert!(t.contains("ip daddr @proxied4 tcp dport { 80, 443 } dnat ip to 172.30.0.1:40001"));
        let refuse = at("ip daddr @proxied4 jump refuse");
        assert!(at("ip daddr 172.30.0.1 tcp dport 40001 accept") < refuse);
        for accept in [
            "ip daddr @exempt4 accept",
            "ip daddr @allow4 accept",
            "ip daddr @dyn4 accept",
            "tcp dport @hostports accept",
            "    accept\n",
        ] {
            assert!(refuse < at(accept), "{accept} ahead of the refusal");
        }
        assert_eq!(verify(&listing(&r), &r), Ok(()));
    }

    /// The attack the read-back must catch: a table in force whose redirect is gone or
    /// changed, or whose refusal of the bound addresses is gone or comes after an accept,
    /// would give the sandbox a direct path to a bound host.
    #[test]
    fn verify_catches_a_missing_or_altered_redirect() {
        let r = proxied();
        let good = listing(&r);
        let redirect = "ip daddr @proxied4 tcp dport { 80, 443 } dnat ip to 172.30.0.1:40001";
        let refuse = "ip daddr @proxied4 jump refuse";
        let tampered = [
            ("redirect gone", good.replace(redirect, "")),
            (
                "redirect to another port",
                good.replace(redirect, &redirect.replace("40001", "40002")),
            ),
            (
                "https only",
                good.replace(redirect, &redirect.replace("{ 80, 443 }", "443")),
            ),
            (
                "an address left out",
                good.replace("elements = { 198.18.0.1 }", ""),
            ),
            ("refusal gone", good.replace(refuse, "")),
            (
                "refusal after the allowlist",
                good.replace(&format!("    {refuse}\n"), "").replace(
                    "    ip daddr @allow4 accept\n",
                    &format!("    ip daddr @allow4 accept\n    {refuse}\n"),
                ),
            ),
            (
                "a second redirect elsewhere",
                good.replace(
                    redirect,
                    &format!("{redirect}\n    ip daddr @proxied4 tcp dport 8443 dnat ip to 198.18.0.1:443"),
                ),
            ),
        ];
        for (what, listing) in tampered {
            assert_ne!(listing, good, "{what}: the tampering changed nothing");
            assert!(
                verify(&listing, &r).is_err(),
                "{what}: read back as the loaded table"
            );
        }
        // A table without a proxy must not redirect anything either.
        let plain = sample(true);
        let smuggled = listing(&plain).replace(
            "    oifname \"lo\" return\n",
            &format!("    oifname \"lo\" return\n    {redirect}\n"),
        );
        assert!(verify(&smuggled, &plain).is_err());
    }

    #[test]
    fn verify_catches_a_different_ruleset() {
        let r = sample(false);
        assert!(verify("table inet other {}", &r).is_err());
    }
}
