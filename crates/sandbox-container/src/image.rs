//! Images: the pull policy applied on create, one pull per image however many creates
//! wait for it, progress reporting, and registry credentials read where the engines' own
//! CLIs keep them.
//!
//! `create` checks the image before provisioning: with [`PullPolicy::Missing`] (the
//! default) an image the engine lacks is pulled, with [`PullPolicy::Always`] it is pulled
//! every time, with [`PullPolicy::Never`] a missing image is a typed error. Concurrent
//! creates of one image share one engine pull (issue 14: ten creates must not hit the
//! registry ten times); each waiter's progress hook sees the shared pull's events.
//!
//! Progress goes two ways: the [`PullProgressHook`] of the backend's
//! [`ContainerConfig`](crate::ContainerConfig), and `tracing` events with target
//! [`PULL_TARGET`] (`pulling image`, one `pull progress` per engine message, `pulled
//! image`), which the CLI turns into a progress bar. Credentials never appear in either:
//! [`RegistryAuth`]'s `Debug` shows the user name only.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use sandbox_core::{PullPolicy, Result, SandboxError, Secret};

use crate::engine::{ContainerEngine, EngineError, EngineErrorKind, EngineResult};
use crate::error::bounded_text;

/// The `tracing` target of pull events (`pulling image`, `pull progress`, `pulled image`).
pub const PULL_TARGET: &str = "sandbox_container::pull";

/// Bound of one whole pull. Outside the create bound: a first pull of a large image takes
/// minutes on a slow link, and is not a wedged engine.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// The registry of short names (`python:3.12` is `docker.io/library/python:3.12`).
pub const DEFAULT_REGISTRY: &str = "docker.io";

/// The next item of an engine's pull stream, or an error once it was silent for `idle`
/// (a registry that stalls mid-layer must not hang `create` until its overall bound).
pub async fn next_pull_item<S>(stream: &mut S, idle: Duration) -> EngineResult<Option<S::Item>>
where
    S: futures::Stream + Unpin,
{
    use futures::StreamExt as _;
    tokio::time::timeout(idle, stream.next())
        .await
        .map_err(|_| {
            EngineError::new(
                EngineErrorKind::Other,
                format!("image pull: no progress for {idle:?}"),
            )
        })
}

/// The small test image `sandbox doctor` checks for beside the default template (built by
/// `cargo xtask setup`; the contract suite's second template).
pub const TEST_BUSYBOX: &str = "sandbox-rs/busybox:latest";

/// An image reference split the way Docker and Podman resolve short names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageRef {
    /// Registry host (and port): `docker.io` for short names.
    pub registry: String,
    /// Repository path inside the registry (`library/python`, `team/app`).
    pub repository: String,
    /// `:tag` or `@sha256:…`, as written (`:latest` when absent).
    pub reference: String,
}

impl ImageRef {
    /// Splits `image`; `None` when it is not an image reference (empty, whitespace,
    /// control characters, an empty path component).
    pub fn parse(image: &str) -> Option<ImageRef> {
        if image.is_empty()
            || image.len() > 512
            || image.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return None;
        }
        let (name, reference) = match image.find('@') {
            Some(at) => (&image[..at], image[at..].to_string()),
            None => {
                let last_slash = image.rfind('/').map_or(0, |i| i + 1);
                match image[last_slash..].rfind(':') {
                    Some(c) => (
                        &image[..last_slash + c],
                        image[last_slash + c..].to_string(),
                    ),
                    None => (image, ":latest".to_string()),
                }
            }
        };
        if reference.len() < 2 {
            return None;
        }
        // The first component is a registry when it looks like a host: Docker's rule.
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), rest.to_string())
            }
            _ if name.contains('/') => (DEFAULT_REGISTRY.to_string(), name.to_string()),
            _ => (DEFAULT_REGISTRY.to_string(), format!("library/{name}")),
        };
        if repository.is_empty() || repository.split('/').any(str::is_empty) {
            return None;
        }
        Some(ImageRef {
            registry,
            repository,
            reference,
        })
    }

    /// Whether the registry is on this machine (`localhost`, `127.0.0.0/8`, `::1`): the
    /// engines allow plain HTTP to those (Docker always; Podman when asked per pull).
    pub fn registry_is_loopback(&self) -> bool {
        let host = match self.registry.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => self.registry.split(':').next().unwrap_or(""),
        };
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}{}", self.registry, self.repository, self.reference)
    }
}

/// Credentials for one registry. `Debug` shows the user name and registry only.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistryAuth {
    /// The registry as the credential file names it (`host:port`, or Docker Hub's
    /// `https://index.docker.io/v1/`).
    pub server_address: String,
    /// User name (empty with an identity token).
    pub username: String,
    /// Password or access token.
    pub password: Secret,
    /// An OAuth identity token (Docker's `identitytoken`), used instead of the password.
    pub identity_token: Option<Secret>,
}

impl RegistryAuth {
    /// A user name and password for `server_address`.
    pub fn new(
        server_address: impl Into<String>,
        username: impl Into<String>,
        password: impl Into<Secret>,
    ) -> Self {
        RegistryAuth {
            server_address: server_address.into(),
            username: username.into(),
            password: password.into(),
            identity_token: None,
        }
    }
}

impl fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("server_address", &self.server_address)
            .field("username", &self.username)
            .field("password", &"***")
            .field(
                "identity_token",
                &self.identity_token.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

/// Where registry credentials are read from: the engine's own CLI's files, so a user who
/// ran `docker login` or `podman login` needs nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CredentialStore {
    /// Docker's: `$DOCKER_CONFIG/config.json` (default `~/.docker/config.json`), its
    /// `auths`, `credHelpers` and `credsStore`.
    Docker,
    /// containers-auth.json(5), as Podman reads it: `$REGISTRY_AUTH_FILE` alone when set,
    /// else `$XDG_RUNTIME_DIR/containers/auth.json`, `~/.config/containers/auth.json`,
    /// then Docker's config.
    Containers,
}

impl CredentialStore {
    /// The environment variable that points at the credentials (named by `Auth` errors).
    pub fn env_var(self) -> &'static str {
        match self {
            CredentialStore::Docker => "DOCKER_CONFIG",
            CredentialStore::Containers => "REGISTRY_AUTH_FILE",
        }
    }

    /// The engine CLI's login command for `registry`.
    fn login_command(self, registry: &str) -> String {
        match self {
            CredentialStore::Docker => format!("docker login {registry}"),
            CredentialStore::Containers => format!("podman login {registry}"),
        }
    }

    /// The credential files consulted, in order, from `env`.
    fn files(self, env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
        let home = env("HOME").filter(|h| !h.is_empty());
        let docker = match env("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
            Some(dir) => Some(Path::new(&dir).join("config.json")),
            None => home
                .as_ref()
                .map(|h| Path::new(h).join(".docker/config.json")),
        };
        match self {
            CredentialStore::Docker => docker.into_iter().collect(),
            CredentialStore::Containers => {
                if let Some(f) = env("REGISTRY_AUTH_FILE").filter(|f| !f.is_empty()) {
                    return vec![PathBuf::from(f)];
                }
                let mut files = Vec::new();
                if let Some(run) = env("XDG_RUNTIME_DIR").filter(|r| !r.is_empty()) {
                    files.push(Path::new(&run).join("containers/auth.json"));
                }
                if let Some(h) = &home {
                    files.push(Path::new(h).join(".config/containers/auth.json"));
                }
                files.extend(docker);
                files
            }
        }
    }

    /// The credentials for `image`'s registry, read from the process environment's
    /// files. `Ok(None)` when none are configured; a file that exists but cannot be read
    /// or parsed is a `Configuration` error naming it (never its content).
    pub fn lookup(self, image: &ImageRef) -> Result<Option<RegistryAuth>> {
        self.lookup_in(image, &|k| std::env::var(k).ok())
    }

    /// [`Self::lookup`] with the environment given (tests).
    pub fn lookup_in(
        self,
        image: &ImageRef,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<RegistryAuth>> {
        for file in self.files(env) {
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(unreadable(&file, &e.to_string())),
            };
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| unreadable(&file, &e.to_string()))?;
            if let Some(found) = from_config(&json, image, &file)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }
}

fn unreadable(file: &Path, why: &str) -> SandboxError {
    SandboxError::config(
        format!(
            "cannot read registry credentials from {}: {}",
            file.display(),
            bounded_text(why)
        ),
        format!(
            "fix the file (it must be JSON with an `auths` object) or remove it; `docker login` \
             / `podman login` rewrite it ({})",
            file.display()
        ),
    )
}

/// The keys a credential file may use for `image`'s registry, most specific first:
/// containers-auth.json allows `registry/namespace` keys; both allow `host[:port]` with or
/// without a scheme; Docker Hub is `https://index.docker.io/v1/`.
fn candidate_keys(image: &ImageRef) -> Vec<String> {
    let mut keys = Vec::new();
    let parts: Vec<&str> = image.repository.split('/').collect();
    for n in (1..=parts.len()).rev() {
        keys.push(format!("{}/{}", image.registry, parts[..n].join("/")));
    }
    keys.push(image.registry.clone());
    if image.registry == DEFAULT_REGISTRY {
        keys.push("https://index.docker.io/v1/".into());
        keys.push("index.docker.io".into());
        keys.push("registry-1.docker.io".into());
    }
    keys
}

/// `https://host:port/v1/` → `host:port`: how Docker normalises `auths` keys.
fn normalise_key(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    // Keep a `registry/namespace` key whole, but drop a `/v1/`, `/v2/` API suffix.
    let k = k.trim_end_matches('/');
    k.strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k)
}

fn from_config(
    json: &serde_json::Value,
    image: &ImageRef,
    file: &Path,
) -> Result<Option<RegistryAuth>> {
    let candidates = candidate_keys(image);
    // A per-registry helper wins over `auths`, as in the Docker CLI.
    if let Some(helpers) = json.get("credHelpers").and_then(|h| h.as_object()) {
        for want in &candidates {
            for (key, helper) in helpers {
                if normalise_key(key) == want.as_str()
                    && let Some(h) = helper.as_str()
                {
                    return run_helper(h, key);
                }
            }
        }
    }
    if let Some(auths) = json.get("auths").and_then(|a| a.as_object()) {
        for want in &candidates {
            for (key, entry) in auths {
                if normalise_key(key) == want.as_str()
                    && let Some(auth) = auth_entry(key, entry, file)?
                {
                    return Ok(Some(auth));
                }
            }
        }
    }
    if let Some(store) = json.get("credsStore").and_then(|s| s.as_str()) {
        let server = if image.registry == DEFAULT_REGISTRY {
            "https://index.docker.io/v1/".to_string()
        } else {
            image.registry.clone()
        };
        return run_helper(store, &server);
    }
    Ok(None)
}

/// One `auths` entry: `auth` (base64 `user:password`), or `username`/`password`, plus an
/// optional `identitytoken`. An entry with neither (Docker writes `{}` when a helper
/// holds the secret) is no credential.
fn auth_entry(key: &str, entry: &serde_json::Value, file: &Path) -> Result<Option<RegistryAuth>> {
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
    };
    let token = field("identitytoken").map(Secret::new);
    let (username, password) = if let Some(encoded) = field("auth") {
        let decoded = base64_decode(encoded.as_bytes())
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| unreadable(file, &format!("`auths.{key}.auth` is not base64")))?;
        let (u, p) = decoded.split_once(':').ok_or_else(|| {
            unreadable(file, &format!("`auths.{key}.auth` is not `user:password`"))
        })?;
        (u.to_string(), p.to_string())
    } else if let Some(u) = field("username") {
        (u.to_string(), field("password").unwrap_or("").to_string())
    } else if token.is_some() {
        (String::new(), String::new())
    } else {
        return Ok(None);
    };
    let mut auth = RegistryAuth::new(key, username, password);
    auth.identity_token = token;
    Ok(Some(auth))
}

/// Longest a credential helper may take (they may unlock a keyring, not wait for a user).
const HELPER_TIMEOUT: Duration = Duration::from_secs(10);

/// Asks `docker-credential-<helper> get` for `server`'s credential (the Docker CLI's
/// protocol: the server on stdin, `{"Username","Secret"}` on stdout; a `<token>` user name
/// means the secret is an identity token).
fn run_helper(helper: &str, server: &str) -> Result<Option<RegistryAuth>> {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    if helper.is_empty()
        || !helper
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(SandboxError::config(
            format!("credential helper name {helper:?} is not a plain name"),
            "name a helper `docker-credential-<name>` on PATH in config.json",
        ));
    }
    let program = format!("docker-credential-{helper}");
    let not_run = |why: String| {
        SandboxError::config(
            format!("credential helper `{program}` failed for {server}: {why}"),
            format!("install `{program}` on PATH, or log in again (`docker login {server}`)"),
        )
    };
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| not_run(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(server.as_bytes());
    }
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() < HELPER_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(not_run(format!("no answer within {HELPER_TIMEOUT:?}")));
            }
            Err(e) => return Err(not_run(e.to_string())),
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    if !status.success() {
        // Helpers exit non-zero with "credentials not found" for an unknown server.
        return Ok(None);
    }
    let v: serde_json::Value =
        serde_json::from_str(&out).map_err(|_| not_run("its answer is not JSON".to_string()))?;
    let user = v.get("Username").and_then(|u| u.as_str()).unwrap_or("");
    let secret = v.get("Secret").and_then(|s| s.as_str()).unwrap_or("");
    if secret.is_empty() {
        return Ok(None);
    }
    Ok(Some(if user == "<token>" {
        let mut a = RegistryAuth::new(server, "", "");
        a.identity_token = Some(Secret::new(secret));
        a
    } else {
        RegistryAuth::new(server, user, secret)
    }))
}

/// Standard or URL-safe base64, padding optional; `None` when malformed.
pub(crate) fn base64_decode(input: &[u8]) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' | b'-' => Some(62),
            b'/' | b'_' => Some(63),
            _ => None,
        }
    }
    let clean: Vec<u8> = input
        .iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let trimmed: &[u8] = {
        let end = clean.iter().rposition(|c| *c != b'=').map_or(0, |i| i + 1);
        &clean[..end]
    };
    let mut out = Vec::with_capacity(trimmed.len() * 3 / 4);
    for chunk in trimmed.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= val(*c)? << (18 - 6 * i);
        }
        let b = acc.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&b[1..4]),
            3 => out.extend_from_slice(&b[1..3]),
            2 => out.push(b[1]),
            _ => return None,
        }
    }
    Some(out)
}

/// One progress message of a pull, as the engine reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PullProgress {
    /// The image being pulled.
    pub image: String,
    /// The layer (or blob) the message is about, when it names one.
    pub layer: Option<String>,
    /// The engine's status text (`Downloading`, `Pull complete`, `Copying blob …`).
    pub status: String,
    /// Bytes done of the layer, when the engine reports them.
    pub current: Option<u64>,
    /// The layer's size, when the engine reports it.
    pub total: Option<u64>,
}

impl PullProgress {
    /// A message with a status only.
    pub fn new(image: impl Into<String>, status: impl Into<String>) -> Self {
        PullProgress {
            image: image.into(),
            layer: None,
            status: status.into(),
            current: None,
            total: None,
        }
    }
}

/// A callback receiving every [`PullProgress`] of the pulls a backend waits for.
/// Compared by identity; `Debug` does not show the closure.
#[derive(Clone)]
pub struct PullProgressHook(Arc<dyn Fn(&PullProgress) + Send + Sync>);

impl PullProgressHook {
    /// Wraps `f`.
    pub fn new(f: impl Fn(&PullProgress) + Send + Sync + 'static) -> Self {
        PullProgressHook(Arc::new(f))
    }

    fn call(&self, p: &PullProgress) {
        (self.0)(p)
    }
}

impl fmt::Debug for PullProgressHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PullProgressHook")
    }
}

impl PartialEq for PullProgressHook {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PullProgressHook {}

/// What a failed pull's message, as Docker and Podman word a registry's answer, means:
/// [`EngineErrorKind::Unauthorized`] for a refused or missing credential,
/// [`EngineErrorKind::NotFound`] for an image or tag the registry does not have, `None`
/// for anything else. Both engines report these as text only (a stream error, or a 500
/// with the registry's message), so the adapters share this one reading of it.
pub fn pull_failure_kind(message: &str) -> Option<EngineErrorKind> {
    let m = message.to_ascii_lowercase();
    let any = |needles: &[&str]| needles.iter().any(|n| m.contains(n));
    if any(&[
        "unauthorized",
        "authentication required",
        "no basic auth credentials",
        "incorrect username or password",
        "invalid username/password",
        "denied: ",
    ]) {
        Some(EngineErrorKind::Unauthorized)
    } else if any(&[
        "manifest unknown",
        "not found",
        "repository does not exist",
        "name unknown",
    ]) {
        Some(EngineErrorKind::NotFound)
    } else {
        None
    }
}

/// A failed pull's error with its kind read from the message ([`pull_failure_kind`]),
/// unless the engine itself could not be reached or did not answer: what both adapters
/// return from [`ContainerEngine::pull`](crate::ContainerEngine::pull).
pub fn classify_pull_failure(mut e: crate::EngineError) -> crate::EngineError {
    if !matches!(
        e.kind,
        EngineErrorKind::Unavailable | EngineErrorKind::Timeout
    ) {
        e.kind = pull_failure_kind(&e.message).unwrap_or(e.kind);
    }
    e
}

/// An engine error shared by every create waiting on one pull.
#[derive(Debug, Clone)]
struct SharedError(Arc<EngineError>);

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0)
    }
}

/// How one shared pull ended: the credentials' presence is kept for the error text.
#[derive(Clone)]
enum Outcome {
    Pulled,
    /// The credential lookup failed (a broken credential file): its message and hint;
    /// nothing was pulled.
    Credentials(String, String),
    Failed {
        error: SharedError,
        had_credentials: bool,
    },
}

type Flight = Shared<BoxFuture<'static, Outcome>>;

/// Backend, engine endpoint, image.
type FlightKey = (String, String, String);

struct InFlight {
    id: u64,
    pull: Flight,
    hooks: Arc<Mutex<Vec<PullProgressHook>>>,
}

/// Pulls in flight, by engine endpoint and image: one per image across every backend on
/// the same engine in this process.
static IN_FLIGHT: LazyLock<Mutex<HashMap<FlightKey, InFlight>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

static FLIGHT_IDS: AtomicU64 = AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Images this process has seen on an engine (by backend, endpoint and image). A create
/// of one skips the existence check, which would otherwise cost a round-trip on every
/// create. An image removed since is reported by the create itself (`NotFound`): the
/// caller then [`forget`]s it and ensures it again.
static PRESENT: LazyLock<Mutex<HashSet<FlightKey>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// Bound on [`PRESENT`]: past it the memory is dropped (it is only a shortcut).
const PRESENT_LIMIT: usize = 1024;

fn key<E: ContainerEngine + ?Sized>(engine: &E, image: &str) -> FlightKey {
    (
        engine.backend().to_string(),
        engine.endpoint().to_string(),
        image.to_string(),
    )
}

fn remember(key: FlightKey) {
    let mut present = lock(&PRESENT);
    if present.len() >= PRESENT_LIMIT {
        present.clear();
    }
    present.insert(key);
}

/// Forgets that the engine held `image`: a create found it missing.
pub(crate) fn forget<E: ContainerEngine + ?Sized>(engine: &E, image: &str) {
    lock(&PRESENT).remove(&key(engine, image));
}

/// How [`ensure`] knew that the engine holds the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ensured {
    /// Asked the engine (or pulled) just now.
    Checked,
    /// Remembered from an earlier create in this process; not asked again.
    Remembered,
}

/// Makes sure the engine holds `image` as `policy` asks, before anything is provisioned.
/// `call_timeout` bounds the existence check; [`DEFAULT_PULL_TIMEOUT`] the pull.
pub(crate) async fn ensure<E: ContainerEngine>(
    engine: &Arc<E>,
    image: &str,
    policy: PullPolicy,
    hook: Option<&PullProgressHook>,
    call_timeout: Duration,
) -> Result<Ensured> {
    let parsed = ImageRef::parse(image).ok_or_else(|| {
        SandboxError::config(
            format!("template {image:?} is not an image reference"),
            "use a name like `sandbox-rs/python:3.11` or `registry:5000/team/app:tag`",
        )
    })?;
    let key = key(&**engine, image);
    if policy != PullPolicy::Always && lock(&PRESENT).contains(&key) {
        return Ok(Ensured::Remembered);
    }
    if policy != PullPolicy::Always {
        let exists =
            crate::sandbox::bounded(call_timeout, "image exists", engine.image_exists(image))
                .await
                .map_err(|e| {
                    // A wedged engine at the first step of a create is a create timeout,
                    // as it is at every later step.
                    if e.kind == EngineErrorKind::Timeout {
                        crate::error::create_timeout(engine.backend(), call_timeout)
                    } else {
                        crate::error::engine(&**engine, "check the image", e)
                    }
                })?;
        if exists {
            remember(key);
            return Ok(Ensured::Checked);
        }
        if policy == PullPolicy::Never {
            return Err(SandboxError::image_unavailable(
                image,
                &parsed.registry,
                "the engine does not have it and the pull policy is `never`",
                format!(
                    "build it (the project's images: docs/images.md), pull it yourself \
                     (`{} pull {image}`), or allow pulls with PullPolicy::Missing",
                    engine.backend()
                ),
            ));
        }
    }
    let outcome = match tokio::time::timeout(
        DEFAULT_PULL_TIMEOUT,
        join_pull(engine, image, &parsed, hook),
    )
    .await
    {
        Ok(o) => o,
        Err(_) => {
            return Err(SandboxError::image_unavailable(
                image,
                &parsed.registry,
                format!("the pull did not finish within {DEFAULT_PULL_TIMEOUT:?}"),
                format!(
                    "pull it ahead of time (`{} pull {image}`), then create again",
                    engine.backend()
                ),
            ));
        }
    };
    match outcome {
        Outcome::Pulled => {
            remember(key);
            Ok(Ensured::Checked)
        }
        Outcome::Credentials(message, hint) => Err(SandboxError::config(message, hint)),
        Outcome::Failed {
            error,
            had_credentials,
        } => Err(pull_error(
            &**engine,
            image,
            &parsed,
            error,
            had_credentials,
        )),
    }
}

/// Joins the pull of `image` in flight on this engine, or starts it.
async fn join_pull<E: ContainerEngine>(
    engine: &Arc<E>,
    image: &str,
    parsed: &ImageRef,
    hook: Option<&PullProgressHook>,
) -> Outcome {
    let key = key(&**engine, image);
    let (id, pull) = {
        let mut flights = lock(&IN_FLIGHT);
        match flights.get(&key) {
            Some(f) => {
                if let Some(h) = hook {
                    lock(&f.hooks).push(h.clone());
                }
                tracing::debug!(target: PULL_TARGET, image, "joining the pull in flight");
                (f.id, f.pull.clone())
            }
            None => {
                let hooks = Arc::new(Mutex::new(hook.cloned().into_iter().collect::<Vec<_>>()));
                let id = FLIGHT_IDS.fetch_add(1, Ordering::Relaxed);
                let pull = start_pull(
                    engine.clone(),
                    image.to_string(),
                    parsed.clone(),
                    hooks.clone(),
                );
                flights.insert(
                    key.clone(),
                    InFlight {
                        id,
                        pull: pull.clone(),
                        hooks,
                    },
                );
                (id, pull)
            }
        }
    };
    // Removes the entry when this waiter leaves, finished or cancelled: a later create
    // (PullPolicy::Always, or after a failure) starts a fresh pull.
    struct Leave(Option<(FlightKey, u64)>);
    impl Drop for Leave {
        fn drop(&mut self) {
            if let Some((key, id)) = self.0.take() {
                let mut flights = lock(&IN_FLIGHT);
                if flights.get(&key).is_some_and(|f| f.id == id) {
                    flights.remove(&key);
                }
            }
        }
    }
    let outcome = pull.await;
    let _leave = Leave(Some((key, id)));
    outcome
}

fn start_pull<E: ContainerEngine>(
    engine: Arc<E>,
    image: String,
    parsed: ImageRef,
    hooks: Arc<Mutex<Vec<PullProgressHook>>>,
) -> Flight {
    async move {
        let store = engine.credential_store();
        let lookup = {
            let parsed = parsed.clone();
            tokio::task::spawn_blocking(move || store.lookup(&parsed)).await
        };
        let auth = match lookup {
            Ok(Ok(auth)) => auth,
            Ok(Err(e)) => {
                let message = match &e {
                    SandboxError::Configuration { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                return Outcome::Credentials(message, e.hint());
            }
            Err(e) => {
                return Outcome::Credentials(
                    format!("reading registry credentials failed: {e}"),
                    "retry the create".into(),
                );
            }
        };
        let started = Instant::now();
        tracing::info!(
            target: PULL_TARGET,
            backend = engine.backend(),
            image = %image,
            registry = %parsed.registry,
            with_credentials = auth.is_some(),
            "pulling image"
        );
        let report = |p: PullProgress| {
            tracing::debug!(
                target: PULL_TARGET,
                image = %p.image,
                layer = p.layer.as_deref().unwrap_or(""),
                status = %bounded_text(&p.status),
                current = p.current.unwrap_or(0),
                total = p.total.unwrap_or(0),
                "pull progress"
            );
            let hooks: Vec<PullProgressHook> = lock(&hooks).clone();
            for h in &hooks {
                h.call(&p);
            }
        };
        let result = engine.pull(&image, auth.as_ref(), &report).await;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match result {
            Ok(()) => {
                tracing::info!(target: PULL_TARGET, image = %image, elapsed_ms, "pulled image");
                Outcome::Pulled
            }
            Err(e) => {
                tracing::info!(
                    target: PULL_TARGET,
                    image = %image,
                    elapsed_ms,
                    kind = ?e.kind,
                    "pull failed"
                );
                Outcome::Failed {
                    error: SharedError(Arc::new(e)),
                    had_credentials: auth.is_some(),
                }
            }
        }
    }
    .boxed()
    .shared()
}

/// A failed pull as the error a user can act on: who refused, what, and the fix.
fn pull_error<E: ContainerEngine + ?Sized>(
    engine: &E,
    image: &str,
    parsed: &ImageRef,
    error: SharedError,
    had_credentials: bool,
) -> SandboxError {
    let registry = &parsed.registry;
    let store = engine.credential_store();
    match error.0.kind {
        EngineErrorKind::Unavailable | EngineErrorKind::Timeout => {
            SandboxError::engine_unavailable(
                engine.backend(),
                engine.endpoint(),
                engine.unavailable_hint(),
            )
            .with_source(error)
        }
        EngineErrorKind::Unauthorized => {
            let detail = if had_credentials {
                format!("registry {registry} refused the credentials for `{image}`")
            } else {
                format!(
                    "registry {registry} demands credentials for `{image}` and none are configured"
                )
            };
            SandboxError::auth_refused(
                store.env_var(),
                detail,
                format!(
                    "log in with `{}` (it writes the credential file), or point {} at {} \
                     with `{registry}` under `auths`",
                    store.login_command(registry),
                    store.env_var(),
                    match store {
                        CredentialStore::Docker => "a directory whose config.json has",
                        _ => "an auth.json",
                    }
                ),
            )
        }
        EngineErrorKind::NotFound => SandboxError::image_unavailable(
            image,
            registry,
            format!(
                "the registry has no `{}{}`",
                parsed.repository, parsed.reference
            ),
            format!(
                "check the name and tag (`{parsed}`); the project's own images are built \
                 from images/ (docs/images.md)"
            ),
        )
        .with_source(error),
        _ => SandboxError::image_unavailable(
            image,
            registry,
            format!("the pull failed: {}", bounded_text(&error.0.message)),
            format!(
                "check that the engine reaches {registry} (`{} pull {image}`), or build the \
                 image locally (docs/images.md)",
                engine.backend()
            ),
        )
        .with_source(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap()
    }

    #[test]
    fn short_names_resolve_to_docker_hub_library() {
        let i = r("python:3.12-slim");
        assert_eq!(
            (
                i.registry.as_str(),
                i.repository.as_str(),
                i.reference.as_str()
            ),
            ("docker.io", "library/python", ":3.12-slim")
        );
        assert_eq!(r("team/app").reference, ":latest");
        assert_eq!(r("team/app").repository, "team/app");
        assert_eq!(r("sandbox-rs/busybox:latest").registry, "docker.io");
    }

    #[test]
    fn registries_with_ports_and_digests_split() {
        let i = r("127.0.0.1:5000/sbx/busybox:1");
        assert_eq!(i.registry, "127.0.0.1:5000");
        assert_eq!(i.repository, "sbx/busybox");
        assert_eq!(i.reference, ":1");
        assert!(i.registry_is_loopback());
        let d = r("localhost:5000/a@sha256:abcd");
        assert_eq!(
            (d.registry.as_str(), d.reference.as_str()),
            ("localhost:5000", "@sha256:abcd")
        );
        assert!(d.registry_is_loopback());
        let p = r("localhost:5000/a");
        assert_eq!(p.reference, ":latest");
        assert!(!r("quay.io/x/y:1").registry_is_loopback());
        assert!(!r("python").registry_is_loopback());
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in ["", "a b", "x//y", "reg.io/", "a:", "a\n"] {
            assert!(ImageRef::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn base64_round_trips() {
        use base64::Engine as _;
        let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        for s in ["", "a", "ab", "abc", "user:pa ss:wörd"] {
            let e = encode(s.as_bytes());
            assert_eq!(base64_decode(e.as_bytes()).unwrap(), s.as_bytes(), "{s}");
        }
        assert_eq!(base64_decode(b"dXNlcjpwdw==").unwrap(), b"user:pw");
        assert!(base64_decode(b"!!!").is_none());
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "sbx-image-test-{tag}-{}-{}",
            std::process::id(),
            FLIGHT_IDS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn docker_config_auths_are_found_by_registry() {
        let dir = tempdir("docker");
        write(
            &dir,
            "config.json",
            r#"{"auths":{"http://127.0.0.1:5000/v2/":{"auth":"dXNlcjpwdw=="},"other:1":{"auth":"eDp5"}}}"#,
        );
        let d = dir.to_string_lossy().to_string();
        let env = move |k: &str| (k == "DOCKER_CONFIG").then(|| d.clone());
        let a = CredentialStore::Docker
            .lookup_in(&r("127.0.0.1:5000/sbx/busybox:1"), &env)
            .unwrap()
            .unwrap();
        assert_eq!((a.username.as_str(), a.password.expose()), ("user", "pw"));
        assert!(
            CredentialStore::Docker
                .lookup_in(&r("127.0.0.1:5001/x"), &env)
                .unwrap()
                .is_none()
        );
        let debug = format!("{a:?}");
        assert!(!debug.contains("pw\"") && debug.contains("***"), "{debug}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn registry_auth_file_wins_and_namespaced_keys_are_more_specific() {
        let dir = tempdir("containers");
        let file = write(
            &dir,
            "auth.json",
            r#"{"auths":{"127.0.0.1:5000":{"auth":"YTpi"},"127.0.0.1:5000/team":{"auth":"Yzpk"}}}"#,
        );
        let docker = write(
            &dir,
            "docker/config.json",
            r#"{"auths":{"127.0.0.1:5000":{"auth":"eDp5"}}}"#,
        );
        let f = file.to_string_lossy().to_string();
        let dd = docker.parent().unwrap().to_string_lossy().to_string();
        let env = move |k: &str| match k {
            "REGISTRY_AUTH_FILE" => Some(f.clone()),
            "DOCKER_CONFIG" => Some(dd.clone()),
            _ => None,
        };
        let team = CredentialStore::Containers
            .lookup_in(&r("127.0.0.1:5000/team/app:1"), &env)
            .unwrap()
            .unwrap();
        assert_eq!(team.username, "c");
        let other = CredentialStore::Containers
            .lookup_in(&r("127.0.0.1:5000/solo:1"), &env)
            .unwrap()
            .unwrap();
        assert_eq!(other.username, "a");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_broken_credential_file_is_a_configuration_error_without_its_content() {
        let dir = tempdir("broken");
        write(
            &dir,
            "config.json",
            r#"{"auths":{"r:1":{"auth":"not base64 hunter2!"}}}"#,
        );
        let d = dir.to_string_lossy().to_string();
        let env = move |k: &str| (k == "DOCKER_CONFIG").then(|| d.clone());
        let e = CredentialStore::Docker
            .lookup_in(&r("r:1/x"), &env)
            .unwrap_err();
        assert_eq!(e.code(), sandbox_core::ErrorCode::Configuration);
        assert!(!e.render().contains("hunter2"), "{}", e.render());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// An engine that only has images: `pull` counts calls, reports two progress
    /// messages, waits, then fails as `fail` says or adds the image.
    #[derive(Debug, Default)]
    struct ImageEngine {
        images: Mutex<Vec<String>>,
        pulls: AtomicU64,
        fail: Option<EngineErrorKind>,
    }

    #[async_trait::async_trait]
    impl ContainerEngine for ImageEngine {
        fn backend(&self) -> &'static str {
            "images-only"
        }
        fn tier(&self) -> sandbox_core::IsolationTier {
            sandbox_core::IsolationTier::Container
        }
        fn capabilities(&self) -> sandbox_core::Capability {
            sandbox_core::Capability::empty()
        }
        fn endpoint(&self) -> &str {
            "memory://images"
        }
        async fn create(&self, _: &crate::ContainerSpec) -> crate::EngineResult<String> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn start(&self, _: &str) -> crate::EngineResult<()> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn inspect(&self, _: &str) -> crate::EngineResult<crate::ContainerInfo> {
            Err(EngineError::new(
                EngineErrorKind::NotFound,
                "not in this test",
            ))
        }
        async fn remove(&self, _: &str) -> crate::EngineResult<bool> {
            Ok(false)
        }
        async fn list(
            &self,
            _: &std::collections::BTreeMap<String, String>,
        ) -> crate::EngineResult<Vec<crate::ContainerInfo>> {
            Ok(Vec::new())
        }
        async fn exec(
            &self,
            _: &str,
            _: crate::ExecRequest,
        ) -> crate::EngineResult<crate::ExecStream> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn exec_state(&self, _: &str) -> crate::EngineResult<crate::ExecState> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn put_archive(
            &self,
            _: &str,
            _: &str,
            _: crate::ArchiveBody,
        ) -> crate::EngineResult<()> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn get_archive(&self, _: &str, _: &str) -> crate::EngineResult<crate::ArchiveBody> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn stat_path(&self, _: &str, _: &str) -> crate::EngineResult<crate::PathStat> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn ping(&self) -> crate::EngineResult<()> {
            Ok(())
        }
        async fn facts(&self) -> crate::engine::EngineFacts {
            crate::engine::EngineFacts::default()
        }
        async fn image_exists(&self, image: &str) -> crate::EngineResult<bool> {
            Ok(lock(&self.images).iter().any(|i| i == image))
        }
        async fn pull(
            &self,
            image: &str,
            auth: Option<&RegistryAuth>,
            progress: &(dyn Fn(PullProgress) + Send + Sync),
        ) -> crate::EngineResult<()> {
            assert!(
                auth.is_none(),
                "no credentials are configured for 127.0.0.9"
            );
            self.pulls.fetch_add(1, Ordering::SeqCst);
            progress(PullProgress::new(image, "Pulling fs layer"));
            tokio::time::sleep(Duration::from_millis(100)).await;
            progress(PullProgress::new(image, "Pull complete"));
            match self.fail {
                Some(kind) => Err(EngineError::new(kind, "registry said no")),
                None => {
                    lock(&self.images).push(image.to_string());
                    Ok(())
                }
            }
        }
    }

    fn counting_hook() -> (PullProgressHook, Arc<AtomicU64>) {
        let n = Arc::new(AtomicU64::new(0));
        let m = n.clone();
        (
            PullProgressHook::new(move |_| {
                m.fetch_add(1, Ordering::SeqCst);
            }),
            n,
        )
    }

    #[tokio::test]
    async fn concurrent_ensures_share_one_pull_and_every_waiter_sees_progress() {
        let engine = Arc::new(ImageEngine::default());
        let image = "127.0.0.9:5000/single/flight:1";
        let hooks: Vec<_> = (0..10).map(|_| counting_hook()).collect();
        let waits = hooks.iter().map(|(h, _)| {
            ensure(
                &engine,
                image,
                PullPolicy::Missing,
                Some(h),
                Duration::from_secs(5),
            )
        });
        for r in futures::future::join_all(waits).await {
            r.unwrap();
        }
        assert_eq!(
            engine.pulls.load(Ordering::SeqCst),
            1,
            "one pull for ten creates"
        );
        for (_, n) in &hooks {
            assert!(n.load(Ordering::SeqCst) >= 1, "every waiter saw progress");
        }
        // Present now: Missing does not pull again, nor even ask (until forgotten), and
        // Always pulls.
        let missing = || {
            ensure(
                &engine,
                image,
                PullPolicy::Missing,
                None,
                Duration::from_secs(5),
            )
        };
        assert_eq!(missing().await.unwrap(), Ensured::Remembered);
        forget(&*engine, image);
        assert_eq!(missing().await.unwrap(), Ensured::Checked);
        assert_eq!(missing().await.unwrap(), Ensured::Remembered);
        assert_eq!(engine.pulls.load(Ordering::SeqCst), 1);
        ensure(
            &engine,
            image,
            PullPolicy::Always,
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(engine.pulls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn never_refuses_a_missing_image_without_pulling() {
        let engine = Arc::new(ImageEngine::default());
        let e = ensure(
            &engine,
            "127.0.0.9:5000/never:1",
            PullPolicy::Never,
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), sandbox_core::ErrorCode::ImageUnavailable);
        assert!(e.to_string().contains("127.0.0.9:5000"), "{e}");
        assert_eq!(engine.pulls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn pull_failures_map_to_typed_errors_naming_image_and_registry() {
        for (kind, code) in [
            (EngineErrorKind::Unauthorized, sandbox_core::ErrorCode::Auth),
            (
                EngineErrorKind::NotFound,
                sandbox_core::ErrorCode::ImageUnavailable,
            ),
            (
                EngineErrorKind::Other,
                sandbox_core::ErrorCode::ImageUnavailable,
            ),
            (
                EngineErrorKind::Unavailable,
                sandbox_core::ErrorCode::EngineUnavailable,
            ),
        ] {
            let engine = Arc::new(ImageEngine {
                fail: Some(kind),
                ..ImageEngine::default()
            });
            let image = format!("127.0.0.9:5000/fails/{kind:?}:1").to_ascii_lowercase();
            let e = ensure(
                &engine,
                &image,
                PullPolicy::Missing,
                None,
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
            assert_eq!(e.code(), code, "{kind:?}: {}", e.render());
            if code != sandbox_core::ErrorCode::EngineUnavailable {
                assert!(e.to_string().contains("127.0.0.9:5000"), "{}", e.render());
            }
            if code == sandbox_core::ErrorCode::ImageUnavailable {
                assert!(e.to_string().contains(&image), "{}", e.render());
            }
        }
    }

    #[test]
    fn engine_wording_of_refusals_and_missing_images_is_read() {
        for m in [
            "Head \"http://127.0.0.1:5000/v2/x/manifests/1\": no basic auth credentials",
            "unauthorized: authentication required",
            "reading manifest 1 in 127.0.0.1:5000/x: authentication required",
        ] {
            assert_eq!(
                pull_failure_kind(m),
                Some(EngineErrorKind::Unauthorized),
                "{m}"
            );
        }
        for m in [
            "manifest for 127.0.0.1:5000/x:9 not found: manifest unknown",
            "reading manifest 9 in 127.0.0.1:5000/x: manifest unknown",
        ] {
            assert_eq!(pull_failure_kind(m), Some(EngineErrorKind::NotFound), "{m}");
        }
        assert_eq!(pull_failure_kind("no space left on device"), None);
    }

    #[test]
    fn helper_names_cannot_be_paths() {
        assert!(run_helper("../../bin/sh", "r:1").is_err());
        assert!(run_helper("", "r:1").is_err());
    }
}
