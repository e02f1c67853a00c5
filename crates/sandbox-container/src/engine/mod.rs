//! The narrow engine trait: everything this crate needs from a container engine, nothing
//! it can do itself.
//!
//! An adapter implements [`ContainerEngine`] on its client (bollard, podman-api, …) and maps
//! its own errors into [`EngineError`] in its `error.rs`. Every method is one engine round
//! trip (or one streamed request); retries, timeouts, kill semantics and the mapping of
//! [`EngineErrorKind`] to `SandboxError` in context are done once, by this crate.

pub(crate) mod error;
pub mod image;
pub mod path_stat;
pub mod pull;
pub mod transfer;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use sandbox_core::{Capability, IsolationTier, OutputChunk, Problem, SandboxState};

/// What one exec runs.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct ExecRequest {
    /// The argv, exec'd as given (never through a shell unless argv says so).
    pub argv: Vec<String>,
    /// Environment for this exec, secrets included (the adapter never logs it).
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub workdir: String,
    /// Attach stdin.
    pub stdin: bool,
}

impl ExecRequest {
    /// An exec of `argv` in `workdir`.
    pub fn new(argv: Vec<String>, workdir: impl Into<String>) -> Self {
        ExecRequest {
            argv,
            env: Vec::new(),
            workdir: workdir.into(),
            stdin: false,
        }
    }
}

impl fmt::Debug for ExecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // env carries secrets: only its keys are shown.
        f.debug_struct("ExecRequest")
            .field("argv0", &self.argv.first())
            .field(
                "env_keys",
                &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .field("workdir", &self.workdir)
            .field("stdin", &self.stdin)
            .finish()
    }
}

/// Stdin of a started exec.
pub type ExecInput = Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// The attached stdio of a container's main process (the in-sandbox agent's channel).
pub struct AttachStream {
    /// The main process's stdout and stderr, demultiplexed, in order per stream.
    pub output: BoxStream<'static, EngineResult<OutputChunk>>,
    /// The main process's stdin.
    pub input: ExecInput,
}

/// A started exec: its engine id, demultiplexed output and (when requested) stdin.
pub struct ExecStream {
    /// The engine's exec id (for [`ContainerEngine::exec_state`]).
    pub exec_id: String,
    /// Output in order per stream; ends when the exec closed its output. Chunk sizes are
    /// the engine's; the container layer bounds what it buffers.
    pub output: BoxStream<'static, EngineResult<OutputChunk>>,
    /// Stdin, when [`ExecRequest::stdin`] was set.
    pub input: Option<ExecInput>,
}

/// The engine's view of one exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecState {
    /// Whether the engine still reports it running. An exit code is trusted only once this
    /// is false (Podman reports exit 0 while an exec still runs).
    pub running: bool,
    /// The exit code, when the engine has one.
    pub exit_code: Option<i64>,
}

impl ExecState {
    /// A state.
    pub fn new(running: bool, exit_code: Option<i64>) -> Self {
        ExecState { running, exit_code }
    }
}

/// The engine's view of one container.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ContainerInfo {
    /// Full id.
    pub id: String,
    /// Name, without a leading `/`.
    pub name: String,
    /// Lifecycle state.
    pub state: SandboxState,
    /// Creation time, when the engine reports one.
    pub created_at: Option<SystemTime>,
    /// All labels.
    pub labels: BTreeMap<String, String>,
    /// Image reference the container was created from.
    pub image: String,
    /// Working directory from its config.
    pub workdir: Option<String>,
    /// Published container port → host address.
    pub published: BTreeMap<u16, SocketAddr>,
    /// The host pid of the container's first process (`State.Pid`), while it runs: its
    /// network namespace is the sandbox's.
    pub pid: Option<u32>,
    /// The container's addresses on its networks.
    pub addresses: Vec<std::net::IpAddr>,
    /// The exit status of its first process once it has stopped (`State.ExitCode`), when
    /// the engine reports one; filled by `inspect` (a list need not). The agent exits
    /// with [`sandbox_agent::protocol::IDLE_EXIT_STATUS`] when the idle limit ended the
    /// sandbox.
    pub exit_code: Option<i64>,
}

impl ContainerInfo {
    /// A record with no ports and no workdir; a leading `/` of `name` (as engines report
    /// names) is dropped.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        state: SandboxState,
        labels: BTreeMap<String, String>,
    ) -> Self {
        let name: String = name.into();
        ContainerInfo {
            id: id.into(),
            name: name.strip_prefix('/').map(str::to_string).unwrap_or(name),
            state,
            created_at: None,
            labels,
            image: String::new(),
            workdir: None,
            published: BTreeMap::new(),
            pid: None,
            addresses: Vec::new(),
            exit_code: None,
        }
    }

    /// Whether the container is running.
    pub fn is_running(&self) -> bool {
        self.state == SandboxState::Running
    }

    /// Whether it is stopped because its agent ended it for being idle: such a sandbox is
    /// removed, never kept for a `start`.
    pub fn ended_idle(&self) -> bool {
        self.state == SandboxState::Stopped
            && self.exit_code == Some(i64::from(sandbox_agent::protocol::IDLE_EXIT_STATUS))
    }
}

/// A streamed archive body (a tar stream).
pub type ArchiveBody = BoxStream<'static, std::io::Result<Bytes>>;

pub use crate::spec::{ContainerSpec, NetworkInfo, NetworkMode, NetworkSpec, Subnet};
pub use error::{EngineError, EngineErrorKind, EngineResult, engine_text};
pub use image::{ImageConfig, ImageImport, ImageInfo};
pub use path_stat::PathStat;

/// The narrow engine trait. One implementation per container engine; a third-party engine
/// implements this and gets the whole sandbox (and passes the contract suite) for free.
#[async_trait]
pub trait ContainerEngine: Send + Sync + fmt::Debug + 'static {
    /// Backend name, also the DSN scheme (`"docker"`).
    fn backend(&self) -> &'static str;
    /// Isolation tier of the containers this engine creates (runc → `Container`, runsc →
    /// `Gvisor`).
    fn tier(&self) -> IsolationTier;
    /// Capabilities this engine can honour on top of what the container layer provides.
    /// The container layer intersects this with what it implements.
    fn capabilities(&self) -> Capability;
    /// The endpoint, for error messages and `doctor` (never with credentials).
    fn endpoint(&self) -> &str;
    /// The exact fix when the engine does not answer (a command where one exists).
    fn unavailable_hint(&self) -> String {
        format!(
            "check that the {} engine at {} is running and reachable",
            self.backend(),
            self.endpoint()
        )
    }

    /// Refuses, before anything is provisioned, what this engine cannot enforce for `spec`
    /// (e.g. `disk_mb` without a storage quota).
    fn check_spec(&self, spec: &ContainerSpec) -> EngineResult<()> {
        let _ = spec;
        Ok(())
    }
    /// Creates (does not start) a container; returns its id. Copy mounts and hooks are
    /// the container layer's ([`Self::copy_mounts`], [`Self::hooks`]): an adapter only
    /// creates.
    async fn create(&self, spec: &ContainerSpec) -> EngineResult<String>;
    /// Host trees the container layer copies into every new container between create and
    /// start, through [`Self::put_archive`] (`copy_in::copy_in`; sealed: no bind mount is
    /// left). Default: none.
    fn copy_mounts(&self) -> Vec<crate::spec::mounts::Mount> {
        Vec::new()
    }
    /// Lifecycle hooks the container layer runs around every start: `pre_start` after the
    /// copy mounts, `post_start` once the container runs. Default: none.
    fn hooks(&self) -> crate::spec::hooks::Hooks {
        crate::spec::hooks::Hooks::default()
    }
    /// Starts a created container.
    async fn start(&self, id: &str) -> EngineResult<()>;
    /// Inspects a container by id or name.
    async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo>;
    /// Force-removes a container (with its anonymous volumes only when the adapter created
    /// them). `Ok(false)` when it was already gone.
    async fn remove(&self, id: &str) -> EngineResult<bool>;
    /// Containers (running or not) carrying every label in `labels` (`key=value`): id,
    /// name, state, creation time, labels and image are read; ports, pid, addresses and
    /// workdir come from [`ContainerEngine::inspect`] only.
    async fn list(&self, labels: &BTreeMap<String, String>) -> EngineResult<Vec<ContainerInfo>>;

    /// Creates and starts an exec with attached output (and stdin when asked).
    async fn exec(&self, id: &str, request: ExecRequest) -> EngineResult<ExecStream>;
    /// Whether [`ContainerEngine::attach`] is implemented. Default `false`: the container
    /// layer then never creates an agent-mode container on this engine.
    fn supports_attach(&self) -> bool {
        false
    }
    /// Whether a container's stdin stays open when an attach to it ends (the attaching
    /// process exits or drops the stream). Only then may a later handle (`connect`, e.g.
    /// each `sandbox exec`) attach to the in-sandbox agent: where the end of an attach
    /// closes the agent's stdin, the agent (PID 1) ends, and the sandbox with it, as soon
    /// as that handle's process goes. Default `false`: reattached handles keep to the
    /// exec path.
    fn attach_survives_detach(&self) -> bool {
        false
    }
    /// Whether the engine bind-mounts [`ContainerSpec::agent_mount`] (a host file, read
    /// only). Default `false`: the container layer then uploads the agent into each
    /// created container instead. Only an engine that shares this host's filesystem can
    /// say `true`; when the mount still fails (a client inside a container talking to the
    /// host's socket), the layer falls back to the upload and stops asking.
    fn supports_agent_mount(&self) -> bool {
        false
    }
    /// Attaches to the stdin, stdout and stderr of the main process of a running
    /// container created with [`ContainerSpec::attach_stdin`]: live streams only, no
    /// past output. Default: not supported, and the container layer keeps to the exec
    /// path.
    async fn attach(&self, id: &str) -> EngineResult<AttachStream> {
        let _ = id;
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("the {} engine cannot attach to a container", self.backend()),
        ))
    }
    /// The state of an exec.
    async fn exec_state(&self, exec_id: &str) -> EngineResult<ExecState>;

    /// Extracts a tar stream into directory `dir` of the container (which must exist).
    async fn put_archive(&self, id: &str, dir: &str, body: ArchiveBody) -> EngineResult<()>;
    /// A tar stream of `path` in the container (`NotFound` when missing).
    async fn get_archive(&self, id: &str, path: &str) -> EngineResult<ArchiveBody>;
    /// Metadata of `path` in the container without an exec (`NotFound` when missing; a
    /// missing container is `NotFound` too, the container layer tells them apart).
    async fn stat_path(&self, id: &str, path: &str) -> EngineResult<PathStat>;

    /// Freezes every process of a running container at once (the cgroup freezer). An
    /// engine that implements it declares `PAUSE_RESUME` in [`Self::capabilities`].
    /// Default: not supported.
    async fn pause(&self, id: &str) -> EngineResult<()> {
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot pause the container {id}"),
        ))
    }
    /// Ends every process of a running container and keeps the container (its
    /// filesystem, id and labels), so that [`Self::start`] runs it again; the engine kills
    /// the main process after `grace`. An engine that implements it, and keeps a stopped
    /// container rather than removing it, declares `STOP_START` in [`Self::capabilities`].
    /// Default: not supported.
    async fn stop(&self, id: &str, grace: Duration) -> EngineResult<()> {
        let _ = grace;
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot stop the container {id}"),
        ))
    }
    /// Thaws a container [`Self::pause`] froze. Default: not supported.
    async fn unpause(&self, id: &str) -> EngineResult<()> {
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot unpause the container {id}"),
        ))
    }

    /// Whether this engine can fork running containers with their memory
    /// ([`Self::checkpoint`], [`Self::copy_for_fork`], [`Self::start_from_checkpoint`],
    /// [`Self::remove_checkpoint`]): `Err` says why not and what would be needed. An
    /// engine that can declares `SNAPSHOT_FORK` in [`Self::capabilities`]. Default: not
    /// supported.
    fn fork_support(&self) -> Result<(), String> {
        Err("this engine cannot checkpoint a running container".to_string())
    }
    /// Checkpoints the running container `id` under the name `checkpoint` (its processes'
    /// memory and state) and stops it: the container stays, stopped, until started from
    /// the checkpoint or removed. Default: not supported.
    async fn checkpoint(&self, id: &str, checkpoint: &str) -> EngineResult<()> {
        let _ = checkpoint;
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot checkpoint the container {id}"),
        ))
    }
    /// Gives the created, never started container `to` what it needs to start as a copy
    /// of the checkpointed, stopped container `from`: `from`'s own files (its writable
    /// layer, which the checkpoint does not hold) and the checkpoint `checkpoint`.
    /// Default: not supported.
    async fn copy_for_fork(&self, from: &str, checkpoint: &str, to: &str) -> EngineResult<()> {
        let _ = (from, checkpoint);
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot prepare the container {to} as a fork"),
        ))
    }
    /// Starts the stopped container `id` from its checkpoint `checkpoint`: its processes
    /// continue where the checkpoint left them. Default: not supported.
    async fn start_from_checkpoint(&self, id: &str, checkpoint: &str) -> EngineResult<()> {
        let _ = checkpoint;
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot restore the container {id}"),
        ))
    }
    /// Removes the checkpoint `checkpoint` of container `id`; `Ok` when it was already
    /// gone (with the container, too). Default: nothing to remove.
    async fn remove_checkpoint(&self, id: &str, checkpoint: &str) -> EngineResult<()> {
        let _ = (id, checkpoint);
        Ok(())
    }

    /// The configuration `image` declares (env, command, entrypoint, workdir, user,
    /// labels): a snapshot of a sandbox created from it keeps them. An engine that
    /// implements the snapshot calls ([`Self::export`], [`Self::import_image`],
    /// [`Self::list_images`], [`Self::remove_image`]) declares `SNAPSHOT` in
    /// [`Self::capabilities`]. Default: not supported.
    async fn image_config(&self, image: &str) -> EngineResult<ImageConfig> {
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot read the configuration of image `{image}`"),
        ))
    }
    /// The container's filesystem as one flat tar stream: its image's layers with its
    /// own changes applied, without what is mounted into it (binds, volumes, tmpfs).
    /// Default: not supported.
    async fn export(&self, id: &str) -> EngineResult<ArchiveBody> {
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot export the container {id}"),
        ))
    }
    /// Makes a new image of one layer from `body` (a flat tar stream, as
    /// [`Self::export`] gives), named and configured by `import` and nothing else (no
    /// configuration of any container is merged in). Returns the image id. Default: not
    /// supported.
    async fn import_image(&self, body: ArchiveBody, import: &ImageImport) -> EngineResult<String> {
        let _ = body;
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot import the image {}", import.reference),
        ))
    }
    /// Images carrying every label in `labels`. Default: none.
    async fn list_images(&self, labels: &BTreeMap<String, String>) -> EngineResult<Vec<ImageInfo>> {
        let _ = labels;
        Ok(Vec::new())
    }
    /// Removes an image by reference or id (not forced: `Conflict` while a container
    /// uses it). `Ok(false)` when it was already gone. Default: nothing to remove.
    async fn remove_image(&self, image: &str) -> EngineResult<bool> {
        let _ = image;
        Ok(false)
    }

    /// Whether the engine runs on this machine (a local unix socket), so the container
    /// layer can enter a container's network namespace through `/proc/<pid>/ns/net` to load
    /// egress rules. Default `false`: egress `AllowList` is then not declared.
    fn is_local(&self) -> bool {
        false
    }
    /// Whether egress rules loaded into a container's network namespace govern its
    /// traffic (false for a user-space network stack such as gVisor's netstack, whose
    /// packets bypass the namespace's netfilter hooks). Default `true`.
    fn netfilter_applies(&self) -> bool {
        true
    }
    /// Creates the network `spec` describes: a bridge that keeps its containers apart
    /// ([`NetworkInfo::isolated`]), labelled with `spec.labels`. `Conflict` (or success)
    /// when one of that name exists: the container layer finds, vets and reuses existing
    /// networks itself ([`ContainerEngine::networks`]). Default: not supported.
    async fn create_network(&self, spec: &NetworkSpec) -> EngineResult<()> {
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!("this engine cannot create the network {}", spec.name),
        ))
    }
    /// Every network the engine has, with ids, labels and [`NetworkInfo::isolated`]
    /// (their subnets are other sandboxes' and the host's bridge addresses, blocked from
    /// egress). Default: none known.
    async fn networks(&self) -> EngineResult<Vec<NetworkInfo>> {
        Ok(Vec::new())
    }
    /// Removes a network; `Ok(false)` when it did not exist; `Conflict` while containers
    /// use it. Default: nothing to remove.
    async fn remove_network(&self, name: &str) -> EngineResult<bool> {
        let _ = name;
        Ok(false)
    }

    /// Where this engine's own CLI reads registry credentials from; the container layer
    /// looks the image's registry up there and hands the result to [`Self::pull`].
    fn credential_store(&self) -> crate::engine::pull::CredentialStore {
        crate::engine::pull::CredentialStore::Docker
    }
    /// Whether the engine holds `image`. The default says yes: an engine that cannot pull
    /// keeps failing `create` with "image not found", as before pulls existed.
    async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        let _ = image;
        Ok(true)
    }
    /// The volumes `image` declares (its config's `Volumes`, the Dockerfile's `VOLUME`),
    /// as the engine reports them. The container layer asks only for a disk-limited
    /// create, and mounts a sized scratch filesystem at each
    /// ([`ContainerSpec::image_volumes`]) so the engine creates no volume on its own disk.
    /// Default: an error, and the layer refuses `disk_mb` on this engine (an engine that
    /// cannot say cannot keep them bounded).
    async fn image_volumes(&self, image: &str) -> EngineResult<Vec<String>> {
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!(
                "the {} engine adapter cannot read the volumes image `{image}` declares",
                self.backend()
            ),
        ))
    }
    /// Pulls the request's `image` from its registry with its `auth` (when credentials
    /// were found for the registry), reporting each engine progress message through its
    /// `progress`. A registry
    /// that refuses or demands credentials is [`EngineErrorKind::Unauthorized`]; an image
    /// or tag the registry does not have is [`EngineErrorKind::NotFound`]. Single-flight
    /// and the pull policy are the container layer's: this is one engine request.
    async fn pull(&self, request: crate::engine::pull::PullRequest<'_>) -> EngineResult<()> {
        Err(EngineError::new(
            EngineErrorKind::InvalidRequest,
            format!(
                "the {} engine adapter cannot pull `{}`",
                self.backend(),
                request.image
            ),
        ))
    }

    /// Health check.
    async fn ping(&self) -> EngineResult<()>;
    /// What `sandbox doctor` learns from the engine itself once `ping` answered: its
    /// version, its runtimes and engine-specific problems. A fact that cannot be read is a
    /// problem, never silently left out. Reachability and the test images are checked by
    /// the container layer, the same way for every engine.
    async fn facts(&self) -> EngineFacts;
    /// The command that builds the test images on this engine (the fix for a missing one).
    fn images_hint(&self) -> String {
        "sudo cargo xtask setup".to_string()
    }
}

/// A sandbox's state from the engine's status word (Docker's and Podman's vocabularies:
/// `running`; `created`/`configured`/`initialized`; `paused`;
/// `exited`/`dead`/`removing`/`stopping`/`stopped`). Anything else is `Unknown`.
pub fn state_from_status(status: Option<&str>) -> SandboxState {
    match status {
        Some("running") => SandboxState::Running,
        Some("created" | "configured" | "initialized") => SandboxState::Creating,
        Some("paused") => SandboxState::Paused,
        Some("exited" | "dead" | "removing" | "stopping" | "stopped") => SandboxState::Stopped,
        _ => SandboxState::Unknown,
    }
}

/// Where a published port is reached from this host, from the engine's host binding:
/// an unspecified or missing host address is loopback (ports are published there only);
/// port 0 or an unparsable address is none.
pub fn published_address(host_ip: Option<&str>, host_port: Option<u16>) -> Option<SocketAddr> {
    let port = host_port.filter(|p| *p != 0)?;
    let ip = match host_ip.map(str::trim).unwrap_or("") {
        "" | "0.0.0.0" | "::" => "127.0.0.1",
        other => other,
    };
    Some(SocketAddr::new(ip.parse().ok()?, port))
}

/// The published ports of an inspect, from the engine's port map (`"8080/tcp"` → its host
/// bindings, each an address and a port): the first binding that is reachable
/// ([`published_address`]) per TCP port; other protocols and unparsable keys are skipped.
pub fn published_ports<'a, B>(
    ports: impl IntoIterator<Item = (&'a str, B)>,
) -> BTreeMap<u16, SocketAddr>
where
    B: IntoIterator<Item = (Option<&'a str>, Option<u16>)>,
{
    let mut out = BTreeMap::new();
    for (key, bindings) in ports {
        let Some(port) = key.strip_suffix("/tcp").and_then(|p| p.parse::<u16>().ok()) else {
            continue;
        };
        if let Some(a) = bindings
            .into_iter()
            .find_map(|(ip, p)| published_address(ip, p))
        {
            out.insert(port, a);
        }
    }
    out
}

/// A container's addresses from an inspect's address strings, parsed and without
/// duplicates (an address may be listed per network and at the top level); unparsable
/// or empty ones are skipped.
pub fn container_addresses<'a>(
    candidates: impl IntoIterator<Item = &'a str>,
) -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    for ip in candidates.into_iter().filter_map(|a| a.parse().ok()) {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// An engine's own contribution to `sandbox doctor` ([`ContainerEngine::facts`]).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct EngineFacts {
    /// Engine version.
    pub version: Option<String>,
    /// OCI runtimes the engine offers.
    pub runtimes: Vec<String>,
    /// Engine-specific problems, each with its fix.
    pub problems: Vec<Problem>,
}

impl EngineFacts {
    /// The value of a fact-finding call, or `None` with a problem naming the `fact` the
    /// engine did not give, its error and `fix`: a check that cannot answer is reported,
    /// never taken as "not provided".
    pub fn answer<T>(&mut self, fact: &str, r: EngineResult<T>, fix: &str) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.problems.push(Problem::new(
                    format!("the engine did not give its {fact}: {e}"),
                    fix,
                ));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fact_the_engine_did_not_give_is_a_problem() {
        let mut f = EngineFacts::default();
        assert_eq!(f.answer("version", Ok(3), "start it"), Some(3));
        assert!(f.problems.is_empty());
        let down = EngineError::new(EngineErrorKind::Unavailable, "version: connection refused");
        assert_eq!(f.answer::<u8>("version", Err(down), "start it"), None);
        assert_eq!(f.problems.len(), 1);
        assert!(f.problems[0].problem.contains("connection refused"));
        assert_eq!(f.problems[0].fix, "start it");
    }

    #[test]
    fn both_engines_status_words_map_to_states() {
        for (word, state) in [
            ("running", SandboxState::Running),
            ("created", SandboxState::Creating),
            ("initialized", SandboxState::Creating),
            ("paused", SandboxState::Paused),
            ("exited", SandboxState::Stopped),
            ("dead", SandboxState::Stopped),
            ("stopped", SandboxState::Stopped),
            ("restarting", SandboxState::Unknown),
        ] {
            assert_eq!(state_from_status(Some(word)), state, "{word}");
        }
        assert_eq!(state_from_status(None), SandboxState::Unknown);
    }

    #[test]
    fn published_ports_are_reached_on_loopback() {
        let lo = Some(SocketAddr::from(([127, 0, 0, 1], 40000)));
        for ip in [Some("127.0.0.1"), Some(""), Some("0.0.0.0"), None] {
            assert_eq!(published_address(ip, Some(40000)), lo, "{ip:?}");
        }
        assert_eq!(published_address(Some("127.0.0.1"), Some(0)), None);
        assert_eq!(published_address(Some("127.0.0.1"), None), None);
        assert_eq!(published_address(Some("not an ip"), Some(1)), None);
        let map = published_ports([
            ("8080/tcp", vec![(Some("0.0.0.0"), Some(49153))]),
            (
                "9090/tcp",
                vec![(Some("127.0.0.1"), Some(0)), (None, Some(49154))],
            ),
            ("53/udp", vec![(Some("127.0.0.1"), Some(5353))]),
            ("7070/tcp", vec![]),
        ]);
        let want = BTreeMap::from([
            (8080, "127.0.0.1:49153".parse().unwrap()),
            (9090, "127.0.0.1:49154".parse().unwrap()),
        ]);
        assert_eq!(map, want);
    }

    #[test]
    fn container_addresses_are_parsed_once_each() {
        let a = container_addresses(["172.17.0.2", "", "fd00::2", "172.17.0.2", "bogus"]);
        let want: Vec<std::net::IpAddr> =
            vec!["172.17.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        assert_eq!(a, want);
    }

    #[test]
    fn engine_text_is_one_bounded_line() {
        let t = engine_text(&format!("a\nb\x1b[31m{}", "x".repeat(1000)));
        assert!(
            !t.chars().any(char::is_control) && t.chars().count() == 300,
            "{t:?}"
        );
    }
}
