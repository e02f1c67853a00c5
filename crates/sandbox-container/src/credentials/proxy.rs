//! The credentials proxy of one sandbox: a listener on the host's address on the
//! sandbox's network, reached only through the redirect in the sandbox's own rules. It
//! serves HTTPS for the bound hosts with the sandbox's CA, puts each credential's real
//! value where the request carries its placeholder (the bound placement only), forwards
//! to the bound host over TLS verified against the host's roots, and scrubs the real
//! values from what comes back. Plain HTTP and every other host are refused.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use sandbox_core::Placement;
use sandbox_core::layer::AuditRecord;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::Binding;

/// Longest request header block (hyper's read buffer; the smallest it allows is 8 KiB).
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Largest request body forwarded to a bound host.
pub(crate) const MAX_REQUEST_BODY: usize = 32 * 1024 * 1024;
/// Largest response body passed back (scrubbed as it streams).
pub(crate) const MAX_RESPONSE_BODY: u64 = 256 * 1024 * 1024;
/// Connections one sandbox may hold open to its proxy.
pub(crate) const MAX_CONNECTIONS: usize = 32;
/// A connection idle this long before its request's headers arrive is closed (also the
/// TLS handshake's bound).
pub(crate) const IDLE: Duration = Duration::from_secs(30);
/// Longest one upstream may take to answer a request's headers.
pub(crate) const UPSTREAM_ANSWER: Duration = Duration::from_secs(120);
/// Longest one connection lives, whatever it does.
pub(crate) const MAX_CONNECTION_TIME: Duration = Duration::from_secs(15 * 60);

type Body = BoxBody<Bytes, sandbox_core::BoxError>;

/// What every connection of one sandbox's proxy shares.
pub(crate) struct Proxy {
    pub sandbox_id: String,
    pub bindings: Arc<[Binding]>,
    /// Bound host → its addresses, resolved at create.
    pub upstream: HashMap<String, Vec<Ipv4Addr>>,
    /// The sandbox's own addresses: connections from anywhere else are closed unread.
    pub sources: Arc<RwLock<Vec<IpAddr>>>,
    pub tls_server: Arc<rustls::ServerConfig>,
    pub tls_client: Arc<rustls::ClientConfig>,
    /// The upstream port (443; tests point it elsewhere).
    pub upstream_port: u16,
    pub slots: Arc<Semaphore>,
    /// The audit sinks of the layer the sandbox was created under.
    pub events: sandbox_core::layer::EventReporter,
}

/// Accepts connections until the task is aborted (which drops the listener, closing the
/// port, and every connection task with it).
pub(crate) async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "credentials proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if !proxy.is_the_sandbox(peer) {
            tracing::warn!(sandbox_id = %proxy.sandbox_id, %peer, "credentials proxy: a connection from outside the sandbox was closed");
            continue;
        }
        let Ok(slot) = proxy.slots.clone().try_acquire_owned() else {
            tracing::warn!(sandbox_id = %proxy.sandbox_id, max = MAX_CONNECTIONS, "credentials proxy: too many connections; one closed");
            continue;
        };
        let p = proxy.clone();
        conns.spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(MAX_CONNECTION_TIME, connection(stream, p)).await;
        });
    }
}

impl Proxy {
    fn is_the_sandbox(&self, peer: SocketAddr) -> bool {
        self.sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&peer.ip())
    }
}

async fn connection(stream: TcpStream, proxy: Arc<Proxy>) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(IDLE, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        _ => return,
    }
    // A TLS record starts with its content type, 22 for a handshake.
    if first[0] != 0x16 {
        serve_http(TokioIo::new(stream), proxy, None).await;
        return;
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(proxy.tls_server.clone());
    let tls = match tokio::time::timeout(IDLE, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        // A name that is not bound gets no certificate: the handshake fails here.
        Ok(Err(e)) => {
            tracing::debug!(sandbox_id = %proxy.sandbox_id, error = %e, "credentials proxy: TLS handshake refused");
            return;
        }
        Err(_) => return,
    };
    let sni = tls
        .get_ref()
        .1
        .server_name()
        .map(|s| s.trim_end_matches('.').to_ascii_lowercase());
    serve_http(TokioIo::new(tls), proxy, sni).await;
}

async fn serve_http<I>(io: TokioIo<I>, proxy: Arc<Proxy>, sni: Option<String>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let proxy = proxy.clone();
        let sni = sni.clone();
        async move { Ok::<_, Infallible>(handle(req, &proxy, sni.as_deref()).await) }
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(IDLE)
        .max_buf_size(MAX_HEADER_BYTES);
    if let Err(e) = b.serve_connection(io, service).await {
        tracing::debug!(error = %e, "credentials proxy: connection ended");
    }
}

fn refusal(status: StatusCode, why: &str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(format!(
            "sandbox-rs credentials proxy: {why}\n"
        )))
        .map_err(|never| match never {})
        .boxed(),
    );
    *r.status_mut() = status;
    r
}

/// The host a request names (its `Host` header, else the target's authority), lower-case
/// and without port.
fn request_host<B>(req: &Request<B>) -> Option<String> {
    let raw = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))?;
    let host = match raw.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => raw.as_str(),
    };
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

/// The longest host, method and path an audit record keeps: the sandbox writes them, and
/// the host's audit trail must not grow by what hyper's 64 KiB header bound allows.
const MAX_AUDIT_HOST: usize = 255;
const MAX_AUDIT_METHOD: usize = 32;
const MAX_AUDIT_PATH: usize = 1024;

/// What one request came to, for its audit record.
enum Verdict {
    /// Forwarded; the host answered (its status is the response's).
    Forwarded,
    /// Refused by the proxy by policy (never forwarded).
    Refused(String),
    /// Forwarded, but the host failed or did not answer in time.
    UpstreamFailed(String),
}

/// Answers one request and reports it to the audit sinks (names and status only: the
/// secret is never in the record, and the layer's redaction hides it anyway).
async fn handle(req: Request<Incoming>, proxy: &Proxy, sni: Option<&str>) -> Response<Body> {
    let started = std::time::SystemTime::now();
    let host = request_host(&req);
    // Kept for the record only when a sink will read it.
    let seen = proxy
        .events
        .is_active()
        .then(|| (req.method().to_string(), req.uri().path().to_string()));
    let mut injected = Vec::new();
    let (resp, verdict) = answer(req, proxy, sni, host.as_deref(), &mut injected).await;
    if let Some((method, path)) = seen {
        let mut r = proxy
            .events
            .record("credentials.request", &proxy.sandbox_id, started);
        r.host = sni
            .map(str::to_string)
            .or(host)
            .map(|h| AuditRecord::capped(h, MAX_AUDIT_HOST));
        r.method = Some(AuditRecord::capped(method, MAX_AUDIT_METHOD));
        r.path = Some(AuditRecord::capped(path, MAX_AUDIT_PATH));
        r.status = Some(resp.status().as_u16());
        r.credentials = Some(injected);
        match verdict {
            Verdict::Forwarded => {}
            Verdict::Refused(why) => {
                r.outcome = sandbox_core::layer::Outcome::Error;
                r.error_code = Some(sandbox_core::ErrorCode::NetworkPolicyViolation.as_str());
                r.error = Some(why);
            }
            Verdict::UpstreamFailed(why) => {
                r.outcome = sandbox_core::layer::Outcome::Error;
                r.error = Some(why);
            }
        }
        proxy.events.report(r);
    }
    resp
}

async fn answer(
    req: Request<Incoming>,
    proxy: &Proxy,
    sni: Option<&str>,
    host: Option<&str>,
    injected: &mut Vec<String>,
) -> (Response<Body>, Verdict) {
    let refused =
        |status: StatusCode, why: &str| (refusal(status, why), Verdict::Refused(why.to_string()));
    let Some(sni) = sni else {
        tracing::info!(sandbox_id = %proxy.sandbox_id, host = host.unwrap_or(""), "credentials proxy: plain HTTP to a bound host refused");
        return refused(
            StatusCode::FORBIDDEN,
            "plain HTTP to a host with a brokered credential is refused (the credential \
             would cross the network in clear); use https",
        );
    };
    if host != Some(sni) {
        return refused(
            StatusCode::MISDIRECTED_REQUEST,
            "the request's Host is not the name the connection was opened for",
        );
    }
    let Some(addrs) = proxy.upstream.get(sni) else {
        return refused(
            StatusCode::FORBIDDEN,
            "not a host with a brokered credential",
        );
    };
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let (mut parts, body) = req.into_parts();
    *injected = inject(&mut parts, &proxy.bindings, sni);
    for h in HOP_BY_HOP {
        parts.headers.remove(h);
    }
    // An encoded answer could not be scrubbed: ask for it plain.
    parts.headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let body = Limited::new(body, MAX_REQUEST_BODY).boxed();
    let upstream = Request::from_parts(parts, body);
    let answer = tokio::time::timeout(UPSTREAM_ANSWER, forward(upstream, sni, addrs, proxy)).await;
    let resp = match answer {
        Ok(Ok(r)) => r,
        Ok(Err(why)) => {
            tracing::info!(sandbox_id = %proxy.sandbox_id, host = sni, %method, path, error = %why, "credentials proxy: upstream failed");
            return (
                refusal(StatusCode::BAD_GATEWAY, &why),
                Verdict::UpstreamFailed(why),
            );
        }
        Err(_) => {
            let why = "the host did not answer in time";
            return (
                refusal(StatusCode::GATEWAY_TIMEOUT, why),
                Verdict::UpstreamFailed(why.to_string()),
            );
        }
    };
    tracing::info!(
        target: "sandbox_rs::credentials",
        sandbox_id = %proxy.sandbox_id,
        host = sni,
        %method,
        path,
        injected = ?injected,
        status = resp.status().as_u16(),
        "credentials proxy: request forwarded"
    );
    (scrub_response(resp, &proxy.bindings), Verdict::Forwarded)
}

const HOP_BY_HOP: [HeaderName; 5] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::UPGRADE,
];

/// Puts the real value of each credential bound to `host` where the request carries its
/// placeholder in the bound placement, and nowhere else. Returns the variables injected
/// (for the audit line: names, never values).
pub(crate) fn inject(
    parts: &mut http::request::Parts,
    bindings: &[Binding],
    host: &str,
) -> Vec<String> {
    let mut injected = Vec::new();
    for b in bindings
        .iter()
        .filter(|b| b.hosts.iter().any(|h| h == host))
    {
        match &b.placement {
            Placement::Header { name, template } => {
                let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                    continue;
                };
                let sent = template.replacen("{}", &b.placeholder, 1);
                if parts
                    .headers
                    .get(&name)
                    .is_some_and(|v| v.as_bytes() == sent.as_bytes())
                {
                    let real = template.replacen("{}", b.secret.expose(), 1);
                    if let Ok(mut v) = HeaderValue::from_str(&real) {
                        v.set_sensitive(true);
                        parts.headers.insert(name, v);
                        injected.push(b.env_var.clone());
                    }
                }
            }
            Placement::Query { name } => {
                let Some(q) = parts.uri.query() else { continue };
                let mut hit = false;
                let rewritten: Vec<String> = q
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some((k, v)) if k == name && v == b.placeholder => {
                            hit = true;
                            format!("{k}={}", percent_encode(b.secret.expose()))
                        }
                        _ => pair.to_string(),
                    })
                    .collect();
                if hit {
                    let pq = format!("{}?{}", parts.uri.path(), rewritten.join("&"));
                    if let Ok(uri) = Uri::builder().path_and_query(pq).build() {
                        parts.uri = uri;
                        injected.push(b.env_var.clone());
                    }
                }
            }
            // A placement this proxy does not know injects nothing.
            _ => {}
        }
    }
    injected
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Sends `req` to `host` at one of `addrs` over TLS verified against the host's roots.
async fn forward(
    req: Request<Body>,
    host: &str,
    addrs: &[Ipv4Addr],
    proxy: &Proxy,
) -> Result<Response<Incoming>, String> {
    let mut last = String::from("the host has no address");
    let mut tcp = None;
    for a in addrs {
        match tokio::time::timeout(
            Duration::from_secs(10),
            TcpStream::connect((*a, proxy.upstream_port)),
        )
        .await
        {
            Ok(Ok(s)) => {
                tcp = Some(s);
                break;
            }
            Ok(Err(e)) => last = format!("connecting to {host}: {e}"),
            Err(_) => last = format!("connecting to {host} timed out"),
        }
    }
    let tcp = tcp.ok_or(last)?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host} is no TLS name: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(proxy.tls_client.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS with {host} failed: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEADER_BYTES)
        .handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP with {host} failed: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| format!("the request to {host} failed: {e}"))
}

/// The response with every credential's real value replaced by its placeholder, in the
/// headers and in the body as it streams (bounded to [`MAX_RESPONSE_BODY`]).
fn scrub_response(resp: Response<Incoming>, bindings: &Arc<[Binding]>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    for v in parts.headers.values_mut() {
        let scrubbed = scrub_all(v.as_bytes(), bindings);
        if scrubbed != v.as_bytes()
            && let Ok(n) = HeaderValue::from_bytes(&scrubbed)
        {
            *v = n;
        }
    }
    // The scrubbed body may differ in length: sent chunked instead.
    parts.headers.remove(header::CONTENT_LENGTH);
    for h in HOP_BY_HOP {
        parts.headers.remove(h);
    }
    let state = (body, Scrubber::new(bindings.clone()), 0u64, false);
    let stream = futures::stream::unfold(state, |(mut body, mut s, mut seen, done)| async move {
        if done {
            return None;
        }
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        // Trailers are dropped: they could carry a value unscrubbed.
                        continue;
                    };
                    seen += data.len() as u64;
                    if seen > MAX_RESPONSE_BODY {
                        let e: sandbox_core::BoxError =
                            "the response is longer than the proxy passes".into();
                        return Some((Err(e), (body, s, seen, true)));
                    }
                    let out = s.push(&data);
                    if !out.is_empty() {
                        return Some((Ok(Frame::data(Bytes::from(out))), (body, s, seen, false)));
                    }
                }
                Some(Err(e)) => {
                    let e: sandbox_core::BoxError = Box::new(e);
                    return Some((Err(e), (body, s, seen, true)));
                }
                None => {
                    let rest = s.finish();
                    return Some((Ok(Frame::data(Bytes::from(rest))), (body, s, seen, true)));
                }
            }
        }
    });
    Response::from_parts(parts, StreamBody::new(stream).boxed())
}

fn scrub_all(bytes: &[u8], bindings: &[Binding]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for b in bindings {
        out = replace_all(&out, b.secret.expose().as_bytes(), b.placeholder.as_bytes());
    }
    out
}

fn replace_all(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() || hay.len() < from.len() {
        return hay.to_vec();
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

/// Replaces real values by placeholders in a stream, holding back the last bytes of each
/// chunk that could start a value split across chunks.
pub(crate) struct Scrubber {
    bindings: Arc<[Binding]>,
    pending: Vec<u8>,
    keep: usize,
}

impl Scrubber {
    pub(crate) fn new(bindings: Arc<[Binding]>) -> Self {
        let keep = bindings
            .iter()
            .map(|b| b.secret.expose().len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        Scrubber {
            bindings,
            pending: Vec::new(),
            keep,
        }
    }

    /// What can be sent of everything pushed so far.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        let scrubbed = scrub_all(&self.pending, &self.bindings);
        // A value that starts before the held-back tail ends inside what was scanned, so
        // it was replaced; only the tail can hold the start of one cut by the chunk.
        let cut = scrubbed.len().saturating_sub(self.keep);
        self.pending = scrubbed[cut..].to_vec();
        scrubbed[..cut].to_vec()
    }

    /// The rest, at the end of the body.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        let rest = scrub_all(&self.pending, &self.bindings);
        self.pending.clear();
        rest
    }
}
