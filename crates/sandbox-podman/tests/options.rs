//! `PodmanOptions` and `PodmanConfig` through the public API: every refusal happens before
//! anything is created, with a `Configuration` error and a hint. No engine needed.

use std::path::Path;

use sandbox_core::{ErrorCode, IsolationTier, SandboxError};
use sandbox_podman::{
    DEFAULT_ENDPOINT, ENDPOINT_ENV, ENGINE_PATHS, GRANTABLE_CAPABILITIES, LinuxCapability, Mount,
    NEVER_GRANTABLE, PodmanConfig, PodmanOptions, Runtime, Sharing,
};

fn refused(o: PodmanOptions) -> SandboxError {
    let e = o
        .validate_with_cdi_dirs(&[Path::new("/nonexistent-cdi-dir")])
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration, "{e}");
    assert!(!e.hint().is_empty());
    e
}

#[test]
fn defaults_are_valid_and_ephemeral() {
    let o = PodmanOptions::default();
    assert!(o.ephemeral);
    assert!(o.validate_with_cdi_dirs(&[]).is_ok());
    assert_eq!(o.tier(), IsolationTier::Container);
}

#[test]
fn runtime_maps_to_tier() {
    assert_eq!(Runtime::parse("runsc"), Some(Runtime::Runsc));
    assert_eq!(Runtime::parse("/usr/bin/runc"), None);
    assert_eq!(PodmanOptions::new().tier(), IsolationTier::Container);
    assert_eq!(
        PodmanOptions::new().runtime(Runtime::Runsc).tier(),
        IsolationTier::Gvisor
    );
    assert_eq!(
        PodmanOptions::new().runtime(Runtime::Krun).tier(),
        IsolationTier::Container,
        "unverified micro-VM"
    );
}

#[test]
fn dangerous_capabilities_are_never_granted() {
    for c in ["NET_ADMIN", "net_raw", "CAP_SYS_ADMIN"] {
        let e = LinuxCapability::parse(c).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert!(e.to_string().contains("never grantable"));
    }
}

#[test]
fn unlisted_capabilities_are_refused() {
    for c in ["SYS_PTRACE", "SYS_MODULE", "ALL", "", "MKNOD", "BPF"] {
        let e = LinuxCapability::parse(c).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration, "{c}");
        assert!(!e.hint().is_empty());
    }
    assert_eq!(
        LinuxCapability::parse("cap_chown").unwrap(),
        LinuxCapability::Chown
    );
    assert_eq!(
        "net_bind_service".parse::<LinuxCapability>().unwrap(),
        LinuxCapability::NetBindService
    );
    assert!(
        PodmanOptions::new()
            .capability(LinuxCapability::Chown)
            .validate_with_cdi_dirs(&[])
            .is_ok()
    );
}

/// PERFMON opens perf_event_open/BPF tracing of the host kernel: not grantable.
#[test]
fn perfmon_is_not_grantable() {
    for c in ["PERFMON", "cap_perfmon"] {
        assert_eq!(
            LinuxCapability::parse(c).unwrap_err().code(),
            ErrorCode::Configuration
        );
    }
    assert!(
        GRANTABLE_CAPABILITIES
            .iter()
            .all(|c| c.as_str() != "PERFMON")
    );
    for never in NEVER_GRANTABLE {
        assert!(GRANTABLE_CAPABILITIES.iter().all(|c| c.as_str() != never));
    }
}

#[test]
fn annotations_need_allowlisted_keys_and_no_control_characters() {
    refused(PodmanOptions::new().annotation("io.podman.annotations.label", "disable"));
    refused(PodmanOptions::new().annotation("krun.cpus", "2\n"));
    refused(PodmanOptions::new().annotation("krun.cpus\u{1b}", "2"));
    refused(PodmanOptions::new().annotation("krun.cpus", "x".repeat(2000)));
    assert!(
        PodmanOptions::new()
            .annotation("krun.cpus", "2")
            .validate_with_cdi_dirs(&[])
            .is_ok()
    );
}

#[test]
fn gpu_without_cdi_specs_is_refused() {
    let e = refused(PodmanOptions::new().cdi_device("nvidia.com/gpu=0"));
    assert!(e.hint().contains("nvidia-ctk"));
}

#[test]
fn gpu_with_cdi_specs_is_accepted_and_names_are_checked() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("nvidia.yaml"), "cdiVersion: 0.5.0\n").unwrap();
    let o = PodmanOptions::new().cdi_device("nvidia.com/gpu=0");
    assert!(o.validate_with_cdi_dirs(&[d.path()]).is_ok());
    for bad in [
        "gpu0",
        "/dev/nvidia0",
        "nvidia.com/gpu=",
        "nvidia.com/gpu=0;x",
    ] {
        let e = PodmanOptions::new()
            .cdi_device(bad)
            .validate_with_cdi_dirs(&[d.path()])
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::Configuration, "{bad}");
    }
}

#[test]
fn mounts_are_checked() {
    let d = tempfile::tempdir().unwrap();
    let host = d.path().to_path_buf();
    refused(PodmanOptions::new().mount(Mount::bind("relative", "/data")));
    refused(PodmanOptions::new().mount(Mount::bind("/definitely/not/here", "/data")));
    for target in [
        "data",
        "/",
        "/proc",
        "/proc/sys",
        "/sys",
        "/dev/shm",
        "/a/../etc",
        "/a,b",
        "/a\nb",
    ] {
        refused(PodmanOptions::new().mount(Mount::bind(&host, target)));
    }
    refused(PodmanOptions::new().mount(Mount::copy(&host, "/data").read_only(true)));
    refused(
        PodmanOptions::new()
            .mount(Mount::bind(&host, "/data"))
            .mount(Mount::copy(&host, "/data/")),
    );
    assert!(
        PodmanOptions::new()
            .mount(
                Mount::bind(&host, "/data")
                    .read_only(true)
                    .sharing(Sharing::Shared)
            )
            .mount(Mount::copy(&host, "/seed"))
            .validate_with_cdi_dirs(&[])
            .is_ok()
    );
}

#[test]
fn bind_mounts_are_read_only_by_default() {
    let d = tempfile::tempdir().unwrap();
    assert!(Mount::bind(d.path(), "/data").read_only);
    assert!(!Mount::bind(d.path(), "/data").read_only(false).read_only);
    assert!(!Mount::copy(d.path(), "/seed").read_only);
}

/// A mount of a host system path or an engine socket hands the host to sandbox root.
#[test]
fn host_system_paths_and_engine_sockets_are_refused() {
    for host in [
        "/", "/etc", "/etc/ssh", "/proc", "/proc/1", "/sys", "/sys/fs", "/dev", "/boot", "/root",
        "/run", "/var",
    ] {
        if Path::new(host).exists() {
            let e = refused(PodmanOptions::new().mount(Mount::bind(host, "/data")));
            assert!(e.to_string().contains("refused"), "{host}: {e}");
            refused(PodmanOptions::new().mount(Mount::copy(host, "/data")));
        }
    }
    // Engine sockets and state, whether or not the engine runs on this host.
    let d = tempfile::tempdir().unwrap();
    for p in ENGINE_PATHS {
        if Path::new(p).exists() {
            refused(PodmanOptions::new().mount(Mount::bind(p, "/data")));
        }
    }
    // Canonicalised first: a symlink to /etc is /etc.
    let link = d.path().join("innocent");
    std::os::unix::fs::symlink("/etc", &link).unwrap();
    refused(PodmanOptions::new().mount(Mount::bind(&link, "/data")));
    // Any unix socket (a custom engine endpoint, a proxy) is refused.
    let sock = d.path().join("engine.sock");
    let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let e = refused(PodmanOptions::new().mount(Mount::bind(&sock, "/engine.sock")));
    assert!(e.to_string().contains("socket"), "{e}");
    // A plain data directory is fine, and the body gets its canonical path.
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let m = Mount::bind(d.path().join("./data/../data"), "/data");
    assert_eq!(
        m.resolved_host().unwrap(),
        std::fs::canonicalize(&data).unwrap()
    );
}

/// `//proc` must not slip past the reserved-target check.
#[test]
fn mount_targets_are_normalised_before_the_reserved_check() {
    let d = tempfile::tempdir().unwrap();
    for target in [
        "//proc",
        "/proc/",
        "//proc//sys",
        "///sys",
        "//dev/shm",
        "//",
        "/./proc",
    ] {
        refused(PodmanOptions::new().mount(Mount::bind(d.path(), target)));
    }
    assert_eq!(
        Mount::bind(d.path(), "//data//x/")
            .normalized_target()
            .unwrap(),
        "/data/x"
    );
    assert_eq!(
        Mount::bind(d.path(), "/processes")
            .normalized_target()
            .unwrap(),
        "/processes"
    );
    // Two spellings of one target are one target.
    refused(
        PodmanOptions::new()
            .mount(Mount::bind(d.path(), "/data"))
            .mount(Mount::copy(d.path(), "//data/")),
    );
}

#[test]
fn from_env_honours_container_host() {
    // Only reads: the variable may or may not be set in the test environment.
    let c = PodmanConfig::from_env();
    match std::env::var(ENDPOINT_ENV) {
        Ok(h) if !h.trim().is_empty() => assert_eq!(c.resolved_endpoint(), h.trim()),
        _ => assert_eq!(c.resolved_endpoint(), DEFAULT_ENDPOINT),
    }
    let c = PodmanConfig::default().endpoint("tcp://127.0.0.1:8888");
    assert_eq!(c.resolved_endpoint(), "tcp://127.0.0.1:8888");
}
