//! Killing what one exec started, and nothing else, from a second exec.
//!
//! [`KILL_SCRIPT`] runs in the sandbox (busybox `sh` and `grep` suffice). It collects, until
//! nothing new turns up, every process that
//! - carries the exec's token in its environment (children inherit it, so background
//!   children, `setsid` and double-forked descendants re-parented to PID 1 are found), or
//! - is the exec's root process, in its process group or session, or a descendant of a
//!   process already collected (so a child that cleared its environment is still found
//!   while its parent lives),
//!
//! stopping each one as it is found (a stopped process cannot fork a new one past the
//! scan), then kills them all with SIGKILL. PID 1 (the sandbox's init, whose end ends the
//! sandbox) and the script itself are never targeted, whatever the sandbox wrote where.
//! The root pid is only used while the engine still reports the exec running, so a reused
//! pid is never hit; the token needs no such check.
//!
//! Not contained (documented in docs/security.md): a descendant that both cleared its
//! environment and was re-parented away from the exec's tree, group and session before the
//! kill. The in-sandbox agent (PID 1) closes that gap.

/// `sh -c KILL_SCRIPT sbx-kill <root pid or 0> <token>`.
pub const KILL_SCRIPT: &str = r#"root=$1; tok="SBX_EXEC=$2"; me=$$; found=" "
case "$root" in ''|*[!0-9]*) root=0;; esac
case "$2" in ''|*[!0-9a-f]*) exit 2;; esac
add() {
  case "$found" in *" $1 "*) return 1;; esac
  found="$found$1 "; kill -STOP "$1" 2>/dev/null; return 0
}
i=0
while [ $i -lt 32 ]; do
  i=$((i+1)); new=0
  for f in $(grep -lF "$tok" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    if [ "$p" = 1 ] || [ "$p" = "$me" ]; then continue; fi
    add "$p" && new=1
  done
  for s in /proc/[0-9]*/stat; do
    p=${s#/proc/}; p=${p%/stat}
    if [ "$p" = 1 ] || [ "$p" = "$me" ]; then continue; fi
    l=; read -r l 2>/dev/null < "$s" || continue
    set -- ${l##*) }
    hit=0
    case "$found" in *" $2 "*) hit=1;; esac
    if [ "$root" != 0 ]; then
      if [ "$p" = "$root" ] || [ "$3" = "$root" ] || [ "$4" = "$root" ]; then hit=1; fi
    fi
    if [ $hit = 1 ]; then add "$p" && new=1; fi
  done
  [ $new = 0 ] && break
done
for p in $found; do kill -KILL "$p" 2>/dev/null; done
exit 0"#;

/// The kill helper's argv.
pub(crate) fn kill_argv(root: Option<u32>, token: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        KILL_SCRIPT.into(),
        "sbx-kill".into(),
        root.unwrap_or(0).to_string(),
        token.into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_script_never_targets_pid_1_or_itself() {
        assert!(KILL_SCRIPT.contains(r#"if [ "$p" = 1 ] || [ "$p" = "$me" ]; then continue; fi"#));
        assert!(
            !KILL_SCRIPT.contains("kill -KILL -"),
            "no group kill of a sandbox-chosen id"
        );
        assert!(!KILL_SCRIPT.contains("/dev/shm"), "no pidfile");
    }

    #[test]
    fn kill_argv_passes_values_as_arguments() {
        let a = kill_argv(Some(42), "00ff00ff00ff00ff");
        assert_eq!(&a[3..], &["sbx-kill", "42", "00ff00ff00ff00ff"]);
        assert_eq!(kill_argv(None, "ab")[4], "0");
    }

    /// Runs the script with a host `sh` against a real process tree: a background child
    /// and a `setsid`-style re-parented grandchild carrying the token die, an unrelated
    /// process does not.
    #[test]
    fn kill_script_kills_token_and_tree_but_not_strangers() {
        use std::process::{Command, Stdio};
        if !std::path::Path::new("/proc/self/environ").exists() {
            return;
        }
        let token = crate::sandbox::exec::new_token();
        // `sh -c 'sleep 301 & sleep 302 & (sleep 303 &) ; sleep 304'` with the token in env.
        let mut tree = Command::new("sh")
            .args([
                "-c",
                "sleep 301 & sleep 302 & (sleep 303 &); exec sleep 304",
            ])
            .env("SBX_EXEC", &token)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut stranger = Command::new("sleep").arg("305").spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let root = tree.id();
        let status = Command::new("sh")
            .args(kill_argv(Some(root), &token)[1..].iter())
            .env_remove("SBX_EXEC")
            .status()
            .unwrap();
        assert!(status.success());
        let _ = tree.wait();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let survivors: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let env = std::fs::read(e.path().join("environ")).ok()?;
                let needle = format!("SBX_EXEC={token}");
                let has = env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes());
                let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                (has && !stat.contains(") Z "))
                    .then(|| e.file_name().to_string_lossy().into_owned())
            })
            .collect();
        assert!(
            survivors.is_empty(),
            "processes with the token survived: {survivors:?}"
        );
        assert!(
            stranger.try_wait().unwrap().is_none(),
            "an unrelated process was killed"
        );
        let _ = stranger.kill();
        let _ = stranger.wait();
    }
}
