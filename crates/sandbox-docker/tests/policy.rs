//! The create body the adapter sends (`DockerConfig::create_body`, as the Engine API's
//! JSON) and the egress network's body (`DockerConfig::network_body`): every hardening
//! field, limit and mount must be in them. No engine needed.

use std::collections::BTreeMap;
use std::time::Duration;

use sandbox_container::engine::NetworkSpec;
use sandbox_container::{ContainerSpec, LABEL_RUNTIME, NetworkMode};
use sandbox_core::Resources;
use sandbox_docker::{DockerConfig, Runtime};
use serde_json::{Value, json};

fn spec(r: Resources) -> ContainerSpec {
    let mut s = ContainerSpec::new(
        "sbx-t-1",
        "sandbox-rs/python:3.11",
        vec!["sleep".into(), "2.500".into()],
        r.effective().unwrap(),
        Duration::from_millis(2500),
    );
    s.env = vec![("PLAIN".into(), "v".into())];
    s.labels
        .insert("io.sandbox-rs.managed".into(), "true".into());
    s
}

fn body(s: &ContainerSpec, runtime: Runtime) -> Value {
    DockerConfig::default()
        .runtime(runtime)
        .create_body(s)
        .unwrap()
}

#[test]
fn hardening_is_always_applied() {
    let b = body(&spec(Resources::default()), Runtime::Runc);
    let h = &b["HostConfig"];
    assert_eq!(h["NetworkMode"], "none");
    assert_eq!(h["CapDrop"], json!(["ALL"]));
    assert_eq!(h["CapAdd"], json!([]));
    assert_eq!(h["SecurityOpt"], json!(["no-new-privileges"]));
    assert_eq!(h["Privileged"], false);
    assert_eq!(h["Memory"], 512 * 1024 * 1024);
    assert_eq!(h["Memory"], h["MemorySwap"], "swap disabled");
    assert_eq!(h["PidsLimit"], 512);
    assert_eq!(h["NanoCpus"], 1_000_000_000);
    assert_eq!(h["Init"], true);
    assert_eq!(
        h["AutoRemove"], false,
        "kept when stopped, so that start can run it"
    );
    assert_eq!(h["Runtime"], "runc");
    assert_eq!(h["PublishAllPorts"], false);
    assert!(h.get("PortBindings").is_none());
    assert_eq!(b["Entrypoint"], json!(["sleep"]));
    assert_eq!(b["Cmd"], json!(["2.500"]));
    assert_eq!(b["Env"], json!(["PLAIN=v"]));
    assert_eq!(b["WorkingDir"], "/work");
    assert_eq!(b["Labels"]["io.sandbox-rs.managed"], "true");
    assert_eq!(b["Labels"][LABEL_RUNTIME], "runc");
    assert_eq!(b["OpenStdin"], false);
}

#[test]
fn limits_runsc_and_loopback_publishing() {
    let mut s = spec(Resources::default().cpu(0.5).memory_mb(64).pids(32));
    s.network = NetworkMode::Bridge {
        publish: vec![8080],
    };
    let b = body(&s, Runtime::Runsc);
    let h = &b["HostConfig"];
    assert_eq!(h["NanoCpus"], 500_000_000);
    assert_eq!(h["Memory"], 64 * 1024 * 1024);
    assert_eq!(h["PidsLimit"], 32 + 256, "runsc headroom");
    assert_eq!(h["Runtime"], "runsc");
    assert_eq!(b["Labels"][LABEL_RUNTIME], "runsc");
    assert_eq!(h["NetworkMode"], "bridge");
    assert_eq!(
        h["PortBindings"]["8080/tcp"],
        // Loopback only, at a port the engine picks.
        json!([{ "HostIp": "127.0.0.1", "HostPort": "" }])
    );
    assert_eq!(b["ExposedPorts"], json!({ "8080/tcp": {} }));
}

#[test]
fn isolated_runs_on_the_named_network_with_its_dns() {
    let mut s = spec(Resources::default());
    s.network = NetworkMode::Isolated {
        network: "sbx-egress".into(),
        publish: vec![8080],
        dns: vec!["172.30.0.1".parse().unwrap()],
    };
    let h = body(&s, Runtime::Runc)["HostConfig"].clone();
    assert_eq!(h["NetworkMode"], "sbx-egress");
    assert_eq!(h["Dns"], json!(["172.30.0.1"]));
    assert!(h["PortBindings"].get("8080/tcp").is_some());
    assert_eq!(h["CapDrop"], json!(["ALL"]), "NET_ADMIN stays dropped");
    let labels = BTreeMap::from([("io.sandbox-rs.managed".to_string(), "true".to_string())]);
    let n = DockerConfig::default().network_body(&NetworkSpec::new("sbx-egress", labels));
    assert_eq!(n["Name"], "sbx-egress");
    assert_eq!(
        n["Options"]["com.docker.network.bridge.enable_icc"], "false",
        "no traffic between sandboxes"
    );
    assert_eq!(n["Labels"]["io.sandbox-rs.managed"], "true");
}

/// Every mount is an anonymous tmpfs-backed volume of 10 MiB: removed with the container,
/// no setuid files or devices.
fn assert_sized_scratch(mounts: &[Value]) {
    for m in mounts {
        assert_eq!(m["Type"], "volume");
        assert!(
            m.get("Source").is_none(),
            "anonymous: removed with the container"
        );
        let o = &m["VolumeOptions"]["DriverConfig"]["Options"];
        assert_eq!(o["type"], "tmpfs");
        assert_eq!(o["o"], "size=10485760,mode=1777,nosuid,nodev");
    }
}

#[test]
fn a_disk_limit_is_a_read_only_root_with_sized_scratch_volumes() {
    let h = body(&spec(Resources::default()), Runtime::Runc)["HostConfig"].clone();
    assert_eq!(h["ReadonlyRootfs"], false);
    assert!(h.get("Mounts").is_none() && h.get("ShmSize").is_none());
    let h = body(&spec(Resources::default().disk_mb(10)), Runtime::Runc)["HostConfig"].clone();
    assert_eq!(h["ReadonlyRootfs"], true);
    assert_eq!(h["ShmSize"], 10 << 20);
    let mounts = h["Mounts"].as_array().unwrap();
    let targets: Vec<&str> = mounts.iter().filter_map(|m| m["Target"].as_str()).collect();
    assert_eq!(targets, ["/work", "/tmp"]);
    assert_sized_scratch(mounts);
}

#[test]
fn the_agent_channel_keeps_stdin_open_and_is_not_logged() {
    let mut s = spec(Resources::default());
    s.attach_stdin = true;
    let b = body(&s, Runtime::Runc);
    assert_eq!(b["OpenStdin"], true);
    assert_eq!(b["StdinOnce"], false);
    assert_eq!(b["Tty"], false);
    assert_eq!(b["AttachStdin"], true);
    assert_eq!(
        b["HostConfig"]["LogConfig"]["Type"], "none",
        "command output must not be copied to the engine's disk"
    );
    // The hardening is the same as for any container.
    assert_eq!(b["HostConfig"]["CapDrop"], json!(["ALL"]));
}

/// On the engine's exec path (no agent) root in the sandbox can still write to PID 1's
/// output (`echo x > /proc/1/fd/1`): with a log driver every byte of it lands in the
/// engine's json-file log, on the engine's disk, past every limit.
#[test]
fn no_container_is_logged_on_the_exec_path_either() {
    for r in [Resources::default(), Resources::default().disk_mb(10)] {
        let s = spec(r);
        assert!(!s.attach_stdin, "the engine exec path");
        let b = body(&s, Runtime::Runc);
        assert_eq!(
            b["HostConfig"]["LogConfig"]["Type"], "none",
            "PID 1's output must not be copied to the engine's disk"
        );
        assert_eq!(b["OpenStdin"], false, "no agent channel unless asked");
    }
}

/// An image's `VOLUME` would be an anonymous volume on the engine's disk, past the limit:
/// under `disk_mb` each declared volume is a sized tmpfs-backed scratch volume instead
/// (Docker creates none of its own where a mount is).
#[test]
fn declared_image_volumes_are_sized_scratch_under_a_disk_limit() {
    let mut s = spec(Resources::default().disk_mb(10));
    s.image_volumes = vec!["/data".into(), "/tmp".into()];
    let h = body(&s, Runtime::Runc)["HostConfig"].clone();
    let mounts = h["Mounts"].as_array().unwrap();
    let targets: Vec<&str> = mounts.iter().filter_map(|m| m["Target"].as_str()).collect();
    assert_eq!(targets, ["/work", "/tmp", "/data"], "each path once");
    assert_sized_scratch(mounts);
    // Without a disk limit nothing changes: the engine keeps its default.
    let mut s = spec(Resources::default());
    s.image_volumes = vec!["/data".into()];
    assert!(
        body(&s, Runtime::Runc)["HostConfig"]
            .get("Mounts")
            .is_none()
    );
}
