//! The libpod SpecGenerator the adapter sends (`PodmanOptions::create_body`) and the
//! refusals it makes before anything is provisioned (`PodmanOptions::check_spec`): every
//! hardening field, limit and option must be in the body. No engine needed.

use std::collections::BTreeMap;
use std::time::Duration;

use sandbox_container::engine::ContainerEngine as _;
use sandbox_container::{ContainerSpec, LABEL_RUNTIME, NetworkMode};
use sandbox_core::{EffectiveResources, ErrorCode, Resources};
use sandbox_podman::{LinuxCapability, Mount, PodmanConfig, PodmanEngine, PodmanOptions, Runtime};
use serde_json::{Value, json};

fn spec_with(resources: Resources, network: NetworkMode) -> ContainerSpec {
    let mut s = ContainerSpec::new(
        "sbx-test-0",
        "img",
        vec!["sleep".into(), "300".into()],
        resources.effective().unwrap(),
        Duration::from_secs(300),
    );
    s.network = network;
    s.env = vec![("PLAIN".into(), "visible".into())];
    s.labels = BTreeMap::from([("io.sandbox-rs.managed".into(), "true".into())]);
    s
}

fn body(s: &ContainerSpec, p: &PodmanOptions) -> Value {
    p.create_body(s).unwrap()
}

#[test]
fn isolated_joins_the_egress_network_with_its_resolver() {
    let s = spec_with(
        Resources::default(),
        NetworkMode::Isolated {
            network: "sbx-egress".into(),
            publish: vec![],
            dns: vec!["10.89.0.1".parse().unwrap()],
        },
    );
    let v = body(&s, &PodmanOptions::default());
    assert_eq!(v["netns"]["nsmode"], "bridge");
    assert_eq!(v["Networks"], json!({ "sbx-egress": {} }));
    assert_eq!(v["dns_server"], json!(["10.89.0.1"]));
    // The host's /etc/hosts is never the base of the container's: the library's
    // loopback-only file, read-only.
    assert_eq!(v["use_image_hosts"], true);
    let hosts = v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == "/etc/hosts")
        .expect("a mount at /etc/hosts");
    assert_eq!(hosts["source"], sandbox_container::egress::HOSTS_FILE);
    assert!(hosts["options"].as_array().unwrap().contains(&json!("ro")));
    assert_eq!(v["cap_drop"], json!(["ALL"]), "NET_ADMIN stays dropped");
    let engine = |o: PodmanOptions| PodmanEngine::new(&PodmanConfig::default().options(o)).unwrap();
    assert!(engine(PodmanOptions::default()).netfilter_applies());
    assert!(!engine(PodmanOptions::default().runtime(Runtime::Runsc)).netfilter_applies());
}

#[test]
fn hardening_is_always_in_the_body() {
    let v = body(
        &spec_with(Resources::default(), NetworkMode::None),
        &PodmanOptions::default(),
    );
    assert_eq!(v["no_new_privileges"], true);
    assert!(v.get("no_new_privilages").is_none());
    assert_eq!(v["cap_drop"], json!(["ALL"]));
    assert!(v.get("cap_add").is_none());
    assert_eq!(v["init"], true);
    assert_eq!(v["netns"]["nsmode"], "none");
    assert_eq!(
        v["remove"], false,
        "kept when stopped, so that start can run it"
    );
    assert!(v["labels"].get(sandbox_container::LABEL_RETAINED).is_none());
    let mem = 512 * 1024 * 1024;
    assert_eq!(v["resource_limits"]["memory"]["limit"], mem);
    assert_eq!(v["resource_limits"]["memory"]["swap"], mem);
    assert_eq!(v["resource_limits"]["pids"]["limit"], 512);
    assert_eq!(v["resource_limits"]["cpu"]["quota"], 100_000);
    assert_eq!(v["entrypoint"], json!(["sleep", "300"]));
    assert!(
        v.get("command").is_none(),
        "the image's CMD is never appended"
    );
    assert_eq!(v["name"], "sbx-test-0");
    assert_eq!(v["work_dir"], "/work");
    assert_eq!(v["create_working_dir"], true);
    assert_eq!(v["env"]["PLAIN"], "visible");
    assert_eq!(v["labels"]["io.sandbox-rs.managed"], "true");
    assert!(v.get("portmappings").is_none());
    assert!(v.get("stdin").is_none(), "no agent channel unless asked");
    // On the engine's exec path root in the sandbox can still write to PID 1's output
    // (`echo x > /proc/1/fd/1`): with a log driver every byte of it lands in the
    // engine's k8s-file log, on the engine's disk, past every limit.
    assert_eq!(
        v["log_configuration"]["driver"], "none",
        "PID 1's output is not logged on the exec path either"
    );
    let mut agent = spec_with(Resources::default(), NetworkMode::None);
    agent.attach_stdin = true;
    let v = body(&agent, &PodmanOptions::default());
    assert_eq!((&v["stdin"], &v["terminal"]), (&json!(true), &json!(false)));
    assert_eq!(
        v["log_configuration"]["driver"], "none",
        "agent output is not logged"
    );
}

#[test]
fn options_map_to_the_body() {
    let d = tempfile::tempdir().unwrap();
    let p = PodmanOptions::new()
        .runtime(Runtime::Runsc)
        .capability(LinuxCapability::Chown)
        .annotation("krun.cpus", "2")
        .ephemeral(false)
        .mount(Mount::bind(d.path(), "/data"))
        .mount(Mount::copy(d.path(), "/seed"));
    let s = spec_with(
        Resources::default().cpu(0.5).memory_mb(256).pids(64),
        NetworkMode::Bridge {
            publish: vec![8080],
        },
    );
    let v = body(&s, &p);
    assert_eq!(v["oci_runtime"], "runsc");
    assert_eq!(v["labels"][LABEL_RUNTIME], "runsc");
    assert_eq!(v["cap_add"], json!(["CHOWN"]));
    assert_eq!(v["annotations"]["krun.cpus"], "2");
    assert_eq!(v["remove"], false);
    assert_eq!(v["labels"][sandbox_container::LABEL_RETAINED], "true");
    assert_eq!(v["netns"]["nsmode"], "bridge");
    assert_eq!(v["portmappings"][0]["host_ip"], "127.0.0.1");
    assert_eq!(v["portmappings"][0]["container_port"], 8080);
    assert!(
        v["portmappings"][0].get("host_port").is_none(),
        "the engine picks the host port: a sandbox never takes a well-known host port"
    );
    assert_eq!(v["resource_limits"]["cpu"]["quota"], 50_000);
    assert_eq!(
        v["resource_limits"]["pids"]["limit"],
        64 + sandbox_container::RUNSC_PIDS_HEADROOM
    );
    let mounts = v["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 1, "copy mounts leave no bind mount");
    assert_eq!(mounts[0]["destination"], "/data");
}

/// `pids` of 2^63 or more wrapped to a negative int64, which Podman reads as unlimited.
#[test]
fn huge_pids_and_memory_never_become_unlimited() {
    let max = sandbox_container::spec::runtime::MAX_PIDS;
    for pids in [1u64 << 63, u64::MAX, (1u64 << 63) + 512, max + 1] {
        for p in [
            PodmanOptions::default(),
            PodmanOptions::new().runtime(Runtime::Runsc),
        ] {
            let s = spec_with(Resources::default().pids(pids), NetworkMode::None);
            let limit = body(&s, &p)["resource_limits"]["pids"]["limit"]
                .as_i64()
                .unwrap();
            assert_eq!(limit, max as i64, "pids {pids}");
        }
    }
    let s = spec_with(Resources::default().memory_mb(u64::MAX), NetworkMode::None);
    let v = body(&s, &PodmanOptions::default());
    let mem = v["resource_limits"]["memory"]["limit"].as_i64().unwrap();
    assert!(mem > 0);
    assert_eq!(
        v["resource_limits"]["memory"]["swap"].as_i64().unwrap(),
        mem
    );
}

#[test]
fn a_disk_limit_is_a_read_only_root_with_sized_tmpfs() {
    let v = body(
        &spec_with(Resources::default(), NetworkMode::None),
        &PodmanOptions::default(),
    );
    assert!(v.get("read_only_filesystem").is_none_or(|r| r == false));
    assert!(v.get("mounts").is_none());
    let v = body(
        &spec_with(Resources::default().disk_mb(10), NetworkMode::None),
        &PodmanOptions::default(),
    );
    assert_eq!(v["read_only_filesystem"], true);
    assert_eq!(v["shm_size"], 10 << 20);
    let mounts = v["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 2);
    for (m, dest) in mounts.iter().zip(["/work", "/tmp"]) {
        assert_eq!(m["destination"], dest);
        assert_eq!(m["type"], "tmpfs");
        assert_eq!(
            m["options"],
            json!(["size=10485760", "mode=1777", "nosuid", "nodev"])
        );
    }
}

/// A writable bind mount still cannot plant a setuid-root file or a device that works
/// in the sandbox, and no bind brings along (now or later) a host mount nested below its
/// source (non-recursive, private); the body carries the canonical host path and the
/// normalised target.
#[test]
fn bind_mounts_are_nosuid_nodev_with_canonical_paths() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let p = PodmanOptions::new()
        .mount(Mount::bind(&link, "//rw//").read_only(false))
        .mount(Mount::bind(&data, "/ro"));
    let v = body(&spec_with(Resources::default(), NetworkMode::None), &p);
    let mounts = v["mounts"].as_array().unwrap();
    let canonical = std::fs::canonicalize(&data).unwrap();
    assert_eq!(mounts[0]["destination"], "/rw");
    assert_eq!(mounts[0]["source"], canonical.to_string_lossy().as_ref());
    assert_eq!(
        mounts[0]["options"],
        json!(["bind", "private", "rw", "nosuid", "nodev", "Z"])
    );
    assert_eq!(
        mounts[1]["options"],
        json!(["bind", "private", "ro", "nosuid", "nodev", "Z"])
    );
}

#[test]
fn refusals_happen_before_provisioning() {
    let p = PodmanOptions::default();
    let refused = |r: Resources, p: &PodmanOptions| {
        let s = spec_with(r, NetworkMode::None);
        p.check_spec(&s).unwrap_err().code()
    };
    let disk = || Resources::default().disk_mb(100);
    assert!(p.check_spec(&spec_with(disk(), NetworkMode::None)).is_ok());
    let d = tempfile::tempdir().unwrap();
    for m in [
        Mount::copy(d.path(), "/work/in"),
        Mount::copy(d.path(), "/tmp"),
        Mount::bind(d.path(), "/data").read_only(false),
    ] {
        let p = PodmanOptions::new().mount(m.clone());
        assert!(
            p.check_spec(&spec_with(Resources::default(), NetworkMode::None))
                .is_ok()
        );
        assert_eq!(refused(disk(), &p), ErrorCode::Configuration, "{m:?}");
    }
    let p = PodmanOptions::new()
        .mount(Mount::copy(d.path(), "/data"))
        .mount(Mount::bind(d.path(), "/ro"));
    assert!(p.check_spec(&spec_with(disk(), NetworkMode::None)).is_ok());
    assert_eq!(
        refused(Resources::default().gpu(1), &p),
        ErrorCode::Configuration
    );
    let gone = tempfile::tempdir().unwrap().path().join("gone");
    assert_eq!(
        refused(
            Resources::default(),
            &PodmanOptions::new().mount(Mount::bind(gone, "/data"))
        ),
        ErrorCode::Configuration,
        "a mount source that vanished after connect"
    );
    let s = spec_with(Resources::default(), NetworkMode::None);
    assert!(p.check_spec(&s).is_ok());
    let _: EffectiveResources = s.resources;
}

/// An image's `VOLUME` would be an anonymous volume on the engine's disk, past the limit:
/// under `disk_mb` each declared volume is a sized tmpfs, and any Podman still finds is a
/// tmpfs (`image_volume_mode`), never a volume on disk.
#[test]
fn declared_image_volumes_are_sized_tmpfs_under_a_disk_limit() {
    let mut s = spec_with(Resources::default().disk_mb(10), NetworkMode::None);
    s.image_volumes = vec!["/data".into(), "/tmp".into(), "/ro".into()];
    let d = tempfile::tempdir().unwrap();
    let p = PodmanOptions::new().mount(Mount::bind(d.path(), "/ro"));
    let v = body(&s, &p);
    assert_eq!(v["image_volume_mode"], "tmpfs");
    let mounts = v["mounts"].as_array().unwrap();
    let dest: Vec<&str> = mounts
        .iter()
        .filter_map(|m| m["destination"].as_str())
        .collect();
    assert_eq!(
        dest,
        ["/ro", "/work", "/tmp", "/data"],
        "each path once; the read-only bind mount keeps its path"
    );
    for m in &mounts[1..] {
        assert_eq!(m["type"], "tmpfs");
        assert_eq!(
            m["options"],
            json!(["size=10485760", "mode=1777", "nosuid", "nodev"])
        );
    }
    // Without a disk limit nothing changes: the engine keeps its default.
    let mut s = spec_with(Resources::default(), NetworkMode::None);
    s.image_volumes = vec!["/data".into()];
    let v = body(&s, &PodmanOptions::default());
    assert!(v.get("image_volume_mode").is_none());
    assert!(v.get("mounts").is_none());
}
