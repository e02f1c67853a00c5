//! `PodmanBackend`: the container layer of `sandbox-container` on [`PodmanEngine`], plus
//! what only Podman has: per-sandbox [`PodmanOptions`] (typed mounts with sealed copy-in,
//! vetted runtime, capabilities and annotations, lifecycle hooks, CDI devices).

use std::sync::Arc;

use podman_api::Podman;
use sandbox_container::{ContainerBackend, ContainerEngine, ContainerNative, ContainerSandbox};
use sandbox_core::{CreateOptions, Result};

use crate::config::{PodmanConfig, PodmanOptions};
use crate::engine::PodmanEngine;

/// One Podman sandbox (a container). Dropping it without `kill()` removes the container in
/// the background, bounded by the teardown grace.
pub type PodmanSandbox = ContainerSandbox<PodmanEngine>;

/// The engine and container id behind a [`PodmanSandbox`] (`Sandbox::native()` downcasts
/// to it). **Outside the semver contract.**
pub type PodmanNative = ContainerNative<PodmanEngine>;

/// The Podman backend: one shared podman-api client behind the shared container layer.
#[derive(Clone)]
pub struct PodmanBackend {
    inner: ContainerBackend<PodmanEngine>,
    config: Arc<PodmanConfig>,
}

impl std::fmt::Debug for PodmanBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodmanBackend")
            .field("endpoint", &self.config.endpoint)
            .field("default_template", &self.config.layer.default_template)
            .finish()
    }
}

impl PodmanBackend {
    /// Checks the backend-wide [`PodmanOptions`], connects to the engine (opening the ssh
    /// tunnel of an `ssh://` endpoint, then a bounded ping: see [`PodmanEngine::connect`]),
    /// and runs the startup sweep when the config asks for it.
    pub async fn connect(config: PodmanConfig) -> Result<PodmanBackend> {
        config.options.validate()?;
        let engine = PodmanEngine::connect(&config).await?;
        let inner = ContainerBackend::new(engine, config.layer.clone()).await;
        Ok(PodmanBackend {
            inner,
            config: Arc::new(config),
        })
    }

    /// The configuration in effect.
    pub fn config(&self) -> &PodmanConfig {
        &self.config
    }

    /// The engine endpoint.
    pub fn endpoint(&self) -> &str {
        self.inner.engine().endpoint()
    }

    /// The podman-api client. **Outside the semver contract.**
    pub fn client(&self) -> &Podman {
        self.inner.engine().client()
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<PodmanEngine> {
        self.inner.engine()
    }

    /// The generic container backend this wraps.
    pub fn container_backend(&self) -> &ContainerBackend<PodmanEngine> {
        &self.inner
    }

    /// Creates a sandbox with explicit [`PodmanOptions`] (outside the portable contract)
    /// instead of the backend's defaults. Every option is checked before anything is
    /// created.
    pub async fn create_with(
        &self,
        options: CreateOptions,
        podman: PodmanOptions,
    ) -> Result<PodmanSandbox> {
        podman.validate()?;
        let engine = self.inner.engine().with_options(podman);
        // Shares this backend's deadline timers: the sandbox is removed past its deadline
        // for as long as this backend lives, like any other.
        self.inner.sibling(engine).create_container(options).await
    }
}

sandbox_container::forward_backend!(PodmanBackend, inner, |this| {
    this.config.endpoint_source.to_string()
});
