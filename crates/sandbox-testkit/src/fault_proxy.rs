//! The fault-injecting proxy both adapters' contract suites put in front of their engine
//! socket: one proxy instead of one per adapter, so the suite's fault trials make
//! container removals and creates hang or fail, and pulls meet a locked registry, while
//! the adapter's own HTTP client and error mapping stay in the path.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

use crate::registry::{self, TestRegistry};

/// What the proxy does with a container removal (`DELETE …/containers/<id>…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Relayed to the engine.
    Pass,
    /// Held until the mode changes (then handled as the new mode says): a wedged engine.
    Hang,
    /// Answered with HTTP 500 and a JSON body both engines' clients parse.
    Fail,
}

impl Fault {
    fn from_u8(v: u8) -> Fault {
        match v {
            1 => Fault::Hang,
            2 => Fault::Fail,
            _ => Fault::Pass,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Fault::Pass => 0,
            Fault::Hang => 1,
            Fault::Fail => 2,
        }
    }
}

/// The 500 body: `message` is what Docker's client reads, `cause`/`response` what
/// Podman's libpod errors carry.
const FAIL_BODY: &[u8] =
    br#"{"cause":"injected fault","message":"injected fault: removal failed","response":500}"#;

/// A unix-socket HTTP/1.1 proxy to an engine socket that intercepts container removals.
/// Everything else passes through, request by request on keep-alive connections,
/// including chunked bodies and upgraded (exec attach) connections. Stops accepting and
/// removes its socket when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    path: PathBuf,
    mode: Arc<AtomicU8>,
    create: Arc<AtomicU8>,
    pulls: PullRedirect,
    /// The registry [`FaultProxy::lock_pulls`] sends pulls to, started once.
    locked: tokio::sync::OnceCell<TestRegistry>,
    accept: JoinHandle<()>,
}

/// Where image pulls go instead of the image asked for (see
/// [`FaultProxy::redirect_pulls`]).
type PullRedirect = Arc<std::sync::Mutex<Option<String>>>;

impl FaultProxy {
    /// Listens on a fresh socket in the temp dir and relays to `upstream` (a socket path,
    /// without `unix://`). Must be called inside a tokio runtime.
    pub async fn start(upstream: impl Into<PathBuf>) -> std::io::Result<FaultProxy> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let upstream: PathBuf = upstream.into();
        let path = std::env::temp_dir().join(format!(
            "sbx-fault-proxy-{}-{}.sock",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let mode = Arc::new(AtomicU8::new(Fault::Pass.as_u8()));
        let create = Arc::new(AtomicU8::new(Fault::Pass.as_u8()));
        let pulls = PullRedirect::default();
        let (m, c, p) = (mode.clone(), create.clone(), pulls.clone());
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (m, c, p, upstream) = (m.clone(), c.clone(), p.clone(), upstream.clone());
                tokio::spawn(async move {
                    let _ = relay(conn, &upstream, m, c, p).await;
                });
            }
        });
        Ok(FaultProxy {
            path,
            mode,
            create,
            pulls,
            locked: tokio::sync::OnceCell::new(),
            accept,
        })
    }

    /// The proxy's socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The proxy's endpoint, `unix://<path>`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    /// What removals do from now on (a held removal follows the change).
    pub fn set(&self, fault: Fault) {
        self.mode.store(fault.as_u8(), Ordering::SeqCst);
    }

    /// What container creations (`POST …/containers/create`) do from now on. A held
    /// create is never relayed late (its client has given up by then): once the mode
    /// changes it is answered as a failure.
    pub fn set_create(&self, fault: Fault) {
        self.create.store(fault.as_u8(), Ordering::SeqCst);
    }

    /// With `Some(image)`: every image is missing (the engine's image inspect /
    /// `exists`, and a container create, are answered 404 as for an image the engine
    /// does not have) and every pull (Docker `POST …/images/create`, Podman
    /// `POST …/libpod/images/pull`) is relayed to the engine for `image` instead, without
    /// TLS verification (a loopback test registry). Pointed at a registry that demands
    /// credentials, a create then meets a real registry refusal through the real engine,
    /// whatever image it asked for. `None` relays them unchanged again.
    pub fn redirect_pulls(&self, image: Option<String>) {
        *self.pulls.lock().unwrap_or_else(|p| p.into_inner()) = image;
    }

    /// A withheld registry credential: from now on every image reads as missing and
    /// every pull goes to a loopback registry (serving `cli`'s export of the source image,
    /// started on first use) that demands a credential nobody is given, so a create meets
    /// a real registry refusal through the real engine. [`FaultProxy::redirect_pulls`]
    /// with `None` ends it.
    pub async fn lock_pulls(&self, cli: &'static str) -> Result<(), String> {
        let reg = self.locked.get_or_try_init(|| locked_registry(cli)).await?;
        self.redirect_pulls(Some(format!("{}/{}", reg.host(), LOCKED_IMAGE)));
        Ok(())
    }

    /// The current mode.
    pub fn fault(&self) -> Fault {
        Fault::from_u8(self.mode.load(Ordering::SeqCst))
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The repository and tag a [`locked_registry`] serves (behind a credential).
pub const LOCKED_IMAGE: &str = "sbx-contract/locked:1";

/// A registry on loopback that demands a credential nobody is given, serving `cli`'s
/// export of [`registry::SOURCE_IMAGE`] as [`LOCKED_IMAGE`] (see
/// [`FaultProxy::lock_pulls`]).
pub async fn locked_registry(cli: &'static str) -> Result<TestRegistry, String> {
    let archive = tokio::task::spawn_blocking(move || registry::source_archive(cli))
        .await
        .map_err(|e| e.to_string())??;
    let (repo, tag) = LOCKED_IMAGE.split_once(':').unwrap_or((LOCKED_IMAGE, "1"));
    TestRegistry::start(
        &archive,
        &[(repo, tag)],
        Some(("sbx-nobody", "sbx-never-given")),
    )
    .await
    .map_err(|e| format!("start the locked registry: {e}"))
}

async fn relay(
    client: UnixStream,
    upstream: &Path,
    mode: Arc<AtomicU8>,
    create: Arc<AtomicU8>,
    pulls: PullRedirect,
) -> std::io::Result<()> {
    let upstream = UnixStream::connect(upstream).await?;
    let (cr, cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let cw = Arc::new(tokio::sync::Mutex::new(cw));
    let down_cw = cw.clone();
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match ur.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if down_cw.lock().await.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = down_cw.lock().await.shutdown().await;
    });
    let mut reader = BufReader::new(cr);
    loop {
        let mut head = Vec::new();
        loop {
            let n = reader.read_until(b'\n', &mut head).await?;
            if n == 0 {
                let _ = uw.shutdown().await;
                return Ok(());
            }
            if head.ends_with(b"\r\n\r\n") {
                break;
            }
            if head.len() > 1 << 20 {
                return Err(std::io::Error::other("request head over 1 MiB"));
            }
        }
        let redirect = pulls.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(to) = redirect {
            match pull_step(&head) {
                Some(PullStep::Inspect | PullStep::Create) => {
                    down.abort();
                    return not_found(&cw).await;
                }
                Some(PullStep::Pull) => head = redirect_pull(&head, &to),
                None => {}
            }
        }
        let text = String::from_utf8_lossy(&head).to_string();
        let mut lines = text.split("\r\n");
        let first = lines.next().unwrap_or_default().to_string();
        let mut content_length = None;
        let mut chunked = false;
        let mut upgrade = false;
        for l in lines {
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase());
            match k.as_str() {
                "content-length" => content_length = v.parse::<u64>().ok(),
                "transfer-encoding" => chunked = v.contains("chunked"),
                "upgrade" => upgrade = true,
                _ => {}
            }
        }
        if first.starts_with("POST ") && first.contains("/containers/create") {
            let held = Fault::from_u8(create.load(Ordering::SeqCst)) == Fault::Hang;
            while Fault::from_u8(create.load(Ordering::SeqCst)) == Fault::Hang {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if held || Fault::from_u8(create.load(Ordering::SeqCst)) == Fault::Fail {
                down.abort();
                return fail(&cw).await;
            }
        }
        if first.starts_with("DELETE ") && first.contains("/containers/") {
            while Fault::from_u8(mode.load(Ordering::SeqCst)) == Fault::Hang {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if Fault::from_u8(mode.load(Ordering::SeqCst)) == Fault::Fail {
                down.abort();
                return fail(&cw).await;
            }
        }
        uw.write_all(&head).await?;
        if upgrade {
            tokio::io::copy(&mut reader, &mut uw).await?;
            let _ = uw.shutdown().await;
            return Ok(());
        }
        if let Some(n) = content_length {
            let mut body = (&mut reader).take(n);
            tokio::io::copy(&mut body, &mut uw).await?;
        } else if chunked {
            loop {
                let mut line = Vec::new();
                reader.read_until(b'\n', &mut line).await?;
                uw.write_all(&line).await?;
                let size_text = String::from_utf8_lossy(&line);
                let size_hex = size_text.trim().split(';').next().unwrap_or("0");
                let size = u64::from_str_radix(size_hex, 16).unwrap_or(0);
                if size == 0 {
                    // Trailers, then the final empty line.
                    loop {
                        let mut t = Vec::new();
                        if reader.read_until(b'\n', &mut t).await? == 0 {
                            return Ok(());
                        }
                        uw.write_all(&t).await?;
                        if t == b"\r\n" {
                            break;
                        }
                    }
                    break;
                }
                let mut chunk = (&mut reader).take(size + 2);
                tokio::io::copy(&mut chunk, &mut uw).await?;
            }
        }
    }
}

/// Answers the request with HTTP 500 and [`FAIL_BODY`], then closes the connection.
async fn fail(cw: &tokio::sync::Mutex<tokio::net::unix::OwnedWriteHalf>) -> std::io::Result<()> {
    answer(cw, "500 Internal Server Error", FAIL_BODY).await
}

/// The 404 of a missing image, in the shape both engines' clients parse.
const NOT_FOUND_BODY: &[u8] =
    br#"{"cause":"image not known","message":"No such image (fault proxy)","response":404}"#;

/// Answers an image inspect with HTTP 404, then closes the connection.
async fn not_found(
    cw: &tokio::sync::Mutex<tokio::net::unix::OwnedWriteHalf>,
) -> std::io::Result<()> {
    answer(cw, "404 Not Found", NOT_FOUND_BODY).await
}

async fn answer(
    cw: &tokio::sync::Mutex<tokio::net::unix::OwnedWriteHalf>,
    status: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut w = cw.lock().await;
    w.write_all(resp.as_bytes()).await?;
    w.write_all(body).await?;
    w.shutdown().await
}

/// The image requests [`FaultProxy::redirect_pulls`] acts on.
#[derive(Debug, PartialEq, Eq)]
enum PullStep {
    /// Docker `GET …/images/<name>/json`, Podman `GET …/libpod/images/<name>/exists`.
    Inspect,
    /// `POST …/containers/create` (both engines): it names an image, so with every image
    /// missing it fails as the engine fails a create of a missing image.
    Create,
    /// Docker `POST …/images/create`, Podman `POST …/libpod/images/pull`.
    Pull,
}

fn pull_step(head: &[u8]) -> Option<PullStep> {
    let first = head.split(|b| *b == b'\r').next()?;
    let first = std::str::from_utf8(first).ok()?;
    let mut parts = first.split(' ');
    let (method, target) = (parts.next()?, parts.next()?);
    let path = target.split('?').next()?;
    match method {
        "GET"
            if path.contains("/images/")
                && !path.contains("/containers/")
                && (path.ends_with("/json") || path.ends_with("/exists")) =>
        {
            Some(PullStep::Inspect)
        }
        "POST" if path.ends_with("/images/create") || path.ends_with("/libpod/images/pull") => {
            Some(PullStep::Pull)
        }
        "POST" if path.ends_with("/containers/create") => Some(PullStep::Create),
        _ => None,
    }
}

/// `head` with its pull target replaced by `to` (Docker `fromImage`, whose `tag` goes;
/// Podman `reference`, plus `tlsVerify=false`); other parameters are kept.
fn redirect_pull(head: &[u8], to: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let (first, rest) = text.split_once("\r\n").unwrap_or((&text, ""));
    let mut parts = first.splitn(3, ' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let podman = path.ends_with("/libpod/images/pull");
    let dropped = ["fromImage", "tag", "reference", "tlsVerify"];
    let mut params: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| !dropped.contains(&p.split('=').next().unwrap_or_default()))
        .map(str::to_string)
        .collect();
    let to = percent_encode(to);
    if podman {
        params.push(format!("reference={to}"));
        params.push("tlsVerify=false".into());
    } else {
        params.push(format!("fromImage={to}"));
    }
    format!("{method} {path}?{} {version}\r\n{rest}", params.join("&")).into_bytes()
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake engine answering every request with 200 `ok` (keep-alive), so the proxy's
    /// interception is observable without an engine.
    async fn fake_engine(path: &Path) -> JoinHandle<()> {
        let listener = UnixListener::bind(path).unwrap();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut r = BufReader::new(conn);
                    loop {
                        let mut head = Vec::new();
                        loop {
                            match r.read_until(b'\n', &mut head).await {
                                Ok(0) | Err(_) => return,
                                Ok(_) if head.ends_with(b"\r\n\r\n") => break,
                                Ok(_) => {}
                            }
                        }
                        let resp = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if r.get_mut().write_all(resp).await.is_err() {
                            return;
                        }
                    }
                });
            }
        })
    }

    async fn request(proxy: &FaultProxy, line: &str) -> String {
        let mut c = UnixStream::connect(proxy.path()).await.unwrap();
        c.write_all(format!("{line}\r\nHost: x\r\nContent-Length: 0\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = c.read(&mut buf).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).to_string()
    }

    #[tokio::test]
    async fn removals_pass_fail_and_hang_until_healed() {
        let upstream =
            std::env::temp_dir().join(format!("sbx-fault-proxy-test-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&upstream);
        let engine = fake_engine(&upstream).await;
        let proxy = FaultProxy::start(&upstream).await.unwrap();
        let delete = "DELETE /v1.41/containers/abc?force=true HTTP/1.1";

        assert!(request(&proxy, delete).await.starts_with("HTTP/1.1 200"));

        proxy.set(Fault::Fail);
        let r = request(&proxy, delete).await;
        assert!(
            r.starts_with("HTTP/1.1 500") && r.contains("injected fault"),
            "{r}"
        );
        // Only removals are touched.
        assert!(
            request(&proxy, "GET /v1.41/containers/abc/json HTTP/1.1")
                .await
                .starts_with("HTTP/1.1 200")
        );

        proxy.set(Fault::Hang);
        let held = tokio::time::timeout(Duration::from_millis(300), request(&proxy, delete)).await;
        assert!(held.is_err(), "a removal answered while hanging");
        let p = Arc::new(proxy);
        let p2 = p.clone();
        let pending = tokio::spawn(async move { request(&p2, delete).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        p.set(Fault::Pass);
        let r = tokio::time::timeout(Duration::from_secs(5), pending)
            .await
            .expect("a held removal resumes when healed")
            .unwrap();
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");

        // Creations fail, or are held and then failed (never relayed late).
        let create = "POST /v1.41/containers/create?name=x HTTP/1.1";
        p.set_create(Fault::Fail);
        assert!(request(&p, create).await.starts_with("HTTP/1.1 500"));
        assert!(request(&p, delete).await.starts_with("HTTP/1.1 200"));
        p.set_create(Fault::Hang);
        let p3 = p.clone();
        let held = tokio::spawn(async move { request(&p3, create).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!held.is_finished(), "a held create answered");
        p.set_create(Fault::Pass);
        let r = tokio::time::timeout(Duration::from_secs(5), held)
            .await
            .expect("a held create is answered once healed")
            .unwrap();
        assert!(r.starts_with("HTTP/1.1 500"), "{r}");
        assert!(request(&p, create).await.starts_with("HTTP/1.1 200"));

        let path = p.path().to_path_buf();
        drop(p);
        assert!(!path.exists(), "the proxy socket is removed on drop");
        engine.abort();
        let _ = std::fs::remove_file(&upstream);
    }

    #[test]
    fn pulls_are_redirected_and_images_reported_missing() {
        let head = |line: &str| format!("{line}\r\nHost: x\r\n\r\n").into_bytes();
        let step = |line: &str| pull_step(&head(line));
        assert_eq!(
            step("GET /v1.41/images/sandbox-rs/busybox:latest/json HTTP/1.1"),
            Some(PullStep::Inspect)
        );
        assert_eq!(
            step("GET /v4.3.1/libpod/images/sandbox-rs/busybox:latest/exists HTTP/1.1"),
            Some(PullStep::Inspect)
        );
        assert_eq!(step("GET /v1.41/containers/abc/json HTTP/1.1"), None);
        assert_eq!(
            step("POST /v1.41/containers/create?name=sbx-1 HTTP/1.1"),
            Some(PullStep::Create)
        );
        assert_eq!(
            step("POST /v4.3.1/libpod/containers/create HTTP/1.1"),
            Some(PullStep::Create)
        );
        assert_eq!(step("POST /v1.41/containers/abc/start HTTP/1.1"), None);
        assert_eq!(step("DELETE /v1.41/images/x/json HTTP/1.1"), None);

        let docker = "POST /v1.41/images/create?fromImage=sandbox-rs%2Fbusybox&tag=latest HTTP/1.1";
        assert_eq!(step(docker), Some(PullStep::Pull));
        let out = String::from_utf8(redirect_pull(&head(docker), "127.0.0.1:5000/p/q:1")).unwrap();
        assert_eq!(
            out,
            "POST /v1.41/images/create?fromImage=127.0.0.1%3A5000%2Fp%2Fq%3A1 HTTP/1.1\r\nHost: x\r\n\r\n"
        );

        let podman =
            "POST /v4.3.1/libpod/images/pull?quiet=false&reference=a%2Fb%3Alatest HTTP/1.1";
        assert_eq!(step(podman), Some(PullStep::Pull));
        let out = String::from_utf8(redirect_pull(&head(podman), "127.0.0.1:5000/p/q:1")).unwrap();
        assert!(
            out.starts_with(
                "POST /v4.3.1/libpod/images/pull?quiet=false&reference=127.0.0.1%3A5000%2Fp%2Fq%3A1&tlsVerify=false HTTP/1.1\r\n"
            ),
            "{out}"
        );
    }
}
