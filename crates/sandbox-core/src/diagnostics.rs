//! What `sandbox doctor` reports about an engine.

use serde::Serialize;

use crate::IsolationTier;

/// One problem found by [`Backend::diagnose`](crate::Backend::diagnose), with its fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Problem {
    /// What is wrong.
    pub problem: String,
    /// The exact fix, as a command where one exists.
    pub fix: String,
}

impl Problem {
    /// A problem and its fix.
    pub fn new(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        Problem {
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

/// Health of one engine. Never contains secrets (no credentials, no env values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EngineReport {
    /// Backend name.
    pub backend: String,
    /// Whether the engine answered.
    pub reachable: bool,
    /// Engine version, when reachable.
    pub version: Option<String>,
    /// API endpoint tried (socket path or URL, credentials stripped).
    pub endpoint: String,
    /// Why this endpoint was chosen (`DOCKER_HOST`, "docker context `x`", "rootless
    /// socket", "default", "configured"), when the backend discovered it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_reason: Option<String>,
    /// OCI runtimes the engine offers (e.g. `runc`, `runsc`).
    pub runtimes: Vec<String>,
    /// Images sandbox-rs uses and whether each is present.
    pub images: Vec<(String, bool)>,
    /// Tier sandboxes get with the configured runtime.
    pub tier: IsolationTier,
    /// Problems and their fixes (empty when healthy).
    pub problems: Vec<Problem>,
}

impl EngineReport {
    /// An empty report for `backend` at `endpoint`.
    pub fn new(backend: impl Into<String>, endpoint: impl Into<String>) -> Self {
        EngineReport {
            backend: backend.into(),
            reachable: false,
            version: None,
            endpoint: endpoint.into(),
            endpoint_reason: None,
            runtimes: vec![],
            images: vec![],
            tier: IsolationTier::Unknown,
            problems: vec![],
        }
    }

    /// Whether the engine is reachable and no problem was found.
    pub fn healthy(&self) -> bool {
        self.reachable && self.problems.is_empty()
    }
}
