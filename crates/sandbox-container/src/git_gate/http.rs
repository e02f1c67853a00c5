//! The gate's HTTP/1.1 server: the token check, the three smart-HTTP endpoints of each
//! repository and nothing else, and `git http-backend` run as CGI for each request with
//! both bodies streamed.
//!
//! Bounds against the code inside the sandbox, which writes every request: headers at
//! most [`MAX_HEADERS`] bytes and read within [`HEADER_TIME`]; one connection (and so
//! each of its requests) at most [`REQUEST_TIME`], a request body at most [`MAX_BODY`]
//! bytes; the backend's CGI header at most
//! [`MAX_CGI_HEADER`] bytes. The backend runs with the gate's config on top of the
//! repository's: its hooks directory (the prefix check), receive-pack only with
//! read-write access, no file served but the protocol's. Every request it answers is one
//! audit record ([`super::audit`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use sandbox_core::{ErrorCode, GitAccess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::audit::{self, Audit};
use super::{Gate, Served};

/// Largest request head (line and headers).
const MAX_HEADERS: usize = 64 * 1024;

/// Time to send a request head.
const HEADER_TIME: Duration = Duration::from_secs(30);

/// Longest one connection may last (its requests, bodies and backends included).
const REQUEST_TIME: Duration = Duration::from_secs(600);

/// Largest request body (a push's pack).
const MAX_BODY: u64 = 1 << 30;

/// Largest command list of one push (its pkt-lines up to the flush): thousands of refs.
const MAX_COMMANDS: usize = 1 << 20;

/// Largest CGI header the backend may write.
const MAX_CGI_HEADER: usize = 64 * 1024;

type Body = BoxBody<Bytes, std::io::Error>;

/// Serves one connection until it ends or breaks a bound.
pub(super) async fn serve<S>(gate: Arc<Gate>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(stream);
    let service = hyper::service::service_fn(move |req| {
        let gate = gate.clone();
        async move { Ok::<_, Infallible>(handle(gate, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .max_buf_size(MAX_HEADERS)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIME)
        .serve_connection(io, service);
    if let Ok(Err(e)) = tokio::time::timeout(REQUEST_TIME, conn).await {
        tracing::debug!(error = %e, "git gate: connection ended");
    }
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(format!("{message}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    r
}

/// Whether the request carries the gate's token as the password of basic credentials.
fn authorized(gate: &Gate, req: &Request<Incoming>) -> bool {
    let Some(value) = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some(b64) = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))
    else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
        return false;
    };
    let Some(colon) = decoded.iter().position(|b| *b == b':') else {
        return false;
    };
    gate.token.matches(&decoded[colon + 1..])
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// `GET info/refs?service=…`.
    Refs { push: bool },
    /// `POST git-upload-pack`.
    UploadPack,
    /// `POST git-receive-pack`.
    ReceivePack,
}

/// The repository and endpoint of `path`/`query`, or `None` for anything but the smart
/// protocol's three endpoints (the dumb protocol's files, the config, hooks, objects by
/// path: never served).
pub(super) fn route<'g>(
    repos: &'g [Served],
    method: &hyper::Method,
    path: &str,
    query: Option<&str>,
) -> Option<(&'g Served, Endpoint)> {
    let rest = path.strip_prefix('/')?;
    let (name, endpoint) = rest.split_once(".git/")?;
    let repo = repos.iter().find(|r| r.name == name)?;
    let endpoint = match (method, endpoint, query) {
        (&hyper::Method::GET, "info/refs", Some("service=git-upload-pack")) => {
            Endpoint::Refs { push: false }
        }
        (&hyper::Method::GET, "info/refs", Some("service=git-receive-pack")) => {
            Endpoint::Refs { push: true }
        }
        (&hyper::Method::POST, "git-upload-pack", None) => Endpoint::UploadPack,
        (&hyper::Method::POST, "git-receive-pack", None) => Endpoint::ReceivePack,
        _ => return None,
    };
    Some((repo, endpoint))
}

/// Answers `status` with `why`, and records the request as refused by the gate's rules.
fn refuse(audit: Audit, status: StatusCode, why: &str) -> Response<Body> {
    audit.refused(status, ErrorCode::NetworkPolicyViolation, why);
    text(status, why)
}

/// Answers `status` with `why`, and records the request as failed on the host's side.
fn fail(audit: Audit, status: StatusCode, why: &str) -> Response<Body> {
    audit.failed(status, why);
    text(status, why)
}

async fn handle(gate: Arc<Gate>, req: Request<Incoming>) -> Response<Body> {
    let mut audit = Audit::begin(&gate, &req);
    let routed = route(
        &gate.repos,
        req.method(),
        req.uri().path(),
        req.uri().query(),
    );
    if let Some((repo, endpoint)) = routed {
        audit.routed(repo, endpoint);
    }
    if !authorized(&gate, &req) {
        let why = "this sandbox's gate token is required";
        // A git client's first request carries no credentials: the 401 is its cue to send
        // the token. The record tells that apart from a token that is not this gate's.
        let recorded = if req.headers().contains_key(hyper::header::AUTHORIZATION) {
            "refused: the credentials are not this sandbox's gate token"
        } else {
            "refused: no credentials (a git client sends the token after this answer)"
        };
        audit.refused(StatusCode::UNAUTHORIZED, ErrorCode::Auth, recorded);
        let mut r = text(StatusCode::UNAUTHORIZED, why);
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Basic realm=\"sandbox git gate\""),
        );
        return r;
    }
    let Some((repo, endpoint)) = routed else {
        return refuse(
            audit,
            StatusCode::NOT_FOUND,
            "the gate serves git's smart HTTP endpoints of its repositories only",
        );
    };
    let push = matches!(
        endpoint,
        Endpoint::Refs { push: true } | Endpoint::ReceivePack
    );
    if push && repo.access != GitAccess::ReadWrite {
        tracing::info!(repo = %repo.name, "git gate: push refused (read-only access)");
        return refuse(
            audit,
            StatusCode::FORBIDDEN,
            "this sandbox has read-only access to the repository: push refused",
        );
    }
    // The hook is the prefix check: should the directory have gone (a cleaner of the
    // host's temporary files), git would run no hook and accept any ref, so no push.
    if push && !gate.hooks_dir().join("pre-receive").is_file() {
        tracing::warn!(repo = %repo.name, "git gate: push refused, the gate's hook is gone");
        return fail(
            audit,
            StatusCode::SERVICE_UNAVAILABLE,
            "the gate cannot check this push's refs: push refused",
        );
    }
    let repo = repo.clone();
    match tokio::time::timeout(REQUEST_TIME, cgi(&gate, &repo, endpoint, req, &mut audit)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            tracing::warn!(repo = %repo.name, error = %e, "git gate: the backend failed");
            fail(
                audit,
                StatusCode::INTERNAL_SERVER_ERROR,
                "the git backend failed",
            )
        }
        Err(_) => fail(
            audit,
            StatusCode::GATEWAY_TIMEOUT,
            "the request took too long",
        ),
    }
}

/// Runs `git http-backend` for one request. A refusal here writes the request's record;
/// once the backend answers, its record is taken from `audit` and written when the
/// backend ends.
async fn cgi(
    gate: &Gate,
    repo: &Served,
    endpoint: Endpoint,
    req: Request<Incoming>,
    audit: &mut Audit,
) -> std::io::Result<Response<Body>> {
    let (root, dir) = match (repo.git_dir.parent(), repo.git_dir.file_name()) {
        (Some(p), Some(d)) => (p.to_path_buf(), d.to_string_lossy().into_owned()),
        _ => {
            return Err(std::io::Error::other(
                "the repository has no parent directory",
            ));
        }
    };
    let path_info = match endpoint {
        Endpoint::Refs { .. } => format!("/{dir}/info/refs"),
        Endpoint::UploadPack => format!("/{dir}/git-upload-pack"),
        Endpoint::ReceivePack => format!("/{dir}/git-receive-pack"),
    };
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let mut cmd = tokio::process::Command::new(&gate.backend);
    cmd.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )
        .env("GIT_PROJECT_ROOT", &root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        // On top of the repository's own config (command-line level wins): the gate's
        // hook and nothing served beyond the protocol.
        .env("GIT_CONFIG_COUNT", "4")
        .env("GIT_CONFIG_KEY_0", "core.hooksPath")
        .env("GIT_CONFIG_VALUE_0", gate.hooks_dir())
        .env("GIT_CONFIG_KEY_1", "http.receivepack")
        .env(
            "GIT_CONFIG_VALUE_1",
            if repo.access == GitAccess::ReadWrite {
                "true"
            } else {
                "false"
            },
        )
        .env("GIT_CONFIG_KEY_2", "http.getanyfile")
        .env("GIT_CONFIG_VALUE_2", "false")
        // One push may not write more than a request body may carry.
        .env("GIT_CONFIG_KEY_3", "receive.maxInputSize")
        .env("GIT_CONFIG_VALUE_3", MAX_BODY.to_string())
        .env("SBX_GIT_PUSH_PREFIX", &repo.prefix)
        .env("PATH_INFO", path_info)
        .env("REQUEST_METHOD", req.method().as_str())
        .env("QUERY_STRING", req.uri().query().unwrap_or(""))
        .env("REMOTE_USER", super::URL_USER)
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (cgi_name, http_name) in [
        ("CONTENT_TYPE", "content-type"),
        ("CONTENT_LENGTH", "content-length"),
        ("HTTP_CONTENT_ENCODING", "content-encoding"),
        ("HTTP_GIT_PROTOCOL", "git-protocol"),
    ] {
        if let Some(v) = header(http_name) {
            cmd.env(cgi_name, v);
        }
    }
    // A push's ref updates are checked here before git sees the request, and again by
    // the gate's hook inside git: two independent checks of the same prefix.
    let encoding = header("content-encoding");
    let mut body = req.into_body();
    let mut read_ahead = Vec::new();
    let mut updates = Vec::new();
    if endpoint == Endpoint::ReceivePack {
        if encoding.is_some_and(|e| !e.eq_ignore_ascii_case("identity")) {
            return Ok(refuse(
                audit.take(),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "the gate reads a push's commands itself: send them uncompressed",
            ));
        }
        updates = loop {
            match parse_commands(&read_ahead) {
                Ok(Some(c)) => break c,
                Ok(None) if read_ahead.len() <= MAX_COMMANDS => {}
                Ok(None) => {
                    return Ok(refuse(
                        audit.take(),
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "too many ref updates",
                    ));
                }
                Err(why) => return Ok(refuse(audit.take(), StatusCode::BAD_REQUEST, &why)),
            }
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        read_ahead.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => {
                    return Ok(refuse(
                        audit.take(),
                        StatusCode::BAD_REQUEST,
                        "the push ended early",
                    ));
                }
            }
        };
        audit.refs(&updates);
        if let Err(why) = refs_allowed(&updates, &repo.prefix) {
            tracing::info!(repo = %repo.name, "git gate: push refused (outside the prefix)");
            return Ok(refuse(audit.take(), StatusCode::FORBIDDEN, &why));
        }
    }
    let mut child = cmd.spawn()?;
    let mut stdin = child.stdin.take();
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let mut stderr = child.stderr.take();
    // The request body goes to the backend as it arrives (what was read ahead first).
    let feed = tokio::spawn(async move {
        let Some(mut input) = stdin.take() else {
            return;
        };
        let mut total = read_ahead.len() as u64;
        if input.write_all(&read_ahead).await.is_err() {
            return;
        }
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return };
            if let Ok(data) = frame.into_data() {
                total += data.len() as u64;
                if total > MAX_BODY || input.write_all(&data).await.is_err() {
                    return;
                }
            }
        }
    });
    // The CGI header, bounded.
    let mut head = Vec::new();
    let mut chunk = vec![0u8; 8192];
    let split = loop {
        if let Some(at) = find_blank_line(&head) {
            break at;
        }
        if head.len() > MAX_CGI_HEADER {
            return Err(std::io::Error::other(
                "the backend's CGI header is too long",
            ));
        }
        let n = stdout.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::other("the backend wrote no CGI header"));
        }
        head.extend_from_slice(&chunk[..n]);
    };
    let (header_end, body_start) = split;
    let rest = Bytes::copy_from_slice(&head[body_start..]);
    let mut response = Response::builder().status(StatusCode::OK);
    let mut answered = StatusCode::OK;
    for line in String::from_utf8_lossy(&head[..header_end]).lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("status") {
            let code = v
                .split_whitespace()
                .next()
                .and_then(|c| c.parse::<u16>().ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            response = response.status(code);
            answered = code;
        } else if ["content-type", "cache-control", "expires", "pragma"]
            .iter()
            .any(|h| k.eq_ignore_ascii_case(h))
        {
            response = response.header(k, v);
        }
    }
    // The backend's end: its stderr (bounded) to the debug log, the process reaped, the
    // request's record written (after a push's refs were read back).
    let name = repo.name.clone();
    let audit = audit.take();
    let read_back = (endpoint == Endpoint::ReceivePack && audit.is_active())
        .then(|| (repo.git_dir.clone(), repo.prefix.clone(), updates));
    tokio::spawn(async move {
        let mut err = Vec::new();
        if let Some(e) = stderr.as_mut() {
            let _ = (&mut *e).take(16 * 1024).read_to_end(&mut err).await;
            // The rest is drained unread: a full pipe would stall the backend.
            let _ = tokio::io::copy(e, &mut tokio::io::sink()).await;
        }
        let status = tokio::time::timeout(REQUEST_TIME, child.wait()).await;
        feed.abort();
        let status = status.ok().and_then(Result::ok);
        tracing::debug!(
            repo = %name,
            status = ?status,
            stderr = %String::from_utf8_lossy(&err),
            "git gate: backend ended"
        );
        let mut failure = match status {
            _ if answered.as_u16() >= 400 => Some(format!("the git backend answered {answered}")),
            Some(s) if s.success() => None,
            Some(s) => Some(format!("the git backend ended with {s}")),
            None => Some("the git backend did not end in time".to_string()),
        };
        if let (None, Some((git_dir, prefix, updates))) = (&failure, read_back) {
            failure = match audit::not_landed(&git_dir, &prefix, &updates).await {
                Ok(missed) if missed.is_empty() => None,
                Ok(missed) => Some(format!(
                    "git landed {} of {} ref updates; not landed: {}",
                    updates.len() - missed.len(),
                    updates.len(),
                    missed.join(", ")
                )),
                Err(why) => Some(format!("whether the push landed is unknown: {why}")),
            };
        }
        audit.served(answered, failure);
    });
    let first = futures::stream::iter((!rest.is_empty()).then(|| Ok(rest)));
    let stream = first
        .chain(tokio_util::io::ReaderStream::new(stdout))
        .map(|r| r.map(Frame::data));
    response
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .map_err(std::io::Error::other)
}

/// One ref update of a push: the ref, and the object it is to point at (all zeros: the
/// ref is deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RefUpdate {
    pub(super) name: String,
    pub(super) new: String,
}

/// A push's ref updates: the `refname` and new object of each command of a receive-pack
/// request, once `buf` holds the command list up to its flush packet (`Ok(None)` until
/// then). Shallow lines are skipped; a signed push (`push-cert`), a malformed packet or
/// command is an error saying why.
pub(super) fn parse_commands(buf: &[u8]) -> Result<Option<Vec<RefUpdate>>, String> {
    let mut refs = Vec::new();
    let mut at = 0;
    loop {
        let Some(len) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        let len = std::str::from_utf8(len)
            .ok()
            .and_then(|l| usize::from_str_radix(l, 16).ok())
            .ok_or("a push's command list is not pkt-lines")?;
        if len == 0 {
            return Ok(Some(refs));
        }
        if !(5..=65520).contains(&len) {
            return Err(format!("a push's command packet has the length {len}"));
        }
        let Some(line) = buf.get(at + 4..at + len) else {
            return Ok(None);
        };
        at += len;
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let command = line.split(|b| *b == 0).next().unwrap_or_default();
        let command =
            std::str::from_utf8(command).map_err(|_| "a push command is not UTF-8".to_string())?;
        if command.starts_with("shallow ") {
            continue;
        }
        if command.starts_with("push-cert") {
            return Err("the gate does not take signed pushes".into());
        }
        let parts: Vec<&str> = command.split(' ').collect();
        let [old, new, name] = parts[..] else {
            return Err(format!("malformed push command {command:?}"));
        };
        let oid = |o: &str| matches!(o.len(), 40 | 64) && o.bytes().all(|b| b.is_ascii_hexdigit());
        if !oid(old) || !oid(new) {
            return Err(format!("malformed push command {command:?}"));
        }
        refs.push(RefUpdate {
            name: name.to_string(),
            new: new.to_string(),
        });
    }
}

/// `Ok` when every ref is under `prefix` and a plain ref name; else why not.
pub(super) fn refs_allowed(updates: &[RefUpdate], prefix: &str) -> Result<(), String> {
    for r in updates.iter().map(|u| &u.name) {
        let plain = !r.contains("..")
            && !r.contains("//")
            && !r.contains("@{")
            && !r.ends_with('/')
            && !r.ends_with(".lock")
            && !r.split('/').any(|c| c.starts_with('.'))
            && !r
                .bytes()
                .any(|b| b.is_ascii_control() || b" ~^:?*[\\".contains(&b));
        if !plain {
            return Err(format!("push refused: {r} is not a plain ref name"));
        }
        if !r.starts_with(prefix) || r.len() == prefix.len() {
            return Err(format!(
                "push refused: {r} is outside {prefix}, the only refs this sandbox may update"
            ));
        }
    }
    Ok(())
}

/// Where the CGI header ends: (end of the header lines, start of the body).
fn find_blank_line(buf: &[u8]) -> Option<(usize, usize)> {
    let crlf = sandbox_agent::protocol::find(buf, b"\r\n\r\n").map(|i| (i, i + 4));
    let lf = sandbox_agent::protocol::find(buf, b"\n\n").map(|i| (i, i + 2));
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod checks {
    use super::*;

    fn pkt(s: &str) -> Vec<u8> {
        let mut v = format!("{:04x}", s.len() + 4).into_bytes();
        v.extend_from_slice(s.as_bytes());
        v
    }

    fn commands(lines: &[&str]) -> Vec<u8> {
        let mut v = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            if i == 0 {
                v.extend(pkt(&format!("{l}\0report-status\n")));
            } else {
                v.extend(pkt(&format!("{l}\n")));
            }
        }
        v.extend_from_slice(b"0000PACK");
        v
    }

    const Z: &str = "0000000000000000000000000000000000000000";
    const A: &str = "1111111111111111111111111111111111111111";

    #[test]
    fn every_ref_of_a_push_is_read_and_checked() {
        let p = "refs/heads/sandbox/s1/";
        let ok = commands(&[&format!("{Z} {A} refs/heads/sandbox/s1/x")]);
        let refs = parse_commands(&ok).unwrap().unwrap();
        assert_eq!(
            refs,
            [RefUpdate {
                name: "refs/heads/sandbox/s1/x".into(),
                new: A.into()
            }]
        );
        assert!(refs_allowed(&refs, p).is_ok());
        // Incomplete: more is needed, never a guess.
        assert_eq!(parse_commands(&ok[..ok.len() - 8]).unwrap(), None);
        for bad in [
            format!("{A} {Z} refs/heads/main"),
            format!("{Z} {A} refs/tags/v1"),
            format!("{Z} {A} refs/heads/sandbox/s1/../../main"),
            format!("{Z} {A} refs/heads/sandbox/s10/x"),
            format!("{Z} {A} refs/heads/sandbox/s1/"),
            format!("{Z} {A} refs/heads/sandbox/s1//x"),
            format!("{Z} {A} refs/heads/sandbox/s1/.x"),
        ] {
            let buf = commands(&[&format!("{Z} {A} refs/heads/sandbox/s1/ok"), &bad]);
            let refs = parse_commands(&buf).unwrap().unwrap();
            assert!(refs_allowed(&refs, p).is_err(), "{bad}");
        }
        for malformed in [
            b"zzzz".to_vec(),
            pkt("push-cert\0caps\n"),
            pkt(&format!("{Z} refs/heads/x")),
            pkt(&format!("{Z} {A} refs/heads/x extra")),
            b"0003".to_vec(),
        ] {
            assert!(parse_commands(&malformed).is_err(), "{malformed:?}");
        }
        let shallow = [
            pkt(&format!("shallow {A}")),
            commands(&[&format!("{Z} {A} refs/heads/sandbox/s1/y")]),
        ]
        .concat();
        let names: Vec<String> = parse_commands(&shallow)
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|u| u.name)
            .collect();
        assert_eq!(names, ["refs/heads/sandbox/s1/y"]);
    }
}
