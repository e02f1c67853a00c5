//! The holder of a `sandbox create` session: this binary again, detached, which creates
//! the sandbox, reports its id to `sandbox create`, and then keeps the handle — and the
//! ownership — until `sandbox kill`, the lifetime in force, or SIGTERM.
//!
//! It also holds the session's forks. A fork needs the original's own handle (the handle
//! knows the spec, the secrets' absence and the engine state a fork is made from; a
//! reattached one does not), so `sandbox fork ID` asks the holder through its control
//! socket, `/run/sandbox-rs/holder/<container id>.sock` in a directory only its user can
//! enter. The holder forks, keeps the forks beside the original (each until its own
//! deadline, `sandbox kill`, or the holder's end) and answers with their ids. `sandbox
//! extend` asks the same way, for the original or a fork: the holder's handle moves the
//! agent's deadline (a reattached one would take the agent over on Docker, and has no
//! agent to ask on Podman). One request per connection, a bounded line each way; the
//! socket is removed when the holder ends.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use sandbox::{Backend, ForkOptions, Sandbox, SandboxError};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::cli::{CreateArgs, ForkArgs};
use crate::exit_code;
use crate::output::{Out, error_json};
use crate::run::SandboxInfo;

/// Set in the environment of the holder process.
pub const HOLDER_ENV: &str = "SANDBOX_CLI_HOLDER";
/// The acknowledgement the parent sends once it printed the id.
pub const ACK: &str = "ok";
/// How often the holder checks that its sandboxes still exist (after `sandbox kill`).
const HOLDER_POLL: Duration = Duration::from_secs(2);
/// Bound on listing the engine.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the holder keeps trying to remove a sandbox once a kill outlasted the
/// teardown grace (a loaded engine): it is detached and about to exit, and whatever it
/// leaves unfinished would outlive it.
const HOLDER_RELEASE_BOUND: Duration = Duration::from_secs(60);
/// Where holders put their control sockets: root's, like the host's other records.
const CONTROL_DIR: &str = "/run/sandbox-rs/holder";
/// Longest request or answer line on the control socket.
const CONTROL_LINE_MAX: u64 = 64 * 1024;
/// How long the holder waits for a connected client's request line: a client that sends
/// nothing must not stall the holder's watch over its sandboxes.
const CONTROL_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `sandbox fork` waits for the holder's answer (a fork restores memory images).
const FORK_WAIT: Duration = Duration::from_secs(180);

/// What the holder reports on its stdout after create, and on the control socket after a
/// fork: one JSON line.
#[derive(Debug, Serialize, Deserialize)]
pub struct HolderReport {
    /// The command's exit code.
    pub exit: u8,
    /// `--json` body on success, `{"error": …}` on failure.
    pub body: serde_json::Value,
    /// The human text: the id(s), or the rendered error.
    pub text: String,
    /// The request named a sandbox this holder does not hold (the client asks the next
    /// holder).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_held: bool,
}

impl HolderReport {
    /// Prints the report as the command's own output; returns its exit code.
    pub fn print(&self, out: &Out) -> u8 {
        if out.json {
            out.json_value(&self.body);
        } else if self.exit == exit_code::OK {
            out.line(&self.text);
        } else {
            out.note(format!("{} {}", out.red("error:"), self.text));
        }
        self.exit
    }

    fn failed(e: &SandboxError) -> Self {
        HolderReport {
            exit: exit_code::for_error(e),
            body: error_json(e),
            text: crate::terminal::escape_text(&e.render()),
            not_held: false,
        }
    }
}

/// A request on the control socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum ControlRequest {
    /// Fork the original `count` times; each fork lives `timeout_s` from the fork, or to
    /// the original's deadline in force.
    Fork {
        count: usize,
        timeout_s: Option<u64>,
    },
    /// Move the deadline of a held sandbox (the original or one of its forks) `by_s`
    /// seconds later, through the handle that holds its agent: a reattached handle would
    /// take the agent over from this holder (Docker) or has none to ask (Podman).
    Extend { id: String, by_s: u64 },
}

/// One sandbox the holder keeps.
struct Held {
    sb: Box<dyn Sandbox>,
    deadline: Instant,
}

/// The holder: creates the sandbox, reports, waits for the ack, then keeps the sandbox
/// (and any forks made through its control socket) until each is killed elsewhere or its
/// lifetime ends, or SIGTERM/SIGINT arrives.
pub async fn hold(args: CreateArgs) -> u8 {
    // Installed first: a signal between create and the loop below still tears down.
    let mut terminated = std::pin::pin!(crate::signals::terminated_not_hangup());
    let lifetime = args
        .timeout
        .unwrap_or(crate::target::DEFAULT_SESSION_LIFETIME);
    let created = async {
        let (target, options) =
            crate::target::resolve(&args.dsn, &args.sandbox, crate::session::create_base(&args))?;
        let options = crate::target::require_agent_where_offered(
            options,
            &target,
            args.sandbox.allow_engine_exec,
        )
        .await?;
        let bindings = crate::session::credentials_json(&options.credentials);
        let backend = sandbox::backend(target).await?;
        let sb = backend.create(options).await?;
        Ok::<_, SandboxError>((backend, sb, bindings))
    };
    let (backend, sb, credentials) = match created.await {
        Ok(v) => v,
        Err(e) => {
            let report = HolderReport::failed(&e);
            send_report(&report);
            return report.exit;
        }
    };
    let deadline = Instant::now() + lifetime;
    let original = sb.id().to_string();
    // Listening before the id is reported: a `sandbox extend` or `fork` sent the moment
    // `sandbox create` returns finds the holder (it waits in the backlog until the loop).
    let control = Control::open(&original);
    let info = SandboxInfo::of(&*sb);
    let deadline_unix = sandbox::labels::unix_now().saturating_add(lifetime.as_secs());
    send_report(&HolderReport {
        exit: exit_code::OK,
        body: serde_json::json!({
            "sandbox": info,
            "timeout_s": lifetime.as_secs(),
            "deadline": deadline_unix,
            "credentials": credentials,
        }),
        text: sb.id().to_string(),
        not_held: false,
    });
    let mut ack = String::new();
    let acked = BufReader::new(tokio::io::stdin()).read_line(&mut ack).await;
    if !matches!(acked, Ok(n) if n > 0 && ack.trim() == ACK) {
        release(&backend, vec![sb]).await;
        return exit_code::INTERRUPTED;
    }
    let mut held = vec![Held { sb, deadline }];
    loop {
        let next = held
            .iter()
            .map(|h| h.deadline)
            .min()
            .unwrap_or_else(Instant::now);
        tokio::select! {
            _ = &mut terminated => break,
            _ = tokio::time::sleep_until(next.into()) => {
                // Moved since the last poll? Asked once more before ending any.
                refresh(&backend, &mut held).await;
                let now = Instant::now();
                let (due, keep): (Vec<_>, Vec<_>) =
                    held.into_iter().partition(|h| h.deadline <= now);
                held = keep;
                release(&backend, due.into_iter().map(|h| h.sb).collect()).await;
            }
            _ = tokio::time::sleep(HOLDER_POLL) => refresh(&backend, &mut held).await,
            Some(stream) = accept(control.as_ref()) => {
                serve(stream, &original, &mut held).await;
            }
        }
        if held.is_empty() {
            return exit_code::OK;
        }
    }
    release(&backend, held.into_iter().map(|h| h.sb).collect()).await;
    exit_code::OK
}

/// Drops the held sandboxes the engine no longer holds (`sandbox kill`, the engine) and
/// moves deadlines extended by another process (`sandbox extend`: the host's record says
/// so, and this holder follows). An engine that does not answer changes nothing: the
/// holder keeps ownership until the deadlines it knows.
async fn refresh(backend: &Arc<dyn Backend>, held: &mut Vec<Held>) {
    let Some(reapable) = backend.as_reapable() else {
        return;
    };
    let Ok(Ok(list)) =
        tokio::time::timeout(LIST_TIMEOUT, reapable.list_managed(&BTreeMap::new())).await
    else {
        return;
    };
    let listed: BTreeMap<&str, Option<SystemTime>> =
        list.iter().map(|m| (m.id.as_str(), m.deadline)).collect();
    held.retain_mut(|h| match listed.get(h.sb.id()) {
        None => false,
        Some(d) => {
            if let Some(at) = d.and_then(|d| later(d, h.deadline)) {
                h.deadline = at;
            }
            true
        }
    });
}

/// `listed` as an instant of this process's clock, when it is later than `held`.
fn later(listed: SystemTime, held: Instant) -> Option<Instant> {
    let at = match listed.duration_since(SystemTime::now()) {
        Ok(left) => Instant::now() + left,
        Err(_) => Instant::now(),
    };
    // A second of slack: the wall clock and the monotonic one are read apart, and a
    // deadline is kept in whole seconds.
    (at > held + Duration::from_secs(1)).then_some(at)
}

/// Kills sandboxes for good before the holder lets go of them. A kill that outlasts the
/// teardown grace leaves its removal to a background task, which this process's exit
/// would abandon (a leaked container, seen under load in CI): the removal is then retried
/// through the reaper until the engine confirms it, for at most [`HOLDER_RELEASE_BOUND`].
async fn release(backend: &Arc<dyn Backend>, sandboxes: Vec<Box<dyn Sandbox>>) {
    if sandboxes.is_empty() {
        return;
    }
    let kills = sandboxes.into_iter().map(|sb| async move {
        let id = sb.id().to_string();
        let killed = sb.kill().await;
        drop(sb);
        if let (Err(e), Some(reaper)) = (killed, backend.as_reapable()) {
            tracing::debug!(error = %e, sandbox_id = %id, "holder kill failed; retrying through the reaper");
            let _ = tokio::time::timeout(HOLDER_RELEASE_BOUND, async {
                while reaper.kill_managed(&id).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
            .await;
        }
    });
    futures::future::join_all(kills).await;
    let grace = sandbox::teardown::teardown_grace() + Duration::from_secs(1);
    sandbox::teardown::wait_for_teardowns(grace).await;
}

fn send_report(r: &HolderReport) {
    use std::io::Write;
    let line = serde_json::to_string(r).unwrap_or_default();
    let mut o = std::io::stdout().lock();
    // The parent may be gone (interrupted); the missing ack handles that.
    let _ = writeln!(o, "{line}").and_then(|_| o.flush());
}

/// The holder's control socket; removed when dropped (the holder's end).
struct Control {
    listener: UnixListener,
    path: PathBuf,
}

impl Control {
    /// Binds the socket for `id`. Without one (not root, a read-only /run) the session
    /// works as before and `sandbox fork` says why it cannot reach the holder.
    fn open(id: &str) -> Option<Control> {
        let dir = Path::new(CONTROL_DIR);
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)));
        if let Err(e) = made {
            tracing::debug!(error = %e, "no holder control socket: {CONTROL_DIR} is not writable");
            return None;
        }
        let path = control_path(id);
        // A stale socket of a holder that was killed outright.
        let _ = std::fs::remove_file(&path);
        match UnixListener::bind(&path) {
            Ok(listener) => Some(Control { listener, path }),
            Err(e) => {
                tracing::debug!(error = %e, "no holder control socket");
                None
            }
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn control_path(id: &str) -> PathBuf {
    Path::new(CONTROL_DIR).join(format!("{id}.sock"))
}

/// The next client, or never when there is no socket.
async fn accept(control: Option<&Control>) -> Option<UnixStream> {
    match control {
        Some(c) => c.listener.accept().await.ok().map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Answers one control request. Forks are made by the original's handle and joined to
/// the held set with their deadlines.
async fn serve(stream: UnixStream, original: &str, held: &mut Vec<Held>) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let got = tokio::time::timeout(
        CONTROL_READ_TIMEOUT,
        BufReader::new(read.take(CONTROL_LINE_MAX)).read_line(&mut line),
    )
    .await;
    let report = match got {
        Ok(Ok(n)) if n > 0 && line.ends_with('\n') => match serde_json::from_str(&line) {
            Ok(request) => answer(request, original, held).await,
            Err(e) => HolderReport::failed(&SandboxError::config(
                format!("unreadable request on the holder's control socket: {e}"),
                "use `sandbox fork ID`",
            )),
        },
        // Nothing, a line too long, or too slow: nothing to answer.
        _ => return,
    };
    let mut out = serde_json::to_string(&report).unwrap_or_default();
    out.push('\n');
    let _ = write.write_all(out.as_bytes()).await;
    let _ = write.shutdown().await;
}

async fn answer(request: ControlRequest, original: &str, held: &mut Vec<Held>) -> HolderReport {
    match request {
        ControlRequest::Fork { count, timeout_s } => {
            answer_fork(count, timeout_s, original, held).await
        }
        ControlRequest::Extend { id, by_s } => answer_extend(&id, by_s, held).await,
    }
}

/// Extends a held sandbox; `not_held` when it is not this holder's.
async fn answer_extend(id: &str, by_s: u64, held: &mut [Held]) -> HolderReport {
    let Some(h) = held.iter_mut().find(|h| h.sb.id() == id) else {
        let mut r = HolderReport::failed(&SandboxError::connect(id, "not held by this holder"));
        r.not_held = true;
        return r;
    };
    let set = match h.sb.extend(Duration::from_secs(by_s)).await {
        Ok(set) => set,
        Err(e) => return HolderReport::failed(&e),
    };
    let left = set.duration_since(SystemTime::now()).unwrap_or_default();
    h.deadline = Instant::now() + left;
    let unix = set
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    HolderReport {
        exit: exit_code::OK,
        body: serde_json::json!({ "id": id, "deadline": unix }),
        text: id.to_string(),
        not_held: false,
    }
}

async fn answer_fork(
    count: usize,
    timeout_s: Option<u64>,
    original: &str,
    held: &mut Vec<Held>,
) -> HolderReport {
    let Some(base) = held.iter().find(|h| h.sb.id() == original) else {
        return HolderReport::failed(&SandboxError::connect(
            original,
            "the sandbox ended; its holder only keeps its forks now",
        ));
    };
    let mut options = ForkOptions::new(count);
    if let Some(s) = timeout_s {
        options = options.timeout(Duration::from_secs(s));
    }
    let base_deadline = base.deadline;
    let forks = match base.sb.fork(options).await {
        Ok(f) => f,
        Err(e) => return HolderReport::failed(&e),
    };
    let deadline = match timeout_s {
        Some(s) => Instant::now() + Duration::from_secs(s),
        None => base_deadline,
    };
    let infos: Vec<SandboxInfo> = forks.iter().map(|f| SandboxInfo::of(&**f)).collect();
    let ids: Vec<String> = forks.iter().map(|f| f.id().to_string()).collect();
    let deadline_unix = sandbox::labels::unix_now()
        .saturating_add(deadline.saturating_duration_since(Instant::now()).as_secs());
    held.extend(forks.into_iter().map(|sb| Held { sb, deadline }));
    HolderReport {
        exit: exit_code::OK,
        body: serde_json::json!({
            "sandbox": original,
            "forks": infos,
            "deadline": deadline_unix,
        }),
        text: ids.join("\n"),
        not_held: false,
    }
}

/// `sandbox fork ID`: asks the holder of a `sandbox create` session for forks with
/// memory, which that holder then keeps; prints their ids, one per line.
pub async fn fork(args: ForkArgs, out: Out) -> sandbox::Result<u8> {
    if !(1..=sandbox::MAX_FORKS).contains(&args.count) {
        return Err(SandboxError::config(
            format!(
                "--count {} is not between 1 and {}",
                args.count,
                sandbox::MAX_FORKS
            ),
            format!("ask for 1 to {} forks", sandbox::MAX_FORKS),
        ));
    }
    let found = crate::session::find(&args.id, args.engine.as_deref()).await?;
    let unreachable = |why: String| {
        SandboxError::connect(
            &found.id,
            format!(
                "{why}: forks are made by the `sandbox create` session holding the sandbox \
                 (its holder runs as root to open {CONTROL_DIR}); a sandbox created by a \
                 program is forked through that program's handle (`Sandbox::fork`, MCP \
                 `sandbox_fork`)"
            ),
        )
    };
    let request = ControlRequest::Fork {
        count: args.count,
        timeout_s: args.timeout.map(|t| t.as_secs()),
    };
    let report = {
        let _progress = out.progress("forking sandbox");
        ask(&control_path(&found.id), &request, FORK_WAIT).await
    };
    match report {
        Ok(report) => Ok(report.print(&out)),
        Err(Unanswered::Unreachable(why)) => Err(unreachable(why)),
        Err(Unanswered::Failed(e)) => Err(e),
    }
}

/// Why a holder gave no report.
enum Unanswered {
    /// No holder at the socket, or it closed without answering.
    Unreachable(String),
    /// It answered nothing readable, or not in time.
    Failed(SandboxError),
}

/// Sends `request` to the holder at `socket`; its report.
async fn ask(
    socket: &Path,
    request: &ControlRequest,
    wait: Duration,
) -> Result<HolderReport, Unanswered> {
    let mut stream = UnixStream::connect(socket).await.map_err(|e| {
        Unanswered::Unreachable(format!(
            "no holder answers for this sandbox on this host ({e})"
        ))
    })?;
    let mut line = serde_json::to_string(request).unwrap_or_default();
    line.push('\n');
    stream.write_all(line.as_bytes()).await.map_err(|e| {
        Unanswered::Unreachable(format!("the holder did not take the request ({e})"))
    })?;
    let mut answer = String::new();
    let read = tokio::time::timeout(
        wait,
        BufReader::new((&mut stream).take(CONTROL_LINE_MAX)).read_line(&mut answer),
    )
    .await;
    match read {
        Ok(Ok(n)) if n > 0 => serde_json::from_str(&answer).map_err(|e| {
            Unanswered::Failed(SandboxError::engine(
                "cli",
                format!("unreadable answer from the holder: {e}"),
            ))
        }),
        Ok(_) => Err(Unanswered::Unreachable(
            "the holder closed without answering".into(),
        )),
        Err(_) => Err(Unanswered::Failed(SandboxError::engine(
            "cli",
            format!("no answer from the holder after {} s", wait.as_secs()),
        ))),
    }
}

/// How long `sandbox extend` waits for a holder's answer (one agent round trip).
const EXTEND_WAIT: Duration = Duration::from_secs(30);

/// `sandbox extend` through the `sandbox create` session that holds sandbox `id` (its
/// own holder's socket first, then every other holder's, which may hold it as a fork).
/// `None` when no holder on this host holds it (a sandbox a program created): the
/// caller then extends through a reattached handle.
pub async fn extend(id: &str, by: Duration) -> Option<Result<HolderReport, SandboxError>> {
    let request = ControlRequest::Extend {
        id: id.to_string(),
        by_s: by.as_secs(),
    };
    let own = control_path(id);
    let mut sockets = vec![own.clone()];
    if let Ok(dir) = std::fs::read_dir(CONTROL_DIR) {
        sockets.extend(
            dir.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "sock") && *p != own),
        );
    }
    for socket in sockets {
        match ask(&socket, &request, EXTEND_WAIT).await {
            Ok(r) if r.not_held => continue,
            Ok(r) => return Some(Ok(r)),
            Err(Unanswered::Unreachable(_)) => continue,
            Err(Unanswered::Failed(e)) => return Some(Err(e)),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_one_strict_json_line() {
        let r: ControlRequest =
            serde_json::from_str(r#"{"fork":{"count":2,"timeout_s":null}}"#).unwrap();
        assert!(matches!(
            r,
            ControlRequest::Fork {
                count: 2,
                timeout_s: None
            }
        ));
        assert!(
            serde_json::from_str::<ControlRequest>(
                r#"{"fork":{"count":2,"timeout_s":null,"x":1}}"#
            )
            .is_err(),
            "an unknown field must be refused, not ignored"
        );
        assert!(serde_json::from_str::<ControlRequest>(r#"{"kill":{}}"#).is_err());
        let r: ControlRequest =
            serde_json::from_str(r#"{"extend":{"id":"abc","by_s":30}}"#).unwrap();
        assert!(matches!(r, ControlRequest::Extend { ref id, by_s: 30 } if id == "abc"));
        assert!(
            serde_json::from_str::<ControlRequest>(r#"{"extend":{"id":"abc"}}"#).is_err(),
            "an extend without its seconds must be refused"
        );
    }

    #[test]
    fn the_socket_is_named_by_the_full_id() {
        assert_eq!(
            control_path("abc123"),
            PathBuf::from("/run/sandbox-rs/holder/abc123.sock")
        );
    }
}
