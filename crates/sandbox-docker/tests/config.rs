//! How a [`DockerConfig`] reaches the engine (`DockerConfig::transport`), decided and
//! refused before any connection: plain TCP only when allowed, TLS never downgraded and
//! its files named when missing, ssh endpoints parsed or refused. No engine needed.

use sandbox_core::{ErrorCode, SandboxError};
use sandbox_docker::{
    DEFAULT_ENDPOINT, DEFAULT_TEMPLATE, DockerConfig, EnvSnapshot, Runtime, Transport,
};

#[test]
fn builder_and_endpoint() {
    let c = DockerConfig::default()
        .endpoint("unix:///tmp/x.sock")
        .runtime(Runtime::Runsc)
        .default_template("img:1");
    assert_eq!(c.resolved_endpoint(), "unix:///tmp/x.sock");
    assert_eq!(c.layer.default_template, "img:1");
    assert_eq!(c.runtime_kind(), Runtime::Runsc);
    assert_eq!(
        DockerConfig::default().layer.default_template,
        DEFAULT_TEMPLATE
    );
}

fn env() -> EnvSnapshot {
    EnvSnapshot::empty()
}

/// A config error's message and hint, for checking what it names.
fn config_text(e: &SandboxError) -> String {
    assert_eq!(e.code(), ErrorCode::Configuration, "{e:?}");
    match e {
        SandboxError::Configuration { message, hint, .. } => {
            format!("{message} {}", hint.clone().unwrap_or_default())
        }
        _ => String::new(),
    }
}

/// `DOCKER_HOST` on TCP with `DOCKER_TLS_VERIFY=1` and the certificates in `dir`.
fn tls_env(dir: &std::path::Path) -> EnvSnapshot {
    env()
        .var("DOCKER_HOST", "tcp://10.0.0.1:2376")
        .var("DOCKER_TLS_VERIFY", "1")
        .var("DOCKER_CERT_PATH", dir.to_string_lossy())
}

fn cert_dir(files: &[&str]) -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    for f in files {
        std::fs::write(d.path().join(f), "x").expect("write");
    }
    d
}

#[test]
fn plain_tcp_refused_unless_allowed() {
    let c = DockerConfig::from_env_snapshot(&env().var("DOCKER_HOST", "tcp://10.0.0.1:2375"));
    let e = c.transport().unwrap_err();
    assert!(config_text(&e).contains("allow_plain_tcp"));
    assert_eq!(
        c.allow_plain_tcp(true).transport().unwrap(),
        Transport::PlainTcp("tcp://10.0.0.1:2375".into())
    );
}

#[test]
fn unix_socket_needs_no_tls() {
    let c = DockerConfig::from_env_snapshot(&env().var("DOCKER_TLS_VERIFY", "1"));
    assert_eq!(
        c.transport().unwrap(),
        Transport::Local(DEFAULT_ENDPOINT.into())
    );
}

#[test]
fn tls_verify_is_never_downgraded_to_plain_http() {
    let d = cert_dir(&["ca.pem", "cert.pem", "key.pem"]);
    let c = DockerConfig::from_env_snapshot(&tls_env(d.path()))
        // Allowing plain TCP must not turn a TLS request into plain HTTP either.
        .allow_plain_tcp(true);
    let t = c.transport();
    if cfg!(feature = "tls") {
        assert!(matches!(t, Ok(Transport::Tls { .. })), "{t:?}");
    } else {
        assert!(config_text(&t.unwrap_err()).contains("`tls` feature"));
    }
}

#[test]
fn https_without_tls_feature_refused() {
    let d = cert_dir(&["ca.pem", "cert.pem", "key.pem"]);
    let t = DockerConfig::default()
        .endpoint("https://10.0.0.1:2376")
        .tls(d.path())
        .transport();
    if cfg!(feature = "tls") {
        assert!(matches!(t, Ok(Transport::Tls { .. })), "{t:?}");
    } else {
        assert!(config_text(&t.unwrap_err()).contains("`tls` feature"));
    }
}

#[cfg(feature = "tls")]
#[test]
fn tls_uses_cert_path_files() {
    let d = cert_dir(&["ca.pem", "cert.pem", "key.pem"]);
    let c = DockerConfig::from_env_snapshot(&tls_env(d.path()));
    assert_eq!(
        c.transport().unwrap(),
        Transport::Tls {
            endpoint: "tcp://10.0.0.1:2376".into(),
            ca: d.path().join("ca.pem"),
            cert: d.path().join("cert.pem"),
            key: d.path().join("key.pem"),
        }
    );
}

#[cfg(feature = "tls")]
#[test]
fn tls_cert_path_defaults_to_home_docker() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".docker")).unwrap();
    for f in ["ca.pem", "cert.pem", "key.pem"] {
        std::fs::write(home.path().join(".docker").join(f), "x").unwrap();
    }
    let c = DockerConfig::from_env_snapshot(
        &env()
            .var("HOME", home.path().to_string_lossy())
            .var("DOCKER_HOST", "tcp://10.0.0.1:2376")
            .var("DOCKER_TLS_VERIFY", "1"),
    );
    assert!(
        matches!(c.transport(), Ok(Transport::Tls { ca, .. }) if ca == home.path().join(".docker/ca.pem"))
    );
}

#[cfg(feature = "tls")]
#[test]
fn tls_missing_file_names_the_path() {
    for missing in ["ca.pem", "cert.pem", "key.pem"] {
        let present: Vec<&str> = ["ca.pem", "cert.pem", "key.pem"]
            .into_iter()
            .filter(|f| *f != missing)
            .collect();
        let d = cert_dir(&present);
        let e = DockerConfig::default()
            .endpoint("tcp://10.0.0.1:2376")
            .tls(d.path())
            .transport()
            .unwrap_err();
        let want = d.path().join(missing).display().to_string();
        assert!(config_text(&e).contains(&want), "{e:?} should name {want}");
    }
}

#[test]
fn ssh_goes_through_a_tunnel_and_bad_ssh_urls_are_refused() {
    let c = DockerConfig::from_env_snapshot(&env().var("DOCKER_HOST", "ssh://me@host:2222"));
    match c.transport().unwrap() {
        Transport::Ssh(t) => {
            assert_eq!((t.user.as_deref(), t.host.as_str()), (Some("me"), "host"));
            assert_eq!(
                (t.port, t.remote_socket.as_str()),
                (Some(2222), "/var/run/docker.sock")
            );
        }
        other => panic!("not a tunnel: {other:?}"),
    }
    let c = DockerConfig::from_env_snapshot(&env().var("DOCKER_HOST", "ssh://-oProxyCommand=x"));
    assert!(config_text(&c.transport().unwrap_err()).contains("invalid ssh endpoint"));
}

#[test]
fn endpoint_credentials_never_reach_an_error() {
    let c = DockerConfig::default().endpoint("tcp://user:pw@10.0.0.1:2375");
    let text = config_text(&c.transport().unwrap_err());
    assert!(text.contains("tcp://10.0.0.1:2375"), "{text}");
    assert!(!text.contains("pw"), "{text}");
}

/// A daemon that accepts connections and never answers fails `connect` within seconds,
/// not after the 30 s per-call bound: a `create` on a wedged engine must fail in under
/// 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_engine_fails_connect_within_seconds() {
    let wedged = sandbox_testkit::wedged::WedgedEngine::start().unwrap();
    let config = DockerConfig::default()
        .endpoint(wedged.endpoint())
        .startup_sweep(false);
    let started = std::time::Instant::now();
    let e = sandbox_docker::DockerBackend::connect(config)
        .await
        .expect_err("a wedged engine must not connect");
    assert_eq!(e.code(), ErrorCode::EngineUnavailable, "{e}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "a wedged engine held connect for {:?}",
        started.elapsed()
    );
}
