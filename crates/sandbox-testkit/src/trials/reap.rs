//! `kill_managed` (what `sandbox reap --kill` calls) leaves nothing of ours behind: the
//! library's egress network goes with its last sandbox, so reaping never strands a
//! network no sandbox uses.

use sandbox_core::{NetworkPolicy, ReapableBackend};

use sandbox_container::egress::NETWORK_NAME;
use sandbox_container::{ContainerEngine, EngineErrorKind};

use crate::tagged::test_options;

/// Creates a sandbox with egress `Allow` (on the library network), reaps it with
/// `kill_managed`, then asks the engine to remove the library network: that must find it
/// already gone, or in use by another sandbox (a test running beside this one). Removing
/// it here would mean the reap left an unused network behind.
pub async fn reaping_the_last_networked_sandbox_removes_the_network<E: ContainerEngine>(
    b: &dyn ReapableBackend,
    engine: &E,
    template: &str,
) {
    let s = b
        .create(test_options(template, "reap-network").network(NetworkPolicy::allow()))
        .await
        .expect("create with egress Allow");
    let id = s.id().to_string();
    assert!(b.kill_managed(&id).await.expect("kill_managed"), "reaped");
    match engine.remove_network(NETWORK_NAME).await {
        Ok(false) => {}
        Err(e) if e.kind == EngineErrorKind::Conflict => {}
        Err(e) if e.kind == EngineErrorKind::NotFound => {}
        Ok(true) => panic!("kill_managed left the unused network {NETWORK_NAME} behind"),
        Err(e) => panic!("removing {NETWORK_NAME}: {e}"),
    }
    drop(s);
}
