//! The suite speaks the fake's vocabulary: every in-sandbox command, shell construct and
//! `run_code` snippet a trial uses on the fake is one `sandbox_fake::vocabulary` documents,
//! so the fake stays a faithful model of what the suite asks of a real engine — never an
//! emulator grown to satisfy it.
//!
//! The whole suite runs against one fake (as `cargo xtask contract fake` does), then the
//! fake's recorded calls are searched for `Call::OutsideVocabulary`: each names what was
//! refused, and the trial whose sandbox it ran in. The only refusals allowed are the ones
//! a trial provokes on purpose (a missing binary must exit 127 on every backend).
//! Trials that never run on the fake (kernel evidence, "not applicable: in-process
//! backend") may use `vocabulary::ENGINE_ONLY` commands; they create no fake sandbox, so
//! they cannot show up here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sandbox_contract::libtest_mimic::Arguments;
use sandbox_contract::{BackendFactory, CanarySpec, Faults, Injection, Probes};
use sandbox_core::{Backend, CreateOptions, async_trait};
use sandbox_fake::{Call, FakeBackend};

/// Refusals a trial provokes on purpose: (trial case, what the fake refused).
const DELIBERATE: &[(&str, &str)] = &[
    (
        "run::missing_binary_argv_is_127",
        "fake: command not in vocabulary: sbx-no-such-binary",
    ),
    (
        "run::missing_binary_shell_is_127",
        "fake: command not in vocabulary: sbx-no-such-binary",
    ),
];

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
    async fn fail_creates(&self) -> Injection {
        self.backend.faults().set_provider_failure(true);
        Injection::Injected
    }
    async fn stall_creates(&self) -> Injection {
        self.backend.faults().set_create_stall(true);
        Injection::Injected
    }
    async fn withhold_credential(&self) -> Injection {
        self.backend
            .faults()
            .set_missing_credential(Some("SBX_FAKE_TOKEN"));
        Injection::Injected
    }
}

struct FakeProbes {
    backend: FakeBackend,
}

#[async_trait]
impl Probes for FakeProbes {
    fn base_options(&self) -> CreateOptions {
        CreateOptions::new(sandbox_fake::DEFAULT_TEMPLATE)
    }
    fn template_without_python(&self) -> Option<String> {
        Some("sandbox-rs/busybox:latest".into())
    }
    fn extra_templates(&self) -> Vec<String> {
        vec!["sandbox-rs/busybox:latest".into()]
    }
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
    async fn stop_sandbox(&self, sandbox_id: &str) -> anyhow::Result<Injection> {
        let handle = self
            .backend
            .sandbox(sandbox_id)
            .ok_or_else(|| anyhow::anyhow!("the fake holds no sandbox {sandbox_id}"))?;
        handle.stop();
        Ok(Injection::Injected)
    }
    fn in_process_storage(&self) -> bool {
        true
    }
    fn in_process(&self) -> bool {
        true
    }
}

#[test]
fn trials_use_only_the_fakes_vocabulary() {
    let fake = FakeBackend::builder()
        .create_delay(Duration::from_millis(25))
        .create_timeout(Duration::from_secs(2))
        .build();
    let probes: Arc<dyn Probes> = Arc::new(FakeProbes {
        backend: fake.clone(),
    });
    let backend: Arc<dyn Backend> = Arc::new(fake.clone());
    let factory: BackendFactory = Box::new(move || Box::pin(async move { Ok(backend) }));
    let report = sandbox_contract::build(factory, probes).run(&Arguments {
        quiet: true,
        ..Arguments::default()
    });
    assert!(
        report.conclusion.num_passed > 100,
        "the suite did not run on the fake: {:?}",
        report.conclusion
    );

    let calls = fake.calls();
    // Which trial each sandbox belongs to (its `contract=<area>::<case>` metadata).
    let mut case_of: BTreeMap<String, String> = BTreeMap::new();
    for c in &calls {
        if let Call::Create {
            options,
            outcome: Ok(id),
            ..
        } = c
        {
            let case = options
                .metadata
                .get("contract")
                .cloned()
                .unwrap_or_default();
            case_of.insert(id.clone(), case);
        }
    }
    let mut outside = Vec::new();
    let mut deliberate_seen = 0;
    for c in &calls {
        if let Call::OutsideVocabulary { sandbox_id, what } = c {
            let case = case_of.get(sandbox_id).cloned().unwrap_or_default();
            let deliberate = DELIBERATE
                .iter()
                .any(|(t, w)| case.trim_end_matches("@busybox") == *t && what == w);
            if deliberate {
                deliberate_seen += 1;
            } else {
                outside.push(format!("{case}: {what}"));
            }
        }
    }
    // The recording itself works: the refusals provoked on purpose were seen.
    assert!(
        deliberate_seen >= DELIBERATE.len(),
        "the fake recorded {deliberate_seen} of the deliberate refusals: the check is blind"
    );
    outside.sort();
    outside.dedup();
    assert!(
        outside.is_empty(),
        "trials used commands outside sandbox_fake::vocabulary (extend the vocabulary and \
         VOCABULARY.md, or use a documented form):\n{}",
        outside.join("\n")
    );
}
