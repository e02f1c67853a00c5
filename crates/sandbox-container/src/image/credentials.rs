//! Registry credentials read where the engines' own CLIs keep them: the auth files
//! (`auth.json`, `~/.docker/config.json`) and the credential helpers they name, run with a
//! bound. A broken file is a configuration error that never quotes its content.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_core::{Result, SandboxError, Secret};

use crate::engine::pull::{CredentialStore, RegistryAuth};
use crate::error::bounded_text;
use crate::image::DEFAULT_REGISTRY;
use crate::image::ImageRef;

impl CredentialStore {
    /// The environment variable that points at the credentials (named by `Auth` errors).
    pub fn env_var(self) -> &'static str {
        match self {
            CredentialStore::Docker => "DOCKER_CONFIG",
            CredentialStore::Containers => "REGISTRY_AUTH_FILE",
        }
    }

    /// The engine CLI's login command for `registry`.
    pub(crate) fn login_command(self, registry: &str) -> String {
        match self {
            CredentialStore::Docker => format!("docker login {registry}"),
            CredentialStore::Containers => format!("podman login {registry}"),
        }
    }

    /// The credential files consulted, in order, from `env`.
    fn files(self, env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
        let home = env("HOME").filter(|h| !h.is_empty());
        let docker = match env("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
            Some(dir) => Some(Path::new(&dir).join("config.json")),
            None => home
                .as_ref()
                .map(|h| Path::new(h).join(".docker/config.json")),
        };
        match self {
            CredentialStore::Docker => docker.into_iter().collect(),
            CredentialStore::Containers => {
                if let Some(f) = env("REGISTRY_AUTH_FILE").filter(|f| !f.is_empty()) {
                    return vec![PathBuf::from(f)];
                }
                let mut files = Vec::new();
                if let Some(run) = env("XDG_RUNTIME_DIR").filter(|r| !r.is_empty()) {
                    files.push(Path::new(&run).join("containers/auth.json"));
                }
                if let Some(h) = &home {
                    files.push(Path::new(h).join(".config/containers/auth.json"));
                }
                files.extend(docker);
                files
            }
        }
    }

    /// The credentials for `image`'s registry, read from the process environment's
    /// files. `Ok(None)` when none are configured; a file that exists but cannot be read
    /// or parsed is a `Configuration` error naming it (never its content).
    pub fn lookup(self, image: &ImageRef) -> Result<Option<RegistryAuth>> {
        self.lookup_in(image, &|k| std::env::var(k).ok())
    }

    /// [`Self::lookup`] with the environment given (tests).
    pub fn lookup_in(
        self,
        image: &ImageRef,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<RegistryAuth>> {
        for file in self.files(env) {
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(unreadable(&file, &e.to_string())),
            };
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| unreadable(&file, &e.to_string()))?;
            if let Some(found) = from_config(&json, image, &file)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }
}

fn unreadable(file: &Path, why: &str) -> SandboxError {
    SandboxError::config(
        format!(
            "cannot read registry credentials from {}: {}",
            file.display(),
            bounded_text(why)
        ),
        format!(
            "fix the file (it must be JSON with an `auths` object) or remove it; `docker login` \
             / `podman login` rewrite it ({})",
            file.display()
        ),
    )
}

/// The keys a credential file may use for `image`'s registry, most specific first:
/// containers-auth.json allows `registry/namespace` keys; both allow `host[:port]` with or
/// without a scheme; Docker Hub is `https://index.docker.io/v1/`.
fn candidate_keys(image: &ImageRef) -> Vec<String> {
    let mut keys = Vec::new();
    let parts: Vec<&str> = image.repository.split('/').collect();
    for n in (1..=parts.len()).rev() {
        keys.push(format!("{}/{}", image.registry, parts[..n].join("/")));
    }
    keys.push(image.registry.clone());
    if image.registry == DEFAULT_REGISTRY {
        keys.push("https://index.docker.io/v1/".into());
        keys.push("index.docker.io".into());
        keys.push("registry-1.docker.io".into());
    }
    keys
}

/// `https://host:port/v1/` → `host:port`: how Docker normalises `auths` keys.
fn normalise_key(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    // Keep a `registry/namespace` key whole, but drop a `/v1/`, `/v2/` API suffix.
    let k = k.trim_end_matches('/');
    k.strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k)
}

fn from_config(
    json: &serde_json::Value,
    image: &ImageRef,
    file: &Path,
) -> Result<Option<RegistryAuth>> {
    let candidates = candidate_keys(image);
    // A per-registry helper wins over `auths`, as in the Docker CLI.
    if let Some(helpers) = json.get("credHelpers").and_then(|h| h.as_object()) {
        for want in &candidates {
            for (key, helper) in helpers {
                if normalise_key(key) == want.as_str()
                    && let Some(h) = helper.as_str()
                {
                    return run_helper(h, key);
                }
            }
        }
    }
    if let Some(auths) = json.get("auths").and_then(|a| a.as_object()) {
        for want in &candidates {
            for (key, entry) in auths {
                if normalise_key(key) == want.as_str()
                    && let Some(auth) = auth_entry(key, entry, file)?
                {
                    return Ok(Some(auth));
                }
            }
        }
    }
    if let Some(store) = json.get("credsStore").and_then(|s| s.as_str()) {
        let server = if image.registry == DEFAULT_REGISTRY {
            "https://index.docker.io/v1/".to_string()
        } else {
            image.registry.clone()
        };
        return run_helper(store, &server);
    }
    Ok(None)
}

/// One `auths` entry: `auth` (base64 `user:password`), or `username`/`password`, plus an
/// optional `identitytoken`. An entry with neither (Docker writes `{}` when a helper
/// holds the secret) is no credential.
fn auth_entry(key: &str, entry: &serde_json::Value, file: &Path) -> Result<Option<RegistryAuth>> {
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
    };
    let token = field("identitytoken").map(Secret::new);
    let (username, password) = if let Some(encoded) = field("auth") {
        let decoded = base64_decode(encoded.as_bytes())
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| unreadable(file, &format!("`auths.{key}.auth` is not base64")))?;
        let (u, p) = decoded.split_once(':').ok_or_else(|| {
            unreadable(file, &format!("`auths.{key}.auth` is not `user:password`"))
        })?;
        (u.to_string(), p.to_string())
    } else if let Some(u) = field("username") {
        (u.to_string(), field("password").unwrap_or("").to_string())
    } else if token.is_some() {
        (String::new(), String::new())
    } else {
        return Ok(None);
    };
    let mut auth = RegistryAuth::new(key, username, password);
    auth.identity_token = token;
    Ok(Some(auth))
}

/// Longest a credential helper may take (they may unlock a keyring, not wait for a user).
const HELPER_TIMEOUT: Duration = Duration::from_secs(10);

/// Asks `docker-credential-<helper> get` for `server`'s credential (the Docker CLI's
/// protocol: the server on stdin, `{"Username","Secret"}` on stdout; a `<token>` user name
/// means the secret is an identity token).
fn run_helper(helper: &str, server: &str) -> Result<Option<RegistryAuth>> {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};
    if helper.is_empty()
        || !helper
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(SandboxError::config(
            format!("credential helper name {helper:?} is not a plain name"),
            "name a helper `docker-credential-<name>` on PATH in config.json",
        ));
    }
    let program = format!("docker-credential-{helper}");
    let not_run = |why: String| {
        SandboxError::config(
            format!("credential helper `{program}` failed for {server}: {why}"),
            format!("install `{program}` on PATH, or log in again (`docker login {server}`)"),
        )
    };
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| not_run(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(server.as_bytes());
    }
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() < HELPER_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(not_run(format!("no answer within {HELPER_TIMEOUT:?}")));
            }
            Err(e) => return Err(not_run(e.to_string())),
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    if !status.success() {
        // Helpers exit non-zero with "credentials not found" for an unknown server.
        return Ok(None);
    }
    let v: serde_json::Value =
        serde_json::from_str(&out).map_err(|_| not_run("its answer is not JSON".to_string()))?;
    let user = v.get("Username").and_then(|u| u.as_str()).unwrap_or("");
    let secret = v.get("Secret").and_then(|s| s.as_str()).unwrap_or("");
    if secret.is_empty() {
        return Ok(None);
    }
    Ok(Some(if user == "<token>" {
        let mut a = RegistryAuth::new(server, "", "");
        a.identity_token = Some(Secret::new(secret));
        a
    } else {
        RegistryAuth::new(server, user, secret)
    }))
}

/// Standard or URL-safe base64, padding optional, whitespace ignored (auth files are
/// written by many tools); `None` when malformed.
fn base64_decode(input: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let clean: Vec<u8> = input
        .iter()
        .copied()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let config = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    [base64::alphabet::STANDARD, base64::alphabet::URL_SAFE]
        .iter()
        .find_map(|alphabet| GeneralPurpose::new(alphabet, config).decode(&clean).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    static DIRS: AtomicU64 = AtomicU64::new(0);

    fn r(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap()
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "sbx-image-test-{tag}-{}-{}",
            std::process::id(),
            DIRS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn docker_config_auths_are_found_by_registry() {
        let dir = tempdir("docker");
        write(
            &dir,
            "config.json",
            r#"{"auths":{"http://127.0.0.1:5000/v2/":{"auth":"dXNlcjpwdw=="},"other:1":{"auth":"eDp5"}}}"#,
        );
        let d = dir.to_string_lossy().to_string();
        let env = move |k: &str| (k == "DOCKER_CONFIG").then(|| d.clone());
        let a = CredentialStore::Docker
            .lookup_in(&r("127.0.0.1:5000/sbx/busybox:1"), &env)
            .unwrap()
            .unwrap();
        assert_eq!((a.username.as_str(), a.password.expose()), ("user", "pw"));
        assert!(
            CredentialStore::Docker
                .lookup_in(&r("127.0.0.1:5001/x"), &env)
                .unwrap()
                .is_none()
        );
        let debug = format!("{a:?}");
        assert!(!debug.contains("pw\"") && debug.contains("***"), "{debug}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn registry_auth_file_wins_and_namespaced_keys_are_more_specific() {
        let dir = tempdir("containers");
        let file = write(
            &dir,
            "auth.json",
            r#"{"auths":{"127.0.0.1:5000":{"auth":"YTpi"},"127.0.0.1:5000/team":{"auth":"Yzpk"}}}"#,
        );
        let docker = write(
            &dir,
            "docker/config.json",
            r#"{"auths":{"127.0.0.1:5000":{"auth":"eDp5"}}}"#,
        );
        let f = file.to_string_lossy().to_string();
        let dd = docker.parent().unwrap().to_string_lossy().to_string();
        let env = move |k: &str| match k {
            "REGISTRY_AUTH_FILE" => Some(f.clone()),
            "DOCKER_CONFIG" => Some(dd.clone()),
            _ => None,
        };
        let team = CredentialStore::Containers
            .lookup_in(&r("127.0.0.1:5000/team/app:1"), &env)
            .unwrap()
            .unwrap();
        assert_eq!(team.username, "c");
        let other = CredentialStore::Containers
            .lookup_in(&r("127.0.0.1:5000/solo:1"), &env)
            .unwrap()
            .unwrap();
        assert_eq!(other.username, "a");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_broken_credential_file_is_a_configuration_error_without_its_content() {
        let dir = tempdir("broken");
        write(
            &dir,
            "config.json",
            r#"{"auths":{"r:1":{"auth":"not base64 hunter2!"}}}"#,
        );
        let d = dir.to_string_lossy().to_string();
        let env = move |k: &str| (k == "DOCKER_CONFIG").then(|| d.clone());
        let e = CredentialStore::Docker
            .lookup_in(&r("r:1/x"), &env)
            .unwrap_err();
        assert_eq!(e.code(), sandbox_core::ErrorCode::Configuration);
        assert!(!e.render().contains("hunter2"), "{}", e.render());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// An engine that only has images: `pull` counts calls, reports two progress
    /// messages, waits, then fails as `fail` says or adds the image.

    #[test]
    fn helper_names_cannot_be_paths() {
        assert!(run_helper("../../bin/sh", "r:1").is_err());
        assert!(run_helper("", "r:1").is_err());
    }
}
