//! Turning a [`ContainerSpec`] into Docker's create body, and refusing what Docker cannot
//! enforce.
//!
//! Every container gets the hardening of SPEC §5, with no opt-out: `cap_drop ALL`,
//! `no-new-privileges`, not privileged, a pids limit, memory == memory+swap, a CPU quota,
//! Docker's init as PID 1, network `none` unless the spec asks for a network, ports
//! published on loopback only, and `auto_remove`, so the container is deleted when its
//! main process (the lifetime backstop) ends.
//!
//! Egress `Allow`/`AllowList` sandboxes run on the library's network (a bridge with
//! `com.docker.network.bridge.enable_icc=false`: no traffic between its containers), with
//! the network's gateway as their DNS server; the container layer loads the egress rules.

use std::collections::HashMap;
use std::net::IpAddr;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, HostConfig, Ipam, Mount, MountBindOptions, MountType, MountVolumeOptions,
    MountVolumeOptionsDriverConfig, NetworkCreateRequest, NetworkSettings, PortBinding,
};
use sandbox_container::engine::{NetworkInfo, NetworkSpec, Subnet};
use sandbox_container::{
    ContainerSpec, EngineError, EngineErrorKind, EngineResult, LABEL_RUNTIME, NetworkMode, Runtime,
};

use crate::error::during;

/// Refuses what Docker cannot enforce for `spec`, before anything is provisioned.
pub(crate) fn refuse_unenforceable(
    spec: &ContainerSpec,
    runtime: Runtime,
    runtime_forces_no_network: bool,
) -> Result<(), EngineError> {
    if !matches!(
        spec.network,
        NetworkMode::None | NetworkMode::Bridge { .. } | NetworkMode::Isolated { .. }
    ) {
        return Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!(
                "network mode {:?} is not supported by the Docker adapter",
                spec.network
            ),
        ));
    }
    if runtime_forces_no_network && spec.network != NetworkMode::None {
        return Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!(
                "the engine registers runtime `{runtime}` with `--network=none`, so egress Allow \
                 cannot be applied; use egress Deny with this runtime, or register runsc without \
                 `--network=none` in /etc/docker/daemon.json and reload dockerd (`sudo kill -HUP \
                 $(pidof dockerd)`)"
            ),
        ));
    }
    Ok(())
}

/// The create body for `spec` under `runtime`.
pub(crate) fn create_body(spec: &ContainerSpec, runtime: Runtime) -> ContainerCreateBody {
    let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
    labels.insert(LABEL_RUNTIME.into(), runtime.as_str().into());
    let publish: &[u16] = spec.network.published();
    let exposed: Vec<String> = publish.iter().map(|p| format!("{p}/tcp")).collect();
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint: spec.command.first().map(|c| vec![c.clone()]),
        cmd: Some(spec.command.iter().skip(1).cloned().collect()),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        working_dir: Some(spec.workdir.clone()),
        labels: Some(labels),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        attach_stdin: Some(false),
        attach_stdout: Some(false),
        attach_stderr: Some(false),
        tty: Some(false),
        open_stdin: Some(false),
        host_config: Some(host_config(spec, runtime, publish)),
        ..Default::default()
    }
}

fn host_config(spec: &ContainerSpec, runtime: Runtime, publish: &[u16]) -> HostConfig {
    let r = &spec.resources;
    let memory = spec.memory_bytes();
    // Every mode is named: a new one must be handled here, never fall back to a bridge.
    let (network_mode, dns) = match &spec.network {
        NetworkMode::None => ("none".to_string(), None),
        NetworkMode::Bridge { .. } => ("bridge".to_string(), None),
        NetworkMode::Isolated { network, dns, .. } => (
            network.clone(),
            Some(dns.iter().map(IpAddr::to_string).collect::<Vec<_>>()),
        ),
        other => unreachable_mode(other),
    };
    let port_bindings = (!publish.is_empty()).then(|| {
        publish
            .iter()
            .map(|p| {
                (
                    format!("{p}/tcp"),
                    // Loopback only, at a port the engine picks: never the container port
                    // itself (a sandbox could impersonate a local service there).
                    Some(vec![PortBinding {
                        host_ip: Some("127.0.0.1".into()),
                        host_port: Some(String::new()),
                    }]),
                )
            })
            .collect()
    });
    HostConfig {
        network_mode: Some(network_mode),
        dns,
        port_bindings,
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(vec![]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        privileged: Some(false),
        pids_limit: Some(runtime.pids_limit(r.pids)),
        memory: Some(memory),
        memory_swap: Some(memory),
        nano_cpus: Some((r.cpu * 1e9) as i64),
        init: Some(spec.init),
        auto_remove: Some(true),
        runtime: Some(runtime.as_str().into()),
        publish_all_ports: Some(false),
        mounts: mounts(spec),
        readonly_rootfs: Some(!spec.scratch_paths().is_empty()),
        shm_size: spec
            .scratch_bytes()
            .map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
        ..Default::default()
    }
}

/// The agent binary bind-mounted read-only from the host (ContainerSpec::agent_mount), and
/// the scratch filesystems of a disk limit (ContainerSpec::scratch_paths).
fn mounts(spec: &ContainerSpec) -> Option<Vec<Mount>> {
    let mut out = Vec::new();
    if let Some(source) = &spec.agent_mount {
        out.push(Mount {
            target: Some(sandbox_container::AGENT_PATH.into()),
            source: Some(source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            bind_options: Some(MountBindOptions {
                non_recursive: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    if let Some(bytes) = spec.scratch_bytes() {
        // An anonymous volume of the local driver backed by tmpfs, not a `tmpfs` mount:
        // Docker's archive API (uploads, downloads, the exec path's file operations)
        // cannot see tmpfs mounts but does see volumes. `docker rm -v` and auto-remove
        // delete anonymous volumes with their container.
        let options = HashMap::from([
            ("type".to_string(), "tmpfs".to_string()),
            ("device".to_string(), "tmpfs".to_string()),
            (
                "o".to_string(),
                format!("size={bytes},mode=1777,nosuid,nodev"),
            ),
        ]);
        for path in spec.scratch_paths() {
            out.push(Mount {
                target: Some(path.to_string()),
                typ: Some(MountType::VOLUME),
                volume_options: Some(MountVolumeOptions {
                    driver_config: Some(MountVolumeOptionsDriverConfig {
                        name: Some("local".into()),
                        options: Some(options.clone()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    (!out.is_empty()).then_some(out)
}

/// A mode this adapter does not know is refused by `refuse_unenforceable` before the body
/// is built; should one get here anyway, it gets no network rather than a wrong one.
fn unreachable_mode(mode: &NetworkMode) -> (String, Option<Vec<String>>) {
    tracing::error!(?mode, "network mode without a Docker mapping; using none");
    ("none".to_string(), None)
}

/// The egress network's create request: a bridge without inter-container traffic.
pub(crate) fn network_request(spec: &NetworkSpec) -> NetworkCreateRequest {
    let mut options = HashMap::new();
    options.insert(
        "com.docker.network.bridge.enable_icc".to_string(),
        "false".to_string(),
    );
    NetworkCreateRequest {
        name: spec.name.clone(),
        driver: Some("bridge".into()),
        internal: Some(false),
        attachable: Some(false),
        options: Some(options),
        labels: Some(spec.labels.clone().into_iter().collect()),
        ..Default::default()
    }
}

fn subnets(ipam: Option<&Ipam>) -> Vec<Subnet> {
    ipam.and_then(|i| i.config.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let mut s = Subnet::parse(c.subnet.as_deref()?, c.gateway.as_deref())?;
            // A fresh dockerd's IPAM config can lack the gateway: it is then the subnet's
            // first host address, which is what dockerd gives the bridge.
            if s.gateway.is_none()
                && let IpAddr::V4(a) = s.addr
            {
                s.gateway = Some(IpAddr::V4((u32::from(a) + 1).into()));
            }
            Some(s)
        })
        .collect()
}

/// Creates the egress network (inter-container traffic off, labelled).
pub(crate) async fn create_network(client: &Docker, spec: &NetworkSpec) -> EngineResult<()> {
    client
        .create_network(network_request(spec))
        .await
        .map(|_| ())
        .map_err(during("create network"))
}

/// Every network: subnets (the host's bridge addresses and other containers), ids, labels,
/// and whether inter-container traffic is off.
pub(crate) async fn networks(client: &Docker) -> EngineResult<Vec<NetworkInfo>> {
    let list = client
        .list_networks(None)
        .await
        .map_err(during("list networks"))?;
    Ok(list
        .into_iter()
        .map(|n| {
            let mut info = NetworkInfo::new(
                n.name.clone().unwrap_or_default(),
                subnets(n.ipam.as_ref()),
                n.labels.unwrap_or_default().into_iter().collect(),
            );
            info.id = n.id.unwrap_or_default();
            info.isolated = n
                .options
                .as_ref()
                .and_then(|o| o.get("com.docker.network.bridge.enable_icc"))
                .is_some_and(|v| v == "false");
            info
        })
        .collect())
}

/// Removes a network: `Ok(false)` when missing, `Conflict` while in use (Docker answers
/// 403 "has active endpoints").
pub(crate) async fn remove_network(client: &Docker, name: &str) -> EngineResult<bool> {
    match client.remove_network(name).await {
        Ok(()) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 403, ..
        }) => Err(EngineError::new(
            EngineErrorKind::Conflict,
            format!("network {name} is in use"),
        )),
        Err(e) => {
            let e = during("remove network")(e);
            if e.kind == EngineErrorKind::NotFound {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// The container's addresses on all its networks.
pub(crate) fn container_addresses(settings: Option<&NetworkSettings>) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for ep in settings
        .and_then(|s| s.networks.as_ref())
        .into_iter()
        .flat_map(|n| n.values())
    {
        for a in [&ep.ip_address, &ep.global_ipv6_address]
            .into_iter()
            .flatten()
        {
            if let Ok(ip) = a.parse::<IpAddr>()
                && !out.contains(&ip)
            {
                out.push(ip);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::Resources;
    use std::collections::BTreeMap;
    use std::time::Duration;

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

    #[test]
    fn hardening_is_always_applied() {
        let b = create_body(&spec(Resources::default()), Runtime::Runc);
        let h = b.host_config.clone().unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(h.cap_add, Some(vec![]));
        assert_eq!(h.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(h.privileged, Some(false));
        assert_eq!(h.memory, Some(512 * 1024 * 1024));
        assert_eq!(h.memory, h.memory_swap, "swap disabled");
        assert_eq!(h.pids_limit, Some(512));
        assert_eq!(h.nano_cpus, Some(1_000_000_000));
        assert_eq!(h.init, Some(true));
        assert_eq!(h.auto_remove, Some(true));
        assert_eq!(h.runtime.as_deref(), Some("runc"));
        assert!(h.port_bindings.is_none());
        assert_eq!(b.entrypoint, Some(vec!["sleep".to_string()]));
        assert_eq!(b.cmd, Some(vec!["2.500".to_string()]));
        assert_eq!(b.env, Some(vec!["PLAIN=v".to_string()]));
        assert_eq!(b.working_dir.as_deref(), Some("/work"));
        let labels = b.labels.unwrap();
        assert_eq!(labels["io.sandbox-rs.managed"], "true");
        assert_eq!(labels[LABEL_RUNTIME], "runc");
    }

    #[test]
    fn limits_runsc_and_loopback_publishing() {
        let mut s = spec(Resources::default().cpu(0.5).memory_mb(64).pids(32));
        s.network = NetworkMode::Bridge {
            publish: vec![8080],
        };
        let b = create_body(&s, Runtime::Runsc);
        let h = b.host_config.clone().unwrap();
        assert_eq!(h.nano_cpus, Some(500_000_000));
        assert_eq!(h.memory, Some(64 * 1024 * 1024));
        assert_eq!(h.pids_limit, Some(32 + 256), "runsc headroom");
        assert_eq!(h.runtime.as_deref(), Some("runsc"));
        assert_eq!(h.network_mode.as_deref(), Some("bridge"));
        let binding = &h.port_bindings.unwrap()["8080/tcp"];
        let binding = &binding.as_ref().unwrap()[0];
        assert_eq!(
            binding.host_ip.as_deref(),
            Some("127.0.0.1"),
            "loopback only"
        );
        assert_eq!(
            binding.host_port.as_deref(),
            Some(""),
            "an ephemeral host port"
        );
        assert_eq!(b.exposed_ports, Some(vec!["8080/tcp".to_string()]));
    }

    #[test]
    fn isolated_runs_on_the_named_network_with_its_dns() {
        let mut s = spec(Resources::default());
        s.network = NetworkMode::Isolated {
            network: "sbx-egress".into(),
            publish: vec![8080],
            dns: vec!["172.30.0.1".parse().unwrap()],
        };
        let h = create_body(&s, Runtime::Runc).host_config.unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("sbx-egress"));
        assert_eq!(h.dns, Some(vec!["172.30.0.1".to_string()]));
        assert!(h.port_bindings.unwrap().contains_key("8080/tcp"));
        assert_eq!(
            h.cap_drop,
            Some(vec!["ALL".to_string()]),
            "NET_ADMIN stays dropped"
        );
        let mut labels = BTreeMap::new();
        labels.insert("io.sandbox-rs.managed".to_string(), "true".to_string());
        let r = network_request(&NetworkSpec::new("sbx-egress", labels));
        assert_eq!(
            r.options.unwrap()["com.docker.network.bridge.enable_icc"],
            "false",
            "no traffic between sandboxes"
        );
        assert_eq!(r.labels.unwrap()["io.sandbox-rs.managed"], "true");
    }

    #[test]
    fn a_disk_limit_is_a_read_only_root_with_sized_scratch_volumes() {
        let h = create_body(&spec(Resources::default()), Runtime::Runc)
            .host_config
            .unwrap();
        assert_eq!(h.readonly_rootfs, Some(false));
        assert!(h.mounts.is_none() && h.shm_size.is_none());
        let h = create_body(&spec(Resources::default().disk_mb(10)), Runtime::Runc)
            .host_config
            .unwrap();
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.shm_size, Some(10 << 20));
        let mounts = h.mounts.unwrap();
        let targets: Vec<_> = mounts.iter().filter_map(|m| m.target.as_deref()).collect();
        assert_eq!(targets, ["/work", "/tmp"]);
        for m in &mounts {
            assert_eq!(m.typ, Some(MountType::VOLUME));
            assert!(m.source.is_none(), "anonymous: removed with the container");
            let driver = m.volume_options.clone().unwrap().driver_config.unwrap();
            let o = driver.options.unwrap();
            assert_eq!(o["type"], "tmpfs");
            assert_eq!(o["o"], "size=10485760,mode=1777,nosuid,nodev");
        }
    }

    #[test]
    fn refusals() {
        let mut s = spec(Resources::default());
        assert!(
            refuse_unenforceable(&s, Runtime::Runsc, true).is_ok(),
            "deny is fine"
        );
        s.network = NetworkMode::Bridge { publish: vec![] };
        assert!(
            refuse_unenforceable(&s, Runtime::Runsc, true).is_err(),
            "forced none"
        );
        assert!(refuse_unenforceable(&s, Runtime::Runsc, false).is_ok());
    }
}
