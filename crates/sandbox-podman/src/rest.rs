//! Direct libpod REST calls for the few things podman-api 0.11 gets wrong or lacks,
//! over the same endpoint (unix socket or tcp) the podman-api client uses.
//!
//! Each bypass and its reason:
//! - **container create**: podman-api's `ContainerCreateOptsBuilder::no_new_privilages`
//!   serialises the misspelled field `no_new_privilages`, which Podman silently ignores, so
//!   the flag never reaches the container. The spec is still assembled with podman-api's
//!   typed builder; only the body is patched with the correct `no_new_privileges` (and
//!   OCI-shaped `mounts`/`devices`, which the crate's Docker-shaped `Mount` model cannot
//!   express) and POSTed here.
//! - **archive stat** (`HEAD /containers/{id}/archive`): podman-api has no call for it; it
//!   is the engine's cheap `stat` (no exec needed).
//! - **archive download** (`GET /containers/{id}/archive`): podman-api's `copy_from`
//!   stream borrows the container handle, so it cannot be handed to the container layer
//!   as an owned stream; hyper's body can.
//! - **container attach** (`POST /libpod/containers/{id}/attach`): podman-api inspects the
//!   container before every attach (to learn whether it has a TTY, which this adapter's
//!   containers never have): one more round-trip on every create, about a third of what
//!   `create` costs beyond the engine's own create and start.
//! - **container delete** (`DELETE /libpod/containers/{id}`): podman-api's `volumes`
//!   option sends `v=true`, which the libpod endpoint ignores (it reads `volumes`), so a
//!   container's anonymous volumes stayed on the engine's disk after its removal.
//! - **image inspect** (`GET /libpod/images/{name}/json`), for the volumes an image
//!   declares: only that field is decoded, from an answer read up to 4 MiB, where
//!   podman-api decodes (and may fail on) the whole answer.
//! - **container export** (`GET /libpod/containers/{id}/export`): podman-api's stream
//!   borrows the container handle, as its archive download does.
//! - **image import** (`POST /libpod/images/import`): podman-api reads the whole archive
//!   into memory first; hyper streams it.
//! - **image inspect, list and delete** for snapshots: the fields read are decoded alone
//!   (as for the volumes), and a delete in use is a `Conflict`, never forced.
//! - **exec start** (`POST /libpod/exec/{id}/start`): podman-api's frame decoder panics on
//!   a stream number it does not know, and its stdin writer is a `futures` one; the
//!   upgraded connection goes through the container layer's own bounded demultiplexer
//!   instead, as the attach does.

use std::path::PathBuf;

use hyper::{Body, Method, Request, StatusCode};
use sandbox_container::engine::{ImageConfig, ImageInfo, engine_text};
use sandbox_container::{EngineError, EngineErrorKind, EngineResult, PathStat};
use sandbox_core::{Result, SandboxError};
use serde::Deserialize;

/// The API version prefix this adapter speaks (podman-api's `LATEST_API_VERSION`).
const API_PREFIX: &str = "/v4.3.1";

#[derive(Clone, Debug)]
enum Transport {
    Unix {
        client: hyper::Client<hyperlocal::UnixConnector>,
        path: PathBuf,
    },
    Tcp {
        client: hyper::Client<hyper::client::HttpConnector>,
        base: String,
    },
}

/// A minimal libpod REST client for the bypassed calls.
#[derive(Clone, Debug)]
pub(crate) struct Rest {
    transport: Transport,
}

/// An answer this client cannot use (a malformed body or header) as an [`EngineError`].
fn invalid(what: &str, why: impl std::fmt::Display) -> EngineError {
    EngineError::new(
        EngineErrorKind::Other,
        engine_text(&format!("{what}: invalid engine answer: {why}")),
    )
}

/// A failure to reach the engine (or to read its answer) as an [`EngineError`].
fn unreachable(what: &str, e: hyper::Error) -> EngineError {
    EngineError::new(
        EngineErrorKind::Unavailable,
        engine_text(&format!("{what}: cannot reach the engine: {e}")),
    )
    .with_source(e)
}

impl Rest {
    /// A client for `unix:///path` or `tcp://host:port` (`http://` accepted as tcp).
    pub(crate) fn new(endpoint: &str) -> Result<Rest> {
        let transport = if let Some(path) = endpoint.strip_prefix("unix://") {
            Transport::Unix {
                client: hyper::Client::builder()
                    .pool_max_idle_per_host(0)
                    .build(hyperlocal::UnixConnector),
                path: PathBuf::from(path),
            }
        } else if let Some(host) = endpoint
            .strip_prefix("tcp://")
            .or_else(|| endpoint.strip_prefix("http://"))
        {
            Transport::Tcp {
                client: hyper::Client::new(),
                base: format!("http://{}", host.trim_end_matches('/')),
            }
        } else {
            return Err(SandboxError::config(
                format!("unsupported Podman endpoint scheme in {endpoint:?}"),
                "set CONTAINER_HOST to unix:///run/podman/podman.sock or tcp://host:port (ssh:// is not supported)",
            ));
        };
        Ok(Rest { transport })
    }

    fn uri(&self, ep: &str) -> hyper::Uri {
        let ep = format!("{API_PREFIX}{ep}");
        match &self.transport {
            Transport::Unix { path, .. } => hyperlocal::Uri::new(path, &ep).into(),
            Transport::Tcp { base, .. } => format!("{base}{ep}")
                .parse()
                .unwrap_or_else(|_| hyper::Uri::from_static("http://invalid.invalid/")),
        }
    }

    /// Sends `method ep` with `body`; a failure to build or send it is an [`EngineError`].
    async fn send(
        &self,
        what: &str,
        req: hyper::http::request::Builder,
        body: Body,
    ) -> EngineResult<hyper::Response<Body>> {
        let req = req.body(body).map_err(|e| invalid(what, e))?;
        match &self.transport {
            Transport::Unix { client, .. } => client.request(req).await,
            Transport::Tcp { client, .. } => client.request(req).await,
        }
        .map_err(|e| unreachable(what, e))
    }

    /// An answer with an unexpected status as an [`EngineError`] of that status's kind,
    /// with the engine's message (capped).
    async fn error_of(what: &str, resp: hyper::Response<Body>) -> EngineError {
        let status = resp.status().as_u16();
        let body = read_capped(resp.into_body()).await.unwrap_or_default();
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| {
                v.get("message")
                    .or_else(|| v.get("cause"))
                    .and_then(|m| m.as_str().map(str::to_string))
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        EngineError::new(
            crate::error::answer_kind(status, &message),
            engine_text(&format!("{what}: engine answered {status}: {message}")),
        )
    }

    /// `GET ep`: the first `cap` bytes of a `200 OK` answer's body; any other status is
    /// the engine's error.
    async fn get_capped(&self, what: &str, ep: &str, cap: usize) -> EngineResult<Vec<u8>> {
        let req = Request::builder().method(Method::GET).uri(self.uri(ep));
        let resp = self.send(what, req, Body::empty()).await?;
        if resp.status() != StatusCode::OK {
            return Err(Self::error_of(what, resp).await);
        }
        read_capped_to(resp.into_body(), cap)
            .await
            .map_err(|e| unreachable(what, e))
    }

    /// `POST /libpod/containers/create` with a JSON SpecGenerator body; returns the id.
    pub(crate) async fn create_container(&self, spec: &serde_json::Value) -> EngineResult<String> {
        const WHAT: &str = "container create";
        let body = serde_json::to_vec(spec).map_err(|e| invalid(WHAT, e))?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.uri("/libpod/containers/create"))
            .header("content-type", "application/json");
        let resp = self.send(WHAT, req, Body::from(body)).await?;
        if resp.status() != StatusCode::CREATED && resp.status() != StatusCode::OK {
            return Err(Self::error_of(WHAT, resp).await);
        }
        let body = read_capped(resp.into_body())
            .await
            .map_err(|e| unreachable(WHAT, e))?;
        #[derive(Deserialize)]
        struct Created {
            #[serde(rename = "Id")]
            id: String,
        }
        let c: Created = serde_json::from_slice(&body).map_err(|e| invalid(WHAT, e))?;
        Ok(c.id)
    }

    /// `DELETE /libpod/containers/{id}?force=true&volumes=true&timeout=0`: the container
    /// and its anonymous volumes (Podman's for each `VOLUME` of an image without a disk
    /// limit; left behind they would stay on the engine's disk for good).
    pub(crate) async fn remove_container(&self, id: &str) -> EngineResult<()> {
        const WHAT: &str = "container delete";
        let ep = format!(
            "/libpod/containers/{}?force=true&volumes=true&timeout=0",
            encode(id)
        );
        let req = Request::builder().method(Method::DELETE).uri(self.uri(&ep));
        let resp = self.send(WHAT, req, Body::empty()).await?;
        match resp.status() {
            StatusCode::OK | StatusCode::NO_CONTENT => Ok(()),
            _ => Err(Self::error_of(WHAT, resp).await),
        }
    }

    /// `GET /libpod/images/{name}/json`: the volumes the image's config declares. Only
    /// that field is decoded (podman-api's model of the whole answer is the part most
    /// likely to break on a field it does not know).
    pub(crate) async fn image_volumes(&self, image: &str) -> EngineResult<Vec<String>> {
        const WHAT: &str = "image inspect";
        let ep = format!("/libpod/images/{}/json", encode(image));
        let body = self.get_capped(WHAT, &ep, IMAGE_ANSWER_CAP).await?;
        image_volumes_of(&body).map_err(|e| invalid(WHAT, e))
    }

    /// `GET /libpod/containers/{id}/json`, decoding only `StaticDir` (the bundle
    /// directory holding conmon's attach socket). podman-api's model of the whole
    /// answer was measured leaving 13 KiB of the process's heap behind per call, which
    /// every agent attach paid once per live sandbox.
    pub(crate) async fn static_dir(&self, id: &str) -> EngineResult<Option<String>> {
        const WHAT: &str = "container inspect";
        #[derive(serde::Deserialize)]
        struct Dirs {
            #[serde(rename = "StaticDir")]
            static_dir: Option<String>,
        }
        let ep = format!("/libpod/containers/{}/json", encode(id));
        let body = self.get_capped(WHAT, &ep, IMAGE_ANSWER_CAP).await?;
        let dirs: Dirs = serde_json::from_slice(&body).map_err(|e| invalid(WHAT, e))?;
        Ok(dirs.static_dir)
    }

    /// `GET /libpod/images/{name}/json`: the configuration a snapshot keeps.
    pub(crate) async fn image_config(&self, image: &str) -> EngineResult<ImageConfig> {
        const WHAT: &str = "image inspect";
        let ep = format!("/libpod/images/{}/json", encode(image));
        let body = self.get_capped(WHAT, &ep, IMAGE_ANSWER_CAP).await?;
        image_config_of(&body).map_err(|e| invalid(WHAT, e))
    }

    /// `GET /libpod/containers/{id}/export`: the container's filesystem as a tar stream.
    pub(crate) async fn export(&self, id: &str) -> EngineResult<Body> {
        const WHAT: &str = "container export";
        let ep = format!("/libpod/containers/{}/export", encode(id));
        let req = Request::builder().method(Method::GET).uri(self.uri(&ep));
        let resp = self.send(WHAT, req, Body::empty()).await?;
        match resp.status() {
            StatusCode::OK => Ok(resp.into_body()),
            _ => Err(Self::error_of(WHAT, resp).await),
        }
    }

    /// `POST /libpod/images/import?reference=&changes=…` with the tar stream as the body;
    /// returns the new image's id.
    pub(crate) async fn import(
        &self,
        body: Body,
        reference: &str,
        changes: &[String],
    ) -> EngineResult<String> {
        const WHAT: &str = "image import";
        let mut ep = format!(
            "/libpod/images/import?reference={}&message=sandbox-rs%20snapshot",
            encode(reference)
        );
        for c in changes {
            ep.push_str("&changes=");
            ep.push_str(&encode(c));
        }
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.uri(&ep))
            .header("content-type", "application/x-tar");
        let resp = self.send(WHAT, req, body).await?;
        if resp.status() != StatusCode::OK {
            return Err(Self::error_of(WHAT, resp).await);
        }
        let body = read_capped(resp.into_body())
            .await
            .map_err(|e| unreachable(WHAT, e))?;
        #[derive(Deserialize)]
        struct Imported {
            #[serde(rename = "Id")]
            id: String,
        }
        let i: Imported = serde_json::from_slice(&body).map_err(|e| invalid(WHAT, e))?;
        Ok(i.id)
    }

    /// `GET /libpod/images/json?filters={"label":[…]}`, narrowed by the first label;
    /// the others are checked here: Podman 4.3 answers none when the label filter holds
    /// more than one entry.
    pub(crate) async fn list_images(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> EngineResult<Vec<ImageInfo>> {
        const WHAT: &str = "image list";
        let filter: Vec<String> = labels
            .iter()
            .take(1)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let filters = serde_json::json!({ "label": filter }).to_string();
        let ep = format!("/libpod/images/json?filters={}", encode(&filters));
        let req = Request::builder().method(Method::GET).uri(self.uri(&ep));
        let resp = self.send(WHAT, req, Body::empty()).await?;
        if resp.status() != StatusCode::OK {
            return Err(Self::error_of(WHAT, resp).await);
        }
        let body = read_capped_to(resp.into_body(), IMAGE_ANSWER_CAP)
            .await
            .map_err(|e| unreachable(WHAT, e))?;
        let images = images_of(&body).map_err(|e| invalid(WHAT, e))?;
        Ok(images
            .into_iter()
            .filter(|i| labels.iter().all(|(k, v)| i.labels.get(k) == Some(v)))
            .collect())
    }

    /// `DELETE /libpod/images/{name}` (not forced): `Ok(false)` when it was gone,
    /// `Conflict` while a container uses it.
    pub(crate) async fn remove_image(&self, image: &str) -> EngineResult<bool> {
        const WHAT: &str = "image delete";
        let ep = format!("/libpod/images/{}", encode(image));
        let req = Request::builder().method(Method::DELETE).uri(self.uri(&ep));
        let resp = self.send(WHAT, req, Body::empty()).await?;
        match resp.status() {
            StatusCode::OK | StatusCode::NO_CONTENT => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(Self::error_of(WHAT, resp).await),
        }
    }

    /// `HEAD /containers/{id}/archive?path=`. A 404 is `NotFound` for a missing path and
    /// a missing container alike: the container layer tells them apart (it checks the
    /// container), so no extra round-trip here.
    pub(crate) async fn stat_path(&self, id: &str, path: &str) -> EngineResult<PathStat> {
        const WHAT: &str = "archive stat";
        let ep = format!("/containers/{}/archive?path={}", encode(id), encode(path));
        let req = Request::builder().method(Method::HEAD).uri(self.uri(&ep));
        let resp = self.send(WHAT, req, Body::empty()).await?;
        if resp.status() != StatusCode::OK {
            // A HEAD answer has no body: the status says it all.
            return Err(EngineError::new(
                EngineErrorKind::from_status(resp.status().as_u16()),
                format!("{WHAT}: engine answered {}", resp.status()),
            ));
        }
        let header = resp
            .headers()
            .get("x-docker-container-path-stat")
            .ok_or_else(|| invalid(WHAT, "the stat header is missing"))?;
        PathStat::from_archive_header(header.as_bytes())
            .ok_or_else(|| invalid(WHAT, "the stat header is not base64 JSON"))
    }

    /// `GET /containers/{id}/archive?path=`: the tar stream of `path` (`NotFound` for a
    /// missing path or container alike; the container layer tells them apart).
    pub(crate) async fn get_archive(&self, id: &str, path: &str) -> EngineResult<Body> {
        const WHAT: &str = "archive download";
        let ep = format!("/containers/{}/archive?path={}", encode(id), encode(path));
        let req = Request::builder().method(Method::GET).uri(self.uri(&ep));
        let resp = self.send(WHAT, req, Body::empty()).await?;
        match resp.status() {
            StatusCode::OK => Ok(resp.into_body()),
            _ => Err(Self::error_of(WHAT, resp).await),
        }
    }

    /// `POST /libpod/containers/{id}/attach` (stdin, stdout, stderr; no logs; detaching
    /// off), upgraded to the raw connection that carries the multiplexed stream.
    pub(crate) async fn attach(&self, id: &str) -> EngineResult<hyper::upgrade::Upgraded> {
        // An empty `detachKeys` (present, not omitted) turns detaching off: otherwise
        // ctrl-p ctrl-q in the protocol's bytes would end the attach.
        let ep = format!(
            "/libpod/containers/{}/attach?detachKeys=&stderr=true&stdin=true&stdout=true&stream=true",
            encode(id)
        );
        self.upgrade("container attach", &ep, Body::empty()).await
    }

    /// `POST /libpod/exec/{id}/start` (attached, no TTY), upgraded to the raw connection
    /// that carries the exec's multiplexed stream and its stdin.
    pub(crate) async fn start_exec(&self, exec_id: &str) -> EngineResult<hyper::upgrade::Upgraded> {
        let ep = format!("/libpod/exec/{}/start", encode(exec_id));
        let body = Body::from(r#"{"Detach":false,"Tty":false}"#);
        self.upgrade("exec start", &ep, body).await
    }

    /// `POST ep` asking for the connection to be upgraded to a raw stream.
    async fn upgrade(
        &self,
        what: &str,
        ep: &str,
        body: Body,
    ) -> EngineResult<hyper::upgrade::Upgraded> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.uri(ep))
            .header("content-type", "application/json")
            .header(hyper::header::CONNECTION, "Upgrade")
            .header(hyper::header::UPGRADE, "tcp");
        let resp = self.send(what, req, body).await?;
        match resp.status() {
            StatusCode::SWITCHING_PROTOCOLS => hyper::upgrade::on(resp)
                .await
                .map_err(|e| unreachable(what, e)),
            s if s.is_success() => Err(invalid(
                what,
                format!("{s} instead of an upgraded connection"),
            )),
            _ => Err(Self::error_of(what, resp).await),
        }
    }
}

/// Longest answer body read into memory (a create's id and warnings, an error's
/// message): an engine message may echo what a sandbox wrote, so it is capped.
const ANSWER_CAP: usize = 64 * 1024;

/// The first [`ANSWER_CAP`] bytes of an answer body; the rest is not read.
async fn read_capped(body: Body) -> std::result::Result<Vec<u8>, hyper::Error> {
    read_capped_to(body, ANSWER_CAP).await
}

/// The first `cap` bytes of an answer body; the rest is not read.
async fn read_capped_to(mut body: Body, cap: usize) -> std::result::Result<Vec<u8>, hyper::Error> {
    use hyper::body::HttpBody as _;
    let mut out = Vec::new();
    while out.len() < cap {
        match body.data().await {
            Some(chunk) => out.extend_from_slice(&chunk?),
            None => break,
        }
    }
    out.truncate(cap);
    Ok(out)
}

/// The most of an image inspect answer that is read: its history and labels make it
/// larger than other answers, and an answer cut short is an error, never a shorter list.
const IMAGE_ANSWER_CAP: usize = 4 * 1024 * 1024;

/// The `Config.Volumes` keys of an image inspect answer (none when absent or null).
fn image_volumes_of(body: &[u8]) -> std::result::Result<Vec<String>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Image {
        #[serde(rename = "Config", default)]
        config: Option<Config>,
    }
    #[derive(Deserialize)]
    struct Config {
        #[serde(rename = "Volumes", default)]
        volumes: Option<std::collections::BTreeMap<String, serde::de::IgnoredAny>>,
    }
    let image: Image = serde_json::from_slice(body)?;
    Ok(image
        .config
        .and_then(|c| c.volumes)
        .map(|v| v.into_keys().collect())
        .unwrap_or_default())
}

/// The configuration of an image inspect answer.
fn image_config_of(body: &[u8]) -> std::result::Result<ImageConfig, serde_json::Error> {
    #[derive(Deserialize)]
    struct Image {
        #[serde(rename = "Config", default)]
        config: Option<Config>,
    }
    #[derive(Deserialize, Default)]
    struct Config {
        #[serde(rename = "Env", default)]
        env: Option<Vec<String>>,
        #[serde(rename = "Cmd", default)]
        cmd: Option<Vec<String>>,
        #[serde(rename = "Entrypoint", default)]
        entrypoint: Option<Vec<String>>,
        #[serde(rename = "WorkingDir", default)]
        workdir: Option<String>,
        #[serde(rename = "User", default)]
        user: Option<String>,
        #[serde(rename = "Labels", default)]
        labels: Option<std::collections::BTreeMap<String, String>>,
    }
    let image: Image = serde_json::from_slice(body)?;
    let c = image.config.unwrap_or_default();
    let mut config = ImageConfig::default();
    config.env = c.env.unwrap_or_default();
    config.cmd = c.cmd.filter(|c| !c.is_empty());
    config.entrypoint = c.entrypoint.filter(|e| !e.is_empty());
    config.workdir = c.workdir.filter(|w| !w.is_empty());
    config.user = c.user.filter(|u| !u.is_empty());
    config.labels = c.labels.unwrap_or_default();
    Ok(config)
}

/// The images of an image list answer.
fn images_of(body: &[u8]) -> std::result::Result<Vec<ImageInfo>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Listed {
        #[serde(rename = "Id")]
        id: String,
        #[serde(rename = "RepoTags", default)]
        tags: Option<Vec<String>>,
        #[serde(rename = "Created", default)]
        created: Option<i64>,
        #[serde(rename = "Labels", default)]
        labels: Option<std::collections::BTreeMap<String, String>>,
    }
    let list: Vec<Listed> = serde_json::from_slice(body)?;
    Ok(list
        .into_iter()
        .map(|i| {
            ImageInfo::new(
                i.id,
                i.tags.unwrap_or_default(),
                i.created.and_then(sandbox_container::time::from_unix_secs),
                i.labels.unwrap_or_default(),
            )
        })
        .collect())
}

/// Percent-encodes a query/path component (RFC 3986 unreserved characters and `/` kept).
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_images_configuration_and_a_list_of_images_are_read() {
        let answer = br#"{"Id":"x","Config":{"Env":["PATH=/bin"],"Cmd":["sh"],"Labels":{"a":"b"},"WorkingDir":""}}"#;
        let c = image_config_of(answer).unwrap();
        assert_eq!(c.env, ["PATH=/bin"]);
        assert_eq!(c.cmd.as_deref(), Some(&["sh".to_string()][..]));
        assert_eq!((c.workdir, c.entrypoint), (None, None));
        assert_eq!(c.labels["a"], "b");
        let list = br#"[{"Id":"abc","RepoTags":["localhost/sandbox-rs/snapshot:t"],"Created":1700000000,"Labels":{"io.sandbox-rs.managed":"true"}},{"Id":"d","RepoTags":null,"Labels":null}]"#;
        let l = images_of(list).unwrap();
        assert_eq!(l[0].references, ["localhost/sandbox-rs/snapshot:t"]);
        assert!(l[0].created_at.is_some() && l[1].references.is_empty());
    }

    #[test]
    fn an_images_declared_volumes_are_read_and_a_cut_answer_is_an_error() {
        let answer = br#"{"Id":"x","Config":{"Env":["A=b"],"Volumes":{"/data":{},"/var/lib/db":{}}},"History":[]}"#;
        assert_eq!(image_volumes_of(answer).unwrap(), ["/data", "/var/lib/db"]);
        for none in [
            &br#"{"Config":{"Volumes":null}}"#[..],
            br#"{"Config":{}}"#,
            b"{}",
        ] {
            assert!(image_volumes_of(none).unwrap().is_empty());
        }
        assert!(
            image_volumes_of(&answer[..40]).is_err(),
            "never a shorter list"
        );
    }

    #[tokio::test]
    async fn answers_are_read_up_to_the_cap() {
        let big = Body::from(vec![b'x'; ANSWER_CAP * 3]);
        assert_eq!(read_capped(big).await.unwrap().len(), ANSWER_CAP);
        let small = Body::from("{\"Id\":\"abc\"}");
        assert_eq!(read_capped(small).await.unwrap(), b"{\"Id\":\"abc\"}");
    }

    #[tokio::test]
    async fn unexpected_answers_map_to_kinds_with_a_capped_message() {
        let answer = |status: u16, body: String| {
            let resp = hyper::Response::builder()
                .status(status)
                .body(Body::from(body))
                .unwrap();
            Rest::error_of("x", resp)
        };
        let json = |m: &str| format!("{{\"message\":\"{m}\"}}");
        assert_eq!(
            answer(404, json("gone")).await.kind,
            EngineErrorKind::NotFound
        );
        assert_eq!(
            answer(409, json("busy")).await.kind,
            EngineErrorKind::Conflict
        );
        assert_eq!(
            answer(400, json("bad")).await.kind,
            EngineErrorKind::InvalidRequest
        );
        assert_eq!(
            answer(500, json("sandbox-rs/nope:1: image not known"))
                .await
                .kind,
            EngineErrorKind::NotFound,
            "libpod's create answers a missing image with 500"
        );
        let e = answer(500, json("boom")).await;
        assert_eq!(e.kind, EngineErrorKind::Other);
        assert!(e.message.contains("boom"), "{}", e.message);
        let e = answer(500, "y\n".repeat(10_000)).await;
        assert!(e.message.chars().count() <= 300);
        assert!(!e.message.contains('\n'));
    }

    #[test]
    fn encodes_query_values() {
        assert_eq!(encode("/work/a b&c"), "/work/a%20b%26c");
    }

    #[test]
    fn refuses_unknown_schemes() {
        assert!(Rest::new("ssh://host/run/podman.sock").is_err());
        assert!(Rest::new("unix:///run/podman/podman.sock").is_ok());
        assert!(Rest::new("tcp://127.0.0.1:8080").is_ok());
    }
}
