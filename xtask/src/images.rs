//! The local test images. Each is defined by a recipe in `images/<name>/Dockerfile` that a
//! user builds with their engine (`docker build -t sandbox-rs/busybox:latest
//! images/busybox`, see docs/images.md). No registry is reachable from CI, so `setup`
//! builds the same root filesystems offline from Debian packages on the host and imports
//! them into Docker and Podman with the recipe's own `ENV`, `CMD` and `LABEL` lines (and
//! its files: busybox's `printenv`, `passwd`, `group`), so the two paths cannot drift:
//!
//! - `sandbox-rs/busybox:latest`: the static busybox with every applet linked, plus a
//!   `printenv` (busybox 1.35 lacks that applet) — the "no GNU tools" image the adapters must work with.
//! - `sandbox-rs/python:3.11`: Debian bookworm `minbase` + `python3` via debootstrap, with
//!   busybox applets filling only the gaps (`ip`, `kill`, `ps`, `nc`, `wget`, …; coreutils
//!   stay GNU). The rootfs tarball is cached so the second `setup` does not debootstrap.
//!
//! Each image carries its recipe revision in `org.opencontainers.image.version` (the
//! recipe's label); an image with another revision is rebuilt, one with the current
//! revision is skipped.

use std::fs::{self, File};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::mirror;
use crate::process;
use crate::report::{self, seconds};
use crate::scratch::ScratchDir;

/// Where the Python rootfs tarball is cached between runs.
const CACHE_DIR: &str = "/var/cache/sandbox-rs";

const RECIPE_LABEL: &str = "org.opencontainers.image.version";

/// The recipes, compiled in so `setup` needs no checkout layout at run time.
const BUSYBOX_DOCKERFILE: &str = include_str!("../../images/busybox/Dockerfile");
const PYTHON_DOCKERFILE: &str = include_str!("../../images/python/Dockerfile");

/// A container engine CLI that can import a rootfs tarball.
pub struct Engine {
    /// Name in messages.
    pub name: &'static str,
    /// A `--format` template printing the recipe label (the engines nest labels differently).
    label_format: &'static str,
}

/// Docker.
pub const DOCKER: Engine = Engine {
    name: "docker",
    label_format: "{{index .Config.Labels \"org.opencontainers.image.version\"}}",
};

/// Podman.
pub const PODMAN: Engine = Engine {
    name: "podman",
    label_format: "{{index .Labels \"org.opencontainers.image.version\"}}",
};

/// Both engines, in the order images are imported.
pub const ENGINES: [&Engine; 2] = [&DOCKER, &PODMAN];

impl Engine {
    /// The engine's CLI.
    pub fn cli(&self) -> Command {
        Command::new(self.name)
    }

    /// The recipe revision of the local image `reference`, `None` when it is absent.
    fn recipe_of(&self, reference: &str) -> Result<Option<String>> {
        let output = process::probe(self.cli().args([
            "image",
            "inspect",
            "--format",
            self.label_format,
            reference,
        ]))?;
        Ok(output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string()))
    }

    fn import(&self, tarball: &Path, image: &TestImage) -> Result<()> {
        let mut cmd = self.cli();
        cmd.arg("import");
        for change in image.changes() {
            cmd.arg("--change").arg(change);
        }
        cmd.arg(tarball).arg(image.reference);
        process::stdout_of(&mut cmd).map(drop)
    }
}

/// A test image and how to build its root filesystem.
pub struct TestImage {
    /// The local reference the adapters and contract suite use.
    pub reference: &'static str,
    /// Its recipe, `images/<name>/Dockerfile`.
    dockerfile: &'static str,
    build: fn(rebuild: bool) -> Result<Rootfs>,
}

/// `sandbox-rs/busybox:latest` (images/busybox).
pub const BUSYBOX: TestImage = TestImage {
    reference: "sandbox-rs/busybox:latest",
    dockerfile: BUSYBOX_DOCKERFILE,
    build: build_busybox,
};

/// `sandbox-rs/python:3.11` (images/python).
pub const PYTHON: TestImage = TestImage {
    reference: "sandbox-rs/python:3.11",
    dockerfile: PYTHON_DOCKERFILE,
    build: build_python,
};

/// The image-config instructions (`ENV`, `CMD`, `LABEL`) of a Dockerfile's final stage,
/// continuation lines joined: what `docker import --change` accepts.
fn config_instructions(dockerfile: &str) -> Vec<String> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part.trim_end());
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    let final_stage = logical
        .iter()
        .rposition(|l| l.to_ascii_uppercase().starts_with("FROM "))
        .map_or(0, |i| i + 1);
    logical[final_stage..]
        .iter()
        .filter(|l| {
            let word = l
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            matches!(word.as_str(), "ENV" | "CMD" | "LABEL")
        })
        .cloned()
        .collect()
}

impl TestImage {
    /// The `--change` instructions giving the imported image the recipe's config.
    fn changes(&self) -> Vec<String> {
        config_instructions(self.dockerfile)
    }

    /// The recipe revision: the recipe's `org.opencontainers.image.version` label.
    fn recipe(&self) -> Result<String> {
        self.changes()
            .iter()
            .filter_map(|l| l.strip_prefix("LABEL "))
            .find_map(|l| l.trim().strip_prefix(&format!("{RECIPE_LABEL}=")))
            .map(|v| v.trim_matches('"').to_string())
            .with_context(|| {
                format!(
                    "the recipe of {} has no `LABEL {RECIPE_LABEL}=…`",
                    self.reference
                )
            })
    }
}

/// A rootfs tarball, in a scratch directory (removed with it) or in the cache.
struct Rootfs {
    tarball: PathBuf,
    _scratch: Option<ScratchDir>,
}

/// Imports `image` into each engine that lacks its current recipe.
pub fn ensure(image: &TestImage, rebuild: bool) -> Result<((), String)> {
    let recipe = image.recipe()?;
    let mut stale = Vec::new();
    for engine in ENGINES {
        if rebuild || engine.recipe_of(image.reference)?.as_deref() != Some(recipe.as_str()) {
            stale.push(engine);
        }
    }
    if stale.is_empty() {
        return Ok((
            (),
            format!("present in docker and podman ({recipe}), skipped"),
        ));
    }
    let rootfs = (image.build)(rebuild)?;
    let mut done = Vec::new();
    for engine in stale {
        let start = Instant::now();
        engine
            .import(&rootfs.tarball, image)
            .with_context(|| format!("importing into {}", engine.name))?;
        done.push(format!("{} ({})", engine.name, seconds(start.elapsed())));
    }
    Ok(((), format!("imported into {}", done.join(", "))))
}

fn build_busybox(_rebuild: bool) -> Result<Rootfs> {
    let scratch = ScratchDir::new("busybox")?;
    let root = scratch.path().join("rootfs");
    for dir in ["bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "work"] {
        fs::create_dir_all(root.join(dir))?;
    }
    for dir in ["tmp", "var/tmp"] {
        make_sticky_dir(&root.join(dir))?;
    }
    let busybox = static_busybox()?;
    install_executable(&busybox, &root.join("bin/busybox"))?;
    let linked = link_applets(&root, "/bin/busybox", |_| true)?;
    fs::write(root.join("usr/bin/printenv"), PRINTENV)?;
    fs::set_permissions(
        root.join("usr/bin/printenv"),
        fs::Permissions::from_mode(0o755),
    )?;
    fs::write(root.join("etc/passwd"), PASSWD)?;
    fs::write(root.join("etc/group"), GROUP)?;
    report::note(
        "setup",
        &format!("busybox rootfs: {linked} applets + printenv"),
    );
    let tarball = scratch.path().join("rootfs.tar");
    tar(&root, &tarball)?;
    Ok(Rootfs {
        tarball,
        _scratch: Some(scratch),
    })
}

fn build_python(rebuild: bool) -> Result<Rootfs> {
    let cached = Path::new(CACHE_DIR).join(format!("{}.tar", PYTHON.recipe()?));
    if cached.is_file() && !rebuild {
        report::note(
            "setup",
            &format!("python rootfs from cache {}", cached.display()),
        );
        return Ok(Rootfs {
            tarball: cached,
            _scratch: None,
        });
    }
    let scratch = ScratchDir::new("python")?;
    let root = scratch.path().join("rootfs");
    debootstrap(&root)?;
    add_busybox_gaps(&root)?;
    if fs::symlink_metadata(root.join("usr/bin/python")).is_err() {
        symlink("python3", root.join("usr/bin/python"))?;
    }
    fs::create_dir_all(root.join("work"))?;
    make_sticky_dir(&root.join("tmp"))?;
    trim(&root)?;
    fs::create_dir_all(CACHE_DIR)?;
    let partial = cached.with_extension("tar.partial");
    tar(&root, &partial)?;
    fs::rename(&partial, &cached)?;
    Ok(Rootfs {
        tarball: cached,
        _scratch: Some(scratch),
    })
}

/// `debootstrap --variant=minbase --include=python3 bookworm`. Not `python3-minimal` alone:
/// that lacks `json`, `codeop` and `shutil`, which interpreter drivers need; `python3` adds
/// the full standard library for ~25 MB.
fn debootstrap(root: &Path) -> Result<()> {
    let (mirror, origin) = mirror::debian_mirror();
    let log_path = Path::new("/var/log/sandbox-rs-debootstrap.log");
    report::note(
        "setup",
        &format!(
            "debootstrap {} from {mirror} ({origin}); 30-60 s, log {}",
            mirror::SUITE,
            log_path.display()
        ),
    );
    let log = File::create(log_path)?;
    let status = Command::new("debootstrap")
        .args(["--variant=minbase", "--include=python3", mirror::SUITE])
        .arg(root)
        .arg(&mirror)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .context("cannot run debootstrap")?;
    if !status.success() {
        bail!(
            "debootstrap failed ({status}); last lines of {}:\n{}",
            log_path.display(),
            process::log_tail(log_path, 20)
        );
    }
    Ok(())
}

/// Links the busybox applets the Debian rootfs lacks, never shadowing a Debian tool.
fn add_busybox_gaps(root: &Path) -> Result<()> {
    install_executable(&static_busybox()?, &root.join("usr/bin/busybox"))?;
    let path_dirs = [
        "usr/local/sbin",
        "usr/local/bin",
        "usr/sbin",
        "usr/bin",
        "sbin",
        "bin",
    ];
    let linked = link_applets(root, "/usr/bin/busybox", |name| {
        // lstat: rootfs symlinks may be absolute and must not resolve against the host.
        path_dirs
            .iter()
            .all(|dir| fs::symlink_metadata(root.join(dir).join(name)).is_err())
    })?;
    report::note(
        "setup",
        &format!("python rootfs: {linked} busybox applets fill gaps"),
    );
    Ok(())
}

/// Debootstrap leaves ~130 MB of apt caches, indexes and docs no sandbox needs; dropping
/// them halves the import time.
fn trim(root: &Path) -> Result<()> {
    for dir in [
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
    ] {
        empty_dir(&root.join(dir))?;
    }
    let archives = root.join("var/cache/apt/archives");
    if let Ok(entries) = fs::read_dir(&archives) {
        for entry in entries.flatten() {
            if entry.path().extension().is_some_and(|e| e == "deb") {
                fs::remove_file(entry.path())?;
            }
        }
    }
    for cache in [
        "var/cache/apt/pkgcache.bin",
        "var/cache/apt/srcpkgcache.bin",
    ] {
        let _ = fs::remove_file(root.join(cache));
    }
    Ok(())
}

fn empty_dir(dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            fs::remove_dir_all(&path)?;
        } else {
            fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Symlinks each applet from `busybox --list-full` (e.g. `sbin/ip`, `usr/bin/env`) to
/// `target` where `wanted(name)`; returns how many were linked.
fn link_applets(root: &Path, target: &str, wanted: impl Fn(&str) -> bool) -> Result<usize> {
    let list = process::stdout_of(Command::new(static_busybox()?).arg("--list-full"))?;
    let mut linked = 0;
    for entry in list.lines() {
        // Entries are relative paths; skip the odd top-level ones (`linuxrc`).
        let Some((_, name)) = entry.rsplit_once('/') else {
            continue;
        };
        let link = root.join(entry);
        if !wanted(name) || fs::symlink_metadata(&link).is_ok() {
            continue;
        }
        if let Some(dir) = link.parent() {
            fs::create_dir_all(dir)?;
        }
        symlink(target, &link)?;
        linked += 1;
    }
    Ok(linked)
}

/// The host's busybox, which must be the static build (it runs inside images without libc).
fn static_busybox() -> Result<PathBuf> {
    let path = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("no busybox binary; install busybox-static")?;
    if has_program_interpreter(&fs::read(&path)?) {
        bail!(
            "{} is dynamically linked; install busybox-static (apt-get install -y busybox-static)",
            path.display()
        );
    }
    Ok(path)
}

/// Whether an ELF64 little-endian image has a PT_INTERP header, i.e. is dynamically linked.
fn has_program_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| {
        elf.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..phnum).any(|i| {
        elf.get(phoff + i * phentsize..phoff + i * phentsize + 4)
            .is_some_and(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == PT_INTERP)
    })
}

fn install_executable(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to).with_context(|| format!("cannot copy {}", from.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn make_sticky_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// Tars `root` with numeric root ownership. /dev, /proc and /sys contents are left out: the
/// engines mount their own, and debootstrap's device nodes have no place in an image.
fn tar(root: &Path, tarball: &Path) -> Result<()> {
    process::run(
        Command::new("tar")
            .arg("-C")
            .arg(root)
            .args([
                "--numeric-owner",
                "--exclude=./dev/*",
                "--exclude=./proc/*",
                "--exclude=./sys/*",
                "-cf",
            ])
            .arg(tarball)
            .arg("."),
    )
}

/// busybox 1.35 has no `printenv` applet; the contract probes use it. Same contract as GNU
/// printenv: all variables without arguments, else each named value, exit 1 if any is unset.
/// The recipe's own file, so both build paths install the same script.
const PRINTENV: &str = include_str!("../../images/busybox/printenv");

const PASSWD: &str = include_str!("../../images/busybox/passwd");
const GROUP: &str = include_str!("../../images/busybox/group");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_test_binary_is_dynamically_linked() {
        let exe = fs::read(std::env::current_exe().unwrap()).unwrap();
        // Rust test binaries on glibc targets link dynamically.
        assert!(has_program_interpreter(&exe));
        assert!(!has_program_interpreter(b"not an elf"));
    }

    const PATH: &str = "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

    #[test]
    fn image_config_comes_from_the_recipes_final_stage() {
        let changes = PYTHON.changes();
        assert!(changes.contains(&PATH.to_string()), "{changes:?}");
        assert!(changes.contains(&"ENV LANG=C.UTF-8".to_string()));
        assert!(changes.contains(&r#"CMD ["python3"]"#.to_string()));
        assert_eq!(PYTHON.recipe().unwrap(), "python-3.11-bookworm-r1");
        let busybox = BUSYBOX.changes();
        assert!(
            busybox.contains(&r#"CMD ["sh"]"#.to_string()),
            "{busybox:?}"
        );
        assert!(busybox.contains(&PATH.to_string()));
        assert_eq!(BUSYBOX.recipe().unwrap(), "busybox-r1");
        // Nothing of the build stage leaks into the image config.
        assert!(busybox.iter().all(|c| !c.contains("apt-get")));
    }

    #[test]
    fn continuation_lines_and_comments_are_handled() {
        let df = "FROM a AS b\nENV X=1\nFROM scratch\n# c\nENV A=1 \\\n    B=2\nRUN x\nLABEL k=\"v w\"\n";
        assert_eq!(
            config_instructions(df),
            vec!["ENV A=1 B=2".to_string(), "LABEL k=\"v w\"".to_string()]
        );
    }

    #[test]
    fn recipes_name_the_references_setup_imports() {
        for image in [&BUSYBOX, &PYTHON] {
            let title = format!("LABEL org.opencontainers.image.title={}", image.reference);
            assert!(image.changes().contains(&title), "{}", image.reference);
        }
    }
}
