//! Images pulled on create (issue 14), against a registry each trial starts on 127.0.0.1
//! serving the local busybox image plus a marker layer: nothing leaves the machine. They
//! skip (with a printed reason) when no engine answers, and fail loudly when `CI=true`.
//! Every image a trial pulls is removed by it.
#![allow(clippy::print_stdout)]

use std::sync::OnceLock;

use sandbox_container::testing::pull as trials;
use sandbox_container::testing::registry::TestRegistry;
use sandbox_core::ErrorCode;
use sandbox_docker::{DockerConfig, DockerEngine};

const CLI: &str = "docker";
const CHILD: &str = "credential_child";

async fn engine() -> Option<DockerEngine> {
    match DockerEngine::connect(DockerConfig::from_env()).await {
        Ok(e) => Some(e),
        Err(e) if e.code() == ErrorCode::EngineUnavailable => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("Docker engine required under CI=true: {}", e.render());
            }
            println!("skipping: Docker engine unavailable: {}", e.render());
            None
        }
        Err(e) => panic!("connect failed: {}", e.render()),
    }
}

/// The docker-archive of the local busybox image, exported once per test binary.
fn archive() -> &'static [u8] {
    static ARCHIVE: OnceLock<Vec<u8>> = OnceLock::new();
    ARCHIVE.get_or_init(|| {
        trials::source_archive(CLI)
            .unwrap_or_else(|e| panic!("{e}; build the test images with `sudo cargo xtask setup`"))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_image_is_pulled_with_progress() {
    let Some(e) = engine().await else { return };
    let m = trials::missing_image_is_pulled_with_progress(e, CLI, archive()).await;
    println!("docker pull on create: {m:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn never_policy_refuses_a_missing_image() {
    let Some(e) = engine().await else { return };
    trials::never_policy_refuses_a_missing_image(e, CLI, archive()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_image_names_image_and_registry() {
    let Some(e) = engine().await else { return };
    trials::unknown_image_names_image_and_registry(e, CLI, archive()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_concurrent_creates_pull_once() {
    let Some(e) = engine().await else { return };
    let m = trials::concurrent_creates_pull_once(e, CLI, archive(), 10).await;
    println!("docker concurrent creates: {m:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_credentials_are_an_auth_error() {
    let Some(e) = engine().await else { return };
    trials::missing_credentials_are_an_auth_error(e, CLI, archive()).await;
}

/// `DOCKER_CONFIG` pointing at a `config.json` with the registry under `auths`.
fn docker_config(
    dir: &trials::TempDir,
) -> impl FnOnce(&TestRegistry, &str) -> Vec<(String, String)> + '_ {
    move |reg, password| {
        trials::write_auth_file(
            &dir.0.join("config.json"),
            &reg.host(),
            "sbx-user",
            password,
        );
        vec![("DOCKER_CONFIG".into(), dir.0.display().to_string())]
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_from_docker_config_are_used() {
    if engine().await.is_none() {
        return;
    }
    let dir = trials::TempDir::new("docker-config");
    let (ok, out, reg, image) = trials::credential_trial(
        archive(),
        CHILD,
        "ok",
        "sbx-right-password",
        docker_config(&dir),
    )
    .await;
    let _cleanup = trials::Cleanup::new(CLI, vec![image]);
    assert!(ok, "child failed:\n{out}");
    assert!(reg.manifest_requests("sbx-pull/creds") >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_credentials_are_an_auth_error() {
    if engine().await.is_none() {
        return;
    }
    let dir = trials::TempDir::new("docker-config");
    let (ok, out, reg, image) = trials::credential_trial(
        archive(),
        CHILD,
        "auth",
        "sbx-wrong-password",
        docker_config(&dir),
    )
    .await;
    let _cleanup = trials::Cleanup::new(CLI, vec![image]);
    assert!(ok, "child failed:\n{out}");
    assert!(reg.unauthorized() >= 1);
}

/// The child half of the credential trials (credential variables are process-wide, so
/// those trials run this in a child process with them set).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "run by the credential trials in a child process"]
async fn credential_child() {
    let e = engine().await.expect("engine");
    trials::child_create(e).await;
}
