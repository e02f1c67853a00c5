//! Turning `CreateOptions` + [`PodmanOptions`] into a libpod SpecGenerator, and the
//! refusals that must happen before anything is created.
//!
//! The spec is assembled with podman-api's typed `ContainerCreateOptsBuilder` and then
//! patched where the crate is defective (see `rest.rs`): `no_new_privileges` (the crate's
//! field is misspelled and ignored by Podman), OCI `mounts` and CDI `devices`.

use std::collections::BTreeMap;

use podman_api::models;
use podman_api::opts::ContainerCreateOpts;
use sandbox_core::{
    Capability, CreateOptions, EffectiveResources, Egress, IsolationTier, Result, SandboxError,
};
use serde_json::{Value, json};

use crate::config::{MountMode, PodmanOptions, Sharing, normalize_capability};
use crate::error::BACKEND;

/// What every Podman sandbox can do with default options.
pub(crate) fn base_capabilities() -> Capability {
    Capability::RUN_COMMAND
        | Capability::RUN_CODE
        | Capability::STATEFUL_CODE
        | Capability::STREAMING
        | Capability::FILESYSTEM
        | Capability::UPLOAD_DOWNLOAD
        | Capability::NETWORK_POLICY
        | Capability::INGRESS_PORTS
}

/// Capabilities of a sandbox created with these Podman options (GPU only with CDI devices,
/// which `PodmanOptions::validate` has checked against the host).
pub(crate) fn capabilities_for(podman: &PodmanOptions) -> Capability {
    let mut c = base_capabilities();
    if !podman.cdi_devices.is_empty() {
        c |= Capability::GPU;
    }
    c
}

/// Everything checked before provisioning. Returns the effective resources.
pub(crate) fn check(
    options: &CreateOptions,
    podman: &PodmanOptions,
    caps: Capability,
    tier: IsolationTier,
) -> Result<EffectiveResources> {
    let res = sandbox_core::policy::check_create(BACKEND, caps, tier, options)?;
    if let Some(mb) = res.disk_mb {
        return Err(SandboxError::config(
            format!("resources.disk_mb ({mb} MiB) cannot be enforced by the Podman adapter"),
            "leave resources.disk_mb unset (the overlay storage driver has no per-container quota here)",
        ));
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
    let mut seen = std::collections::BTreeSet::new();
    for p in &options.network.ingress_ports {
        if !seen.insert(*p) {
            return Err(SandboxError::config(
                format!("ingress port {p} given twice"),
                "list each port once",
            ));
        }
    }
    podman.validate()?;
    Ok(res)
}

/// The lifetime in whole seconds the main `sleep` runs (at least 1).
pub(crate) fn lifetime_secs(options: &CreateOptions) -> u64 {
    let t = options.timeout;
    (t.as_secs() + u64::from(t.subsec_nanos() > 0)).max(1)
}

/// The libpod SpecGenerator JSON for a new sandbox container.
pub(crate) fn container_spec(
    options: &CreateOptions,
    res: &EffectiveResources,
    podman: &PodmanOptions,
    template: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Value> {
    let memory = (res.memory_mb as i64).saturating_mul(1024 * 1024);
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
            limit: Some(res.pids as i64),
        }),
        rdma: None,
        unified: None,
    };
    let netns = match options.network.egress {
        Egress::Deny => "none",
        _ => "bridge",
    };
    let mut caps_add = Vec::new();
    for c in &podman.capabilities {
        caps_add.push(normalize_capability(c)?);
    }
    let mut b = ContainerCreateOpts::builder()
        .image(template)
        // The main process bounds the lifetime: when `sleep` ends the container stops
        // (and, ephemeral, is removed). `init: true` reaps zombies as PID 1.
        .command(["sleep".to_string(), lifetime_secs(options).to_string()])
        .init(true)
        .labels(labels.iter().map(|(k, v)| (k.clone(), v.clone())))
        .env(options.env.iter().map(|(k, v)| (k.clone(), v.clone())))
        .work_dir(options.effective_workdir())
        .create_working_dir(true)
        .remove(podman.ephemeral)
        .drop_capabilities(["ALL"])
        .net_namespace(models::Namespace {
            nsmode: Some(netns.to_string()),
            value: None,
        })
        .resource_limits(resources)
        .stop_timeout(1u64);
    if !caps_add.is_empty() {
        b = b.add_capabilities(caps_add);
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
    // Under Deny there is no interface to map to: `ingress.rs` forwards those ports.
    if !options.network.ingress_ports.is_empty() && options.network.egress != Egress::Deny {
        b = b.portmappings(
            options
                .network
                .ingress_ports
                .iter()
                .map(|p| models::PortMapping {
                    container_port: Some(*p),
                    host_ip: Some("127.0.0.1".into()),
                    host_port: Some(*p),
                    protocol: Some("tcp".into()),
                    range: None,
                }),
        );
    }
    let body = b
        .build()
        .serialize_vec()
        .map_err(|e| crate::error::engine("serialising the container spec", e))?;
    let mut spec: Value = serde_json::from_slice(&body).map_err(|e| SandboxError::Engine {
        backend: BACKEND.into(),
        message: "re-reading the container spec failed".into(),
        source: Some(Box::new(e)),
    })?;
    patch_spec(&mut spec, podman);
    Ok(spec)
}

/// Applies what podman-api cannot express correctly.
fn patch_spec(spec: &mut Value, podman: &PodmanOptions) {
    let Some(obj) = spec.as_object_mut() else {
        return;
    };
    // podman-api 0.11 only offers `no_new_privilages` (sic), which Podman ignores.
    obj.remove("no_new_privilages");
    obj.insert("no_new_privileges".into(), Value::Bool(true));
    let mounts: Vec<Value> = podman
        .mounts
        .iter()
        .filter(|m| m.mode == MountMode::Bind)
        .map(|m| {
            let relabel = match m.sharing {
                Sharing::Private => "Z",
                Sharing::Shared => "z",
            };
            json!({
                "destination": m.container,
                "source": m.host.to_string_lossy(),
                "type": "bind",
                "options": ["rbind", if m.read_only { "ro" } else { "rw" }, relabel],
            })
        })
        .collect();
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mount;
    use sandbox_core::{ErrorCode, NetworkPolicy, Resources};
    use std::time::Duration;

    fn spec(o: &CreateOptions, p: &PodmanOptions) -> Value {
        let res = o.validate().unwrap();
        let labels = sandbox_core::labels::sandbox_labels("podman", 1, &o.metadata);
        container_spec(o, &res, p, "img", &labels).unwrap()
    }

    #[test]
    fn hardening_is_always_in_the_spec() {
        let v = spec(&CreateOptions::default(), &PodmanOptions::default());
        assert_eq!(v["no_new_privileges"], true);
        assert!(v.get("no_new_privilages").is_none());
        assert_eq!(v["cap_drop"], json!(["ALL"]));
        assert_eq!(v["init"], true);
        assert_eq!(v["netns"]["nsmode"], "none");
        assert_eq!(v["remove"], true);
        let mem = 512 * 1024 * 1024;
        assert_eq!(v["resource_limits"]["memory"]["limit"], mem);
        assert_eq!(v["resource_limits"]["memory"]["swap"], mem);
        assert_eq!(v["resource_limits"]["pids"]["limit"], 512);
        assert_eq!(v["resource_limits"]["cpu"]["quota"], 100_000);
        assert_eq!(v["command"], json!(["sleep", "300"]));
        assert_eq!(v["work_dir"], "/work");
        assert_eq!(v["create_working_dir"], true);
        assert_eq!(v["labels"]["io.sandbox-rs.managed"], "true");
    }

    #[test]
    fn secrets_never_enter_the_spec() {
        let o = CreateOptions::default()
            .env("PLAIN", "visible")
            .secret("TOKEN", "hunter2");
        let v = spec(&o, &PodmanOptions::default());
        let s = v.to_string();
        assert!(!s.contains("hunter2") && !s.contains("TOKEN"));
        assert_eq!(v["env"]["PLAIN"], "visible");
    }

    #[test]
    fn options_map_to_the_spec() {
        let d = tempfile::tempdir().unwrap();
        let p = PodmanOptions::new()
            .runtime(crate::PodmanRuntime::Runsc)
            .capability("chown")
            .annotation("krun.cpus", "2")
            .ephemeral(false)
            .mount(Mount::bind(d.path(), "/data").read_only(true))
            .mount(Mount::copy(d.path(), "/seed"));
        let o = CreateOptions::default()
            .network(NetworkPolicy::allow().ingress_port(8080))
            .resources(Resources::default().cpu(0.5).memory_mb(256).pids(64))
            .timeout(Duration::from_millis(1500));
        let v = spec(&o, &p);
        assert_eq!(v["oci_runtime"], "runsc");
        assert_eq!(v["cap_add"], json!(["CHOWN"]));
        assert_eq!(v["annotations"]["krun.cpus"], "2");
        assert_eq!(v["remove"], false);
        assert_eq!(v["netns"]["nsmode"], "bridge");
        assert_eq!(v["portmappings"][0]["host_ip"], "127.0.0.1");
        assert_eq!(v["portmappings"][0]["container_port"], 8080);
        assert_eq!(v["resource_limits"]["cpu"]["quota"], 50_000);
        assert_eq!(v["resource_limits"]["pids"]["limit"], 64);
        assert_eq!(v["command"], json!(["sleep", "2"]));
        let mounts = v["mounts"].as_array().unwrap();
        assert_eq!(mounts.len(), 1, "copy mounts leave no bind mount");
        assert_eq!(mounts[0]["destination"], "/data");
        assert_eq!(mounts[0]["options"], json!(["rbind", "ro", "Z"]));
    }

    #[test]
    fn deny_ingress_is_forwarded_not_mapped() {
        let o = CreateOptions::default().network(NetworkPolicy::deny().ingress_port(8080));
        let v = spec(&o, &PodmanOptions::default());
        assert_eq!(v["netns"]["nsmode"], "none");
        assert!(v.get("portmappings").is_none());
    }

    #[test]
    fn refusals_happen_before_provisioning() {
        let caps = base_capabilities();
        let t = IsolationTier::Container;
        let p = PodmanOptions::default();
        let code = |o: CreateOptions, p: &PodmanOptions| check(&o, p, caps, t).unwrap_err().code();
        assert_eq!(
            code(
                CreateOptions::default().resources(Resources::default().disk_mb(100)),
                &p
            ),
            ErrorCode::Configuration
        );
        assert_eq!(
            code(
                CreateOptions::default().resources(Resources::default().gpu(1)),
                &p
            ),
            ErrorCode::CapabilityNotSupported
        );
        assert_eq!(
            code(
                CreateOptions::default().network(NetworkPolicy::allow_list(["pypi.org"])),
                &p
            ),
            ErrorCode::CapabilityNotSupported
        );
        assert_eq!(
            code(
                CreateOptions::default()
                    .network(NetworkPolicy::allow().ingress_port(80).ingress_port(80)),
                &p
            ),
            ErrorCode::Configuration
        );
        assert_eq!(
            code(
                CreateOptions::default().require_isolation(IsolationTier::Gvisor),
                &p
            ),
            ErrorCode::Configuration
        );
        assert_eq!(
            code(
                CreateOptions::default(),
                &PodmanOptions::new().capability("NET_ADMIN")
            ),
            ErrorCode::Configuration
        );
        assert!(check(&CreateOptions::default(), &p, caps, t).is_ok());
        assert!(
            check(
                &CreateOptions::default().require_isolation(IsolationTier::Gvisor),
                &p,
                caps,
                IsolationTier::Gvisor
            )
            .is_ok()
        );
    }
}
