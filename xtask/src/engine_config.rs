//! Engine configuration files (the ones docs/engines.md lists). Files are rewritten only when their content differs,
//! so a second `setup` changes nothing and restarts nothing.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::process;

/// Podman's system-wide configuration.
pub const CONTAINERS_CONF: &str = "/etc/containers/containers.conf";
/// dockerd's configuration.
pub const DAEMON_JSON: &str = "/etc/docker/daemon.json";

/// What measured on Debian 12 (podman 4.3.1, cgroup v1 hybrid, no systemd) makes Podman
/// run the hardened containers at all, plus a bounded exec cleanup delay.
const CONTAINERS_CONF_CONTENT: &str = r#"# Written by `cargo xtask setup` (sandbox-rs); see docs/engines.md. Edits are overwritten.
[containers]
# Podman's default ulimits exceed this host's hard limits; runc then fails with
# "error setting rlimits for ready process: ... operation not permitted".
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
# No systemd on these machines, so the default "systemd" cgroup manager cannot work.
cgroup_manager = "cgroupfs"
# crun fails on hybrid cgroups; runc works (and is what Docker uses).
runtime = "runc"
# Every exec made through the API keeps two conmon processes alive for this many seconds
# (default 300); exec-heavy test suites would pile up hundreds of them.
exit_command_delay = 5
"#;

/// What `apply` changed.
pub struct Applied {
    /// containers.conf was written (a running Podman service must restart to see it).
    pub containers_conf_changed: bool,
    /// daemon.json was written (a running dockerd must get SIGHUP).
    pub daemon_json_changed: bool,
}

/// Writes both configuration files where their content differs.
pub fn apply() -> Result<(Applied, String)> {
    let containers_conf_changed =
        write_if_changed(Path::new(CONTAINERS_CONF), CONTAINERS_CONF_CONTENT)?;
    let runsc = process::find_in_path("runsc");
    let daemon_json_changed = match &runsc {
        Some(path) => write_if_changed(Path::new(DAEMON_JSON), &daemon_json(path))?,
        None => false,
    };
    let describe = |changed| if changed { "written" } else { "unchanged" };
    let mut outcome = format!("{CONTAINERS_CONF} {}, ", describe(containers_conf_changed));
    match &runsc {
        Some(path) => outcome.push_str(&format!(
            "{DAEMON_JSON} {} (runsc at {})",
            describe(daemon_json_changed),
            path.display()
        )),
        None => outcome.push_str(&format!(
            "{DAEMON_JSON} untouched (no runsc: gVisor unavailable)"
        )),
    }
    let applied = Applied {
        containers_conf_changed,
        daemon_json_changed,
    };
    Ok((applied, outcome))
}

/// Registers gVisor as the `runsc` runtime. `--network=none` gives the gVisor
/// sandbox no network stack at all, whatever network the container is attached to.
/// `experimental` turns on `docker checkpoint`, which forks with memory need (gVisor
/// checkpoints without CRIU, so this works where runc's checkpoints cannot).
fn daemon_json(runsc: &Path) -> String {
    format!(
        r#"{{
  "experimental": true,
  "runtimes": {{
    "runsc": {{
      "path": "{}",
      "runtimeArgs": ["--network=none"]
    }}
  }}
}}
"#,
        runsc.display()
    )
}

/// Writes `content` unless the file already holds it. A differing file we did not write is
/// kept once as `<path>.sandbox-rs.bak`.
fn write_if_changed(path: &Path, content: &str) -> Result<bool> {
    let current = fs::read_to_string(path).ok();
    if current.as_deref() == Some(content) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    if current.is_some() {
        let backup = PathBuf::from(format!("{}.sandbox-rs.bak", path.display()));
        if !backup.exists() {
            fs::copy(path, &backup)
                .with_context(|| format!("cannot back up {}", path.display()))?;
            crate::report::note(
                "setup",
                &format!(
                    "kept the previous {} as {}",
                    path.display(),
                    backup.display()
                ),
            );
        }
    }
    // Write-then-rename so an engine starting concurrently never reads half a file.
    let staging = PathBuf::from(format!("{}.sandbox-rs.tmp", path.display()));
    fs::write(&staging, content).with_context(|| format!("cannot write {}", staging.display()))?;
    fs::rename(&staging, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_json_registers_runsc_without_network() {
        let json = daemon_json(Path::new("/usr/bin/runsc"));
        assert!(json.contains(r#""path": "/usr/bin/runsc""#));
        assert!(json.contains(r#""runtimeArgs": ["--network=none"]"#));
        assert!(json.contains(r#""experimental": true"#));
    }

    #[test]
    fn containers_conf_has_the_settings_podman_needs_here() {
        for setting in [
            r#"default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]"#,
            r#"cgroup_manager = "cgroupfs""#,
            r#"runtime = "runc""#,
            "exit_command_delay = 5",
        ] {
            assert!(CONTAINERS_CONF_CONTENT.contains(setting), "{setting}");
        }
    }

    #[test]
    fn unchanged_content_is_not_rewritten() {
        let dir = std::env::temp_dir().join(format!("xtask-conf-{}", std::process::id()));
        let file = dir.join("sub/x.conf");
        assert!(write_if_changed(&file, "a\n").unwrap());
        assert!(!write_if_changed(&file, "a\n").unwrap());
        assert!(write_if_changed(&file, "b\n").unwrap());
        assert_eq!(fs::read_to_string(&file).unwrap(), "b\n");
        assert_eq!(
            fs::read_to_string(dir.join("sub/x.conf.sandbox-rs.bak")).unwrap(),
            "a\n"
        );
        fs::remove_dir_all(dir).unwrap();
    }
}
