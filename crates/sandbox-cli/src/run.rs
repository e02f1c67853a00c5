//! `sandbox run DSN -- CMD…`: one command in a fresh sandbox.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sandbox::options::DEFAULT_OUTPUT_CAP;
use sandbox::{Command, CreateOptions, ErrorCode, RunOptions, SandboxError, StreamKind};
use serde::Serialize;

use crate::cli::RunArgs;
use crate::exit_code;
use crate::output::{Out, ms};
use crate::terminal::TerminalEscaper;

/// Default command timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The sandbox outlives the command by this much, so a command timeout is reported as
/// `ExecutionTimeout`, never as the sandbox's lifetime running out.
const LIFETIME_MARGIN: Duration = Duration::from_secs(30);

/// Which sandbox, in `--json` reports.
#[derive(Serialize)]
pub(crate) struct SandboxInfo {
    id: String,
    backend: String,
    tier: String,
    /// Which way this handle's commands go: `agent` (the in-sandbox agent) or `exec` (the
    /// engine's exec path, or a backend without an agent).
    exec_path: &'static str,
    /// The git gate's clone URLs (`--git-repo`), without the token: commands inside have
    /// them with it in `$SANDBOX_GIT_URL`, `$SANDBOX_GIT_URL_1`, ….
    #[serde(skip_serializing_if = "Vec::is_empty")]
    git_urls: Vec<String>,
}

impl SandboxInfo {
    pub(crate) fn of(sb: &dyn sandbox::Sandbox) -> Self {
        SandboxInfo {
            id: sb.id().to_string(),
            backend: sb.backend().to_string(),
            tier: sb.isolation().to_string(),
            exec_path: exec_path(sb.capabilities()),
            git_urls: Vec::new(),
        }
    }

    /// With the git gate's URLs (no token) of the repositories the sandbox was given.
    pub(crate) fn with_git_urls(mut self, urls: Vec<String>) -> Self {
        self.git_urls = urls;
        self
    }
}

/// `agent` when a sandbox with `caps` runs its commands through the in-sandbox agent, else
/// `exec`.
pub(crate) fn exec_path(caps: sandbox::Capability) -> &'static str {
    if caps.contains(sandbox::Capability::AGENT) {
        "agent"
    } else {
        "exec"
    }
}

/// `run --json` payload.
#[derive(Serialize)]
struct RunReport {
    sandbox: SandboxInfo,
    exit_code: Option<i64>,
    timed_out: bool,
    stdout: String,
    stderr: String,
    truncated: bool,
    duration_ms: u64,
}

pub async fn run(args: RunArgs, out: Out) -> sandbox::Result<u8> {
    let timeout = args.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let base = CreateOptions::default()
        .timeout(timeout + LIFETIME_MARGIN)
        .metadata("tool", "sandbox-cli")
        .metadata("command", "run");
    let (target, mut options) = crate::target::resolve(&args.dsn, &args.sandbox, base)?;
    for name in &args.secrets {
        options = options.secret(name.clone(), crate::secret_env::read(name)?);
    }
    let git_urls = sandbox::git_gate::public_urls(&options.git_repos);
    // Read before creating, so a bad or oversized stdin costs no sandbox. (With a
    // terminal, stdin is typed in live instead.)
    let input = if !args.tty && crate::stdin::wanted(args.interactive) {
        crate::stdin::read_all().await?
    } else {
        Vec::new()
    };
    let started = Instant::now();
    let sb = {
        let _progress = out.progress("creating sandbox");
        let options = crate::target::require_agent_where_offered(
            options,
            &target,
            args.sandbox.allow_engine_exec,
        )
        .await?;
        sandbox::create(target, options).await?
    };
    let info = SandboxInfo::of(&*sb).with_git_urls(git_urls);
    let result = if args.tty {
        crate::tty::session(&*sb, Command::Argv(args.cmd.clone()), timeout)
            .await
            .map(|code| (code, Captured::default()))
    } else {
        execute(
            &*sb,
            Command::Argv(args.cmd.clone()),
            crate::stdin::given(RunOptions::default().timeout(timeout), input),
            out,
            args.raw,
        )
        .await
    };
    // Tear down before reporting; a teardown failure never hides the command's outcome.
    if let Err(e) = sb.kill().await {
        out.note(format!(
            "warning: {}",
            crate::terminal::escape_text(&e.render())
        ));
    }
    drop(sb);
    report(out, info, started, result)
}

/// The exit status of `run` and `exec` (and their `--json` report).
pub(crate) fn report(
    out: Out,
    info: SandboxInfo,
    started: Instant,
    result: sandbox::Result<(i64, Captured)>,
) -> sandbox::Result<u8> {
    let duration_ms = ms(started.elapsed());
    let (exit_code, timed_out, captured) = match result {
        Ok((code, captured)) => (Some(code), false, captured),
        Err(e) if e.code() == ErrorCode::ExecutionTimeout => {
            if !out.json {
                out.error(&e);
                return Ok(exit_code::TIMEOUT);
            }
            (None, true, Captured::default())
        }
        Err(e) => return Err(e),
    };
    if out.json {
        out.json_value(&RunReport {
            sandbox: info,
            exit_code,
            timed_out,
            stdout: String::from_utf8_lossy(&captured.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&captured.stderr).into_owned(),
            truncated: captured.truncated,
            duration_ms,
        });
    }
    Ok(match exit_code {
        None => exit_code::TIMEOUT,
        Some(c) => u8::try_from(c).unwrap_or(exit_code::FAILURE),
    })
}

/// Output kept for `--json`, capped per stream.
#[derive(Default)]
pub(crate) struct Captured {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
}

impl Captured {
    fn push(&mut self, kind: StreamKind, data: &[u8]) {
        let buf = match kind {
            StreamKind::Stdout => &mut self.stdout,
            StreamKind::Stderr => &mut self.stderr,
        };
        let room = DEFAULT_OUTPUT_CAP.saturating_sub(buf.len());
        if data.len() > room {
            self.truncated = true;
        }
        buf.extend_from_slice(&data[..data.len().min(room)]);
    }
}

/// Streams the command's output live (or captures it for `--json`) and returns its exit
/// code. Falls back to a buffered `run` on backends without `STREAMING`.
pub(crate) async fn execute(
    sb: &dyn sandbox::Sandbox,
    cmd: Command,
    options: RunOptions,
    out: Out,
    raw: bool,
) -> sandbox::Result<(i64, Captured)> {
    let mut captured = Captured::default();
    let mut live = LiveOutput::new(raw);
    let mut process = match sb.stream(cmd.clone(), options.clone()) {
        Ok(p) => p,
        Err(SandboxError::CapabilityNotSupported { .. }) => {
            let r = sb.run(cmd, options).await?;
            if out.json {
                captured.push(StreamKind::Stdout, &r.stdout);
                captured.push(StreamKind::Stderr, &r.stderr);
            } else {
                live.write(StreamKind::Stdout, &r.stdout);
                live.write(StreamKind::Stderr, &r.stderr);
                live.finish();
            }
            return Ok((r.exit_code, captured));
        }
        Err(e) => return Err(e),
    };
    while let Some(chunk) = process.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                live.finish();
                return Err(e);
            }
        };
        if out.json {
            captured.push(chunk.stream, &chunk.data);
        } else {
            live.write(chunk.stream, &chunk.data);
        }
    }
    live.finish();
    let r = process.wait().await?;
    Ok((r.exit_code, captured))
}

/// The sandbox's output on our stdout/stderr: escaped for a terminal (see
/// [`crate::terminal`]) unless `--raw`, byte for byte into pipes and files.
struct LiveOutput {
    /// `None`: raw.
    stdout: Option<TerminalEscaper>,
    stderr: Option<TerminalEscaper>,
}

impl LiveOutput {
    fn new(raw: bool) -> Self {
        let escaper = |tty: bool| (tty && !raw).then(TerminalEscaper::default);
        LiveOutput {
            stdout: escaper(std::io::stdout().is_terminal()),
            stderr: escaper(std::io::stderr().is_terminal()),
        }
    }

    fn write(&mut self, kind: StreamKind, data: &[u8]) {
        let escaper = match kind {
            StreamKind::Stdout => &mut self.stdout,
            StreamKind::Stderr => &mut self.stderr,
        };
        match escaper {
            Some(e) => write_to(kind, &e.push(data)),
            None => write_to(kind, data),
        }
    }

    /// Flushes a character held back at the end of either stream.
    fn finish(&mut self) {
        if let Some(e) = &mut self.stdout {
            write_to(StreamKind::Stdout, &e.finish());
        }
        if let Some(e) = &mut self.stderr {
            write_to(StreamKind::Stderr, &e.finish());
        }
    }
}

fn write_to(kind: StreamKind, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    // Errors (a closed pipe) are ignored: the command keeps its exit code.
    match kind {
        StreamKind::Stdout => {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(data).and_then(|_| o.flush());
        }
        StreamKind::Stderr => {
            let mut e = std::io::stderr().lock();
            let _ = e.write_all(data).and_then(|_| e.flush());
        }
    }
}
