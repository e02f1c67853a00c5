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

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::Resources;
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
    fn refusals() {
        let s = spec(Resources::default().disk_mb(10));
        let e = refuse_unenforceable(&s, Runtime::Runc, false).unwrap_err();
        assert_eq!(e.kind, EngineErrorKind::InvalidRequest);
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
