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

use crate::egress::{TABLE, lab};
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
