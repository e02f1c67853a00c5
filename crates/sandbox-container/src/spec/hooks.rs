//! Lifecycle hooks at four points of a sandbox's life, for the engines that offer them
//! (`PodmanOptions::hooks`, `DockerOptions::hooks`): `pre_start` after the container was
//! created (and copy mounts injected) but before it starts; `post_start` after it started;
//! `ready` once the sandbox is usable (egress rules loaded, the agent greeted), just before
//! `create` returns; `post_stop` after its container was removed. An error or panic of the
//! first three fails the create (the container is removed); `post_stop`'s is logged, since
//! nothing is left to undo.

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
/// injected) but before it starts; `post_start` after it started and `/work` exists;
/// `ready` when the sandbox is usable, before `create` returns; `post_stop` after the
/// sandbox's container was removed by `kill` or by dropping its handle (once).
#[derive(Clone, Default)]
pub struct Hooks {
    pre_start: Option<HookFn>,
    post_start: Option<HookFn>,
    ready: Option<HookFn>,
    post_stop: Option<HookFn>,
}

/// Two hook sets are equal when they hold the very same callbacks (closures cannot be
/// compared by what they do): a configuration compared with a clone of itself is equal.
impl PartialEq for Hooks {
    fn eq(&self, other: &Self) -> bool {
        let same = |a: &Option<HookFn>, b: &Option<HookFn>| match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same(&self.pre_start, &other.pre_start)
            && same(&self.post_start, &other.post_start)
            && same(&self.ready, &other.ready)
            && same(&self.post_stop, &other.post_stop)
    }
}

impl Eq for Hooks {}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("pre_start", &self.pre_start.is_some())
            .field("post_start", &self.post_start.is_some())
            .field("ready", &self.ready.is_some())
            .field("post_stop", &self.post_stop.is_some())
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

    /// Sets the `ready` hook.
    pub fn ready<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(HookEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        self.ready = Some(Arc::new(move |e| Box::pin(f(e))));
        self
    }

    /// Sets the `post_stop` hook.
    pub fn post_stop<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(HookEvent) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        self.post_stop = Some(Arc::new(move |e| Box::pin(f(e))));
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

    /// Runs the `ready` hook, if any.
    pub async fn run_ready(&self, event: &HookEvent) -> EngineResult<()> {
        run("ready", &self.ready, event).await
    }

    /// Whether a `post_stop` hook is set.
    pub fn has_post_stop(&self) -> bool {
        self.post_stop.is_some()
    }

    /// Runs the `post_stop` hook, if any; its failure is logged (the sandbox is gone,
    /// nothing is left to undo).
    pub async fn run_post_stop(&self, event: &HookEvent) {
        if let Err(e) = run("post_stop", &self.post_stop, event).await {
            tracing::warn!(sandbox_id = %event.container_id, error = %e, "post_stop hook failed");
        }
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
