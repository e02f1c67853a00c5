//! The in-sandbox agent as the container's PID 1 (docs/agent.md): putting the embedded
//! binary into a created container, connecting to it over the engine's attach stream, and
//! running user processes through it instead of the engine's exec path.
//!
//! Why: an engine exec costs tens of milliseconds (runc exec, conmon) where a spawn through
//! the agent costs about one; and the agent as PID 1 is a lifetime backstop sandboxed root
//! cannot stop (the kernel drops every signal from inside the namespace to a PID 1 without
//! handlers), unlike the `sleep` main process of the exec path.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use sandbox_agent::client::{AgentClient, ClientOptions, ProcessEvent, RemoteProcess, StdinWriter};
use sandbox_agent::protocol::{SpawnSpec, WindowSize};
use sandbox_core::teardown::Killer;
use sandbox_core::{
    Capability, InputSink, IsolationTier, OutputChunk, Process, PtySize, Result, StartFuture,
    StartedExec, StreamKind,
};

use crate::engine::transfer::bounded;
use crate::engine::{ArchiveBody, ContainerEngine};
use crate::error;
use crate::sandbox::shared::Shared;
use crate::sandbox::stdin::Stdin;

/// Where the agent binary is put in every agent-mode container (the root directory always
/// exists, whatever the image; the dot keeps it out of a plain `ls /`).
pub const AGENT_PATH: &str = "/.sandbox-agent";

/// Which path a sandbox's commands take; reported by [`ContainerNative`](crate::ContainerNative)
/// and as the `exec_path` field of the create's tracing event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExecPath {
    /// Through the in-sandbox agent (the container's PID 1) over the engine's attach
    /// stream.
    Agent,
    /// Through the engine's exec API (the agent is off, unavailable for this engine or
    /// architecture, or failed to start; for a handle reattached with `connect`: the
    /// sandbox has no agent that takes a new session over, or it did not answer).
    Engine,
}

impl ExecPath {
    /// `"agent"` or `"engine"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ExecPath::Agent => "agent",
            ExecPath::Engine => "engine",
        }
    }
}

impl std::fmt::Display for ExecPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Environment variable that switches the agent off for configurations built from the
/// environment (`SBX_AGENT=off`; also `0`, `false`, `no`): every sandbox then uses the
/// engine's exec path. Read by the adapters' `from_env` constructors, so a test suite can
/// run in both modes without code changes.
pub const AGENT_ENV: &str = "SBX_AGENT";

/// Whether `env` leaves the agent on ([`AGENT_ENV`] unset or anything but off).
pub fn agent_enabled_in(env: &crate::endpoint::discovery::EnvSnapshot) -> bool {
    !env.get(AGENT_ENV).is_some_and(|v| {
        ["off", "0", "false", "no"]
            .iter()
            .any(|off| v.eq_ignore_ascii_case(off))
    })
}

/// The agent binary this build ships, if any for this architecture.
pub(crate) fn binary() -> Option<&'static [u8]> {
    sandbox_agent::prebuilt()
}

/// The container's main process in agent mode: the agent, ending at `deadline_unix`,
/// movable up to `max_deadline_unix`, and after `idle` without use when given. The
/// arguments an unchanged lifetime does not need are left out, so such a sandbox starts
/// the same way with an agent of any protocol version.
pub(crate) fn command(
    deadline_unix: u64,
    max_deadline_unix: u64,
    idle: Option<Duration>,
) -> Vec<String> {
    let mut argv = vec![
        AGENT_PATH.to_string(),
        "--deadline-unix".to_string(),
        deadline_unix.to_string(),
    ];
    if max_deadline_unix > deadline_unix {
        argv.push("--max-deadline-unix".to_string());
        argv.push(max_deadline_unix.to_string());
    }
    if let Some(idle) = idle {
        // Whole seconds, rounded up: never idle-ended before the limit.
        let secs = idle.as_secs() + u64::from(idle.subsec_nanos() > 0);
        argv.push("--idle".to_string());
        argv.push(secs.to_string());
    }
    argv
}

/// A tar stream holding the agent at [`AGENT_PATH`] (extracted into `/`): root-owned,
/// 0755, a fixed mtime. Built once per process (1.5 MiB).
pub(crate) fn archive(bin: &'static [u8]) -> std::io::Result<ArchiveBody> {
    static TAR: OnceLock<Bytes> = OnceLock::new();
    let tar = match TAR.get() {
        Some(t) => t.clone(),
        None => {
            let t = tar_of(bin)?;
            TAR.get_or_init(|| t).clone()
        }
    };
    Ok(futures::stream::once(async move { Ok(tar) }).boxed())
}

fn tar_of(bin: &[u8]) -> std::io::Result<Bytes> {
    let mut b = tar::Builder::new(Vec::with_capacity(bin.len() + 2048));
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(bin.len() as u64);
    h.set_mode(0o755);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    b.append_data(&mut h, AGENT_PATH.trim_start_matches('/'), bin)?;
    Ok(b.into_inner()?.into())
}

/// Whom a new host session is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Session {
    /// A sandbox just started: its agent has served no host yet.
    First,
    /// A reattached handle: the agent may serve (or have served) another host, which
    /// this session takes over (protocol version 3).
    TakeOver,
}

/// The [`LABEL_AGENT_PROTOCOL`](sandbox_core::labels::LABEL_AGENT_PROTOCOL) value of a
/// sandbox running this build's agent.
pub(crate) fn protocol_label() -> String {
    sandbox_agent::protocol::SUPPORTED_VERSIONS
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether a sandbox with these labels runs an agent that takes a new host session over:
/// created on the agent path by a build whose agent speaks the takeover version. Any
/// doubt is a no: the takeover preamble would end an older agent, and the sandbox with it.
pub(crate) fn takes_over(labels: &BTreeMap<String, String>) -> bool {
    use sandbox_core::labels::{EXEC_PATH_AGENT, LABEL_AGENT_PROTOCOL, LABEL_EXEC_PATH};
    labels.get(LABEL_EXEC_PATH).map(String::as_str) == Some(EXEC_PATH_AGENT)
        && labels.get(LABEL_AGENT_PROTOCOL).is_some_and(|v| {
            v.split(',')
                .any(|n| n.trim().parse() == Ok(sandbox_agent::protocol::TAKEOVER_VERSION))
        })
}

/// Takes this handle's agent session back when another handle took it over (a reattached
/// one, e.g. `sandbox exec` while `sandbox create`'s holder keeps the sandbox), for the
/// calls only the owning handle can make: a fork (only it knows what a fork is made
/// from) and an extension (the owner's timer and maximum move with it). The other
/// handle's session ends, as a later `connect` would end this one's; the deadline in
/// force, the ssh-agent relay and the git gate's port are given to the new session.
pub(crate) async fn reclaim<E: ContainerEngine>(sh: &Shared<E>) -> Result<()> {
    let Some(old) = sh.agent() else {
        return Ok(());
    };
    if !old.is_superseded() {
        return Ok(());
    }
    sh.refuse_unless_running()?;
    let client = connect(
        &*sh.engine,
        &sh.id,
        sh.config.call_timeout,
        Session::TakeOver,
    )
    .await
    .map_err(|reason| {
        error::internal(
            sh.engine.backend(),
            format!("the sandbox's agent did not take this handle's session back: {reason}"),
        )
    })?;
    client
        .set_deadline(crate::sandbox::fork::unix_secs_up(sh.deadline()))
        .await?;
    crate::ssh_agent::Forwarding::resume(&sh.ssh_agent, &client, &sh.id).await?;
    crate::git_gate::Forwarding::resume(&sh.git_gate, &client).await?;
    sh.expiry.watch_session(&client);
    *sh.agent.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
    Ok(())
}

/// Attaches to the agent of container `id` and starts a host session. Each step is
/// bounded by `limit` (the hello by at most [`HELLO_TIMEOUT`]); the error says which step
/// failed, for the fallback's log line.
pub(crate) async fn connect<E: ContainerEngine>(
    engine: &E,
    id: &str,
    limit: Duration,
    session: Session,
) -> std::result::Result<AgentClient, String> {
    let attach = bounded(limit, "attach", engine.attach(id))
        .await
        .map_err(|e| format!("attach failed: {e}"))?;
    let sandbox = id.to_string();
    // The agent's stdout is the protocol; its stderr carries only its own diagnostics
    // (bad arguments, a broken stream), which go to the log, bounded.
    let stdout = attach.output.filter_map(move |item| {
        futures::future::ready(match item {
            Ok(c) if c.stream == StreamKind::Stdout => Some(Ok(c.data)),
            Ok(c) => {
                let text = String::from_utf8_lossy(&c.data[..c.data.len().min(512)]).into_owned();
                tracing::debug!(sandbox_id = %sandbox, agent_stderr = %text, "agent diagnostics");
                None
            }
            Err(e) => Some(Err(std::io::Error::other(e))),
        })
    });
    let reader = tokio_util::io::StreamReader::new(Box::pin(stdout));
    let mut opts = ClientOptions::default();
    opts.hello_timeout = limit.min(HELLO_TIMEOUT);
    opts.call_timeout = limit;
    let client = match session {
        Session::First => AgentClient::connect(reader, attach.input, id, opts).await,
        Session::TakeOver => AgentClient::take_over(reader, attach.input, id, opts).await,
    };
    client.map_err(|e| format!("the agent did not answer its hello: {}", e.render()))
}

/// Longest wait for the agent's hello. It answers in well under a millisecond once
/// started; a binary that cannot run at all (another architecture) ends the container,
/// which ends the stream at once, so this bound is only hit by a wedged engine.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long past the sandbox's deadline a lifetime-bounded command's own timeout waits
/// for the agent's deadline notice (sent at the deadline, a few ms later on the host).
const LIFETIME_MARGIN: Duration = Duration::from_secs(2);

/// A user command through the agent, as a lazily started, killable [`Process`] bounded by
/// `timeout`, reading `stdin`. Dropped before its end, the process tree is killed (by the
/// agent, which sees `setsid` and double-forked descendants too).
pub(crate) fn process<E: ContainerEngine>(
    sh: &Arc<Shared<E>>,
    client: &AgentClient,
    argv: Vec<String>,
    env: &BTreeMap<String, String>,
    workdir: Option<&str>,
    timeout: Duration,
    stdin: Stdin,
) -> Result<Process> {
    let cwd = match workdir {
        Some(w) => sandbox_core::resolve_path(&sh.workdir, w)?,
        None => sh.workdir.clone(),
    };
    // A command bounded only by the sandbox's lifetime ends with the sandbox, which the
    // agent guarantees at its deadline: give that end a moment to arrive first, so the
    // caller sees `SandboxGone` (the sandbox is over), not a timeout of its command.
    let timeout = match sh.remaining() {
        Ok(left) if timeout + LIFETIME_MARGIN >= left => left + LIFETIME_MARGIN,
        _ => timeout,
    };
    let spec = SpawnSpec {
        argv,
        env: sh.exec_env(env),
        cwd: Some(cwd),
        stdin: matches!(stdin, Stdin::Given(_) | Stdin::Live),
        pty: match stdin {
            Stdin::Terminal(p) => Some(WindowSize {
                rows: p.rows,
                cols: p.cols,
            }),
            _ => None,
        },
    };
    Ok(Process::new(
        start(sh.clone(), client.clone(), spec, stdin),
        timeout,
        sh.info(),
    ))
}

fn start<E: ContainerEngine>(
    sh: Arc<Shared<E>>,
    client: AgentClient,
    spec: SpawnSpec,
    stdin: Stdin,
) -> StartFuture {
    Box::pin(async move {
        sh.remaining()?;
        // Dropped while this future is pending (a cancelled start), the process is killed.
        let p = client.spawn(spec).await?;
        let writer = match (stdin.attached(), p.stdin()) {
            (false, _) => None,
            (true, Some(w)) => Some(w),
            (true, None) => {
                return Err(error::internal(
                    sh.engine.backend(),
                    "the agent gave the process no stdin",
                ));
            }
        };
        let (feed, input) = match (stdin, writer) {
            (Stdin::Given(data), Some(w)) => (Some((w, data)), None),
            (Stdin::Live, Some(w)) => (None, Some(Arc::new(AgentInput(w)) as Arc<dyn InputSink>)),
            (Stdin::Terminal(_), Some(w)) => {
                (None, Some(Arc::new(AgentTerminal(w)) as Arc<dyn InputSink>))
            }
            _ => (None, None),
        };
        let handle = p.kill_handle();
        let killer: Killer = Arc::new(move || {
            let handle = handle.clone();
            Box::pin(async move { handle.kill().await })
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<i64>();
        let id = sh.id.clone();
        let exit_code = Box::pin(async move { rx.await.map_err(|_| error::gone(&id)) });
        let mut output = events(p, client, tx);
        if let Some((stdin, data)) = feed {
            crate::sandbox::stdin::beside(
                &mut output,
                Box::pin(async move {
                    stdin.write(&data).await.map_err(std::io::Error::other)?;
                    stdin.close().await.map_err(std::io::Error::other)
                }),
            );
        }
        Ok(StartedExec {
            output,
            exit_code,
            killer,
            input,
        })
    })
}

/// Live input through the agent: written bytes are stdin frames (flow-controlled); the end
/// is `close_stdin` (the pipe closes). No terminal: the trait's resize refuses.
struct AgentInput(StdinWriter);

#[async_trait::async_trait]
impl InputSink for AgentInput {
    async fn write(&self, data: Bytes) -> Result<()> {
        self.0.write(&data).await
    }
    async fn end(&self) -> Result<()> {
        self.0.close().await
    }
}

/// A terminal through the agent: as [`AgentInput`], plus `resize`; the end is `^D`.
struct AgentTerminal(StdinWriter);

#[async_trait::async_trait]
impl InputSink for AgentTerminal {
    async fn write(&self, data: Bytes) -> Result<()> {
        self.0.write(&data).await
    }
    async fn resize(&self, size: PtySize) -> Result<()> {
        self.0
            .resize(WindowSize {
                rows: size.rows,
                cols: size.cols,
            })
            .await
    }
    async fn end(&self) -> Result<()> {
        self.0.close().await
    }
}

/// The process's output as chunks; the exit status goes to `exit`. The client is held so
/// its I/O tasks live as long as the stream, whatever happens to the sandbox handle.
pub(crate) fn events(
    p: RemoteProcess,
    client: AgentClient,
    exit: tokio::sync::oneshot::Sender<i64>,
) -> futures::stream::BoxStream<'static, Result<OutputChunk>> {
    struct State {
        p: RemoteProcess,
        _client: AgentClient,
        exit: Option<tokio::sync::oneshot::Sender<i64>>,
    }
    let state = State {
        p,
        _client: client,
        exit: Some(exit),
    };
    futures::stream::unfold(Some(state), |state| async move {
        let mut s = state?;
        match s.p.next_event().await {
            Ok(Some(ProcessEvent::Stdout(b))) => Some((Ok(OutputChunk::stdout(b)), Some(s))),
            Ok(Some(ProcessEvent::Stderr(b))) => Some((Ok(OutputChunk::stderr(b)), Some(s))),
            Ok(Some(ProcessEvent::Exit(status))) => {
                if let Some(tx) = s.exit.take() {
                    let _ = tx.send(status.exit_code());
                }
                None
            }
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

/// What a sandbox gains from its agent: `AGENT` itself, terminals where the agent
/// speaks the protocol version that has them and the runtime's terminals are whole (see
/// [`terminals_work`]), and a movable deadline and idle limit where it speaks the version
/// that has them, and the reset of every process where it speaks the version with it.
pub(crate) fn capabilities(
    agent: Option<&sandbox_agent::client::AgentClient>,
    tier: IsolationTier,
) -> Capability {
    let Some(a) = agent else {
        return Capability::empty();
    };
    let mut caps = Capability::AGENT;
    if a.version() >= sandbox_agent::protocol::PTY_VERSION && terminals_work(tier) {
        caps |= Capability::PTY;
    }
    // The agent enforces a moved deadline and the idle limit from inside, where the one
    // set at create is enforced; the exec path's `sleep` cannot follow either.
    if a.version() >= sandbox_agent::protocol::LIFETIME_VERSION {
        caps |= Capability::EXTEND_LIFETIME | Capability::IDLE_TIMEOUT;
    }
    // Ending every process but the first needs a process that is still there when no
    // new one can start: the agent (the exec path's exec fails once pids run out).
    if a.version() >= sandbox_agent::protocol::RESET_VERSION {
        caps |= Capability::RESET_PROCESSES;
    }
    // The ssh-agent relay socket is the agent's: the exec path has no channel for it.
    if a.version() >= sandbox_agent::protocol::SSH_AGENT_VERSION {
        caps |= Capability::SSH_AGENT;
    }
    // The gate's port is forwarded over the agent's channel, which the exec path lacks.
    if a.version() >= sandbox_agent::protocol::TCP_FORWARD_VERSION {
        caps |= Capability::GIT_GATE;
    }
    caps
}

/// [`capabilities`] of an agent of this build's takeover version, for a handle reattached
/// to a stopped sandbox whose agent `start` will greet.
pub(crate) fn restarted_capabilities(tier: IsolationTier) -> Capability {
    let mut caps = Capability::AGENT | Capability::EXTEND_LIFETIME | Capability::IDLE_TIMEOUT;
    if terminals_work(tier) {
        caps |= Capability::PTY;
    }
    caps
}

/// What the template holds at [`AGENT_PATH`] that keeps the agent out, if anything: a
/// directory (also a volume the image declares there) or a symbolic link. A regular file
/// is no obstacle (the upload replaces it, a bind mount covers it).
pub(crate) fn obstacle(stat: &crate::engine::PathStat) -> Option<String> {
    match (&stat.link_target, stat.is_dir) {
        (Some(target), _) => Some(format!("a symbolic link (to {target:?})")),
        (None, true) => Some("a directory".to_string()),
        (None, false) => None,
    }
}

/// The refusal of a template that holds `what` at [`AGENT_PATH`]: the agent cannot go
/// there, and the sandbox would otherwise run on the weaker engine exec path.
pub(crate) fn image_in_the_way(image: &str, what: &str) -> sandbox_core::SandboxError {
    sandbox_core::SandboxError::config(
        format!(
            "image `{image}` has {what} at {AGENT_PATH}, where the in-sandbox agent goes; \
             without the agent the sandbox would run on the engine's exec path (its main \
             process can be stopped from inside, kills run the image's own /bin/sh), so the \
             create is refused"
        ),
        format!(
            "use an image with nothing at {AGENT_PATH} (remove it, and any VOLUME declared \
             there, from the image's Dockerfile)"
        ),
    )
}

/// The refusal of a create that needs the agent (see [`needed`]) whose agent could not
/// be used (`reason`).
pub(crate) fn required(reason: &str) -> sandbox_core::SandboxError {
    sandbox_core::SandboxError::config(
        format!(
            "the in-sandbox agent could not be used ({reason}), and this sandbox needs it \
             (require_agent, an idle_timeout, a max_lifetime beyond the timeout, or \
             ssh_agent, git_repo): the engine's exec path cannot enforce or relay them"
        ),
        "fix the cause above and retry, or leave CreateOptions::require_agent, idle_timeout, \
         max_lifetime, ssh_agent and git_repo unset (`--allow-engine-exec` on the CLI and the MCP server) to \
         accept the engine's exec path",
    )
}

/// Whether a create must not fall back to the engine's exec path: the caller asked for
/// the agent, or for a lifetime only the agent enforces from inside (an idle limit, a
/// deadline that can move).
pub(crate) fn needed(options: &sandbox_core::CreateOptions) -> bool {
    options.require_agent
        || options.idle_timeout.is_some()
        || options.effective_max_lifetime() > options.timeout
        || options.ssh_agent.is_some()
        || !options.git_repos.is_empty()
}

/// gVisor's own terminals (runsc 2022-12, what Debian 12 ships) ignore `^D`, so a
/// line-mode reader never sees end of input (gVisor issue 9333): `PTY` is not declared
/// there rather than declared half-working.
pub(crate) fn terminals_work(tier: IsolationTier) -> bool {
    tier != IsolationTier::Gvisor
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbx_agent_off_switches_the_agent_off() {
        use crate::endpoint::discovery::EnvSnapshot;
        assert!(agent_enabled_in(&EnvSnapshot::empty()));
        assert!(agent_enabled_in(&EnvSnapshot::empty().var(AGENT_ENV, "on")));
        for off in ["off", "OFF", "0", "false", "no"] {
            assert!(
                !agent_enabled_in(&EnvSnapshot::empty().var(AGENT_ENV, off)),
                "{off}"
            );
        }
    }

    /// A directory or a link at the agent's path is the image's obstacle; a regular file
    /// (a committed sandbox's mount point, an old agent) is not.
    #[test]
    fn a_directory_or_link_at_the_agent_path_is_an_obstacle() {
        use crate::engine::PathStat;
        assert_eq!(
            obstacle(&PathStat::new(4096, 0o755, true)).as_deref(),
            Some("a directory")
        );
        let mut link = PathStat::new(7, 0o777, false);
        link.link_target = Some("/bin/sh".into());
        assert!(obstacle(&link).is_some_and(|w| w.contains("symbolic link")));
        assert_eq!(obstacle(&PathStat::new(0, 0o644, false)), None);
        let e = image_in_the_way("evil:1", "a directory");
        assert_eq!(e.code(), sandbox_core::ErrorCode::Configuration);
        assert!(e.to_string().contains(AGENT_PATH) && e.hint().contains(AGENT_PATH));
        let e = required("attach failed");
        assert_eq!(e.code(), sandbox_core::ErrorCode::Configuration);
        assert!(e.to_string().contains("attach failed") && e.hint().contains("require_agent"));
    }

    #[test]
    fn command_runs_the_agent_until_the_deadline() {
        assert_eq!(
            command(1_800_000_000, 1_800_000_000, None),
            vec!["/.sandbox-agent", "--deadline-unix", "1800000000"]
        );
        assert_eq!(
            command(
                1_800_000_000,
                1_800_000_600,
                Some(Duration::from_millis(2500))
            ),
            vec![
                "/.sandbox-agent",
                "--deadline-unix",
                "1800000000",
                "--max-deadline-unix",
                "1800000600",
                "--idle",
                "3"
            ]
        );
    }

    /// The archive holds exactly the agent, root-owned and executable, at the path the
    /// command names.
    #[test]
    fn archive_holds_the_agent_root_owned_and_executable() {
        let bin: &'static [u8] = b"\x7fELF not really";
        let tar = tar_of(bin).unwrap();
        let mut a = tar::Archive::new(&tar[..]);
        let mut entries = a.entries().unwrap();
        let mut e = entries.next().unwrap().unwrap();
        assert_eq!(e.path().unwrap().to_str(), Some(".sandbox-agent"));
        assert_eq!(e.header().mode().unwrap(), 0o755);
        assert_eq!(e.header().uid().unwrap(), 0);
        assert_eq!(e.header().gid().unwrap(), 0);
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut body).unwrap();
        assert_eq!(body, bin);
        drop(e);
        assert!(entries.next().is_none());
    }
}
