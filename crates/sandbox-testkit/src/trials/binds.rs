//! Host mounts nested below a bind mount's source stay out of the sandbox: a bind mount
//! shares the one filesystem its source lies on, never a tmpfs, disk or share mounted
//! somewhere below it, whose own flags (writable, setuid, devices) the bind's
//! `ro,nosuid,nodev` would not cover. The host fixture ([`NestedHostMount`], mounted with
//! the `mount` command, so the trials need root) and the checks are written once; the
//! adapter creates the sandbox with its own mount option and hands it over.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sandbox_core::{Sandbox, SandboxExt};

/// Where the trials expect the adapter to bind [`NestedHostMount::source`].
pub const TARGET: &str = "/data";

/// The file on the nested tmpfs, and what it holds.
const NESTED: (&str, &str) = ("nested.txt", "on the nested mount");
/// The file in the directory the nested tmpfs covers on the host, and what it holds.
const UNDER: (&str, &str) = ("under.txt", "under the nested mount");

/// A host directory `D` made a shared mount point (as `/` is under systemd, so later host
/// mounts below it would propagate to every peer and slave), holding `under.txt` in
/// `D/sub`, then a tmpfs on `D/sub` holding `nested.txt`. Dropping it (also when a trial
/// fails) unmounts everything it mounted, innermost first, and removes `D`.
pub struct NestedHostMount {
    root: PathBuf,
    /// Mounted by this fixture, in mount order.
    mounted: Vec<PathBuf>,
}

/// Runs `mount args`, panicking with what it said when it fails.
fn mount(args: &[&str]) {
    let out = Command::new("mount")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run mount {args:?}: {e}"));
    assert!(
        out.status.success(),
        "mount {args:?} failed (the nested-mount trials need root): {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// The tmpfs files `dir` holds, as `name:mode:content` (content of regular files only),
/// sorted.
fn listing(dir: &Path) -> BTreeSet<String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .flatten()
        .map(|e| {
            let meta = e.metadata().ok();
            let mode = meta.as_ref().map_or(0, |m| m.permissions().mode());
            let content = std::fs::read_to_string(e.path()).unwrap_or_default();
            format!("{}:{mode:o}:{content}", e.file_name().to_string_lossy())
        })
        .collect()
}

impl NestedHostMount {
    /// Makes the fixture under the temporary directory; `label` tells parallel trials
    /// apart. Panics (after cleaning up) when it cannot mount.
    pub fn new(label: &str) -> NestedHostMount {
        let root = std::env::temp_dir().join(format!(
            "sbx-nested-{label}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        let sub = root.join("sub");
        std::fs::create_dir_all(&sub).expect("fixture directory");
        std::fs::write(sub.join(UNDER.0), UNDER.1).expect("fixture file");
        let mut fixture = NestedHostMount {
            root,
            mounted: Vec::new(),
        };
        let root = fixture.root.to_string_lossy().into_owned();
        mount(&["--bind", &root, &root]);
        fixture.mounted.push(fixture.root.clone());
        mount(&["--make-shared", &root]);
        fixture.mount_tmpfs("sub", NESTED);
        fixture
    }

    /// A tmpfs on `D/name` (created), holding `file`.
    fn mount_tmpfs(&mut self, name: &str, file: (&str, &str)) {
        let at = self.root.join(name);
        std::fs::create_dir_all(&at).expect("mount point");
        mount(&[
            "-t",
            "tmpfs",
            "-o",
            "size=1m,mode=0777",
            "tmpfs",
            &at.to_string_lossy(),
        ]);
        self.mounted.push(at.clone());
        std::fs::write(at.join(file.0), file.1).expect("file on the nested tmpfs");
    }

    /// `D`, the directory to bind at [`TARGET`].
    pub fn source(&self) -> &Path {
        &self.root
    }

    /// What the nested tmpfs holds now.
    fn nested(&self) -> BTreeSet<String> {
        listing(&self.root.join("sub"))
    }
}

impl Drop for NestedHostMount {
    fn drop(&mut self) {
        for at in self.mounted.iter().rev() {
            let unmounted = Command::new("umount")
                .arg(at)
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !unmounted {
                // Busy: detach it now, the kernel frees it when the last user goes.
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(at)
                    .stdin(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// What the sandbox saw and did at [`TARGET`], printed in one exec.
const PROBE: &str = r#"cd /data || exit 9
echo "nested=$(cat sub/nested.txt 2>/dev/null)"
echo "under=$(cat sub/under.txt 2>/dev/null)"
echo pwned > sub/x 2>/dev/null; echo "write=$?"
cp /bin/busybox sub/suid 2>/dev/null && chmod 4755 sub/suid 2>/dev/null; echo "setuid=$?"
mknod sub/null c 1 3 2>/dev/null; echo "mknod=$?"
echo top > x 2>/dev/null; echo "top=$?"
awk '$5 ~ "^/data/" { print "below=" $5 " " $6 }' /proc/self/mountinfo
"#;

/// The value of `key=` in the probe's output (empty when absent).
fn field(out: &str, key: &str) -> String {
    let prefix = format!("{key}=");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_default()
        .to_string()
}

/// Runs the probe, then mounts a second tmpfs on `D/late` on the host and asks whether
/// the sandbox sees it; kills `s`. Returns the probe's output and what the late look
/// printed.
async fn probe(s: &dyn Sandbox, host: &mut NestedHostMount) -> (String, String) {
    let out = s.exec(PROBE).await.expect("probe").stdout_text();
    host.mount_tmpfs("late", ("late.txt", "mounted after start"));
    let late = s
        .exec(
            "cat /data/late/late.txt 2>/dev/null; \
             awk '$5 == \"/data/late\" { print \"mounted\" }' /proc/self/mountinfo",
        )
        .await
        .expect("late probe")
        .stdout_text();
    s.kill().await.expect("kill");
    (out, late)
}

/// What both kinds of bind keep: the nested tmpfs is not visible (its file cannot be
/// read, nothing is mounted below [`TARGET`]), the directory it covers on the host is,
/// nothing the sandbox did reached it, and a host mount made after start stays out.
fn nested_mounts_stayed_out(
    out: &str,
    late: &str,
    host: &NestedHostMount,
    before: &BTreeSet<String>,
) {
    assert_eq!(
        host.nested(),
        *before,
        "sandbox root changed the host mount nested below the bind's source: {out}"
    );
    assert_eq!(
        field(out, "nested"),
        "",
        "the host mount nested below the bind's source is visible in the sandbox: {out}"
    );
    assert!(
        !out.contains("below="),
        "host mounts below the bind's source reached the sandbox: {out}"
    );
    assert_eq!(
        field(out, "under"),
        UNDER.1,
        "the bind shows the source's own filesystem, the directory under the nested mount \
         included: {out}"
    );
    assert_eq!(
        late.trim(),
        "",
        "a host mount made below the source after start reached the sandbox"
    );
}

/// A read-only bind of a directory with a host mount (a writable tmpfs) below it: sandbox
/// root can neither write nor plant a setuid file or a device node anywhere under
/// [`TARGET`], the nested mount is not visible, and the host's nested mount is unchanged.
/// `s` is a sandbox with [`NestedHostMount::source`] bound read-only at [`TARGET`]; the
/// trial kills it.
pub async fn a_read_only_bind_reaches_no_nested_host_mount(
    s: &dyn Sandbox,
    host: &mut NestedHostMount,
) {
    let before = host.nested();
    let (out, late) = probe(s, host).await;
    for key in ["write", "setuid", "mknod", "top"] {
        assert_ne!(
            field(&out, key),
            "0",
            "sandbox root succeeded at {key} through a read-only bind: {out}"
        );
    }
    nested_mounts_stayed_out(&out, &late, host, &before);
}

/// A writable bind of a directory with a host mount below it: what the sandbox writes at
/// the nested mount's path lands in the source's own filesystem (the directory the host
/// mount covers), never on the nested mount, which is not visible and stays unchanged.
/// `s` is a sandbox with [`NestedHostMount::source`] bound writable at [`TARGET`]; the
/// trial kills it.
pub async fn a_writable_bind_reaches_no_nested_host_mount(
    s: &dyn Sandbox,
    host: &mut NestedHostMount,
) {
    let before = host.nested();
    let (out, late) = probe(s, host).await;
    assert_eq!(
        field(&out, "top"),
        "0",
        "the writable bind is writable: {out}"
    );
    nested_mounts_stayed_out(&out, &late, host, &before);
}
