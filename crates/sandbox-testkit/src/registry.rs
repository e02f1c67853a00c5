//! A tiny OCI distribution registry for the pull trials: plain HTTP on 127.0.0.1,
//! serving one image (from a `docker save` / `podman save` archive) under any number of
//! repository names, with optional basic auth, counting manifest requests per
//! repository. Nothing leaves the machine: the engines reach it on loopback, which Docker
//! allows over plain HTTP and Podman when the pull skips TLS verification.
//!
//! Routes (the subset both engines use to pull): `GET /v2/` (the auth probe),
//! `GET|HEAD /v2/<name>/manifests/<tag or digest>`, `GET|HEAD /v2/<name>/blobs/<digest>`.
//! With credentials configured every route answers 401 with a `Basic` challenge until
//! the request carries them.

use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The local image the test registries serve (built by `cargo xtask setup`).
pub const SOURCE_IMAGE: &str = "sandbox-rs/busybox:latest";

/// The docker-archive of [`SOURCE_IMAGE`] exported with `cli save` (`docker` /
/// `podman`), or why not: what a [`TestRegistry`] serves.
pub fn source_archive(cli: &str) -> Result<Vec<u8>, String> {
    let path =
        std::env::temp_dir().join(format!("sbx-pull-source-{cli}-{}.tar", std::process::id()));
    let mut cmd = std::process::Command::new(cli);
    cmd.arg("save");
    if cli == "podman" {
        cmd.args(["--format", "docker-archive"]);
    }
    let out = cmd
        .arg("-o")
        .arg(&path)
        .arg(SOURCE_IMAGE)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{cli} save`: {e}"))?;
    let bytes = std::fs::read(&path);
    let _ = std::fs::remove_file(&path);
    if !out.status.success() {
        return Err(format!(
            "`{cli} save {SOURCE_IMAGE}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    bytes.map_err(|e| e.to_string())
}

/// Docker's schema 2 manifest (both engines accept it).
const MANIFEST_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
const CONFIG_TYPE: &str = "application/vnd.docker.container.image.v1+json";
/// An uncompressed layer, as `save` writes it (both engines detect compression by content).
const LAYER_TYPE: &str = "application/vnd.docker.image.rootfs.diff.tar";

/// The image a [`TestRegistry`] serves: manifest and blobs by digest.
#[derive(Debug)]
struct Image {
    manifest: Vec<u8>,
    manifest_digest: String,
    blobs: HashMap<String, Vec<u8>>,
}

#[derive(Debug, Default)]
struct Counters {
    /// `GET` and `HEAD` of a manifest, by repository.
    manifests: Mutex<HashMap<String, u64>>,
    requests: AtomicU64,
    unauthorized: AtomicU64,
}

/// A registry on 127.0.0.1 serving one image under the given repositories and tags.
/// Stops when dropped.
#[derive(Debug)]
pub struct TestRegistry {
    addr: SocketAddr,
    marker: String,
    counters: Arc<Counters>,
    accept: JoinHandle<()>,
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn sha256_digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut s = String::with_capacity(7 + 64);
    s.push_str("sha256:");
    for b in hash.iter() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// A one-file layer (`/etc/sbx-test-registry` holding `marker`), so every registry serves
/// an image the engine has not seen: its pull downloads a layer for real, and removing
/// the image afterwards removes what the pull added (the base layers stay shared).
fn marker_layer(marker: &str) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_size(0);
    dir.set_mode(0o755);
    dir.set_cksum();
    b.append_data(&mut dir, "etc/", std::io::empty())?;
    let mut h = tar::Header::new_gnu();
    h.set_size(marker.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "etc/sbx-test-registry", marker.as_bytes())?;
    b.into_inner()
}

/// Reads a `docker save` / `podman save` (docker-archive) tarball: its `manifest.json`
/// names the config file and the layer tars in order. `marker` is added as one more
/// layer (see [`marker_layer`]), recorded in the config's `rootfs` and `history`.
fn image_from_archive(archive: &[u8], marker: &str) -> std::io::Result<Image> {
    let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let mut files: HashMap<String, Vec<u8>> = HashMap::new();
    let mut tar = tar::Archive::new(archive);
    for entry in tar.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        files.insert(path, data);
    }
    let manifest: serde_json::Value = serde_json::from_slice(
        files
            .get("manifest.json")
            .ok_or_else(|| invalid("no manifest.json in the archive".into()))?,
    )
    .map_err(|e| invalid(e.to_string()))?;
    let first = manifest
        .get(0)
        .ok_or_else(|| invalid("manifest.json lists no image".into()))?;
    let config_path = first["Config"]
        .as_str()
        .ok_or_else(|| invalid("manifest.json has no Config".into()))?;
    let mut config: serde_json::Value = serde_json::from_slice(
        files
            .get(config_path)
            .ok_or_else(|| invalid(format!("{config_path} missing from the archive")))?,
    )
    .map_err(|e| invalid(e.to_string()))?;
    let mut layer_data: Vec<Vec<u8>> = Vec::new();
    for l in first["Layers"].as_array().into_iter().flatten() {
        let path = l.as_str().unwrap_or_default();
        layer_data.push(
            files
                .get(path)
                .ok_or_else(|| invalid(format!("layer {path} missing from the archive")))?
                .clone(),
        );
    }
    let marker = marker_layer(marker)?;
    let marker_digest = sha256_digest(&marker);
    layer_data.push(marker);
    let diff_ids = config
        .pointer_mut("/rootfs/diff_ids")
        .and_then(|d| d.as_array_mut())
        .ok_or_else(|| invalid("the image config has no rootfs.diff_ids".into()))?;
    diff_ids.push(serde_json::Value::String(marker_digest));
    if let Some(history) = config.get_mut("history").and_then(|h| h.as_array_mut()) {
        history.push(serde_json::json!({
            "created": "2026-01-01T00:00:00Z",
            "created_by": "sandbox-rs test registry marker layer",
        }));
    }
    let config = serde_json::to_vec(&config).map_err(|e| invalid(e.to_string()))?;
    let mut blobs = HashMap::new();
    let config_digest = sha256_digest(&config);
    let mut layers = Vec::new();
    for data in layer_data {
        let digest = sha256_digest(&data);
        layers.push(serde_json::json!({
            "mediaType": LAYER_TYPE, "size": data.len(), "digest": digest,
        }));
        blobs.insert(digest, data);
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": { "mediaType": CONFIG_TYPE, "size": config.len(), "digest": config_digest },
        "layers": layers,
    }))
    .map_err(|e| invalid(e.to_string()))?;
    blobs.insert(config_digest, config);
    Ok(Image {
        manifest_digest: sha256_digest(&manifest),
        manifest,
        blobs,
    })
}

struct Served {
    image: Image,
    /// Repository → tags served.
    repos: HashMap<String, Vec<String>>,
    /// `Basic <base64(user:password)>` every request must carry, when set.
    authorization: Option<String>,
    counters: Arc<Counters>,
}

impl TestRegistry {
    /// Serves the image of `archive` (a docker-archive tarball) as `repo:tag` for every
    /// `(repo, tag)` in `names`, requiring `credentials` (user, password) when given.
    /// Must be called inside a tokio runtime.
    pub async fn start(
        archive: &[u8],
        names: &[(&str, &str)],
        credentials: Option<(&str, &str)>,
    ) -> std::io::Result<TestRegistry> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let marker = format!(
            "sbx-test-registry {} {} {:?}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
        );
        let image = image_from_archive(archive, &marker)?;
        let mut repos: HashMap<String, Vec<String>> = HashMap::new();
        for (repo, tag) in names {
            repos
                .entry(repo.to_string())
                .or_default()
                .push(tag.to_string());
        }
        let counters = Arc::new(Counters::default());
        let served = Arc::new(Served {
            image,
            repos,
            authorization: credentials
                .map(|(u, p)| format!("Basic {}", BASE64.encode(format!("{u}:{p}").as_bytes()))),
            counters: counters.clone(),
        });
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let served = served.clone();
                tokio::spawn(async move {
                    let _ = serve(conn, &served).await;
                });
            }
        });
        Ok(TestRegistry {
            addr,
            marker,
            counters,
            accept,
        })
    }

    /// `127.0.0.1:<port>`, the registry part of image references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The content of `/etc/sbx-test-registry` in the image this registry serves (unique
    /// per registry): proof that a sandbox runs the pulled image.
    pub fn marker(&self) -> &str {
        &self.marker
    }

    /// Manifest requests (`GET` and `HEAD`) for `repo` so far.
    pub fn manifest_requests(&self, repo: &str) -> u64 {
        self.counters
            .manifests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(repo)
            .copied()
            .unwrap_or(0)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.counters.requests.load(Ordering::SeqCst)
    }

    /// Requests refused for missing or wrong credentials so far.
    pub fn unauthorized(&self) -> u64 {
        self.counters.unauthorized.load(Ordering::SeqCst)
    }
}

/// One request per connection (`Connection: close`): the engines reconnect as needed.
async fn serve(mut conn: TcpStream, served: &Served) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = match tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await {
            Ok(r) => r?,
            Err(_) => return Ok(()),
        };
        if n == 0 || head.len() > 64 * 1024 {
            return Ok(());
        }
        // A TLS ClientHello (record type 22): the engines try HTTPS first and fall back to
        // plain HTTP for a loopback registry once the handshake fails. Closing at once
        // makes that immediate (left waiting, Docker gives up only after its 10 s
        // handshake timeout).
        if head.is_empty() && buf[0] == 0x16 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let mut lines = text.split("\r\n");
    let mut request = lines.next().unwrap_or_default().split(' ');
    let method = request.next().unwrap_or_default().to_string();
    let target = request.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_string();
    let authorization = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.trim().to_string());
    served.counters.requests.fetch_add(1, Ordering::SeqCst);
    let (status, headers, body) = route(served, &method, &path, authorization.as_deref());
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\
         Docker-Distribution-API-Version: registry/2.0\r\n",
        body.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    conn.write_all(out.as_bytes()).await?;
    if method != "HEAD" {
        conn.write_all(&body).await?;
    }
    conn.shutdown().await
}

fn error_body(code: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "errors": [{ "code": code, "message": message, "detail": {} }]
    }))
    .unwrap_or_default()
}

type Response = (u16, Vec<(&'static str, String)>, Vec<u8>);

fn json_error(status: u16, code: &str, message: &str) -> Response {
    (
        status,
        vec![("Content-Type", "application/json".into())],
        error_body(code, message),
    )
}

fn route(served: &Served, method: &str, path: &str, authorization: Option<&str>) -> Response {
    if method != "GET" && method != "HEAD" {
        return json_error(405, "UNSUPPORTED", "the test registry is read-only");
    }
    if let Some(want) = &served.authorization
        && authorization != Some(want.as_str())
    {
        served.counters.unauthorized.fetch_add(1, Ordering::SeqCst);
        let (status, mut headers, body) =
            json_error(401, "UNAUTHORIZED", "authentication required");
        headers.push((
            "WWW-Authenticate",
            "Basic realm=\"sandbox-rs test registry\"".into(),
        ));
        return (status, headers, body);
    }
    if path == "/v2/" || path == "/v2" {
        return (
            200,
            vec![("Content-Type", "application/json".into())],
            b"{}".to_vec(),
        );
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return json_error(404, "NOT_FOUND", "not a registry path");
    };
    if let Some(at) = rest.rfind("/manifests/") {
        let (repo, reference) = (&rest[..at], &rest[at + "/manifests/".len()..]);
        *served
            .counters
            .manifests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(repo.to_string())
            .or_default() += 1;
        let known = served.repos.get(repo).is_some_and(|tags| {
            tags.iter().any(|t| t == reference) || reference == served.image.manifest_digest
        });
        if !known {
            return json_error(404, "MANIFEST_UNKNOWN", "manifest unknown");
        }
        return (
            200,
            vec![
                ("Content-Type", MANIFEST_TYPE.into()),
                (
                    "Docker-Content-Digest",
                    served.image.manifest_digest.clone(),
                ),
            ],
            served.image.manifest.clone(),
        );
    }
    if let Some(at) = rest.rfind("/blobs/") {
        let (repo, digest) = (&rest[..at], &rest[at + "/blobs/".len()..]);
        if let (true, Some(blob)) = (
            served.repos.contains_key(repo),
            served.image.blobs.get(digest),
        ) {
            return (
                200,
                vec![
                    ("Content-Type", "application/octet-stream".into()),
                    ("Docker-Content-Digest", digest.to_string()),
                ],
                blob.clone(),
            );
        }
        return json_error(404, "BLOB_UNKNOWN", "blob unknown to registry");
    }
    json_error(404, "NOT_FOUND", "not a registry path")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A docker-archive with one layer holding one file.
    fn archive() -> Vec<u8> {
        let mut layer = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o644);
        h.set_cksum();
        layer.append_data(&mut h, "hello", &b"hi\n"[..]).unwrap();
        let layer = layer.into_inner().unwrap();
        let config = br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:00"]},"history":[{}]}"#;
        let manifest = br#"[{"Config":"c.json","RepoTags":["x:1"],"Layers":["l/layer.tar"]}]"#;
        let mut out = tar::Builder::new(Vec::new());
        for (name, data) in [
            ("manifest.json", &manifest[..]),
            ("c.json", &config[..]),
            ("l/layer.tar", &layer[..]),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            out.append_data(&mut h, name, data).unwrap();
        }
        out.into_inner().unwrap()
    }

    async fn get(addr: &str, path: &str, auth: Option<&str>) -> (u16, String) {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let auth = auth
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text[9..12].parse().unwrap();
        (status, text)
    }

    #[tokio::test]
    async fn serves_manifest_and_blobs_and_counts_manifest_requests() {
        let r = TestRegistry::start(&archive(), &[("sbx/img", "1")], None)
            .await
            .unwrap();
        let host = r.host();
        assert_eq!(get(&host, "/v2/", None).await.0, 200);
        let (status, text) = get(&host, "/v2/sbx/img/manifests/1", None).await;
        assert_eq!(status, 200);
        let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
        let m: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(m["layers"].as_array().unwrap().len(), 2, "base + marker");
        let marker = m["layers"][1]["digest"].as_str().unwrap().to_string();
        let (status, blob) = get(&host, &format!("/v2/sbx/img/blobs/{marker}"), None).await;
        assert_eq!(status, 200);
        assert!(blob.contains(r.marker()));
        let config = m["config"]["digest"].as_str().unwrap().to_string();
        let (status, text) = get(&host, &format!("/v2/sbx/img/blobs/{config}"), None).await;
        assert_eq!(status, 200);
        let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
        let c: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(c["rootfs"]["diff_ids"][1].as_str(), Some(marker.as_str()));
        assert_eq!(c["history"].as_array().unwrap().len(), 2);
        assert_eq!(get(&host, "/v2/sbx/img/manifests/2", None).await.0, 404);
        assert_eq!(get(&host, "/v2/other/manifests/1", None).await.0, 404);
        assert_eq!(r.manifest_requests("sbx/img"), 2);
    }

    #[tokio::test]
    async fn credentials_are_demanded_with_a_basic_challenge() {
        let r = TestRegistry::start(&archive(), &[("a", "1")], Some(("u", "p")))
            .await
            .unwrap();
        let host = r.host();
        let (status, text) = get(&host, "/v2/", None).await;
        assert_eq!(status, 401);
        assert!(text.contains("WWW-Authenticate: Basic"));
        assert_eq!(get(&host, "/v2/", Some("Basic dTp4")).await.0, 401);
        assert_eq!(get(&host, "/v2/", Some("Basic dTpw")).await.0, 200);
        assert_eq!(r.unauthorized(), 2);
    }
}
