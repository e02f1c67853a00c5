//! Every async method of the public surface has a blocking twin in `sandbox::blocking`.
//!
//! The async surface is read from the sources (the core traits and `Process`, and the
//! facade's free functions), so adding an async method without its twin fails here.

use std::path::{Path, PathBuf};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn core_src(file: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../sandbox-core/src")
        .join(file);
    read(&p)
}

fn own_src(file: &str) -> String {
    read(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("src")
            .join(file),
    )
}

/// The brace-delimited body that follows the first occurrence of `header`.
fn block_after<'a>(src: &'a str, header: &str) -> &'a str {
    let start = src
        .find(header)
        .unwrap_or_else(|| panic!("`{header}` not found"));
    let open = start + src[start..].find('{').expect("opening brace");
    let mut depth = 0usize;
    for (i, c) in src[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &src[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces after `{header}`")
}

/// Names following `marker` (e.g. `async fn `), in order.
fn names_after(body: &str, marker: &str) -> Vec<String> {
    body.match_indices(marker)
        .map(|(i, _)| {
            body[i + marker.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

fn blocking_methods(header: &str) -> Vec<String> {
    names_after(block_after(&own_src("blocking.rs"), header), "pub fn ")
}

fn assert_twins(what: &str, async_methods: &[String], twins: &[String]) {
    assert!(
        !async_methods.is_empty(),
        "{what}: no async methods found; has the source layout changed?"
    );
    let missing: Vec<&String> = async_methods
        .iter()
        .filter(|m| !twins.contains(m))
        .collect();
    assert!(
        missing.is_empty(),
        "{what}: async methods without a blocking twin in sandbox::blocking: {missing:?}"
    );
}

#[test]
fn sandbox_trait_methods_have_blocking_twins() {
    let src = core_src("sandbox.rs");
    let mut methods = names_after(block_after(&src, "pub trait Sandbox:"), "async fn ");
    methods.extend(names_after(
        block_after(&src, "pub trait SandboxExt:"),
        "async fn ",
    ));
    // `stream` is a plain fn returning a Process; it is part of the surface too.
    methods.push("stream".into());
    assert_twins("Sandbox", &methods, &blocking_methods("impl Sandbox {"));
}

#[test]
fn filesystem_trait_methods_have_blocking_twins() {
    let src = core_src("files.rs");
    let methods = names_after(block_after(&src, "pub trait FileSystem:"), "async fn ");
    assert_twins(
        "FileSystem",
        &methods,
        &blocking_methods("impl<'a> FileSystem<'a> {"),
    );
}

#[test]
fn process_methods_have_blocking_twins() {
    let src = core_src("process.rs");
    let methods = names_after(block_after(&src, "impl Process {"), "pub async fn ");
    assert_twins("Process", &methods, &blocking_methods("impl Process {"));
}

#[test]
fn backend_trait_methods_have_blocking_twins() {
    let src = core_src("backend.rs");
    let mut methods = names_after(block_after(&src, "pub trait Backend:"), "async fn ");
    methods.extend(names_after(
        block_after(&src, "pub trait ReapableBackend:"),
        "async fn ",
    ));
    assert_twins("Backend", &methods, &blocking_methods("impl Backend {"));
}

#[test]
fn facade_functions_have_blocking_twins() {
    let lib = own_src("lib.rs");
    let methods = names_after(&lib, "pub async fn ");
    let twins = names_after(&own_src("blocking.rs"), "\npub fn ");
    assert_twins("facade", &methods, &twins);
}

#[test]
fn scanner_finds_a_missing_twin() {
    // The checker itself must be able to fail.
    let r = std::panic::catch_unwind(|| {
        assert_twins("probe", &["nope".to_string()], &["run".to_string()]);
    });
    assert!(r.is_err());
}
