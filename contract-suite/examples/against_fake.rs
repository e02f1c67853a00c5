//! Runs the whole suite against the fake backend with the suite's own probes:
//! `cargo run -p sandbox-rs-contract --example against_fake -- [libtest filters]`.
//! (The fake's own `tests/contract.rs` is the normative run; this one exercises the suite.)

use std::process::ExitCode;
use std::sync::Arc;

use sandbox_contract::{CanarySpec, Faults, Probes, anyhow};
use sandbox_core::{Backend, async_trait};
use sandbox_fake::FakeBackend;

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
    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        Ok(Some(Arc::new(FakeFaults {
            backend: self.backend.with_own_faults(),
        })))
    }
    fn in_process_storage(&self) -> bool {
        true
    }
    fn in_process(&self) -> bool {
        true
    }
    fn symlinks(&self) -> bool {
        false
    }
}

fn main() -> ExitCode {
    let fake = FakeBackend::new();
    let probes = Arc::new(FakeSuiteProbes {
        backend: fake.clone(),
    });
    sandbox_contract::run(
        Box::new(move || Box::pin(async move { Ok(Arc::new(fake) as Arc<dyn Backend>) })),
        probes,
    )
}
