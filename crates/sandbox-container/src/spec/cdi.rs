//! Devices named by the Container Device Interface (CDI, `vendor/class=name`, e.g.
//! `nvidia.com/gpu=0`): names checked, and refused unless the host has a CDI spec, before
//! anything is created. Engines that take CDI devices (Podman's
//! `PodmanOptions::cdi_device`) validate through here.

use std::path::Path;

use sandbox_core::{Result, SandboxError};

/// Directories where CDI device specs live (checked before a CDI device is requested).
pub const CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// Checks every device name, and that `spec_dirs` hold a CDI spec when any is named.
pub fn validate(devices: &[String], spec_dirs: &[&Path]) -> Result<()> {
    for d in devices {
        validate_name(d)?;
    }
    if !devices.is_empty() && !host_has_specs(spec_dirs) {
        return Err(SandboxError::config(
            "a CDI GPU device was requested but this host has no CDI specs in /etc/cdi or /var/run/cdi",
            "generate one, e.g. `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`, or drop cdi_device",
        ));
    }
    Ok(())
}

fn validate_name(d: &str) -> Result<()> {
    // vendor/class=name, e.g. nvidia.com/gpu=0 or nvidia.com/gpu=all
    let ok = d.len() <= 253
        && d.split_once('=').is_some_and(|(kind, name)| {
            kind.split_once('/').is_some_and(|(vendor, class)| {
                !vendor.is_empty()
                    && !class.is_empty()
                    && vendor
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c))
                    && class
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c))
            }) && !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
        });
    if !ok {
        return Err(SandboxError::config(
            format!(
                "{:?} is not a CDI device name",
                d.chars().take(64).collect::<String>()
            ),
            "use vendor/class=name, e.g. nvidia.com/gpu=0",
        ));
    }
    Ok(())
}

/// Whether any of `dirs` holds a CDI spec file (`*.json`, `*.yaml`, `*.yml`).
pub fn host_has_specs(dirs: &[&Path]) -> bool {
    dirs.iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|rd| {
            rd.flatten().any(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.ends_with(".json") || n.ends_with(".yaml") || n.ends_with(".yml")
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_vendor_class_equals_name_and_need_a_spec() {
        let none: [&Path; 0] = [];
        assert!(validate(&[], &none).is_ok());
        for ok in ["nvidia.com/gpu=0", "nvidia.com/gpu=all", "a-b.c/x_y=d:e"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "gpu",
            "nvidia.com/gpu",
            "/gpu=0",
            "nvidia.com/=0",
            "a/b=",
            "a/b=c;rm",
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        let e = validate(&["nvidia.com/gpu=0".into()], &none).unwrap_err();
        assert!(e.to_string().contains("no CDI specs"), "{e}");
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("nvidia.yaml"), "cdiVersion: 0.5.0").unwrap();
        assert!(validate(&["nvidia.com/gpu=0".into()], &[d.path()]).is_ok());
    }
}
