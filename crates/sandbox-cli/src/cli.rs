//! Command-line grammar (clap derive): every subcommand, flag and value parser of
//! `sandbox`, and the text `--help` prints. It imports nothing else of this crate: the
//! commands depend on the grammar, never the reverse. What the parsed values mean is left
//! to them; checks that must not echo a value (secret names, in `secret_env`) run after
//! parsing, and the exit codes the help lists are returned through `exit_code`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Where `sandbox mcp --http` listens when given no address: loopback, so only this
/// machine can reach a server that runs code.
const MCP_HTTP_DEFAULT_ADDR: &str = "127.0.0.1:8931";

/// Printed after `--help`. Keep in step with `exit_code`, which this file cannot import.
const EXIT_CODES: &str = "Every command takes --json (one JSON object on stdout; errors as {\"error\": {code, message, hint, url}}).\nColor only on a terminal and when NO_COLOR is unset.\n\nExit codes:\n  0    ok\n  1    failure (engine error, unhealthy default engine, failed demo step, failed kill)\n  2    usage or configuration error (bad flags, bad DSN, unknown backend)\n  124  `run`: the command timed out (and was killed)\n  130  interrupted by Ctrl-C (after teardown)\n  `run` otherwise exits with the command's own exit code.";

/// Run untrusted code in sandboxes (Docker, Podman, fake).
///
/// Exit codes: 0 ok; 1 failure; 2 usage or configuration error; 124 `run` timed out;
/// 130 interrupted (Ctrl-C, after teardown). `sandbox run` otherwise exits with the
/// command's own exit code.
#[derive(Debug, Parser)]
#[command(name = "sandbox", version, about, long_about = None, after_help = EXIT_CODES)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Run one command in a fresh sandbox, streaming its output; exits with its exit code.
    Run(RunArgs),
    /// Create a sandbox, run code, stream, prove egress is denied, tear down — timed.
    Demo(DemoArgs),
    /// Check every engine: reachable, version, socket, runtimes, images, tier, fixes.
    Doctor(DoctorArgs),
    /// List sandboxes and snapshot images sandbox-rs manages on every reachable engine;
    /// kill (and remove) them with --kill.
    Reap(ReapArgs),
    /// Create a sandbox that outlives this command (until `kill` or its --timeout); prints its id.
    Create(CreateArgs),
    /// Run a command in a sandbox made by `create`; exits with its exit code.
    Exec(ExecArgs),
    /// Copy files between the host and a sandbox: `cp FILE ID:PATH` or `cp ID:PATH FILE`.
    Cp(CpArgs),
    /// List live sandboxes on every reachable engine, with state (running, paused,
    /// stopped), age, deadline, how far it can be extended (MAX) and idle limit.
    Ls(LsArgs),
    /// Kill (and remove) a sandbox made by `create`.
    Kill(KillArgs),
    /// Freeze every process of a sandbox made by `create` (its lifetime keeps running).
    Pause(KillArgs),
    /// Show a live sandbox's egress policy, or replace it (`--deny`, `--allow`, host tiers);
    /// prints the policy in force afterwards.
    Egress(EgressArgs),
    /// Let a paused sandbox's processes go on where they stopped.
    Resume(KillArgs),
    /// End every process of a sandbox made by `create` and keep it (its files, id and
    /// policy; its lifetime keeps running).
    Stop(KillArgs),
    /// Run a stopped sandbox again: its network policy is re-applied before it returns;
    /// interpreter contexts start afresh.
    Start(KillArgs),
    /// Move the deadline of a sandbox made by `create` S seconds later (up to the
    /// `--max-lifetime` it was created with); prints the new deadline. Its holder, and
    /// every other process on this host, follows the moved deadline.
    Extend(ExtendArgs),
    /// Fork a sandbox made by `create` with its memory: COUNT new sandboxes whose
    /// processes and files continue from this instant (prints their ids, one per line).
    /// The session's holder makes and keeps them; each ends at its own deadline (the
    /// original's, or --timeout from now) or with `sandbox kill`. Needs Docker with gVisor
    /// and experimental features (`sandbox doctor`).
    Fork(ForkArgs),
    /// Serve the Model Context Protocol on stdin/stdout, or over streamable HTTP with --http
    /// (tools: sandbox_create, sandbox_run, sandbox_run_code, sandbox_write_file,
    /// sandbox_read_file, sandbox_list_files, sandbox_pause, sandbox_resume,
    /// sandbox_stop, sandbox_start, sandbox_extend, sandbox_fork, sandbox_set_egress,
    /// sandbox_kill); a
    /// sandbox belongs to the session that created it and is killed when that session ends
    /// or the server stops.
    Mcp(McpArgs),
    /// Print a shell completion script: `sandbox completions bash > /etc/bash_completion.d/sandbox`.
    Completions(CompletionsArgs),
}

/// OCI runtime, from a vetted set (never a path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeArg {
    /// runc (the engines' default; `Container` tier).
    Runc,
    /// crun (`Container` tier).
    Crun,
    /// gVisor (`Gvisor` tier); must be registered with the engine.
    Runsc,
    /// libkrun micro-VM (`MicroVm` tier); must be registered with the engine.
    Krun,
}

/// Minimum isolation tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TierArg {
    /// A container (namespaces, seccomp, dropped capabilities).
    Container,
    /// A user-space kernel (gVisor).
    Gvisor,
    /// A micro-VM.
    Microvm,
}

/// When the template image is pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PullArg {
    /// Only when the engine does not have it.
    Missing,
    /// Every time (a moved tag is followed).
    Always,
    /// Never: a missing image is an error (SBX_E1205).
    Never,
}

/// Sandbox settings shared by `run` and `create`.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// Memory limit in MiB (default 512).
    #[arg(long, value_name = "MB")]
    pub memory: Option<u64>,
    /// CPU quota in cores, e.g. 0.5 (default 1).
    #[arg(long, value_name = "N")]
    pub cpus: Option<f64>,
    /// Disk limit in MiB: a read-only root filesystem, and at most this much in each
    /// writable place (the workdir, /tmp, /dev/shm). Refused by engines that cannot
    /// enforce it (see `sandbox doctor`).
    #[arg(long = "disk-mb", value_name = "MB")]
    pub disk_mb: Option<u64>,
    /// The sandbox's hostname (at most 63 bytes: letters, digits, inner hyphens, dots).
    #[arg(long, value_name = "NAME")]
    pub hostname: Option<String>,
    /// Egress policy: what a destination no host flag names gets (`closed`: nothing, like
    /// `deny`, but on a network whose policy `sandbox egress` can open later).
    #[arg(long, value_enum, default_value_t = NetworkArg::Deny)]
    pub network: NetworkArg,
    /// Egress tiers (allow, deny, exceptions), enforced by nftables rules in the sandbox
    /// (Docker and Podman on this host; see `sandbox doctor`).
    #[command(flatten)]
    pub hosts: HostTiers,
    /// Environment variable (repeatable). Visible in the engine's container config: use
    /// --secret for credentials.
    #[arg(long = "env", value_name = "K=V", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// OCI runtime (Docker and Podman).
    #[arg(long, value_enum, value_name = "RUNTIME")]
    pub runtime: Option<RuntimeArg>,
    /// Refuse to start unless the sandbox reaches this isolation tier (checked before
    /// anything is provisioned).
    #[arg(long, value_enum, value_name = "TIER")]
    pub require_isolation: Option<TierArg>,
    /// When to pull the image from its registry (with a progress bar on a terminal).
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = PullArg::Missing)]
    pub pull: PullArg,
    /// Accept a sandbox without the in-sandbox agent. By default, on an engine that offers
    /// the agent, a create whose agent cannot start fails instead of falling back to the
    /// engine's exec path (where root inside can stop the main process, and a timeout's
    /// kill runs the image's own shell).
    #[arg(long)]
    pub allow_engine_exec: bool,
    /// Forward this host's ssh-agent (`$SSH_AUTH_SOCK`) into the sandbox: its
    /// `SSH_AUTH_SOCK` lists and signs with the selected keys only, and nothing else of the
    /// agent is reachable. Bare: every key the agent holds now; `--ssh-agent=KEY`
    /// (repeatable): a key by its fingerprint (`SHA256:…`, as `ssh-add -l` prints it) or
    /// its public key file (`~/.ssh/id_ed25519.pub`). `run` only: the relay lives in the
    /// process holding the sandbox's channel, which `sandbox exec` takes over.
    #[arg(
        long = "ssh-agent",
        value_name = "KEY",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "*"
    )]
    pub ssh_agent: Vec<String>,
    /// Serve this host repository to the sandbox through the git gate: commands inside
    /// find its clone URL (with the sandbox's token) in `$SANDBOX_GIT_URL` (the next
    /// ones in `$SANDBOX_GIT_URL_1`, …), and may clone and fetch it; with `:rw` they may
    /// also push refs under `refs/heads/sandbox/<sandbox id>/`, nothing else. The
    /// repository's config, remotes and credentials are never served. Repeatable (at
    /// most 8). `run` only, as `--ssh-agent`: the gate lives with the process holding
    /// the sandbox's channel.
    #[arg(long = "git-repo", value_name = "PATH[:rw]")]
    pub git_repo: Vec<String>,
    /// A brokered credential (repeatable): `HOST:HEADER=ENV_VAR` sends the value of this
    /// shell's ENV_VAR as header HEADER on HTTPS requests to HOST, put there by a proxy on
    /// this host; inside, ENV_VAR holds only a placeholder. The value may be a template:
    /// `'HOST:Authorization=Bearer {ENV_VAR}'`; a query parameter: `HOST:?PARAM=ENV_VAR`;
    /// several hosts: `HOST1,HOST2:…`. The value is read from the environment, never the
    /// command line. Needs egress other than `--network none`.
    #[arg(long = "credential", value_name = "HOST:HEADER=ENV_VAR")]
    pub credential: Vec<String>,
}

/// `sandbox create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Lifetime in seconds: the sandbox is killed after it even if nobody runs `kill`.
    /// Default 600 (10 min), at most 86400.
    #[arg(long, value_name = "S", value_parser = parse_positive_secs)]
    pub timeout: Option<Duration>,
    /// The latest the lifetime can be moved to with `sandbox extend`, in seconds from
    /// create (at least --timeout, at most 86400). Default: the lifetime itself, which
    /// then cannot be extended. Needs the in-sandbox agent.
    #[arg(long = "max-lifetime", value_name = "S", value_parser = parse_positive_secs)]
    pub max_lifetime: Option<Duration>,
    /// End and remove the sandbox once it has had no call and no running command for S
    /// seconds (a command still running keeps it); the session's holder ends with it.
    /// Needs the in-sandbox agent.
    #[arg(long = "idle-timeout", value_name = "S", value_parser = parse_positive_secs)]
    pub idle_timeout: Option<Duration>,
    /// Sandbox settings.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Metadata label on the sandbox (repeatable), shown by `ls` and usable with
    /// `reap --label`.
    #[arg(long = "label", value_name = "K=V", value_parser = parse_key_value)]
    pub labels: Vec<(String, String)>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Where: `docker://sandbox-rs/python:3.11`, `podman://…`, `fake://`.
    #[arg(value_name = "DSN")]
    pub dsn: String,
}

/// `sandbox exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Command timeout in seconds (default: the sandbox's remaining lifetime).
    #[arg(long, value_name = "S", value_parser = parse_positive_secs)]
    pub timeout: Option<Duration>,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Pass the caller's environment variable NAME to the command as a secret (repeatable).
    /// Its value is read from this process's environment, never from the command line, and
    /// is given to the command's process only: not in the engine's container config, not
    /// in logs.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Pass stdin to the command (automatic when stdin is not a terminal). Not a live
    /// stream: stdin is read to its end (at most 64 MiB) before the command starts and
    /// given to it as its input (`RunOptions::stdin`) — pipes and files work, an
    /// interactive session does not.
    #[arg(short, long)]
    pub interactive: bool,
    /// Only look on this engine (default: every compiled-in one).
    #[arg(long, value_name = "NAME")]
    pub engine: Option<String>,
    /// Print one JSON object instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// Write the sandbox's output to a terminal byte for byte (see `run --raw`).
    #[arg(long)]
    pub raw: bool,
    /// Sandbox id (or a unique prefix) printed by `sandbox create`.
    #[arg(value_name = "ID")]
    pub id: String,
    /// The command and its arguments (after `--`); run directly, not through a shell.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// `sandbox cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Only look on this engine (default: every compiled-in one).
    #[arg(long, value_name = "NAME")]
    pub engine: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Source: a host path, or `ID:PATH` in a sandbox.
    #[arg(value_name = "SRC")]
    pub src: String,
    /// Destination: a host path, or `ID:PATH` in a sandbox.
    #[arg(value_name = "DEST")]
    pub dest: String,
}

/// The egress tiers of `run`, `create` and `egress`: hosts (`pypi.org`), wildcards
/// (`*.example.com`) or CIDRs (`10.0.0.0/8`), each flag repeatable. Most specific first:
/// an exception beats a deny entry, which beats an allow entry, which beats the default.
#[derive(Debug, Clone, Default, Args)]
pub struct HostTiers {
    /// Allow egress to this host, wildcard or CIDR (with nothing else, an allowlist).
    #[arg(long = "allow-host", value_name = "NAME_OR_CIDR")]
    pub allow_hosts: Vec<String>,
    /// Deny this host, wildcard or CIDR, whatever the allow list or the default says.
    #[arg(long = "deny-host", value_name = "NAME_OR_CIDR")]
    pub deny_hosts: Vec<String>,
    /// Reach this host, wildcard or CIDR although a deny entry covers it.
    #[arg(long = "except-host", value_name = "NAME_OR_CIDR")]
    pub except_hosts: Vec<String>,
    /// Reach this TCP port of a service on the host at `host.sandbox.internal` (no other
    /// port or address of the host); with no other flag, the only way out.
    #[arg(long = "host-port", value_name = "PORT")]
    pub host_ports: Vec<u16>,
}

impl HostTiers {
    /// Whether any host flag was given.
    pub fn is_empty(&self) -> bool {
        self.allow_hosts.is_empty()
            && self.deny_hosts.is_empty()
            && self.except_hosts.is_empty()
            && self.host_ports.is_empty()
    }
}

/// `sandbox egress`.
#[derive(Debug, Args)]
pub struct EgressArgs {
    /// Only look on this engine (default: every compiled-in one).
    #[arg(long, value_name = "NAME")]
    pub engine: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Deny all egress (the sandbox keeps its interface; everything is refused).
    #[arg(long, conflicts_with_all = ["allow", "allow_hosts", "deny_hosts", "except_hosts", "host_ports"])]
    pub deny: bool,
    /// Allow all egress but the always-blocked set, or, with host flags, make allow the
    /// default (`--allow --deny-host H`: everything except H).
    #[arg(long)]
    pub allow: bool,
    /// The tiers to set (with `--allow` over a default of allow, else over deny).
    #[command(flatten)]
    pub hosts: HostTiers,
    /// Sandbox id (or a unique prefix) printed by `sandbox create`.
    #[arg(value_name = "ID")]
    pub id: String,
}

/// `sandbox ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only this engine (repeatable; default: every compiled-in one).
    #[arg(long = "engine", value_name = "NAME")]
    pub engines: Vec<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `sandbox kill`.
#[derive(Debug, Args)]
pub struct KillArgs {
    /// Only look on this engine (default: every compiled-in one).
    #[arg(long, value_name = "NAME")]
    pub engine: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Sandbox id (or a unique prefix) printed by `sandbox create`.
    #[arg(value_name = "ID")]
    pub id: String,
}

/// `sandbox extend`.
#[derive(Debug, Args)]
pub struct ExtendArgs {
    /// Only look on this engine (default: every compiled-in one).
    #[arg(long, value_name = "NAME")]
    pub engine: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Sandbox id (or a unique prefix) printed by `sandbox create`.
    #[arg(value_name = "ID")]
    pub id: String,
    /// Seconds to add to the deadline in force.
    #[arg(value_name = "S", value_parser = parse_positive_secs)]
    pub by: Duration,
}

/// `sandbox fork`.
#[derive(Debug, Args)]
pub struct ForkArgs {
    /// Only look on this engine (default: every compiled-in one).
    #[arg(long, value_name = "NAME")]
    pub engine: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// How many forks (1 to 16).
    #[arg(long, short = 'n', value_name = "COUNT", default_value_t = 1)]
    pub count: usize,
    /// Each fork's lifetime in seconds from the fork (default: the original's deadline
    /// in force; never past its --max-lifetime).
    #[arg(long, value_name = "S", value_parser = parse_positive_secs)]
    pub timeout: Option<Duration>,
    /// Sandbox id (or a unique prefix) printed by `sandbox create`.
    #[arg(value_name = "ID")]
    pub id: String,
}

/// `sandbox mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Let tool calls open egress (`network: allow` or an `allow_hosts` list). Off by
    /// default: the model's instructions can come from untrusted content, and egress is how
    /// data leaves.
    #[arg(long)]
    pub allow_egress: bool,
    /// With --allow-egress: the hosts, wildcards or CIDRs egress may be opened to, and
    /// nothing wider (repeatable). Every allow or exception entry a tool call asks for, at
    /// create or in sandbox_set_egress, must lie inside one; network `allow` is refused.
    /// Default: any.
    #[arg(
        long = "egress-host",
        value_name = "NAME_OR_CIDR",
        requires = "allow_egress"
    )]
    pub egress_hosts: Vec<String>,
    /// Let sandboxes run without the in-sandbox agent. By default a `sandbox_create` whose
    /// agent cannot start fails instead of falling back to the engine's exec path, on every
    /// engine that offers the agent.
    #[arg(long)]
    pub allow_engine_exec: bool,
    /// Offer a brokered credential that `sandbox_create` may bind by its variable
    /// (`credentials: ["ENV_VAR"]`), repeatable: `HOST:HEADER=ENV_VAR`,
    /// `'HOST:Authorization=Bearer {ENV_VAR}'` or `HOST:?PARAM=ENV_VAR`, the value read
    /// from this process's environment at start. Tool calls never see the value: inside,
    /// the variable holds a placeholder, and a proxy on this host puts the value into
    /// HTTPS requests to HOST.
    #[arg(long = "credential", value_name = "HOST:HEADER=ENV_VAR")]
    pub credential: Vec<String>,
    /// Let tool calls name images matching PATTERN (repeatable): a reference whose
    /// repository path components and tag may hold `*` (never matching across `/`; the
    /// tag defaults to `latest`, so `team/*:*` is every tag of every image under `team/`),
    /// or a pinned `name@sha256:<digest>` admitting exactly that digest. Names are compared
    /// as the engines read them (`busybox` is `docker.io/library/busybox:latest`). Without
    /// it only the default image (sandbox-rs/python:3.11) may be named; anything else is
    /// refused (SBX_E1000) before the engine pulls it.
    #[arg(long, value_name = "PATTERN")]
    pub allow_image: Vec<String>,
    /// Total memory, in MiB, that all live sandboxes of the server may hold together
    /// (each call may ask for up to 4096). A create past it is refused with SBX_E1402.
    /// Default: 8192.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(6..))]
    pub total_memory_mb: Option<u64>,
    /// Total CPU quota, in cores, that all live sandboxes of the server may hold together
    /// (each call may ask for up to 4). A create past it is refused with SBX_E1402.
    /// Default: 8.
    #[arg(long, value_name = "CORES", value_parser = parse_positive_cores)]
    pub total_cpus: Option<f64>,
    /// Serve MCP over streamable HTTP at http://ADDR/mcp instead of stdin/stdout (ADDR
    /// defaults to 127.0.0.1:8931; port 0 picks a free one). The URL is printed on stdout
    /// once listening. Every request needs a bearer token: without --token-env one is
    /// generated and stored in $XDG_RUNTIME_DIR/sandbox-rs/mcp-IP-PORT.token (mode 0600,
    /// removed on exit; the path is printed on stderr, the token itself only when stderr
    /// is a terminal). A sandbox is usable only by the MCP session that created it; all
    /// are killed when the server stops.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = MCP_HTTP_DEFAULT_ADDR)]
    pub http: Option<SocketAddr>,
    /// Let --http listen on a non-loopback address. Refused without --token-env: whoever
    /// reaches the port can run code.
    #[arg(long, requires = "http")]
    pub allow_non_loopback: bool,
    /// With --http, the bearer token every request must carry (`Authorization: Bearer
    /// <token>`) is the value of environment variable NAME (never given on the command
    /// line, never logged) instead of a generated one.
    #[arg(long, value_name = "NAME", requires = "http")]
    pub token_env: Option<String>,
}

/// `sandbox completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Egress policy of `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkArg {
    /// No network but loopback (default).
    Deny,
    /// Unrestricted outbound traffic (but the always-blocked set).
    Allow,
    /// Nothing reachable, like `deny`, on a network whose policy `sandbox egress` can
    /// open later.
    Closed,
}

/// `sandbox run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Command timeout in seconds (the sandbox lives 30 s longer). Default: 300.
    #[arg(long, value_name = "S", value_parser = parse_positive_secs)]
    pub timeout: Option<Duration>,
    /// Sandbox settings.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Pass the caller's environment variable NAME to the command as a secret (repeatable).
    /// Its value is read from this process's environment, never from the command line, and
    /// is given to the command's process only: not in the engine's container config, not
    /// in logs.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Pass stdin to the command (automatic when stdin is not a terminal). Not a live
    /// stream: stdin is read to its end (at most 64 MiB) before the command starts and
    /// given to it as its input (`RunOptions::stdin`) — pipes and files work, an
    /// interactive session does not.
    #[arg(short, long)]
    pub interactive: bool,
    /// Run the command on a terminal in the sandbox with this one attached, like
    /// `ssh -t`: keys (Ctrl-C included) go to the command, the window size follows this
    /// terminal's, output is written byte for byte. Needs an engine with terminals (Docker
    /// or Podman through the agent, not under runsc; `sandbox doctor`).
    #[arg(short = 't', long, conflicts_with_all = ["json", "interactive"])]
    pub tty: bool,
    /// Print one JSON object instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// Write the sandbox's output to a terminal byte for byte. By default, on a terminal,
    /// control characters but newline and tab (escape sequences) are shown escaped (`\x1b`),
    /// so sandboxed code cannot drive the terminal; pipes and files always get raw bytes.
    #[arg(long)]
    pub raw: bool,
    /// Where to run: `docker://sandbox-rs/busybox:latest`, `podman://…`, `fake://`.
    #[arg(value_name = "DSN")]
    pub dsn: String,
    /// The command and its arguments (after `--`); run directly, not through a shell.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// `sandbox demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Where to run the demo.
    #[arg(value_name = "DSN", default_value = "docker://sandbox-rs/python:3.11")]
    pub dsn: String,
}

/// `sandbox doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Check only this engine (repeatable; default: every compiled-in and registered one).
    #[arg(long = "engine", value_name = "NAME")]
    pub engines: Vec<String>,
}

/// `sandbox reap`.
#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Kill (and remove) listed sandboxes whose owner process is proven gone or whose
    /// deadline has passed. Without it, only list. The whole command gives up after 60 s.
    #[arg(long)]
    pub kill: bool,
    /// With --kill, also kill live sandboxes (owner alive or unverifiable, deadline
    /// ahead). Sandboxes without the labels sandbox-rs sets are never killed.
    #[arg(long, requires = "kill")]
    pub force: bool,
    /// Only sandboxes with this metadata label (repeatable; `io.sandbox-rs.*` keys as given).
    #[arg(long = "label", value_name = "K=V", value_parser = parse_key_value)]
    pub labels: Vec<(String, String)>,
    /// Only sandboxes created longer ago than this: `30s`, `10m`, `2h`, `1d`.
    #[arg(long, value_name = "DUR", value_parser = parse_age)]
    pub older_than: Option<Duration>,
    /// Only this sandbox id, or a unique prefix of it (repeatable).
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<String>,
    /// Only this engine (repeatable; default: every compiled-in and registered one).
    #[arg(long = "engine", value_name = "NAME")]
    pub engines: Vec<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl ReapArgs {
    /// The label filter as a map.
    pub fn label_map(&self) -> BTreeMap<String, String> {
        self.labels.iter().cloned().collect()
    }
}

impl Cmd {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        match self {
            Cmd::Run(a) => a.json,
            Cmd::Demo(a) => a.json,
            Cmd::Doctor(a) => a.json,
            Cmd::Reap(a) => a.json,
            Cmd::Create(a) => a.json,
            Cmd::Exec(a) => a.json,
            Cmd::Cp(a) => a.json,
            Cmd::Ls(a) => a.json,
            Cmd::Kill(a) | Cmd::Pause(a) | Cmd::Resume(a) | Cmd::Stop(a) | Cmd::Start(a) => a.json,
            Cmd::Egress(a) => a.json,
            Cmd::Extend(a) => a.json,
            Cmd::Fork(a) => a.json,
            Cmd::Mcp(_) | Cmd::Completions(_) => false,
        }
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}

fn parse_positive_secs(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("expected seconds in (0, 86400], got {s:?}")),
    }
}

/// A positive, finite number of cores.
fn parse_positive_cores(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1024.0 => Ok(v),
        _ => Err(format!(
            "expected a number of cores in (0, 1024], got {s:?}"
        )),
    }
}

/// `30s`, `10m`, `2h`, `1d`.
pub fn parse_age(s: &str) -> Result<Duration, String> {
    let bad = || format!("expected a number with a unit (30s, 10m, 2h, 1d), got {s:?}");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(secs).map(Duration::from_secs).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(parse_age("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_age("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_age("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_age("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["", "10", "m", "1w", "-1s", "1.5h", "99999999999999999999d"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn key_values() {
        assert_eq!(parse_key_value("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(parse_key_value("=x").is_err());
        assert!(parse_key_value("novalue").is_err());
    }

    #[test]
    fn grammar_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
