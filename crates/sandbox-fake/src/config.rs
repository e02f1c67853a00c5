//! Typed options of the fake backend.

use std::time::Duration;

use sandbox_core::{Capability, IsolationTier};

/// Default template of fake sandboxes (it "has" python3 and the busybox applets).
pub const DEFAULT_TEMPLATE: &str = "sandbox-rs/python:3.11";

/// Everything the fake backend declares (pause and resume freeze a sandbox's programs
/// before their next output or start; `extend` moves the virtual deadline up to the
/// maximum lifetime; an idle limit removes a sandbox with no call, no program and no
/// context for that long; a snapshot copies the in-memory filesystem into a template
/// `create` accepts; stop ends every program and context and keeps the filesystem until
/// start or the deadline; a fork copies the filesystem and the contexts' variables into
/// new sandboxes, but not running programs, which are tasks of this process). `PTY`, `GPU`,
/// `INGRESS_PORTS` (nothing in a fake sandbox can accept a host connection) and `TUNNELS`
/// are not implemented and therefore never declared: asking for them is
/// `CapabilityNotSupported`.
pub fn full_capabilities() -> Capability {
    Capability::RUN_COMMAND
        | Capability::RUN_CODE
        | Capability::STATEFUL_CODE
        | Capability::STREAMING
        | Capability::STDIN
        | Capability::FILESYSTEM
        | Capability::UPLOAD_DOWNLOAD
        | Capability::NETWORK_POLICY
        | Capability::EGRESS_ALLOWLIST
        | Capability::LIVE_EGRESS
        | Capability::HOST_PORTS
        | Capability::PAUSE_RESUME
        | Capability::EXTEND_LIFETIME
        | Capability::IDLE_TIMEOUT
        | Capability::SNAPSHOT
        | Capability::STOP_START
        | Capability::SNAPSHOT_FORK
}

/// Options of a [`FakeBackend`](crate::FakeBackend). Build one with
/// [`FakeBackend::builder`](crate::FakeBackend::builder) or start from `Default`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FakeConfig {
    /// Declared capabilities (default [`full_capabilities`]). Remove some to simulate a
    /// poorer backend: using an undeclared one returns `CapabilityNotSupported`.
    pub capabilities: Capability,
    /// Reported isolation tier (default `Container`).
    pub isolation: IsolationTier,
    /// Template used when `CreateOptions::template` is `None` (default [`DEFAULT_TEMPLATE`]).
    pub default_template: String,
    /// A template whose name contains one of these substrings has no `python3`
    /// (default `["busybox"]`): `run_code` there returns `InterpreterMissing`.
    pub templates_without_python: Vec<String>,
    /// When set, only these templates exist; any other fails `create` with a `Creation`
    /// error, like an image that cannot be pulled. Default: every template exists.
    pub known_templates: Option<Vec<String>>,
    /// User id commands run as (default 1000): 0 gives `HOME=/root`, any other
    /// `HOME=/home/sandbox`.
    pub uid: u32,
    /// Delay before every `create` returns (virtual time; default zero). The same as
    /// `faults().set_create_delay` at start.
    pub create_delay: Duration,
    /// Bound of a whole `create` (default 60 s, the container adapters' default): a
    /// create delayed or stalled past it fails with `CreateTimeout` and leaves nothing.
    pub create_timeout: Duration,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            capabilities: full_capabilities(),
            isolation: IsolationTier::Container,
            default_template: DEFAULT_TEMPLATE.to_string(),
            templates_without_python: vec!["busybox".to_string()],
            known_templates: None,
            uid: 1000,
            create_delay: Duration::ZERO,
            create_timeout: Duration::from_secs(60),
        }
    }
}

impl FakeConfig {
    /// Whether `template` has a python3 interpreter.
    pub fn template_has_python(&self, template: &str) -> bool {
        !self
            .templates_without_python
            .iter()
            .any(|marker| template.contains(marker.as_str()))
    }

    /// Whether `template` exists.
    pub fn template_exists(&self, template: &str) -> bool {
        self.known_templates
            .as_ref()
            .is_none_or(|known| known.iter().any(|t| t == template))
    }
}

/// Builder of a [`FakeBackend`](crate::FakeBackend).
#[derive(Debug, Clone, Default)]
pub struct FakeBuilder {
    config: FakeConfig,
}

impl FakeBuilder {
    /// Declares exactly these capabilities.
    pub fn capabilities(mut self, caps: Capability) -> Self {
        self.config.capabilities = caps;
        self
    }
    /// Removes capabilities from the declared set.
    pub fn without(mut self, caps: Capability) -> Self {
        self.config.capabilities.remove(caps);
        self
    }
    /// Reports this isolation tier.
    pub fn isolation(mut self, tier: IsolationTier) -> Self {
        self.config.isolation = tier;
        self
    }
    /// Sets the default template.
    pub fn default_template(mut self, template: impl Into<String>) -> Self {
        self.config.default_template = template.into();
        self
    }
    /// Marks templates whose name contains `marker` as having no python3.
    pub fn template_without_python(mut self, marker: impl Into<String>) -> Self {
        self.config.templates_without_python.push(marker.into());
        self
    }
    /// Restricts the set of existing templates.
    pub fn known_templates<I, S>(mut self, templates: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config.known_templates = Some(templates.into_iter().map(Into::into).collect());
        self
    }
    /// Sets the uid commands run as.
    pub fn uid(mut self, uid: u32) -> Self {
        self.config.uid = uid;
        self
    }
    /// Delays every `create` (virtual time).
    pub fn create_delay(mut self, delay: Duration) -> Self {
        self.config.create_delay = delay;
        self
    }
    /// Bounds every `create` (`CreateTimeout` past it).
    pub fn create_timeout(mut self, limit: Duration) -> Self {
        self.config.create_timeout = limit;
        self
    }
    /// The configuration built so far.
    pub fn config(&self) -> &FakeConfig {
        &self.config
    }
    /// Builds the backend.
    pub fn build(self) -> crate::FakeBackend {
        crate::FakeBackend::with_config(self.config)
    }
}
