//! The contract suite against the fake backend with every capability it implements.
//!
//! `create` is given a 25 ms (virtual-time) start-up delay here, like a real engine, so the
//! drop-mid-create trial can drop a create that is still in flight. Every trial runs here
//! (zero ignored); the "refused" branch of each capability trial runs in
//! `contract_reduced.rs` against poorer fakes. `cargo xtask contract fake` runs this target
//! (`test = false` keeps it out of `cargo test --workspace`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use sandbox_contract::{CanarySpec, Faults, Injection, Probes};
use sandbox_core::{Backend, CreateOptions, async_trait};
use sandbox_fake::FakeBackend;

/// What the suite needs to know about the fake beyond the core traits.
struct FakeProbes {
    backend: FakeBackend,
}

/// Kill faults on a second handle of the same in-memory engine, so injecting them never
/// disturbs trials running in parallel on the main handle.
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

    async fn canary(&self) -> sandbox_contract::anyhow::Result<Option<CanarySpec>> {
        Ok(Some(CanarySpec {
            bind: "127.0.0.1:0".parse()?,
            dial_host: "127.0.0.1".into(),
        }))
    }

    /// The fake resolves with the host's resolver: `localhost` is the canary's address in
    /// `/etc/hosts`; `.invalid` (RFC 6761) never resolves.
    fn egress_names(&self) -> Option<sandbox_contract::EgressNames> {
        Some(sandbox_contract::EgressNames {
            listed: "localhost".into(),
            unlisted: "unlisted.sbx-contract.invalid".into(),
        })
    }

    async fn engine_env(
        &self,
        sandbox_id: &str,
    ) -> sandbox_contract::anyhow::Result<Option<Vec<String>>> {
        let handle = self.backend.sandbox(sandbox_id).ok_or_else(|| {
            sandbox_contract::anyhow::anyhow!("the fake holds no sandbox {sandbox_id}")
        })?;
        Ok(Some(handle.engine_env()))
    }

    async fn faults(&self) -> sandbox_contract::anyhow::Result<Option<Arc<dyn Faults>>> {
        Ok(Some(Arc::new(FakeFaults {
            backend: self.backend.with_own_faults(),
        })))
    }

    async fn stop_sandbox(&self, sandbox_id: &str) -> sandbox_contract::anyhow::Result<Injection> {
        let handle = self.backend.sandbox(sandbox_id).ok_or_else(|| {
            sandbox_contract::anyhow::anyhow!("the fake holds no sandbox {sandbox_id}")
        })?;
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

fn main() -> ExitCode {
    let backend = FakeBackend::builder()
        .create_delay(Duration::from_millis(25))
        // A short create bound keeps the stalled-create trial fast.
        .create_timeout(Duration::from_secs(2))
        .build();
    let probes = Arc::new(FakeProbes {
        backend: backend.clone(),
    });
    sandbox_contract::run(
        Box::new(move || Box::pin(async move { Ok(Arc::new(backend) as Arc<dyn Backend>) })),
        probes,
    )
}
