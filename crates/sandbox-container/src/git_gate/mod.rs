//! The git gate (`CreateOptions::git_repo`): the host side that serves the sandbox's
//! repositories over git's smart HTTP on connections forwarded from a loopback port
//! inside the sandbox.
//!
//! [`Gate::new`] mints the sandbox's token and writes the gate's own `pre-receive` hook
//! into a private directory; [`Gate::serve`] answers one connection (any
//! `AsyncRead + AsyncWrite`, a forwarded [`sandbox_agent::client::TcpConn`] in a
//! sandbox) with an HTTP/1.1 server ([`http`]) that checks the token and runs
//! `git http-backend`. Each request it answers is one `git.request` audit record
//! ([`audit`]) in the sinks of the layer the sandbox was created under. The gate is
//! dropped at kill: the token is forgotten, the hooks directory removed, and the port
//! inside closes with the relay.

mod audit;
mod http;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandbox_agent::client::{AgentClient, TcpRelay};
use sandbox_core::git_gate::{GATE_PORT, git_dir, git_url_var, url_names};
use sandbox_core::layer::EventReporter;
use sandbox_core::{GitAccess, GitRepo, Result, SandboxError};

/// Bytes of the token (hex-encoded in URLs).
const TOKEN_BYTES: usize = 32;

/// The user name in clone URLs; the gate ignores it, the token is the password.
pub(crate) const URL_USER: &str = "sandbox";

/// The gate's pre-receive hook: every ref a push updates must start with the prefix in
/// `SBX_GIT_PUSH_PREFIX` (set by the gate per request, never by the sandbox) and contain
/// no `..`; otherwise the whole push is refused before any ref moves (git quarantines the
/// pushed objects until the hook accepts).
const PRE_RECEIVE: &str = r#"#!/bin/sh
# Written by the sandbox-rs git gate; removed with the sandbox.
prefix="$SBX_GIT_PUSH_PREFIX"
if [ -z "$prefix" ]; then
  echo "sandbox git gate: no push prefix; push refused" >&2
  exit 1
fi
status=0
while read -r old new ref; do
  case "$ref" in
    *..*|*//*) echo "sandbox git gate: $ref refused: not a plain ref name" >&2; status=1 ;;
    "$prefix"*) ;;
    *) echo "sandbox git gate: $ref refused: pushes may only update refs under $prefix" >&2; status=1 ;;
  esac
done
exit $status
"#;

/// One repository as the gate serves it.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    /// The name in URLs (`/<name>.git`).
    pub(crate) name: String,
    /// The git directory on the host.
    pub(crate) git_dir: PathBuf,
    pub(crate) access: GitAccess,
    pub(crate) prefix: String,
}

/// The token of one sandbox's gate. Never in Debug, Display, errors or logs.
#[derive(Clone)]
pub(crate) struct Token(Arc<String>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

impl Token {
    fn mint() -> Result<Token> {
        let mut bytes = [0u8; TOKEN_BYTES];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .map_err(|e| {
                SandboxError::config(
                    format!("git_repo: no random source for the gate's token: {e}"),
                    "the host needs a readable /dev/urandom",
                )
            })?;
        Ok(Token(Arc::new(
            bytes.iter().map(|b| format!("{b:02x}")).collect(),
        )))
    }

    /// Compares in time independent of where `other` first differs.
    pub(crate) fn matches(&self, other: &[u8]) -> bool {
        let ours = self.0.as_bytes();
        if ours.len() != other.len() {
            return false;
        }
        ours.iter()
            .zip(other)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    fn expose(&self) -> &str {
        &self.0
    }
}

/// The private directory of the gate's hook; removed on drop.
#[derive(Debug)]
struct HooksDir(PathBuf);

impl Drop for HooksDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One sandbox's gate.
#[derive(Debug)]
pub(crate) struct Gate {
    pub(crate) repos: Vec<Served>,
    pub(crate) token: Token,
    backend: PathBuf,
    hooks: HooksDir,
    sandbox_id: String,
    /// The audit sinks of the layer the sandbox was created under, hiding the token.
    events: EventReporter,
}

impl Gate {
    /// The gate of sandbox `sandbox_id` for `repos`: the repositories resolved, a fresh
    /// token, the hook written; each request it answers is reported to `events` (taken
    /// during the layer's create). Refused (with what to do) when git's HTTP backend is
    /// not on the host or a path is no repository.
    pub(crate) fn new(repos: &[GitRepo], sandbox_id: &str, events: EventReporter) -> Result<Gate> {
        let backend = http_backend()?;
        let mut served: Vec<Served> = Vec::with_capacity(repos.len());
        for (r, name) in repos.iter().zip(url_names(repos)) {
            r.validate()?;
            let git_dir = git_dir(&r.path).ok_or_else(|| {
                SandboxError::config(
                    format!("git_repo: {} is not a git repository", r.path.display()),
                    "give the path of a work tree or of a bare repository",
                )
            })?;
            let git_dir = git_dir.canonicalize().unwrap_or(git_dir);
            served.push(Served {
                name,
                git_dir,
                access: r.access,
                prefix: r.effective_prefix(sandbox_id),
            });
        }
        let token = Token::mint()?;
        let hooks = write_hooks()?;
        let events = events.hiding([token.expose()]);
        Ok(Gate {
            repos: served,
            token,
            backend,
            hooks,
            sandbox_id: sandbox_id.to_string(),
            events,
        })
    }

    /// The clone URL of repository `index` at `port` inside the sandbox, with the token.
    pub(crate) fn url(&self, index: usize, port: u16) -> Option<String> {
        let r = self.repos.get(index)?;
        Some(format!(
            "http://{URL_USER}:{}@127.0.0.1:{port}/{}.git",
            self.token.expose(),
            r.name
        ))
    }

    /// The environment every command gets: each repository's URL with the token.
    pub(crate) fn env(&self, port: u16) -> Vec<(String, String)> {
        (0..self.repos.len())
            .filter_map(|i| Some((git_url_var(i), self.url(i, port)?)))
            .collect()
    }

    /// Serves one connection until it ends.
    pub(crate) async fn serve<S>(self: Arc<Self>, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        http::serve(self, stream).await;
    }

    fn hooks_dir(&self) -> &Path {
        &self.hooks.0
    }
}

/// `git http-backend` on this host, or what to do without it.
pub(crate) fn http_backend() -> Result<PathBuf> {
    if let Some(found) = sandbox_core::git_gate::http_backend() {
        return Ok(found);
    }
    Err(SandboxError::config(
        "git_repo: git's HTTP backend (git-http-backend) is not on this host",
        "install git on the host (Debian/Ubuntu: `apt-get install git`); `sandbox doctor` \
         says whether it is found",
    ))
}

/// A private directory (0700) with the gate's pre-receive hook.
fn write_hooks() -> Result<HooksDir> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let failed = |e: std::io::Error| {
        SandboxError::config(
            format!("git_repo: the gate's hooks directory could not be written: {e}"),
            "make the host's temporary directory (TMPDIR) writable",
        )
    };
    let token = Token::mint()?;
    let dir = std::env::temp_dir().join(format!("sbx-git-gate-{}", &token.expose()[..16]));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(failed)?;
    let dir = HooksDir(dir);
    let hook = dir.0.join("pre-receive");
    std::fs::write(&hook, PRE_RECEIVE).map_err(failed)?;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o700)).map_err(failed)?;
    Ok(dir)
}

/// The gate of one sandbox on the agent session in use: the port inside and the task
/// serving its connections. Kept by the handle that created the sandbox, so a new session
/// of its own (a start after a stop, the original's restore after a fork) opens the port
/// again; dropped at kill, which ends every connection, closes the port inside, and (with
/// the last connection) forgets the token and removes the hooks directory.
#[derive(Debug)]
pub(crate) struct Forwarding {
    gate: Arc<Gate>,
    port: u16,
    serving: Option<Serving>,
}

/// The accept loop of one session's port; aborting it drops the relay (closing the port
/// inside) and every connection task with it.
#[derive(Debug)]
struct Serving(tokio::task::JoinHandle<()>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Forwarding {
    /// Opens a free loopback port inside the sandbox through `client` and serves `gate`
    /// on it.
    pub(crate) async fn start(client: &AgentClient, gate: Gate, sandbox_id: &str) -> Result<Self> {
        let gate = Arc::new(gate);
        let relay = listen(client, GATE_PORT).await?;
        let port = relay.port();
        tracing::debug!(sandbox_id, port, repos = gate.repos.len(), "git gate open");
        Ok(Forwarding {
            serving: Some(serve_port(relay, gate.clone())),
            gate,
            port,
        })
    }

    /// After this handle started a new session with the sandbox's agent (`client`): the
    /// old port's task ends and the same port is opened again on the new session (the
    /// URLs commands were given stay right). Nothing when the sandbox has no gate.
    pub(crate) async fn resume(
        slot: &std::sync::Mutex<Option<Forwarding>>,
        client: &AgentClient,
    ) -> Result<()> {
        let (gate, port) = {
            let mut f = slot.lock().unwrap_or_else(|p| p.into_inner());
            match f.as_mut() {
                Some(f) => {
                    f.serving = None;
                    (f.gate.clone(), f.port)
                }
                None => return Ok(()),
            }
        };
        let relay = listen(client, port).await?;
        if let Some(f) = slot.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            f.serving = Some(serve_port(relay, gate));
        }
        Ok(())
    }

    /// The environment every command gets: each repository's URL with the token.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        self.gate.env(self.port)
    }
}

async fn listen(client: &AgentClient, port: u16) -> Result<TcpRelay> {
    client.tcp_listen(port).await.map_err(|e| {
        SandboxError::config(
            format!(
                "git_repo: the gate's port could not be opened in the sandbox: {}",
                e.render()
            ),
            "the image must let its user bind a loopback port; or create the sandbox \
             without git_repo",
        )
    })
}

fn serve_port(mut relay: TcpRelay, gate: Arc<Gate>) -> Serving {
    Serving(tokio::spawn(async move {
        // Owned here: aborting this task drops every connection's task with it.
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = relay.accept() => match accepted {
                    Ok(conn) => {
                        conns.spawn(gate.clone().serve(conn));
                    }
                    Err(_) => return,
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    }))
}

#[cfg(test)]
mod tests;
