//! Where the deadline in force of each sandbox is kept for every process on this host:
//! one file per sandbox, `/run/sandbox-rs/deadline/<container id>`, holding the deadline
//! in whole Unix seconds, in a directory only root can write.
//!
//! A container's labels cannot change after create, and anything inside the sandbox (the
//! agent, a file) is in reach of root inside, so neither can tell another process that a
//! deadline moved: the creating process's host-side timer (a CLI session's holder, an MCP
//! server) would remove a sandbox another process extended at its old deadline, and a
//! handle reattached with `connect` would not know the deadline it should give a
//! restarted agent. `Sandbox::extend` writes the moved deadline here, from any process;
//! the deadline timers read it before they remove anything, reattached handles read it
//! when they connect and start, and `list_managed` reports it.
//!
//! A record only ever moves later (extensions only add time), and a reader never takes
//! one past the sandbox's labelled maximum (`io.sandbox-rs.max-deadline`): a damaged
//! record cannot keep a sandbox longer than an extension could. The record goes with the
//! sandbox (every removal through this crate forgets it), and the sweep drops records
//! past their deadline (a sandbox removed by other means).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The directory of every sandbox's recorded deadline on this host.
pub(crate) const RECORD_DIR: &str = "/run/sandbox-rs/deadline";

/// The recorded deadlines in one directory (tests use their own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deadlines {
    dir: PathBuf,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines::in_dir(Path::new(RECORD_DIR))
    }
}

/// Whole Unix seconds of `t`, rounded up (a deadline is never recorded earlier than set).
fn secs_up(t: SystemTime) -> u64 {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl Deadlines {
    pub(crate) fn in_dir(dir: &Path) -> Deadlines {
        Deadlines {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, id: &str, ext: &str) -> Option<PathBuf> {
        // A container id is hex; anything else could walk out of the directory.
        let safe: String = id.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        (!safe.is_empty()).then(|| self.dir.join(format!("{safe}{ext}")))
    }

    /// The deadline recorded for sandbox `id`, never later than `max` (its labelled
    /// maximum); `None` when none is recorded or the record is unreadable.
    pub(crate) fn recorded(&self, id: &str, max: SystemTime) -> Option<SystemTime> {
        let text = std::fs::read_to_string(self.path(id, "")?).ok()?;
        let secs: u64 = text.trim().parse().ok()?;
        Some((UNIX_EPOCH + Duration::from_secs(secs)).min(max))
    }

    /// Records `deadline` for sandbox `id`, unless a later one is recorded already.
    /// Written aside and renamed into place: a reader never sees half a record.
    pub(crate) fn record(&self, id: &str, deadline: SystemTime) -> Result<(), String> {
        let (Some(path), Some(tmp)) = (self.path(id, ""), self.path(id, ".tmp")) else {
            return Err(format!("`{id}` is not a container id"));
        };
        let secs = secs_up(deadline);
        let run = || -> std::io::Result<()> {
            if let Ok(old) = std::fs::read_to_string(&path)
                && old.trim().parse::<u64>().is_ok_and(|o| o >= secs)
            {
                return Ok(());
            }
            std::fs::create_dir_all(&self.dir)?;
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))?;
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(secs.to_string().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        run().map_err(|e| {
            format!(
                "recording the deadline of {id} in {}: {e}",
                self.dir.display()
            )
        })
    }

    /// Removes every record of a deadline before `before`: a sandbox past its recorded
    /// deadline is over, so such a record moves nothing, and one whose sandbox was
    /// removed outside this crate would otherwise stay.
    pub(crate) fn prune_past(&self, before: SystemTime) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let limit = before
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        for entry in dir.filter_map(|e| e.ok()) {
            let path = entry.path();
            let past = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .is_some_and(|s| s < limit);
            if past {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Removes the record of sandbox `id` (it is gone; none is fine).
    pub(crate) fn forget(&self, id: &str) {
        for ext in ["", ".tmp"] {
            if let Some(p) = self.path(id, ext) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn a_record_moves_only_later_and_never_past_the_maximum() {
        let dir = std::env::temp_dir().join(format!("sbx-deadlines-{}", std::process::id()));
        let d = Deadlines::in_dir(&dir);
        let max = at(2_000);
        assert_eq!(d.recorded("abc1", max), None);
        d.record("abc1", at(1_000) + Duration::from_millis(1))
            .unwrap();
        assert_eq!(d.recorded("abc1", max), Some(at(1_001)), "rounded up");
        d.record("abc1", at(900)).unwrap();
        assert_eq!(d.recorded("abc1", max), Some(at(1_001)), "never earlier");
        d.record("abc1", at(5_000)).unwrap();
        assert_eq!(d.recorded("abc1", max), Some(max), "clamped to the maximum");
        // Another sandbox's record is its own; a path-like id stays in the directory.
        assert_eq!(d.recorded("abc2", max), None);
        assert!(d.path("../x", "").unwrap().starts_with(&dir));
        assert!(d.record("../", at(1)).is_err());
        d.forget("abc1");
        assert_eq!(d.recorded("abc1", max), None);
        // Records past their deadline go; later ones stay.
        d.record("old1", at(100)).unwrap();
        d.record("new1", at(1_000)).unwrap();
        d.prune_past(at(500));
        assert_eq!(d.recorded("old1", max), None);
        assert_eq!(d.recorded("new1", max), Some(at(1_000)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
