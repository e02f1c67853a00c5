//! Turning a [`ContainerSpec`] from the container layer plus [`PodmanOptions`] into a
//! libpod SpecGenerator, refusing what Podman cannot enforce before anything is created,
//! and what its sandboxes can declare ([`CAPABILITIES`]); also the network bodies and the
//! reading of the engine's network answers. The engine calls are `engine.rs`'s.
//!
//! The body is written as JSON directly and POSTed through the REST bypass (`rest.rs`).

use std::net::IpAddr;

use podman_api::models;
use podman_api::opts::NetworkCreateOpts;
use sandbox_container::engine::{ImageConfig, NetworkInfo, NetworkSpec, Subnet};
use sandbox_container::{ContainerSpec, LABEL_RUNTIME, LAYER_CAPABILITIES, NetworkMode, Runtime};
use sandbox_core::{Capability, Result, SandboxError};
use serde_json::{Map, Value, json};

use crate::config::{MountMode, PodmanOptions, Sharing};

/// What a Podman sandbox can declare: the container layer's set, a disk limit (a
/// read-only root with tmpfs scratch mounts), the egress allowlist where the container
/// layer can load its rules, the agent with its terminals, moved deadlines and idle limits
/// where it runs, GPUs for a sandbox created with CDI devices
/// ([`PodmanOptions::cdi_device`]), pause/resume (the freezer), filesystem snapshots
/// (an export imported as a new image), and stop/start (the engine keeps a stopped
/// container).
pub const CAPABILITIES: Capability = LAYER_CAPABILITIES
    .union(Capability::DISK_LIMIT)
    .union(Capability::EGRESS_ALLOWLIST)
    .union(Capability::LIVE_EGRESS)
    .union(Capability::HOST_PORTS)
    .union(Capability::CREDENTIALS)
    .union(Capability::PTY)
    .union(Capability::AGENT)
    .union(Capability::GPU)
    .union(Capability::PAUSE_RESUME)
    .union(Capability::EXTEND_LIFETIME)
    .union(Capability::IDLE_TIMEOUT)
    .union(Capability::SNAPSHOT)
    .union(Capability::RESET_PROCESSES)
    .union(Capability::SSH_AGENT)
    .union(Capability::STOP_START)
    .union(Capability::GIT_GATE);

/// What the engine offers the container layer under these options: [`CAPABILITIES`]
/// without the agent, its terminals, extend, the idle limit and the reset of processes (which the container layer
/// adds where the agent runs), and GPU only with CDI devices, which `PodmanOptions::validate` has checked
/// against the host.
pub(crate) fn capabilities(podman: &PodmanOptions) -> Capability {
    let caps = CAPABILITIES
        .difference(Capability::PTY)
        .difference(Capability::AGENT)
        .difference(Capability::EXTEND_LIFETIME)
        .difference(Capability::IDLE_TIMEOUT)
        .difference(Capability::RESET_PROCESSES)
        .difference(Capability::SSH_AGENT)
        .difference(Capability::GIT_GATE);
    if podman.cdi_devices.is_empty() {
        caps.difference(Capability::GPU)
    } else {
        caps
    }
}

impl PodmanOptions {
    /// The libpod SpecGenerator body the adapter sends for `spec` under these options:
    /// every hardening field, limit and mount is visible in it, for an audit or a test.
    pub fn create_body(&self, spec: &ContainerSpec) -> Result<Value> {
        create_body(spec, self)
    }

    /// What these options cannot enforce for `spec` (a writable bind mount or a copy
    /// under a disk-limited scratch path, more GPUs than CDI devices, any option outside
    /// the allowlists), refused before anything is provisioned.
    pub fn check_spec(&self, spec: &ContainerSpec) -> Result<()> {
        check_spec(spec, self)
    }
}

/// What Podman cannot enforce for `spec` with these options, refused before anything is
/// provisioned: mounts the disk limit cannot keep (`mounts::check_against_spec`), more
/// GPUs than named CDI devices, and any option outside the vetted allowlists.
pub(crate) fn check_spec(spec: &ContainerSpec, podman: &PodmanOptions) -> Result<()> {
    sandbox_container::spec::mounts::check_against_spec(&podman.mounts, spec)?;
    let gpus = spec.resources.gpu as usize;
    if gpus > podman.cdi_devices.len() {
        return Err(SandboxError::config(
            format!(
                "{gpus} GPU(s) requested but only {} CDI device(s) named",
                podman.cdi_devices.len()
            ),
            "name one CDI device per GPU with PodmanOptions::cdi_device(\"nvidia.com/gpu=N\")",
        ));
    }
    podman.validate()
}

/// The labels of the body: the spec's plus the runtime label, so a reattached handle
/// reports the tier the sandbox really has.
fn labels(spec: &ContainerSpec, podman: &PodmanOptions) -> Map<String, Value> {
    let mut l: Map<String, Value> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    if let Some(rt) = podman.runtime {
        l.insert(LABEL_RUNTIME.into(), rt.as_str().into());
    }
    if !podman.ephemeral {
        l.insert(sandbox_container::LABEL_RETAINED.into(), "true".into());
    }
    l
}

/// The libpod SpecGenerator JSON for a [`ContainerSpec`] from the container layer plus
/// this backend's [`PodmanOptions`], written directly (podman-api 0.11's builder misspells
/// `no_new_privileges`, which Podman then ignores, and has no OCI-shaped mounts or CDI
/// devices). Every field of the spec is applied: a field silently dropped would be a
/// security bug.
pub(crate) fn create_body(spec: &ContainerSpec, podman: &PodmanOptions) -> Result<Value> {
    let res = &spec.resources;
    let memory = spec.memory_bytes();
    let period: u64 = 100_000;
    let quota = (res.cpu * period as f64).round().max(1000.0) as i64;
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
    let env: Map<String, Value> = spec
        .env
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let mut body = json!({
        "name": spec.name,
        "image": spec.image,
        // The whole argv as entrypoint: Podman then ignores the image's CMD, which would
        // otherwise be appended to our main process.
        "entrypoint": spec.command,
        "init": spec.init,
        "labels": labels(spec, podman),
        "env": env,
        "work_dir": spec.workdir,
        "create_working_dir": true,
        // Never Podman's `--rm`: a stopped container is kept so that `Sandbox::start` can
        // run it again; the container layer removes it (`ephemeral` decides whether its
        // deadline timer removes it once stopped, see `LABEL_RETAINED`).
        "remove": false,
        "cap_drop": ["ALL"],
        "no_new_privileges": true,
        "netns": { "nsmode": netns },
        "resource_limits": {
            "cpu": { "period": period, "quota": quota },
            // memory == memory+swap: swap disabled.
            "memory": { "limit": memory, "swap": memory },
            "pids": { "limit": spec.pids_limit(podman.runtime) },
        },
        "read_only_filesystem": !spec.scratch_paths().is_empty(),
        "stop_timeout": 1,
    });
    let Some(o) = body.as_object_mut() else {
        return Ok(body);
    };
    // No container is logged: the agent's output is its channel, and on the exec path
    // root inside can still write to PID 1's stdout (`/proc/1/fd/1`); a log driver
    // would copy every byte to the engine's disk, past every limit.
    o.insert("log_configuration".into(), json!({ "driver": "none" }));
    if let Some(h) = &spec.hostname {
        o.insert("hostname".into(), h.clone().into());
    }
    if spec.attach_stdin {
        // An agent-mode container: its main process (the agent) keeps stdin open across
        // attaches.
        o.insert("stdin".into(), true.into());
        o.insert("terminal".into(), false.into());
    }
    if let Some(bytes) = spec.scratch_bytes() {
        o.insert(
            "shm_size".into(),
            i64::try_from(bytes).unwrap_or(i64::MAX).into(),
        );
        // The image's volumes the container layer read are sized scratch mounts (which
        // take the place of Podman's own); one it did not see (the tag re-pointed since)
        // becomes a tmpfs too, never a volume on the engine's disk. Podman cannot size
        // that tmpfs: its pages are bounded by the memory limit only.
        o.insert("image_volume_mode".into(), "tmpfs".into());
    }
    if !podman.capabilities.is_empty() {
        let caps: Vec<&str> = podman.capabilities.iter().map(|c| c.as_str()).collect();
        o.insert("cap_add".into(), json!(caps));
    }
    if let Some(rt) = podman.runtime {
        o.insert("oci_runtime".into(), rt.as_str().into());
    }
    if !podman.annotations.is_empty() {
        o.insert("annotations".into(), json!(podman.annotations));
    }
    if !publish.is_empty() {
        // Loopback only, at a port the engine picks (a sandbox must not take a well-known
        // host port and impersonate a local service).
        let maps: Vec<Value> = publish
            .iter()
            .map(|p| json!({ "container_port": p, "host_ip": "127.0.0.1", "protocol": "tcp" }))
            .collect();
        o.insert("portmappings".into(), maps.into());
    }
    let mut mounts = mounts(spec, podman)?;
    if matches!(spec.network, NetworkMode::Isolated { .. }) {
        // Podman's own /etc/hosts starts from the host's: a listed name found there would
        // resolve inside without reaching the egress resolver (never pinned, so
        // refused), and the host's private names would leak in. The library's loopback-only
        // file instead (the engine ensures it exists before the create), read-only.
        o.insert("use_image_hosts".into(), true.into());
        mounts.push(json!({
            "destination": "/etc/hosts",
            "source": sandbox_container::egress::HOSTS_FILE,
            "type": "bind",
            "options": ["bind", "private", "ro", "nosuid", "nodev", "noexec"],
        }));
    }
    if !mounts.is_empty() {
        o.insert("mounts".into(), mounts.into());
    }
    if !podman.cdi_devices.is_empty() {
        let devices: Vec<Value> = podman
            .cdi_devices
            .iter()
            .map(|d| json!({ "path": d }))
            .collect();
        o.insert("devices".into(), devices.into());
    }
    if let NetworkMode::Isolated { network, dns, .. } = &spec.network {
        // The library network, and its gateway (the egress resolver) as the only name
        // server in the container's resolv.conf.
        o.insert("Networks".into(), json!({ network.clone(): {} }));
        let dns: Vec<String> = dns.iter().map(ToString::to_string).collect();
        o.insert("dns_server".into(), json!(dns));
    }
    Ok(body)
}

/// The OCI mounts: the user's bind mounts (sources canonicalised and checked again here,
/// so the body never carries a path other than the one vetted), the agent, and the disk
/// limit's scratch filesystems.
fn mounts(spec: &ContainerSpec, podman: &PodmanOptions) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for m in podman.mounts.iter().filter(|m| m.mode == MountMode::Bind) {
        let relabel = match m.sharing {
            Sharing::Private => "Z",
            Sharing::Shared => "z",
        };
        // Sandbox root is host root on a bind mount (rootful, no user namespace): a setuid
        // binary or a device node written through it must stay inert on the host. `bind`,
        // never `rbind`: `ro,nosuid,nodev` apply to the top mount only, so a host mount
        // nested below the source (a tmpfs, a disk, a share) would come along writable,
        // setuid and with devices. Non-recursive, the sandbox sees the source's own
        // filesystem, the directories under those mounts included, and nothing else.
        // `private` (Podman's default, stated so no configuration changes it): a slave
        // bind would receive every mount the host makes below the source later, with the
        // new mount's own flags.
        let access = if m.read_only { "ro" } else { "rw" };
        out.push(json!({
            "destination": m.normalized_target()?,
            "source": m.resolved_host()?.to_string_lossy(),
            "type": "bind",
            "options": ["bind", "private", access, "nosuid", "nodev", relabel],
        }));
    }
    if let Some(source) = &spec.agent_mount {
        // The agent binary from the host's cache, read-only (ContainerSpec::agent_mount).
        out.push(json!({
            "destination": sandbox_container::AGENT_PATH,
            "source": source.to_string_lossy(),
            "type": "bind",
            "options": ["bind", "ro", "nosuid", "nodev"],
        }));
    }
    if let Some(bytes) = spec.scratch_bytes() {
        // The disk limit's scratch filesystems over the read-only root, the image's
        // declared volumes among them (Podman creates no volume of its own where a mount
        // is). Podman copies the image's files at that path in (tmpcopyup), and its archive
        // API sees them. A declared volume a (read-only) bind mount takes is left to it,
        // as Podman does without a disk limit: two mounts at one path are refused.
        let bound: Vec<String> = podman
            .mounts
            .iter()
            .filter(|m| m.mode == MountMode::Bind)
            .filter_map(|m| m.normalized_target().ok())
            .collect();
        for path in spec.scratch_paths() {
            if spec.image_volumes.iter().any(|v| v == path) && bound.iter().any(|b| b == path) {
                continue;
            }
            out.push(json!({
                "destination": path,
                "source": "tmpfs",
                "type": "tmpfs",
                "options": [format!("size={bytes}"), "mode=1777", "nosuid", "nodev"],
            }));
        }
    }
    Ok(out)
}

/// Whether rules in a container's network namespace govern its traffic under these
/// options (not under gVisor, whose netstack sends through a packet socket).
pub(crate) fn netfilter_applies(podman: &PodmanOptions) -> bool {
    podman.runtime != Some(Runtime::Runsc)
}

/// The network option (key, value) that isolates a bridge from other networks: set on the
/// egress network, and read back to tell it from a foreign network of the same name.
const ISOLATION: (&str, &str) = ("isolate", "true");

/// The egress network: a bridge isolated from other networks (`isolate`), without
/// aardvark DNS (the library's resolver answers), labelled. netavark 1.4 has no switch for
/// traffic between containers of one bridge: each sandbox's own rules reject the subnet.
pub(crate) fn network_body(spec: &NetworkSpec) -> NetworkCreateOpts {
    NetworkCreateOpts::builder()
        .name(&spec.name)
        .driver("bridge")
        .dns_enabled(false)
        .internal(false)
        .labels(spec.labels.clone())
        .options([ISOLATION])
        .build()
}

/// A network as the container layer sees it.
pub(crate) fn network_info(n: models::Network) -> NetworkInfo {
    let subnets = n.subnets.unwrap_or_default().into_iter();
    let subnets = subnets.filter_map(|s| Subnet::parse(s.subnet.as_deref()?, s.gateway.as_deref()));
    let labels = n.labels.unwrap_or_default().into_iter().collect();
    let mut info = NetworkInfo::new(n.name.unwrap_or_default(), subnets.collect(), labels);
    // Known ids let a create tell a network re-created under the same name (another
    // process's sweep removed it meanwhile) from the one it ensured.
    info.id = n.id.unwrap_or_default();
    info.isolated = n
        .options
        .is_some_and(|o| o.get(ISOLATION.0).is_some_and(|v| v == ISOLATION.1));
    info
}

/// The container's addresses on its networks.
pub(crate) fn container_addresses(
    settings: Option<&models::InspectNetworkSettings>,
) -> Vec<IpAddr> {
    let Some(s) = settings else { return vec![] };
    let nets = s.networks.iter().flat_map(|n| n.values());
    let per_network = nets.flat_map(|n| [&n.ip_address, &n.global_i_pv_6_address]);
    sandbox_container::engine::container_addresses(
        [&s.ip_address, &s.global_i_pv_6_address]
            .into_iter()
            .chain(per_network)
            .filter_map(|a| a.as_deref()),
    )
}

/// A snapshot image's configuration as the `changes` of Podman's import: one instruction
/// each, `KEY=value` split at the first `=`, with surrounding double quotes stripped and
/// no other unescaping (unlike Docker's). A value Podman would read back differently (a
/// control character, a leading or trailing `"`, an `=` or space in a key) is refused.
pub(crate) fn import_changes(
    config: &ImageConfig,
) -> std::result::Result<Vec<String>, sandbox_container::EngineError> {
    let mut out = Vec::new();
    for entry in &config.env {
        let (k, v) = entry.split_once('=').unwrap_or((entry.as_str(), ""));
        out.push(format!(
            "ENV {}={}",
            key(k, "an env key")?,
            value(v, "an env value")?
        ));
    }
    for (k, v) in &config.labels {
        out.push(format!(
            "LABEL {}={}",
            key(k, "a label key")?,
            value(v, "a label value")?
        ));
    }
    let array = |a: &[String]| {
        serde_json::to_string(a).map_err(|e| unrepresentable("a command", &e.to_string()))
    };
    if let Some(e) = &config.entrypoint {
        out.push(format!("ENTRYPOINT {}", array(e)?));
    }
    if let Some(c) = &config.cmd {
        out.push(format!("CMD {}", array(c)?));
    }
    if let Some(w) = &config.workdir {
        out.push(format!("WORKDIR {}", value(w, "the workdir")?));
    }
    if let Some(u) = &config.user {
        out.push(format!("USER {}", value(u, "the user")?));
    }
    Ok(out)
}

fn unrepresentable(what: &str, v: &str) -> sandbox_container::EngineError {
    sandbox_container::EngineError::new(
        sandbox_container::EngineErrorKind::InvalidRequest,
        format!(
            "{what} of the image ({:?}) cannot be carried into a snapshot image",
            sandbox_container::engine::engine_text(v)
        ),
    )
}

fn key<'a>(k: &'a str, what: &str) -> std::result::Result<&'a str, sandbox_container::EngineError> {
    if k.is_empty()
        || k.chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == '=' || c == '"')
    {
        return Err(unrepresentable(what, k));
    }
    Ok(k)
}

fn value<'a>(
    v: &'a str,
    what: &str,
) -> std::result::Result<&'a str, sandbox_container::EngineError> {
    if v.chars().any(char::is_control) || v.starts_with('"') || v.ends_with('"') {
        return Err(unrepresentable(what, v));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_egress_network_is_isolated_without_engine_dns() {
        let spec = NetworkSpec::new("sbx-egress", BTreeMap::new());
        let o = network_body(&spec).serialize().unwrap();
        let o: Value = serde_json::from_str(&o).unwrap();
        assert_eq!(o["options"]["isolate"], "true");
        assert_eq!(o["dns_enabled"], false);
    }
}
