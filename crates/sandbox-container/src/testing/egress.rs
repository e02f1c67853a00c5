//! The egress-allowlist tests both adapters run against their real engine, beyond the
//! contract suite: a failing apply leaves no container, and the rules in force are read
//! from the host (`nsenter` into the container's network namespace). Nothing leaves the
//! machine (the canary is the egress lab address, see [`crate::egress::lab`]).
//!
//! What only the engine's own API can tell (the container's pid, the library network's
//! options and labels) the adapter's test reads and hands over as a [`HostView`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sandbox_core::{Backend, Capability, ErrorCode, NetworkPolicy, ReapableBackend, Sandbox};

use crate::egress::{NETWORK_NAME, TABLE, lab};
use crate::engine::{
    ArchiveBody, AttachStream, ContainerEngine, ContainerInfo, ContainerSpec, EngineErrorKind,
    EngineResult, ExecRequest, ExecState, ExecStream, NetworkInfo, NetworkSpec, PathStat,
};
use crate::provision::backend::ContainerBackend;
use crate::provision::config::ContainerConfig;
use crate::testing::{managed_ids, test_options};

/// The image the tests create.
const BUSYBOX: &str = "sandbox-rs/busybox:latest";

/// The tests share the process-wide apply-failure switch, so they run one at a time.
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

/// A create whose allowlist fails to apply (the lab's injected failure) is a `Creation`
/// error, and the container it made is gone within 10 s.
pub async fn a_failing_apply_leaves_no_container<B: Backend + ReapableBackend>(b: &B) {
    let _serial = SERIAL.lock().await;
    assert!(b.capabilities().contains(Capability::EGRESS_ALLOWLIST));
    lab::fail_next_apply();
    let e = b
        .create(
            test_options(BUSYBOX, "egress-fail").network(NetworkPolicy::allow_list(["192.0.2.1"])),
        )
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Creation, "{}", e.render());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = managed_ids(b, "egress-fail").await;
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A sandbox allowed [`lab::LISTED`] has the library's table loaded in its network
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
    let ip = lab::install().unwrap();
    let t0 = Instant::now();
    let sb = b
        .create(
            test_options(BUSYBOX, "egress-rules").network(NetworkPolicy::allow_list([lab::LISTED])),
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
            sandbox_core::Command::Shell(format!("nslookup {} || true", lab::LISTED)),
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

/// An engine that removes the library network right before the first container create
/// that would join it: another process's sweep, which removes the network while nothing
/// uses it, at the worst moment. Everything else goes to `inner`.
#[derive(Debug)]
pub struct NetworkThief<E> {
    inner: E,
    armed: std::sync::atomic::AtomicBool,
    /// Networks removed by the thief.
    pub stolen: std::sync::atomic::AtomicU64,
}

impl<E> NetworkThief<E> {
    /// Wraps `inner`, armed.
    pub fn new(inner: E) -> Self {
        NetworkThief {
            inner,
            armed: std::sync::atomic::AtomicBool::new(true),
            stolen: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

#[async_trait::async_trait]
impl<E: ContainerEngine> ContainerEngine for NetworkThief<E> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn tier(&self) -> sandbox_core::IsolationTier {
        self.inner.tier()
    }
    fn capabilities(&self) -> Capability {
        self.inner.capabilities()
    }
    fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }
    fn check_spec(&self, spec: &ContainerSpec) -> EngineResult<()> {
        self.inner.check_spec(spec)
    }
    async fn create(&self, spec: &ContainerSpec) -> EngineResult<String> {
        use std::sync::atomic::Ordering;
        let joins = !matches!(spec.network, crate::engine::NetworkMode::None);
        if joins && self.armed.swap(false, Ordering::SeqCst) {
            // Another test's sandbox may still be on the network for a moment.
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                match self.inner.remove_network(NETWORK_NAME).await {
                    Ok(_) => {
                        self.stolen.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    Err(e) if e.kind == EngineErrorKind::Conflict && Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        self.inner.create(spec).await
    }
    async fn start(&self, id: &str) -> EngineResult<()> {
        self.inner.start(id).await
    }
    async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo> {
        self.inner.inspect(id).await
    }
    async fn remove(&self, id: &str) -> EngineResult<bool> {
        self.inner.remove(id).await
    }
    async fn list(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> EngineResult<Vec<ContainerInfo>> {
        self.inner.list(labels).await
    }
    async fn exec(&self, id: &str, request: ExecRequest) -> EngineResult<ExecStream> {
        self.inner.exec(id, request).await
    }
    fn supports_attach(&self) -> bool {
        self.inner.supports_attach()
    }
    fn supports_agent_mount(&self) -> bool {
        self.inner.supports_agent_mount()
    }
    async fn attach(&self, id: &str) -> EngineResult<AttachStream> {
        self.inner.attach(id).await
    }
    async fn exec_state(&self, exec_id: &str) -> EngineResult<ExecState> {
        self.inner.exec_state(exec_id).await
    }
    async fn put_archive(&self, id: &str, dir: &str, body: ArchiveBody) -> EngineResult<()> {
        self.inner.put_archive(id, dir, body).await
    }
    async fn get_archive(&self, id: &str, path: &str) -> EngineResult<ArchiveBody> {
        self.inner.get_archive(id, path).await
    }
    async fn stat_path(&self, id: &str, path: &str) -> EngineResult<PathStat> {
        self.inner.stat_path(id, path).await
    }
    fn is_local(&self) -> bool {
        self.inner.is_local()
    }
    fn netfilter_applies(&self) -> bool {
        self.inner.netfilter_applies()
    }
    async fn create_network(&self, spec: &NetworkSpec) -> EngineResult<()> {
        self.inner.create_network(spec).await
    }
    async fn networks(&self) -> EngineResult<Vec<NetworkInfo>> {
        self.inner.networks().await
    }
    async fn remove_network(&self, name: &str) -> EngineResult<bool> {
        self.inner.remove_network(name).await
    }
    fn credential_store(&self) -> crate::image::CredentialStore {
        self.inner.credential_store()
    }
    async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        self.inner.image_exists(image).await
    }
    async fn ping(&self) -> EngineResult<()> {
        self.inner.ping().await
    }
    async fn facts(&self) -> crate::engine::EngineFacts {
        self.inner.facts().await
    }
}

/// The library network is removed between being ensured and the container create that
/// joins it (the [`NetworkThief`]): the create re-ensures it and succeeds, on a network
/// that exists, and the sandbox has its interface.
pub async fn network_removed_during_create_is_recreated<E: ContainerEngine>(engine: E) {
    let _one = SERIAL.lock().await;
    let thief = NetworkThief::new(engine);
    let b = ContainerBackend::new(thief, ContainerConfig::new(BUSYBOX).startup_sweep(false)).await;
    // The network exists before the create (so the thief has something to remove).
    let first = b
        .create(test_options(BUSYBOX, "egress_network_race").network(NetworkPolicy::allow()))
        .await;
    let s =
        first.unwrap_or_else(|e| panic!("create after the network was removed: {}", e.render()));
    assert_eq!(
        b.engine().stolen.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the thief removed no network: the trial proved nothing"
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

/// The library finds, vets and reuses its network the same way on every engine: a network
/// of the name it wants that lacks its labels or its isolation is refused (`Conflict`,
/// naming the `rm` command), never joined; once that is gone the network is created, and a
/// second ensure reuses it (same id). Runs on a network name of its own (`cli` makes the
/// foreign one: `docker` or `podman --remote`), so it never disturbs `sbx-egress`.
pub async fn a_foreign_network_of_our_name_is_refused<E: ContainerEngine>(engine: &E, cli: &str) {
    let name = format!("sbx-egress-test-{}", std::process::id());
    let mut spec = crate::egress::network_spec(engine.backend());
    spec.name = name.clone();
    let sh = |args: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("{cli} {args}")])
            .output()
            .expect("run the engine's CLI")
    };
    let _ = sh(&format!("network rm {name}"));
    assert!(
        sh(&format!("network create {name}")).status.success(),
        "foreign network"
    );
    let e = crate::egress::ensure_network(engine, &spec)
        .await
        .expect_err("a foreign network of our name was accepted");
    assert_eq!(e.kind, EngineErrorKind::Conflict, "{e}");
    assert!(e.message.contains("network rm"), "names the fix: {e}");
    assert!(sh(&format!("network rm {name}")).status.success());
    let made = crate::egress::ensure_network(engine, &spec)
        .await
        .expect("created");
    assert!(made.isolated && !made.id.is_empty(), "{made:?}");
    let again = crate::egress::ensure_network(engine, &spec)
        .await
        .expect("reused");
    assert_eq!(again.id, made.id, "the same network is reused");
    assert!(engine.remove_network(&name).await.expect("removed"));
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
    let canary_ip = lab::install().unwrap();
    let canary = lab::bind(std::net::SocketAddr::new(canary_ip, 0)).unwrap();
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
