//! Turning `CreateOptions` into engine settings, and refusing what Docker cannot enforce.
//!
//! Every container gets the hardening of SPEC §5, with no opt-out: `cap_drop ALL`,
//! `no-new-privileges`, a pids limit, memory == memory+swap, a CPU quota, an init as PID 1,
//! network `none` unless egress is allowed, and a main process (`sleep <lifetime>`) that
//! ends at the deadline so the engine removes the container (`auto_remove`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, PortBinding};
use sandbox_core::labels::sandbox_labels;
use sandbox_core::{CreateOptions, EffectiveResources, Egress, Result, SandboxError};

use crate::config::{DockerConfig, Runtime};
use crate::error::BACKEND;

/// Label carrying the OCI runtime name.
pub(crate) const LABEL_RUNTIME: &str = "io.sandbox-rs.runtime";

/// Everything `create` sends to the engine, computed without touching it.
#[derive(Debug, Clone)]
pub(crate) struct ContainerPlan {
    /// The create body (image, command, env, labels, host config).
    pub body: ContainerCreateBody,
    /// Image name.
    pub template: String,
    /// Working directory.
    pub workdir: String,
    /// Labels (also in `body`).
    pub labels: BTreeMap<String, String>,
}

/// Refuses what Docker cannot enforce, before anything is provisioned.
pub(crate) fn refuse_unenforceable(resources: &EffectiveResources) -> Result<()> {
    if resources.disk_mb.is_some() {
        return Err(SandboxError::config(
            "resources.disk_mb cannot be enforced by the Docker backend (overlay2 has no \
             per-container quota without xfs project quotas)",
            "leave resources.disk_mb unset for Docker",
        ));
    }
    Ok(())
}

/// The lifetime in whole seconds, rounded up (what the deadline label and `sleep` use).
fn lifetime_secs(timeout: Duration) -> u64 {
    let s = timeout.as_secs();
    if timeout.subsec_nanos() > 0 { s + 1 } else { s }
}

/// Builds the container create body for `options`.
pub(crate) fn plan_container(
    config: &DockerConfig,
    options: &CreateOptions,
    resources: &EffectiveResources,
    now_unix: u64,
) -> ContainerPlan {
    let template = options
        .template
        .clone()
        .unwrap_or_else(|| config.default_template.clone());
    let workdir = options.effective_workdir().to_string();
    let deadline = now_unix + lifetime_secs(options.timeout);
    let mut labels = sandbox_labels(BACKEND, deadline, &options.metadata);
    labels.insert(LABEL_RUNTIME.into(), config.runtime.as_str().into());

    // Secrets are deliberately absent: they are injected per exec, never stored in
    // the container configuration (`docker inspect` Config.Env).
    let env: Vec<String> = options
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();

    let host_config = host_config(config.runtime, options, resources);
    let exposed: Vec<String> = engine_published(options)
        .iter()
        .map(|p| format!("{p}/tcp"))
        .collect();

    let body = ContainerCreateBody {
        image: Some(template.clone()),
        // The main process is the lifetime backstop: it ends at the deadline, the init
        // exits, and `auto_remove` deletes the container.
        entrypoint: Some(vec!["sleep".into()]),
        cmd: Some(vec![format!("{:.3}", options.timeout.as_secs_f64())]),
        env: Some(env),
        working_dir: Some(workdir.clone()),
        labels: Some(labels.clone().into_iter().collect::<HashMap<_, _>>()),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        attach_stdin: Some(false),
        attach_stdout: Some(false),
        attach_stderr: Some(false),
        tty: Some(false),
        open_stdin: Some(false),
        host_config: Some(host_config),
        ..Default::default()
    };
    ContainerPlan {
        body,
        template,
        workdir,
        labels,
    }
}

/// Ports the engine publishes itself: only with a network (egress `Allow`). Under
/// `Deny` ingress goes through a loopback forwarder instead (see `ingress.rs`).
pub(crate) fn engine_published(options: &CreateOptions) -> Vec<u16> {
    if options.network.egress == Egress::Deny {
        Vec::new()
    } else {
        options.network.ingress_ports.clone()
    }
}

/// The cgroup pids limit for `requested` sandbox processes (plus the runtime's
/// [`Runtime::pids_headroom`]).
pub(crate) fn pids_limit(runtime: Runtime, requested: u64) -> i64 {
    let n = requested.saturating_add(runtime.pids_headroom());
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn host_config(
    runtime: Runtime,
    options: &CreateOptions,
    resources: &EffectiveResources,
) -> HostConfig {
    let memory = (resources.memory_mb as i64).saturating_mul(1024 * 1024);
    let network_mode = match options.network.egress {
        Egress::Deny => "none",
        // AllowList is refused by check_create (EGRESS_ALLOWLIST is not declared).
        _ => "bridge",
    };
    let published = engine_published(options);
    let port_bindings = (!published.is_empty()).then(|| {
        published
            .iter()
            .map(|p| {
                (
                    format!("{p}/tcp"),
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
        pids_limit: Some(pids_limit(runtime, resources.pids)),
        memory: Some(memory),
        memory_swap: Some(memory),
        nano_cpus: Some((resources.cpu * 1e9) as i64),
        init: Some(true),
        auto_remove: Some(true),
        runtime: Some(runtime.as_str().into()),
        publish_all_ports: Some(false),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::{ErrorCode, NetworkPolicy, Resources};

    fn plan(o: &CreateOptions) -> ContainerPlan {
        let r = o.resources.effective().unwrap();
        plan_container(&DockerConfig::default(), o, &r, 1_000)
    }

    #[test]
    fn hardening_is_always_applied() {
        let p = plan(&CreateOptions::default());
        let h = p.body.host_config.clone().unwrap();
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(h.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(h.memory, Some(512 * 1024 * 1024));
        assert_eq!(h.memory, h.memory_swap, "swap disabled");
        assert_eq!(h.pids_limit, Some(512));
        assert_eq!(h.nano_cpus, Some(1_000_000_000));
        assert_eq!(h.init, Some(true));
        assert_eq!(h.auto_remove, Some(true));
        assert_eq!(h.runtime.as_deref(), Some("runc"));
        assert_eq!(p.body.image.as_deref(), Some("sandbox-rs/python:3.11"));
        assert_eq!(p.body.working_dir.as_deref(), Some("/work"));
        assert_eq!(p.labels["io.sandbox-rs.managed"], "true");
        assert_eq!(p.labels["io.sandbox-rs.deadline"], "1300");
    }

    #[test]
    fn lifetime_backstop_is_the_main_process() {
        let o = CreateOptions::default().timeout(Duration::from_millis(2500));
        let p = plan(&o);
        assert_eq!(p.body.entrypoint, Some(vec!["sleep".to_string()]));
        assert_eq!(p.body.cmd, Some(vec!["2.500".to_string()]));
        assert_eq!(p.labels["io.sandbox-rs.deadline"], "1003");
    }

    #[test]
    fn secrets_never_in_container_env() {
        let o = CreateOptions::default()
            .env("PLAIN", "v")
            .secret("TOKEN", "hunter2");
        let p = plan(&o);
        let env = p.body.env.unwrap();
        assert_eq!(env, vec!["PLAIN=v".to_string()]);
        assert!(!format!("{:?}", p.body.labels).contains("hunter2"));
    }

    #[test]
    fn requested_caps_are_mapped() {
        let o = CreateOptions::default()
            .resources(Resources::default().cpu(0.5).memory_mb(64).pids(32))
            .network(NetworkPolicy::allow().ingress_port(8080))
            .metadata("team", "x");
        let p = plan(&o);
        let h = p.body.host_config.clone().unwrap();
        assert_eq!(h.nano_cpus, Some(500_000_000));
        assert_eq!(h.memory, Some(64 * 1024 * 1024));
        assert_eq!(h.pids_limit, Some(32));
        assert_eq!(h.network_mode.as_deref(), Some("bridge"));
        let b = &h.port_bindings.unwrap()["8080/tcp"];
        assert_eq!(
            b.as_ref().unwrap()[0].host_ip.as_deref(),
            Some("127.0.0.1"),
            "published on loopback only"
        );
        assert_eq!(p.body.exposed_ports, Some(vec!["8080/tcp".to_string()]));
        assert_eq!(p.labels["io.sandbox-rs.meta.team"], "x");
    }

    #[test]
    fn runsc_selected_by_enum() {
        let o = CreateOptions::default();
        let r = o.resources.effective().unwrap();
        let cfg = DockerConfig::default().runtime(Runtime::Runsc);
        let p = plan_container(&cfg, &o, &r, 0);
        assert_eq!(
            p.body.host_config.unwrap().runtime.as_deref(),
            Some("runsc")
        );
        assert_eq!(p.labels[LABEL_RUNTIME], "runsc");
    }

    #[test]
    fn unenforceable_requests_refused() {
        let o = CreateOptions::default().resources(Resources::default().disk_mb(100));
        let r = o.resources.effective().unwrap();
        assert_eq!(
            refuse_unenforceable(&r).unwrap_err().code(),
            ErrorCode::Configuration
        );
        let o = CreateOptions::default().network(NetworkPolicy::deny().ingress_port(80));
        let r = o.resources.effective().unwrap();
        assert!(refuse_unenforceable(&r).is_ok());
        let h = plan(&o).body.host_config.unwrap();
        assert_eq!(
            h.network_mode.as_deref(),
            Some("none"),
            "ingress never opens egress"
        );
        assert!(
            h.port_bindings.is_none(),
            "deny: forwarded, not engine-published"
        );
    }
}
