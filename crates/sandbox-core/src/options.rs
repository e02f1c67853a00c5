//! Typed options for creating sandboxes and running work in them.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::labels::{validate_env_key, validate_metadata};
use crate::{
    EffectiveResources, IsolationTier, NetworkPolicy, Resources, Result, SandboxError, Secret,
};

/// Default sandbox lifetime.
pub const DEFAULT_SANDBOX_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest lifetime accepted; anything above counts as "unbounded" and is refused.
pub const MAX_SANDBOX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Shortest `CreateOptions::idle_timeout` accepted: idleness is checked once a second.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(1);
/// Default working directory inside every sandbox.
pub const DEFAULT_WORKDIR: &str = "/work";
/// Default cap on buffered output per stream for `run` / `run_code`.
pub const DEFAULT_OUTPUT_CAP: usize = 64 * 1024 * 1024;

/// Options for [`Backend::create`](crate::Backend::create).
///
/// `Debug` shows env and secret *keys* only, never their values.
#[derive(Clone, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default)
)]
#[non_exhaustive]
pub struct CreateOptions {
    /// Template (image) name; `None` uses the backend's default.
    pub template: Option<String>,
    /// Resource caps.
    pub resources: Resources,
    /// Network policy (default deny).
    pub network: NetworkPolicy,
    /// Environment for every command.
    /// Serialised as `env_keys` (names only, like `Debug`: env values are redacted from
    /// audit records too, since they may carry credentials); deserialised from `env`.
    #[cfg_attr(
        feature = "serde",
        serde(
            rename(serialize = "env_keys", deserialize = "env"),
            serialize_with = "crate::serialization::keys_only"
        )
    )]
    pub env: BTreeMap<String, String>,
    /// Secrets exposed to commands as environment variables, never stored in engine
    /// configuration or printed. Serialised as name → `"***"`; never deserialised (a
    /// secret does not travel through JSON), so it is empty after a round trip.
    #[cfg_attr(feature = "serde", serde(skip_deserializing))]
    pub secrets: BTreeMap<String, Secret>,
    /// Sandbox lifetime, enforced provider-side. Positive, at most [`MAX_SANDBOX_TIMEOUT`].
    pub timeout: Duration,
    /// Labels propagated to the engine as `io.sandbox-rs.meta.<key>`.
    pub metadata: BTreeMap<String, String>,
    /// Minimum isolation tier, checked before anything is provisioned.
    pub require_isolation: Option<IsolationTier>,
    /// Working directory (default [`DEFAULT_WORKDIR`]).
    pub workdir: Option<String>,
    /// When the template image is pulled from its registry (default
    /// [`PullPolicy::Missing`]). Backends without images ignore it.
    pub pull: PullPolicy,
    /// Refuse to create the sandbox unless its processes run under the in-sandbox agent
    /// ([`Capability::AGENT`](crate::Capability::AGENT)): a supervisor that is the
    /// sandbox's first process, enforces its lifetime and kills timed-out process trees
    /// from inside. Without it a container backend may fall back to the engine's exec
    /// path, where sandboxed root can stop the main process (only the host-side sweep
    /// then bounds the lifetime) and a timeout's kill runs the image's own `/bin/sh`.
    /// Refused with `CapabilityNotSupported` by a backend that does not declare `AGENT`
    /// (the agent is off, or the backend has none), and with `Configuration` when the
    /// agent could not be started for this sandbox. Default `false`.
    pub require_agent: bool,
    /// The longest the sandbox may live, counted from create, however often
    /// [`Sandbox::extend`](crate::Sandbox::extend) moves its deadline. `None` (the
    /// default) means `timeout`: the deadline set at create is final and every extension
    /// is refused. At least `timeout`, at most [`MAX_SANDBOX_TIMEOUT`]; longer than
    /// `timeout` needs [`Capability::EXTEND_LIFETIME`](crate::Capability::EXTEND_LIFETIME).
    /// It is written on the sandbox at create (an engine label, and the in-sandbox
    /// agent's argument), so no request, from the host or from inside, moves the deadline
    /// past it.
    pub max_lifetime: Option<Duration>,
    /// End the sandbox once it has had no API call and no running process for this long
    /// (a command still running, even a silent one, keeps it): every process ends and the
    /// handle's calls fail with `SandboxGone`, and the sandbox is removed, files and all
    /// (container backends: by the creating process at once, else by the next sweep of
    /// any sandbox-rs process; docs/lifecycle.md). `None` (the default): no idle limit,
    /// only the lifetime. Needs
    /// [`Capability::IDLE_TIMEOUT`](crate::Capability::IDLE_TIMEOUT). At least
    /// [`MIN_IDLE_TIMEOUT`], at most [`MAX_SANDBOX_TIMEOUT`].
    pub idle_timeout: Option<Duration>,
    /// The sandbox's hostname (what `hostname` and `/etc/hostname` say inside). `None`
    /// (the default): the backend's (an engine names it after the container id). A
    /// hostname of at most 63 bytes: dot-separated labels of ASCII letters, digits and
    /// inner hyphens.
    pub hostname: Option<String>,
    /// SSH agent forwarding: a socket inside the sandbox (`SSH_AUTH_SOCK` in every
    /// command's environment) through which its programs list and sign with the
    /// selected keys of an agent on the host, and do nothing else with it. The keys
    /// never enter the sandbox; the socket stops working when the sandbox is killed.
    /// Needs [`Capability::SSH_AGENT`](crate::Capability::SSH_AGENT). `None` (the
    /// default): no socket.
    pub ssh_agent: Option<crate::SshAgentOptions>,
    /// Host repositories served to the sandbox over git's smart HTTP through a gate on
    /// the host (clone URLs in `SANDBOX_GIT_URL`, `SANDBOX_GIT_URL_1`, … of every
    /// command): opened by a per-sandbox token, pushes only under each repository's
    /// prefix and only with read-write access, never the repository's config, remotes
    /// or credentials; gone at kill. Needs
    /// [`Capability::GIT_GATE`](crate::Capability::GIT_GATE). Empty (the default): none.
    /// At most [`MAX_GIT_REPOS`](crate::git_gate::MAX_GIT_REPOS).
    pub git_repos: Vec<crate::GitRepo>,
    /// Brokered credentials: each a secret bound to destination hosts and to one place in
    /// a request. Inside the sandbox its environment variable holds an opaque placeholder;
    /// a proxy on the host puts the real value in requests to the bound hosts only. The
    /// secret never enters the sandbox. Needs
    /// [`Capability::CREDENTIALS`](crate::Capability::CREDENTIALS). At most
    /// [`MAX_CREDENTIALS`](crate::credential::MAX_CREDENTIALS). Serialised with the
    /// secrets as `"***"`; never deserialised (a secret does not travel through JSON).
    #[cfg_attr(feature = "serde", serde(skip_deserializing))]
    pub credentials: Vec<crate::Credential>,
}

/// When a backend pulls the template image from its registry before creating a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum PullPolicy {
    /// Pull only when the engine does not have the image (what `docker run` does).
    #[default]
    Missing,
    /// Pull every time, so a moved tag is followed; concurrent creates still pull once.
    Always,
    /// Never pull: a missing image is an error (offline or pinned deployments).
    Never,
}

impl PullPolicy {
    /// The policy's name (`missing`, `always`, `never`).
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Missing => "missing",
            PullPolicy::Always => "always",
            PullPolicy::Never => "never",
        }
    }

    /// Parses a policy name (`missing`, `always`, `never`).
    pub fn parse(s: &str) -> Option<PullPolicy> {
        match s {
            "missing" => Some(PullPolicy::Missing),
            "always" => Some(PullPolicy::Always),
            "never" => Some(PullPolicy::Never),
            _ => None,
        }
    }
}

impl fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            template: None,
            resources: Resources::default(),
            network: NetworkPolicy::default(),
            env: BTreeMap::new(),
            secrets: BTreeMap::new(),
            timeout: DEFAULT_SANDBOX_TIMEOUT,
            metadata: BTreeMap::new(),
            require_isolation: None,
            workdir: None,
            pull: PullPolicy::Missing,
            require_agent: false,
            max_lifetime: None,
            idle_timeout: None,
            hostname: None,
            ssh_agent: None,
            git_repos: Vec::new(),
            credentials: Vec::new(),
        }
    }
}

impl fmt::Debug for CreateOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateOptions")
            .field("template", &self.template)
            .field("resources", &self.resources)
            .field("network", &self.network)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .field("secret_keys", &self.secrets.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("metadata", &self.metadata)
            .field("require_isolation", &self.require_isolation)
            .field("workdir", &self.workdir)
            .field("pull", &self.pull)
            .field("require_agent", &self.require_agent)
            .field("max_lifetime", &self.max_lifetime)
            .field("idle_timeout", &self.idle_timeout)
            .field("hostname", &self.hostname)
            .field("ssh_agent", &self.ssh_agent)
            .field("git_repos", &self.git_repos)
            .field("credentials", &self.credentials)
            .finish()
    }
}

impl CreateOptions {
    /// Options with the given template.
    pub fn new(template: impl Into<String>) -> Self {
        CreateOptions::default().template(template)
    }
    /// Sets the template.
    pub fn template(mut self, t: impl Into<String>) -> Self {
        self.template = Some(t.into());
        self
    }
    /// Sets the resource caps.
    pub fn resources(mut self, r: Resources) -> Self {
        self.resources = r;
        self
    }
    /// Sets the network policy.
    pub fn network(mut self, n: NetworkPolicy) -> Self {
        self.network = n;
        self
    }
    /// Adds an environment variable.
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.insert(k.into(), v.into());
        self
    }
    /// Adds a secret.
    pub fn secret(mut self, k: impl Into<String>, v: impl Into<Secret>) -> Self {
        self.secrets.insert(k.into(), v.into());
        self
    }
    /// Sets the lifetime.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }
    /// Adds a metadata label.
    pub fn metadata(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.metadata.insert(k.into(), v.into());
        self
    }
    /// Requires a minimum isolation tier.
    pub fn require_isolation(mut self, tier: IsolationTier) -> Self {
        self.require_isolation = Some(tier);
        self
    }
    /// Requires (`true`) that the sandbox's processes run under the in-sandbox agent, or
    /// no sandbox at all (see the `require_agent` field).
    pub fn require_agent(mut self, required: bool) -> Self {
        self.require_agent = required;
        self
    }
    /// Sets the working directory.
    pub fn workdir(mut self, w: impl Into<String>) -> Self {
        self.workdir = Some(w.into());
        self
    }
    /// Sets when the template image is pulled.
    pub fn pull(mut self, policy: PullPolicy) -> Self {
        self.pull = policy;
        self
    }
    /// Sets the longest the sandbox may live, extensions included (see the
    /// `max_lifetime` field).
    pub fn max_lifetime(mut self, max: Duration) -> Self {
        self.max_lifetime = Some(max);
        self
    }
    /// Ends and removes the sandbox after `idle` with no API call and no running process
    /// (see the `idle_timeout` field).
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = Some(idle);
        self
    }
    /// Sets the sandbox's hostname.
    pub fn hostname(mut self, name: impl Into<String>) -> Self {
        self.hostname = Some(name.into());
        self
    }
    /// Forwards the selected keys of a host ssh-agent into the sandbox (see the
    /// `ssh_agent` field).
    pub fn ssh_agent(mut self, agent: crate::SshAgentOptions) -> Self {
        self.ssh_agent = Some(agent);
        self
    }

    /// Serves the host repository `repo` to the sandbox through the git gate (see the
    /// `git_repos` field); call once per repository.
    pub fn git_repo(mut self, repo: crate::GitRepo) -> Self {
        self.git_repos.push(repo);
        self
    }

    /// Adds a brokered credential (see the `credentials` field).
    pub fn credential(mut self, credential: crate::Credential) -> Self {
        self.credentials.push(credential);
        self
    }

    /// The maximum lifetime in effect: `max_lifetime`, else `timeout`.
    pub fn effective_max_lifetime(&self) -> Duration {
        self.max_lifetime.unwrap_or(self.timeout)
    }

    /// The working directory in effect.
    pub fn effective_workdir(&self) -> &str {
        self.workdir.as_deref().unwrap_or(DEFAULT_WORKDIR)
    }

    /// Validates everything that can be checked without a backend, and returns the
    /// effective resources. Adapters call this first, before provisioning anything.
    pub fn validate(&self) -> Result<EffectiveResources> {
        validate_lifetime(self.timeout)?;
        self.validate_lifetime_limits()?;
        if let Some(t) = &self.template
            && (t.is_empty() || t.chars().any(|c| c.is_control() || c.is_whitespace()))
        {
            return Err(SandboxError::config(
                format!("template {t:?} is not a valid image name"),
                "use a name like `sandbox-rs/python:3.11`",
            ));
        }
        if self.require_isolation == Some(IsolationTier::Unknown) {
            return Err(SandboxError::config(
                "require_isolation(Unknown) can never be satisfied",
                "require IsolationTier::Container or stronger, or leave it unset",
            ));
        }
        for (k, v) in &self.env {
            validate_env_key(k)?;
            if v.contains('\0') {
                return Err(SandboxError::config(
                    format!("env value of `{k}` contains a NUL byte"),
                    "remove the NUL byte",
                ));
            }
        }
        for (k, v) in &self.secrets {
            validate_env_key(k)?;
            if v.expose().contains('\0') {
                return Err(SandboxError::config(
                    format!("secret `{k}` contains a NUL byte"),
                    "remove the NUL byte",
                ));
            }
            if self.env.contains_key(k) {
                return Err(SandboxError::config(
                    format!("`{k}` is both an env variable and a secret"),
                    "give it only as a secret",
                ));
            }
        }
        validate_metadata(&self.metadata)?;
        validate_workdir(self.effective_workdir())?;
        if let Some(h) = &self.hostname {
            validate_hostname(h)?;
        }
        if let Some(a) = &self.ssh_agent {
            a.validate()?;
            if self.env.contains_key("SSH_AUTH_SOCK") || self.secrets.contains_key("SSH_AUTH_SOCK")
            {
                return Err(SandboxError::config(
                    "SSH_AUTH_SOCK is set in env while ssh_agent sets it to the sandbox's socket",
                    "leave SSH_AUTH_SOCK out of env: ssh_agent sets it in every command",
                ));
            }
        }
        crate::git_gate::validate_options(&self.git_repos)?;
        for i in 0..self.git_repos.len() {
            let var = crate::git_gate::git_url_var(i);
            if self.env.contains_key(&var) || self.secrets.contains_key(&var) {
                return Err(SandboxError::config(
                    format!("{var} is set in env while git_repo sets it to the gate's URL"),
                    format!("leave {var} out of env: git_repo sets it in every command"),
                ));
            }
        }
        crate::credential::validate_all(&self.credentials)?;
        for c in &self.credentials {
            if self.env.contains_key(&c.env_var) || self.secrets.contains_key(&c.env_var) {
                return Err(SandboxError::config(
                    format!(
                        "{} is set in env while a credential puts its placeholder there",
                        c.env_var
                    ),
                    "leave the credential's variable out of env and secrets",
                ));
            }
        }
        if !self.credentials.is_empty() && matches!(self.network.egress, crate::Egress::Deny) {
            return Err(SandboxError::config(
                "credentials need a network, and egress Deny gives the sandbox none",
                "allow egress (an allowlist is enough: the bound hosts are reached through \
                 the host's proxy whatever it lists)",
            ));
        }
        self.network.validate()?;
        self.resources.effective()
    }
}

impl CreateOptions {
    /// The maximum lifetime lies between the lifetime and [`MAX_SANDBOX_TIMEOUT`], the
    /// idle limit between a second and [`MAX_SANDBOX_TIMEOUT`].
    fn validate_lifetime_limits(&self) -> Result<()> {
        if let Some(max) = self.max_lifetime {
            if max < self.timeout {
                return Err(SandboxError::config(
                    format!(
                        "max_lifetime {max:?} is shorter than the lifetime (timeout {:?})",
                        self.timeout
                    ),
                    "set max_lifetime to at least the timeout, or leave it unset (then the lifetime cannot be extended)",
                ));
            }
            if max > MAX_SANDBOX_TIMEOUT {
                return Err(SandboxError::config(
                    format!("max_lifetime {max:?} is effectively unbounded"),
                    format!(
                        "use at most {MAX_SANDBOX_TIMEOUT:?}; a sandbox lifetime is always bounded"
                    ),
                ));
            }
        }
        if let Some(idle) = self.idle_timeout
            && (idle < MIN_IDLE_TIMEOUT || idle > MAX_SANDBOX_TIMEOUT)
        {
            return Err(SandboxError::config(
                format!("idle_timeout {idle:?} is out of range"),
                format!(
                    "use between {MIN_IDLE_TIMEOUT:?} and {MAX_SANDBOX_TIMEOUT:?}, or leave it unset"
                ),
            ));
        }
        Ok(())
    }
}

/// The deadline `by` after `deadline`, or the refusal when it would pass `max_deadline`
/// (the end `CreateOptions::max_lifetime` set at create; `max_lifetime` names it). Every
/// backend's `Sandbox::extend` decides through this, so the refusal reads the same
/// everywhere. Deadlines are whole seconds where the sandbox keeps them so: the result
/// is rounded up to the second when `whole_seconds`.
pub fn extended_deadline(
    deadline: std::time::SystemTime,
    max_deadline: std::time::SystemTime,
    by: Duration,
    whole_seconds: bool,
) -> Result<std::time::SystemTime> {
    if by.is_zero() {
        return Err(SandboxError::config(
            "extend needs a positive duration",
            "pass the time to add, e.g. Duration::from_secs(60)",
        ));
    }
    let mut moved = deadline
        .checked_add(by)
        .unwrap_or(max_deadline + Duration::from_secs(1));
    if whole_seconds {
        let since = moved
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        if since.subsec_nanos() > 0 {
            moved = std::time::UNIX_EPOCH + Duration::from_secs(since.as_secs() + 1);
        }
    }
    if moved > max_deadline {
        let left = max_deadline
            .duration_since(deadline)
            .unwrap_or_default()
            .as_secs();
        return Err(SandboxError::resource_limit(
            format!(
                "maximum lifetime (CreateOptions::max_lifetime, ends at Unix second {}; {left} s of extension left)",
                max_deadline
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs()
            ),
            Some(format!(
                "extend by at most {left} s, or create the sandbox with a longer \
                 CreateOptions::max_lifetime (at most {} s)",
                MAX_SANDBOX_TIMEOUT.as_secs()
            )),
        ));
    }
    Ok(moved)
}

/// Refuses a zero or unbounded sandbox lifetime.
pub fn validate_lifetime(t: Duration) -> Result<()> {
    if t.is_zero() {
        return Err(SandboxError::config(
            "sandbox timeout must be positive",
            "set CreateOptions::timeout to the sandbox lifetime, e.g. Duration::from_secs(300)",
        ));
    }
    if t > MAX_SANDBOX_TIMEOUT {
        return Err(SandboxError::config(
            format!("sandbox timeout {t:?} is effectively unbounded"),
            format!("use at most {MAX_SANDBOX_TIMEOUT:?}; a sandbox lifetime is always bounded"),
        ));
    }
    Ok(())
}

/// The longest hostname the kernel keeps (`HOST_NAME_MAX` is 64 with the terminating NUL).
pub const MAX_HOSTNAME_LEN: usize = 63;

/// A hostname: 1 to [`MAX_HOSTNAME_LEN`] bytes of dot-separated labels, each of ASCII
/// letters, digits and hyphens, not starting or ending with a hyphen.
fn validate_hostname(h: &str) -> Result<()> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if h.is_empty() || h.len() > MAX_HOSTNAME_LEN || !h.split('.').all(label_ok) {
        return Err(SandboxError::config(
            format!(
                "hostname {:?} is not a hostname of at most {MAX_HOSTNAME_LEN} bytes",
                h.chars().take(80).collect::<String>()
            ),
            "use letters, digits and inner hyphens in dot-separated labels, e.g. `worker-1` \
             or `build.local`",
        ));
    }
    Ok(())
}

fn validate_workdir(w: &str) -> Result<()> {
    if !w.starts_with('/') || w.contains('\0') || w.split('/').any(|s| s == "..") {
        return Err(SandboxError::config(
            format!("workdir {w:?} must be an absolute path without `..`"),
            "use e.g. `/work`",
        ));
    }
    Ok(())
}

/// A command: an argv list (never through a shell) or a string run with `sh -c`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Command {
    /// Executed directly, no shell.
    Argv(Vec<String>),
    /// Executed as `sh -c <string>`.
    Shell(String),
}

impl Command {
    /// The argv the engine executes (`["sh", "-c", s]` for a shell string).
    pub fn to_argv(&self) -> Vec<String> {
        match self {
            Command::Argv(v) => v.clone(),
            Command::Shell(s) => vec!["sh".into(), "-c".into(), s.clone()],
        }
    }

    /// Refuses an empty argv or NUL bytes.
    pub fn validate(&self) -> Result<()> {
        let bad = match self {
            Command::Argv(v) => {
                v.is_empty() || v[0].is_empty() || v.iter().any(|a| a.contains('\0'))
            }
            Command::Shell(s) => s.contains('\0'),
        };
        if bad {
            return Err(SandboxError::config(
                "command is empty or contains a NUL byte",
                "give at least a program name, without NUL bytes",
            ));
        }
        Ok(())
    }
}

impl From<&str> for Command {
    fn from(s: &str) -> Self {
        Command::Shell(s.to_string())
    }
}
impl From<String> for Command {
    fn from(s: String) -> Self {
        Command::Shell(s)
    }
}
impl From<Vec<String>> for Command {
    fn from(v: Vec<String>) -> Self {
        Command::Argv(v)
    }
}
impl From<Vec<&str>> for Command {
    fn from(v: Vec<&str>) -> Self {
        Command::Argv(v.into_iter().map(String::from).collect())
    }
}
impl From<&[&str]> for Command {
    fn from(v: &[&str]) -> Self {
        Command::Argv(v.iter().map(|s| s.to_string()).collect())
    }
}
impl<const N: usize> From<[&str; N]> for Command {
    fn from(v: [&str; N]) -> Self {
        Command::Argv(v.iter().map(|s| s.to_string()).collect())
    }
}

/// Options for [`Sandbox::run`](crate::Sandbox::run) and
/// [`Sandbox::stream`](crate::Sandbox::stream).
#[derive(Clone, Default, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default)
)]
#[non_exhaustive]
pub struct RunOptions {
    /// Timeout; `None` inherits the sandbox lifetime (never unbounded).
    pub timeout: Option<Duration>,
    /// Extra environment for this command.
    /// Serialised as `env_keys` (names only, like `Debug`: env values are redacted from
    /// audit records too, since they may carry credentials); deserialised from `env`.
    #[cfg_attr(
        feature = "serde",
        serde(
            rename(serialize = "env_keys", deserialize = "env"),
            serialize_with = "crate::serialization::keys_only"
        )
    )]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the sandbox workdir).
    pub workdir: Option<String>,
    /// Cap on buffered output per stream for `run` (default [`DEFAULT_OUTPUT_CAP`]).
    pub output_cap: Option<usize>,
    /// Bytes given to the command's standard input, which is then closed; `None` (the
    /// default): the command reads end of input at once. Written while the output is
    /// read, so a command may echo more than a pipe holds; a command that exits without
    /// reading it all is not an error (as with a shell pipe). Serialised as its length
    /// only (`stdin_len`: it may carry data a log must not), deserialised from `stdin`.
    #[cfg_attr(
        feature = "serde",
        serde(
            rename(serialize = "stdin_len", deserialize = "stdin"),
            serialize_with = "crate::serialization::len_only",
            deserialize_with = "crate::serialization::opt_bytes_text"
        )
    )]
    pub stdin: Option<bytes::Bytes>,
    /// Keep the command's stdin open for live input written through
    /// [`Process::input`](crate::Process::input) while its output is read, until
    /// [`ProcessInput::end`](crate::ProcessInput::end) (needs
    /// [`Capability::STDIN`](crate::Capability); not combinable with
    /// [`stdin`](Self::stdin)). For `stream`; `run` of such a command reads end of input
    /// at once.
    pub interactive: bool,
    /// Run the command on a pseudo-terminal of this size (needs
    /// [`Capability::PTY`](crate::Capability)): it sees a terminal on stdin, stdout and
    /// stderr (`isatty` is true, both streams arrive merged as stdout, lines end in
    /// `\r\n`), and a streamed process takes input and window sizes through
    /// [`Process::input`](crate::Process::input). Not combinable with
    /// [`stdin`](Self::stdin).
    pub pty: Option<PtySize>,
}

/// A pseudo-terminal's size in character cells (default 24 rows × 80 columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PtySize {
    /// Rows (at least 1).
    pub rows: u16,
    /// Columns (at least 1).
    pub cols: u16,
}

impl PtySize {
    /// A size of `rows` × `cols`.
    pub fn new(rows: u16, cols: u16) -> Self {
        PtySize { rows, cols }
    }

    /// `Configuration` unless both dimensions are positive.
    pub fn validate(&self) -> Result<()> {
        if self.rows == 0 || self.cols == 0 {
            return Err(SandboxError::config(
                format!("terminal size {}x{} is empty", self.rows, self.cols),
                "give at least one row and one column, e.g. PtySize::new(24, 80)",
            ));
        }
        Ok(())
    }
}

impl Default for PtySize {
    fn default() -> Self {
        PtySize { rows: 24, cols: 80 }
    }
}

impl fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunOptions")
            .field("timeout", &self.timeout)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .field("workdir", &self.workdir)
            .field("output_cap", &self.output_cap)
            .field("stdin_len", &self.stdin.as_ref().map(|b| b.len()))
            .field("interactive", &self.interactive)
            .field("pty", &self.pty)
            .finish()
    }
}

impl RunOptions {
    /// Sets the timeout.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
    /// Adds an environment variable.
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.insert(k.into(), v.into());
        self
    }
    /// Sets the working directory.
    pub fn workdir(mut self, w: impl Into<String>) -> Self {
        self.workdir = Some(w.into());
        self
    }
    /// Sets the buffered output cap per stream.
    pub fn output_cap(mut self, bytes: usize) -> Self {
        self.output_cap = Some(bytes);
        self
    }
    /// Gives the command `data` on its standard input (then end of input).
    pub fn stdin(mut self, data: impl Into<bytes::Bytes>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    /// Keeps stdin open for live input through `Process::input` (needs `STDIN`).
    pub fn interactive(mut self) -> Self {
        self.interactive = true;
        self
    }

    /// Runs the command on a pseudo-terminal of `size` (needs `PTY`).
    pub fn pty(mut self, size: PtySize) -> Self {
        self.pty = Some(size);
        self
    }

    /// Validates and resolves the timeout against the sandbox's remaining lifetime.
    pub fn validate(&self, remaining_lifetime: Duration) -> Result<Duration> {
        if self.interactive && self.stdin.is_some() {
            return Err(SandboxError::config(
                "RunOptions::stdin and RunOptions::interactive cannot be combined",
                "write the input through Process::input, or give it all with RunOptions::stdin",
            ));
        }
        if let Some(size) = &self.pty {
            size.validate()?;
            if self.stdin.is_some() {
                return Err(SandboxError::config(
                    "RunOptions::stdin and RunOptions::pty cannot be combined",
                    "stream the command and type into it with Process::input",
                ));
            }
        }
        for k in self.env.keys() {
            validate_env_key(k)?;
        }
        if let Some(w) = &self.workdir
            && w.contains('\0')
        {
            return Err(SandboxError::config(
                "workdir contains a NUL byte",
                "remove it",
            ));
        }
        if self.output_cap == Some(0) {
            return Err(SandboxError::config(
                "output_cap must be positive",
                "leave it unset for 64 MiB",
            ));
        }
        resolve_timeout(self.timeout, remaining_lifetime)
    }
}

/// Resolves a per-call timeout: zero is refused, `None` inherits the remaining lifetime.
pub fn resolve_timeout(t: Option<Duration>, remaining_lifetime: Duration) -> Result<Duration> {
    match t {
        Some(t) if t.is_zero() => Err(SandboxError::config(
            "timeout must be positive",
            "give a timeout above zero, or None to inherit the sandbox lifetime",
        )),
        Some(t) => Ok(t.min(remaining_lifetime.max(Duration::from_millis(1)))),
        None => Ok(remaining_lifetime.max(Duration::from_millis(1))),
    }
}

/// Language for [`Sandbox::run_code`](crate::Sandbox::run_code).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
#[non_exhaustive]
pub enum Language {
    /// Python 3 (`python3`).
    #[default]
    Python,
}

impl Language {
    /// Interpreter binary name.
    pub fn interpreter(self) -> &'static str {
        match self {
            Language::Python => "python3",
        }
    }
}

/// Options for [`Sandbox::run_code`](crate::Sandbox::run_code).
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default)
)]
#[non_exhaustive]
pub struct CodeOptions {
    /// Language (default Python).
    pub language: Language,
    /// Persistent interpreter context (needs `STATEFUL_CODE`).
    pub context_id: Option<String>,
    /// Timeout; `None` inherits the sandbox lifetime.
    pub timeout: Option<Duration>,
    /// Cap on buffered output per stream (default [`DEFAULT_OUTPUT_CAP`]).
    pub output_cap: Option<usize>,
}

impl CodeOptions {
    /// Sets the language.
    pub fn language(mut self, l: Language) -> Self {
        self.language = l;
        self
    }
    /// Uses a persistent interpreter context.
    pub fn context(mut self, id: impl Into<String>) -> Self {
        self.context_id = Some(id.into());
        self
    }
    /// Sets the timeout.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
    /// Sets the buffered output cap per stream (default [`DEFAULT_OUTPUT_CAP`]).
    pub fn output_cap(mut self, bytes: usize) -> Self {
        self.output_cap = Some(bytes);
        self
    }

    /// Validates the context id and resolves the timeout.
    pub fn validate(&self, remaining_lifetime: Duration) -> Result<Duration> {
        if let Some(c) = &self.context_id
            && (c.is_empty()
                || c.len() > 64
                || !c
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_'))
        {
            return Err(SandboxError::config(
                format!("context id {c:?} is invalid"),
                "use 1-64 characters from [A-Za-z0-9_-]",
            ));
        }
        if self.output_cap == Some(0) {
            return Err(SandboxError::config(
                "output_cap must be positive",
                "leave it unset for 64 MiB",
            ));
        }
        resolve_timeout(self.timeout, remaining_lifetime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn hostnames_are_checked() {
        for good in ["a", "worker-1", "build.local", &"x".repeat(63)] {
            assert!(
                CreateOptions::new("t").hostname(good).validate().is_ok(),
                "{good}"
            );
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a..b",
            "a b",
            "a_b",
            "é",
            &"x".repeat(64),
            "a\nb",
        ] {
            let e = CreateOptions::new("t")
                .hostname(bad)
                .validate()
                .unwrap_err();
            assert_eq!(e.code(), crate::ErrorCode::Configuration, "{bad:?}");
        }
    }

    #[test]
    fn pty_sizes_are_checked_and_not_combined_with_given_stdin() {
        let left = Duration::from_secs(60);
        assert!(
            RunOptions::default()
                .pty(PtySize::default())
                .validate(left)
                .is_ok()
        );
        assert_eq!(PtySize::default(), PtySize::new(24, 80));
        for empty in [PtySize::new(0, 80), PtySize::new(24, 0)] {
            let e = RunOptions::default().pty(empty).validate(left).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Configuration);
        }
        let e = RunOptions::default()
            .pty(PtySize::default())
            .stdin("x")
            .validate(left)
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert!(format!("{:?}", RunOptions::default().pty(PtySize::new(3, 4))).contains("rows: 3"));
        let e = RunOptions::default()
            .interactive()
            .stdin("x")
            .validate(left)
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert!(RunOptions::default().interactive().validate(left).is_ok());
    }

    #[test]
    fn code_output_cap_setter_and_zero_refused() {
        let o = CodeOptions::default().output_cap(1024);
        assert_eq!(o.output_cap, Some(1024));
        let e = CodeOptions::default()
            .output_cap(0)
            .validate(Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration);
    }

    #[test]
    fn debug_hides_values() {
        let o = CreateOptions::default()
            .env("A", "plainvalue")
            .secret("TOKEN", "hunter2");
        let d = format!("{o:?}");
        assert!(!d.contains("plainvalue") && !d.contains("hunter2"), "{d}");
        assert!(d.contains("TOKEN"));
    }

    #[test]
    fn lifetime_bounds() {
        let code = |t| {
            CreateOptions::default()
                .timeout(t)
                .validate()
                .unwrap_err()
                .code()
        };
        assert_eq!(code(Duration::ZERO), ErrorCode::Configuration);
        assert_eq!(code(Duration::MAX), ErrorCode::Configuration);
        assert!(CreateOptions::default().validate().is_ok());
    }

    #[test]
    fn none_inherits_and_zero_refused() {
        let life = Duration::from_secs(10);
        assert_eq!(resolve_timeout(None, life).unwrap(), life);
        assert_eq!(
            resolve_timeout(Some(Duration::from_secs(99)), life).unwrap(),
            life
        );
        assert!(resolve_timeout(Some(Duration::ZERO), life).is_err());
    }

    #[test]
    fn reserved_and_control_refused() {
        for o in [
            CreateOptions::default().metadata("io.sandbox-rs.managed", "x"),
            CreateOptions::default().metadata("k", "a\nb"),
            CreateOptions::default().env("A=B", "x"),
            CreateOptions::default().env("A\u{1}", "x"),
            CreateOptions::default().require_isolation(IsolationTier::Unknown),
            CreateOptions::default().workdir("relative"),
        ] {
            assert_eq!(
                o.validate().unwrap_err().code(),
                ErrorCode::Configuration,
                "{o:?}"
            );
        }
    }

    #[test]
    fn command_forms() {
        assert_eq!(Command::from("echo hi").to_argv(), ["sh", "-c", "echo hi"]);
        assert_eq!(Command::from(["echo", "hi"]).to_argv(), ["echo", "hi"]);
        assert!(Command::Argv(vec![]).validate().is_err());
    }

    #[test]
    fn an_extension_adds_time_up_to_the_maximum_and_no_further() {
        use std::time::UNIX_EPOCH;
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let d = extended_deadline(at(100), at(200), Duration::from_secs(60), true).unwrap();
        assert_eq!(d, at(160));
        assert_eq!(
            extended_deadline(at(100), at(200), Duration::from_millis(1500), true).unwrap(),
            at(102),
            "rounded up, never cut"
        );
        assert_eq!(
            extended_deadline(at(100), at(200), Duration::from_secs(100), true).unwrap(),
            at(200)
        );
        let e = extended_deadline(at(100), at(200), Duration::from_secs(101), true).unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::ResourceLimitExceeded);
        assert!(e.hint().contains("max_lifetime") && e.hint().contains("100 s"));
        let zero = extended_deadline(at(100), at(200), Duration::ZERO, true).unwrap_err();
        assert_eq!(zero.code(), crate::ErrorCode::Configuration);
    }

    #[test]
    fn lifetime_limits_are_bounded() {
        let o = CreateOptions::default().timeout(Duration::from_secs(60));
        assert!(
            o.clone()
                .max_lifetime(Duration::from_secs(59))
                .validate()
                .is_err()
        );
        assert!(
            o.clone()
                .max_lifetime(MAX_SANDBOX_TIMEOUT * 2)
                .validate()
                .is_err()
        );
        assert!(
            o.clone()
                .max_lifetime(Duration::from_secs(600))
                .validate()
                .is_ok()
        );
        assert_eq!(o.effective_max_lifetime(), Duration::from_secs(60));
        assert!(
            o.clone()
                .idle_timeout(Duration::from_millis(10))
                .validate()
                .is_err()
        );
        assert!(
            o.clone()
                .idle_timeout(Duration::from_secs(3))
                .validate()
                .is_ok()
        );
    }
}
