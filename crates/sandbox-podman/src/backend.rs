//! `PodmanBackend`: the container layer of `sandbox-container` on [`PodmanEngine`], plus
//! what only Podman has: per-sandbox [`PodmanOptions`] (typed mounts with sealed copy-in,
//! vetted runtime, capabilities and annotations, lifecycle hooks, CDI devices).

use std::sync::Arc;

use podman_api::Podman;
use sandbox_container::endpoint::discovery::unavailable_or_missing;
use sandbox_container::{ContainerBackend, ContainerEngine, ContainerNative, ContainerSandbox};
use sandbox_core::{CreateOptions, Result};

use crate::config::{PodmanConfig, PodmanOptions};
use crate::engine::PodmanEngine;
use crate::error::{BACKEND, to_sandbox_error};

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
    /// Connects to the engine (a bounded ping), checks the backend-wide [`PodmanOptions`],
    /// and runs the startup sweep when the config asks for it.
    pub async fn connect(config: PodmanConfig) -> Result<PodmanBackend> {
        config.options.validate()?;
        let engine = PodmanEngine::connect(&config).await?;
        if let Err(e) = engine.ping().await {
            let e = to_sandbox_error(&config.endpoint, "ping", e);
            return Err(unavailable_or_missing(
                e,
                BACKEND,
                &config.endpoint,
                &["podman"],
                "sudo apt-get install -y podman && sudo cargo xtask setup podman",
            ));
        }
        let inner = ContainerBackend::new(engine, config.layer.clone()).await;
        Ok(PodmanBackend {
            inner,
            config: Arc::new(config),
        })
    }

    /// The podman-api client (outside semver).
    pub fn client(&self) -> &Podman {
        self.inner.engine().client()
    }

    /// The engine (outside semver).
    pub fn engine(&self) -> &PodmanEngine {
        self.inner.engine()
    }

    /// The configuration in effect.
    pub fn config(&self) -> &PodmanConfig {
        &self.config
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
        let layer =
            ContainerBackend::new(engine, self.config.layer.clone().startup_sweep(false)).await;
        layer.create_container(options).await
    }

    /// Removes leftovers whose owner is proven gone or that are long past their deadline
    /// (see `ContainerBackend::sweep`); returns how many were removed.
    pub async fn sweep(&self) -> usize {
        self.inner.sweep().await
    }

    /// The engine-side configured environment of a container (`Config.Env`), for proving
    /// that secrets are not stored there.
    pub async fn engine_env(&self, id: &str) -> Result<Vec<String>> {
        self.engine()
            .engine_env(id)
            .await
            .map_err(|e| to_sandbox_error(&self.config.endpoint, "container inspect", e))
    }
}

sandbox_container::forward_backend!(PodmanBackend, inner, |this| {
    this.config.endpoint_source.to_string()
});
