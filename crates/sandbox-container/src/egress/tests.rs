use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use super::*;

#[test]
fn cidrs_parse_and_normalise() {
    let c: Cidr = "10.1.2.3/8".parse().unwrap();
    assert_eq!(c.to_string(), "10.0.0.0/8");
    assert_eq!(
        "fd00::1".parse::<Cidr>().unwrap().to_string(),
        "fd00::1/128"
    );
    assert!("10.0.0.0/33".parse::<Cidr>().is_err());
    assert!("host".parse::<Cidr>().is_err());
    assert!(
        always_blocked()
            .iter()
            .any(|c| c.to_string() == "169.254.0.0/16")
    );
}

fn blocked(cidr: &str, what: &str) -> Blocked {
    Blocked {
        cidr: cidr.parse().unwrap(),
        what: what.into(),
    }
}

/// The part of the blocked set only known at create (the host's addresses, the engine's
/// networks): an allowlist network inside it is refused, one that merely contains it is
/// not (the rules keep the blocked part blocked), an explicit override lets it through.
#[test]
fn an_allowlist_network_inside_the_host_or_an_engine_network_is_refused() {
    let block = [
        blocked("192.168.1.10/32", "an address of this host"),
        blocked("fd12::10/128", "an address of this host"),
        blocked("172.17.0.0/16", "the docker network `bridge`"),
        blocked("172.30.0.1/32", "the host's address on `sbx-egress`"),
    ];
    let check = |policy: &NetworkPolicy| {
        let rules = policy.egress.rules().unwrap();
        refused_entry(policy, &rules, &block)
    };
    for bad in [
        "192.168.1.10",
        "192.168.1.10/32",
        "fd12::10",
        "172.17.0.0/16",
        "172.17.0.2",
        "172.17.128.0/17",
        "172.30.0.1",
    ] {
        let e = check(&NetworkPolicy::allow_list(["pypi.org", bad])).expect_err(bad);
        assert_eq!(e.code(), sandbox_core::ErrorCode::Configuration, "{bad}");
        assert!(
            e.to_string().contains(bad.split('/').next().unwrap()),
            "{e}"
        );
    }
    for ok in [
        "192.168.1.0/24",
        "fd12::/64",
        "172.16.0.0/12",
        "172.30.0.2",
        "10.0.0.0/8",
        "pypi.org",
    ] {
        assert!(check(&NetworkPolicy::allow_list([ok])).is_ok(), "{ok}");
    }
    let host = sandbox_core::BlockedSetOverride::network("192.168.1.10").unwrap();
    let p = NetworkPolicy::allow_list(["192.168.1.10"]).through_blocked_set(host);
    assert!(check(&p).is_ok());
    assert_eq!(override_networks(&p), ["192.168.1.10/32".parse().unwrap()]);
}

#[test]
fn the_mode_follows_the_policy() {
    let net = NetworkInfo::new(
        NETWORK_NAME,
        vec![crate::engine::Subnet::parse("172.30.0.0/16", Some("172.30.0.1")).unwrap()],
        BTreeMap::new(),
    );
    assert_eq!(
        network_mode(&NetworkPolicy::deny(), Some(&net)),
        NetworkMode::None
    );
    let m = network_mode(
        &NetworkPolicy::allow_list(["a.org"]).ingress_port(80),
        Some(&net),
    );
    assert_eq!(
        m,
        NetworkMode::Isolated {
            network: NETWORK_NAME.into(),
            publish: vec![80],
            dns: vec!["172.30.0.1".parse().unwrap()],
        }
    );
    // An engine without networks keeps its bridge for Allow (never a silent deny).
    assert_eq!(
        network_mode(&NetworkPolicy::allow(), None),
        NetworkMode::Bridge { publish: vec![] }
    );
    assert!(needs_network(&NetworkPolicy::allow()));
    assert!(!needs_network(&NetworkPolicy::deny()));
}

/// A process in a network namespace of its own (`unshare --net`), the stand-in for a
/// container's first process; killed on drop.
struct Netns(tokio::process::Child);

impl Netns {
    async fn new() -> Option<Netns> {
        if host::support().is_err() {
            return None;
        }
        let child = tokio::process::Command::new("unshare")
            .args(["--net", "sleep", "60"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .ok()?;
        // unshare execs sleep in the new namespace; wait until the switch is visible.
        let pid = child.id()?;
        let own = std::fs::read_link("/proc/self/ns/net").ok()?;
        for _ in 0..100 {
            if std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()? != own {
                return Some(Netns(child));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }
    fn pid(&self) -> u32 {
        self.0.id().unwrap_or(0)
    }
}

/// The inode of `pid`'s network namespace.
fn inode(pid: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(netns::of_pid(pid)).unwrap().ino()
}

/// A sandbox state of `egress` in a temporary directory of its own (never the host's
/// state directory), removed when the returned guard drops.
fn test_state(name: &str, egress: &Egress) -> (state::Files, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix("sbx-egress-test-")
        .tempdir()
        .unwrap();
    let files = state::Files::in_dir(dir.path(), name);
    let st = state::State::new(egress, vec![], "127.0.0.1:53".parse().unwrap(), 1, 1).unwrap();
    files.write(&st).unwrap();
    (files, dir)
}

fn sample_rules() -> nft::Ruleset {
    nft::Ruleset {
        allow_all: false,
        exempt: vec![],
        allow: vec!["10.9.0.0/16".parse().unwrap(), "fd00::/8".parse().unwrap()],
        block: always_blocked()
            .into_iter()
            .chain([
                "10.9.3.0/24".parse().unwrap(),
                "172.17.0.0/16".parse().unwrap(),
            ])
            .collect(),
        resolver: Some("172.30.0.1:40000".parse().unwrap()),
        ..Default::default()
    }
}

/// A change re-pins the names answered so far into the set of the tier that grants them
/// now, and leaves out those it no longer lets through; the tiers' networks land in their
/// sets; a new policy whose allow network lies inside the blocked set is refused.
#[test]
fn a_change_re_pins_the_names_still_let_through() {
    let (files, _dir) = test_state("repin", &Egress::Allow);
    let pin = |name: &str, a: &str| state::Pin {
        name: name.into(),
        addrs: vec![a.parse().unwrap()],
    };
    files
        .add_pin(state::PinTier::Allow, &pin("api.example.com", "198.18.1.1"))
        .unwrap();
    files
        .add_pin(
            state::PinTier::Allow,
            &pin("build.example.com", "198.18.1.2"),
        )
        .unwrap();
    files
        .add_pin(state::PinTier::Allow, &pin("pypi.org", "198.18.1.3"))
        .unwrap();
    let rule = |r: &str| EgressRule::parse(r).unwrap();
    let tiers = EgressTiers::deny_by_default()
        .allow(rule("*.example.com"))
        .deny(rule("*.example.com"))
        .except(rule("api.example.com"))
        .deny(rule("10.0.0.0/8"))
        .allow(rule("10.9.0.0/16"));
    let block = vec![blocked("172.17.0.0/16", "the docker network `bridge`")];
    let r = ruleset_for(
        &Egress::Tiers(tiers),
        &[],
        block.clone(),
        &NetworkPolicy::deny(),
        &files,
    )
    .unwrap();
    assert_eq!(
        r.pinned_except,
        vec!["198.18.1.1".parse::<IpAddr>().unwrap()]
    );
    assert!(
        r.pinned_allow.is_empty(),
        "denied and unlisted names are not re-pinned: {r:?}"
    );
    assert_eq!(r.deny, vec!["10.0.0.0/8".parse::<Cidr>().unwrap()]);
    assert_eq!(r.allow, vec!["10.9.0.0/16".parse::<Cidr>().unwrap()]);
    assert!(!r.allow_all);
    assert_eq!(files.pins().len(), 1, "only the kept pin stays recorded");
    let e = ruleset_for(
        &Egress::AllowList(vec!["172.17.0.5".into()]),
        &[],
        block,
        &NetworkPolicy::deny(),
        &files,
    )
    .unwrap_err();
    assert_eq!(e.code(), sandbox_core::ErrorCode::Configuration);
    files.remove();
}

/// Needs root and nft (the same as the feature): without them the test fails, naming why,
/// unless SBX_EGRESS_TESTS=skip says this host cannot run it.
fn require_host() -> bool {
    if std::env::var("SBX_EGRESS_TESTS").as_deref() == Ok("skip") {
        return false;
    }
    if let Err(e) = host::support() {
        panic!(
            "egress tests need root and nft ({e}); set SBX_EGRESS_TESTS=skip on a host without them"
        );
    }
    true
}

#[tokio::test]
async fn rules_load_into_a_namespace_and_read_back() {
    if !require_host() {
        return;
    }
    let ns = Netns::new().await.expect("unshare --net");
    let rules = sample_rules();
    nft::load(&netns::of_pid(ns.pid()), &rules).await.unwrap();
    // Loading again replaces the table atomically (no duplicate table, no error).
    nft::load(&netns::of_pid(ns.pid()), &rules).await.unwrap();
    nft::allow_addresses(
        &netns::of_pid(ns.pid()),
        &["192.0.2.7".parse().unwrap(), "2001:db8::7".parse().unwrap()],
        false,
    )
    .await
    .unwrap();
    let listing = nft::nft(
        &netns::of_pid(ns.pid()),
        &["list", "table", "inet", TABLE],
        "",
    )
    .await
    .unwrap();
    assert!(listing.contains("192.0.2.7"), "{listing}");
    assert!(listing.contains("2001:db8::7"), "{listing}");
    // The host's own ruleset is untouched.
    let host = tokio::process::Command::new(host::nft_path())
        .args(["list", "tables"])
        .output()
        .await
        .unwrap();
    assert!(!String::from_utf8_lossy(&host.stdout).contains(TABLE));
}

/// Granted host ports load into a real namespace and read back as loaded (nft prints
/// them as numbers in the set, the rule ahead of the blocked set); a listing checked
/// against other ports is refused.
#[tokio::test]
async fn host_ports_load_and_read_back() {
    if !require_host() {
        return;
    }
    let ns = Netns::new().await.expect("unshare --net");
    let rules = nft::Ruleset {
        host_ports: vec![8080, 8443],
        ..sample_rules()
    };
    nft::load(&netns::of_pid(ns.pid()), &rules).await.unwrap();
    let listing = nft::nft(
        &netns::of_pid(ns.pid()),
        &["list", "table", "inet", TABLE],
        "",
    )
    .await
    .unwrap();
    assert!(
        listing.contains("ip daddr 172.30.0.1 tcp dport @hostports accept"),
        "{listing}"
    );
    let other = nft::Ruleset {
        host_ports: vec![8080],
        ..sample_rules()
    };
    let e = nft::verify(&listing, &other).unwrap_err();
    assert!(e.contains("8443"), "{e}");
}

/// `host.sandbox.internal` is answered with the host's address on the sandbox's network
/// (where the resolver listens) while the policy grants a host port, NXDOMAIN once a
/// change drops them, and never pinned (the rules accept that address on the ports only).
#[tokio::test]
async fn the_resolver_answers_the_host_name_only_while_a_port_is_granted() {
    if !require_host() {
        return;
    }
    let ns = Netns::new().await.expect("unshare --net");
    nft::load(&netns::of_pid(ns.pid()), &sample_rules())
        .await
        .unwrap();
    let r = resolver::resolver().unwrap();
    // A source address no other test uses.
    let src: IpAddr = "203.0.113.78".parse().unwrap();
    let granted = EgressTiers::deny_by_default()
        .allow(EgressRule::parse("*.sandbox.internal").unwrap())
        .host_port(sandbox_core::HostPort::new(8080).unwrap());
    let (files, _dir) = test_state("hostname", &Egress::Tiers(granted));
    r.register(&[src], ns.pid(), inode(ns.pid()), files.clone())
        .unwrap();
    let name = sandbox_core::HOST_SANDBOX_NAME;
    let a = r
        .answer(&dns::build_query(1, name, dns::TYPE_A), src, 512)
        .await
        .unwrap();
    // test_state records the resolver at 127.0.0.1.
    assert_eq!(
        dns::answer_addrs(&a),
        vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
    );
    let six = r
        .answer(&dns::build_query(2, name, dns::TYPE_AAAA), src, 512)
        .await
        .unwrap();
    assert_eq!(dns::rcode_of(&six), Some(0));
    assert!(dns::answer_addrs(&six).is_empty());
    let listing = nft::nft(
        &netns::of_pid(ns.pid()),
        &["list", "set", "inet", TABLE, "dyn4"],
        "",
    )
    .await
    .unwrap();
    assert!(
        !listing.contains("127.0.0.1"),
        "the host name was pinned: {listing}"
    );
    // No host port any more: NXDOMAIN, although a wildcard lists the domain.
    let mut st = files.read().unwrap().unwrap();
    st.set_egress(&Egress::Tiers(
        EgressTiers::deny_by_default().allow(EgressRule::parse("*.sandbox.internal").unwrap()),
    ))
    .unwrap();
    files.write(&st).unwrap();
    let no = r
        .answer(&dns::build_query(3, name, dns::TYPE_A), src, 512)
        .await
        .unwrap();
    assert_eq!(dns::rcode_of(&no), Some(3), "no host port: NXDOMAIN");
    files.remove();
}

#[tokio::test]
async fn a_failing_load_is_an_error() {
    if !require_host() {
        return;
    }
    // A pid with no namespace to enter.
    let e = nft::load(&netns::of_pid(u32::MAX - 1), &sample_rules())
        .await
        .unwrap_err();
    assert!(!e.is_empty());
}

struct Names(Vec<(&'static str, IpAddr)>);

impl Lookup for Names {
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let found: Vec<IpAddr> = self
                .0
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, a)| *a)
                .collect();
            if found.is_empty() {
                Err(std::io::ErrorKind::NotFound.into())
            } else {
                Ok(found)
            }
        })
    }
}

/// `n<i>.…` → 198.18.9.<i>: a new address for every name.
struct Counting;

impl Lookup for Counting {
    fn lookup<'a>(&'a self, name: &'a str) -> BoxFuture<'a, std::io::Result<Vec<IpAddr>>> {
        let i: u8 = name
            .strip_prefix('n')
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Box::pin(std::future::ready(Ok(vec![IpAddr::from([198, 18, 9, i])])))
    }
}

#[tokio::test]
async fn the_resolver_pins_listed_names_and_refuses_the_rest() {
    if !require_host() {
        return;
    }
    let ns = Netns::new().await.expect("unshare --net");
    nft::load(&netns::of_pid(ns.pid()), &sample_rules())
        .await
        .unwrap();
    let r = resolver::resolver().unwrap();
    r.set_lookup(Arc::new(Names(vec![
        ("api.sbx.test", "198.18.7.1".parse().unwrap()),
        ("x.wild.sbx.test", "198.18.7.2".parse().unwrap()),
        ("other.sbx.test", "198.18.7.3".parse().unwrap()),
    ])));
    // A source address no other test uses.
    let src: IpAddr = "203.0.113.77".parse().unwrap();
    let (files, _dir) = test_state(
        "pins",
        &Egress::AllowList(vec!["api.sbx.test".into(), "*.wild.sbx.test".into()]),
    );
    r.register(&[src], ns.pid(), inode(ns.pid()), files.clone())
        .unwrap();
    let ask = |name: &str| dns::build_query(1, name, dns::TYPE_A);
    let a = r.answer(&ask("api.sbx.test"), src, 512).await.unwrap();
    assert_eq!(
        dns::answer_addrs(&a),
        vec!["198.18.7.1".parse::<IpAddr>().unwrap()]
    );
    let a = r.answer(&ask("X.Wild.sbx.test."), src, 512).await.unwrap();
    assert_eq!(dns::answer_addrs(&a).len(), 1);
    let listing = nft::nft(
        &netns::of_pid(ns.pid()),
        &["list", "set", "inet", TABLE, "dyn4"],
        "",
    )
    .await
    .unwrap();
    assert!(
        listing.contains("198.18.7.1") && listing.contains("198.18.7.2"),
        "answers pinned before the reply: {listing}"
    );
    // Asked again, a pinned answer costs no `nft` call: taken out of the set behind the
    // resolver's back (the workload cannot: no NET_ADMIN), it is not added again.
    nft::nft(
        &netns::of_pid(ns.pid()),
        &["delete", "element", "inet", TABLE, "dyn4", "{ 198.18.7.1 }"],
        "",
    )
    .await
    .unwrap();
    let a = r.answer(&ask("api.sbx.test"), src, 512).await.unwrap();
    assert_eq!(dns::answer_addrs(&a).len(), 1);
    let listing = nft::nft(
        &netns::of_pid(ns.pid()),
        &["list", "set", "inet", TABLE, "dyn4"],
        "",
    )
    .await
    .unwrap();
    assert!(
        !listing.contains("198.18.7.1"),
        "a repeated answer ran nft again: {listing}"
    );
    let no = r.answer(&ask("other.sbx.test"), src, 512).await.unwrap();
    assert_eq!(dns::rcode_of(&no), Some(3), "unlisted name: NXDOMAIN");
    let listing = nft::nft(
        &netns::of_pid(ns.pid()),
        &["list", "set", "inet", TABLE, "dyn4"],
        "",
    )
    .await
    .unwrap();
    assert!(
        !listing.contains("198.18.7.3"),
        "an unlisted answer is not pinned"
    );
    let stranger = r
        .answer(&ask("api.sbx.test"), "203.0.113.78".parse().unwrap(), 512)
        .await
        .unwrap();
    assert_eq!(dns::rcode_of(&stranger), Some(5), "unknown source: REFUSED");
    assert_eq!(
        dns::rcode_of(&r.answer(&[0, 7, 1], src, 512).await.unwrap()),
        Some(1),
        "garbage: FORMERR"
    );
    // A wildcard cannot grow the set without end: each name below it answers a new
    // address until the sandbox's cap (16 under test), then SERVFAIL, nothing pinned.
    r.set_lookup(Arc::new(Counting));
    let mut served = 0;
    let refused = loop {
        let a = r
            .answer(&ask(&format!("n{served}.wild.sbx.test")), src, 512)
            .await
            .unwrap();
        if dns::rcode_of(&a) != Some(0) {
            break a;
        }
        served += 1;
        assert!(served <= 64, "no cap on pinned addresses");
    };
    assert_eq!(dns::rcode_of(&refused), Some(2), "past the cap: SERVFAIL");
    // 198.18.7.1 and 198.18.7.2 were pinned above.
    assert_eq!(served, 16 - 2, "addresses pinned before the cap");
    let listing = nft::nft(
        &netns::of_pid(ns.pid()),
        &["list", "set", "inet", TABLE, "dyn4"],
        "",
    )
    .await
    .unwrap();
    assert!(
        !listing.contains(&format!("198.18.9.{served}")),
        "the refused answer was pinned: {listing}"
    );
    r.set_lookup(Arc::new(Names(vec![(
        "api.sbx.test",
        "198.18.7.1".parse().unwrap(),
    )])));
    drop(ns);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let gone = r.answer(&ask("api.sbx.test"), src, 512).await.unwrap();
    assert_eq!(
        dns::rcode_of(&gone),
        Some(5),
        "a sandbox that is gone resolves nothing"
    );
    r.set_lookup(Arc::new(HostLookup));
}

/// Host links a test made, deleted on drop (a bridge's ports go with it).
struct Links(Vec<String>);

impl Drop for Links {
    fn drop(&mut self) {
        for l in &self.0 {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", l])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn ip_ok(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn mac_of(link: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/net/{link}/address"))
        .unwrap()
        .trim()
        .to_string()
}

/// The flake this prevents: an unpinned bridge (netavark's) takes the lowest MAC of its
/// ports, so a sandbox starting or ending moved the gateway's MAC under every other
/// sandbox on the network and their connects stalled.
#[tokio::test]
async fn a_pinned_egress_bridge_keeps_its_mac_when_ports_come_and_go() {
    if !require_host() {
        return;
    }
    let tag = std::process::id() % 10_000;
    let (br, p1, p2) = (
        format!("sbxtb{tag}"),
        format!("sbxtp{tag}a"),
        format!("sbxtp{tag}b"),
    );
    let _links = Links(vec![br.clone(), p1.clone(), p2.clone()]);
    let gw: IpAddr = format!("198.19.{}.{}", tag / 250, tag % 250 + 1)
        .parse()
        .unwrap();
    ip_ok(&["link", "add", &br, "type", "bridge"]);
    ip_ok(&["addr", "add", &format!("{gw}/32"), "dev", &br]);
    // veth ends as ports (kernels without the dummy module have veth: engines need it).
    for (p, mac) in [(&p1, "02:5b:00:00:10:10"), (&p2, "02:5b:00:00:00:01")] {
        let peer = p.replace("sbxtp", "sbxtq");
        ip_ok(&[
            "link", "add", p, "address", mac, "type", "veth", "peer", "name", &peer,
        ]);
    }
    ip_ok(&["link", "set", &p1, "master", &br]);
    assert_eq!(mac_of(&br), "02:5b:00:00:10:10");
    // Unpinned, the bridge follows its lowest port: this is what broke connects.
    ip_ok(&["link", "set", &p2, "master", &br]);
    assert_eq!(mac_of(&br), "02:5b:00:00:00:01");
    ip_ok(&["link", "set", &p2, "nomaster"]);
    assert_eq!(mac_of(&br), "02:5b:00:00:10:10");

    assert_eq!(bridge::pin_mac(gw).await.unwrap(), Some(br.clone()));
    assert_eq!(mac_of(&br), "02:5b:00:00:10:10", "pinning changed the MAC");
    ip_ok(&["link", "set", &p2, "master", &br]);
    assert_eq!(
        mac_of(&br),
        "02:5b:00:00:10:10",
        "a new port moved a pinned MAC"
    );
    ip_ok(&["link", "set", &p1, "nomaster"]);
    assert_eq!(
        mac_of(&br),
        "02:5b:00:00:10:10",
        "a leaving port moved a pinned MAC"
    );
    // Already pinned: nothing to do. An address on no interface: nothing to do.
    assert_eq!(bridge::pin_mac(gw).await.unwrap(), None);
    assert_eq!(
        bridge::pin_mac("198.18.255.254".parse().unwrap())
            .await
            .unwrap(),
        None
    );
}

/// The host tools run as root: a relative `PATH` entry (`.`, `bin`) must never find them,
/// or whatever the current directory holds under that name would run as root.
#[test]
fn host_tools_are_found_in_absolute_directories_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let tool = "sbx-planted-tool";
    let planted = dir.path().join(tool);
    std::fs::write(&planted, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The same directory, named relative to the current one (no file in the checkout).
    let cwd = std::env::current_dir().unwrap();
    let up = "../".repeat(cwd.components().count().saturating_sub(1));
    let relative = PathBuf::from(format!(
        "{up}{}",
        dir.path().display().to_string().trim_start_matches('/')
    ));
    assert!(relative.is_relative() && relative.join(tool).is_file());
    assert_eq!(
        host::find_in(relative.as_os_str(), tool),
        None,
        "a relative PATH entry found {tool}"
    );
    assert_eq!(
        host::find_in(dir.path().as_os_str(), tool),
        Some(planted),
        "an absolute PATH entry is searched"
    );
}

/// One TCP DNS exchange from `src` to the resolver at `server`: whether any answer came.
async fn tcp_query(src: IpAddr, server: SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let sock = tokio::net::TcpSocket::new_v4()?;
        sock.bind(SocketAddr::new(src, 0))?;
        let mut conn = sock.connect(server).await?;
        let q = dns::build_query(7, "sbx-slots.invalid", dns::TYPE_A);
        let mut out = (q.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&q);
        conn.write_all(&out).await?;
        let mut len = [0u8; 2];
        conn.read_exact(&mut len).await?;
        Ok::<_, std::io::Error>(())
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), exchange).await,
        Ok(Ok(()))
    )
}

/// Connections held open from `src` to `server`, as many as `n`.
async fn hold_connections(src: IpAddr, server: SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        let Ok(sock) = tokio::net::TcpSocket::new_v4() else {
            break;
        };
        if sock.bind(SocketAddr::new(src, 0)).is_err() {
            break;
        }
        match sock.connect(server).await {
            Ok(c) => held.push(c),
            Err(_) => break,
        }
    }
    held
}

/// The resolver's slots go to sandboxes it knows, a fair share each: a stranger holding
/// hundreds of connections, or one sandbox doing so, cannot starve another sandbox's
/// queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolver_slots_go_to_known_sandboxes_a_share_each() {
    let r = resolver::resolver().unwrap();
    let gateway: IpAddr = "127.0.77.1".parse().unwrap();
    let server = r.listen(gateway).await.unwrap();
    let stranger: IpAddr = "127.0.77.2".parse().unwrap();
    let greedy: IpAddr = "127.0.77.3".parse().unwrap();
    let victim: IpAddr = "127.0.77.4".parse().unwrap();
    // Two sandboxes (this process's own namespace stands in for theirs), all names allowed.
    let (greedy_state, _greedy_dir) = test_state("greedy", &Egress::Allow);
    let (victim_state, _victim_dir) = test_state("victim", &Egress::Allow);
    r.register(
        &[greedy],
        std::process::id(),
        inode(std::process::id()),
        greedy_state,
    )
    .unwrap();
    r.register(
        &[victim],
        std::process::id(),
        inode(std::process::id()),
        victim_state,
    )
    .unwrap();
    let strangers = hold_connections(stranger, server, 300).await;
    assert!(
        strangers.len() >= 260,
        "held {} connections",
        strangers.len()
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        tcp_query(victim, server).await,
        "a stranger's idle connections starved a sandbox's query"
    );
    drop(strangers);
    let greedy_held = hold_connections(greedy, server, 300).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        tcp_query(victim, server).await,
        "one sandbox's idle connections starved another's query"
    );
    drop(greedy_held);
}
