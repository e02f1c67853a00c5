//! `examples/third-party-engine` is a crate outside the workspace implementing
//! `ContainerEngine` from the published API alone. Nothing else compiles
//! it, so an API change that breaks third-party engines would go unnoticed: this test
//! builds it (library and its contract test target) and fails when it does not compile.
//!
//! It reuses the workspace's target directory so the shared crates are not rebuilt, and
//! runs cargo `--offline --locked`: tests never reach a registry, and the example's
//! committed lockfile is what a third party would pin.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The workspace's target dir: `CARGO_TARGET_DIR` when set, else `<root>/target`.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

#[test]
fn third_party_engine_example_builds_from_the_public_api() {
    let root = workspace_root();
    let manifest = root.join("examples/third-party-engine/Cargo.toml");
    assert!(manifest.is_file(), "{} is missing", manifest.display());
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "--offline",
            "--locked",
            "--all-targets",
            "--manifest-path",
        ])
        .arg(&manifest)
        // No RUSTFLAGS here: they are part of every artifact's fingerprint, and a
        // different value would rebuild the whole dependency tree.
        .env("CARGO_TARGET_DIR", target_dir(&root))
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "building {} failed (after a workspace dependency change, refresh its lockfile: \
         `cargo update --offline --workspace --manifest-path {}`):\n{}",
        manifest.display(),
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The README's "Writing an adapter" walk-through is not compiled on its own (the root
/// README is no crate's doc); each of its Rust blocks must appear in the example (whitespace aside),
/// which the test above compiles, so the walk-through cannot rot.
#[test]
fn readme_walkthrough_is_the_compiled_example() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let example: String = ["src/lib.rs", "tests/contract.rs"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(root.join("examples/third-party-engine").join(f))
                .unwrap_or_else(|e| panic!("read the example's {f}: {e}"))
        })
        .collect();
    let section = readme
        .split("\n## Writing an adapter")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README has a `## Writing an adapter` section");
    let blocks: Vec<&str> = section
        .split("```rust")
        .skip(1)
        .filter_map(|b| b.split_once('\n').map(|(_, body)| body))
        .filter_map(|b| b.split("```").next())
        .collect();
    assert!(!blocks.is_empty(), "the section has no rust block");
    let normalize = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let example = normalize(&example);
    for block in blocks {
        // `// …` lines mark omitted code; every run of lines between them must be in the
        // example.
        for part in block.split("// …") {
            let part = normalize(part);
            assert!(
                part.is_empty() || example.contains(&part),
                "README block not in examples/third-party-engine (src/lib.rs, tests/contract.rs):\n{part}"
            );
        }
    }
}
