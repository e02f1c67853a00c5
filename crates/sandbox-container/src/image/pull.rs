//! One pull per image however many creates wait for it: the pull policy applied on
//! create, the engine's pull stream bounded and turned into progress events, and pull
//! failures classified into typed errors naming the image and the registry.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use sandbox_core::{PullPolicy, Result, SandboxError};

use crate::engine::pull::{CredentialStore, PullProgress, PullProgressHook, PullRequest};
use crate::engine::{ContainerEngine, EngineError, EngineErrorKind, EngineResult};
use crate::error::bounded_text;
use crate::image::ImageRef;

/// The `tracing` target of pull events (`pulling image`, `pull progress`, `pulled image`).
pub const PULL_TARGET: &str = "sandbox_container::pull";

/// Bound of one whole pull. Outside the create bound: a first pull of a large image takes
/// minutes on a slow link, and is not a wedged engine.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// The next item of an engine's pull stream, or an error once it was silent for `idle`
/// (a registry that stalls mid-layer must not hang `create` until its overall bound).
pub async fn next_pull_item<S>(stream: &mut S, idle: Duration) -> EngineResult<Option<S::Item>>
where
    S: futures::Stream + Unpin,
{
    use futures::StreamExt as _;
    tokio::time::timeout(idle, stream.next())
        .await
        .map_err(|_| {
            EngineError::new(
                EngineErrorKind::Other,
                format!("image pull: no progress for {idle:?}"),
            )
        })
}

/// What a failed pull's message, as Docker and Podman word a registry's answer, means:
/// [`EngineErrorKind::Unauthorized`] for a refused or missing credential,
/// [`EngineErrorKind::NotFound`] for an image or tag the registry does not have, `None`
/// for anything else. Both engines report these as text only (a stream error, or a 500
/// with the registry's message), so the adapters share this one reading of it.
pub fn pull_failure_kind(message: &str) -> Option<EngineErrorKind> {
    let m = message.to_ascii_lowercase();
    let any = |needles: &[&str]| needles.iter().any(|n| m.contains(n));
    if any(&[
        "unauthorized",
        "authentication required",
        "no basic auth credentials",
        "incorrect username or password",
        "invalid username/password",
        "denied: ",
    ]) {
        Some(EngineErrorKind::Unauthorized)
    } else if any(&[
        "manifest unknown",
        "not found",
        "repository does not exist",
        "name unknown",
    ]) {
        Some(EngineErrorKind::NotFound)
    } else {
        None
    }
}

/// A failed pull's error with its kind read from the message ([`pull_failure_kind`]),
/// unless the engine itself could not be reached or did not answer: what both adapters
/// return from [`ContainerEngine::pull`](crate::ContainerEngine::pull).
pub fn classify_pull_failure(mut e: crate::EngineError) -> crate::EngineError {
    if !matches!(
        e.kind,
        EngineErrorKind::Unavailable | EngineErrorKind::Timeout
    ) {
        e.kind = pull_failure_kind(&e.message).unwrap_or(e.kind);
    }
    e
}

/// An engine error shared by every create waiting on one pull.
#[derive(Debug, Clone)]
struct SharedError(Arc<EngineError>);

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0)
    }
}

/// How one shared pull ended: the credentials' presence is kept for the error text.
#[derive(Clone)]
enum Outcome {
    Pulled,
    /// The credential lookup failed (a broken credential file): its message and hint;
    /// nothing was pulled.
    Credentials(String, String),
    Failed {
        error: SharedError,
        had_credentials: bool,
    },
}

type Flight = Shared<BoxFuture<'static, Outcome>>;

/// Backend, engine endpoint, image.
type FlightKey = (String, String, String);

struct InFlight {
    id: u64,
    pull: Flight,
    hooks: Arc<Mutex<Vec<PullProgressHook>>>,
}

/// Pulls in flight, by engine endpoint and image: one per image across every backend on
/// the same engine in this process.
static IN_FLIGHT: LazyLock<Mutex<HashMap<FlightKey, InFlight>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

static FLIGHT_IDS: AtomicU64 = AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Images this process has seen on an engine (by backend, endpoint and image). A create
/// of one skips the existence check, which would otherwise cost a round-trip on every
/// create. An image removed since is reported by the create itself (`NotFound`): the
/// caller then [`forget`]s it and ensures it again.
static PRESENT: LazyLock<Mutex<HashSet<FlightKey>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// Bound on [`PRESENT`]: past it the memory is dropped (it is only a shortcut).
const PRESENT_LIMIT: usize = 1024;

fn key<E: ContainerEngine + ?Sized>(engine: &E, image: &str) -> FlightKey {
    (
        engine.backend().to_string(),
        engine.endpoint().to_string(),
        image.to_string(),
    )
}

fn remember(key: FlightKey) {
    let mut present = lock(&PRESENT);
    if present.len() >= PRESENT_LIMIT {
        present.clear();
    }
    present.insert(key);
}

/// Forgets that the engine held `image`: a create found it missing.
pub(crate) fn forget<E: ContainerEngine + ?Sized>(engine: &E, image: &str) {
    lock(&PRESENT).remove(&key(engine, image));
}

/// How [`ensure`] knew that the engine holds the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ensured {
    /// Asked the engine (or pulled) just now.
    Checked,
    /// Remembered from an earlier create in this process; not asked again.
    Remembered,
}

/// Makes sure the engine holds `image` as `policy` asks, before anything is provisioned.
/// `call_timeout` bounds the existence check; [`DEFAULT_PULL_TIMEOUT`] the pull.
pub(crate) async fn ensure<E: ContainerEngine>(
    engine: &Arc<E>,
    image: &str,
    policy: PullPolicy,
    hook: Option<&PullProgressHook>,
    call_timeout: Duration,
) -> Result<Ensured> {
    let parsed = ImageRef::parse(image).ok_or_else(|| {
        SandboxError::config(
            format!("template {image:?} is not an image reference"),
            "use a name like `sandbox-rs/python:3.11` or `registry:5000/team/app:tag`",
        )
    })?;
    let key = key(&**engine, image);
    if policy != PullPolicy::Always && lock(&PRESENT).contains(&key) {
        return Ok(Ensured::Remembered);
    }
    if policy != PullPolicy::Always {
        let exists = crate::engine::transfer::bounded(
            call_timeout,
            "image exists",
            engine.image_exists(image),
        )
        .await
        .map_err(|e| {
            // A wedged engine at the first step of a create is a create timeout,
            // as it is at every later step.
            if e.kind == EngineErrorKind::Timeout {
                crate::error::create_timeout(engine.backend(), call_timeout)
            } else {
                crate::error::engine(&**engine, "check the image", e)
            }
        })?;
        if exists {
            remember(key);
            return Ok(Ensured::Checked);
        }
        if policy == PullPolicy::Never {
            return Err(SandboxError::image_unavailable(
                image,
                &parsed.registry,
                "the engine does not have it and the pull policy is `never`",
                format!(
                    "build it (the project's images: docs/images.md), pull it yourself \
                     (`{} pull {image}`), or allow pulls with PullPolicy::Missing",
                    engine.backend()
                ),
            ));
        }
    }
    let outcome = match tokio::time::timeout(
        DEFAULT_PULL_TIMEOUT,
        join_pull(engine, image, &parsed, hook),
    )
    .await
    {
        Ok(o) => o,
        Err(_) => {
            return Err(SandboxError::image_unavailable(
                image,
                &parsed.registry,
                format!("the pull did not finish within {DEFAULT_PULL_TIMEOUT:?}"),
                format!(
                    "pull it ahead of time (`{} pull {image}`), then create again",
                    engine.backend()
                ),
            ));
        }
    };
    match outcome {
        Outcome::Pulled => {
            remember(key);
            Ok(Ensured::Checked)
        }
        Outcome::Credentials(message, hint) => Err(SandboxError::config(message, hint)),
        Outcome::Failed {
            error,
            had_credentials,
        } => Err(pull_error(
            &**engine,
            image,
            &parsed,
            error,
            had_credentials,
        )),
    }
}

/// Joins the pull of `image` in flight on this engine, or starts it.
async fn join_pull<E: ContainerEngine>(
    engine: &Arc<E>,
    image: &str,
    parsed: &ImageRef,
    hook: Option<&PullProgressHook>,
) -> Outcome {
    let key = key(&**engine, image);
    let (id, pull) = {
        let mut flights = lock(&IN_FLIGHT);
        match flights.get(&key) {
            Some(f) => {
                if let Some(h) = hook {
                    lock(&f.hooks).push(h.clone());
                }
                tracing::debug!(target: PULL_TARGET, image, "joining the pull in flight");
                (f.id, f.pull.clone())
            }
            None => {
                let hooks = Arc::new(Mutex::new(hook.cloned().into_iter().collect::<Vec<_>>()));
                let id = FLIGHT_IDS.fetch_add(1, Ordering::Relaxed);
                let pull = start_pull(
                    engine.clone(),
                    image.to_string(),
                    parsed.clone(),
                    hooks.clone(),
                );
                flights.insert(
                    key.clone(),
                    InFlight {
                        id,
                        pull: pull.clone(),
                        hooks,
                    },
                );
                (id, pull)
            }
        }
    };
    // Removes the entry when this waiter leaves, finished or cancelled: a later create
    // (PullPolicy::Always, or after a failure) starts a fresh pull.
    struct Leave(Option<(FlightKey, u64)>);
    impl Drop for Leave {
        fn drop(&mut self) {
            if let Some((key, id)) = self.0.take() {
                let mut flights = lock(&IN_FLIGHT);
                if flights.get(&key).is_some_and(|f| f.id == id) {
                    flights.remove(&key);
                }
            }
        }
    }
    let outcome = pull.await;
    let _leave = Leave(Some((key, id)));
    outcome
}

fn start_pull<E: ContainerEngine>(
    engine: Arc<E>,
    image: String,
    parsed: ImageRef,
    hooks: Arc<Mutex<Vec<PullProgressHook>>>,
) -> Flight {
    async move {
        let store = engine.credential_store();
        let lookup = {
            let parsed = parsed.clone();
            tokio::task::spawn_blocking(move || store.lookup(&parsed)).await
        };
        let auth = match lookup {
            Ok(Ok(auth)) => auth,
            Ok(Err(e)) => {
                let message = match &e {
                    SandboxError::Configuration { message, .. } => message.clone(),
                    other => other.to_string(),
                };
                return Outcome::Credentials(message, e.hint());
            }
            Err(e) => {
                return Outcome::Credentials(
                    format!("reading registry credentials failed: {e}"),
                    "retry the create".into(),
                );
            }
        };
        let started = Instant::now();
        tracing::info!(
            target: PULL_TARGET,
            backend = engine.backend(),
            image = %image,
            registry = %parsed.registry,
            with_credentials = auth.is_some(),
            "pulling image"
        );
        let report = |p: PullProgress| {
            tracing::debug!(
                target: PULL_TARGET,
                image = %p.image,
                layer = p.layer.as_deref().unwrap_or(""),
                status = %bounded_text(&p.status),
                current = p.current.unwrap_or(0),
                total = p.total.unwrap_or(0),
                "pull progress"
            );
            let hooks: Vec<PullProgressHook> = lock(&hooks).clone();
            for h in &hooks {
                h.call(&p);
            }
        };
        let result = engine
            .pull(PullRequest::new(&image, auth.as_ref(), &report))
            .await;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match result {
            Ok(()) => {
                tracing::info!(target: PULL_TARGET, image = %image, elapsed_ms, "pulled image");
                Outcome::Pulled
            }
            Err(e) => {
                tracing::info!(
                    target: PULL_TARGET,
                    image = %image,
                    elapsed_ms,
                    kind = ?e.kind,
                    "pull failed"
                );
                Outcome::Failed {
                    error: SharedError(Arc::new(e)),
                    had_credentials: auth.is_some(),
                }
            }
        }
    }
    .boxed()
    .shared()
}

/// A failed pull as the error a user can act on: who refused, what, and the fix.
fn pull_error<E: ContainerEngine + ?Sized>(
    engine: &E,
    image: &str,
    parsed: &ImageRef,
    error: SharedError,
    had_credentials: bool,
) -> SandboxError {
    let registry = &parsed.registry;
    let store = engine.credential_store();
    match error.0.kind {
        EngineErrorKind::Unavailable | EngineErrorKind::Timeout => {
            SandboxError::engine_unavailable(
                engine.backend(),
                engine.endpoint(),
                engine.unavailable_hint(),
            )
            .with_source(error)
        }
        EngineErrorKind::Unauthorized => {
            let detail = if had_credentials {
                format!("registry {registry} refused the credentials for `{image}`")
            } else {
                format!(
                    "registry {registry} demands credentials for `{image}` and none are configured"
                )
            };
            SandboxError::auth_refused(
                store.env_var(),
                detail,
                format!(
                    "log in with `{}` (it writes the credential file), or point {} at {} \
                     with `{registry}` under `auths`",
                    store.login_command(registry),
                    store.env_var(),
                    match store {
                        CredentialStore::Docker => "a directory whose config.json has",
                        _ => "an auth.json",
                    }
                ),
            )
        }
        EngineErrorKind::NotFound => SandboxError::image_unavailable(
            image,
            registry,
            format!(
                "the registry has no `{}{}`",
                parsed.repository, parsed.reference
            ),
            format!(
                "check the name and tag (`{parsed}`); the project's own images are built \
                 from images/ (docs/images.md)"
            ),
        )
        .with_source(error),
        _ => SandboxError::image_unavailable(
            image,
            registry,
            format!("the pull failed: {}", bounded_text(&error.0.message)),
            format!(
                "check that the engine reaches {registry} (`{} pull {image}`), or build the \
                 image locally (docs/images.md)",
                engine.backend()
            ),
        )
        .with_source(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct ImageEngine {
        images: Mutex<Vec<String>>,
        pulls: AtomicU64,
        fail: Option<EngineErrorKind>,
    }

    #[async_trait::async_trait]
    impl ContainerEngine for ImageEngine {
        fn backend(&self) -> &'static str {
            "images-only"
        }
        fn tier(&self) -> sandbox_core::IsolationTier {
            sandbox_core::IsolationTier::Container
        }
        fn capabilities(&self) -> sandbox_core::Capability {
            sandbox_core::Capability::empty()
        }
        fn endpoint(&self) -> &str {
            "memory://images"
        }
        async fn create(&self, _: &crate::ContainerSpec) -> crate::EngineResult<String> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn start(&self, _: &str) -> crate::EngineResult<()> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn inspect(&self, _: &str) -> crate::EngineResult<crate::ContainerInfo> {
            Err(EngineError::new(
                EngineErrorKind::NotFound,
                "not in this test",
            ))
        }
        async fn remove(&self, _: &str) -> crate::EngineResult<bool> {
            Ok(false)
        }
        async fn list(
            &self,
            _: &std::collections::BTreeMap<String, String>,
        ) -> crate::EngineResult<Vec<crate::ContainerInfo>> {
            Ok(Vec::new())
        }
        async fn exec(
            &self,
            _: &str,
            _: crate::ExecRequest,
        ) -> crate::EngineResult<crate::ExecStream> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn exec_state(&self, _: &str) -> crate::EngineResult<crate::ExecState> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn put_archive(
            &self,
            _: &str,
            _: &str,
            _: crate::ArchiveBody,
        ) -> crate::EngineResult<()> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn get_archive(&self, _: &str, _: &str) -> crate::EngineResult<crate::ArchiveBody> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn stat_path(&self, _: &str, _: &str) -> crate::EngineResult<crate::PathStat> {
            Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
        }
        async fn ping(&self) -> crate::EngineResult<()> {
            Ok(())
        }
        async fn facts(&self) -> crate::engine::EngineFacts {
            crate::engine::EngineFacts::default()
        }
        async fn image_exists(&self, image: &str) -> crate::EngineResult<bool> {
            Ok(lock(&self.images).iter().any(|i| i == image))
        }
        async fn pull(&self, request: PullRequest<'_>) -> crate::EngineResult<()> {
            let PullRequest {
                image,
                auth,
                progress,
            } = request;
            assert!(
                auth.is_none(),
                "no credentials are configured for 127.0.0.9"
            );
            self.pulls.fetch_add(1, Ordering::SeqCst);
            progress(PullProgress::new(image, "Pulling fs layer"));
            tokio::time::sleep(Duration::from_millis(100)).await;
            progress(PullProgress::new(image, "Pull complete"));
            match self.fail {
                Some(kind) => Err(EngineError::new(kind, "registry said no")),
                None => {
                    lock(&self.images).push(image.to_string());
                    Ok(())
                }
            }
        }
    }

    fn counting_hook() -> (PullProgressHook, Arc<AtomicU64>) {
        let n = Arc::new(AtomicU64::new(0));
        let m = n.clone();
        (
            PullProgressHook::new(move |_| {
                m.fetch_add(1, Ordering::SeqCst);
            }),
            n,
        )
    }

    #[tokio::test]
    async fn concurrent_ensures_share_one_pull_and_every_waiter_sees_progress() {
        let engine = Arc::new(ImageEngine::default());
        let image = "127.0.0.9:5000/single/flight:1";
        let hooks: Vec<_> = (0..10).map(|_| counting_hook()).collect();
        let waits = hooks.iter().map(|(h, _)| {
            ensure(
                &engine,
                image,
                PullPolicy::Missing,
                Some(h),
                Duration::from_secs(5),
            )
        });
        for r in futures::future::join_all(waits).await {
            r.unwrap();
        }
        assert_eq!(
            engine.pulls.load(Ordering::SeqCst),
            1,
            "one pull for ten creates"
        );
        for (_, n) in &hooks {
            assert!(n.load(Ordering::SeqCst) >= 1, "every waiter saw progress");
        }
        // Present now: Missing does not pull again, nor even ask (until forgotten), and
        // Always pulls.
        let missing = || {
            ensure(
                &engine,
                image,
                PullPolicy::Missing,
                None,
                Duration::from_secs(5),
            )
        };
        assert_eq!(missing().await.unwrap(), Ensured::Remembered);
        forget(&*engine, image);
        assert_eq!(missing().await.unwrap(), Ensured::Checked);
        assert_eq!(missing().await.unwrap(), Ensured::Remembered);
        assert_eq!(engine.pulls.load(Ordering::SeqCst), 1);
        ensure(
            &engine,
            image,
            PullPolicy::Always,
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(engine.pulls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn never_refuses_a_missing_image_without_pulling() {
        let engine = Arc::new(ImageEngine::default());
        let e = ensure(
            &engine,
            "127.0.0.9:5000/never:1",
            PullPolicy::Never,
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), sandbox_core::ErrorCode::ImageUnavailable);
        assert!(e.to_string().contains("127.0.0.9:5000"), "{e}");
        assert_eq!(engine.pulls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn pull_failures_map_to_typed_errors_naming_image_and_registry() {
        for (kind, code) in [
            (EngineErrorKind::Unauthorized, sandbox_core::ErrorCode::Auth),
            (
                EngineErrorKind::NotFound,
                sandbox_core::ErrorCode::ImageUnavailable,
            ),
            (
                EngineErrorKind::Other,
                sandbox_core::ErrorCode::ImageUnavailable,
            ),
            (
                EngineErrorKind::Unavailable,
                sandbox_core::ErrorCode::EngineUnavailable,
            ),
        ] {
            let engine = Arc::new(ImageEngine {
                fail: Some(kind),
                ..ImageEngine::default()
            });
            let image = format!("127.0.0.9:5000/fails/{kind:?}:1").to_ascii_lowercase();
            let e = ensure(
                &engine,
                &image,
                PullPolicy::Missing,
                None,
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
            assert_eq!(e.code(), code, "{kind:?}: {}", e.render());
            if code != sandbox_core::ErrorCode::EngineUnavailable {
                assert!(e.to_string().contains("127.0.0.9:5000"), "{}", e.render());
            }
            if code == sandbox_core::ErrorCode::ImageUnavailable {
                assert!(e.to_string().contains(&image), "{}", e.render());
            }
        }
    }

    #[test]
    fn engine_wording_of_refusals_and_missing_images_is_read() {
        for m in [
            "Head \"http://127.0.0.1:5000/v2/x/manifests/1\": no basic auth credentials",
            "unauthorized: authentication required",
            "reading manifest 1 in 127.0.0.1:5000/x: authentication required",
        ] {
            assert_eq!(
                pull_failure_kind(m),
                Some(EngineErrorKind::Unauthorized),
                "{m}"
            );
        }
        for m in [
            "manifest for 127.0.0.1:5000/x:9 not found: manifest unknown",
            "reading manifest 9 in 127.0.0.1:5000/x: manifest unknown",
        ] {
            assert_eq!(pull_failure_kind(m), Some(EngineErrorKind::NotFound), "{m}");
        }
        assert_eq!(pull_failure_kind("no space left on device"), None);
    }
}
