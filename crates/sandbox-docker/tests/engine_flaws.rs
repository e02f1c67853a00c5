//! The flaws only a real engine can show (`sandbox_contract::broken::Flaw::ON_AN_ENGINE`):
//! this Docker backend wrapped with each, and the trial named for it must fail. The same
//! trials pass unbroken in this crate's contract run (`tests/contract.rs`) and credentials
//! run (`tests/credentials.rs`); here they prove they can fail. A credential bound wider
//! than asked, a git gate that lets a push land outside its prefix, an ssh-agent socket
//! that offers every key: each is an adapter that accepted a security setting and did
//! something else with it.

use std::sync::Arc;

use sandbox_contract::broken::{BrokenBackend, Flaw};
use sandbox_contract::libtest_mimic::Arguments;
use sandbox_contract::{BackendFactory, Probes};
use sandbox_core::{Backend, CreateOptions, async_trait};
use sandbox_docker::{DockerBackend, DockerConfig};
use sandbox_testkit::skip::unless_connected;
use sandbox_testkit::tagged::managed_ids;

const PY: &str = "sandbox-rs/python:3.11";

async fn backend() -> Option<DockerBackend> {
    let config = DockerConfig::from_env().startup_sweep(false);
    unless_connected("Docker", DockerBackend::connect(config).await)
}

/// What the git gate and ssh-agent trials ask of the probes: a template with Python.
struct Python;

#[async_trait]
impl Probes for Python {
    fn base_options(&self) -> CreateOptions {
        CreateOptions::new(PY)
    }
}

/// Runs the contract trial `trial` against `backend` with `flaw`; returns (passed,
/// failed, ignored).
fn run_flawed(backend: DockerBackend, flaw: Flaw, trial: &str) -> (u64, u64, u64) {
    let flawed: Arc<dyn Backend> = Arc::new(BrokenBackend::new(Arc::new(backend), flaw));
    let factory: BackendFactory = Box::new(move || Box::pin(async move { Ok(flawed) }));
    let suite = sandbox_contract::build_without_layer(factory, Arc::new(Python));
    let args = Arguments {
        filter: Some(trial.to_string()),
        exact: true,
        quiet: true,
        test_threads: Some(1),
        // A flawed run is meant to fail: its report would read as a failure in the log.
        logfile: Some("/dev/null".to_string()),
        ..Arguments::default()
    };
    let c = suite.run(&args).conclusion;
    (c.num_passed, c.num_failed, c.num_ignored)
}

/// The contract trial named for `flaw` fails on this engine with it.
fn caught_on_docker(flaw: Flaw) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(b) = rt.block_on(backend()) else {
        return;
    };
    drop(rt);
    for trial in flaw.caught_by() {
        assert_eq!(
            run_flawed(b.clone(), flaw, trial),
            (0, 1, 0),
            "{trial} must FAIL on Docker with {flaw:?}"
        );
    }
}

#[test]
fn a_git_gate_that_lets_a_push_land_outside_the_prefix_is_caught() {
    caught_on_docker(Flaw::GitPushAnywhere);
}

#[test]
fn an_ssh_agent_socket_that_offers_every_key_is_caught() {
    caught_on_docker(Flaw::SshAgentEveryKey);
}

/// The credentials engine trial fails (panics) with a broker that binds the credential to
/// every allowed host: the other host is either handed the secret or taken over by the
/// proxy, and never sees the placeholder. Nothing of the trial's is left behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_injects_for_every_host_is_caught() {
    let Some(b) = backend().await else { return };
    let flaw = Flaw::CredentialForEveryHost;
    assert_eq!(
        flaw.caught_by(),
        ["engine::credentials::the_bound_host_alone_receives_the_secret"]
    );
    let flawed = Arc::new(BrokenBackend::new(Arc::new(b.clone()), flaw));
    // Its own task, so that the trial's panic is caught as the task's outcome.
    let outcome = tokio::spawn(async move {
        sandbox_testkit::trials::credentials::the_bound_host_alone_receives_the_secret(&flawed)
            .await
    })
    .await;
    let payload = match outcome {
        Ok(()) => panic!("the credentials trial passed with {flaw:?}"),
        Err(e) => e.into_panic(),
    };
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        message.contains("other host"),
        "the trial failed, but not where a wider binding shows: {message}"
    );
    assert!(managed_ids(&b, "credentials-e2e").await.is_empty());
}
