//! Images pulled on create (issue 14), against a registry each trial starts on 127.0.0.1
//! serving the local busybox image plus a marker layer: nothing leaves the machine (the
//! adapter skips TLS verification for loopback registries only, as Docker does). They
//! skip (with a printed reason) when no engine answers, and fail loudly when `CI=true`.
//! Every image a trial pulls is removed by it.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::sync::OnceLock;

use sandbox_container::ContainerEngine;
use sandbox_container::testing::pull as trials;
use sandbox_podman::{PodmanConfig, PodmanEngine};

const CLI: &str = "podman";
const CHILD: &str = "credential_child";

async fn engine() -> Option<PodmanEngine> {
    let unavailable = |why: String| {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true")
            || std::env::var("SBX_CONTRACT_REQUIRED").is_ok_and(|v| v == "1");
        if ci {
            panic!("Podman engine required (CI=true) but unavailable: {why}");
        }
        eprintln!("SKIPPED: Podman engine unavailable: {why}");
        None
    };
    let engine = match PodmanEngine::new(&PodmanConfig::from_env()) {
        Ok(e) => e,
        Err(e) => return unavailable(e.render()),
    };
    match engine.ping().await {
        Ok(()) => Some(engine),
        Err(e) => unavailable(e.to_string()),
    }
}

/// The docker-archive of the local busybox image, exported once per test binary.
fn archive() -> &'static [u8] {
    static ARCHIVE: OnceLock<Vec<u8>> = OnceLock::new();
    ARCHIVE.get_or_init(|| {
        trials::source_archive(CLI).unwrap_or_else(|e| {
            panic!("{e}; build the test images with `sudo cargo xtask setup podman`")
        })
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_image_is_pulled_with_progress() {
    let Some(e) = engine().await else { return };
    let m = trials::missing_image_is_pulled_with_progress(e, CLI, archive()).await;
    println!("podman pull on create: {m:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_removed_since_a_create_is_ensured_again() {
    let Some(e) = engine().await else { return };
    trials::an_image_removed_since_a_create_is_ensured_again(e, CLI, archive()).await;
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
    println!("podman concurrent creates: {m:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_credentials_are_an_auth_error() {
    let Some(e) = engine().await else { return };
    trials::missing_credentials_are_an_auth_error(e, CLI, archive()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_from_registry_auth_file_are_used() {
    if engine().await.is_none() {
        return;
    }
    let file = trials::CredentialFile::RegistryAuthFile;
    trials::credentials_from_file_are_used(file, CLI, archive(), CHILD).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_credentials_are_an_auth_error() {
    if engine().await.is_none() {
        return;
    }
    let file = trials::CredentialFile::RegistryAuthFile;
    trials::wrong_credentials_are_an_auth_error(file, CLI, archive(), CHILD).await;
}

/// The child half of the credential trials (credential variables are process-wide, so
/// those trials run this in a child process with them set).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "run by the credential trials in a child process"]
async fn credential_child() {
    let e = engine().await.expect("engine");
    trials::child_create(e).await;
}
