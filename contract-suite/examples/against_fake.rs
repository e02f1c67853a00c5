//! Runs the whole suite against the fake backend with the suite's own probes:
//! `cargo run -p sandbox-rs-contract --example against_fake -- [libtest filters]`.
//! (The fake's own `tests/contract.rs` is the normative run; this one exercises the suite.)

use std::process::ExitCode;
use std::sync::Arc;

use sandbox_contract::{CanarySpec, Faults, Injection, Probes, anyhow};
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
    fn symlinks(&self) -> bool {
        false
    }
}

fn main() -> ExitCode {
    let fake = FakeBackend::builder()
        .create_timeout(std::time::Duration::from_secs(2))
        .build();
    let probes = Arc::new(FakeSuiteProbes {
        backend: fake.clone(),
    });
    sandbox_contract::run(
        Box::new(move || Box::pin(async move { Ok(Arc::new(fake) as Arc<dyn Backend>) })),
        probes,
    )
}
