//! Podman endpoint discovery: one test per step of Podman's order and for the precedence
//! between steps, in temporary directories given through the environment snapshot. The
//! refusals are checked through `PodmanEngine::new`, which makes no engine call.

use sandbox_core::ErrorCode;
use sandbox_podman::{DEFAULT_ENDPOINT, EndpointSource, EnvSnapshot, PodmanConfig, PodmanEngine};

/// `$XDG_RUNTIME_DIR/podman/podman.sock` exists (presence is what discovery checks).
fn rootless_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("podman")).unwrap();
    std::fs::write(d.path().join("podman/podman.sock"), "").unwrap();
    d
}

fn rootless_endpoint(d: &tempfile::TempDir) -> String {
    format!("unix://{}", d.path().join("podman/podman.sock").display())
}

#[test]
fn container_host_variable_is_used() {
    let c = PodmanConfig::from_env_snapshot(
        &EnvSnapshot::empty().var("CONTAINER_HOST", "unix:///tmp/p.sock"),
    );
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/p.sock");
    assert_eq!(c.endpoint_source().to_string(), "CONTAINER_HOST");
}

#[test]
fn rootless_socket_used_when_present_and_not_root() {
    let run = rootless_dir();
    let c = PodmanConfig::from_env_snapshot(
        &EnvSnapshot::empty().var("XDG_RUNTIME_DIR", run.path().to_string_lossy()),
    );
    assert_eq!(c.resolved_endpoint(), rootless_endpoint(&run));
    assert_eq!(c.endpoint_source(), EndpointSource::RootlessSocket);
    assert_eq!(c.endpoint_source().to_string(), "rootless socket");
}

#[test]
fn rootless_socket_skipped_for_root() {
    let run = rootless_dir();
    let c = PodmanConfig::from_env_snapshot(
        &EnvSnapshot::empty()
            .root(true)
            .var("XDG_RUNTIME_DIR", run.path().to_string_lossy()),
    );
    assert_eq!(c.resolved_endpoint(), DEFAULT_ENDPOINT);
}

#[test]
fn rootless_socket_skipped_when_absent() {
    let run = tempfile::tempdir().unwrap();
    let c = PodmanConfig::from_env_snapshot(
        &EnvSnapshot::empty().var("XDG_RUNTIME_DIR", run.path().to_string_lossy()),
    );
    assert_eq!(c.resolved_endpoint(), DEFAULT_ENDPOINT);
}

#[test]
fn default_socket_when_nothing_else() {
    let c = PodmanConfig::from_env_snapshot(&EnvSnapshot::empty());
    assert_eq!(c.resolved_endpoint(), DEFAULT_ENDPOINT);
    assert_eq!(c.endpoint_source().to_string(), "default");
}

#[test]
fn precedence_container_host_over_rootless_over_default_and_configured_over_all() {
    let run = rootless_dir();
    let base = EnvSnapshot::empty().var("XDG_RUNTIME_DIR", run.path().to_string_lossy());
    assert_eq!(
        PodmanConfig::from_env_snapshot(&base).resolved_endpoint(),
        rootless_endpoint(&run)
    );
    let c = PodmanConfig::from_env_snapshot(
        &base.clone().var("CONTAINER_HOST", "unix:///tmp/env.sock"),
    );
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/env.sock");
    let c = c.endpoint("unix:///tmp/mine.sock");
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/mine.sock");
    assert_eq!(c.endpoint_source(), EndpointSource::Configured);
}

/// `PodmanEngine::new` is synchronous and cannot open a tunnel: it refuses ssh:// with
/// the fix (`PodmanEngine::connect`), before any connection.
#[test]
fn ssh_host_refused_with_configuration_error() {
    let c = PodmanConfig::from_env_snapshot(&EnvSnapshot::empty().var(
        "CONTAINER_HOST",
        "ssh://me@192.0.2.1/run/podman/podman.sock",
    ));
    let e = PodmanEngine::new(&c).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
}

#[test]
fn plain_tcp_refused_unless_allowed() {
    // 192.0.2.0/24 is TEST-NET-1, and `new` makes no engine call anyway.
    let c = PodmanConfig::default().endpoint("tcp://192.0.2.1:8888");
    assert_eq!(
        PodmanEngine::new(&c).unwrap_err().code(),
        ErrorCode::Configuration
    );
    assert!(PodmanEngine::new(&c.allow_plain_tcp(true)).is_ok());
}
