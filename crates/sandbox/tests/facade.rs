//! The facade's selection rules, checked with a recording backend (no engine).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sandbox::{
    Backend, BackendConfig, Capability, CreateOptions, ErrorCode, IsolationTier, Result,
    SandboxError, Target,
};

/// Counts `create` calls and records the options' template; never provisions anything.
#[derive(Debug, Default)]
struct Recording {
    creates: AtomicUsize,
    last_template: std::sync::Mutex<Option<String>>,
}

#[sandbox::async_trait]
impl Backend for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    fn capabilities(&self) -> Capability {
        Capability::RUN_COMMAND | Capability::NETWORK_POLICY
    }
    fn isolation(&self) -> IsolationTier {
        IsolationTier::Container
    }
    async fn create(&self, options: CreateOptions) -> Result<Box<dyn sandbox::Sandbox>> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        *self.last_template.lock().unwrap() = options.template.clone();
        Err(SandboxError::creation("recording", "recorded"))
    }
    async fn connect(&self, id: &str) -> Result<Box<dyn sandbox::Sandbox>> {
        Err(SandboxError::connect(id, "unknown"))
    }
}

#[tokio::test]
async fn require_isolation_is_checked_before_provisioning() {
    let rec = Arc::new(Recording::default());
    let target: Arc<dyn Backend> = rec.clone();
    let e = sandbox::create(
        target.clone(),
        CreateOptions::default().require_isolation(IsolationTier::Gvisor),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
    assert_eq!(rec.creates.load(Ordering::SeqCst), 0, "nothing provisioned");

    // A satisfiable requirement reaches the backend.
    let e = sandbox::create(
        target,
        CreateOptions::default().require_isolation(IsolationTier::Container),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Creation);
    assert_eq!(rec.creates.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn policy_the_backend_cannot_apply_is_refused_before_provisioning() {
    let rec = Arc::new(Recording::default());
    let e = sandbox::create(
        rec.clone() as Arc<dyn Backend>,
        CreateOptions::default().network(sandbox::NetworkPolicy::allow_list(["pypi.org"])),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::CapabilityNotSupported);
    assert_eq!(rec.creates.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn registered_scheme_is_reachable_by_dsn_and_dsn_template_applies() {
    static REC: std::sync::OnceLock<Arc<Recording>> = std::sync::OnceLock::new();
    let rec = REC.get_or_init(|| Arc::new(Recording::default())).clone();
    sandbox::register("recording", || async {
        Ok(REC.get().unwrap().clone() as Arc<dyn Backend>)
    })
    .unwrap();
    assert!(sandbox::schemes().contains(&"recording".to_string()));
    let e = sandbox::create(
        "recording://my/image:1?timeout=30",
        CreateOptions::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Creation);
    assert_eq!(
        rec.last_template.lock().unwrap().as_deref(),
        Some("my/image:1")
    );
    // Cached: the same object both times.
    let a = sandbox::backend("recording://").await.unwrap();
    let b = sandbox::backend("recording://other").await.unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    let e = sandbox::connect("recording://", "nope").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Connect);
}

#[tokio::test]
async fn unknown_scheme_is_backend_not_found_listing_compiled_in_schemes() {
    let e = sandbox::create("nosuch://x", CreateOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::BackendNotFound);
    for s in sandbox::schemes() {
        assert!(e.to_string().contains(&s), "{e}");
    }
}

#[tokio::test]
async fn bad_dsn_and_bad_options_are_configuration_errors() {
    for dsn in ["docker", "docker://x?token=abc", "docker://x?foo=1"] {
        let e = sandbox::create(dsn, CreateOptions::default())
            .await
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration, "{dsn}");
    }
    let e = sandbox::create(
        "nosuch://",
        CreateOptions::default().timeout(std::time::Duration::ZERO),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration, "options checked first");
}

#[test]
fn none_and_empty_select_the_default_engine() {
    assert!(matches!(Target::from(None), Target::Default));
    assert!(matches!(Target::from(Some("")), Target::Default));
    assert!(matches!(Target::from(""), Target::Default));
    assert!(matches!(Target::from(String::new()), Target::Default));
    assert!(matches!(Target::from("fake://"), Target::Dsn(_)));
    // `create(None, …)` type-checks without annotations.
    drop(sandbox::create(None, CreateOptions::default()));
}

#[test]
fn typed_config_debug_shows_only_the_scheme() {
    let c = BackendConfig::Custom(Arc::new(Recording::default()));
    assert_eq!(format!("{c:?}"), "BackendConfig(\"recording\")");
}

#[tokio::test]
async fn blocking_api_refuses_to_run_inside_a_runtime() {
    let e = sandbox::blocking::create(
        Arc::new(Recording::default()) as Arc<dyn Backend>,
        CreateOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
}

#[test]
fn blocking_api_reaches_the_same_backend() {
    let rec = Arc::new(Recording::default());
    let e = sandbox::blocking::create(rec.clone() as Arc<dyn Backend>, CreateOptions::default())
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Creation);
    assert_eq!(rec.creates.load(Ordering::SeqCst), 1);
    let b = sandbox::blocking::backend(rec as Arc<dyn Backend>).unwrap();
    assert_eq!(b.name(), "recording");
    assert!(b.diagnose().unwrap().reachable);
    assert_eq!(
        b.list_managed(&Default::default()).unwrap_err().code(),
        ErrorCode::Configuration
    );
}
