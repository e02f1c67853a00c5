//! Connecting the drivers of one backend, describing its engine, sweeping its leftovers.

use std::sync::Arc;

use anyhow::{Result, bail};
use sandbox_core::Backend;

use crate::cli::{Cli, Engine};
use crate::docker_raw::DockerRaw;
use crate::driver::{Driver, Spec, Variant};
use crate::ours::Ours;
use crate::podman_raw::PodmanRaw;

/// The backends this binary can measure.
pub const BACKENDS: [&str; 3] = ["docker", "podman", "fake"];

/// The sandbox-rs backend named `name`.
pub async fn backend(name: &str) -> Result<Arc<dyn Backend>> {
    Ok(match name {
        "docker" => Arc::new(
            sandbox_docker::DockerBackend::connect(sandbox_docker::DockerConfig::from_env())
                .await?,
        ),
        "podman" => Arc::new(
            sandbox_podman::PodmanBackend::connect(sandbox_podman::PodmanConfig::from_env())
                .await?,
        ),
        "fake" => Arc::new(sandbox_fake::FakeBackend::new()),
        other => bail!("unknown backend {other:?} (expected one of {BACKENDS:?})"),
    })
}

/// The backend forks are measured on: Docker under gVisor (the only engine here whose
/// sandboxes checkpoint), or the fake; `Err` says why there is none.
pub async fn fork_backend(name: &str) -> Result<Arc<dyn Backend>> {
    match name {
        "docker" => Ok(Arc::new(
            sandbox_docker::DockerBackend::connect(
                sandbox_docker::DockerConfig::from_env().runtime(sandbox_docker::Runtime::Runsc),
            )
            .await?,
        )),
        "fake" => backend(name).await,
        other => bail!(
            "{other} sandboxes cannot fork with memory here (CRIU fails on this kernel); \
             forks are measured on Docker with gVisor"
        ),
    }
}

/// The drivers of `variants` for `name` (raw and CLI exist for docker and podman only).
pub async fn drivers(
    name: &str,
    spec: &Spec,
    variants: &[Variant],
) -> Result<(Option<Arc<dyn Backend>>, Vec<Arc<dyn Driver>>)> {
    let mut out: Vec<Arc<dyn Driver>> = Vec::new();
    let mut ours_backend = None;
    for v in variants {
        match (v, name) {
            (Variant::Ours, _) => {
                let b = backend(name).await?;
                ours_backend = Some(b.clone());
                out.push(Arc::new(Ours {
                    backend: b,
                    options: spec.options(),
                }));
            }
            (Variant::Raw, "docker") => out.push(Arc::new(DockerRaw::connect(spec.clone()).await?)),
            (Variant::Raw, "podman") => out.push(Arc::new(PodmanRaw::connect(spec.clone())?)),
            (Variant::Cli, "docker") => out.push(Arc::new(Cli::new(Engine::Docker, spec.clone()))),
            (Variant::Cli, "podman") => out.push(Arc::new(Cli::new(Engine::Podman, spec.clone()))),
            _ => {}
        }
    }
    Ok((ours_backend, out))
}

/// The variants measured for a backend.
pub fn variants_of(name: &str) -> Vec<Variant> {
    match name {
        "docker" | "podman" => vec![Variant::Ours, Variant::Raw, Variant::Cli],
        _ => vec![Variant::Ours],
    }
}

/// Engine and CLI versions for the report.
pub async fn describe(name: &str, spec: &Spec) -> (String, Option<String>) {
    match name {
        "docker" => {
            let engine = match DockerRaw::connect(spec.clone()).await {
                Ok(r) => r.engine_version().await,
                Err(e) => format!("unreachable ({e})"),
            };
            let cli = Cli::new(Engine::Docker, spec.clone()).version().await;
            (engine, Some(cli))
        }
        "podman" => {
            let engine = match PodmanRaw::connect(spec.clone()) {
                Ok(r) => r.engine_version().await,
                Err(e) => format!("unreachable ({e})"),
            };
            let cli = Cli::new(Engine::Podman, spec.clone()).version().await;
            (engine, Some(cli))
        }
        _ => ("in-process fake (sandbox-fake)".into(), None),
    }
}

/// Removes every container of this run (by its label); returns how many were left.
pub async fn sweep(name: &str, spec: &Spec) -> Result<usize> {
    match name {
        "docker" => DockerRaw::connect(spec.clone()).await?.sweep().await,
        "podman" => PodmanRaw::connect(spec.clone())?.sweep().await,
        _ => Ok(0),
    }
}
