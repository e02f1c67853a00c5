//! The egress-allowlist trials both adapters run against their real engine, beyond the
//! contract suite: a failing apply leaves no container, the rules in force are read from
//! the host (`nsenter` into the container's network namespace), the library network
//! survives a removal mid-create and is never confused with a foreign one, and the host's
//! own addresses are out of reach. Nothing leaves the machine (the canary is the egress
//! lab's, [`crate::egress_lab`]). Faults come from a [`TrialEngine`] around the real
//! engine.
//!
//! What only the engine's own API can tell (the container's pid, the library network's
//! options and labels) the adapter's test reads and hands over as a [`HostView`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sandbox_container::egress::{NETWORK_NAME, TABLE};
use sandbox_container::{ContainerBackend, ContainerConfig, ContainerEngine};
use sandbox_core::{Backend, Capability, ErrorCode, NetworkPolicy, Sandbox, SandboxExt};

use crate::egress_lab;
use crate::tagged::{managed_ids, test_options};
use crate::trial_engine::TrialEngine;

/// The image the tests create.
const BUSYBOX: &str = "sandbox-rs/busybox:latest";

/// The trials share the library network (one removes it mid-create, others count on it),
/// so they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What the engine's API says about a sandbox created with an allowlist.
#[derive(Debug, Clone, Default)]
pub struct HostView {
    /// The container's pid on the host (its network namespace is `/proc/<pid>/ns/net`).
    pub pid: i64,
    /// The options of the network the container joined.
    pub network_options: HashMap<String, String>,
    /// The labels of that network.
    pub network_labels: HashMap<String, String>,
}

/// A backend on `engine` (decorated for the trial) as the egress trials configure it.
async fn trial_backend<E: ContainerEngine>(
    engine: TrialEngine<E>,
) -> ContainerBackend<TrialEngine<E>> {
    ContainerBackend::new(engine, ContainerConfig::new(BUSYBOX).startup_sweep(false)).await
}

/// Waits until `b` holds no managed container of trial `test`, at most 10 s (a refused
/// create's removal may still be finishing), else fails naming what is left.
async fn nothing_left_within_10s<B: sandbox_core::ReapableBackend + ?Sized>(b: &B, test: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = managed_ids(b, test).await;
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A create whose allowlist fails to apply (the engine reports a container whose network
/// namespace cannot be entered, [`TrialEngine::unenterable_namespace_once`]) is a
/// `Creation` error saying the egress rules could not be applied, and the container it
/// made is gone within 10 s.
pub async fn a_failing_apply_leaves_no_container<E: ContainerEngine>(engine: E) {
    let _serial = SERIAL.lock().await;
    let b = trial_backend(TrialEngine::new(engine)).await;
    assert!(b.capabilities().contains(Capability::EGRESS_ALLOWLIST));
    b.engine().unenterable_namespace_once();
    let e = b
        .create(
            test_options(BUSYBOX, "egress-fail").network(NetworkPolicy::allow_list(["192.0.2.1"])),
        )
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Creation, "{}", e.render());
    assert!(
        e.render().contains("egress rules could not be applied"),
        "the failure is the egress apply's: {}",
        e.render()
    );
    nothing_left_within_10s(&b, "egress-fail").await;
}

/// A process in a network namespace of its own (`unshare --net sleep`): the "other
/// process" an engine's pid can name when this host does not see the engine's pids.
/// Killed and reaped on drop.
struct Decoy(std::process::Child);

impl Decoy {
    fn start() -> Decoy {
        let child = std::process::Command::new("unshare")
            .args(["--net", "sleep", "120"])
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("unshare --net (util-linux) runs as root");
        let decoy = Decoy(child);
        let own = std::fs::read_link("/proc/self/ns/net").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        // unshare execs sleep once the namespace is its own.
        while std::fs::read_link(decoy.ns_path()).ok().as_ref() == Some(&own) {
            assert!(
                Instant::now() < deadline,
                "unshare did not enter a new namespace"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        decoy
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
    fn ns_path(&self) -> String {
        format!("/proc/{}/ns/net", self.pid())
    }
    /// The nft tables of the decoy's namespace.
    fn tables(&self) -> String {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={}", self.ns_path()))
            .args(["nft", "list", "tables"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Decoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// When the pid the engine reports is some other process here (a library in a container
/// with the host's socket, an engine in a VM), the rules must not be loaded into that
/// process's namespace and read back from there as if it were the sandbox's: the create
/// fails, saying the pid is not the container's, the other namespace has no table, and
/// the container is gone within 10 s.
pub async fn rules_never_go_into_a_namespace_not_the_containers<E: ContainerEngine>(engine: E) {
    let _serial = SERIAL.lock().await;
    let b = trial_backend(TrialEngine::new(engine)).await;
    assert!(b.capabilities().contains(Capability::EGRESS_ALLOWLIST));
    let decoy = Decoy::start();
    b.engine().foreign_pid_once(decoy.pid());
    let made = b
        .create(
            test_options(BUSYBOX, "egress-foreign-pid")
                .network(NetworkPolicy::allow_list(["192.0.2.1"])),
        )
        .await;
    let tables = decoy.tables();
    let e = match made {
        Ok(sb) => {
            let _ = sb.kill().await;
            panic!(
                "the create succeeded with its rules in another process's namespace; \
                 that namespace's tables: {tables:?}"
            );
        }
        Err(e) => e,
    };
    assert_eq!(e.code(), ErrorCode::Creation, "{}", e.render());
    assert!(
        e.render().contains("is not in that container's cgroup"),
        "the refusal names the cause: {}",
        e.render()
    );
    assert!(!tables.contains(TABLE), "rules were loaded there: {tables}");
    nothing_left_within_10s(&b, "egress-foreign-pid").await;
}

/// Egress `Allow` on an engine whose containers the library cannot load rules into (here
/// one that says it is remote) would reach the cloud metadata service, the host's
/// services and other containers' networks: it is refused with `Configuration` before
/// anything is provisioned, naming why and the opt-in; a backend configured with
/// `allow_unfiltered_egress(true)` creates it. `engine` and `again` are two connections to
/// the same engine.
pub async fn allow_without_the_rules_is_refused_unless_opted_in<E: ContainerEngine>(
    engine: E,
    again: E,
) {
    let _serial = SERIAL.lock().await;
    let config = || ContainerConfig::new(BUSYBOX).startup_sweep(false);
    let b = ContainerBackend::new(TrialEngine::new(engine).as_remote(), config()).await;
    let e = b
        .create(test_options(BUSYBOX, "egress-unfiltered").network(NetworkPolicy::allow()))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration, "{}", e.render());
    let text = e.render();
    assert!(text.contains("not on this machine"), "names why: {text}");
    assert!(
        text.contains("allow_unfiltered_egress"),
        "names the opt-in: {text}"
    );
    let left = managed_ids(&b, "egress-unfiltered").await;
    assert!(left.is_empty(), "a refused create provisioned {left:?}");

    let opted = ContainerBackend::new(
        TrialEngine::new(again).as_remote(),
        config().allow_unfiltered_egress(true),
    )
    .await;
    let sb = opted
        .create(test_options(BUSYBOX, "egress-unfiltered").network(NetworkPolicy::allow()))
        .await
        .unwrap();
    let r = sb.exec("true").await;
    sb.kill().await.unwrap();
    assert_eq!(r.unwrap().exit_code, 0);
}

/// A sandbox allowed [`egress_lab::LISTED`] has the library's table loaded in its network
/// namespace (default drop, link-local refused), resolving the listed name pins its
/// address in the dynamic set, and its network is the library's, isolated (the network
/// option `isolation` names, e.g. `("isolate", "true")`) and labelled managed.
/// `host_view` reads the engine's API for the sandbox (and asserts what only that engine
/// shows).
#[allow(clippy::print_stdout)]
pub async fn the_rules_in_force_are_the_ones_loaded<B: Backend>(
    b: &B,
    isolation: (&str, &str),
    host_view: impl AsyncFnOnce(&dyn Sandbox) -> HostView,
) {
    let _serial = SERIAL.lock().await;
    let ip = egress_lab::install().unwrap();
    let t0 = Instant::now();
    let sb = b
        .create(
            test_options(BUSYBOX, "egress-rules")
                .network(NetworkPolicy::allow_list([egress_lab::LISTED])),
        )
        .await
        .unwrap();
    println!("create with an allowlist: {:?}", t0.elapsed());
    let view = host_view(&*sb).await;
    let pid = view.pid;
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["nft", "list", "table", "inet", TABLE])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.contains("policy drop"), "{listing}");
    assert!(listing.contains("169.254.0.0/16"), "{listing}");
    // Resolving the listed name pins its address before the answer arrives.
    let r = sb
        .run(
            sandbox_core::Command::Shell(format!("nslookup {} || true", egress_lab::LISTED)),
            Default::default(),
        )
        .await
        .unwrap();
    println!("nslookup: {}", r.stdout_text());
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["nft", "list", "set", "inet", TABLE, "dyn4"])
        .output()
        .unwrap();
    let set = String::from_utf8_lossy(&out.stdout);
    assert!(set.contains(&ip.to_string()), "{set}");
    let (key, value) = isolation;
    assert_eq!(
        view.network_options.get(key).map(String::as_str),
        Some(value)
    );
    assert_eq!(
        view.network_labels
            .get("io.sandbox-rs.managed")
            .map(String::as_str),
        Some("true")
    );
    sb.kill().await.unwrap();
}

/// The library network is removed between being ensured and the container create that
/// joins it ([`TrialEngine::steal_network_once`]: another process's sweep, which removes
/// the network while nothing uses it, at the worst moment): the create re-ensures it and
/// succeeds, on a network that exists, and the sandbox has its interface.
pub async fn network_removed_during_create_is_recreated<E: ContainerEngine>(engine: E) {
    let _one = SERIAL.lock().await;
    let b = trial_backend(TrialEngine::new(engine)).await;
    b.engine().steal_network_once();
    // The network exists before the create (so the trial engine has something to remove).
    let first = b
        .create(test_options(BUSYBOX, "egress_network_race").network(NetworkPolicy::allow()))
        .await;
    let s =
        first.unwrap_or_else(|e| panic!("create after the network was removed: {}", e.render()));
    assert_eq!(
        b.engine().stolen_networks(),
        1,
        "no network was removed: the trial proved nothing"
    );
    let r = s
        .run("cat /proc/net/dev".into(), Default::default())
        .await
        .unwrap();
    let text = r.stdout_text();
    let _ = s.kill().await;
    assert!(
        text.lines()
            .any(|l| l.contains(':') && !l.trim_start().starts_with("lo:")),
        "no interface besides lo:\n{text}"
    );
}

/// Reaping one networked sandbox (`kill_managed`, which also removes the library network
/// when nothing uses it) leaves every other sandbox on that network alone: a running one
/// still runs and a stopped one still starts. Podman's forced network removal once took
/// every container on the network with it.
pub async fn reaping_one_sandbox_leaves_the_others_on_the_network<E: ContainerEngine>(engine: E) {
    let _one = SERIAL.lock().await;
    let b = trial_backend(TrialEngine::new(engine)).await;
    let opts = || test_options(BUSYBOX, "egress_reap_neighbours").network(NetworkPolicy::allow());
    let running = b
        .create(opts())
        .await
        .expect("create the running neighbour");
    let stopped = b
        .create(opts())
        .await
        .expect("create the stopped neighbour");
    let reaped = b.create(opts()).await.expect("create the reaped one");
    let can_stop = b.capabilities().contains(Capability::STOP_START);
    if can_stop {
        stopped.stop().await.expect("stop the neighbour");
    }
    let reaper = b.as_reapable().expect("container backends reap");
    assert!(
        reaper.kill_managed(reaped.id()).await.expect("reap one"),
        "the reaped sandbox was not removed"
    );
    let alive = running.run("true".into(), Default::default()).await;
    let started = if can_stop {
        stopped.start().await.map(|_| ())
    } else {
        Ok(())
    };
    let _ = running.kill().await;
    let _ = stopped.kill().await;
    let _ = reaped.kill().await;
    let alive = alive.unwrap_or_else(|e| {
        panic!(
            "a running neighbour died when another sandbox was reaped: {}",
            e.render()
        )
    });
    assert_eq!(alive.exit_code, 0);
    started.unwrap_or_else(|e| {
        panic!(
            "a stopped neighbour could not start after another sandbox was reaped: {}",
            e.render()
        )
    });
}

/// The error and every source under it, one line: where a refusal's reason is found.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        text.push_str(": ");
        text.push_str(&s.to_string());
        next = s.source();
    }
    text
}

/// The ids of the engine's networks the library sees as its own.
async fn library_network_ids<E: ContainerEngine>(engine: &TrialEngine<E>) -> Vec<String> {
    engine
        .networks()
        .await
        .expect("list networks")
        .into_iter()
        .filter(|n| n.name == NETWORK_NAME)
        .map(|n| n.id)
        .collect()
}

/// The library finds, vets and reuses its network the same way on every engine: a network
/// of the name it wants that lacks its labels or its isolation is refused (an `Engine`
/// error naming the `rm` command, and no sandbox), never joined; once that is gone the
/// network is created, isolated, and a second create reuses it (same id, still one). Runs
/// on a network name of its own ([`TrialEngine::with_network_name`]; `cli` makes the
/// foreign one: `docker` or `podman --remote`), so it never disturbs `sbx-egress`.
pub async fn a_foreign_network_of_our_name_is_refused<E: ContainerEngine>(engine: E, cli: &str) {
    let _one = SERIAL.lock().await;
    let name = format!("sbx-egress-test-{}", std::process::id());
    let b = trial_backend(TrialEngine::new(engine).with_network_name(&name)).await;
    let sh = |args: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("{cli} {args}")])
            .output()
            .expect("run the engine's CLI")
    };
    let create =
        || b.create(test_options(BUSYBOX, "egress-foreign").network(NetworkPolicy::allow()));
    let _ = sh(&format!("network rm {name}"));
    assert!(
        sh(&format!("network create {name}")).status.success(),
        "foreign network"
    );
    let e = create()
        .await
        .map(|_| ())
        .expect_err("a foreign network of our name was joined");
    assert_eq!(e.code(), ErrorCode::Engine, "{}", e.render());
    assert!(
        chain(&e).contains("network rm"),
        "names the fix: {}",
        chain(&e)
    );
    assert!(managed_ids(&b, "egress-foreign").await.is_empty());
    assert!(sh(&format!("network rm {name}")).status.success());
    let first = create()
        .await
        .unwrap_or_else(|e| panic!("create once the foreign network is gone: {}", e.render()));
    let made = library_network_ids(b.engine()).await;
    let second = create()
        .await
        .unwrap_or_else(|e| panic!("second create: {}", e.render()));
    let again = library_network_ids(b.engine()).await;
    let isolated = b
        .engine()
        .networks()
        .await
        .expect("list networks")
        .into_iter()
        .any(|n| n.name == NETWORK_NAME && n.isolated);
    let _ = first.kill().await;
    let _ = second.kill().await;
    let _ = b.engine().inner().remove_network(&name).await;
    assert!(made.len() == 1 && !made[0].is_empty(), "created: {made:?}");
    assert!(
        isolated,
        "the network the library created keeps containers apart"
    );
    assert_eq!(again, made, "the same network is reused");
}

/// The host's own addresses (IPv4, loopback aside) as `ip -4 -o addr show` prints them:
/// the trial's own reading, not the library's.
fn host_ipv4_addresses() -> Vec<std::net::Ipv4Addr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("run `ip -4 -o addr show`");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace().skip_while(|w| *w != "inet");
            w.next()?;
            w.next()?.split('/').next()?.parse().ok()
        })
        .filter(|a: &std::net::Ipv4Addr| !a.is_loopback())
        .collect()
}

/// Serves `token` to every client of `listener`.
fn serve(listener: std::net::TcpListener, token: String) -> tokio::task::JoinHandle<()> {
    use tokio::io::AsyncWriteExt;
    listener.set_nonblocking(true).unwrap();
    let l = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let t = token.clone();
            tokio::spawn(async move {
                let _ = s.write_all(format!("{t}\n").as_bytes()).await;
            });
        }
    })
}

/// Under egress `Allow`, every address of the host — its LAN address, not only its
/// bridge addresses — is refused fast, so a service listening on all of the host's
/// addresses is out of reach; an ordinary address (the lab canary, in a namespace of its
/// own) stays reachable, so the refusal is not a blanket one.
#[allow(clippy::print_stdout)]
pub async fn host_addresses_are_blocked_under_allow<B: Backend>(b: &B) {
    let _serial = SERIAL.lock().await;
    let canary_ip = egress_lab::install().unwrap();
    let canary = egress_lab::bind(std::net::SocketAddr::new(canary_ip, 0)).unwrap();
    let canary_port = canary.local_addr().unwrap().port();
    let canary_task = serve(canary, "sbx-lab-canary".into());
    let host = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    let host_task = serve(host, "sbx-host-service".into());
    let sb = b
        .create(test_options(BUSYBOX, "egress-host").network(NetworkPolicy::allow()))
        .await
        .unwrap();
    let dial = async |addr: String, port: u16| {
        let t0 = Instant::now();
        let r = sb
            .run(
                sandbox_core::Command::Shell(format!("nc -w 3 {addr} {port} 2>&1; echo rc=$?")),
                Default::default(),
            )
            .await
            .unwrap();
        (r.stdout_text(), t0.elapsed())
    };
    let (canary_out, _) = dial(canary_ip.to_string(), canary_port).await;
    let mut reached = Vec::new();
    for a in host_ipv4_addresses() {
        let (out, took) = dial(a.to_string(), host_port).await;
        println!("host address {a}: {took:?} {out:?}");
        reached.push((a, out, took));
    }
    // Killed before any assertion, so a failure leaves nothing on the library network.
    canary_task.abort();
    host_task.abort();
    sb.kill().await.unwrap();
    assert!(
        canary_out.contains("sbx-lab-canary"),
        "the canary: {canary_out}"
    );
    assert!(!reached.is_empty(), "the host has no non-loopback address");
    for (a, out, took) in reached {
        assert!(
            !out.contains("sbx-host-service"),
            "the host's address {a} was reached under Allow: {out}"
        );
        assert!(
            took < Duration::from_secs(2),
            "{a}: dropped, not refused ({took:?})"
        );
    }
}

/// Lines this trial appended to the host's `/etc/hosts`, removed again on drop (only
/// those lines; the file is rewritten in place, since it may be a bind mount).
struct HostsLines(Vec<String>);

impl HostsLines {
    const PATH: &'static str = "/etc/hosts";

    fn add(lines: &[String]) -> HostsLines {
        let mut text = std::fs::read_to_string(Self::PATH).unwrap_or_default();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        std::fs::write(Self::PATH, text).expect("the trial runs as root and may edit /etc/hosts");
        HostsLines(lines.to_vec())
    }
}

impl Drop for HostsLines {
    fn drop(&mut self) {
        if let Ok(text) = std::fs::read_to_string(Self::PATH) {
            let kept: String = text
                .lines()
                .filter(|l| !self.0.iter().any(|ours| ours == l))
                .map(|l| format!("{l}\n"))
                .collect();
            let _ = std::fs::write(Self::PATH, kept);
        }
    }
}

/// A listed name that the host resolves through its `/etc/hosts` (an engine may copy that
/// file into the container, so the name resolves inside without asking the library's
/// resolver) is reachable, exactly as on an engine that does not copy it; a name of the
/// host's `/etc/hosts` that is not listed does not resolve inside (the host's file does
/// not leak in); and root inside writing its own `/etc/hosts` line for an address no
/// listed name pinned opens nothing.
#[allow(clippy::print_stdout)]
pub async fn a_listed_name_from_the_hosts_file_is_reachable<B: Backend>(b: &B) {
    let _serial = SERIAL.lock().await;
    let canary_ip = egress_lab::install().unwrap();
    let canary = egress_lab::bind(std::net::SocketAddr::new(canary_ip, 0)).unwrap();
    let port = canary.local_addr().unwrap().port();
    let task = serve(canary, "sbx-hosts-canary".into());
    let tag = std::process::id();
    let listed = format!("hostsfile-{tag}.sbx-lab.test");
    let unlisted = format!("hostsfile-unlisted-{tag}.sbx-lab.test");
    let hosts = HostsLines::add(&[
        format!("{canary_ip}\t{listed}\t# sandbox-rs egress trial"),
        format!("{canary_ip}\t{unlisted}\t# sandbox-rs egress trial"),
    ]);
    let sb = b
        .create(
            test_options(BUSYBOX, "egress-hosts")
                .network(NetworkPolicy::allow_list([listed.as_str()])),
        )
        .await
        .unwrap();
    let sh = async |script: String| {
        sb.run(sandbox_core::Command::Shell(script), Default::default())
            .await
            .unwrap()
    };
    // First, while the canary's address is pinned for no name: the rules enforce
    // addresses, so once the listed name pinned it, any name for it would do.
    let forged = sh(format!(
        "echo '{canary_ip} forged.sbx-lab.test' >> /etc/hosts; \
         nc -w 5 forged.sbx-lab.test {port} 2>&1; echo rc=$?"
    ))
    .await;
    let leaked = sh(format!("nc -w 5 {unlisted} {port} 2>&1; echo rc=$?")).await;
    let reached = sh(format!("nc -w 5 {listed} {port} 2>&1; echo rc=$?")).await;
    let inside = sh("cat /etc/hosts 2>&1".into()).await;
    println!("/etc/hosts inside: {:?}", inside.stdout_text());
    task.abort();
    sb.kill().await.unwrap();
    drop(hosts);
    assert!(
        reached.stdout_text().contains("sbx-hosts-canary"),
        "the listed name from the host's /etc/hosts was not reached: {:?}",
        reached.stdout_text()
    );
    assert!(
        !leaked.stdout_text().contains("sbx-hosts-canary")
            && leaked.stdout_text().to_lowercase().contains("bad address"),
        "an unlisted name of the host's /etc/hosts resolved inside: {:?}",
        leaked.stdout_text()
    );
    assert!(
        !forged.stdout_text().contains("sbx-hosts-canary"),
        "a line root wrote into /etc/hosts opened an unlisted address: {:?}",
        forged.stdout_text()
    );
}

/// Lists the egress trials as `#[tokio::test]`s of the calling test binary.
///
/// `backend:` and `engine:` are expressions that, inside an async test, yield
/// `Option<B>` (the adapter's backend, no startup sweep) and `Option<E>` (its engine)
/// (`None`: skip); `cli:` the engine CLI that makes a foreign network (`"docker"`,
/// `"podman --remote"`); `isolation:` the network option that says containers are kept
/// apart; `host_view:` an async function `(&B, &dyn Sandbox) -> HostView` reading the
/// engine's API.
#[macro_export]
macro_rules! egress_trials {
    (
        backend: $backend:expr,
        engine: $engine:expr,
        cli: $cli:expr,
        isolation: $isolation:expr,
        host_view: $host_view:path $(,)?
    ) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn a_failing_apply_leaves_no_container() {
            let Some(e) = $engine else { return };
            $crate::trials::egress::a_failing_apply_leaves_no_container(e).await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn rules_never_go_into_a_namespace_not_the_containers() {
            let Some(e) = $engine else { return };
            $crate::trials::egress::rules_never_go_into_a_namespace_not_the_containers(e).await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn allow_without_the_rules_is_refused_unless_opted_in() {
            let (Some(e), Some(again)) = ($engine, $engine) else {
                return;
            };
            $crate::trials::egress::allow_without_the_rules_is_refused_unless_opted_in(e, again)
                .await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn the_rules_in_force_are_the_ones_loaded() {
            let Some(b) = $backend else { return };
            $crate::trials::egress::the_rules_in_force_are_the_ones_loaded(
                &b,
                $isolation,
                async |sb| $host_view(&b, sb).await,
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn network_removed_during_create_is_recreated() {
            let Some(e) = $engine else { return };
            $crate::trials::egress::network_removed_during_create_is_recreated(e).await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn reaping_one_sandbox_leaves_the_others_on_the_network() {
            let Some(e) = $engine else { return };
            $crate::trials::egress::reaping_one_sandbox_leaves_the_others_on_the_network(e).await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_foreign_network_of_our_name_is_refused() {
            let Some(e) = $engine else { return };
            $crate::trials::egress::a_foreign_network_of_our_name_is_refused(e, $cli).await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn host_addresses_are_blocked_under_allow() {
            let Some(b) = $backend else { return };
            $crate::trials::egress::host_addresses_are_blocked_under_allow(&b).await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_listed_name_from_the_hosts_file_is_reachable() {
            let Some(b) = $backend else { return };
            $crate::trials::egress::a_listed_name_from_the_hosts_file_is_reachable(&b).await;
        }
    };
}
