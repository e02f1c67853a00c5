//! The facade end to end on the fake (and on Docker when an engine answers).

#![cfg(feature = "fake")]

use std::sync::Arc;

use futures::StreamExt;
use sandbox::fake::FakeConfig;
use sandbox::{CreateOptions, ErrorCode, IsolationTier, SandboxExt};

#[tokio::test]
async fn dsn_and_typed_config_build_the_same_backend() {
    let a = sandbox::backend("fake://").await.unwrap();
    let b = sandbox::backend(FakeConfig::default()).await.unwrap();
    let c = sandbox::backend("fake://some/template?timeout=5")
        .await
        .unwrap();
    assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&a, &c));
    let mut other = FakeConfig::default();
    other.uid = 0;
    let d = sandbox::backend(other).await.unwrap();
    assert!(
        !Arc::ptr_eq(&a, &d),
        "another configuration is another backend"
    );
}

#[tokio::test]
async fn create_run_stream_files_connect_kill_on_the_fake() {
    let sb = sandbox::create("fake://?timeout=60", CreateOptions::default())
        .await
        .unwrap();
    assert_eq!(sb.backend(), "fake");
    assert_eq!(sb.exec(["echo", "hi"]).await.unwrap().stdout_text(), "hi\n");
    let mut p = sb
        .stream(vec!["seq", "3"].into(), Default::default())
        .unwrap();
    let mut out = Vec::new();
    while let Some(c) = p.next().await {
        out.extend_from_slice(&c.unwrap().data);
    }
    assert_eq!(out, b"1\n2\n3\n");
    sb.files()
        .unwrap()
        .write("a.txt", "x".into())
        .await
        .unwrap();
    let again = sandbox::connect("fake://", sb.id()).await.unwrap();
    assert_eq!(
        &again.files().unwrap().read("/work/a.txt").await.unwrap()[..],
        b"x"
    );
    sb.kill().await.unwrap();
    let e = sandbox::connect("fake://", sb.id()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Connect);
}

#[tokio::test]
async fn require_isolation_refused_on_the_fake_before_provisioning() {
    let e = sandbox::create(
        "fake://",
        CreateOptions::default().require_isolation(IsolationTier::MicroVm),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
}

#[test]
fn blocking_twin_end_to_end() {
    let sb = sandbox::blocking::create("fake://", CreateOptions::default()).unwrap();
    assert_eq!(sb.exec("echo hi").unwrap().stdout_text(), "hi\n");
    assert_eq!(sb.code("print(1 + 1)").unwrap().stdout_text(), "2\n");
    let fs = sb.files().unwrap();
    fs.write("b.txt", &b"bytes"[..]).unwrap();
    assert_eq!(&fs.read("b.txt").unwrap()[..], b"bytes");
    assert!(fs.stat("b.txt").unwrap().size == 5);
    let chunks: Vec<_> = sb
        .stream(["seq", "2"], Default::default())
        .unwrap()
        .map(|c| c.unwrap().data)
        .collect();
    assert_eq!(chunks.concat(), b"1\n2\n");
    let mut p = sb.stream(["true"], Default::default()).unwrap();
    assert_eq!(p.wait().unwrap().exit_code, 0);
    assert_eq!(p.returncode(), Some(0));
    // Live input from synchronous code: written, echoed, ended.
    let mut cat = sb
        .stream(["cat"], sandbox::RunOptions::default().interactive())
        .unwrap();
    let input = cat.input().unwrap();
    input.write("typed\n").unwrap();
    assert_eq!(&cat.next().unwrap().unwrap().data[..], b"typed\n");
    input.end().unwrap();
    assert_eq!(cat.wait().unwrap().exit_code, 0);
    let id = sb.id().to_string();
    drop(sb); // kills synchronously
    let e = sandbox::blocking::connect("fake://", &id).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Connect);
}

#[cfg(feature = "docker")]
#[tokio::test]
async fn docker_dsn_none_and_typed_config_share_one_client() {
    let Ok(a) = sandbox::backend(None).await else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("Docker is required when CI=true");
        }
        eprintln!("SKIPPED docker_dsn_none_and_typed_config_share_one_client: no Docker engine");
        return;
    };
    let b = sandbox::backend("docker://").await.unwrap();
    let c = sandbox::backend(sandbox::docker::DockerConfig::from_env())
        .await
        .unwrap();
    let d = sandbox::backend("").await.unwrap();
    assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&a, &c) && Arc::ptr_eq(&a, &d));
}
