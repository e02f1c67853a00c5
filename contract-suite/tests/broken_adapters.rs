//! The suite catches broken adapters: the fake backend, wrapped with one deliberate flaw
//! each (`sandbox_contract::broken`), fails the trial named for that flaw — and the same
//! trial passes on the unbroken fake.

use std::sync::Arc;

use sandbox_contract::broken::{self, BrokenProbes, Flaw};
use sandbox_contract::libtest_mimic::Arguments;
use sandbox_contract::{BackendFactory, CanarySpec, Faults, Probes};
use sandbox_core::{Backend, async_trait};
use sandbox_fake::FakeBackend;

/// Probes for the fake, written against its public API.
struct FakeSuiteProbes {
    backend: FakeBackend,
}

struct FakeFaults {
    backend: FakeBackend,
}

#[async_trait]
impl Faults for FakeFaults {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }
    async fn hang_kills(&self) {
        self.backend.faults().set_kill_hang(true);
    }
    async fn fail_kills(&self) {
        self.backend.faults().set_kill_failure(true);
    }
    async fn heal(&self) {
        self.backend.faults().heal();
    }
}

#[async_trait]
impl Probes for FakeSuiteProbes {
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        Ok(Some(CanarySpec {
            bind: "127.0.0.1:0".parse()?,
            dial_host: "127.0.0.1".into(),
        }))
    }
    async fn engine_env(&self, sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        let handle = self
            .backend
            .sandbox(sandbox_id)
            .ok_or_else(|| anyhow::anyhow!("the fake holds no sandbox {sandbox_id}"))?;
        Ok(Some(handle.engine_env()))
    }
    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        Ok(Some(Arc::new(FakeFaults {
            backend: self.backend.with_own_faults(),
        })))
    }
    fn in_process_storage(&self) -> bool {
        true
    }
    fn symlinks(&self) -> bool {
        false
    }
}

/// Runs exactly one trial against the fake (optionally with a flaw); returns
/// (passed, failed).
fn run_one(flaw: Option<Flaw>, trial: &str) -> (u64, u64) {
    let fake = FakeBackend::new();
    let probes: Arc<dyn Probes> = Arc::new(FakeSuiteProbes {
        backend: fake.clone(),
    });
    let (probes, backend): (Arc<dyn Probes>, Arc<dyn Backend>) = match flaw {
        Some(f) => (
            Arc::new(BrokenProbes::new(probes, f)),
            broken::wrap(Arc::new(fake), f),
        ),
        None => (probes, Arc::new(fake)),
    };
    let factory: BackendFactory = Box::new(move || Box::pin(async move { Ok(backend) }));
    let suite = sandbox_contract::build(factory, probes);
    assert!(
        suite.trial_names().iter().any(|n| n == trial),
        "trial {trial} is not runnable against the fake: {:?}",
        suite
            .trial_names()
            .into_iter()
            .filter(|n| n.starts_with(trial))
            .collect::<Vec<_>>()
    );
    let args = Arguments {
        filter: Some(trial.to_string()),
        exact: true,
        quiet: true,
        test_threads: Some(1),
        ..Arguments::default()
    };
    let report = suite.run(&args);
    (report.conclusion.num_passed, report.conclusion.num_failed)
}

/// Which trial catches which flaw.
const CATCHES: &[(Flaw, &str)] = &[
    (
        Flaw::SwallowTimeouts,
        "contract::run::timeout_kills_only_that_process",
    ),
    (
        Flaw::PretendNetworkPolicy,
        "contract::policy::egress_deny_really_denies",
    ),
    (
        Flaw::PretendNetworkPolicy,
        "contract::policy::deny_leaves_only_loopback",
    ),
    (
        Flaw::LeakSecrets,
        "contract::lifecycle::debug_shows_id_never_secrets",
    ),
    (
        Flaw::LeakKillError,
        "contract::cancellation::failing_kill_is_connect_error_with_reap_hint",
    ),
    (
        Flaw::OrphanProcesses,
        "contract::cancellation::drop_mid_run_kills_process",
    ),
    (
        Flaw::OrphanProcesses,
        "contract::streaming::cleanup_after_drop",
    ),
    (
        Flaw::PretendIngress,
        "contract::policy::ingress_published_or_refused",
    ),
];

fn check(flaw: Flaw) {
    let mut covered = false;
    for (f, trial) in CATCHES.iter().filter(|(f, _)| *f == flaw) {
        covered = true;
        assert_eq!(
            run_one(None, trial),
            (1, 0),
            "{trial} must pass on the unbroken fake"
        );
        assert_eq!(
            run_one(Some(*f), trial),
            (0, 1),
            "{trial} must FAIL on the fake with {f:?}"
        );
    }
    assert!(covered, "no trial is named for {flaw:?}");
}

#[test]
fn timeout_swallower_is_caught() {
    check(Flaw::SwallowTimeouts);
}

#[test]
fn pretended_network_policy_is_caught() {
    check(Flaw::PretendNetworkPolicy);
}

#[test]
fn secret_leak_is_caught() {
    check(Flaw::LeakSecrets);
}

#[test]
fn raw_kill_error_is_caught() {
    check(Flaw::LeakKillError);
}

#[test]
fn orphan_leaver_is_caught() {
    check(Flaw::OrphanProcesses);
}

#[test]
fn pretended_ingress_is_caught() {
    check(Flaw::PretendIngress);
}

#[test]
fn every_flaw_has_a_catching_trial() {
    for f in Flaw::ALL {
        assert!(CATCHES.iter().any(|(c, _)| *c == f), "{f:?}");
    }
}
