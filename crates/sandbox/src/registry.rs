//! The runtime registry: which schemes exist, and one cached backend per configuration.
//!
//! First-party schemes (`docker`, `podman`, `fake`) are compiled in by cargo features;
//! third-party adapters add theirs with [`register`]. Backends are cached per tokio runtime
//! and configuration, because engine clients (hyper connection pools) are tied to the
//! runtime that created them: a client reused from a runtime that has shut down fails
//! with "dispatch task is gone" errors.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use futures::future::BoxFuture;
use sandbox_core::{Backend, Dsn, Result, SandboxError};
use tokio::sync::OnceCell;

use crate::target::{BackendConfig, Target};

/// Builds a backend for a registered scheme. Called at most once per tokio runtime
/// (the result is cached); a failure is not cached, so the next call retries.
pub type BackendFactory =
    Arc<dyn Fn() -> BoxFuture<'static, Result<Arc<dyn Backend>>> + Send + Sync>;

/// First-party schemes and the cargo feature of the `sandbox` crate that adds each.
const FIRST_PARTY: &[(&str, &str, bool)] = &[
    ("docker", "docker", cfg!(feature = "docker")),
    ("podman", "podman", cfg!(feature = "podman")),
    ("fake", "fake", cfg!(feature = "fake")),
];

/// The scheme `None` / `""` selects.
pub const DEFAULT_SCHEME: &str = "docker";

type CacheKey = (tokio::runtime::Id, String);
type Slot = Arc<OnceCell<Arc<dyn Backend>>>;

#[derive(Default)]
struct Registry {
    factories: RwLock<BTreeMap<String, BackendFactory>>,
    cache: Mutex<HashMap<CacheKey, Slot>>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// Registers a third-party adapter under `scheme`, so `create("<scheme>://…")` and
/// `connect` reach it. Registering the same scheme again replaces the factory (and drops
/// cached backends of that scheme). A scheme compiled into this build (`docker`, `fake`,
/// …) cannot be replaced; an invalid scheme is a `Configuration` error.
///
/// ```
/// use std::sync::Arc;
/// use sandbox::Backend;
/// # #[derive(Debug)] struct MyBackend;
/// # #[sandbox::async_trait]
/// # impl Backend for MyBackend {
/// #     fn name(&self) -> &str { "mine" }
/// #     fn capabilities(&self) -> sandbox::Capability { sandbox::Capability::empty() }
/// #     fn isolation(&self) -> sandbox::IsolationTier { sandbox::IsolationTier::Container }
/// #     async fn create(&self, _: sandbox::CreateOptions) -> sandbox::Result<Box<dyn sandbox::Sandbox>> { unimplemented!() }
/// #     async fn connect(&self, _: &str) -> sandbox::Result<Box<dyn sandbox::Sandbox>> { unimplemented!() }
/// # }
/// sandbox::register("mine", || async { Ok(Arc::new(MyBackend) as Arc<dyn Backend>) })?;
/// assert!(sandbox::schemes().contains(&"mine".to_string()));
/// # Ok::<(), sandbox::SandboxError>(())
/// ```
pub fn register<F, Fut>(scheme: &str, factory: F) -> Result<()>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Arc<dyn Backend>>> + Send + 'static,
{
    let parsed = Dsn::parse(&format!("{scheme}://"))?;
    if parsed.scheme != scheme {
        return Err(SandboxError::config(
            format!("invalid scheme {scheme:?}"),
            "a scheme matches [a-z][a-z0-9+.-]*",
        ));
    }
    if FIRST_PARTY
        .iter()
        .any(|(name, _, compiled)| *compiled && *name == scheme)
    {
        return Err(SandboxError::config(
            format!("scheme `{scheme}` is a compiled-in first-party backend"),
            "register your adapter under another scheme, or build `sandbox` without that feature",
        ));
    }
    let factory: BackendFactory = Arc::new(move || Box::pin(factory()));
    write(&registry().factories).insert(scheme.to_string(), factory);
    let key = custom_key(scheme);
    lock(&registry().cache).retain(|(_, k), _| *k != key);
    Ok(())
}

/// Every scheme this process can reach: the compiled-in first-party ones, then registered
/// ones, each once, sorted.
pub fn schemes() -> Vec<String> {
    let mut out: Vec<String> = FIRST_PARTY
        .iter()
        .filter(|(_, _, compiled)| *compiled)
        .map(|(name, _, _)| name.to_string())
        .collect();
    out.extend(read(&registry().factories).keys().cloned());
    out.sort();
    out.dedup();
    out
}

/// Resolves a target to a backend (cached per runtime and configuration) and the DSN, if
/// the target was one (its template and timeout apply to `CreateOptions`).
pub(crate) async fn resolve(target: Target) -> Result<(Arc<dyn Backend>, Option<Dsn>)> {
    let (backend, dsn) = match target {
        Target::Default => (backend_for_scheme(DEFAULT_SCHEME).await?, None),
        Target::Dsn(s) => {
            let dsn = Dsn::parse(&s)?;
            (backend_for_scheme(&dsn.scheme).await?, Some(dsn))
        }
        Target::Parsed(dsn) => (backend_for_scheme(&dsn.scheme).await?, Some(dsn)),
        Target::Config(c) => (backend_for_config(*c).await?, None),
    };
    // Cached backends are wrapped once when built; a user's object is wrapped here (or kept,
    // when it already carries the layer).
    Ok((crate::support::enforce(backend), dsn))
}

async fn backend_for_scheme(scheme: &str) -> Result<Arc<dyn Backend>> {
    if let Some(config) = first_party_config(scheme) {
        return backend_for_config(config).await;
    }
    let factory = read(&registry().factories).get(scheme).cloned();
    match factory {
        Some(f) => cached(custom_key(scheme), move || f()).await,
        None => Err(not_found(scheme)),
    }
}

/// The typed configuration a first-party scheme means, read from the environment.
fn first_party_config(scheme: &str) -> Option<BackendConfig> {
    match scheme {
        #[cfg(feature = "docker")]
        "docker" => Some(BackendConfig::Docker(
            sandbox_docker::DockerConfig::from_env(),
        )),
        #[cfg(feature = "podman")]
        "podman" => Some(BackendConfig::Podman(
            sandbox_podman::PodmanConfig::from_env(),
        )),
        #[cfg(feature = "fake")]
        "fake" => Some(BackendConfig::Fake(sandbox_fake::FakeConfig::default())),
        _ => None,
    }
}

fn not_found(scheme: &str) -> SandboxError {
    let feature = FIRST_PARTY
        .iter()
        .find(|(name, _, compiled)| !compiled && *name == scheme)
        .map(|(_, feature, _)| feature.to_string());
    SandboxError::backend_not_found(scheme, schemes(), feature)
}

async fn backend_for_config(config: BackendConfig) -> Result<Arc<dyn Backend>> {
    match config {
        #[cfg(feature = "docker")]
        BackendConfig::Docker(c) => {
            // The key holds the whole configuration so two different configs get two
            // clients; it is never printed.
            let key = format!("docker:{c:?}");
            cached(key, move || {
                Box::pin(async move {
                    let b = sandbox_docker::DockerBackend::connect(c).await?;
                    Ok(Arc::new(b) as Arc<dyn Backend>)
                })
            })
            .await
        }
        #[cfg(feature = "podman")]
        BackendConfig::Podman(c) => {
            let key = format!("podman:{c:?}");
            cached(key, move || {
                Box::pin(async move {
                    let b = sandbox_podman::PodmanBackend::connect(c).await?;
                    Ok(Arc::new(b) as Arc<dyn Backend>)
                })
            })
            .await
        }
        #[cfg(feature = "fake")]
        BackendConfig::Fake(c) => {
            let key = format!("fake:{c:?}");
            cached(key, move || {
                Box::pin(async move {
                    Ok(Arc::new(sandbox_fake::FakeBackend::with_config(c)) as Arc<dyn Backend>)
                })
            })
            .await
        }
        BackendConfig::Custom(b) => Ok(b),
    }
}

async fn cached<F>(key: String, build: F) -> Result<Arc<dyn Backend>>
where
    F: FnOnce() -> BoxFuture<'static, Result<Arc<dyn Backend>>>,
{
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|_| {
            SandboxError::config(
                "the async sandbox API needs a tokio runtime",
                "call it inside a tokio runtime (#[tokio::main]), or use sandbox::blocking",
            )
        })?
        .id();
    let slot = lock(&registry().cache)
        .entry((runtime, key))
        .or_default()
        .clone();
    slot.get_or_try_init(|| async move { build().await.map(crate::support::enforce) })
        .await
        .cloned()
}

fn custom_key(scheme: &str) -> String {
    format!("custom:{scheme}")
}

// A poisoned lock only means another thread panicked while holding it; the maps stay
// consistent (every write is a single insert/retain), so keep going.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}
fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorCode;

    #[tokio::test]
    async fn unknown_scheme_lists_what_is_compiled_in() {
        let e = backend_for_scheme("nosuch").await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::BackendNotFound);
        let SandboxError::BackendNotFound {
            available, feature, ..
        } = e
        else {
            unreachable!()
        };
        // Another test registers a scheme concurrently: compare with a snapshot taken
        // after the error, which holds everything the error could have listed.
        let now = schemes();
        assert!(!available.is_empty(), "no scheme listed");
        assert!(
            available.iter().all(|s| now.contains(s)),
            "{available:?} vs {now:?}"
        );
        assert!(!available.iter().any(|s| s == "nosuch"));
        assert_eq!(feature, None);
    }

    #[cfg(not(feature = "podman"))]
    #[tokio::test]
    async fn known_but_missing_scheme_names_its_feature() {
        let e = backend_for_scheme("podman").await.unwrap_err();
        let SandboxError::BackendNotFound { feature, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(feature.as_deref(), Some("podman"));
        assert!(e.hint().contains("`podman` cargo feature"), "{}", e.hint());
    }

    #[test]
    fn compiled_in_schemes_cannot_be_replaced_and_bad_schemes_are_refused() {
        for bad in ["", "Bad", "a b", "x://y"] {
            let r = register(bad, || async { Err(SandboxError::gone("x")) });
            assert_eq!(r.unwrap_err().code(), ErrorCode::Configuration, "{bad:?}");
        }
        for (name, _, compiled) in FIRST_PARTY {
            if *compiled {
                let r = register(name, || async { Err(SandboxError::gone("x")) });
                assert_eq!(r.unwrap_err().code(), ErrorCode::Configuration);
            }
        }
    }

    #[tokio::test]
    async fn failed_factory_is_retried_not_cached() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        register("flaky-test", || async {
            CALLS.fetch_add(1, Ordering::SeqCst);
            Err(SandboxError::engine_unavailable(
                "flaky-test",
                "nowhere",
                "start it",
            ))
        })
        .unwrap();
        for _ in 0..2 {
            let e = backend_for_scheme("flaky-test").await.unwrap_err();
            assert_eq!(e.code(), ErrorCode::EngineUnavailable);
        }
        assert_eq!(CALLS.load(Ordering::SeqCst), 2);
    }
}
