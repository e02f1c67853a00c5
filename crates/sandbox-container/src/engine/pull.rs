//! What an image pull exchanges with the engine: the credentials it may send
//! ([`RegistryAuth`], found through a [`CredentialStore`]) and the progress it reports
//! ([`PullProgress`], delivered to a [`PullProgressHook`]). Finding credentials and
//! sharing pulls is the `image` module's job.

use std::fmt;
use std::sync::Arc;

use sandbox_core::Secret;

/// One image pull asked of the engine ([`ContainerEngine::pull`](crate::ContainerEngine::pull)).
#[non_exhaustive]
pub struct PullRequest<'a> {
    /// The image reference as the caller gave it.
    pub image: &'a str,
    /// Credentials for its registry, when some were found.
    pub auth: Option<&'a RegistryAuth>,
    /// Receives each progress message the engine reports.
    pub progress: &'a (dyn Fn(PullProgress) + Send + Sync),
}

impl<'a> PullRequest<'a> {
    pub(crate) fn new(
        image: &'a str,
        auth: Option<&'a RegistryAuth>,
        progress: &'a (dyn Fn(PullProgress) + Send + Sync),
    ) -> Self {
        PullRequest {
            image,
            auth,
            progress,
        }
    }
}

impl fmt::Debug for PullRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PullRequest")
            .field("image", &self.image)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
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

    pub(crate) fn call(&self, p: &PullProgress) {
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
