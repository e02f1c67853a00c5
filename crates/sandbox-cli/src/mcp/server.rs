//! The MCP server's tools (rmcp's tool router): `sandbox_create`, `sandbox_run`,
//! `sandbox_run_code`, `sandbox_write_file`, `sandbox_read_file`, `sandbox_list_files`,
//! `sandbox_pause`, `sandbox_resume`, `sandbox_stop`, `sandbox_start`, `sandbox_extend`,
//! `sandbox_fork`, `sandbox_set_egress`, `sandbox_kill`, with the bounds a model's
//! requests are held to (lifetime and its extensions, resources,
//! sandbox count, output size), the operator's [`Policy`] with the server's total
//! [`Budget`], and who may use which sandbox: the session that created it, alone. The
//! server keeps a registry of every sandbox it created so that the transport serving it
//! (the sibling `stdio` and `http` modules) can kill them all when it stops.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, InitializeRequestParams, InitializeResult, ProtocolVersion,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_handler, tool_router};
use sandbox::{
    CodeOptions, Command, CreateOptions, NetworkPolicy, Resources, RunOptions, Sandbox,
    SandboxError, StreamKind,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::mcp::images::ImageAllowlist;
use crate::mcp::registry::Budget;
use crate::mcp::registry::Claim;
use crate::mcp::registry::Owner;
use crate::mcp::registry::Registry;
use crate::mcp::registry::Reservation;
use crate::mcp::registry::Session;
use crate::mcp::registry::millicores;
use crate::output::error_json;

/// Bytes of stdout and of stderr a tool result carries; the rest is counted and dropped
/// (`truncated: true`), so one chatty command cannot flood the model's context.
pub const RESULT_OUTPUT_CAP: usize = 64 * 1024;
/// Largest file `sandbox_read_file` returns.
pub const READ_FILE_CAP: u64 = 1024 * 1024;
/// Largest `run_code` output buffered in the sandbox before it is refused (run_code has no
/// stream to cut short).
const RUN_CODE_BUFFER_CAP: usize = 4 * 1024 * 1024;
/// Default lifetime of a sandbox created through MCP.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(600);
/// Longest lifetime a tool call may ask for.
const MAX_LIFETIME: Duration = Duration::from_secs(3600);
/// Most entries `sandbox_list_files` returns.
const LIST_CAP: usize = 1000;
/// Largest memory limit a tool call may ask for, in MiB.
const MAX_MEMORY_MB: u64 = 4096;
/// Largest CPU quota a tool call may ask for, in cores.
const MAX_CPUS: f64 = 4.0;

/// What the operator who started the server allows tool calls to ask for.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// `--allow-egress`: network `allow` and allowlists are permitted.
    pub allow_egress: bool,
    /// `--allow-engine-exec`: sandboxes may run without the in-sandbox agent. Off: every
    /// create on an engine that offers the agent requires it.
    pub allow_engine_exec: bool,
    /// What all live sandboxes may hold together.
    pub budget: Budget,
    /// `--allow-image`: the images a call may name (by default the default image only).
    pub images: Arc<ImageAllowlist>,
    /// `--egress-host`: the bound every allow or exception entry must lie inside (empty:
    /// no bound beyond `allow_egress`).
    pub egress_hosts: Vec<sandbox::EgressRule>,
    /// `--credential`: the brokered credentials a `sandbox_create` may bind, by their
    /// variable. The values stay in this process; tool calls name them, never see them.
    pub credentials: Vec<sandbox::Credential>,
}

/// Whether the operator's bound entry `bound` covers all that `want` names: the same
/// host, a host or narrower wildcard below a wildcard, a network inside a network.
fn covers(bound: &sandbox::EgressRule, want: &sandbox::EgressRule) -> bool {
    use sandbox::EgressTarget as T;
    match (bound.target(), want.target()) {
        (T::Host(b), T::Host(w)) => b == w,
        (T::Subdomains(_), T::Host(w)) => bound.matches_host(w),
        (T::Subdomains(b), T::Subdomains(w)) => w == b || w.ends_with(&format!(".{b}")),
        (
            T::Network { .. },
            T::Network {
                addr,
                prefix: want_prefix,
            },
        ) => {
            let T::Network { prefix, .. } = bound.target() else {
                return false;
            };
            want_prefix >= prefix && bound.matches_ip(*addr)
        }
        _ => false,
    }
}

/// Refuses an egress policy that opens more than the operator allows: anything at all
/// without `--allow-egress`; with `--egress-host`, a default of allow or an allow or
/// exception entry outside every bound entry.
fn check_opening(egress: &sandbox::Egress, policy: &Policy) -> sandbox::Result<()> {
    let t = egress.tiers()?;
    let opens =
        t.default == sandbox::EgressDefault::Allow || !t.allow.is_empty() || !t.except.is_empty();
    if opens && !policy.allow_egress {
        return Err(SandboxError::network_policy_violation(
            "this MCP server does not allow egress (network `allow` or `allow_hosts`); sandboxes have no network",
        ));
    }
    if policy.egress_hosts.is_empty() {
        return Ok(());
    }
    if t.default == sandbox::EgressDefault::Allow {
        return Err(SandboxError::network_policy_violation(
            "network `allow` is wider than the egress hosts this MCP server was started with; list hosts instead",
        ));
    }
    for want in t.allow.iter().chain(&t.except) {
        if !policy.egress_hosts.iter().any(|b| covers(b, want)) {
            return Err(SandboxError::network_policy_violation(format!(
                "`{want}` is outside the egress hosts this MCP server was started with"
            )));
        }
    }
    Ok(())
}

/// Egress policy of `sandbox_create`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NetworkParam {
    /// No network but loopback (the default).
    Deny,
    /// Unrestricted outbound traffic.
    Allow,
}

/// Arguments of `sandbox_create`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateParams {
    /// Engine: `docker`, `podman` or `fake`, or a full DSN such as
    /// `docker://sandbox-rs/python:3.11`.
    pub engine: String,
    /// Container image (template), e.g. `sandbox-rs/python:3.11`. Overrides the DSN's.
    #[serde(default)]
    pub image: Option<String>,
    /// Memory limit in MiB (default 512).
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// CPU quota in cores, e.g. 0.5 (default 1).
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Disk limit in MiB: a read-only root filesystem, and at most this much in each
    /// writable place (workdir, /tmp). Engines that cannot enforce it refuse (SBX_E1101).
    #[serde(default)]
    pub disk_mb: Option<u64>,
    /// Sandbox lifetime in seconds (default 600, at most 3600); it is killed after that.
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// The latest sandbox_extend may move the lifetime to, in seconds from create (at
    /// least the lifetime, at most 3600). Default: the lifetime, which then cannot be
    /// extended.
    #[serde(default)]
    pub max_lifetime_s: Option<u64>,
    /// Egress: `deny` (default) or `allow`.
    #[serde(default)]
    pub network: Option<NetworkParam>,
    /// Egress allowlist: hostnames, `*.example.com` wildcards or CIDRs; only these are
    /// reachable. Engines that cannot enforce it refuse (SBX_E1101). An entry inside
    /// link-local, cloud metadata, the host's addresses or the engine's networks, or
    /// wider than /8, is refused (SBX_E1000).
    #[serde(default)]
    pub allow_hosts: Option<Vec<String>>,
    /// Brokered credentials to bind, by their variable (the ones this server offers:
    /// `sandbox mcp --credential`). Inside, each variable holds a placeholder; HTTPS
    /// requests to the credential's hosts get the real value from a proxy outside the
    /// sandbox, which the sandbox cannot read. Needs egress (network `allow` or
    /// `allow_hosts`) and an engine that can force traffic through the proxy (else
    /// SBX_E1101).
    #[serde(default)]
    pub credentials: Option<Vec<String>>,
}

/// A command: one string run by `sh -c`, or a list run directly (no shell).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandParam {
    /// Run with `sh -c`.
    Shell(String),
    /// Run directly: program and arguments.
    Argv(Vec<String>),
}

/// Arguments of `sandbox_run`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunParams {
    /// The id `sandbox_create` returned.
    pub sandbox_id: String,
    /// A string (run by `sh -c`) or a list of program and arguments (no shell).
    pub command: CommandParam,
    /// Timeout in seconds; on expiry the command is killed (SBX_E1302). Default: the
    /// sandbox's remaining lifetime.
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Text given to the command's standard input, then end of input. Default: none.
    #[serde(default)]
    pub stdin: Option<String>,
}

/// Arguments of `sandbox_run_code`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunCodeParams {
    /// The id `sandbox_create` returned.
    pub sandbox_id: String,
    /// Source code.
    pub code: String,
    /// Language: `python` (the default and only one).
    #[serde(default)]
    pub language: Option<String>,
    /// Run in this persistent interpreter, keeping variables between calls.
    #[serde(default)]
    pub context_id: Option<String>,
    /// Timeout in seconds.
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

/// Arguments of `sandbox_write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WriteFileParams {
    /// The id `sandbox_create` returned.
    pub sandbox_id: String,
    /// Path inside the sandbox; relative paths are under the working directory `/work`.
    pub path: String,
    /// Text content (UTF-8).
    pub content: String,
}

/// Arguments of `sandbox_read_file` and `sandbox_list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PathParams {
    /// The id `sandbox_create` returned.
    pub sandbox_id: String,
    /// Path inside the sandbox; relative paths are under the working directory `/work`.
    pub path: String,
}

/// Arguments of `sandbox_set_egress`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SetEgressParams {
    /// The id `sandbox_create` returned.
    pub sandbox_id: String,
    /// `true`: close all egress at once (the sandbox keeps running).
    #[serde(default)]
    pub close: Option<bool>,
    /// Hosts, `*.example.com` wildcards or CIDRs to deny from now on, added to the
    /// policy in force (always accepted: it only narrows).
    #[serde(default)]
    pub deny_hosts: Option<Vec<String>>,
    /// Replaces the allow list: only within what the server's operator allows (without
    /// --allow-egress, refused; with --egress-host, each entry must lie inside one).
    #[serde(default)]
    pub allow_hosts: Option<Vec<String>>,
}

/// Most forks one `sandbox_fork` call makes.
const MAX_FORKS: usize = 4;

/// Arguments of `sandbox_fork`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ForkParams {
    /// The id `sandbox_create` returned.
    pub sandbox_id: String,
    /// How many forks (1 to 4, default 1).
    #[serde(default)]
    pub count: Option<usize>,
}

/// Arguments of `sandbox_extend`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExtendParams {
    /// The id `sandbox_create` returned.
    pub sandbox_id: String,
    /// Seconds to add to the sandbox's deadline (at most 3600; the sandbox's
    /// max_lifetime_s from create bounds the total).
    pub seconds: f64,
}

/// Arguments of `sandbox_kill`, `sandbox_pause`, `sandbox_resume`, `sandbox_stop` and
/// `sandbox_start`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct KillParams {
    /// The id `sandbox_create` returned.
    pub sandbox_id: String,
}

/// Output of a command, bounded.
#[derive(Debug, Default, Serialize)]
struct Bounded {
    stdout: String,
    stderr: String,
    truncated: bool,
    #[serde(skip)]
    out: Vec<u8>,
    #[serde(skip)]
    err: Vec<u8>,
}

impl Bounded {
    fn push(&mut self, kind: StreamKind, data: &[u8]) {
        let buf = match kind {
            StreamKind::Stdout => &mut self.out,
            StreamKind::Stderr => &mut self.err,
        };
        let room = RESULT_OUTPUT_CAP.saturating_sub(buf.len());
        if data.len() > room {
            self.truncated = true;
        }
        buf.extend_from_slice(&data[..data.len().min(room)]);
    }

    fn finish(mut self) -> Self {
        self.stdout = String::from_utf8_lossy(&self.out).into_owned();
        self.stderr = String::from_utf8_lossy(&self.err).into_owned();
        self
    }
}

/// The MCP server: tools over the sandboxes of one session, with limits shared by all
/// sessions of the server.
#[derive(Clone)]
pub struct SandboxServer {
    policy: Policy,
    sandboxes: Registry,
    session: Arc<Session>,
    tool_router: ToolRouter<Self>,
}

/// A successful tool result: the JSON object as text (what hosts show the model) and as
/// structured content.
fn ok_result(value: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
    r.structured_content = Some(value);
    r
}

/// A failed tool result carrying the SBX code, message, hint and docs URL.
fn err_result(e: &SandboxError) -> CallToolResult {
    let value = error_json(e);
    let mut r = CallToolResult::error(vec![ContentBlock::text(value.to_string())]);
    r.structured_content = Some(value);
    r
}

fn to_result(r: sandbox::Result<Value>) -> CallToolResult {
    match r {
        Ok(v) => ok_result(v),
        Err(e) => err_result(&e),
    }
}

fn secs(s: f64) -> sandbox::Result<Duration> {
    if s.is_finite() && s > 0.0 && s <= MAX_LIFETIME.as_secs_f64() {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(SandboxError::config(
            format!("timeout_s must be in (0, {}]", MAX_LIFETIME.as_secs()),
            "pass a positive number of seconds",
        ))
    }
}

fn exec_json(exit_code: i64, out: Bounded) -> Value {
    json!({
        "exit_code": exit_code,
        "stdout": out.stdout,
        "stderr": out.stderr,
        "truncated": out.truncated,
    })
}

fn create_options(p: &CreateParams, policy: &Policy) -> sandbox::Result<CreateOptions> {
    // Whatever image a call names, here or in the DSN, the engine pulls if it lacks it:
    // only the operator's allowlist may be named, checked before the engine is asked.
    // Naming none gives the engine's default image, which the operator chose.
    let named = match &p.image {
        Some(image) => Some(image.clone()),
        None if p.engine.contains("://") => sandbox::Dsn::parse(&p.engine)?.template,
        None => None,
    };
    if let Some(image) = named {
        policy.images.check(&image)?;
    }
    let mut resources = Resources::default();
    if let Some(m) = p.memory_mb {
        if m > MAX_MEMORY_MB {
            return Err(SandboxError::resource_limit(
                format!("memory_mb ({MAX_MEMORY_MB} MiB through MCP)"),
                Some(format!("ask for at most {MAX_MEMORY_MB}")),
            ));
        }
        resources = resources.memory_mb(m);
    }
    if let Some(c) = p.cpus {
        if c > MAX_CPUS {
            return Err(SandboxError::resource_limit(
                format!("cpus ({MAX_CPUS} cores through MCP)"),
                Some(format!("ask for at most {MAX_CPUS}")),
            ));
        }
        resources = resources.cpu(c);
    }
    if let Some(d) = p.disk_mb {
        resources = resources.disk_mb(d);
    }
    let wants_egress = p.network == Some(NetworkParam::Allow)
        || p.allow_hosts.as_ref().is_some_and(|h| !h.is_empty());
    if wants_egress && !policy.allow_egress {
        return Err(SandboxError::network_policy_violation(
            "this MCP server does not allow egress (network `allow` or `allow_hosts`); sandboxes have no network",
        ));
    }
    let network: NetworkPolicy = match (&p.allow_hosts, p.network) {
        (Some(hosts), None | Some(NetworkParam::Deny)) if !hosts.is_empty() => {
            NetworkPolicy::allow_list(hosts.iter().cloned())
        }
        (Some(hosts), Some(NetworkParam::Allow)) if !hosts.is_empty() => {
            return Err(SandboxError::config(
                "network `allow` and `allow_hosts` contradict each other",
                "give either network=allow or an allow_hosts list",
            ));
        }
        (_, Some(NetworkParam::Allow)) => NetworkPolicy::allow(),
        _ => NetworkPolicy::deny(),
    };
    check_opening(&network.egress, policy)?;
    let mut lifetime = match p.timeout_s {
        None => DEFAULT_LIFETIME,
        Some(s) => secs(s as f64)?,
    };
    // A DSN's `?timeout=` overrides the lifetime: hold it to the same bound, and keep the
    // one that applies, which the registry counts the sandbox until.
    if p.engine.contains("://") {
        let dsn = sandbox::Dsn::parse(&p.engine)?;
        if dsn.timeout.is_some_and(|t| t > MAX_LIFETIME) {
            return Err(SandboxError::config(
                format!("the DSN's timeout exceeds {} s", MAX_LIFETIME.as_secs()),
                "pass timeout_s instead (at most 3600)",
            ));
        }
        lifetime = dsn.timeout.unwrap_or(lifetime);
    }
    let mut o = CreateOptions::default()
        .resources(resources)
        .network(network)
        .timeout(lifetime)
        .metadata("tool", "sandbox-cli")
        .metadata("command", "mcp");
    if let Some(image) = &p.image {
        o = o.template(image.clone());
    }
    for name in p.credentials.iter().flatten() {
        let Some(c) = policy.credentials.iter().find(|c| &c.env_var == name) else {
            let offered: Vec<&str> = policy
                .credentials
                .iter()
                .map(|c| c.env_var.as_str())
                .collect();
            return Err(SandboxError::config(
                format!("this MCP server offers no credential {name:?}"),
                if offered.is_empty() {
                    "this server offers none (`sandbox mcp --credential HOST:HEADER=ENV_VAR`)"
                        .to_string()
                } else {
                    format!("name one it offers: {}", offered.join(", "))
                },
            ));
        };
        if o.credentials.iter().any(|have| have.env_var == c.env_var) {
            continue;
        }
        o = o.credential(c.clone());
    }
    if let Some(max) = p.max_lifetime_s {
        // The same bound as the lifetime: extensions never take a sandbox past what a
        // create could have asked for.
        o = o.max_lifetime(secs(max as f64).map_err(|_| {
            SandboxError::config(
                format!("max_lifetime_s must be in (0, {}]", MAX_LIFETIME.as_secs()),
                "ask for at most 3600",
            )
        })?);
    }
    Ok(o)
}

/// `docker` → `docker://`; a DSN stays as it is.
fn engine_target(engine: &str) -> String {
    if engine.contains("://") {
        engine.to_string()
    } else {
        format!("{engine}://")
    }
}

#[tool_router]
impl SandboxServer {
    /// A server with no sandboxes yet, serving one session (stdio), or the template
    /// each HTTP session's handler is made from with [`Self::for_session`].
    pub fn new(policy: Policy) -> Self {
        let sandboxes = Registry::default();
        SandboxServer {
            policy,
            session: Arc::new(Session {
                owner: OnceLock::new(),
                registry: sandboxes.clone(),
            }),
            sandboxes,
            tool_router: Self::tool_router(),
        }
    }

    /// A handler for a new session: the same registry and limits, its own sandboxes.
    pub fn for_session(&self) -> Self {
        SandboxServer {
            session: Arc::new(Session {
                owner: OnceLock::new(),
                registry: self.sandboxes.clone(),
            }),
            ..self.clone()
        }
    }

    /// All sandboxes of the server, for teardown when it stops.
    pub fn registry(&self) -> Registry {
        self.sandboxes.clone()
    }

    /// The session this handler serves; none before `initialize`.
    fn owner(&self) -> sandbox::Result<Owner> {
        self.session.owner.get().copied().ok_or_else(|| {
            SandboxError::config(
                "this request belongs to no MCP session, and a sandbox is only usable by the session that created it",
                "connect with a protocol revision that opens a session with `initialize` (2025-11-25 or earlier)",
            )
        })
    }

    /// The sandbox `id` if this session created it. Another session's sandbox gets the
    /// answer an unknown id gets, so ids cannot be probed across sessions.
    fn get(&self, id: &str) -> sandbox::Result<Arc<dyn Sandbox>> {
        let owner = self.owner()?;
        let live = self.sandboxes.lock();
        live.entries
            .get(id)
            .filter(|e| e.owner == owner)
            .map(|e| e.sandbox.clone())
            .ok_or_else(|| {
                SandboxError::connect(
                    id,
                    "no sandbox with this id in this MCP session; create one with sandbox_create",
                )
            })
    }

    /// Stops counting sandboxes whose lifetime is over, and removes them for good.
    fn release_expired(&self) {
        for sb in self.sandboxes.take_expired(Instant::now()) {
            // Idempotent, and bounded by the teardown grace; nobody waits for it.
            tokio::spawn(async move {
                if let Err(e) = sb.kill().await {
                    tracing::debug!(
                        sandbox_id = sb.id(),
                        code = e.code().as_str(),
                        "expired mcp sandbox kill failed"
                    );
                }
            });
        }
    }

    #[tool(
        description = "Create an isolated sandbox (a locked-down container: no network by default, 1 CPU, 512 MiB). Returns sandbox_id for the other tools. It is destroyed by sandbox_kill, when its lifetime (timeout_s, default 600) ends, or when this MCP session ends. `credentials` binds API keys this server offers by their variable name: the sandbox sees only a placeholder, and requests to the key's hosts carry the real value."
    )]
    async fn sandbox_create(&self, Parameters(p): Parameters<CreateParams>) -> CallToolResult {
        to_result(self.create(p).await)
    }

    async fn create(&self, p: CreateParams) -> sandbox::Result<Value> {
        let owner = self.owner()?;
        let options = create_options(&p, &self.policy)?;
        let credentials = options.credentials.clone();
        let asked = options.resources.effective()?;
        let claim = Claim {
            count: 1,
            memory_mb: asked.memory_mb,
            millicores: millicores(asked.cpu),
        };
        self.release_expired();
        let reservation = Reservation::take(&self.sandboxes, claim, self.policy.budget)?;
        let lifetime = options.timeout;
        let target = sandbox::Target::from(engine_target(&p.engine));
        let options = crate::target::require_agent_where_offered(
            options,
            &target,
            self.policy.allow_engine_exec,
        )
        .await?;
        let sb: Arc<dyn Sandbox> = Arc::from(sandbox::create(target, options).await?);
        let id = sb.id().to_string();
        let mut value = json!({
            "sandbox_id": id,
            "backend": sb.backend(),
            "isolation": sb.isolation().to_string(),
            "exec_path": crate::run::exec_path(sb.capabilities()),
        });
        if !credentials.is_empty() {
            value["credentials"] = crate::session::credentials_json(&credentials);
        }
        // Measured from now, after the create: never earlier than the sandbox's own end.
        reservation.commit(id, sb, owner, Instant::now() + lifetime);
        Ok(value)
    }

    #[tool(
        description = "Run a shell command in a sandbox. `command` is a string (run by `sh -c`) or a list [program, args...] (no shell). Returns exit_code, stdout, stderr (each capped at 64 KiB; truncated=true when cut)."
    )]
    async fn sandbox_run(&self, Parameters(p): Parameters<RunParams>) -> CallToolResult {
        to_result(self.run(p).await)
    }

    async fn run(&self, p: RunParams) -> sandbox::Result<Value> {
        let sb = self.get(&p.sandbox_id)?;
        let cmd = match p.command {
            CommandParam::Shell(s) => Command::Shell(s),
            CommandParam::Argv(v) => Command::Argv(v),
        };
        let mut options = RunOptions::default();
        if let Some(t) = p.timeout_s {
            options = options.timeout(secs(t)?);
        }
        if let Some(input) = p.stdin {
            options = options.stdin(input);
        }
        let (code, out) = run_bounded(&*sb, cmd, options).await?;
        Ok(exec_json(code, out))
    }

    #[tool(
        description = "Run code in the sandbox's interpreter (Python). With context_id, variables persist between calls of the same context. Returns exit_code, stdout, stderr."
    )]
    async fn sandbox_run_code(&self, Parameters(p): Parameters<RunCodeParams>) -> CallToolResult {
        to_result(self.run_code(p).await)
    }

    async fn run_code(&self, p: RunCodeParams) -> sandbox::Result<Value> {
        let sb = self.get(&p.sandbox_id)?;
        let language = match p
            .language
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("python") | Some("python3") | Some("py") => sandbox::Language::Python,
            Some(other) => {
                return Err(SandboxError::config(
                    format!("unsupported language {other:?}"),
                    "use language=python",
                ));
            }
        };
        let mut options = CodeOptions::default()
            .language(language)
            .output_cap(RUN_CODE_BUFFER_CAP);
        if let Some(c) = p.context_id {
            options = options.context(c);
        }
        if let Some(t) = p.timeout_s {
            options = options.timeout(secs(t)?);
        }
        let r = sb.run_code(&p.code, options).await?;
        let mut out = Bounded::default();
        out.push(StreamKind::Stdout, &r.stdout);
        out.push(StreamKind::Stderr, &r.stderr);
        Ok(exec_json(r.exit_code, out.finish()))
    }

    #[tool(
        description = "Write a UTF-8 text file in a sandbox (relative paths are under /work). Creates or replaces it."
    )]
    async fn sandbox_write_file(
        &self,
        Parameters(p): Parameters<WriteFileParams>,
    ) -> CallToolResult {
        to_result(self.write_file(p).await)
    }

    async fn write_file(&self, p: WriteFileParams) -> sandbox::Result<Value> {
        let sb = self.get(&p.sandbox_id)?;
        let size = p.content.len();
        sb.files()?
            .write(&p.path, bytes::Bytes::from(p.content.into_bytes()))
            .await?;
        Ok(json!({"path": p.path, "size": size}))
    }

    #[tool(
        description = "Read a file from a sandbox (at most 1 MiB). Returns its content as text (invalid UTF-8 replaced; binary=true then)."
    )]
    async fn sandbox_read_file(&self, Parameters(p): Parameters<PathParams>) -> CallToolResult {
        to_result(self.read_file(p).await)
    }

    async fn read_file(&self, p: PathParams) -> sandbox::Result<Value> {
        let sb = self.get(&p.sandbox_id)?;
        let files = sb.files()?;
        // Checked before reading so a huge file is never pulled into the server.
        let info = files.stat(&p.path).await?;
        if info.size > READ_FILE_CAP {
            return Err(SandboxError::resource_limit(
                format!(
                    "sandbox_read_file size ({READ_FILE_CAP} bytes; {} is {} bytes)",
                    info.path, info.size
                ),
                Some("read a part with sandbox_run, e.g. `head -c 100000 FILE`".into()),
            ));
        }
        let data = files.read(&p.path).await?;
        let binary = std::str::from_utf8(&data).is_err();
        Ok(json!({
            "path": info.path,
            "size": data.len(),
            "binary": binary,
            "content": String::from_utf8_lossy(&data),
        }))
    }

    #[tool(
        description = "List a directory in a sandbox: name, path, size, is_dir, mode of each entry (at most 1000)."
    )]
    async fn sandbox_list_files(&self, Parameters(p): Parameters<PathParams>) -> CallToolResult {
        to_result(self.list_files(p).await)
    }

    async fn list_files(&self, p: PathParams) -> sandbox::Result<Value> {
        let sb = self.get(&p.sandbox_id)?;
        let entries = sb.files()?.ls(&p.path).await?;
        let truncated = entries.len() > LIST_CAP;
        let entries: Vec<Value> = entries
            .iter()
            .take(LIST_CAP)
            .map(|f| {
                json!({
                    "name": f.name,
                    "path": f.path,
                    "size": f.size,
                    "is_dir": f.is_dir,
                    "mode": format!("{:o}", f.mode),
                })
            })
            .collect();
        Ok(json!({"path": p.path, "entries": entries, "truncated": truncated}))
    }

    #[tool(
        description = "Freeze every process of a sandbox (to hold it while waiting, e.g. for a review). Its lifetime keeps running; every tool but sandbox_resume and sandbox_kill fails with SBX_E1206 until resumed. Idempotent."
    )]
    async fn sandbox_pause(&self, Parameters(p): Parameters<KillParams>) -> CallToolResult {
        to_result(self.pause_or_resume(p, true).await)
    }

    #[tool(
        description = "Let a paused sandbox's processes go on exactly where they stopped. Idempotent."
    )]
    async fn sandbox_resume(&self, Parameters(p): Parameters<KillParams>) -> CallToolResult {
        to_result(self.pause_or_resume(p, false).await)
    }

    #[tool(
        description = "Fork a running sandbox with its memory, to branch an agent's work: `count` (1-4) new sandboxes whose processes, interpreter contexts (sandbox_run_code with context_id) and files continue from this instant; the original goes on and each fork diverges on its own. Each fork counts against this server's limits like a created sandbox and ends when the original's lifetime would. Needs Docker with gVisor and experimental features (`sandbox doctor`); elsewhere it fails with SBX_E1101. A fork cannot be forked again: ask for every branch in one call."
    )]
    async fn sandbox_fork(&self, Parameters(p): Parameters<ForkParams>) -> CallToolResult {
        to_result(self.fork(p).await)
    }

    async fn fork(&self, p: ForkParams) -> sandbox::Result<Value> {
        let owner = self.owner()?;
        let count = p.count.unwrap_or(1);
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(SandboxError::config(
                format!("count {count} is not between 1 and {MAX_FORKS}"),
                format!("ask for 1 to {MAX_FORKS} forks"),
            ));
        }
        let sb = self.get(&p.sandbox_id)?;
        let (claim, deadline) = {
            let live = self.sandboxes.lock();
            let e = live.entries.get(&p.sandbox_id).ok_or_else(|| {
                SandboxError::connect(&p.sandbox_id, "the sandbox ended meanwhile")
            })?;
            (e.claim, e.deadline)
        };
        self.release_expired();
        // Every fork is held against the limits before any is made, as a create is.
        let reservations = (0..count)
            .map(|_| Reservation::take(&self.sandboxes, claim, self.policy.budget))
            .collect::<sandbox::Result<Vec<_>>>()?;
        let forks = sb.fork(sandbox::ForkOptions::new(count)).await?;
        let mut ids = Vec::with_capacity(forks.len());
        for (fork, reservation) in forks.into_iter().zip(reservations) {
            let id = fork.id().to_string();
            ids.push(id.clone());
            reservation.commit(id, Arc::from(fork), owner, deadline);
        }
        Ok(json!({"sandbox_id": p.sandbox_id, "forks": ids}))
    }

    async fn pause_or_resume(&self, p: KillParams, pause: bool) -> sandbox::Result<Value> {
        let sb = self.get(&p.sandbox_id)?;
        if pause {
            sb.pause().await?;
        } else {
            sb.resume().await?;
        }
        let state = if pause { "paused" } else { "running" };
        Ok(json!({"sandbox_id": p.sandbox_id, "state": state}))
    }

    #[tool(
        description = "Stop a sandbox: every process in it ends (commands, interpreter contexts), its files, id and network policy are kept for sandbox_start. Its lifetime keeps running (past it the stopped sandbox is removed); every tool but sandbox_start and sandbox_kill fails with SBX_E1207 until started. It still counts against this server's limits. Idempotent."
    )]
    async fn sandbox_stop(&self, Parameters(p): Parameters<KillParams>) -> CallToolResult {
        to_result(self.stop_or_start(p, true).await)
    }

    #[tool(
        description = "Run a stopped sandbox again: its network policy is in force before this returns; its files are as they were, processes and interpreter contexts start afresh. Idempotent on a running sandbox."
    )]
    async fn sandbox_start(&self, Parameters(p): Parameters<KillParams>) -> CallToolResult {
        to_result(self.stop_or_start(p, false).await)
    }

    async fn stop_or_start(&self, p: KillParams, stop: bool) -> sandbox::Result<Value> {
        let sb = self.get(&p.sandbox_id)?;
        if stop {
            sb.stop().await?;
        } else {
            sb.start().await?;
        }
        let state = if stop { "stopped" } else { "running" };
        Ok(json!({"sandbox_id": p.sandbox_id, "state": state}))
    }

    #[tool(
        description = "Give a sandbox more time: its deadline moves `seconds` later (enforced inside the sandbox and by the host as the first one), up to the max_lifetime_s it was created with (beyond it: SBX_E1402, nothing changes). Returns the new deadline (Unix seconds) and the seconds left."
    )]
    async fn sandbox_extend(&self, Parameters(p): Parameters<ExtendParams>) -> CallToolResult {
        to_result(self.extend(p).await)
    }

    async fn extend(&self, p: ExtendParams) -> sandbox::Result<Value> {
        let by = secs(p.seconds).map_err(|_| {
            SandboxError::config(
                format!("seconds must be in (0, {}]", MAX_LIFETIME.as_secs()),
                "ask for at most 3600 more seconds",
            )
        })?;
        let sb = self.get(&p.sandbox_id)?;
        let deadline = sb.extend(by).await.map_err(|e| match e {
            // The library's hint names its API; say what a tool call can do instead.
            SandboxError::ResourceLimitExceeded { limit, .. } => SandboxError::resource_limit(
                limit,
                Some(
                    "extend by less, or create the sandbox with a longer max_lifetime_s (at most 3600)"
                        .into(),
                ),
            ),
            e => e,
        })?;
        let left = deadline
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        // The server counts the sandbox against its limits until its deadline: the moved
        // one, or the sandbox would be released (and killed) at the old one.
        self.sandboxes
            .move_deadline(&p.sandbox_id, Instant::now() + left);
        let unix = deadline
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        Ok(json!({
            "sandbox_id": p.sandbox_id,
            "deadline": unix,
            "expires_in_s": left.as_secs(),
        }))
    }

    #[tool(
        description = "Change a running sandbox's egress: close it (close=true), deny hosts from now on (deny_hosts, added to the policy in force), or replace its allow list (allow_hosts, only within what this server allows). In force when it returns; connections to what is now denied are cut. Returns the policy in force."
    )]
    async fn sandbox_set_egress(
        &self,
        Parameters(p): Parameters<SetEgressParams>,
    ) -> CallToolResult {
        to_result(self.set_egress(p).await)
    }

    async fn set_egress(&self, p: SetEgressParams) -> sandbox::Result<Value> {
        let sb = self.get(&p.sandbox_id)?;
        let parse = |l: &Option<Vec<String>>| -> sandbox::Result<Vec<sandbox::EgressRule>> {
            l.iter()
                .flatten()
                .map(|h| sandbox::EgressRule::parse(h))
                .collect()
        };
        let deny = parse(&p.deny_hosts)?;
        let allow = parse(&p.allow_hosts)?;
        let current = sb.egress().await?;
        let wanted = if p.close == Some(true) {
            sandbox::Egress::Deny
        } else if current == sandbox::Egress::Deny && p.allow_hosts.is_none() {
            // Closed already: denying more changes nothing.
            sandbox::Egress::Deny
        } else {
            let now = current.tiers()?;
            let mut t = if now.default == sandbox::EgressDefault::Allow {
                sandbox::EgressTiers::allow_by_default()
            } else {
                sandbox::EgressTiers::deny_by_default()
            };
            let allow_list = if p.allow_hosts.is_some() {
                allow
            } else {
                now.allow.clone()
            };
            for r in allow_list {
                t = t.allow(r);
            }
            for r in now.deny.iter().cloned().chain(deny) {
                t = t.deny(r);
            }
            for r in now.except.iter().cloned() {
                t = t.except(r);
            }
            // Host ports the operator granted stay as they are: this tool neither grants
            // nor (short of closing everything) drops them.
            for p in now.host_ports.iter().copied() {
                t = t.host_port(p);
            }
            let t = sandbox::Egress::Tiers(t);
            // A new allow list is a widening: held to the operator's bounds. Denying more
            // over what is in force only narrows.
            if p.allow_hosts.is_some() {
                check_opening(&t, &self.policy)?;
            }
            t
        };
        if wanted != current {
            sb.set_egress(wanted).await?;
        }
        let now = sb.egress().await?;
        Ok(json!({"sandbox_id": p.sandbox_id, "egress": now.to_string()}))
    }

    #[tool(description = "Destroy a sandbox and everything in it. Idempotent.")]
    async fn sandbox_kill(&self, Parameters(p): Parameters<KillParams>) -> CallToolResult {
        to_result(self.kill(p).await)
    }

    async fn kill(&self, p: KillParams) -> sandbox::Result<Value> {
        let removed = self.sandboxes.take(&p.sandbox_id, self.owner()?);
        match removed {
            Some(sb) => {
                sb.kill().await?;
                Ok(json!({"sandbox_id": p.sandbox_id, "killed": true}))
            }
            // Idempotent: a second kill of a sandbox this session created is not an error.
            // Another session's sandbox gets the same answer and stays alive.
            None => Ok(json!({"sandbox_id": p.sandbox_id, "killed": false})),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::default();
        info.capabilities = ServerCapabilities::builder().enable_tools().build();
        info.instructions = Some(
            "Run untrusted code in isolated sandboxes: sandbox_create, then sandbox_run / sandbox_run_code / files, then sandbox_kill. Failures carry an SBX error code and a hint."
                .into(),
        );
        info
    }

    /// Only the revisions that open a session with `initialize`: a sandbox belongs to the
    /// session that created it, and the newest revision has no sessions to hang it on.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    /// rmcp's own `initialize`, which also marks this handler's session as begun: from
    /// now on it owns what it creates.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.session.owner.get_or_init(Owner::next);
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }
}

/// Streams the command and keeps the first [`RESULT_OUTPUT_CAP`] bytes of each stream
/// (bounded memory however much it prints); falls back to a buffered `run` on backends
/// without `STREAMING`.
async fn run_bounded(
    sb: &dyn Sandbox,
    cmd: Command,
    options: RunOptions,
) -> sandbox::Result<(i64, Bounded)> {
    let mut out = Bounded::default();
    let mut process = match sb.stream(cmd.clone(), options.clone()) {
        Ok(p) => p,
        Err(SandboxError::CapabilityNotSupported { .. }) => {
            let r = sb.run(cmd, options).await?;
            out.push(StreamKind::Stdout, &r.stdout);
            out.push(StreamKind::Stderr, &r.stderr);
            return Ok((r.exit_code, out.finish()));
        }
        Err(e) => return Err(e),
    };
    while let Some(chunk) = process.next().await {
        let chunk = chunk?;
        out.push(chunk.stream, &chunk.data);
    }
    let r = process.wait().await?;
    Ok((r.exit_code, out.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::registry::MAX_SANDBOXES;
    use sandbox::ErrorCode;

    /// Egress opens only within the operator's bounds: nothing without --allow-egress;
    /// with --egress-host, only entries inside a bound entry and never a default of allow.
    /// Denying more is never held back.
    #[test]
    fn egress_opens_only_within_the_operators_bounds() {
        let r = |s: &str| sandbox::EgressRule::parse(s).unwrap();
        let tiers = |allow: &[&str]| {
            let mut t = sandbox::EgressTiers::deny_by_default();
            for a in allow {
                t = t.allow(r(a));
            }
            sandbox::Egress::Tiers(t)
        };
        let closed = Policy::default();
        let code = |e: sandbox::Result<()>| e.unwrap_err().code();
        assert_eq!(
            code(check_opening(&tiers(&["pypi.org"]), &closed)),
            ErrorCode::NetworkPolicyViolation
        );
        let deny_only =
            sandbox::Egress::Tiers(sandbox::EgressTiers::deny_by_default().deny(r("evil.test")));
        assert!(
            check_opening(&deny_only, &closed).is_ok(),
            "denying is narrowing"
        );
        let bounded = Policy {
            allow_egress: true,
            egress_hosts: vec![r("*.example.com"), r("pypi.org"), r("10.0.0.0/8")],
            ..Policy::default()
        };
        for ok in [
            tiers(&["api.example.com"]),
            tiers(&["*.a.example.com"]),
            tiers(&["pypi.org", "10.1.0.0/16"]),
        ] {
            assert!(check_opening(&ok, &bounded).is_ok(), "{ok}");
        }
        for wider in [
            tiers(&["example.com"]),
            tiers(&["*.other.com"]),
            tiers(&["files.pythonhosted.org"]),
            tiers(&["11.0.0.0/8"]),
            sandbox::Egress::Allow,
            sandbox::Egress::Tiers(sandbox::EgressTiers::allow_by_default().deny(r("x.test"))),
        ] {
            assert_eq!(
                code(check_opening(&wider, &bounded)),
                ErrorCode::NetworkPolicyViolation,
                "{wider}"
            );
        }
        // The bound applies at create too.
        let p: CreateParams =
            serde_json::from_value(json!({"engine": "fake", "allow_hosts": ["evil.test"]}))
                .unwrap();
        assert_eq!(
            create_options(&p, &bounded).unwrap_err().code(),
            ErrorCode::NetworkPolicyViolation
        );
    }

    #[test]
    fn credentials_are_bound_by_the_name_the_operator_offered() {
        let offered = sandbox::Credential::new(
            "API_KEY",
            "sk-unit-secret",
            ["api.example.com"],
            sandbox::Placement::header_template("Authorization", "Bearer {}"),
        );
        let policy = Policy {
            allow_egress: true,
            credentials: vec![offered],
            ..Policy::default()
        };
        let p = |names: Value| -> CreateParams {
            serde_json::from_value(json!({
                "engine": "fake", "allow_hosts": ["api.example.com"], "credentials": names
            }))
            .unwrap()
        };
        let o = create_options(&p(json!(["API_KEY", "API_KEY"])), &policy).unwrap();
        assert_eq!(o.credentials.len(), 1, "bound once");
        assert_eq!(o.credentials[0].env_var, "API_KEY");
        assert_eq!(o.credentials[0].hosts, ["api.example.com"]);
        assert_eq!(o.credentials[0].secret.expose(), "sk-unit-secret");
        assert!(
            create_options(&p(json!([])), &policy)
                .unwrap()
                .credentials
                .is_empty()
        );
        let e = create_options(&p(json!(["NOPE"])), &policy).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert!(e.render().contains("API_KEY") && !e.render().contains("sk-unit-secret"));
        let e = create_options(&p(json!(["API_KEY"])), &Policy::default()).unwrap_err();
        assert_eq!(
            e.code(),
            ErrorCode::NetworkPolicyViolation,
            "egress is refused first"
        );
    }

    #[test]
    fn bounded_output_is_cut_and_flagged() {
        let mut b = Bounded::default();
        b.push(StreamKind::Stdout, &vec![b'a'; RESULT_OUTPUT_CAP - 1]);
        b.push(StreamKind::Stdout, b"bc");
        b.push(StreamKind::Stderr, b"e");
        let b = b.finish();
        assert_eq!(b.stdout.len(), RESULT_OUTPUT_CAP);
        assert!(b.stdout.ends_with("ab"));
        assert_eq!(b.stderr, "e");
        assert!(b.truncated);
    }

    #[test]
    fn allow_with_allowlist_is_refused() {
        let p: CreateParams = serde_json::from_value(json!({
            "engine": "fake", "network": "allow", "allow_hosts": ["example.com"]
        }))
        .expect("params");
        let consent = Policy {
            allow_egress: true,
            ..Policy::default()
        };
        let e = create_options(&p, &consent).expect_err("contradiction");
        assert_eq!(e.code(), ErrorCode::Configuration);
    }

    #[test]
    fn egress_needs_the_operators_consent() {
        for args in [
            json!({"engine": "fake", "network": "allow"}),
            json!({"engine": "fake", "allow_hosts": ["example.com"]}),
        ] {
            let p: CreateParams = serde_json::from_value(args).expect("params");
            let e = create_options(&p, &Policy::default()).expect_err("no consent");
            assert_eq!(e.code(), ErrorCode::NetworkPolicyViolation);
            let consent = Policy {
                allow_egress: true,
                ..Policy::default()
            };
            let o = create_options(&p, &consent).expect("consent");
            assert_ne!(o.network, NetworkPolicy::deny());
        }
    }

    /// The MCP server never offers a way through the blocked set: no argument of
    /// `sandbox_create` names one, an argument smuggled in is not read, and every policy
    /// it builds is validated (so a client's entry inside the blocked set is refused).
    #[test]
    fn mcp_never_offers_a_blocked_set_override() {
        let schema = serde_json::to_value(schemars::schema_for!(CreateParams)).unwrap();
        let args = schema["properties"].as_object().expect("properties");
        assert!(args.contains_key("allow_hosts"), "{schema}");
        for arg in args.keys() {
            for word in ["override", "blocked", "through"] {
                assert!(
                    !arg.contains(word),
                    "`{arg}` offers a way through the blocked set"
                );
            }
        }
        let consent = Policy {
            allow_egress: true,
            ..Policy::default()
        };
        let p: CreateParams = serde_json::from_value(json!({
            "engine": "fake",
            "allow_hosts": ["pypi.org"],
            "blocked_set_overrides": ["169.254.169.254/32"],
        }))
        .expect("params");
        let o = create_options(&p, &consent).expect("an ordinary allowlist");
        assert!(o.network.blocked_set_overrides.is_empty());
        for bad in ["169.254.169.254/32", "0.0.0.0/0", "fd00:ec2::254", "::/0"] {
            let p: CreateParams =
                serde_json::from_value(json!({"engine": "fake", "allow_hosts": [bad]}))
                    .expect("params");
            let refused = create_options(&p, &consent).and_then(|o| {
                assert!(o.network.blocked_set_overrides.is_empty());
                o.validate().map(drop)
            });
            assert_eq!(
                refused.expect_err(bad).code(),
                ErrorCode::Configuration,
                "{bad}"
            );
        }
    }

    #[test]
    fn resource_asks_are_bounded() {
        for args in [
            json!({"engine": "fake", "memory_mb": 1_000_000}),
            json!({"engine": "fake", "cpus": 64.0}),
        ] {
            let p: CreateParams = serde_json::from_value(args).expect("params");
            let e = create_options(&p, &Policy::default()).expect_err("too much");
            assert_eq!(e.code(), ErrorCode::ResourceLimitExceeded);
        }
    }

    #[test]
    fn disk_limit_reaches_the_options() {
        let p: CreateParams =
            serde_json::from_value(json!({"engine": "fake", "disk_mb": 32})).expect("p");
        let o = create_options(&p, &Policy::default()).expect("ok");
        assert_eq!(o.resources.disk_mb, Some(32));
    }

    #[test]
    fn lifetime_is_bounded() {
        let p: CreateParams =
            serde_json::from_value(json!({"engine": "fake", "timeout_s": 86400})).expect("p");
        assert_eq!(
            create_options(&p, &Policy::default())
                .expect_err("too long")
                .code(),
            ErrorCode::Configuration
        );
        let p: CreateParams = serde_json::from_value(json!({"engine": "fake"})).expect("p");
        assert_eq!(
            create_options(&p, &Policy::default()).expect("ok").timeout,
            DEFAULT_LIFETIME
        );
        // The maximum an extension can reach is held to the same bound.
        let p: CreateParams =
            serde_json::from_value(json!({"engine": "fake", "max_lifetime_s": 3601})).expect("p");
        let e = create_options(&p, &Policy::default()).expect_err("too long");
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert!(e.to_string().contains("max_lifetime_s"), "{e}");
        let p: CreateParams =
            serde_json::from_value(json!({"engine": "fake", "max_lifetime_s": 3600})).expect("p");
        assert_eq!(
            create_options(&p, &Policy::default())
                .expect("ok")
                .max_lifetime,
            Some(Duration::from_secs(3600))
        );
    }

    #[test]
    fn command_is_a_string_or_a_list() {
        let p: RunParams =
            serde_json::from_value(json!({"sandbox_id": "x", "command": "echo hi"})).expect("s");
        assert!(matches!(p.command, CommandParam::Shell(_)));
        let p: RunParams =
            serde_json::from_value(json!({"sandbox_id": "x", "command": ["echo", "hi"]}))
                .expect("l");
        assert!(matches!(p.command, CommandParam::Argv(_)));
    }

    #[test]
    fn a_dsn_timeout_cannot_lift_the_lifetime_bound() {
        let p: CreateParams =
            serde_json::from_value(json!({"engine": "fake://?timeout=86400"})).expect("p");
        assert_eq!(
            create_options(&p, &Policy::default())
                .expect_err("too long")
                .code(),
            ErrorCode::Configuration
        );
    }

    fn claim(memory_mb: u64, cpus: f64) -> Claim {
        Claim {
            count: 1,
            memory_mb,
            millicores: millicores(cpus),
        }
    }

    #[test]
    fn concurrent_creates_cannot_overshoot_the_budget() {
        let registry = Registry::default();
        let budget = Budget {
            memory_mb: 1024,
            cpus: 2.0,
        };
        let a = Reservation::take(&registry, claim(512, 1.0), budget).expect("1st");
        let b = Reservation::take(&registry, claim(512, 0.5), budget).expect("2nd");
        let e = Reservation::take(&registry, claim(6, 0.1), budget).expect_err("memory");
        assert_eq!(e.code(), ErrorCode::ResourceLimitExceeded);
        assert!(e.to_string().contains("memory"), "{e}");
        drop(a);
        let e = Reservation::take(&registry, claim(6, 1.6), budget).expect_err("cpus");
        assert!(e.to_string().contains("cpus"), "{e}");
        let c = Reservation::take(&registry, claim(512, 1.5), budget).expect("room again");
        drop((b, c));
        assert_eq!(registry.lock().held, Claim::default());
    }

    #[test]
    fn the_sandbox_count_is_bounded() {
        let registry = Registry::default();
        let budget = Budget {
            memory_mb: u64::MAX,
            cpus: 1e9,
        };
        let held: Vec<_> = (0..MAX_SANDBOXES)
            .map(|_| Reservation::take(&registry, claim(6, 0.1), budget).expect("room"))
            .collect();
        let e = Reservation::take(&registry, claim(6, 0.1), budget).expect_err("17th");
        assert_eq!(e.code(), ErrorCode::ResourceLimitExceeded);
        drop(held);
    }

    async fn fake() -> Arc<dyn Sandbox> {
        Arc::from(
            sandbox::create("fake://", CreateOptions::default())
                .await
                .expect("fake sandbox"),
        )
    }

    #[tokio::test]
    async fn a_session_that_ends_gives_its_room_back() {
        let root = SandboxServer::new(Policy::default());
        let (a, b) = (root.for_session(), root.for_session());
        let (oa, ob) = (Owner::next(), Owner::next());
        a.session.owner.set(oa).expect("a");
        b.session.owner.set(ob).expect("b");
        let registry = root.registry();
        for (owner, id) in [(oa, "a1"), (oa, "a2"), (ob, "b1")] {
            let r = Reservation::take(&registry, claim(512, 1.0), Budget::default()).expect("room");
            r.commit(
                id.into(),
                fake().await,
                owner,
                Instant::now() + DEFAULT_LIFETIME,
            );
        }
        assert_eq!(registry.lock().held.count, 3);
        assert!(b.get("a1").is_err(), "another session's sandbox");
        assert!(a.get("a1").is_ok());
        drop(a);
        let live = registry.lock();
        assert_eq!(live.held, claim(512, 1.0));
        assert!(live.entries.contains_key("b1"));
    }

    #[tokio::test]
    async fn expired_sandboxes_stop_counting() {
        let registry = Registry::default();
        let r = Reservation::take(&registry, claim(512, 1.0), Budget::default()).expect("room");
        let now = Instant::now();
        r.commit(
            "x".into(),
            fake().await,
            Owner::next(),
            now + Duration::from_secs(5),
        );
        assert!(registry.take_expired(now).is_empty());
        assert_eq!(registry.take_expired(now + Duration::from_secs(5)).len(), 1);
        assert_eq!(registry.lock().held, Claim::default());
    }

    /// sandbox_extend moves the deadline the server counts the sandbox until: it is not
    /// released (and killed) at the old one. Beyond its maximum nothing moves.
    #[tokio::test]
    async fn an_extended_sandbox_is_not_released_at_its_old_deadline() {
        let server = SandboxServer::new(Policy::default());
        let owner = Owner::next();
        server.session.owner.set(owner).expect("owner");
        let sb: Arc<dyn Sandbox> = Arc::from(
            sandbox::create(
                "fake://",
                CreateOptions::default()
                    .timeout(Duration::from_secs(60))
                    .max_lifetime(Duration::from_secs(600)),
            )
            .await
            .expect("fake sandbox"),
        );
        let id = sb.id().to_string();
        let registry = server.registry();
        let r = Reservation::take(&registry, claim(512, 1.0), Budget::default()).expect("room");
        let now = Instant::now();
        r.commit(id.clone(), sb, owner, now + Duration::from_secs(60));
        let v = server
            .extend(ExtendParams {
                sandbox_id: id.clone(),
                seconds: 120.0,
            })
            .await
            .expect("extend");
        assert!(
            (170..=181).contains(&v["expires_in_s"].as_u64().expect("left")),
            "{v}"
        );
        assert!(
            registry
                .take_expired(now + Duration::from_secs(61))
                .is_empty(),
            "released at the deadline of create"
        );
        let e = server
            .extend(ExtendParams {
                sandbox_id: id.clone(),
                seconds: 1000.0,
            })
            .await
            .expect_err("past the maximum");
        assert_eq!(e.code(), ErrorCode::ResourceLimitExceeded);
        assert!(e.hint().contains("max_lifetime_s"), "{}", e.hint());
        let e = server
            .extend(ExtendParams {
                sandbox_id: id.clone(),
                seconds: 0.0,
            })
            .await
            .expect_err("nothing to add");
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert_eq!(
            registry.take_expired(now + Duration::from_secs(200)).len(),
            1
        );
    }

    #[test]
    fn a_handler_outside_a_session_uses_no_sandbox() {
        let server = SandboxServer::new(Policy::default());
        assert_eq!(
            server.get("any").expect_err("no session").code(),
            ErrorCode::Configuration
        );
    }

    #[test]
    fn engine_names_become_dsns() {
        assert_eq!(engine_target("docker"), "docker://");
        assert_eq!(engine_target("fake://x"), "fake://x");
    }
}
