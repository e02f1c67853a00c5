#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]
// docs.rs (all features) marks each adapter module with the cargo feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod blocking;
mod registry;
mod support;
mod target;

use std::sync::Arc;

use tracing::Instrument;

pub use registry::{BackendFactory, DEFAULT_SCHEME, register, schemes};
pub use sandbox_core::*;
pub use support::first_party_support;
pub use target::{BackendConfig, Target};

/// The Docker adapter (typed configuration: `docker::DockerConfig`).
#[cfg(feature = "docker")]
#[cfg_attr(docsrs, doc(cfg(feature = "docker")))]
pub use sandbox_docker as docker;
/// The in-memory fake backend, for tests without an engine.
#[cfg(feature = "fake")]
#[cfg_attr(docsrs, doc(cfg(feature = "fake")))]
pub use sandbox_fake as fake;
/// The Podman adapter (typed configuration: `podman::PodmanConfig`).
#[cfg(feature = "podman")]
#[cfg_attr(docsrs, doc(cfg(feature = "podman")))]
pub use sandbox_podman as podman;

/// Creates a sandbox and returns once it is usable.
///
/// `target` is a DSN (`"docker://sandbox-rs/python:3.11?timeout=60"`), `None` or `""` for
/// the local Docker engine, or a typed configuration ([`BackendConfig`], `DockerConfig`, an
/// `Arc<dyn Backend>`). A DSN's template and timeout are applied on top of `options`.
///
/// Every backend the facade hands out is wrapped in core's enforcement layer
/// ([`layer`]): options are validated and `require_isolation` and the capabilities the
/// policy needs are checked before anything is provisioned, and every operation gets its
/// `tracing` span and audit record. To attach audit sinks, wrap the backend yourself with
/// [`layer::Layer`] and pass the `Arc<dyn Backend>` as the target; the facade detects the
/// layer and does not add a second one. An unknown scheme is `BackendNotFound`, listing the
/// schemes this build has and, for a known first-party one, the cargo feature that adds it.
pub async fn create(target: impl Into<Target>, options: CreateOptions) -> Result<Box<dyn Sandbox>> {
    let target = target.into();
    let span = tracing::info_span!("sandbox.facade.create", backend = tracing::field::Empty);
    async move {
        // Refuse bad options before resolving (and maybe connecting to) an engine.
        options.validate()?;
        let (backend, dsn) = registry::resolve(target).await?;
        tracing::Span::current().record("backend", backend.name());
        let options = match dsn {
            Some(d) => d.apply(options),
            None => options,
        };
        backend.create(options).await
    }
    .instrument(span)
    .await
}

/// Reattaches to a live sandbox by id. An unknown or dead id is `Connect`; never creates.
pub async fn connect(target: impl Into<Target>, id: &str) -> Result<Box<dyn Sandbox>> {
    let target = target.into();
    let span = tracing::info_span!(
        "sandbox.facade.connect",
        backend = tracing::field::Empty,
        id
    );
    async move {
        let (backend, _) = registry::resolve(target).await?;
        tracing::Span::current().record("backend", backend.name());
        backend.connect(id).await
    }
    .instrument(span)
    .await
}

/// The backend a target selects: one shared client per scheme and configuration (per tokio
/// runtime), built on first use. Useful for `diagnose`, `list_managed` and `kill_managed`.
pub async fn backend(target: impl Into<Target>) -> Result<Arc<dyn Backend>> {
    Ok(registry::resolve(target.into()).await?.0)
}
