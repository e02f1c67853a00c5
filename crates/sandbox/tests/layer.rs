//! The facade always applies core's enforcement layer: proven against the fake, whose
//! recorded calls show what reached the adapter.

#![cfg(feature = "fake")]

use std::sync::Arc;
use std::time::Duration;

use sandbox::fake::{Call, FakeBackend};
use sandbox::layer::{Layer, MemorySink};
use sandbox::{
    Backend, Capability, CodeOptions, CreateOptions, ErrorCode, RunOptions, SandboxError,
};

fn fake_without(caps: Capability) -> Arc<FakeBackend> {
    Arc::new(FakeBackend::builder().without(caps).build())
}

#[tokio::test]
async fn undeclared_capability_is_refused_before_the_fake_sees_it() {
    let fake = fake_without(Capability::STREAMING | Capability::STATEFUL_CODE);
    let sb = sandbox::create(fake.clone() as Arc<dyn Backend>, CreateOptions::default())
        .await
        .unwrap();
    let e = sb
        .stream("echo hi".into(), RunOptions::default())
        .unwrap_err();
    let SandboxError::CapabilityNotSupported {
        capability,
        supported_by,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(*capability, Capability::STREAMING);
    assert_eq!(
        supported_by,
        &["docker", "podman", "fake"],
        "facade directory"
    );
    let e = sb
        .run_code("x = 1", CodeOptions::default().context("c"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::CapabilityNotSupported);
    let reached: Vec<_> = fake
        .calls_for(sb.id())
        .into_iter()
        .filter(|c| matches!(c, Call::Run { .. } | Call::RunCode { .. }))
        .collect();
    assert!(reached.is_empty(), "{reached:?}");
    sb.kill().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn none_timeout_reaches_the_fake_as_the_remaining_lifetime() {
    let fake = Arc::new(FakeBackend::new());
    let sb = sandbox::create(
        fake.clone() as Arc<dyn Backend>,
        CreateOptions::default().timeout(Duration::from_secs(90)),
    )
    .await
    .unwrap();
    tokio::time::advance(Duration::from_secs(30)).await;
    sb.run("true".into(), RunOptions::default()).await.unwrap();
    let timeouts: Vec<_> = fake
        .calls_for(sb.id())
        .into_iter()
        .filter_map(|c| match c {
            Call::Run { timeout, .. } => Some(timeout),
            _ => None,
        })
        .collect();
    assert_eq!(timeouts, [Some(Duration::from_secs(60))]);
    sb.kill().await.unwrap();
}

#[tokio::test]
async fn double_kill_reaches_the_fake_once() {
    let fake = Arc::new(FakeBackend::new());
    let sb = sandbox::create(fake.clone() as Arc<dyn Backend>, CreateOptions::default())
        .await
        .unwrap();
    sb.kill().await.unwrap();
    sb.kill().await.unwrap();
    let kills = fake
        .calls_for(sb.id())
        .into_iter()
        .filter(|c| matches!(c, Call::Kill { .. }))
        .count();
    assert_eq!(kills, 1);
}

#[tokio::test]
async fn user_audit_layer_is_kept_not_doubled() {
    let sink = Arc::new(MemorySink::new());
    let backend = Layer::new()
        .audit(sink.clone())
        .wrap(Arc::new(FakeBackend::new()));
    let sb = sandbox::create(backend, CreateOptions::default().secret("T", "tok-123456"))
        .await
        .unwrap();
    sb.run("printenv T".into(), RunOptions::default())
        .await
        .unwrap();
    sb.kill().await.unwrap();
    let ops: Vec<_> = sink.records().iter().map(|r| r.operation).collect();
    assert_eq!(ops, ["sandbox.create", "sandbox.run", "sandbox.kill"]);
    assert!(
        sink.records()
            .iter()
            .all(|r| !r.to_json().contains("tok-123456"))
    );
    // The fake's native handle is still reachable through the layer.
    assert!(
        sb.native()
            .downcast_ref::<sandbox::fake::SandboxHandle>()
            .is_some()
    );
}

#[tokio::test]
async fn dsn_backends_are_enforced() {
    let b = sandbox::backend("fake://").await.unwrap();
    assert!(b.as_enforced().is_some(), "facade backends carry the layer");
    let again = sandbox::backend("fake://").await.unwrap();
    assert!(Arc::ptr_eq(&b, &again), "cached, wrapped once");
}
