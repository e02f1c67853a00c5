//! The contract suite against fakes that declare fewer capabilities, so the "refused"
//! branch of every capability trial (`*_honours_declaration`, `*_or_refused`) runs: the
//! full fake in `contract.rs` takes their "declared, and it really works" branch. Positive
//! trials of the undeclared capabilities are (correctly) ignored here with the reason.
//!
//! A normal test (unlike `contract.rs`, which `cargo xtask contract fake` runs), so every
//! `cargo test -p sandbox-rs-fake` proves the refusals.

use std::sync::Arc;

use sandbox_contract::libtest_mimic::Arguments;
use sandbox_contract::{CanarySpec, Probes};
use sandbox_core::{Backend, Capability, async_trait};
use sandbox_fake::FakeBackend;

struct ReducedProbes;

#[async_trait]
impl Probes for ReducedProbes {
    async fn canary(&self) -> sandbox_contract::anyhow::Result<Option<CanarySpec>> {
        Ok(Some(CanarySpec {
            bind: "127.0.0.1:0".parse()?,
            dial_host: "127.0.0.1".into(),
        }))
    }
    fn template_without_python(&self) -> Option<String> {
        Some("sandbox-rs/busybox:latest".into())
    }
    fn in_process_storage(&self) -> bool {
        true
    }
    fn in_process(&self) -> bool {
        true
    }
}

/// The capability questions: each is one trial that runs whatever the declaration.
const CAPABILITY_TRIALS: &[&str] = &[
    "contract::files::entry_point_honours_declaration",
    "contract::files::transfer_honours_declaration",
    "contract::streaming::entry_point_honours_declaration",
    "contract::run_code::entry_point_honours_declaration",
    "contract::run_code::context_honours_declaration",
    "contract::policy::allowlist_enforced_or_refused",
    "contract::policy::ingress_published_or_refused",
    "contract::policy::gpu_refused_without_capability",
    "contract::capabilities::every_undeclared_flag_refuses",
    "contract::capabilities::declared_flags_have_trials",
];

fn suite_passes(label: &str, caps: Capability) {
    let backend = FakeBackend::builder().capabilities(caps).build();
    let suite = sandbox_contract::build(
        Box::new(move || Box::pin(async move { Ok(Arc::new(backend) as Arc<dyn Backend>) })),
        Arc::new(ReducedProbes),
    );
    let names = suite.trial_names();
    for t in CAPABILITY_TRIALS {
        assert!(
            names.iter().any(|n| n == t),
            "{label}: {t} does not run: {:?}",
            names
                .iter()
                .filter(|n| n.starts_with(t))
                .collect::<Vec<_>>()
        );
    }
    let report = suite.run(&Arguments {
        quiet: true,
        ..Arguments::default()
    });
    // Positive trials of the capabilities these fakes lack are ignored with the reason,
    // as they must be; what is judged here is that nothing failed and nothing leaked.
    assert!(
        !report.conclusion.has_failed() && report.leaked.is_empty(),
        "{label} fake ({caps}): {} trial(s) failed, leaked {:?}",
        report.conclusion.num_failed,
        report.leaked
    );
}

#[test]
fn poorer_fakes_pass_the_suite_by_refusing() {
    // Stateless code, no streaming, no transfers, no allowlist, no ingress.
    suite_passes(
        "poor",
        Capability::RUN_COMMAND
            | Capability::RUN_CODE
            | Capability::FILESYSTEM
            | Capability::NETWORK_POLICY,
    );
    // Commands only: no code, no filesystem.
    suite_passes("bare", Capability::RUN_COMMAND | Capability::NETWORK_POLICY);
}
