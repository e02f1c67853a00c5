//! `DockerBackend`: the container layer of `sandbox-container` on [`DockerEngine`], with
//! Docker's `connect` and the accessors every adapter's backend has.

use std::sync::Arc;

use sandbox_container::{ContainerBackend, ContainerEngine, ContainerNative, ContainerSandbox};
use sandbox_core::Result;

use crate::config::DockerConfig;
use crate::engine::DockerEngine;

/// A Docker sandbox: the shared container sandbox on [`DockerEngine`].
pub type DockerSandbox = ContainerSandbox<DockerEngine>;

/// What [`Sandbox::native`](sandbox_core::Sandbox::native) returns for a Docker sandbox: the engine (its bollard client
/// through [`DockerEngine::client`]) and the container id.
///
/// **Outside the semver contract**: its fields and their types (including the `bollard`
/// version) may change in any release.
pub type DockerNative = ContainerNative<DockerEngine>;

/// The Docker backend. Cheap to clone (one shared bollard client).
#[derive(Clone, Debug)]
pub struct DockerBackend {
    inner: ContainerBackend<DockerEngine>,
}

impl DockerBackend {
    /// Connects to the engine (`config.endpoint`, else discovered: `DOCKER_HOST`, the
    /// current Docker context, the rootless socket, the default socket), negotiates the API
    /// version, pings it, checks the runtime is registered, and sweeps this host's
    /// leftovers (owner proven gone, or long past their deadline).
    ///
    /// `ssh://[user@]host[:port][/socket]` goes through the OpenSSH client, which forwards
    /// the remote socket (see `sandbox_container::endpoint::ssh`; `BatchMode`, the user's keys and
    /// known hosts). Refused with `Configuration` before connecting: malformed `ssh://`
    /// endpoints, TLS endpoints
    /// without the `tls` feature or with missing certificate files, plain `tcp://` unless
    /// [`DockerConfig::allow_plain_tcp`], and a selected context that does not resolve.
    /// An engine that does not answer is `EngineUnavailable` with the start command as hint.
    pub async fn connect(config: DockerConfig) -> Result<DockerBackend> {
        config.options.validate()?;
        let config = config.resolved();
        let container = config.container_config();
        let engine = DockerEngine::connect(config).await?;
        Ok(DockerBackend {
            inner: ContainerBackend::new(engine, container).await,
        })
    }

    /// The configuration in effect.
    pub fn config(&self) -> &DockerConfig {
        self.inner.engine().config()
    }

    /// The engine endpoint (credentials removed).
    pub fn endpoint(&self) -> &str {
        self.inner.engine().endpoint()
    }

    /// The shared bollard client. **Outside the semver contract.**
    pub fn client(&self) -> &bollard::Docker {
        self.inner.engine().client()
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<DockerEngine> {
        self.inner.engine()
    }

    /// The generic container backend this wraps.
    pub fn container_backend(&self) -> &ContainerBackend<DockerEngine> {
        &self.inner
    }
}

sandbox_container::forward_backend!(DockerBackend, inner, |this| {
    this.config().endpoint_source.to_string()
});
