//! Turning a [`ContainerSpec`] into Docker's create body, refusing what Docker cannot
//! enforce, and what its sandboxes can declare ([`CAPABILITIES`]); also the network bodies
//! and the reading of the engine's network answers. The engine calls are `engine.rs`'s.
//!
//! Every container gets the same hardening, with no opt-out: `cap_drop ALL`,
//! `no-new-privileges`, not privileged, a pids limit, memory == memory+swap, a CPU quota,
//! Docker's init as PID 1, network `none` unless the spec asks for a network, ports
//! published on loopback only, log driver `none` (nothing PID 1 writes reaches the
//! engine's disk). No `auto_remove`: a stopped container is kept so that
//! `Sandbox::start` can run it again; the host removes it (the kill, the deadline timer,
//! the sweeps, `sandbox reap`).
//!
//! Egress `Allow`/`AllowList` sandboxes run on the library's network (a bridge with
//! `com.docker.network.bridge.enable_icc=false`: no traffic between its containers), with
//! the network's gateway as their DNS server; the container layer loads the egress rules.

use std::collections::HashMap;
use std::net::IpAddr;

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Ipam, Mount, MountBindOptions,
    MountPoint, MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig, Network,
    NetworkCreateRequest, NetworkSettings, PortBinding,
};
use sandbox_container::engine::{ImageConfig, NetworkInfo, NetworkSpec, Subnet};
use sandbox_container::{
    ContainerSpec, EngineError, EngineErrorKind, LABEL_RUNTIME, LAYER_CAPABILITIES, NetworkMode,
    Runtime,
};
use sandbox_core::Capability;

use crate::config::DockerConfig;

/// What a Docker sandbox can declare: the container layer's set, a disk limit (a
/// read-only root with tmpfs-backed scratch volumes), the egress allowlist where the
/// container layer can load its rules, the agent with its terminals, moved deadlines and
/// idle limits where it runs, pause/resume (the freezer, under runc and runsc),
/// filesystem snapshots (an export imported as a new image), and stop/start (the engine
/// keeps a stopped container; under runc and runsc).
pub const CAPABILITIES: Capability = LAYER_CAPABILITIES
    .union(Capability::DISK_LIMIT)
    .union(Capability::EGRESS_ALLOWLIST)
    .union(Capability::LIVE_EGRESS)
    .union(Capability::HOST_PORTS)
    .union(Capability::CREDENTIALS)
    .union(Capability::PTY)
    .union(Capability::PAUSE_RESUME)
    .union(Capability::AGENT)
    .union(Capability::EXTEND_LIFETIME)
    .union(Capability::IDLE_TIMEOUT)
    .union(Capability::SNAPSHOT)
    .union(Capability::RESET_PROCESSES)
    .union(Capability::SSH_AGENT)
    .union(Capability::STOP_START)
    .union(Capability::GIT_GATE)
    .union(Capability::SNAPSHOT_FORK);

/// What the engine offers the container layer under this runtime: [`CAPABILITIES`]
/// without the agent, its terminals, extend, the idle limit and the reset of processes
/// (which the container layer adds where the agent runs), without the allowlist where the
/// runtime forces `--network=none`, and without forks unless the engine can checkpoint
/// (`forks`).
pub(crate) fn capabilities(runtime_forces_no_network: bool, forks: bool) -> Capability {
    let mut caps = CAPABILITIES
        .difference(Capability::PTY)
        .difference(Capability::AGENT)
        .difference(Capability::EXTEND_LIFETIME)
        .difference(Capability::IDLE_TIMEOUT)
        .difference(Capability::RESET_PROCESSES)
        .difference(Capability::SSH_AGENT)
        .difference(Capability::GIT_GATE);
    if !forks {
        caps.remove(Capability::SNAPSHOT_FORK);
    }
    if runtime_forces_no_network {
        caps.difference(
            Capability::EGRESS_ALLOWLIST
                | Capability::LIVE_EGRESS
                | Capability::HOST_PORTS
                | Capability::CREDENTIALS,
        )
    } else {
        caps
    }
}

/// Whether rules in a container's network namespace govern its traffic under `runtime`
/// (not under gVisor, whose netstack sends through a packet socket, past the hooks).
pub(crate) fn netfilter_applies(runtime: Runtime) -> bool {
    runtime != Runtime::Runsc
}

impl DockerConfig {
    /// The create body the adapter sends for `spec` under this configuration, as the
    /// Engine API's JSON: every hardening field, limit and mount is visible in it, for an
    /// audit or a test.
    /// Refused when a mount's host path no longer passes its checks.
    pub fn create_body(&self, spec: &ContainerSpec) -> sandbox_core::Result<serde_json::Value> {
        let body = create_body(spec, self.runtime, &self.options.mounts)?;
        Ok(serde_json::to_value(body).unwrap_or(serde_json::Value::Null))
    }

    /// The network create body the adapter sends for the library's egress network.
    pub fn network_body(&self, spec: &NetworkSpec) -> serde_json::Value {
        serde_json::to_value(network_body(spec)).unwrap_or(serde_json::Value::Null)
    }
}

/// Refuses what Docker cannot enforce for `spec`, before anything is provisioned.
pub(crate) fn check_spec(
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
pub(crate) fn create_body(
    spec: &ContainerSpec,
    runtime: Runtime,
    user_mounts: &[sandbox_container::spec::mounts::Mount],
) -> sandbox_core::Result<ContainerCreateBody> {
    let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
    labels.insert(LABEL_RUNTIME.into(), runtime.as_str().into());
    let publish: &[u16] = spec.network.published();
    let exposed: Vec<String> = publish.iter().map(|p| format!("{p}/tcp")).collect();
    let mut body = ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint: spec.command.first().map(|c| vec![c.clone()]),
        cmd: Some(spec.command.iter().skip(1).cloned().collect()),
        env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        working_dir: Some(spec.workdir.clone()),
        hostname: spec.hostname.clone(),
        labels: Some(labels),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        attach_stdin: Some(false),
        attach_stdout: Some(false),
        attach_stderr: Some(false),
        tty: Some(false),
        open_stdin: Some(false),
        host_config: Some(host_config(spec, runtime, publish, user_mounts)?),
        ..Default::default()
    };
    if spec.attach_stdin {
        open_agent_channel(&mut body);
    }
    Ok(body)
}

/// The create body of an agent-mode container: its main process (the agent) keeps stdin
/// open across attaches (its output is the agent's channel; no container is logged).
fn open_agent_channel(body: &mut ContainerCreateBody) {
    body.open_stdin = Some(true);
    body.stdin_once = Some(false);
    body.tty = Some(false);
    body.attach_stdin = Some(true);
    body.attach_stdout = Some(true);
    body.attach_stderr = Some(true);
}

fn host_config(
    spec: &ContainerSpec,
    runtime: Runtime,
    publish: &[u16],
    user_mounts: &[sandbox_container::spec::mounts::Mount],
) -> sandbox_core::Result<HostConfig> {
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
    Ok(HostConfig {
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
        // Kept when stopped (`Sandbox::stop`); the container layer removes it.
        auto_remove: Some(false),
        runtime: Some(runtime.as_str().into()),
        publish_all_ports: Some(false),
        // No container is logged: the agent's output is its channel, and on the exec path
        // root inside can still write to PID 1's stdout (`/proc/1/fd/1`); a log driver
        // would copy every byte to the engine's disk, past every limit.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: None,
        }),
        mounts: mounts(spec, user_mounts)?,
        readonly_rootfs: Some(!spec.scratch_paths().is_empty()),
        shm_size: spec
            .scratch_bytes()
            .map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
        ..Default::default()
    })
}

/// The agent binary bind-mounted read-only from the host (ContainerSpec::agent_mount), the
/// user's read-only bind mounts (`DockerOptions::mounts`; copies are injected by the
/// container layer instead), and the scratch filesystems of a disk limit
/// (ContainerSpec::scratch_paths, the image's declared volumes among them: Docker creates
/// no volume of its own at a path a mount covers).
fn mounts(
    spec: &ContainerSpec,
    user_mounts: &[sandbox_container::spec::mounts::Mount],
) -> sandbox_core::Result<Option<Vec<Mount>>> {
    use sandbox_container::spec::mounts::MountMode;
    let mut out = Vec::new();
    for m in user_mounts.iter().filter(|m| m.mode == MountMode::Bind) {
        // Canonicalised and checked again here, so the body never carries a path other
        // than the one vetted (the host tree may have changed since `validate`).
        let source = m.resolved_host()?;
        // Read-only (writable binds are refused: Docker cannot make them nosuid) and
        // non-recursive: a host mount nested below the source, which read-only would not
        // cover, is not visible inside.
        out.push(Mount {
            target: Some(m.normalized_target()?),
            source: Some(source.to_string_lossy().into_owned()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            bind_options: Some(MountBindOptions {
                non_recursive: Some(true),
                propagation: Some(bollard::models::MountBindOptionsPropagationEnum::RPRIVATE),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
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
    Ok((!out.is_empty()).then_some(out))
}

/// Docker's archive upload refuses a container whose root filesystem is read-only, which a
/// disk limit makes it: a sealed copy cannot be injected then, so the create is refused
/// before anything is provisioned instead of failing half-way.
pub(crate) fn check_copies_against_spec(
    user_mounts: &[sandbox_container::spec::mounts::Mount],
    spec: &ContainerSpec,
) -> sandbox_container::engine::EngineResult<()> {
    use sandbox_container::engine::{EngineError, EngineErrorKind};
    use sandbox_container::spec::mounts::MountMode;
    if spec.resources.disk_mb.is_none() {
        return Ok(());
    }
    match user_mounts.iter().find(|m| m.mode == MountMode::Copy) {
        Some(m) => Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!(
                "the copied mount at {} cannot be injected on Docker under resources.disk_mb, \
                 whose root filesystem is read-only (Docker refuses uploads into it): mount \
                 it as a read-only bind, or leave disk_mb unset",
                m.container
            ),
        )),
        None => Ok(()),
    }
}

/// The destinations among a created container's `mounts` that the body did not ask for
/// (the agent, the scratch volumes, the user's bind mounts): volumes Docker added for the
/// image on its own disk.
pub(crate) fn unplanned_mounts(
    spec: &ContainerSpec,
    user_mounts: &[sandbox_container::spec::mounts::Mount],
    mounts: &[MountPoint],
) -> Vec<String> {
    use sandbox_container::spec::mounts::MountMode;
    let clean = |p: &str| p.trim_end_matches('/').to_string();
    let mut planned: Vec<String> = spec.scratch_paths().into_iter().map(clean).collect();
    planned.extend(
        user_mounts
            .iter()
            .filter(|m| m.mode == MountMode::Bind)
            .filter_map(|m| m.normalized_target().ok()),
    );
    if spec.agent_mount.is_some() {
        planned.push(sandbox_container::AGENT_PATH.into());
    }
    mounts
        .iter()
        .filter_map(|m| m.destination.as_deref())
        .filter(|d| !planned.contains(&clean(d)))
        .map(|d| format!("{:?}", d.chars().take(128).collect::<String>()))
        .collect()
}

/// A mode this adapter does not know is refused by `check_spec` before the body
/// is built; should one get here anyway, it gets no network rather than a wrong one.
fn unreachable_mode(mode: &NetworkMode) -> (String, Option<Vec<String>>) {
    tracing::error!(?mode, "network mode without a Docker mapping; using none");
    ("none".to_string(), None)
}

/// The bridge option (key, value) that turns inter-container traffic off: set on the
/// egress network, and read back to tell it from a foreign network of the same name.
const ISOLATION: (&str, &str) = ("com.docker.network.bridge.enable_icc", "false");

/// The egress network's create request: a bridge without inter-container traffic.
pub(crate) fn network_body(spec: &NetworkSpec) -> NetworkCreateRequest {
    let (key, value) = ISOLATION;
    let options = HashMap::from([(key.to_string(), value.to_string())]);
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

/// A network as the container layer sees it: subnets (the host's bridge addresses and
/// other containers), id, labels, and whether inter-container traffic is off.
pub(crate) fn network_info(n: Network) -> NetworkInfo {
    let labels = n.labels.unwrap_or_default().into_iter().collect();
    let mut info = NetworkInfo::new(n.name.unwrap_or_default(), subnets(n.ipam.as_ref()), labels);
    info.id = n.id.unwrap_or_default();
    info.isolated = n
        .options
        .is_some_and(|o| o.get(ISOLATION.0).is_some_and(|v| v == ISOLATION.1));
    info
}

/// The container's addresses on all its networks.
pub(crate) fn container_addresses(settings: Option<&NetworkSettings>) -> Vec<IpAddr> {
    let endpoints = settings.and_then(|s| s.networks.as_ref()).into_iter();
    sandbox_container::engine::container_addresses(
        endpoints
            .flat_map(|n| n.values())
            .flat_map(|ep| [&ep.ip_address, &ep.global_ipv6_address])
            .filter_map(|a| a.as_deref()),
    )
}

/// A snapshot image's configuration as the `changes` of Docker's import: Dockerfile
/// instructions, which Docker parses as one Dockerfile (newline-joined), with its quoting
/// and `$` substitution. Values are double-quoted with `\`, `"` and `$` escaped; a control
/// character (a newline would start an instruction of its own) is refused.
pub(crate) fn import_changes(config: &ImageConfig) -> Result<Vec<String>, EngineError> {
    let mut out = Vec::new();
    for entry in &config.env {
        let (k, v) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
        if k.is_empty()
            || k.chars()
                .any(|c| c.is_whitespace() || c == '"' || c == '\\')
        {
            return Err(unrepresentable("an env key", k));
        }
        out.push(format!("ENV {k}={}", quoted(v, "an env value")?));
    }
    for (k, v) in &config.labels {
        out.push(format!(
            "LABEL {}={}",
            quoted(k, "a label key")?,
            quoted(v, "a label value")?
        ));
    }
    if let Some(e) = &config.entrypoint {
        out.push(format!("ENTRYPOINT {}", json_array(e)?));
    }
    if let Some(c) = &config.cmd {
        out.push(format!("CMD {}", json_array(c)?));
    }
    if let Some(w) = &config.workdir {
        out.push(format!("WORKDIR {}", quoted(w, "the workdir")?));
    }
    if let Some(u) = &config.user {
        out.push(format!("USER {}", quoted(u, "the user")?));
    }
    Ok(out)
}

fn unrepresentable(what: &str, value: &str) -> EngineError {
    EngineError::new(
        EngineErrorKind::InvalidRequest,
        format!(
            "{what} of the image ({:?}) cannot be carried into a snapshot image",
            sandbox_container::engine::engine_text(value)
        ),
    )
}

fn quoted(v: &str, what: &str) -> Result<String, EngineError> {
    if v.chars().any(char::is_control) {
        return Err(unrepresentable(what, v));
    }
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        if matches!(c, '\\' | '"' | '$') {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    Ok(s)
}

fn json_array(items: &[String]) -> Result<String, EngineError> {
    serde_json::to_string(items).map_err(|e| {
        EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("a command of the image cannot be written: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::Resources;
    use std::time::Duration;

    #[test]
    fn allow_is_refused_where_the_runtime_forces_no_network() {
        let mut s = ContainerSpec::new(
            "sbx-t-1",
            "img",
            vec!["sleep".into()],
            Resources::default().effective().unwrap(),
            Duration::from_secs(1),
        );
        assert!(check_spec(&s, Runtime::Runsc, true).is_ok(), "deny is fine");
        s.network = NetworkMode::Bridge { publish: vec![] };
        assert!(check_spec(&s, Runtime::Runsc, true).is_err());
        assert!(check_spec(&s, Runtime::Runsc, false).is_ok());
    }

    /// The agent is Docker's only bind mount (Docker sandboxes take no user mounts): it is
    /// read-only and non-recursive, so no host mount below its source comes along with
    /// that mount's own flags.
    #[test]
    fn every_bind_mount_is_read_only_and_non_recursive() {
        let mut s = ContainerSpec::new(
            "sbx-t-1",
            "img",
            vec!["sleep".into()],
            Resources::default().disk_mb(10).effective().unwrap(),
            Duration::from_secs(1),
        );
        s.agent_mount = Some("/cache/agent".into());
        let host = tempfile::tempdir().unwrap();
        let user = [
            sandbox_container::spec::mounts::Mount::bind(host.path(), "/data//"),
            sandbox_container::spec::mounts::Mount::copy(host.path(), "/copied"),
        ];
        let all = mounts(&s, &user).unwrap().unwrap();
        let binds: Vec<&Mount> = all
            .iter()
            .filter(|m| m.typ == Some(MountType::BIND))
            .collect();
        assert_eq!(
            binds.len(),
            2,
            "the agent and the user's bind, not the copy: {all:?}"
        );
        assert!(
            binds.iter().any(|b| b.target.as_deref() == Some("/data")),
            "the target normalised: {binds:?}"
        );
        for b in binds {
            assert_eq!(b.read_only, Some(true), "{b:?}");
            let non_recursive = b.bind_options.as_ref().and_then(|o| o.non_recursive);
            assert_eq!(non_recursive, Some(true), "{b:?}");
        }
    }

    /// A volume Docker added for the image (one the container layer did not read) is
    /// found; the agent and the scratch volumes the body asked for are not.
    #[test]
    fn volumes_docker_added_for_the_image_are_found() {
        let mut s = ContainerSpec::new(
            "sbx-t-1",
            "img",
            vec!["sleep".into()],
            Resources::default().disk_mb(10).effective().unwrap(),
            Duration::from_secs(1),
        );
        s.image_volumes = vec!["/data".into()];
        s.agent_mount = Some("/cache/agent".into());
        let at = |d: &str| MountPoint {
            destination: Some(d.into()),
            typ: Some("volume".into()),
            ..Default::default()
        };
        let planned = [
            at("/work"),
            at("/tmp/"),
            at("/data"),
            at(sandbox_container::AGENT_PATH),
        ];
        assert!(unplanned_mounts(&s, &[], &planned).is_empty());
        let mut mounts = planned.to_vec();
        mounts.push(at("/var/lib/db"));
        assert_eq!(unplanned_mounts(&s, &[], &mounts), ["\"/var/lib/db\""]);
        s.agent_mount = None;
        assert_eq!(
            unplanned_mounts(&s, &[], &planned).len(),
            1,
            "no agent mount asked for"
        );
    }
}
