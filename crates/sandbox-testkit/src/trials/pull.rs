//! The pull trials both adapters run against a [`TestRegistry`]: a missing image is
//! pulled with progress, `never` refuses, an unknown image and a refused credential give
//! their typed errors, ten concurrent creates pull once, and credentials are read from
//! the files the engines' CLIs use. Each trial removes the images it pulled.
//!
//! The engine CLI (`docker` / `podman`) is used only around the trials: to export the
//! local busybox image the registry serves, and to remove pulled images.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use sandbox_container::image::{PullProgress, PullProgressHook};
use sandbox_container::{ContainerBackend, ContainerConfig, ContainerEngine, ContainerSandbox};
use sandbox_core::{CreateOptions, ErrorCode, PullPolicy, Sandbox, SandboxExt};

use crate::engine_cli::{ImageCleanup, image_present, remove_image};
use crate::registry::{SOURCE_IMAGE, TestRegistry};

/// Collected progress events.
#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Vec<PullProgress>>>);

impl Events {
    /// A hook appending to this collection.
    pub fn hook(&self) -> PullProgressHook {
        let e = self.0.clone();
        PullProgressHook::new(move |p| e.lock().unwrap_or_else(|p| p.into_inner()).push(p.clone()))
    }

    /// How many were reported.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether none were reported.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A backend on `engine` that reports pull progress into `events`.
pub async fn backend<E: ContainerEngine>(engine: E, events: &Events) -> ContainerBackend<E> {
    ContainerBackend::new(
        engine,
        ContainerConfig::new(SOURCE_IMAGE)
            .startup_sweep(false)
            .on_pull_progress(events.hook()),
    )
    .await
}

fn options(image: &str, trial: &str) -> CreateOptions {
    CreateOptions::new(image)
        .timeout(Duration::from_secs(120))
        .metadata("test", format!("pull-{trial}"))
}

/// Proves the sandbox runs the registry's image (its marker file), then kills it.
async fn check_and_kill<E: ContainerEngine>(sb: ContainerSandbox<E>, reg: &TestRegistry) {
    let r = sb.exec("cat /etc/sbx-test-registry").await;
    let _ = sb.kill().await;
    let r = r.unwrap_or_else(|e| panic!("run in the pulled image: {}", e.render()));
    assert_eq!(
        r.stdout_text(),
        reg.marker(),
        "the sandbox runs the pulled image"
    );
}

/// What [`missing_image_is_pulled_with_progress`] measured.
#[derive(Debug, Clone, Copy)]
pub struct PullMeasure {
    /// Progress events the hook received.
    pub events: usize,
    /// Manifest requests the registry answered.
    pub manifest_requests: u64,
    /// Time of the create that pulled.
    pub create: Duration,
}

/// A missing image is pulled on create (PullPolicy::Missing, the default), with progress
/// events, and the sandbox runs it.
pub async fn missing_image_is_pulled_with_progress<E: ContainerEngine>(
    engine: E,
    cli: &'static str,
    archive: &[u8],
) -> PullMeasure {
    let reg = TestRegistry::start(archive, &[("sbx-pull/busybox", "1")], None)
        .await
        .expect("registry");
    let image = format!("{}/sbx-pull/busybox:1", reg.host());
    let _cleanup = ImageCleanup::new(cli, vec![image.clone()]);
    assert!(!image_present(cli, &image));
    let events = Events::default();
    let b = backend(engine, &events).await;
    let t = Instant::now();
    let sb = b
        .create_container(options(&image, "missing"))
        .await
        .unwrap_or_else(|e| panic!("create pulling {image}: {}", e.render()));
    let create = t.elapsed();
    assert!(image_present(cli, &image), "the image is on the engine");
    check_and_kill(sb, &reg).await;
    assert!(!events.is_empty(), "progress was reported");
    assert!(reg.manifest_requests("sbx-pull/busybox") >= 1);
    PullMeasure {
        events: events.len(),
        manifest_requests: reg.manifest_requests("sbx-pull/busybox"),
        create,
    }
}

/// `PullPolicy::Never` with a missing image: `ImageUnavailable`, and the registry never
/// hears of it.
pub async fn never_policy_refuses_a_missing_image<E: ContainerEngine>(
    engine: E,
    cli: &'static str,
    archive: &[u8],
) {
    let reg = TestRegistry::start(archive, &[("sbx-pull/never", "1")], None)
        .await
        .expect("registry");
    let image = format!("{}/sbx-pull/never:1", reg.host());
    let _cleanup = ImageCleanup::new(cli, vec![image.clone()]);
    let b = backend(engine, &Events::default()).await;
    let e = b
        .create_container(options(&image, "never").pull(PullPolicy::Never))
        .await
        .expect_err("a missing image with PullPolicy::Never is refused");
    assert_eq!(e.code(), ErrorCode::ImageUnavailable, "{}", e.render());
    assert!(e.to_string().contains(&image), "{}", e.render());
    assert_eq!(reg.requests(), 0, "nothing was pulled");
    assert!(!image_present(cli, &image));
}

/// An image removed from the engine after a create used it: the backend remembers that
/// the engine had it (no existence check on every create), so the next create finds it
/// missing itself, and must still end as the pull policy says: `Missing` pulls it again
/// and runs it, `Never` is `ImageUnavailable` (never a generic creation error).
pub async fn an_image_removed_since_a_create_is_ensured_again<E: ContainerEngine>(
    engine: E,
    cli: &'static str,
    archive: &[u8],
) {
    let reg = TestRegistry::start(archive, &[("sbx-pull/removed", "1")], None)
        .await
        .expect("registry");
    let image = format!("{}/sbx-pull/removed:1", reg.host());
    let _cleanup = ImageCleanup::new(cli, vec![image.clone()]);
    let b = backend(engine, &Events::default()).await;
    let create = |policy: PullPolicy| b.create_container(options(&image, "removed").pull(policy));
    for round in ["first pull", "pulled again"] {
        let sb = create(PullPolicy::Missing)
            .await
            .unwrap_or_else(|e| panic!("create ({round}) of {image}: {}", e.render()));
        check_and_kill(sb, &reg).await;
        remove_image(cli, &image);
        assert!(!image_present(cli, &image), "removed ({round})");
    }
    assert!(
        reg.manifest_requests("sbx-pull/removed") >= 2,
        "the removed image was pulled again"
    );
    let sb = create(PullPolicy::Missing)
        .await
        .unwrap_or_else(|e| panic!("create after a removal: {}", e.render()));
    check_and_kill(sb, &reg).await;
    remove_image(cli, &image);
    let e = create(PullPolicy::Never)
        .await
        .expect_err("Never, with the remembered image removed");
    assert_eq!(e.code(), ErrorCode::ImageUnavailable, "{}", e.render());
}

/// An image the registry does not have: `ImageUnavailable` naming the image and the
/// registry, with a fix.
pub async fn unknown_image_names_image_and_registry<E: ContainerEngine>(
    engine: E,
    cli: &'static str,
    archive: &[u8],
) {
    let reg = TestRegistry::start(archive, &[("sbx-pull/present", "1")], None)
        .await
        .expect("registry");
    let image = format!("{}/sbx-pull/absent:9", reg.host());
    let _cleanup = ImageCleanup::new(cli, vec![image.clone()]);
    let b = backend(engine, &Events::default()).await;
    let e = b
        .create_container(options(&image, "unknown"))
        .await
        .expect_err("an unknown image fails the create");
    assert_eq!(e.code(), ErrorCode::ImageUnavailable, "{}", e.render());
    let text = e.to_string();
    assert!(
        text.contains(&image) && text.contains(&reg.host()),
        "{text}"
    );
    assert!(!e.hint().is_empty());
    assert!(
        reg.manifest_requests("sbx-pull/absent") >= 1,
        "the registry was asked"
    );
}

/// What [`concurrent_creates_pull_once`] measured.
#[derive(Debug, Clone, Copy)]
pub struct ConcurrentMeasure {
    /// Manifest requests of one lone pull (the baseline).
    pub alone: u64,
    /// Manifest requests of the concurrent creates' pull.
    pub concurrent: u64,
    /// Creates that ran concurrently.
    pub creates: usize,
}

/// `n` concurrent creates of one missing image pull it once: the registry sees no more
/// manifest requests than for one lone pull of the same kind of image.
pub async fn concurrent_creates_pull_once<E: ContainerEngine>(
    engine: E,
    cli: &'static str,
    archive: &[u8],
    n: usize,
) -> ConcurrentMeasure {
    // Two registries, so the two images differ (each has its own marker layer).
    let lone = TestRegistry::start(archive, &[("sbx-pull/lone", "1")], None)
        .await
        .expect("registry");
    let many = TestRegistry::start(archive, &[("sbx-pull/many", "1")], None)
        .await
        .expect("registry");
    let lone_image = format!("{}/sbx-pull/lone:1", lone.host());
    let many_image = format!("{}/sbx-pull/many:1", many.host());
    let _cleanup = ImageCleanup::new(cli, vec![lone_image.clone(), many_image.clone()]);
    let b = backend(engine, &Events::default()).await;
    let sb = b
        .create_container(options(&lone_image, "lone"))
        .await
        .unwrap_or_else(|e| panic!("lone create: {}", e.render()));
    check_and_kill(sb, &lone).await;
    let alone = lone.manifest_requests("sbx-pull/lone");
    let creates = (0..n).map(|_| b.create_container(options(&many_image, "many")));
    let results = futures::future::join_all(creates).await;
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(sb) => check_and_kill(sb, &many).await,
            Err(e) => failures.push(e.render()),
        }
    }
    assert!(failures.is_empty(), "every create succeeded: {failures:?}");
    let concurrent = many.manifest_requests("sbx-pull/many");
    assert!(
        concurrent >= 1 && concurrent <= alone,
        "{n} concurrent creates made {concurrent} manifest requests; one lone pull makes {alone}"
    );
    ConcurrentMeasure {
        alone,
        concurrent,
        creates: n,
    }
}

/// A registry that demands credentials, with none configured for it: `Auth`, naming the
/// registry and the image, with the login command as fix.
pub async fn missing_credentials_are_an_auth_error<E: ContainerEngine>(
    engine: E,
    cli: &'static str,
    archive: &[u8],
) {
    let reg = TestRegistry::start(
        archive,
        &[("sbx-pull/private", "1")],
        Some(("sbx-user", "sbx-test-secret")),
    )
    .await
    .expect("registry");
    let image = format!("{}/sbx-pull/private:1", reg.host());
    let _cleanup = ImageCleanup::new(cli, vec![image.clone()]);
    let b = backend(engine, &Events::default()).await;
    let e = b
        .create_container(options(&image, "nocreds"))
        .await
        .expect_err("a registry demanding credentials refuses the pull");
    assert_eq!(e.code(), ErrorCode::Auth, "{}", e.render());
    assert!(e.to_string().contains(&reg.host()), "{}", e.render());
    assert!(reg.unauthorized() >= 1);
    assert!(!image_present(cli, &image));
}

/// The environment variables a credential trial's child gets.
pub const CHILD_IMAGE_ENV: &str = "SBX_PULL_CHILD_IMAGE";
/// `ok` or `auth`: what the child expects.
pub const CHILD_EXPECT_ENV: &str = "SBX_PULL_CHILD_EXPECT";
/// The marker the child checks inside the sandbox.
pub const CHILD_MARKER_ENV: &str = "SBX_PULL_CHILD_MARKER";
/// The password the child's credential file holds: it must appear in no error.
pub const CHILD_SECRET_ENV: &str = "SBX_PULL_CHILD_SECRET";

/// Writes a credential file (Docker's `config.json` or a containers `auth.json`: the same
/// `auths` shape) holding `user:password` for `registry`.
pub fn write_auth_file(file: &std::path::Path, registry: &str, user: &str, password: &str) {
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}").as_bytes());
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).expect("credential dir");
    }
    std::fs::write(
        file,
        serde_json::json!({ "auths": { registry: { "auth": auth } } }).to_string(),
    )
    .expect("credential file");
}

/// A fresh directory under the temp dir, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    /// Creates `sbx-pull-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> TempDir {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "sbx-pull-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where a credential trial's child finds its credentials: the file an engine's CLI reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialFile {
    /// `DOCKER_CONFIG` pointing at a directory whose `config.json` has the registry under
    /// `auths`.
    DockerConfig,
    /// `REGISTRY_AUTH_FILE` pointing at an `auth.json` with the registry under `auths`.
    RegistryAuthFile,
}

impl CredentialFile {
    /// The tag of the trial's [`TempDir`].
    fn tag(self) -> &'static str {
        match self {
            CredentialFile::DockerConfig => "docker-config",
            CredentialFile::RegistryAuthFile => "auth-file",
        }
    }

    /// Writes `password` for `reg` into `dir`; the child's environment variables.
    fn write(self, dir: &TempDir, reg: &TestRegistry, password: &str) -> Vec<(String, String)> {
        match self {
            CredentialFile::DockerConfig => {
                write_auth_file(
                    &dir.0.join("config.json"),
                    &reg.host(),
                    "sbx-user",
                    password,
                );
                vec![("DOCKER_CONFIG".into(), dir.0.display().to_string())]
            }
            CredentialFile::RegistryAuthFile => {
                let file = dir.0.join("auth.json");
                write_auth_file(&file, &reg.host(), "sbx-user", password);
                vec![("REGISTRY_AUTH_FILE".into(), file.display().to_string())]
            }
        }
    }
}

/// The right password in `file`: the child's create pulls from the registry and runs the
/// image. `child` is the ignored test of the calling binary that calls [`child_create`].
pub async fn credentials_from_file_are_used(
    file: CredentialFile,
    cli: &'static str,
    archive: &[u8],
    child: &str,
) {
    let dir = TempDir::new(file.tag());
    let (ok, out, reg, image) = credential_trial(archive, child, "ok", "sbx-right-password", {
        |reg: &TestRegistry, password: &str| file.write(&dir, reg, password)
    })
    .await;
    let _cleanup = ImageCleanup::new(cli, vec![image]);
    assert!(ok, "child failed:\n{out}");
    assert!(reg.manifest_requests("sbx-pull/creds") >= 1);
}

/// A wrong password in `file`: the child's create is an `Auth` error that does not show
/// the password. `child` as for [`credentials_from_file_are_used`].
pub async fn wrong_credentials_are_an_auth_error(
    file: CredentialFile,
    cli: &'static str,
    archive: &[u8],
    child: &str,
) {
    let dir = TempDir::new(file.tag());
    let (ok, out, reg, image) = credential_trial(archive, child, "auth", "sbx-wrong-password", {
        |reg: &TestRegistry, password: &str| file.write(&dir, reg, password)
    })
    .await;
    let _cleanup = ImageCleanup::new(cli, vec![image]);
    assert!(ok, "child failed:\n{out}");
    assert!(reg.unauthorized() >= 1);
}

/// A registry demanding `user`/`password`, and the child's environment for a create of
/// its image expecting `expect` (`ok`/`auth`), with the credential file variables `creds`.
pub async fn credential_trial(
    archive: &[u8],
    child: &str,
    expect: &str,
    written_password: &str,
    creds: impl FnOnce(&TestRegistry, &str) -> Vec<(String, String)>,
) -> (bool, String, TestRegistry, String) {
    let reg = TestRegistry::start(
        archive,
        &[("sbx-pull/creds", "1")],
        Some(("sbx-user", "sbx-right-password")),
    )
    .await
    .expect("registry");
    let image = format!("{}/sbx-pull/creds:1", reg.host());
    let mut env = creds(&reg, written_password);
    env.push((CHILD_IMAGE_ENV.into(), image.clone()));
    env.push((CHILD_EXPECT_ENV.into(), expect.into()));
    env.push((CHILD_MARKER_ENV.into(), reg.marker().into()));
    env.push((CHILD_SECRET_ENV.into(), written_password.into()));
    let (ok, out) = run_child(child, env).await;
    (ok, out, reg, image)
}

/// Runs the ignored test `child` of the current test binary with `env` (credential
/// variables are process-wide, so a trial that sets them runs in a child process), and
/// returns whether it passed, with its output.
pub async fn run_child(child: &str, env: Vec<(String, String)>) -> (bool, String) {
    let exe = std::env::current_exe().expect("test binary");
    let child = child.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(exe)
            .args([child.as_str(), "--exact", "--ignored", "--nocapture"])
            .envs(env)
            .stdin(Stdio::null())
            .output()
    })
    .await
    .expect("join")
    .expect("run the child test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && text.contains("1 passed"), text)
}

/// The child half of the credential trials: creates from `$SBX_PULL_CHILD_IMAGE` and
/// expects `$SBX_PULL_CHILD_EXPECT` (`ok`: the sandbox runs the image whose marker is
/// `$SBX_PULL_CHILD_MARKER`; `auth`: an `Auth` error that does not contain the password
/// `$SBX_PULL_CHILD_SECRET`).
pub async fn child_create<E: ContainerEngine>(engine: E) {
    let secret = std::env::var(CHILD_SECRET_ENV).expect("run by a credential trial");
    let secret = secret.as_str();
    let image = std::env::var(CHILD_IMAGE_ENV).expect("run by a credential trial");
    let expect = std::env::var(CHILD_EXPECT_ENV).expect("run by a credential trial");
    let b = backend(engine, &Events::default()).await;
    let r = b.create_container(options(&image, "creds")).await;
    match (expect.as_str(), r) {
        ("ok", Ok(sb)) => {
            let marker = std::env::var(CHILD_MARKER_ENV).expect("marker");
            let out = sb.exec("cat /etc/sbx-test-registry").await;
            let _ = sb.kill().await;
            let out = out.unwrap_or_else(|e| panic!("run: {}", e.render()));
            assert_eq!(out.stdout_text(), marker);
        }
        ("auth", Err(e)) => {
            assert_eq!(e.code(), ErrorCode::Auth, "{}", e.render());
            let shown = format!("{} {} {:?}", e.render(), e.hint(), e);
            assert!(!shown.contains(secret), "the secret leaked: {shown}");
        }
        (want, Ok(sb)) => {
            let _ = sb.kill().await;
            panic!("expected {want}, the create succeeded");
        }
        (want, Err(e)) => panic!("expected {want}, got {}", e.render()),
    }
}

/// The name of the ignored test [`pull_trials!`](crate::pull_trials) defines for the
/// child half of the credential trials.
pub const CHILD_TEST: &str = "credential_child";

/// [`source_archive`](crate::registry::source_archive) of `cli`, or a panic naming the
/// command that builds the image.
pub fn archive_or_panic(cli: &str) -> Vec<u8> {
    crate::registry::source_archive(cli).unwrap_or_else(|e| {
        let setup = if cli == "podman" {
            "sudo cargo xtask setup podman"
        } else {
            "sudo cargo xtask setup"
        };
        panic!("{e}; build the test images with `{setup}`")
    })
}

/// Prints what a trial measured (the engine runs' logs keep it).
#[allow(clippy::print_stdout)]
pub fn report(what: &str, measured: &impl std::fmt::Debug) {
    println!("{what}: {measured:?}");
}

/// Lists the pull trials as `#[tokio::test]`s of the calling test binary.
///
/// `engine:` an expression that, inside an async test, yields `Option<E>` for a
/// [`ContainerEngine`] `E` (`None`: skip); `cli:` the engine's CLI (`"docker"`);
/// `credentials:` the name of the credential-file test and the [`CredentialFile`] variant
/// it writes. Defines the ignored `credential_child` test ([`CHILD_TEST`]) the credential
/// trials run in a child process.
#[macro_export]
macro_rules! pull_trials {
    (
        engine: $engine:expr,
        cli: $cli:literal,
        credentials: $credentials_test:ident from $file:ident $(,)?
    ) => {
        /// The docker-archive of the local busybox image, exported once per test binary.
        fn pull_source_archive() -> &'static [u8] {
            static ARCHIVE: ::std::sync::OnceLock<Vec<u8>> = ::std::sync::OnceLock::new();
            ARCHIVE.get_or_init(|| $crate::trials::pull::archive_or_panic($cli))
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn missing_image_is_pulled_with_progress() {
            let Some(e) = $engine else { return };
            let m = $crate::trials::pull::missing_image_is_pulled_with_progress(
                e,
                $cli,
                pull_source_archive(),
            )
            .await;
            $crate::trials::pull::report(concat!($cli, " pull on create"), &m);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn an_image_removed_since_a_create_is_ensured_again() {
            let Some(e) = $engine else { return };
            $crate::trials::pull::an_image_removed_since_a_create_is_ensured_again(
                e,
                $cli,
                pull_source_archive(),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn never_policy_refuses_a_missing_image() {
            let Some(e) = $engine else { return };
            $crate::trials::pull::never_policy_refuses_a_missing_image(
                e,
                $cli,
                pull_source_archive(),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn unknown_image_names_image_and_registry() {
            let Some(e) = $engine else { return };
            $crate::trials::pull::unknown_image_names_image_and_registry(
                e,
                $cli,
                pull_source_archive(),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn ten_concurrent_creates_pull_once() {
            let Some(e) = $engine else { return };
            let m = $crate::trials::pull::concurrent_creates_pull_once(
                e,
                $cli,
                pull_source_archive(),
                10,
            )
            .await;
            $crate::trials::pull::report(concat!($cli, " concurrent creates"), &m);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn missing_credentials_are_an_auth_error() {
            let Some(e) = $engine else { return };
            $crate::trials::pull::missing_credentials_are_an_auth_error(
                e,
                $cli,
                pull_source_archive(),
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn $credentials_test() {
            if $engine.is_none() {
                return;
            }
            $crate::trials::pull::credentials_from_file_are_used(
                $crate::trials::pull::CredentialFile::$file,
                $cli,
                pull_source_archive(),
                $crate::trials::pull::CHILD_TEST,
            )
            .await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn wrong_credentials_are_an_auth_error() {
            if $engine.is_none() {
                return;
            }
            $crate::trials::pull::wrong_credentials_are_an_auth_error(
                $crate::trials::pull::CredentialFile::$file,
                $cli,
                pull_source_archive(),
                $crate::trials::pull::CHILD_TEST,
            )
            .await;
        }

        /// The child half of the credential trials (credential variables are
        /// process-wide, so those trials run this in a child process with them set).
        #[tokio::test(flavor = "multi_thread")]
        #[ignore = "run by the credential trials in a child process"]
        async fn credential_child() {
            let e = $engine.expect("engine");
            $crate::trials::pull::child_create(e).await;
        }
    };
}
