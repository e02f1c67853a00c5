//! `cargo xtask publish-check`: would `cargo publish` of every library crate work, and
//! would it ship what it should and nothing else?
//!
//! Offline and in seconds, so CI runs it on every change:
//! 1. Every workspace package is either publishable under the free `sandbox-rs*` names
//!    (the `sandbox*` names on crates.io belong to other projects) or `publish = false`.
//! 2. Each publishable package has the metadata crates.io and docs.rs use: description,
//!    licence `MIT OR Apache-2.0` with both licence files packaged, repository, readme,
//!    keywords, categories, rust-version, documentation and docs.rs settings for libraries.
//! 3. Path dependencies carry versions (an unversioned dev-dependency is allowed: cargo
//!    drops it from the published manifest) and point at publishable packages.
//! 4. The declared `rust-version` is not below any normal dependency's, nor below 1.88 when
//!    the sources use let chains.
//! 5. `cargo package --workspace --no-verify` packages them all in dependency order.
//! 6. The packaged files: no file that looks like a credential, no secret-shaped string,
//!    no file over 1 MiB except a committed prebuilt binary (8 MiB), no `.crate` over
//!    crates.io's 10 MiB; every `include_bytes!`/`include_str!` path lies inside its own
//!    package (else the published crate cannot compile), and every committed `prebuilt/`
//!    file (the in-sandbox agent binary) is packaged.
//!
//! `--verify` also lets cargo build every packaged crate (what `cargo publish` does before
//! uploading; minutes, not seconds).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::process;

/// The licence every publishable crate carries.
const LICENSE: &str = "MIT OR Apache-2.0";
/// Licence files a publishable crate must package.
const LICENSE_FILES: &[&str] = &["LICENSE-MIT", "LICENSE-APACHE"];
/// The name family that is free on crates.io.
const NAME_FAMILY: &str = "sandbox-rs";
/// Largest packaged file outside `prebuilt/`.
const MAX_FILE: u64 = 1024 * 1024;
/// Largest committed prebuilt binary (the static agent is ~1.5 MiB).
const MAX_PREBUILT: u64 = 8 * 1024 * 1024;
/// crates.io's default upload limit.
const MAX_CRATE: u64 = 10 * 1024 * 1024;
/// The first stable Rust with let chains (`if let … && let …`).
const LET_CHAINS_MSRV: (u64, u64) = (1, 88);

/// Runs every check; fails listing every problem found.
pub fn run(verify: bool) -> Result<()> {
    let meta = metadata()?;
    let packages = workspace_packages(&meta)?;
    let mut problems = Vec::new();
    let publishable: Vec<&Package> = packages.iter().filter(|p| p.publishable).collect();
    for p in &packages {
        problems.extend(naming_problems(p));
    }
    let names: BTreeSet<&str> = publishable.iter().map(|p| p.name.as_str()).collect();
    for p in &publishable {
        problems.extend(metadata_problems(p));
        problems.extend(dependency_problems(p, &packages));
        problems.extend(msrv_problems(p, &meta)?);
    }
    if !problems.is_empty() {
        bail!(
            "publish-check: {} problem(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    package_all(&packages, verify)?;
    let target = PathBuf::from(meta["target_directory"].as_str().unwrap_or("target"));
    let mut rows = Vec::new();
    for p in &publishable {
        let files = packaged_files(p)?;
        problems.extend(content_problems(p, &files));
        let crate_file = target
            .join("package")
            .join(format!("{}-{}.crate", p.name, p.version));
        let crate_size = std::fs::metadata(&crate_file)
            .with_context(|| format!("reading {}", crate_file.display()))?
            .len();
        if crate_size > MAX_CRATE {
            problems.push(format!(
                "{}: the .crate is {} (crates.io takes at most {})",
                p.name,
                size(crate_size),
                size(MAX_CRATE)
            ));
        }
        rows.push(Row::of(p, &files, crate_size));
    }
    print_table(&rows);
    if !problems.is_empty() {
        bail!(
            "publish-check: {} problem(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    println!(
        "publish-check: {} crates publishable ({}) in dependency order",
        names.len(),
        names.iter().copied().collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

/// One workspace package, as `cargo metadata` describes it.
#[derive(Debug, Clone)]
struct Package {
    name: String,
    version: String,
    dir: PathBuf,
    publishable: bool,
    has_lib: bool,
    json: Value,
}

/// `cargo metadata` for this platform only (offline: other platforms' crates may never
/// have been downloaded).
fn metadata() -> Result<Value> {
    let host = host_triple()?;
    let mut cmd = process::cargo();
    cmd.args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &host]);
    let out = process::stdout_of(&mut cmd)?;
    serde_json::from_str(&out).context("parsing cargo metadata")
}

fn host_triple() -> Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = process::stdout_of(Command::new(rustc).arg("-vV"))?;
    out.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("`rustc -vV` names no host")
}

fn workspace_packages(meta: &Value) -> Result<Vec<Package>> {
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .context("metadata without workspace_members")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut out = Vec::new();
    for p in meta["packages"]
        .as_array()
        .context("metadata without packages")?
    {
        if !p["id"].as_str().is_some_and(|id| members.contains(id)) {
            continue;
        }
        let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap_or_default());
        let has_lib = p["targets"].as_array().is_some_and(|ts| {
            ts.iter().any(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "lib"))
            })
        });
        out.push(Package {
            name: p["name"].as_str().unwrap_or_default().to_string(),
            version: p["version"].as_str().unwrap_or_default().to_string(),
            dir: manifest.parent().unwrap_or(Path::new(".")).to_path_buf(),
            // `publish = false` is `[]`; unset is null (any registry).
            publishable: !p["publish"].as_array().is_some_and(Vec::is_empty),
            has_lib,
            json: p.clone(),
        });
    }
    Ok(out)
}

/// A publishable package must be in the free name family.
fn naming_problems(p: &Package) -> Vec<String> {
    let in_family = p.name == NAME_FAMILY || p.name.starts_with(&format!("{NAME_FAMILY}-"));
    if p.publishable && !in_family {
        return vec![format!(
            "{}: publishable under a name outside `{NAME_FAMILY}-*` (the `sandbox*` names on \
             crates.io are other projects'): rename it, or set `publish = false`",
            p.name
        )];
    }
    Vec::new()
}

fn metadata_problems(p: &Package) -> Vec<String> {
    let j = &p.json;
    let mut problems = Vec::new();
    let mut missing = |field: &str, why: &str| {
        problems.push(format!("{}: `{field}` {why}", p.name));
    };
    let text = |field: &str| j[field].as_str().is_some_and(|s| !s.trim().is_empty());
    for field in ["description", "repository", "rust_version"] {
        if !text(field) {
            missing(&field.replace('_', "-"), "is missing");
        }
    }
    if j["license"].as_str() != Some(LICENSE) {
        missing("license", &format!("must be {LICENSE:?}"));
    }
    match j["readme"].as_str() {
        Some(readme) if Path::new(readme).is_file() || p.dir.join(readme).is_file() => {}
        Some(readme) => missing("readme", &format!("names {readme}, which does not exist")),
        None => missing("readme", "is missing"),
    }
    let keywords: Vec<&str> = j["keywords"]
        .as_array()
        .map(|k| k.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if keywords.is_empty() || keywords.len() > 5 {
        missing("keywords", "must list 1 to 5 keywords");
    }
    for k in keywords.iter().filter(|k| !valid_keyword(k)) {
        missing(
            "keywords",
            &format!(
                "has {k:?}: at most 20 ASCII letters, digits, `-` or `_`, starting with a letter"
            ),
        );
    }
    let categories = j["categories"].as_array().map_or(0, Vec::len);
    if categories == 0 || categories > 5 {
        missing("categories", "must list 1 to 5 crates.io categories");
    }
    if p.has_lib {
        if !text("documentation") {
            missing("documentation", "is missing (the docs.rs page)");
        }
        if j["metadata"]["docs"]["rs"].is_null() {
            missing(
                "package.metadata.docs.rs",
                "is missing (which features docs.rs documents)",
            );
        }
    }
    problems
}

/// crates.io's keyword rule.
fn valid_keyword(k: &str) -> bool {
    k.len() <= 20
        && k.starts_with(|c: char| c.is_ascii_alphabetic())
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn dependency_problems(p: &Package, packages: &[Package]) -> Vec<String> {
    let mut problems = Vec::new();
    for d in p.json["dependencies"].as_array().into_iter().flatten() {
        let Some(path) = d["path"].as_str() else {
            continue;
        };
        let name = d["name"].as_str().unwrap_or_default();
        let dev = d["kind"].as_str() == Some("dev");
        let unversioned = d["req"].as_str().is_none_or(|r| r == "*");
        if unversioned && dev {
            // Dropped from the published manifest by cargo: fine for in-repo tests.
            continue;
        }
        if unversioned {
            problems.push(format!(
                "{}: path dependency {name} ({path}) has no version; crates.io needs one",
                p.name
            ));
        }
        let target = packages.iter().find(|q| Path::new(path) == q.dir);
        if target.is_some_and(|q| !q.publishable) {
            problems.push(format!(
                "{}: depends on {name}, which is `publish = false`",
                p.name
            ));
        }
    }
    problems
}

/// `major.minor` of a rust-version.
fn rust_version(v: &str) -> Option<(u64, u64)> {
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().unwrap_or("0").parse().ok()?;
    Some((major, minor))
}

fn msrv_problems(p: &Package, meta: &Value) -> Result<Vec<String>> {
    let Some(declared) = p.json["rust_version"].as_str().and_then(rust_version) else {
        return Ok(Vec::new()); // reported by metadata_problems
    };
    let mut problems = Vec::new();
    for (dep, needs) in normal_dependency_msrvs(p, meta) {
        if needs > declared {
            problems.push(format!(
                "{}: rust-version {}.{} is below {dep}'s {}.{}",
                p.name, declared.0, declared.1, needs.0, needs.1
            ));
        }
    }
    if declared < LET_CHAINS_MSRV
        && let Some(file) = first_let_chain(&p.dir.join("src"))?
    {
        problems.push(format!(
            "{}: rust-version {}.{}, but {} uses let chains (Rust {}.{})",
            p.name,
            declared.0,
            declared.1,
            file.display(),
            LET_CHAINS_MSRV.0,
            LET_CHAINS_MSRV.1
        ));
    }
    Ok(problems)
}

/// The rust-version of every package in `p`'s normal/build dependency closure (as
/// resolved for the workspace), keyed by name.
fn normal_dependency_msrvs(p: &Package, meta: &Value) -> BTreeMap<String, (u64, u64)> {
    let mut by_id: BTreeMap<&str, &Value> = BTreeMap::new();
    for q in meta["packages"].as_array().into_iter().flatten() {
        if let Some(id) = q["id"].as_str() {
            by_id.insert(id, q);
        }
    }
    let mut nodes: BTreeMap<&str, &Value> = BTreeMap::new();
    for n in meta["resolve"]["nodes"].as_array().into_iter().flatten() {
        if let Some(id) = n["id"].as_str() {
            nodes.insert(id, n);
        }
    }
    let mut out = BTreeMap::new();
    let mut stack: Vec<&str> = p.json["id"].as_str().into_iter().collect();
    let mut seen = BTreeSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let Some(node) = nodes.get(id) else { continue };
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null() || k["kind"] == "build");
            if let (true, Some(dep_id)) = (normal, dep["pkg"].as_str()) {
                stack.push(dep_id);
                if let Some(q) = by_id.get(dep_id)
                    && let Some(v) = q["rust_version"].as_str().and_then(rust_version)
                {
                    out.insert(q["name"].as_str().unwrap_or(dep_id).to_string(), v);
                }
            }
        }
    }
    out
}

/// The first Rust file under `dir` with a let chain, if any.
fn first_let_chain(dir: &Path) -> Result<Option<PathBuf>> {
    for file in rust_files(dir)? {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        if text
            .lines()
            .map(str::trim_start)
            .filter(|l| !l.starts_with("//"))
            .any(|l| l.contains("&& let "))
        {
            return Ok(Some(file));
        }
    }
    Ok(None)
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// `cargo package` of every publishable package at once, so cargo orders them and
/// resolves each against the ones packaged before it.
fn package_all(packages: &[Package], verify: bool) -> Result<()> {
    let mut cmd = process::cargo();
    cmd.args(["package", "--workspace", "--offline", "--quiet"])
        // A check, not a release: a working tree with edits is normal locally, and what
        // is checked is what is there.
        .arg("--allow-dirty");
    if !verify {
        cmd.arg("--no-verify");
    }
    for p in packages.iter().filter(|p| !p.publishable) {
        cmd.args(["--exclude", &p.name]);
    }
    println!("publish-check: {}", process::describe(&cmd));
    process::stdout_of(&mut cmd).map(drop)
}

/// The files `cargo package` puts in `p`'s crate, relative to its directory.
fn packaged_files(p: &Package) -> Result<Vec<String>> {
    let mut cmd = process::cargo();
    cmd.args([
        "package",
        "--list",
        "--offline",
        "--allow-dirty",
        "-p",
        &p.name,
    ]);
    Ok(process::stdout_of(&mut cmd)?
        .lines()
        .map(str::to_string)
        .collect())
}

/// Files cargo writes into the crate itself rather than taking from the checkout.
fn generated(file: &str) -> bool {
    matches!(
        file,
        ".cargo_vcs_info.json" | "Cargo.toml" | "Cargo.lock" | "Cargo.toml.orig"
    )
}

fn content_problems(p: &Package, files: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let listed: BTreeSet<&str> = files.iter().map(String::as_str).collect();
    for required in LICENSE_FILES {
        if !listed.contains(required) {
            problems.push(format!("{}: {required} is not packaged", p.name));
        }
    }
    for file in files.iter().filter(|f| !generated(f)) {
        let path = p.dir.join(file);
        if let Some(why) = credential_file_name(file) {
            problems.push(format!("{}: packages {file} ({why})", p.name));
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(err) => {
                problems.push(format!("{}: cannot read {file}: {err}", p.name));
                continue;
            }
        };
        let limit = if is_prebuilt(file) {
            MAX_PREBUILT
        } else {
            MAX_FILE
        };
        if bytes.len() as u64 > limit {
            problems.push(format!(
                "{}: {file} is {} (limit {}); exclude it or keep it out of the package",
                p.name,
                size(bytes.len() as u64),
                size(limit)
            ));
        }
        if let Some(kind) = secret_shape(&bytes) {
            problems.push(format!(
                "{}: {file} contains what looks like {kind}",
                p.name
            ));
        }
        if file.ends_with(".rs") {
            let text = String::from_utf8_lossy(&bytes);
            for included in included_paths(&text) {
                match resolve_include(file, &included) {
                    Some(target) if listed.contains(target.as_str()) => {}
                    _ => problems.push(format!(
                        "{}: {file} includes {included:?}, which is not in the package (the \
                         published crate would not compile)",
                        p.name
                    )),
                }
            }
        }
    }
    for prebuilt in committed_prebuilt(&p.dir) {
        if !listed.contains(prebuilt.as_str()) {
            problems.push(format!(
                "{}: the committed {prebuilt} is not packaged",
                p.name
            ));
        }
    }
    problems
}

fn is_prebuilt(file: &str) -> bool {
    file.starts_with("prebuilt/")
}

/// Git-tracked files under `<dir>/prebuilt/`, relative to `dir`.
fn committed_prebuilt(dir: &Path) -> Vec<String> {
    let Ok(out) = process::stdout_of(
        Command::new("git")
            .args(["ls-files", "--", "prebuilt"])
            .current_dir(dir),
    ) else {
        return Vec::new();
    };
    out.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// Why a file name looks like a credential store, if it does.
fn credential_file_name(file: &str) -> Option<&'static str> {
    let name = file.rsplit('/').next().unwrap_or(file);
    let exact = [
        ".env",
        ".netrc",
        ".npmrc",
        ".pypirc",
        ".git-credentials",
        "credentials",
        "credentials.json",
        "id_rsa",
        "id_ecdsa",
        "id_ed25519",
    ];
    if exact.contains(&name) || name.starts_with(".env.") {
        return Some("a credential file");
    }
    let key_ext = [".pem", ".key", ".p12", ".pfx", ".jks", ".keystore"];
    key_ext
        .iter()
        .any(|e| name.ends_with(e))
        .then_some("a key or certificate store")
}

/// The kind of secret `bytes` seems to contain: private keys and the token formats of the
/// big providers, each with its full length so a short test placeholder never matches.
fn secret_shape(bytes: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(bytes);
    if text.contains("PRIVATE KEY-----") && text.contains("-----BEGIN ") {
        return Some("a private key");
    }
    // (prefix, characters after it, allowed characters beyond alphanumerics, kind)
    let tokens: &[(&str, usize, &str, &str)] = &[
        ("AKIA", 16, "", "an AWS access key id"),
        ("ghp_", 36, "", "a GitHub token"),
        ("gho_", 36, "", "a GitHub token"),
        ("ghs_", 36, "", "a GitHub token"),
        ("github_pat_", 60, "_", "a GitHub token"),
        ("glpat-", 20, "-_", "a GitLab token"),
        ("xoxb-", 24, "-", "a Slack token"),
        ("xoxp-", 24, "-", "a Slack token"),
        ("sk-ant-", 40, "-_", "an Anthropic API key"),
        ("sk-proj-", 40, "-_", "an OpenAI API key"),
        ("AIza", 35, "-_", "a Google API key"),
    ];
    for (prefix, len, extra, kind) in tokens {
        let mut rest = text.as_ref();
        while let Some(at) = rest.find(prefix) {
            let after = &rest[at + prefix.len()..];
            let run = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || extra.contains(*c))
                .count();
            // An all-same run (`AKIAXXXXXXXXXXXXXXXX`) is a placeholder, not a key.
            let distinct: BTreeSet<char> = after.chars().take(run).collect();
            if run >= *len && distinct.len() > 4 {
                return Some(kind);
            }
            rest = after;
        }
    }
    None
}

/// The literal paths of `include_bytes!`/`include_str!` calls in `source`:
/// `include_bytes!("x")` relative to the file, `concat!(env!("CARGO_MANIFEST_DIR"), "/x")`
/// returned as `$CARGO_MANIFEST_DIR/x`.
fn included_paths(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    for mac in ["include_bytes!(", "include_str!("] {
        let mut rest = source;
        while let Some(at) = rest.find(mac) {
            let args = &rest[at + mac.len()..];
            // The macro's arguments end at the statement or the line.
            let end = args.find([';', '\n']).unwrap_or(args.len());
            let args = &args[..end];
            let manifest_relative = args.contains("CARGO_MANIFEST_DIR");
            let literals: Vec<&str> = args
                .split('"')
                .skip(1)
                .step_by(2)
                .filter(|s| *s != "CARGO_MANIFEST_DIR")
                .collect();
            if let Some(path) = literals.first() {
                out.push(if manifest_relative {
                    format!(
                        "$CARGO_MANIFEST_DIR/{}",
                        literals.concat().trim_start_matches('/')
                    )
                } else {
                    path.to_string()
                });
            }
            rest = &rest[at + mac.len()..];
        }
    }
    out
}

/// The package-relative path an include in `file` refers to; `None` when it leaves the
/// package.
fn resolve_include(file: &str, included: &str) -> Option<String> {
    let joined = match included.strip_prefix("$CARGO_MANIFEST_DIR/") {
        Some(rest) => PathBuf::from(rest),
        None => Path::new(file)
            .parent()
            .unwrap_or(Path::new(""))
            .join(included),
    };
    let mut parts: Vec<String> = Vec::new();
    for c in joined.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.join("/"))
}

/// One line of the size table.
struct Row {
    name: String,
    files: usize,
    unpacked: u64,
    crate_size: u64,
    largest: (String, u64),
}

impl Row {
    fn of(p: &Package, files: &[String], crate_size: u64) -> Row {
        let sizes: Vec<(String, u64)> = files
            .iter()
            .filter(|f| !generated(f))
            .map(|f| {
                let len = std::fs::metadata(p.dir.join(f)).map_or(0, |m| m.len());
                (f.clone(), len)
            })
            .collect();
        Row {
            name: p.name.clone(),
            files: files.len(),
            unpacked: sizes.iter().map(|(_, s)| s).sum(),
            crate_size,
            largest: sizes
                .into_iter()
                .max_by_key(|(_, s)| *s)
                .unwrap_or_default(),
        }
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<22} {:>5} {:>10} {:>10}  largest file",
        "package", "files", "unpacked", ".crate"
    );
    for r in rows {
        println!(
            "{:<22} {:>5} {:>10} {:>10}  {} ({})",
            r.name,
            r.files,
            size(r.unpacked),
            size(r.crate_size),
            r.largest.0,
            size(r.largest.1)
        );
    }
}

fn size(bytes: u64) -> String {
    if bytes >= 1024 * 1024 {
        format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_outside_the_package_are_caught() {
        let src = r#"
            #![doc = include_str!("../README.md")]
            static A: &[u8] = include_bytes!("../../sandbox-agent/prebuilt/x86_64/sandbox-agent");
            static B: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/prebuilt/x86_64/a"));
        "#;
        let paths = included_paths(src);
        assert_eq!(
            paths,
            [
                "../../sandbox-agent/prebuilt/x86_64/sandbox-agent",
                "$CARGO_MANIFEST_DIR/prebuilt/x86_64/a",
                "../README.md",
            ]
        );
        assert_eq!(
            resolve_include("src/lib.rs", &paths[2]).as_deref(),
            Some("README.md")
        );
        assert_eq!(resolve_include("src/lib.rs", &paths[0]), None);
        assert_eq!(
            resolve_include("src/deep/mod.rs", &paths[1]).as_deref(),
            Some("prebuilt/x86_64/a")
        );
    }

    #[test]
    fn secret_shapes_match_real_formats_not_placeholders() {
        let key = ["-----BEGIN OPENSSH ", "PRIVATE KEY-----\nabc"].concat();
        assert_eq!(secret_shape(key.as_bytes()), Some("a private key"));
        let aws = ["AKIA", "Z3QW5ERT7YUI2OPL"].concat();
        assert_eq!(secret_shape(aws.as_bytes()), Some("an AWS access key id"));
        let gh = [
            "token = ghp_",
            &"aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dF3hJ5"[..36],
        ]
        .concat();
        assert_eq!(secret_shape(gh.as_bytes()), Some("a GitHub token"));
        for harmless in [
            "AKIAXXXXXXXXXXXXXXXX",
            "sk-live-123",
            "ghp_short",
            "the AKIA prefix",
            "PRIVATE KEY----- without a BEGIN",
        ] {
            assert_eq!(secret_shape(harmless.as_bytes()), None, "{harmless}");
        }
    }

    #[test]
    fn credential_file_names() {
        for bad in [".env", "tests/.env.local", "certs/server.pem", "id_ed25519"] {
            assert!(credential_file_name(bad).is_some(), "{bad}");
        }
        for fine in [
            "src/env.rs",
            "README.md",
            "src/keys.rs",
            "prebuilt/x86_64/sandbox-agent",
        ] {
            assert!(credential_file_name(fine).is_none(), "{fine}");
        }
    }

    #[test]
    fn keywords_follow_crates_io_rules() {
        assert!(valid_keyword("code-execution"));
        assert!(valid_keyword("ai_agents"));
        assert!(!valid_keyword("1sandbox"));
        assert!(!valid_keyword("code execution"));
        assert!(!valid_keyword("a-keyword-far-too-long-for-crates-io"));
    }

    #[test]
    fn rust_versions_compare_by_major_and_minor() {
        assert_eq!(rust_version("1.88"), Some((1, 88)));
        assert_eq!(rust_version("1.85.1"), Some((1, 85)));
        assert!(rust_version("1.85").unwrap() < LET_CHAINS_MSRV);
        assert_eq!(rust_version("x"), None);
    }

    fn package(name: &str, publishable: bool, json: Value) -> Package {
        Package {
            name: name.into(),
            version: "0.1.0".into(),
            dir: PathBuf::from(format!("/w/{name}")),
            publishable,
            has_lib: true,
            json,
        }
    }

    #[test]
    fn taken_names_must_not_be_publishable() {
        assert_eq!(
            naming_problems(&package("sandbox-core", true, Value::Null)).len(),
            1
        );
        assert!(naming_problems(&package("sandbox-core", false, Value::Null)).is_empty());
        assert!(naming_problems(&package("sandbox-rs-core", true, Value::Null)).is_empty());
        assert!(naming_problems(&package("sandbox-rs", true, Value::Null)).is_empty());
    }

    #[test]
    fn path_dependencies_need_versions_except_dev() {
        let core = package("sandbox-rs-core", true, Value::Null);
        let bench = package("sandbox-bench", false, Value::Null);
        let p = package(
            "sandbox-rs-fake",
            true,
            serde_json::json!({"dependencies": [
                {"name": "sandbox-rs-core", "path": "/w/sandbox-rs-core", "req": "*", "kind": null},
                {"name": "sandbox-rs-core", "path": "/w/sandbox-rs-core", "req": "*", "kind": "dev"},
                {"name": "sandbox-bench", "path": "/w/sandbox-bench", "req": "^0.1.0", "kind": null},
                {"name": "serde", "req": "^1", "kind": null},
            ]}),
        );
        let problems = dependency_problems(&p, &[core, bench]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("no version"), "{problems:?}");
        assert!(problems[1].contains("publish = false"), "{problems:?}");
    }

    /// The CI workflow builds with the declared MSRV (so the declaration is tested, not
    /// just claimed) and runs `.ci/run`.
    #[test]
    fn ci_workflow_checks_the_declared_msrv() {
        let meta = metadata().unwrap();
        let packages = workspace_packages(&meta).unwrap();
        let declared: BTreeSet<&str> = packages
            .iter()
            .filter(|p| p.publishable)
            .filter_map(|p| p.json["rust_version"].as_str())
            .collect();
        assert_eq!(
            declared.len(),
            1,
            "one MSRV for the workspace: {declared:?}"
        );
        let msrv = declared.first().copied().unwrap_or_default();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let workflow = std::fs::read_to_string(root.join(".github/workflows/ci.yml")).unwrap();
        assert!(
            workflow.contains(&format!("dtolnay/rust-toolchain@{msrv}\n")),
            "the workflow's MSRV job must use Rust {msrv}"
        );
        assert!(workflow.contains(".ci/run"), "the workflow runs .ci/run");
    }

    /// The real workspace's manifests: names, metadata, path dependencies and MSRV hold
    /// (the packaging itself runs in `cargo xtask publish-check`, not under `cargo test`).
    #[test]
    fn workspace_manifests_are_publishable() {
        let meta = metadata().unwrap();
        let packages = workspace_packages(&meta).unwrap();
        let mut problems = Vec::new();
        for p in &packages {
            problems.extend(naming_problems(p));
            if p.publishable {
                problems.extend(metadata_problems(p));
                problems.extend(dependency_problems(p, &packages));
                problems.extend(msrv_problems(p, &meta).unwrap());
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
        let names: BTreeSet<&str> = packages
            .iter()
            .filter(|p| p.publishable)
            .map(|p| p.name.as_str())
            .collect();
        for expected in ["sandbox-rs", "sandbox-rs-core", "sandbox-rs-cli"] {
            assert!(names.contains(expected), "{names:?}");
        }
        assert!(!names.contains("xtask") && !names.contains("sandbox-bench"));
    }
}
