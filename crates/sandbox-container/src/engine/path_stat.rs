//! [`PathStat`]: what an engine knows about one path inside a container without running
//! anything in it, and the two encodings the Docker-style archive API reports it in (a Go
//! `os.FileMode`, inside a base64 JSON header). Read once here, so every engine reports
//! the same mode bits for the same file.

use std::time::SystemTime;

use serde::Deserialize;

/// What the engine knows about one path inside a container without running anything in
/// it (Docker's and Podman's archive `HEAD`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathStat {
    /// Size in bytes.
    pub size: u64,
    /// Unix permission bits, including setuid/setgid/sticky (`0o7777`).
    pub mode: u32,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Last modification time, when the engine reports one.
    pub modified: Option<SystemTime>,
    /// The target, when the path is a symbolic link.
    pub link_target: Option<String>,
}

/// Go's `os.FileMode` bits that are not the 9 permission bits (`io/fs` constants).
const GO_DIR: u32 = 1 << 31;
const GO_SETUID: u32 = 1 << 23;
const GO_SETGID: u32 = 1 << 22;
const GO_STICKY: u32 = 1 << 20;

/// The archive stat header's JSON (`X-Docker-Container-Path-Stat`).
#[derive(Deserialize)]
struct HeaderJson {
    size: i64,
    mode: u32,
    #[serde(default)]
    mtime: String,
    #[serde(rename = "linkTarget", default)]
    link_target: String,
}

impl PathStat {
    /// A stat record without modification time or link target.
    pub fn new(size: u64, mode: u32, is_dir: bool) -> Self {
        PathStat {
            size,
            mode,
            is_dir,
            modified: None,
            link_target: None,
        }
    }

    /// A stat record from a Go `os.FileMode`, what Docker-style engines report: the setuid,
    /// setgid and sticky bits live at Go's own positions, not at `0o7000`, so masking the
    /// raw value with `0o7777` would silently drop them.
    pub fn from_go_mode(size: u64, go_mode: u32) -> Self {
        let mut mode = go_mode & 0o777;
        for (go, unix) in [
            (GO_SETUID, 0o4000),
            (GO_SETGID, 0o2000),
            (GO_STICKY, 0o1000),
        ] {
            if go_mode & go != 0 {
                mode |= unix;
            }
        }
        PathStat::new(size, mode, go_mode & GO_DIR != 0)
    }

    /// The archive `HEAD`'s `X-Docker-Container-Path-Stat` header: base64 of JSON (the
    /// URL-safe alphabet in Docker's API, the standard one from some engines, padded or
    /// not). `None` when it is neither.
    pub fn from_archive_header(header: &[u8]) -> Option<PathStat> {
        use base64::Engine as _;
        use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
        let cfg =
            GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
        let json = [base64::alphabet::URL_SAFE, base64::alphabet::STANDARD]
            .iter()
            .find_map(|a| GeneralPurpose::new(a, cfg).decode(header.trim_ascii()).ok())?;
        let h: HeaderJson = serde_json::from_slice(&json).ok()?;
        let mut stat = PathStat::from_go_mode(u64::try_from(h.size).unwrap_or(0), h.mode);
        stat.modified = crate::parse_rfc3339(&h.mtime);
        stat.link_target = Some(h.link_target).filter(|t| !t.is_empty());
        Some(stat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_mode_bits_move_to_unix_positions() {
        let m = |go| {
            let s = PathStat::from_go_mode(0, go);
            (s.mode, s.is_dir)
        };
        assert_eq!(m(0o755 | GO_DIR), (0o755, true));
        assert_eq!(m(0o777 | GO_DIR | GO_STICKY), (0o1777, true));
        assert_eq!(m(0o755 | GO_SETUID), (0o4755, false));
        assert_eq!(m(0o755 | GO_SETGID), (0o2755, false));
        // A symlink's Go bit (1 << 27) is neither a directory nor a permission.
        assert_eq!(m(0o777 | 1 << 27), (0o777, false));
    }

    #[test]
    fn reads_the_archive_header_in_both_alphabets() {
        let h = b"eyJuYW1lIjoicGFzc3dkIiwic2l6ZSI6ODIsIm1vZGUiOjQyMCwibXRpbWUiOiIyMDI2LTExLTI5VDIyOjUwOjA5WiIsImlzRGlyIjpmYWxzZSwibGlua1RhcmdldCI6Ii9ldGMvcGFzc3dkIn0=";
        let s = PathStat::from_archive_header(h).unwrap();
        assert_eq!((s.size, s.mode, s.is_dir), (82, 0o644, false));
        assert_eq!(s.link_target.as_deref(), Some("/etc/passwd"));
        let t = s.modified.unwrap();
        let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs, 1_795_992_609);
        let unpadded = PathStat::from_archive_header(&h[..h.len() - 1]).unwrap();
        assert_eq!(unpadded, s);
        assert!(PathStat::from_archive_header(b"not base64!").is_none());
        // A directory, encoded with the standard alphabet and padding.
        use base64::Engine as _;
        let dir = br#"{"size":4096,"mode":2147484141,"mtime":"2026-11-29T22:59:12.063721484Z"}"#;
        let std = base64::engine::general_purpose::STANDARD.encode(dir);
        let s = PathStat::from_archive_header(std.as_bytes()).unwrap();
        assert_eq!((s.mode, s.is_dir), (0o755, true));
        assert!(s.modified.is_some() && s.link_target.is_none());
    }
}
