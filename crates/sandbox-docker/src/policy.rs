//! Turning a [`ContainerSpec`] into Docker's create body, and refusing what Docker cannot
//! enforce.
//!
//! Every container gets the hardening of SPEC §5, with no opt-out: `cap_drop ALL`,
//! `no-new-privileges`, not privileged, a pids limit, memory == memory+swap, a CPU quota,
//! Docker's init as PID 1, network `none` unless the spec asks for a network, ports
//! published on loopback only, and `auto_remove`, so the container is deleted when its
//! main process (the lifetime backstop) ends.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, PortBinding};
use sandbox_container::{
    ContainerSpec, EngineError, EngineErrorKind, LABEL_RUNTIME, NetworkMode, Runtime,
};

/// Refuses what Docker cannot enforce for `spec`, before anything is provisioned.
pub(crate) fn refuse_unenforceable(
    spec: &ContainerSpec,
    runtime: Runtime,
    runtime_forces_no_network: bool,
) -> Result<(), EngineError> {
    if spec.resources.disk_mb.is_some() {
        return Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            "resources.disk_mb cannot be enforced by the Docker backend (overlay2 has no \
             per-container quota without xfs project quotas); leave it unset for Docker",
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
    let publish: &[u16] = match &spec.network {
        NetworkMode::Bridge { publish } => publish,
        _ => &[],
    };
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
    let memory = i64::try_from(r.memory_mb)
        .unwrap_or(i64::MAX)
        .saturating_mul(1024 * 1024);
    let network_mode = match spec.network {
        NetworkMode::None => "none",
        _ => "bridge",
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
        network_mode: Some(network_mode.into()),
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
        ..Default::default()
    }
}
