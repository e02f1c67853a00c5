//! Turning a [`ContainerSpec`] from the container layer plus [`PodmanOptions`] into a
//! libpod SpecGenerator, and the refusals that must happen before anything is created.
//!
//! The body is assembled with podman-api's typed `ContainerCreateOptsBuilder` and then
//! patched where the crate is defective (see `rest.rs`): `no_new_privileges` (the crate's
//! field is misspelled and ignored by Podman), OCI `mounts` and CDI `devices`.

use std::net::IpAddr;

use podman_api::models;
use podman_api::opts::{ContainerCreateOpts, NetworkCreateOpts};
use sandbox_container::engine::{NetworkInfo, NetworkSpec, Subnet};
use sandbox_container::{ContainerSpec, LABEL_RUNTIME, NetworkMode, Runtime};
use sandbox_core::{Capability, Result, SandboxError};
use serde_json::{Value, json};

use crate::config::{MountMode, PodmanOptions, Sharing};

/// Capabilities of a sandbox created with these Podman options (GPU only with CDI devices,
/// which `PodmanOptions::validate` has checked against the host; the egress allowlist
/// where the container layer can load its rules, which it decides).
pub(crate) fn capabilities_for(podman: &PodmanOptions) -> Capability {
    let mut c = sandbox_container::LAYER_CAPABILITIES
        | Capability::EGRESS_ALLOWLIST
        | Capability::DISK_LIMIT;
    if !podman.cdi_devices.is_empty() {
        c |= Capability::GPU;
    }
    c
}

/// What Podman cannot enforce for `spec` with these options, refused before anything is
/// provisioned: more GPUs than named CDI devices; with a disk limit, a writable bind mount
/// (host disk the limit cannot bound) or a sealed copy-in under a scratch path (the scratch
/// mount would hide it); and any option outside the vetted allowlists.
pub(crate) fn check_spec(spec: &ContainerSpec, podman: &PodmanOptions) -> Result<()> {
    let res = &spec.resources;
    if let Some(m) = podman
        .mounts
        .iter()
        .find(|m| m.mode == MountMode::Bind && !m.read_only)
        .filter(|_| res.disk_mb.is_some())
    {
        return Err(SandboxError::config(
            format!(
                "the writable bind mount at {} writes to the host's disk, which \
                 resources.disk_mb cannot bound",
                m.container
            ),
            "make the bind mount read-only (Mount::read_only(true)) or leave disk_mb unset",
        ));
    }
    for m in podman.mounts.iter().filter(|m| m.mode == MountMode::Copy) {
        let target = m.normalized_target()?;
        if let Some(scratch) = spec.scratch_paths().into_iter().find(|p| under(&target, p)) {
            return Err(SandboxError::config(
                format!(
                    "the copied mount {target} lies under {scratch}, which resources.disk_mb \
                     turns into an empty scratch filesystem"
                ),
                "copy it elsewhere (e.g. /data), use MountMode::Bind, or leave disk_mb unset",
            ));
        }
    }
    if res.gpu > 0 && (res.gpu as usize) > podman.cdi_devices.len() {
        return Err(SandboxError::config(
            format!(
                "{} GPU(s) requested but only {} CDI device(s) named",
                res.gpu,
                podman.cdi_devices.len()
            ),
            "name one CDI device per GPU with PodmanOptions::cdi_device(\"nvidia.com/gpu=N\")",
        ));
    }
    podman.validate()
}

/// Whether `path` is `dir` or lies below it (both normalised, absolute).
fn under(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path == dir || dir.is_empty() || path.starts_with(&format!("{dir}/"))
}

/// The largest value the kernel accepts in `pids.max` (`PID_MAX_LIMIT`, 2^22): no
/// container can hold more processes, so a larger request means this.
pub(crate) const MAX_PIDS: u64 = 4_194_304;

/// The pids limit for the body. Clamped, because a `u64` of 2^63 or more would wrap to a
/// negative `int64`, which Podman reads as "unlimited".
pub(crate) fn pids_limit(pids: u64) -> i64 {
    pids.clamp(1, MAX_PIDS) as i64
}

/// The pids limit for `requested` sandbox processes under the configured runtime (runsc's
/// own threads count against the cgroup limit), clamped.
fn runtime_pids_limit(podman: &PodmanOptions, requested: u64) -> i64 {
    let headroom = podman.runtime.map(|r| r.pids_headroom()).unwrap_or(0);
    pids_limit(requested.saturating_add(headroom))
}

/// The memory limit in bytes, saturating instead of wrapping to a negative (= unlimited).
pub(crate) fn memory_limit(memory_mb: u64) -> i64 {
    i64::try_from(memory_mb)
        .unwrap_or(i64::MAX)
        .saturating_mul(1024 * 1024)
}

/// The spec's labels plus the runtime label, so a reattached handle reports the tier the
/// sandbox really has.
fn labels(spec: &ContainerSpec, podman: &PodmanOptions) -> Vec<(String, String)> {
    let mut l: Vec<(String, String)> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(rt) = podman.runtime {
        l.push((LABEL_RUNTIME.to_string(), rt.as_str().to_string()));
    }
    l
}

/// The libpod SpecGenerator JSON for a [`ContainerSpec`] from the container layer plus
/// this backend's [`PodmanOptions`]. Every field of the spec is applied (SPEC §5): a field
/// silently dropped would be a security bug.
pub(crate) fn create_body(spec: &ContainerSpec, podman: &PodmanOptions) -> Result<Value> {
    let res = &spec.resources;
    let memory = memory_limit(res.memory_mb);
    let period: u64 = 100_000;
    let quota = (res.cpu * period as f64).round().max(1000.0) as i64;
    let resources = models::LinuxResources {
        block_io: None,
        cpu: Some(models::LinuxCpu {
            cpus: None,
            mems: None,
            period: Some(period),
            quota: Some(quota),
            realtime_period: None,
            realtime_runtime: None,
            shares: None,
        }),
        devices: None,
        hugepage_limits: None,
        // memory == memory+swap: swap disabled.
        memory: Some(models::LinuxMemory {
            disable_oom_killer: None,
            kernel: None,
            kernel_tcp: None,
            limit: Some(memory),
            reservation: None,
            swap: Some(memory),
            swappiness: None,
            use_hierarchy: None,
        }),
        network: None,
        pids: Some(models::LinuxPids {
            limit: Some(runtime_pids_limit(podman, res.pids)),
        }),
        rdma: None,
        unified: None,
    };
    let (netns, publish): (&str, &[u16]) = match &spec.network {
        NetworkMode::None => ("none", &[]),
        NetworkMode::Bridge { publish } => ("bridge", publish),
        NetworkMode::Isolated { publish, .. } => ("bridge", publish),
        other => {
            return Err(SandboxError::config(
                format!("network mode {other:?} is not supported by the Podman adapter"),
                "use egress Deny or Allow",
            ));
        }
    };
    let mut b = ContainerCreateOpts::builder()
        .name(&spec.name)
        .image(&spec.image)
        // The whole argv as entrypoint: Podman then ignores the image's CMD, which would
        // otherwise be appended to our main process.
        .entrypoint(spec.command.iter().cloned())
        .init(spec.init)
        .labels(labels(spec, podman))
        .env(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())))
        .work_dir(&spec.workdir)
        .create_working_dir(true)
        .remove(podman.ephemeral)
        .drop_capabilities(["ALL"])
        .net_namespace(models::Namespace {
            nsmode: Some(netns.to_string()),
            value: None,
        })
        .resource_limits(resources)
        .read_only_fs(!spec.scratch_paths().is_empty())
        .stop_timeout(1u64);
    if let Some(bytes) = spec.scratch_bytes() {
        b = b.shm_size(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    if !podman.capabilities.is_empty() {
        b = b.add_capabilities(podman.capabilities.iter().map(|c| c.as_str().to_string()));
    }
    if let Some(rt) = podman.runtime {
        b = b.oci_runtime(rt.as_str());
    }
    if !podman.annotations.is_empty() {
        b = b.annotations(
            podman
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
    }
    if !publish.is_empty() {
        // Loopback only, at a port the engine picks (a sandbox must not take a well-known
        // host port and impersonate a local service).
        b = b.portmappings(publish.iter().map(|p| models::PortMapping {
            container_port: Some(*p),
            host_ip: Some("127.0.0.1".into()),
            host_port: None,
            protocol: Some("tcp".into()),
            range: None,
        }));
    }
    let body = b.build().serialize_vec().map_err(|e| {
        SandboxError::config(
            format!("the container spec cannot be serialised: {e}"),
            "check labels, env and annotations for values JSON cannot carry",
        )
    })?;
    let mut v: Value = serde_json::from_slice(&body).map_err(|e| {
        SandboxError::config(
            format!("the container spec cannot be re-read: {e}"),
            "check labels, env and annotations for values JSON cannot carry",
        )
    })?;
    patch_spec(&mut v, podman)?;
    let mut extra = Vec::new();
    if let Some(source) = &spec.agent_mount {
        // The agent binary from the host's cache, read-only (ContainerSpec::agent_mount).
        extra.push(json!({
            "destination": sandbox_container::AGENT_PATH,
            "source": source.to_string_lossy(),
            "type": "bind",
            "options": ["bind", "ro", "nosuid", "nodev"],
        }));
    }
    if let Some(bytes) = spec.scratch_bytes() {
        // The disk limit's scratch filesystems over the read-only root. Podman copies the
        // image's files at that path in (tmpcopyup), and its archive API sees them.
        for path in spec.scratch_paths() {
            extra.push(json!({
                "destination": path,
                "source": "tmpfs",
                "type": "tmpfs",
                "options": [format!("size={bytes}"), "mode=1777", "nosuid", "nodev"],
            }));
        }
    }
    if let Some(obj) = v.as_object_mut().filter(|_| !extra.is_empty()) {
        match obj.get_mut("mounts").and_then(Value::as_array_mut) {
            Some(mounts) => mounts.extend(extra),
            None => {
                obj.insert("mounts".into(), Value::Array(extra));
            }
        }
    }
    if let (NetworkMode::Isolated { network, dns, .. }, Some(obj)) =
        (&spec.network, v.as_object_mut())
    {
        // The library network, and its gateway (the egress resolver) as the only name
        // server in the container's resolv.conf.
        obj.insert("Networks".into(), json!({ network.clone(): {} }));
        obj.insert(
            "dns_server".into(),
            Value::Array(dns.iter().map(|d| Value::String(d.to_string())).collect()),
        );
    }
    Ok(v)
}

/// Whether rules in a container's network namespace govern its traffic under these
/// options (not under gVisor, whose netstack sends through a packet socket).
pub(crate) fn netfilter_applies(podman: &PodmanOptions) -> bool {
    podman.runtime != Some(Runtime::Runsc)
}

/// The egress network: a bridge isolated from other networks (`isolate`), without
/// aardvark DNS (the library's resolver answers), labelled. netavark 1.4 has no switch for
/// traffic between containers of one bridge: each sandbox's own rules reject the subnet.
pub(crate) fn network_create_opts(spec: &NetworkSpec) -> NetworkCreateOpts {
    NetworkCreateOpts::builder()
        .name(&spec.name)
        .driver("bridge")
        .dns_enabled(false)
        .internal(false)
        .labels(spec.labels.clone())
        .options([("isolate", "true")])
        .build()
}

/// A network as the container layer sees it.
pub(crate) fn network_info(n: models::Network) -> NetworkInfo {
    let subnets = n
        .subnets
        .unwrap_or_default()
        .into_iter()
        .filter_map(|s| Subnet::parse(s.subnet.as_deref()?, s.gateway.as_deref()))
        .collect();
    let mut info = NetworkInfo::new(
        n.name.unwrap_or_default(),
        subnets,
        n.labels.unwrap_or_default().into_iter().collect(),
    );
    // Known ids let a create tell a network re-created under the same name (another
    // process's sweep removed it meanwhile) from the one it ensured.
    info.id = n.id.unwrap_or_default();
    info.isolated = n
        .options
        .as_ref()
        .and_then(|o| o.get("isolate"))
        .is_some_and(|v| v == "true");
    info
}

/// The container's addresses on its networks.
pub(crate) fn container_addresses(
    settings: Option<&models::InspectNetworkSettings>,
) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let Some(s) = settings else { return out };
    let direct = [&s.ip_address, &s.global_i_pv_6_address];
    let nets = s.networks.iter().flat_map(|n| n.values());
    let candidates = direct
        .into_iter()
        .cloned()
        .chain(nets.flat_map(|n| [n.ip_address.clone(), n.global_i_pv_6_address.clone()]));
    for a in candidates.flatten() {
        if let Ok(ip) = a.parse::<IpAddr>()
            && !out.contains(&ip)
        {
            out.push(ip);
        }
    }
    out
}

/// Applies what podman-api cannot express correctly. Mount sources are canonicalised and
/// checked again here, so the body never carries a path other than the one vetted.
fn patch_spec(spec: &mut Value, podman: &PodmanOptions) -> Result<()> {
    let Some(obj) = spec.as_object_mut() else {
        return Ok(());
    };
    // podman-api 0.11 only offers `no_new_privilages` (sic), which Podman ignores.
    obj.remove("no_new_privilages");
    obj.insert("no_new_privileges".into(), Value::Bool(true));
    let mut mounts: Vec<Value> = Vec::new();
    for m in podman.mounts.iter().filter(|m| m.mode == MountMode::Bind) {
        let relabel = match m.sharing {
            Sharing::Private => "Z",
            Sharing::Shared => "z",
        };
        // Sandbox root is host root on a bind mount (rootful, no user namespace): a setuid
        // binary or a device node written through it must stay inert on the host.
        mounts.push(json!({
            "destination": m.normalized_target()?,
            "source": m.resolved_host()?.to_string_lossy(),
            "type": "bind",
            "options": ["rbind", if m.read_only { "ro" } else { "rw" }, "nosuid", "nodev", relabel],
        }));
    }
    if !mounts.is_empty() {
        obj.insert("mounts".into(), Value::Array(mounts));
    }
    if !podman.cdi_devices.is_empty() {
        let devices: Vec<Value> = podman
            .cdi_devices
            .iter()
            .map(|d| json!({ "path": d }))
            .collect();
        obj.insert("devices".into(), Value::Array(devices));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mount;
    use sandbox_core::{EffectiveResources, ErrorCode, Resources};
    use std::collections::BTreeMap;
    use std::time::Duration;

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
        create_body(s, p).unwrap()
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
        assert_eq!(v["cap_drop"], json!(["ALL"]), "NET_ADMIN stays dropped");
        let spec = NetworkSpec::new("sbx-egress", BTreeMap::new());
        let o = network_create_opts(&spec).serialize().unwrap();
        let o: Value = serde_json::from_str(&o).unwrap();
        assert_eq!(o["options"]["isolate"], "true");
        assert_eq!(o["dns_enabled"], false);
        assert!(netfilter_applies(&PodmanOptions::default()));
        assert!(!netfilter_applies(
            &PodmanOptions::default().runtime(Runtime::Runsc)
        ));
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
        assert_eq!(v["remove"], true);
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
    }

    #[test]
    fn options_map_to_the_body() {
        let d = tempfile::tempdir().unwrap();
        let p = PodmanOptions::new()
            .runtime(crate::PodmanRuntime::Runsc)
            .capability(crate::LinuxCapability::Chown)
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
        for pids in [1u64 << 63, u64::MAX, (1u64 << 63) + 512, MAX_PIDS + 1] {
            for p in [
                PodmanOptions::default(),
                PodmanOptions::new().runtime(crate::PodmanRuntime::Runsc),
            ] {
                let s = spec_with(Resources::default().pids(pids), NetworkMode::None);
                let limit = body(&s, &p)["resource_limits"]["pids"]["limit"]
                    .as_i64()
                    .unwrap();
                assert_eq!(limit, MAX_PIDS as i64, "pids {pids}");
            }
        }
        assert_eq!(pids_limit(64), 64);
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
    /// in the sandbox; the body carries the canonical host path and the normalised target.
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
            json!(["rbind", "rw", "nosuid", "nodev", "Z"])
        );
        assert_eq!(
            mounts[1]["options"],
            json!(["rbind", "ro", "nosuid", "nodev", "Z"])
        );
    }

    #[test]
    fn refusals_happen_before_provisioning() {
        let p = PodmanOptions::default();
        let refused = |r: Resources, p: &PodmanOptions| {
            let s = spec_with(r, NetworkMode::None);
            check_spec(&s, p).unwrap_err().code()
        };
        let disk = || Resources::default().disk_mb(100);
        assert!(check_spec(&spec_with(disk(), NetworkMode::None), &p).is_ok());
        let d = tempfile::tempdir().unwrap();
        for m in [
            Mount::copy(d.path(), "/work/in"),
            Mount::copy(d.path(), "/tmp"),
            Mount::bind(d.path(), "/data").read_only(false),
        ] {
            let p = PodmanOptions::new().mount(m.clone());
            assert!(check_spec(&spec_with(Resources::default(), NetworkMode::None), &p).is_ok());
            assert_eq!(refused(disk(), &p), ErrorCode::Configuration, "{m:?}");
        }
        let p = PodmanOptions::new()
            .mount(Mount::copy(d.path(), "/data"))
            .mount(Mount::bind(d.path(), "/ro"));
        assert!(check_spec(&spec_with(disk(), NetworkMode::None), &p).is_ok());
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
        assert!(check_spec(&s, &p).is_ok());
        let _: EffectiveResources = s.resources;
    }
}
