//! Docker endpoint discovery: one test per step of the Docker CLI's order and for the
//! precedence between steps. Every lookup happens in temporary directories given through
//! the environment snapshot; nothing connects anywhere.

use std::path::Path;

use sandbox_core::ErrorCode;
use sandbox_docker::{DEFAULT_ENDPOINT, DockerBackend, DockerConfig, EndpointSource, EnvSnapshot};
/// The Docker CLI's directory name for a context (hex SHA-256 of the name), precomputed
/// with an independent tool so a wrong hash in the crate cannot agree with itself.
fn context_dir(name: &str) -> &'static str {
    match name {
        "lab" => "a51146d38077ff992eba84cf1d5e9b249073503eb74868699016153b031a38f7",
        "other" => "d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa",
        _ => "unknown-context",
    }
}

/// Writes a context `name` whose docker endpoint is `host` under `<home>/.docker`.
fn write_context(home: &Path, name: &str, host: &str) {
    let dir = home.join(".docker/contexts/meta").join(context_dir(name));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("meta.json"),
        format!(r#"{{"Name":"{name}","Metadata":{{}},"Endpoints":{{"docker":{{"Host":"{host}","SkipTLSVerify":false}}}}}}"#),
    )
    .unwrap();
}

fn write_current_context(home: &Path, name: &str) {
    std::fs::create_dir_all(home.join(".docker")).unwrap();
    std::fs::write(
        home.join(".docker/config.json"),
        format!(r#"{{"auths":{{}},"currentContext":"{name}"}}"#),
    )
    .unwrap();
}

/// `$XDG_RUNTIME_DIR/docker.sock` exists (a plain file is enough: discovery checks presence).
fn rootless_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("docker.sock"), "").unwrap();
    d
}

fn env_with_home(home: &Path) -> EnvSnapshot {
    EnvSnapshot::empty().var("HOME", home.to_string_lossy())
}

#[test]
fn docker_host_variable_is_used() {
    let c = DockerConfig::from_env_snapshot(
        &EnvSnapshot::empty().var("DOCKER_HOST", "unix:///tmp/x.sock"),
    );
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/x.sock");
    assert_eq!(c.endpoint_source().to_string(), "DOCKER_HOST");
}

#[test]
fn docker_context_variable_resolves_through_meta_sha256() {
    let home = tempfile::tempdir().unwrap();
    write_context(home.path(), "lab", "unix:///tmp/lab.sock");
    let c =
        DockerConfig::from_env_snapshot(&env_with_home(home.path()).var("DOCKER_CONTEXT", "lab"));
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/lab.sock");
    assert_eq!(
        c.endpoint_source(),
        EndpointSource::DockerContext("lab".into())
    );
    assert_eq!(c.endpoint_source().to_string(), "docker context `lab`");
}

#[test]
fn current_context_from_config_json() {
    let home = tempfile::tempdir().unwrap();
    write_context(home.path(), "lab", "unix:///tmp/lab.sock");
    write_current_context(home.path(), "lab");
    let c = DockerConfig::from_env_snapshot(&env_with_home(home.path()));
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/lab.sock");
    assert_eq!(
        c.endpoint_source(),
        EndpointSource::DockerContext("lab".into())
    );
}

#[test]
fn docker_config_variable_moves_the_config_dir() {
    let cfg = tempfile::tempdir().unwrap();
    // DOCKER_CONFIG replaces `~/.docker`: lay the files out directly in it.
    let meta = cfg.path().join("contexts/meta").join(context_dir("lab"));
    std::fs::create_dir_all(&meta).unwrap();
    std::fs::write(
        meta.join("meta.json"),
        r#"{"Endpoints":{"docker":{"Host":"unix:///tmp/cfg.sock"}}}"#,
    )
    .unwrap();
    std::fs::write(
        cfg.path().join("config.json"),
        r#"{"currentContext":"lab"}"#,
    )
    .unwrap();
    let c = DockerConfig::from_env_snapshot(
        &EnvSnapshot::empty().var("DOCKER_CONFIG", cfg.path().to_string_lossy()),
    );
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/cfg.sock");
}

#[test]
fn default_context_means_no_context() {
    let home = tempfile::tempdir().unwrap();
    write_current_context(home.path(), "default");
    let c = DockerConfig::from_env_snapshot(&env_with_home(home.path()));
    assert_eq!(c.resolved_endpoint(), DEFAULT_ENDPOINT);
    assert_eq!(c.endpoint_source(), EndpointSource::Default);
}

#[test]
fn rootless_socket_used_when_present() {
    let run = rootless_dir();
    let c = DockerConfig::from_env_snapshot(
        &EnvSnapshot::empty().var("XDG_RUNTIME_DIR", run.path().to_string_lossy()),
    );
    assert_eq!(
        c.resolved_endpoint(),
        format!("unix://{}", run.path().join("docker.sock").display())
    );
    assert_eq!(c.endpoint_source().to_string(), "rootless socket");
}

#[test]
fn rootless_socket_skipped_when_absent() {
    let run = tempfile::tempdir().unwrap();
    let c = DockerConfig::from_env_snapshot(
        &EnvSnapshot::empty().var("XDG_RUNTIME_DIR", run.path().to_string_lossy()),
    );
    assert_eq!(c.resolved_endpoint(), DEFAULT_ENDPOINT);
}

#[test]
fn default_socket_when_nothing_else() {
    let c = DockerConfig::from_env_snapshot(&EnvSnapshot::empty());
    assert_eq!(c.resolved_endpoint(), DEFAULT_ENDPOINT);
    assert_eq!(c.endpoint_source().to_string(), "default");
}

#[test]
fn precedence_docker_host_over_context_over_rootless_over_default() {
    let home = tempfile::tempdir().unwrap();
    write_context(home.path(), "lab", "unix:///tmp/lab.sock");
    write_context(home.path(), "other", "unix:///tmp/other.sock");
    write_current_context(home.path(), "other");
    let run = rootless_dir();
    let base = env_with_home(home.path()).var("XDG_RUNTIME_DIR", run.path().to_string_lossy());

    // config.json's context beats the rootless socket.
    let c = DockerConfig::from_env_snapshot(&base);
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/other.sock");
    // DOCKER_CONTEXT beats config.json's currentContext.
    let c = DockerConfig::from_env_snapshot(&base.clone().var("DOCKER_CONTEXT", "lab"));
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/lab.sock");
    // DOCKER_HOST beats every context.
    let c = DockerConfig::from_env_snapshot(
        &base
            .clone()
            .var("DOCKER_CONTEXT", "lab")
            .var("DOCKER_HOST", "unix:///tmp/env.sock"),
    );
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/env.sock");
    assert_eq!(c.endpoint_source().to_string(), "DOCKER_HOST");
    // An explicit host beats discovery.
    let c = DockerConfig::from_env_snapshot(&base).endpoint("unix:///tmp/mine.sock");
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/mine.sock");
    assert_eq!(c.endpoint_source(), EndpointSource::Configured);
}

#[tokio::test]
async fn unknown_context_is_a_configuration_error_not_a_fallback() {
    let home = tempfile::tempdir().unwrap();
    let run = rootless_dir();
    let c = DockerConfig::from_env_snapshot(
        &env_with_home(home.path())
            .var("DOCKER_CONTEXT", "missing")
            .var("XDG_RUNTIME_DIR", run.path().to_string_lossy()),
    );
    let e = DockerBackend::connect(c).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
}

#[tokio::test]
async fn malformed_ssh_host_refused_before_connecting() {
    // ssh:// is supported (tests/ssh.rs); a host ssh would read as an option is refused
    // before any process starts or any traffic is sent.
    for host in [
        "ssh://-oProxyCommand=touch%20x",
        "ssh://me@",
        "ssh://h:notaport",
    ] {
        let c = DockerConfig::from_env_snapshot(&EnvSnapshot::empty().var("DOCKER_HOST", host));
        let e = DockerBackend::connect(c).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration, "{host}: {}", e.render());
    }
}

#[tokio::test]
async fn plain_tcp_refused_before_connecting() {
    // 192.0.2.0/24 is TEST-NET-1: even a bug that connected would reach nothing.
    let c = DockerConfig::from_env_snapshot(
        &EnvSnapshot::empty().var("DOCKER_HOST", "tcp://192.0.2.1:2375"),
    );
    let e = DockerBackend::connect(c).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
}
