//! The `/etc/hosts` an egress sandbox sees on an engine that would otherwise copy the
//! host's own file into the container (Podman does: its base hosts file is the host's
//! `/etc/hosts`).
//!
//! A name in the copied file resolves inside without a DNS query, so the library's
//! resolver never pins its address and the rules reject the connect; and every private
//! name of the host leaks into the sandbox. Such an engine mounts this file instead,
//! read-only: loopback names only, everything else through the resolver, where the
//! allowlist decides. Nothing written into a hosts file inside can open an address: the
//! rules accept only what the resolver pinned or the policy lists by address.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// Where the file lives on the host (under `/run`: cleared at boot, root's).
pub const HOSTS_FILE: &str = "/run/sandbox-rs/egress-hosts";

/// What the file says: loopback names only.
pub const HOSTS_TEXT: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

/// Writes [`HOSTS_FILE`] unless it already holds [`HOSTS_TEXT`] (mode 0644, written
/// aside and renamed into place, so a container mounting it never sees half a file).
pub fn ensure_hosts_file() -> std::io::Result<&'static Path> {
    let path = Path::new(HOSTS_FILE);
    if std::fs::read_to_string(path).is_ok_and(|t| t == HOSTS_TEXT) {
        return Ok(path);
    }
    let dir = path.parent().unwrap_or(Path::new("/run"));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".egress-hosts.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(HOSTS_TEXT.as_bytes())?;
    f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(path)
}
