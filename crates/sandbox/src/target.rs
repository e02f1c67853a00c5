//! What `create` and `connect` accept: a DSN string or a typed backend configuration.
//!
//! Both forms end in the same place: a DSN's scheme is turned into the typed configuration
//! read from the environment (`docker://` → `BackendConfig::Docker(DockerConfig::from_env())`),
//! so a DSN and the equivalent typed configuration build the same backend object (and share
//! its cached client).

use std::fmt;
use std::sync::Arc;

use sandbox_core::{Backend, Dsn};

/// A typed backend configuration. Variants exist for the adapters compiled in (cargo
/// features `docker`, `podman`, `fake`), plus `Custom` for any [`Backend`] object.
#[derive(Clone)]
#[non_exhaustive]
pub enum BackendConfig {
    /// The Docker adapter.
    #[cfg(feature = "docker")]
    #[cfg_attr(docsrs, doc(cfg(feature = "docker")))]
    Docker(sandbox_docker::DockerConfig),
    /// The Podman adapter.
    #[cfg(feature = "podman")]
    #[cfg_attr(docsrs, doc(cfg(feature = "podman")))]
    Podman(sandbox_podman::PodmanConfig),
    /// The in-memory fake. `fake://` means `FakeConfig::default()`; one fake (with its
    /// sandboxes) is shared per configuration, like an engine.
    #[cfg(feature = "fake")]
    #[cfg_attr(docsrs, doc(cfg(feature = "fake")))]
    Fake(sandbox_fake::FakeConfig),
    /// A ready backend object (a configured fake, a third-party adapter). Used as is,
    /// never cached.
    Custom(Arc<dyn Backend>),
}

impl BackendConfig {
    /// The DSN scheme this configuration belongs to.
    pub fn scheme(&self) -> &str {
        match self {
            #[cfg(feature = "docker")]
            BackendConfig::Docker(_) => "docker",
            #[cfg(feature = "podman")]
            BackendConfig::Podman(_) => "podman",
            #[cfg(feature = "fake")]
            BackendConfig::Fake(_) => "fake",
            BackendConfig::Custom(b) => b.name(),
        }
    }
}

impl fmt::Debug for BackendConfig {
    // Only the scheme: adapter configurations may carry endpoints with credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BackendConfig")
            .field(&self.scheme())
            .finish()
    }
}

/// Where a sandbox lives: the local default engine, a DSN, or a typed configuration.
///
/// Built with `.into()` from `None`, `""`, `&str`/`String` DSNs, a parsed [`Dsn`], a
/// [`BackendConfig`], an adapter configuration (`DockerConfig`, `PodmanConfig`) or an
/// `Arc<dyn Backend>`.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Target {
    /// The local default engine (Docker): what `None` and `""` mean.
    Default,
    /// A DSN, parsed when used (`<backend>://[template][?timeout=N]`).
    Dsn(String),
    /// An already parsed DSN.
    Parsed(Dsn),
    /// A typed configuration.
    Config(Box<BackendConfig>),
}

impl From<&str> for Target {
    fn from(s: &str) -> Self {
        if s.is_empty() {
            Target::Default
        } else {
            Target::Dsn(s.to_string())
        }
    }
}

impl From<String> for Target {
    fn from(s: String) -> Self {
        if s.is_empty() {
            Target::Default
        } else {
            Target::Dsn(s)
        }
    }
}

impl From<&String> for Target {
    fn from(s: &String) -> Self {
        Target::from(s.as_str())
    }
}

/// `None` (and `Some("")`) select the local default engine.
impl From<Option<&str>> for Target {
    fn from(s: Option<&str>) -> Self {
        s.map(Target::from).unwrap_or(Target::Default)
    }
}

impl From<Dsn> for Target {
    fn from(d: Dsn) -> Self {
        Target::Parsed(d)
    }
}

impl From<BackendConfig> for Target {
    fn from(c: BackendConfig) -> Self {
        Target::Config(Box::new(c))
    }
}

impl From<Arc<dyn Backend>> for Target {
    fn from(b: Arc<dyn Backend>) -> Self {
        Target::Config(Box::new(BackendConfig::Custom(b)))
    }
}

#[cfg(feature = "docker")]
#[cfg_attr(docsrs, doc(cfg(feature = "docker")))]
impl From<sandbox_docker::DockerConfig> for Target {
    fn from(c: sandbox_docker::DockerConfig) -> Self {
        Target::Config(Box::new(BackendConfig::Docker(c)))
    }
}

#[cfg(feature = "podman")]
#[cfg_attr(docsrs, doc(cfg(feature = "podman")))]
impl From<sandbox_podman::PodmanConfig> for Target {
    fn from(c: sandbox_podman::PodmanConfig) -> Self {
        Target::Config(Box::new(BackendConfig::Podman(c)))
    }
}

#[cfg(feature = "fake")]
#[cfg_attr(docsrs, doc(cfg(feature = "fake")))]
impl From<sandbox_fake::FakeConfig> for Target {
    fn from(c: sandbox_fake::FakeConfig) -> Self {
        Target::Config(Box::new(BackendConfig::Fake(c)))
    }
}
