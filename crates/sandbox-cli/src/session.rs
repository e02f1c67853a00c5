//! Sandboxes that outlive one command: `create`, `exec`, `cp`, `ls`, `kill`.
//!
//! A sandbox is owned by the process that made it: its labels name that process, other
//! sandbox-rs processes on the host sweep it as soon as the owner is gone, and dropping its
//! handle kills it. So `sandbox create` does not create the sandbox itself: it starts a
//! *holder* ([`crate::holder`]) — this binary again, detached in its own process group
//! with no terminal — that creates the sandbox, reports its id back through a pipe, and
//! then keeps the handle (and the ownership) until `sandbox kill`, the `--timeout`
//! lifetime, or SIGTERM to the holder. `sandbox fork` asks that holder for forks.
//! `sandbox extend` moves the lifetime from another process through the host's record of
//! the deadline in force, which the holder's poll reads (and reads again before it ends
//! the sandbox).
//! Until the parent acknowledges the id, the holder kills the sandbox if the parent goes
//! away (Ctrl-C during `create` leaves nothing behind).
//!
//! `exec` and `cp` reattach with `connect` and must not kill what they did not create:
//! their handles are [`Borrowed`].

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use sandbox::labels::LABEL_DEADLINE;
use sandbox::{Backend, CreateOptions, ManagedSandbox, Sandbox, SandboxError, SandboxState};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::cli::{
    CpArgs, CreateArgs, EgressArgs, ExecArgs, ExtendArgs, KillArgs, LsArgs, NetworkArg,
};
use crate::exit_code;
use crate::holder::{ACK, HOLDER_ENV, HolderReport};
use crate::output::{Out, error_json};
use crate::run::{SandboxInfo, execute, report};

/// How long `create` waits for the holder to report (image pulls can be slow).
const CREATE_WAIT: Duration = Duration::from_secs(300);
/// Bound on listing one engine.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// `sandbox create` (the parent side): starts the holder and relays its report.
pub async fn create(args: CreateArgs, out: Out) -> sandbox::Result<u8> {
    // The relay answers on the channel of the process that holds the sandbox, and the
    // first `sandbox exec` takes that channel over: a socket that stops answering then
    // would be a setting silently dropped, so it is refused here.
    if !args.sandbox.ssh_agent.is_empty() {
        return Err(SandboxError::config(
            "--ssh-agent works with `sandbox run`, not `sandbox create`: the relay lives in \
             the process holding the sandbox's agent channel, which `sandbox exec` takes over",
            "use `sandbox run --ssh-agent[=KEY] DSN -- CMD`, or the library's \
             CreateOptions::ssh_agent with one handle for the sandbox's whole life",
        ));
    }
    // The gate serves on the same channel: the same reason.
    if !args.sandbox.git_repo.is_empty() {
        return Err(SandboxError::config(
            "--git-repo works with `sandbox run`, not `sandbox create`: the gate lives in the \
             process holding the sandbox's agent channel, which `sandbox exec` takes over",
            "use `sandbox run --git-repo PATH[:rw] DSN -- CMD`, or the library's \
             CreateOptions::git_repo with one handle for the sandbox's whole life",
        ));
    }
    // Validate here so usage errors come back fast, without a holder.
    let (_, _) = crate::target::resolve(&args.dsn, &args.sandbox, create_base(&args))?;
    let exe = std::env::current_exe()
        .map_err(|e| holder_error(format!("cannot find this binary: {e}")))?;
    let mut child = tokio::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(HOLDER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Not inherited: a holder holding our stderr open would hang `$(sandbox create …)`
        // and any caller that reads to EOF.
        .stderr(Stdio::null())
        // Its own group: Ctrl-C in this terminal must not reach it once it holds a sandbox.
        .process_group(0)
        .spawn()
        .map_err(|e| holder_error(format!("cannot start the holder process: {e}")))?;
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(holder_error("the holder process has no pipes".into()));
    };
    let mut line = String::new();
    let read = {
        let _progress = out.progress("creating sandbox");
        tokio::time::timeout(CREATE_WAIT, BufReader::new(stdout).read_line(&mut line)).await
    };
    let report: HolderReport = match read {
        Ok(Ok(n)) if n > 0 => serde_json::from_str(&line)
            .map_err(|e| holder_error(format!("unreadable report from the holder: {e}")))?,
        Ok(_) => return Err(holder_error("the holder exited without reporting".into())),
        Err(_) => {
            return Err(holder_error(format!(
                "no sandbox after {} s",
                CREATE_WAIT.as_secs()
            )));
        }
    };
    if report.exit == exit_code::OK {
        // From here on the holder keeps the sandbox; failing to ack makes it kill it.
        stdin
            .write_all(format!("{ACK}\n").as_bytes())
            .await
            .map_err(|e| holder_error(format!("cannot hand the sandbox over: {e}")))?;
    }
    drop(stdin);
    Ok(report.print(&out))
}

fn holder_error(message: String) -> SandboxError {
    SandboxError::engine("cli", message)
}

pub(crate) fn create_base(args: &CreateArgs) -> CreateOptions {
    let mut o = CreateOptions::default();
    for (k, v) in &args.labels {
        o = o.metadata(k.clone(), v.clone());
    }
    if let Some(idle) = args.idle_timeout {
        o = o.idle_timeout(idle);
    }
    if let Some(max) = args.max_lifetime {
        o = o.max_lifetime(max);
    }
    // Last, so a user label cannot pass for the CLI's own.
    o.timeout(
        args.timeout
            .unwrap_or(crate::target::DEFAULT_SESSION_LIFETIME),
    )
    .metadata("tool", "sandbox-cli")
    .metadata("command", "create")
}

/// The brokered credentials of a create as `--json` shows them: the variable, the hosts
/// and the placement, never the secret.
pub(crate) fn credentials_json(creds: &[sandbox::Credential]) -> serde_json::Value {
    creds
        .iter()
        .map(|c| {
            serde_json::json!({
                "env_var": c.env_var,
                "hosts": c.hosts,
                "placement": c.placement.to_string(),
            })
        })
        .collect()
}

/// A handle from `connect`. Dropping it must not kill a sandbox this process does not own,
/// and the `Sandbox` port has no way to give a handle up, so it is never dropped (a few
/// hundred bytes, once per command, in a process about to exit).
struct Borrowed(std::mem::ManuallyDrop<Box<dyn Sandbox>>);

impl Borrowed {
    fn get(&self) -> &dyn Sandbox {
        &**self.0
    }
}

/// A sandbox found on an engine.
pub(crate) struct Found {
    scheme: String,
    backend: Arc<dyn Backend>,
    /// The full id.
    pub(crate) id: String,
    /// The runtime it was created with (its label), when known.
    runtime: Option<String>,
}

/// The label naming the OCI runtime a container sandbox was created with.
const LABEL_RUNTIME: &str = "io.sandbox-rs.runtime";

/// Finds `id` (or a unique prefix of it) on `engine`, or on every compiled-in engine.
pub(crate) async fn find(id: &str, engine: Option<&str>) -> sandbox::Result<Found> {
    if id.is_empty() {
        return Err(SandboxError::config(
            "empty sandbox id",
            "pass the id `sandbox create` printed",
        ));
    }
    let schemes = match engine {
        Some(e) => vec![e.to_string()],
        None => sandbox::schemes(),
    };
    let listings = list_all(&schemes).await;
    let mut matches = Vec::new();
    let mut errors = Vec::new();
    for (scheme, listing) in listings {
        match listing {
            Ok((backend, items)) => {
                for m in items.into_iter().filter(|m| m.id.starts_with(id)) {
                    if m.id == id {
                        return Ok(Found {
                            scheme,
                            backend,
                            runtime: m.labels.get(LABEL_RUNTIME).cloned(),
                            id: m.id,
                        });
                    }
                    matches.push(Found {
                        scheme: scheme.clone(),
                        backend: backend.clone(),
                        runtime: m.labels.get(LABEL_RUNTIME).cloned(),
                        id: m.id,
                    });
                }
            }
            Err(e) => errors.push(format!("{scheme}: {}", e.code())),
        }
    }
    match matches.len() {
        1 => Ok(matches.remove(0)),
        0 => {
            let unreachable = if errors.is_empty() {
                String::new()
            } else {
                format!(" (not checked: {})", errors.join(", "))
            };
            Err(SandboxError::connect(
                id,
                format!(
                    "no sandbox with this id on {}{unreachable}; list them with `sandbox ls`",
                    schemes.join(", ")
                ),
            ))
        }
        n => Err(SandboxError::config(
            format!("sandbox id prefix {id:?} matches {n} sandboxes"),
            "give more characters of the id (`sandbox ls`)",
        )),
    }
}

type Listing = sandbox::Result<(Arc<dyn Backend>, Vec<ManagedSandbox>)>;

/// Lists every engine concurrently, each bounded by [`LIST_TIMEOUT`].
async fn list_all(schemes: &[String]) -> Vec<(String, Listing)> {
    let lists = schemes.iter().map(|s| async move {
        let listing = tokio::time::timeout(LIST_TIMEOUT, list_one(s))
            .await
            .unwrap_or_else(|_| {
                Err(SandboxError::engine_unavailable(
                    s.clone(),
                    "unknown",
                    format!(
                        "the {s} engine did not answer within {} s",
                        LIST_TIMEOUT.as_secs()
                    ),
                ))
            });
        (s.clone(), listing)
    });
    futures::future::join_all(lists).await
}

async fn list_one(scheme: &str) -> Listing {
    let backend = sandbox::backend(format!("{scheme}://").as_str()).await?;
    let reapable = backend.as_reapable().ok_or_else(|| {
        SandboxError::config(
            format!("backend `{scheme}` cannot list its sandboxes"),
            "use the engine's own tooling",
        )
    })?;
    let items = reapable.list_managed(&BTreeMap::new()).await?;
    Ok((backend, items))
}

/// Reattaches to `found`, through a backend configured for the runtime the sandbox was
/// made with: the engine's default backend declares its own runtime's isolation and
/// refuses a sandbox of another (one made with `create --runtime runsc`).
async fn connect(found: &Found) -> sandbox::Result<Borrowed> {
    let runsc = found.runtime.as_deref() == Some("runsc");
    let sb = if runsc {
        let target = crate::target::runtime_target(&found.scheme, crate::cli::RuntimeArg::Runsc)?;
        sandbox::connect(target, &found.id).await?
    } else {
        sandbox::connect(format!("{}://", found.scheme).as_str(), &found.id).await?
    };
    Ok(Borrowed(std::mem::ManuallyDrop::new(sb)))
}

/// `sandbox exec ID -- CMD…`.
pub async fn exec(args: ExecArgs, out: Out) -> sandbox::Result<u8> {
    // Secrets and stdin first: a usage error must not wait for engines.
    let mut secrets = Vec::new();
    for name in &args.secrets {
        secrets.push((name.clone(), crate::secret_env::read(name)?));
    }
    let input = if crate::stdin::wanted(args.interactive) {
        crate::stdin::read_all().await?
    } else {
        Vec::new()
    };
    let found = find(&args.id, args.engine.as_deref()).await?;
    let started = Instant::now();
    let sb = connect(&found).await?;
    let sb = sb.get();
    let info = SandboxInfo::of(sb);
    let mut options = sandbox::RunOptions::default();
    if let Some(t) = args.timeout {
        options = options.timeout(t);
    }
    for (k, v) in &args.env {
        options = options.env(k.clone(), v.clone());
    }
    // A reattached handle holds no secrets (they are never stored engine-side), so they
    // go to this one process only.
    for (name, value) in secrets {
        options = options.env(name, value);
    }
    let options = crate::stdin::given(options, input);
    let result = execute(
        sb,
        sandbox::Command::Argv(args.cmd.clone()),
        options,
        out,
        args.raw,
    )
    .await;
    report(out, info, started, result)
}

/// `ID:PATH` in a sandbox, or `None` for a host path. A host path with a colon is written
/// with a `/` before it (`./a:b`).
fn sandbox_path(arg: &str) -> Option<(&str, &str)> {
    let (id, path) = arg.split_once(':')?;
    (!id.is_empty() && !id.contains('/') && !path.is_empty()).then_some((id, path))
}

#[derive(Serialize)]
struct CpReport<'a> {
    sandbox: SandboxInfo,
    direction: &'a str,
    from: &'a str,
    to: &'a str,
}

/// `sandbox cp SRC DEST`: exactly one side is `ID:PATH`.
pub async fn cp(args: CpArgs, out: Out) -> sandbox::Result<u8> {
    let (id, upload, remote, local) = match (sandbox_path(&args.src), sandbox_path(&args.dest)) {
        (None, Some((id, path))) => (id, true, path, args.src.as_str()),
        (Some((id, path)), None) => (id, false, path, args.dest.as_str()),
        _ => {
            return Err(SandboxError::config(
                "exactly one of SRC and DEST must be in a sandbox (ID:PATH)",
                "e.g. `sandbox cp data.csv ID:/work/data.csv` or `sandbox cp ID:/work/out.txt out.txt`",
            ));
        }
    };
    let found = find(id, args.engine.as_deref()).await?;
    let sb = connect(&found).await?;
    let sb = sb.get();
    let files = sb.files()?;
    if upload {
        files.upload(Path::new(local), remote).await?;
    } else {
        files.download(remote, Path::new(local)).await?;
    }
    if out.json {
        out.json_value(&CpReport {
            sandbox: SandboxInfo::of(sb),
            direction: if upload { "upload" } else { "download" },
            from: &args.src,
            to: &args.dest,
        });
    }
    Ok(exit_code::OK)
}

/// One line of `sandbox ls`.
#[derive(Serialize)]
struct LsEntry {
    id: String,
    backend: String,
    /// `running`, `paused` or `stopped` (`sandbox stop`: kept until `sandbox start`, a
    /// kill or its deadline).
    state: &'static str,
    created_at: Option<u64>,
    age_s: Option<u64>,
    /// The deadline in force (Unix seconds): the one set at create, or where an
    /// extension moved it (`sandbox extend`, `Sandbox::extend` in any process on this
    /// host), up to `max_deadline`.
    deadline: Option<u64>,
    expires_in_s: Option<u64>,
    /// The latest deadline extensions can reach (`CreateOptions::max_lifetime`); equal to
    /// `deadline` when the lifetime cannot be extended.
    max_deadline: Option<u64>,
    /// The idle limit in seconds (`CreateOptions::idle_timeout`), if any.
    idle_timeout_s: Option<u64>,
    /// How the creator's commands go: `agent`, `exec` (the engine's exec path), or `-`
    /// for a backend without an agent.
    exec_path: String,
    /// The egress policy in force (`Sandbox::egress`), `None` where the backend cannot
    /// say (no `LIVE_EGRESS`) or did not answer in time.
    egress: Option<String>,
    /// The git gate's clone URLs (`--git-repo`), without the token: commands inside the
    /// sandbox have them with it in `$SANDBOX_GIT_URL`, `$SANDBOX_GIT_URL_1`, ….
    #[serde(skip_serializing_if = "Vec::is_empty")]
    git_urls: Vec<String>,
    labels: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct LsReport {
    sandboxes: Vec<LsEntry>,
    /// Engines that could not be listed: `{engine, error}`.
    skipped: Vec<serde_json::Value>,
}

/// The `STATE` of a listed sandbox; `None` for one being created or in an unknown state.
fn ls_state(state: SandboxState) -> Option<&'static str> {
    match state {
        SandboxState::Running => Some("running"),
        SandboxState::Paused => Some("paused"),
        SandboxState::Stopped => Some("stopped"),
        _ => None,
    }
}

/// `sandbox ls`: live (running, paused or stopped) sandboxes on every reachable engine.
pub async fn ls(args: LsArgs, out: Out) -> sandbox::Result<u8> {
    let schemes = if args.engines.is_empty() {
        sandbox::schemes()
    } else {
        args.engines.clone()
    };
    let now = SystemTime::now();
    let now_unix = sandbox::labels::unix_now();
    let mut report = LsReport {
        sandboxes: Vec::new(),
        skipped: Vec::new(),
    };
    for (scheme, listing) in list_all(&schemes).await {
        match listing {
            Ok((_, items)) => report.sandboxes.extend(
                items
                    .into_iter()
                    .filter_map(|m| ls_state(m.state).map(|state| (state, m)))
                    .map(|(state, m)| {
                        let deadline = deadline_unix(&m);
                        let label_secs =
                            |k: &str| m.labels.get(k).and_then(|v| v.parse::<u64>().ok());
                        LsEntry {
                            state,
                            max_deadline: sandbox::labels::latest_deadline(&m.labels),
                            idle_timeout_s: label_secs(sandbox::labels::LABEL_IDLE_TIMEOUT),
                            created_at: m
                                .created_at
                                .and_then(|c| c.duration_since(SystemTime::UNIX_EPOCH).ok())
                                .map(|d| d.as_secs()),
                            age_s: m
                                .created_at
                                .and_then(|c| now.duration_since(c).ok())
                                .map(|d| d.as_secs()),
                            expires_in_s: deadline.map(|d| d.saturating_sub(now_unix)),
                            deadline,
                            exec_path: m
                                .labels
                                .get(sandbox::labels::LABEL_EXEC_PATH)
                                .cloned()
                                .unwrap_or_else(|| "-".into()),
                            id: m.id,
                            backend: m.backend,
                            egress: None,
                            git_urls: m
                                .labels
                                .get(sandbox::git_gate::LABEL_GIT_GATE)
                                .map(|u| u.split_whitespace().map(String::from).collect())
                                .unwrap_or_default(),
                            labels: m.labels,
                        }
                    }),
            ),
            Err(e) => {
                let mut err = error_json(&e);
                err["engine"] = serde_json::Value::String(scheme);
                report.skipped.push(err);
            }
        }
    }
    report
        .sandboxes
        .sort_by(|a, b| (&a.backend, a.created_at).cmp(&(&b.backend, b.created_at)));
    // Each sandbox's policy in force, read from where the library keeps it (all at once,
    // each bounded: one slow engine must not hold the listing).
    let policies = futures::future::join_all(report.sandboxes.iter().map(|s| async move {
        let read = async {
            if let Some(recorded) = recorded_policy(&s.backend, &s.id) {
                return recorded;
            }
            let sb = sandbox::connect(format!("{}://", s.backend).as_str(), &s.id).await?;
            // Borrowed: a handle reattached to read must not kill what it did not create.
            let sb = Borrowed(std::mem::ManuallyDrop::new(sb));
            sb.get().egress().await
        };
        match tokio::time::timeout(Duration::from_secs(3), read).await {
            Ok(Ok(e)) => Some(e.to_string()),
            _ => None,
        }
    }))
    .await;
    for (s, p) in report.sandboxes.iter_mut().zip(policies) {
        s.egress = p;
    }
    if out.json {
        out.json_value(&report);
        return Ok(exit_code::OK);
    }
    for s in &report.skipped {
        // Engines that are not running are normal here; say so on stderr only.
        let code = s["error"]["code"].as_str().unwrap_or("?");
        out.note(format!(
            "{} {}: {code}",
            out.yellow("skipped"),
            s["engine"].as_str().unwrap_or("?")
        ));
    }
    if report.sandboxes.is_empty() {
        out.note("no live sandboxes");
        return Ok(exit_code::OK);
    }
    out.line(format!(
        "{:<14} {:<8} {:<8} {:>6} {:>9} {:>9} {:>5} {:<6}  {:<24}  {}",
        "ID", "ENGINE", "STATE", "AGE", "EXPIRES", "MAX", "IDLE", "PATH", "EGRESS", "COMMAND"
    ));
    for s in &report.sandboxes {
        let short: String = s.id.chars().take(12).collect();
        let tool = s
            .labels
            .get("io.sandbox-rs.meta.command")
            .map(String::as_str)
            .unwrap_or("-");
        // MAX: how far extensions can take it, "-" when the deadline is final.
        let max = match (s.max_deadline, s.deadline) {
            (Some(m), Some(d)) if m > d => format!("in {}", human_secs(m.saturating_sub(now_unix))),
            (Some(_), Some(_)) => "-".into(),
            _ => "?".into(),
        };
        let egress = s.egress.as_deref().unwrap_or("-");
        out.line(format!(
            "{:<14} {:<8} {:<8} {:>6} {:>9} {:>9} {:>5} {:<6}  {:<24}  {}",
            crate::terminal::escape_text(&short),
            crate::terminal::escape_text(&s.backend),
            s.state,
            s.age_s.map(human_secs).unwrap_or_else(|| "?".into()),
            s.expires_in_s
                .map(|e| format!("in {}", human_secs(e)))
                .unwrap_or_else(|| "?".into()),
            max,
            s.idle_timeout_s
                .map(human_secs)
                .unwrap_or_else(|| "-".into()),
            crate::terminal::escape_text(&s.exec_path),
            crate::terminal::escape_text(egress),
            crate::terminal::escape_text(tool),
        ));
    }
    Ok(exit_code::OK)
}

/// The deadline in force of a listed sandbox, Unix seconds: the backend's (which follows
/// extensions), else the label of create.
fn deadline_unix(m: &ManagedSandbox) -> Option<u64> {
    match m.deadline {
        Some(d) => d
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs()),
        None => m
            .labels
            .get(LABEL_DEADLINE)
            .and_then(|d| d.parse::<u64>().ok()),
    }
}

fn human_secs(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// `sandbox kill ID`.
pub async fn kill(args: KillArgs, out: Out) -> sandbox::Result<u8> {
    let found = find(&args.id, args.engine.as_deref()).await?;
    let reapable = found.backend.as_reapable().ok_or_else(|| {
        SandboxError::config(
            format!("backend `{}` cannot kill by id", found.scheme),
            "use the engine's own tooling",
        )
    })?;
    let killed = reapable.kill_managed(&found.id).await?;
    if out.json {
        out.json_value(&serde_json::json!({
            "id": found.id,
            "backend": found.scheme,
            "killed": killed,
        }));
    } else {
        out.line(&found.id);
    }
    Ok(exit_code::OK)
}

/// `sandbox egress ID [--deny | --allow] [--allow-host H…] [--deny-host H…]
/// [--except-host H…] [--host-port P…]`: with no policy flag, prints the policy in force; with one,
/// replaces it (in force when this returns) and prints the policy read back.
pub async fn egress(args: EgressArgs, out: Out) -> sandbox::Result<u8> {
    let wanted = if args.deny {
        Some(sandbox::Egress::Deny)
    } else if args.allow || !args.hosts.is_empty() {
        let network = if args.allow {
            NetworkArg::Allow
        } else {
            NetworkArg::Closed
        };
        Some(crate::target::egress_of(network, &args.hosts)?)
    } else {
        None
    };
    let found = find(&args.id, args.engine.as_deref()).await?;
    let sb = connect(&found).await?;
    let sb = sb.get();
    if let Some(e) = wanted {
        sb.set_egress(e).await?;
    }
    let now = sb.egress().await?;
    if out.json {
        out.json_value(&serde_json::json!({
            "id": found.id,
            "backend": found.scheme,
            "egress": egress_json(&now),
            "policy": now.to_string(),
        }));
    } else {
        out.line(crate::terminal::escape_text(&now.to_string()));
    }
    Ok(exit_code::OK)
}

/// The policy as JSON: `{"default": "deny"|"allow", "allow": […], "deny": […], "except":
/// […], "host_ports": […]}`, the same shape for every policy.
fn egress_json(e: &sandbox::Egress) -> serde_json::Value {
    let Ok(t) = e.tiers() else {
        return serde_json::Value::Null;
    };
    let list = |l: &[sandbox::EgressRule]| -> Vec<String> {
        l.iter().map(|r| r.as_str().to_string()).collect()
    };
    serde_json::json!({
        "default": if t.default == sandbox::EgressDefault::Allow { "allow" } else { "deny" },
        "allow": list(&t.allow),
        "deny": list(&t.deny),
        "except": list(&t.except),
        "host_ports": t.host_ports.iter().map(|p| p.get()).collect::<Vec<u16>>(),
    })
}

/// `sandbox pause ID` (`pause`) or `sandbox resume ID`.
pub async fn pause_or_resume(args: KillArgs, pause: bool, out: Out) -> sandbox::Result<u8> {
    let found = find(&args.id, args.engine.as_deref()).await?;
    let sb = connect(&found).await?;
    let sb = sb.get();
    if pause {
        sb.pause().await?;
    } else {
        sb.resume().await?;
    }
    if out.json {
        out.json_value(&serde_json::json!({
            "id": found.id,
            "backend": found.scheme,
            "state": if pause { "paused" } else { "running" },
        }));
    } else {
        out.line(&found.id);
    }
    Ok(exit_code::OK)
}

/// `sandbox stop ID` (`stop`) or `sandbox start ID`. The session's holder keeps the
/// sandbox while it is stopped (it lets go only when the sandbox is gone).
pub async fn stop_or_start(args: KillArgs, stop: bool, out: Out) -> sandbox::Result<u8> {
    let found = find(&args.id, args.engine.as_deref()).await?;
    let sb = connect(&found).await?;
    let sb = sb.get();
    if stop {
        sb.stop().await?;
    } else {
        sb.start().await?;
    }
    if out.json {
        out.json_value(&serde_json::json!({
            "id": found.id,
            "backend": found.scheme,
            "state": if stop { "stopped" } else { "running" },
        }));
    } else {
        out.line(&found.id);
    }
    Ok(exit_code::OK)
}

/// `sandbox extend ID S`: moves the deadline through a reattached handle. The extension
/// is recorded on this host, so the session's holder (and every other process) follows
/// it: the holder ends the sandbox at the new deadline, not the one of create.
pub async fn extend(args: ExtendArgs, out: Out) -> sandbox::Result<u8> {
    let found = find(&args.id, args.engine.as_deref()).await?;
    // A `sandbox create` session's holder extends through the handle that holds the
    // agent (on either engine, without taking it over).
    let deadline = match crate::holder::extend(&found.id, args.by).await {
        Some(report) => {
            let report = report?;
            if report.exit != exit_code::OK {
                return Ok(report.print(&out));
            }
            let unix = report.body["deadline"].as_u64().ok_or_else(|| {
                SandboxError::engine("cli", "the holder's answer names no deadline")
            })?;
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix)
        }
        None => extend_reattached(&found, args.by).await?,
    };
    let unix = deadline
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let left = unix.saturating_sub(sandbox::labels::unix_now());
    if out.json {
        out.json_value(&serde_json::json!({
            "id": found.id,
            "backend": found.scheme,
            "deadline": unix,
            "expires_in_s": left,
        }));
    } else {
        out.line(format!("{} expires in {}", found.id, human_secs(left)));
    }
    Ok(exit_code::OK)
}

/// Extends a sandbox no holder on this host holds, through a reattached handle.
async fn extend_reattached(
    found: &Found,
    by: std::time::Duration,
) -> sandbox::Result<std::time::SystemTime> {
    let sb = connect(found).await?;
    let sb = sb.get();
    sb.extend(by).await.map_err(|e| match e {
        // The library's hint names the API; say how to get there from here.
        SandboxError::ResourceLimitExceeded { limit, .. } => SandboxError::resource_limit(
            limit,
            Some(
                "extend by less, or create the sandbox with a longer `sandbox create --max-lifetime S` (at most 86400)"
                    .into(),
            ),
        ),
        // A handle reattached on Podman keeps to the engine's exec path (an attach that
        // ends would end the agent), so it cannot move the agent's deadline: only the
        // program that created the sandbox (or a `sandbox create` holder) can.
        SandboxError::CapabilityNotSupported {
            capability,
            backend,
            ..
        } if backend == "podman" => {
            SandboxError::capability_not_supported(capability, backend, vec!["docker".into()])
        }
        e => e,
    })
}

/// The egress policy of a container engine's sandbox, read from this host's record without
/// reattaching: a reattached Docker handle takes the in-sandbox agent over, which would end
/// the session of the program holding the sandbox. `None` for other backends (the fake's
/// policy lives in its handle).
fn recorded_policy(backend: &str, id: &str) -> Option<sandbox::Result<sandbox::Egress>> {
    match backend {
        #[cfg(feature = "docker")]
        "docker" => Some(sandbox::docker::recorded_policy(backend, id)),
        #[cfg(feature = "podman")]
        "podman" => Some(sandbox::podman::recorded_policy(backend, id)),
        _ => {
            let _ = id;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths() {
        assert_eq!(sandbox_path("abc:/work/x"), Some(("abc", "/work/x")));
        assert_eq!(sandbox_path("abc:rel"), Some(("abc", "rel")));
        assert_eq!(sandbox_path("./a:b"), None);
        assert_eq!(sandbox_path("/tmp/a:b"), None);
        assert_eq!(sandbox_path("plain"), None);
        assert_eq!(sandbox_path(":x"), None);
        assert_eq!(sandbox_path("id:"), None);
    }
}
