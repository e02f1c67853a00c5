//! The Debian packages the engines and the test images need, installed with apt only when
//! something is missing (a machine that has them all never touches the network).

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{Result, bail};

use crate::process;

/// A package `setup` installs, and why.
pub struct Package {
    /// The Debian package name.
    pub name: &'static str,
    /// Optional packages that the configured apt sources lack are reported, not fatal.
    pub optional: bool,
    /// What it is for (printed when it is missing).
    pub purpose: &'static str,
}

/// Everything `setup` relies on. Versions in Debian 12: docker.io 20.10.24, podman 4.3.1,
/// runsc 0.0~20221219 (gVisor, a real bookworm/main package), busybox-static 1.35.0.
pub const PACKAGES: &[Package] = &[
    Package {
        name: "docker.io",
        optional: false,
        purpose: "Docker engine (dockerd, containerd, runc, docker CLI)",
    },
    Package {
        name: "podman",
        optional: false,
        purpose: "Podman engine and its REST API service",
    },
    Package {
        // `podman run --init` bind-mounts /usr/libexec/podman/catatonit; podman only
        // *recommends* it and the recommendation is satisfied by tini, so without this
        // package `--init` fails: "container-init binary not found on the host".
        name: "catatonit",
        optional: false,
        purpose: "the init process Podman's --init injects as PID 1",
    },
    Package {
        name: "runsc",
        optional: true,
        purpose: "gVisor runtime for Docker (`--runtime runsc`, the Gvisor tier)",
    },
    Package {
        name: "debootstrap",
        optional: false,
        purpose: "builds the sandbox-rs/python:3.11 rootfs",
    },
    Package {
        name: "debian-archive-keyring",
        optional: false,
        purpose: "lets debootstrap verify the Debian archive (also on Ubuntu hosts)",
    },
    Package {
        name: "busybox-static",
        optional: false,
        purpose: "the static busybox both test images are built from",
    },
    Package {
        name: "nftables",
        optional: false,
        purpose: "egress allowlists inside sandbox network namespaces",
    },
    Package {
        // Tests only: the ssh:// engine trials start their own sshd on loopback (never the
        // system service; policy-rc.d keeps it stopped in CI) and connect with `ssh`.
        name: "openssh-server",
        optional: false,
        purpose: "the loopback sshd the ssh:// engine tests start",
    },
    Package {
        name: "openssh-client",
        optional: false,
        purpose: "the `ssh` that ssh:// engine endpoints tunnel through",
    },
    Package {
        // The Python wheel's run (`cargo xtask python`): Debian's python3 lacks venv and
        // ensurepip without these.
        name: "python3-venv",
        optional: false,
        purpose: "virtual environments for the Python wheel's conformance run",
    },
    Package {
        name: "python3-pip",
        optional: false,
        purpose: "installs maturin, sandboxio and pytest into those environments",
    },
    Package {
        name: "iproute2",
        optional: false,
        purpose: "`ip netns` / interface inspection for network policy",
    },
];

/// Installs what is missing; returns the outcome line.
pub fn ensure() -> Result<String> {
    let names: Vec<&str> = PACKAGES.iter().map(|p| p.name).collect();
    let present = installed(&names)?;
    let missing: Vec<&Package> = PACKAGES
        .iter()
        .filter(|p| !present.contains(p.name))
        .collect();
    if missing.is_empty() {
        return Ok(format!("all {} present", PACKAGES.len()));
    }
    for package in &missing {
        crate::report::note(
            "setup",
            &format!("missing {}: {}", package.name, package.purpose),
        );
    }
    apt_get(&["update", "-q"])?;
    let mut to_install = Vec::new();
    let mut unavailable = Vec::new();
    for package in missing {
        if package.optional && !has_candidate(package.name)? {
            unavailable.push(package.name);
        } else {
            to_install.push(package.name);
        }
    }
    if !to_install.is_empty() {
        let mut args = vec!["install", "-y", "-q"];
        args.extend(&to_install);
        apt_get(&args)?;
    }
    let still_missing: Vec<&str> = {
        let now = installed(&to_install)?;
        to_install
            .iter()
            .copied()
            .filter(|name| !now.contains(*name))
            .collect()
    };
    if !still_missing.is_empty() {
        bail!("apt-get did not install {}", still_missing.join(", "));
    }
    let mut outcome = if to_install.is_empty() {
        String::from("nothing installable was missing")
    } else {
        format!("installed {}", to_install.join(" "))
    };
    for name in unavailable {
        outcome.push_str(&format!(
            "; {name} has no installation candidate in the apt sources (gVisor unavailable)"
        ));
    }
    Ok(outcome)
}

/// The subset of `names` that dpkg reports as installed.
fn installed(names: &[&str]) -> Result<BTreeSet<String>> {
    // dpkg-query exits 1 when some name is unknown but still prints the known ones.
    let output = process::probe(
        Command::new("dpkg-query")
            .args(["-W", "-f", "${Package} ${Status}\\n"])
            .args(names),
    )?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.ends_with(" install ok installed"))
        .filter_map(|line| line.split_whitespace().next())
        .map(|name| name.split(':').next().unwrap_or(name).to_string())
        .collect())
}

/// Whether the configured apt sources offer `name` (`apt-cache policy` shows a candidate).
fn has_candidate(name: &str) -> Result<bool> {
    let policy = process::stdout_of(Command::new("apt-cache").args(["policy", name]))?;
    Ok(policy.lines().any(|line| {
        line.trim()
            .strip_prefix("Candidate:")
            .is_some_and(|c| c.trim() != "(none)")
    }))
}

fn apt_get(args: &[&str]) -> Result<()> {
    crate::report::note("setup", &format!("apt-get {}", args.join(" ")));
    process::run(
        Command::new("apt-get")
            .args(args)
            // Never prompt (debconf); skip needrestart's service scan, meaningless here.
            .env("DEBIAN_FRONTEND", "noninteractive")
            .env("NEEDRESTART_SUSPEND", "1"),
    )
}
