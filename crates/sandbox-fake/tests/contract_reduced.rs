//! The contract suite against fakes that declare fewer capabilities, so every negative
//! trial ("X refused without capability") runs somewhere: the full fake in `contract.rs`
//! declares everything those trials need absent. Positive trials of the undeclared
//! capabilities are (correctly) ignored here.

use std::process::ExitCode;
use std::sync::Arc;

use sandbox_contract::libtest_mimic::Arguments;
use sandbox_contract::{CanarySpec, Probes};
use sandbox_core::{Backend, Capability, async_trait};
use sandbox_fake::FakeBackend;

struct ReducedProbes;

#[async_trait]
impl Probes for ReducedProbes {
    async fn canary(&self) -> Option<CanarySpec> {
        Some(CanarySpec {
            bind: "127.0.0.1:0".parse().ok()?,
            dial_host: "127.0.0.1".into(),
        })
    }
    fn template_without_python(&self) -> Option<String> {
        Some("sandbox-rs/busybox:latest".into())
    }
    fn in_process_storage(&self) -> bool {
        true
    }
}

fn suite(caps: Capability) -> bool {
    let backend = FakeBackend::builder().capabilities(caps).build();
    let report = sandbox_contract::build(
        Box::new(move || Box::pin(async move { Ok(Arc::new(backend) as Arc<dyn Backend>) })),
        Arc::new(ReducedProbes),
    )
    .run(&Arguments::from_args());
    !report.failed()
}

fn main() -> ExitCode {
    // Stateless code, no streaming, no transfers, no allowlist, no ingress.
    let poor = suite(
        Capability::RUN_COMMAND
            | Capability::RUN_CODE
            | Capability::FILESYSTEM
            | Capability::NETWORK_POLICY,
    );
    // Commands only: no code, no filesystem.
    let bare = suite(Capability::RUN_COMMAND | Capability::NETWORK_POLICY);
    if poor && bare {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(101)
    }
}
