//! Egress allowlists on a real Docker engine, beyond the contract suite: the rules in
//! force read from the host, the library network's isolation, and a failing apply that
//! must leave no container. Nothing leaves the machine (the canary is the egress lab
//! address, see `sandbox_container::egress::lab`).

#![allow(clippy::print_stdout)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sandbox_container::egress::{NETWORK_NAME, TABLE, lab};
use sandbox_core::{Backend, Capability, CreateOptions, ErrorCode, NetworkPolicy, ReapableBackend};
use sandbox_docker::{DockerBackend, DockerConfig, DockerNative};

const BUSYBOX: &str = "sandbox-rs/busybox:latest";

/// Tests here share the process-wide apply-failure switch.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn backend() -> Option<DockerBackend> {
    match DockerBackend::connect(DockerConfig::from_env().startup_sweep(false)).await {
        Ok(b) => Some(b),
        Err(e) if e.code() == ErrorCode::EngineUnavailable => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("Docker engine required under CI=true: {}", e.render());
            }
            println!("skipping: Docker engine unavailable: {}", e.render());
            None
        }
        Err(e) => panic!("connect failed: {}", e.render()),
    }
}

fn opts(test: &str) -> CreateOptions {
    CreateOptions::new(BUSYBOX)
        .timeout(Duration::from_secs(120))
        .metadata("test", test)
}

async fn listed(b: &DockerBackend, test: &str) -> Vec<String> {
    let mut f = BTreeMap::new();
    f.insert("test".to_string(), test.to_string());
    b.list_managed(&f)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_apply_leaves_no_container() {
    let _serial = SERIAL.lock().await;
    let Some(b) = backend().await else { return };
    assert!(b.capabilities().contains(Capability::EGRESS_ALLOWLIST));
    lab::fail_next_apply();
    let e = b
        .create(opts("egress-fail").network(NetworkPolicy::allow_list(["192.0.2.1"])))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Creation, "{}", e.render());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = listed(&b, "egress-fail").await;
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rules_in_force_are_the_ones_loaded() {
    let _serial = SERIAL.lock().await;
    let Some(b) = backend().await else { return };
    let ip = lab::install().unwrap();
    let t0 = Instant::now();
    let sb = b
        .create(opts("egress-rules").network(NetworkPolicy::allow_list([lab::LISTED])))
        .await
        .unwrap();
    println!("create with an allowlist: {:?}", t0.elapsed());
    let id = sb
        .native()
        .downcast_ref::<DockerNative>()
        .unwrap()
        .container_id
        .clone();
    let c = b
        .engine()
        .client()
        .inspect_container(&id, None)
        .await
        .unwrap();
    let pid = c.state.unwrap().pid.unwrap();
    let host = c.host_config.unwrap();
    // Joined by id (Docker allows duplicate names); the network is ours.
    let joined = b
        .engine()
        .client()
        .inspect_network(host.network_mode.as_deref().unwrap(), None)
        .await
        .unwrap();
    assert_eq!(joined.name.as_deref(), Some(NETWORK_NAME));
    assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
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
    let net = joined;
    let o = net.options.unwrap_or_default();
    assert_eq!(
        o.get("com.docker.network.bridge.enable_icc")
            .map(String::as_str),
        Some("false")
    );
    assert_eq!(
        net.labels
            .unwrap_or_default()
            .get("io.sandbox-rs.managed")
            .map(String::as_str),
        Some("true")
    );
    sb.kill().await.unwrap();
}
