//! Lifecycle hooks around a container's start, for engines that offer them (Podman's
//! `PodmanOptions::hooks`): `pre_start` runs after the container was created (and copy
//! mounts injected) but before it starts; `post_start` after it started. A hook's error
//! or panic fails the create (the container is removed).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use sandbox_core::BoxError;

use crate::engine::error::{EngineError, EngineErrorKind, EngineResult, engine_text};

/// What a lifecycle hook is told.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HookEvent {
    /// Engine id of the container.
    pub container_id: String,
    /// Template (image) of the sandbox.
    pub template: String,
}

/// An async lifecycle callback. An error aborts the creation (the container is removed).
pub type HookFn =
    Arc<dyn Fn(HookEvent) -> BoxFuture<'static, std::result::Result<(), BoxError>> + Send + Sync>;

/// Lifecycle hooks: `pre_start` runs after the container was created (and copy mounts
/// injected) but before it starts; `post_start` after it started and `/work` exists.
#[derive(Clone, Default)]
pub struct Hooks {
    pre_start: Option<HookFn>,
    post_start: Option<HookFn>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("pre_start", &self.pre_start.is_some())
            .field("post_start", &self.post_start.is_some())
            .finish()
    }
}

impl Hooks {
    /// No hooks.
    pub fn new() -> Self {
        Hooks::default()
    }

    /// Sets the `pre_start` hook.
    pub fn pre_start<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(HookEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        self.pre_start = Some(Arc::new(move |e| Box::pin(f(e))));
        self
    }

    /// Sets the `post_start` hook.
    pub fn post_start<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(HookEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        self.post_start = Some(Arc::new(move |e| Box::pin(f(e))));
        self
    }
}

impl HookEvent {
    /// The event of container `container_id` created from `template`.
    pub fn new(container_id: impl Into<String>, template: impl Into<String>) -> Self {
        HookEvent {
            container_id: container_id.into(),
            template: template.into(),
        }
    }
}

impl Hooks {
    /// Whether a `post_start` hook is set.
    pub fn has_post_start(&self) -> bool {
        self.post_start.is_some()
    }

    /// Runs the `pre_start` hook, if any.
    pub async fn run_pre_start(&self, event: &HookEvent) -> EngineResult<()> {
        run("pre_start", &self.pre_start, event).await
    }

    /// Runs the `post_start` hook, if any.
    pub async fn run_post_start(&self, event: &HookEvent) -> EngineResult<()> {
        run("post_start", &self.post_start, event).await
    }
}

async fn run(name: &str, hook: &Option<HookFn>, event: &HookEvent) -> EngineResult<()> {
    let Some(h) = hook else {
        return Ok(());
    };
    let fut = h(event.clone());
    // A user hook is not an engine call: unbounded here, like the user's own code.
    match futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(fut)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(EngineError::new(
            EngineErrorKind::Other,
            format!("the {name} hook failed: {}", engine_text(&e.to_string())),
        )
        .with_source(e)),
        Err(_) => Err(EngineError::new(
            EngineErrorKind::Other,
            format!("the {name} hook panicked"),
        )),
    }
}
