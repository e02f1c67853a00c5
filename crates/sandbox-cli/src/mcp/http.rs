//! `sandbox mcp --http [ADDR]`: the same tools over MCP's streamable HTTP transport
//! (rmcp's `StreamableHttpService` on a hyper HTTP/1.1 server), for hosts that connect to
//! a URL instead of starting a child process.
//!
//! Whoever can reach the port can run code, so the defaults are narrow: it listens on
//! loopback (127.0.0.1:8931), and every request must carry a bearer token, even there
//! (other users of this machine reach loopback too). The token is the operator's own
//! (`--token-env NAME`: read from that environment variable, never from the command line)
//! or, without that flag, one generated at start and handed over through a 0600 file (see
//! the sibling `token`); it is never logged. A non-loopback address is refused unless the
//! operator passes `--allow-non-loopback`, and then only with `--token-env`. On loopback,
//! rmcp's `Host` check refuses DNS-rebinding requests from web pages.
//!
//! Every MCP session (one `Mcp-Session-Id`) gets its own handler from the factory below,
//! so a sandbox belongs to the session that created it; all of them share the server's
//! registry and budget, and are killed when the server stops (SIGTERM, SIGHUP, Ctrl-C).
//! Each is bounded by its lifetime should the server itself be killed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use sandbox::SandboxError;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::exit_code;
use crate::mcp::registry::kill_all;
use crate::mcp::server::{Policy, SandboxServer};
use crate::mcp::token::{Token, TokenFile};

/// Connections served at once; one past it is closed as soon as it is accepted, so a
/// client opening connections it never uses cannot take every file descriptor.
const MAX_CONNECTIONS: usize = 64;

/// How long a client may take to send a request's headers before its connection is cut:
/// a connection that trickles a header never ending would otherwise be held forever.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The path the MCP endpoint is served on.
pub const ENDPOINT_PATH: &str = "/mcp";

/// How `sandbox mcp --http` listens, checked before anything binds.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The operator's bearer token (`--token-env`); without one the server generates its
    /// own when it starts.
    pub token: Option<Token>,
}

impl HttpOptions {
    /// Validates the flags: a non-loopback address needs `--allow-non-loopback` and the
    /// operator's own token; a named token variable must be set and non-empty. `env` reads the
    /// environment (a parameter so the rules are testable without touching it).
    pub fn new(
        addr: SocketAddr,
        allow_non_loopback: bool,
        token_env: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> sandbox::Result<Self> {
        let token = match token_env {
            None => None,
            Some(name) => match crate::secret_env::check_name("--token-env", name)
                .map(|()| env(name))?
            {
                Some(v) if !v.trim().is_empty() => Some(Token::new(v.trim())),
                // The message names the variable, never a value.
                _ => {
                    return Err(SandboxError::config(
                        format!(
                            "--token-env {name}: the environment variable {name} is unset or empty"
                        ),
                        format!("export {name}=<a long random token> before starting the server"),
                    ));
                }
            },
        };
        if !addr.ip().is_loopback() {
            if !allow_non_loopback {
                return Err(SandboxError::config(
                    format!(
                        "--http {addr} is not a loopback address: anyone who reaches it could run code in sandboxes"
                    ),
                    "listen on 127.0.0.1, or pass --allow-non-loopback together with --token-env NAME",
                ));
            }
            if token.is_none() {
                return Err(SandboxError::config(
                    format!("--http {addr} with --allow-non-loopback needs a bearer token"),
                    "pass --token-env NAME, NAME being an environment variable holding the token",
                ));
            }
        }
        Ok(HttpOptions { addr, token })
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *r.status_mut() = status;
    r
}

/// Serves MCP over streamable HTTP until a termination signal arrives, then kills every
/// sandbox the server's clients created. Prints the endpoint URL on stdout once
/// listening (port 0 picks a free port).
pub async fn serve(policy: Policy, options: HttpOptions) -> sandbox::Result<u8> {
    let listener = TcpListener::bind(options.addr).await.map_err(|e| {
        SandboxError::config(
            format!("cannot listen on {}: {e}", options.addr),
            "pick a free port, e.g. --http 127.0.0.1:0",
        )
    })?;
    let local = listener
        .local_addr()
        .map_err(|e| SandboxError::engine("mcp", format!("listening socket: {e}")))?;
    // Removed when this function returns, whichever way; a token is always required.
    let (token, _token_file) = match options.token {
        Some(t) => (t, None),
        None => {
            let t = Token::generate()?;
            let file = TokenFile::write(&t, local, |name| std::env::var_os(name))?;
            announce_generated(&t, &file, local);
            (t, Some(file))
        }
    };
    // Each session gets its own handler (and so owns what it creates); all of them share
    // the sandbox registry and the server's limits, so the server can tear them down.
    let server = SandboxServer::new(policy);
    let registry = server.registry();
    let shutdown = CancellationToken::new();
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
    if !local.ip().is_loopback() {
        // Host checks stop DNS rebinding from browsers; beyond loopback the mandatory
        // bearer token does that (a page cannot add it), and the names clients use for
        // this machine are not known here.
        config = config.disable_allowed_hosts();
    }
    let mcp = StreamableHttpService::new(
        move || Ok(server.for_session()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let url = format!("http://{local}{ENDPOINT_PATH}");
    crate::output::Out::new(false).line(&url);
    tracing::info!(%url, "mcp http server listening");

    let signal = crate::signals::terminated();
    tokio::pin!(signal);
    let mut connections = JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut signal => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Fd exhaustion passes as connections close; the listener stays. The pause
                // keeps a persistent failure from spinning a core.
                tracing::warn!(error = %e, "mcp http accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, max = MAX_CONNECTIONS, "mcp http connection refused: too many open");
            drop(stream);
            continue;
        };
        let mcp = mcp.clone();
        let token = token.clone();
        let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
            let mut mcp = mcp.clone();
            let token = token.clone();
            async move {
                if req.uri().path() != ENDPOINT_PATH {
                    return Ok::<_, Infallible>(plain(StatusCode::NOT_FOUND, "not found\n"));
                }
                if !token.admits(req.headers().get(AUTHORIZATION)) {
                    let mut r = plain(StatusCode::UNAUTHORIZED, "bearer token required\n");
                    r.headers_mut()
                        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                    return Ok(r);
                }
                mcp.call(req).await
            }
        });
        connections.spawn(async move {
            let _slot = slot;
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), handler)
                .await;
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "mcp http connection ended");
            }
        });
        // Reap finished connection tasks so the set does not grow with every client.
        while connections.try_join_next().is_some() {}
    }
    // No new requests, sessions closed, open streams dropped; then the sandboxes go.
    shutdown.cancel();
    connections.abort_all();
    let failed = kill_all(&registry).await;
    if failed > 0 {
        tracing::warn!(
            failed,
            "some sandboxes of the MCP server could not be killed; see `sandbox reap`"
        );
    }
    Ok(exit_code::INTERRUPTED)
}

/// Hands a generated token to the operator, once: its value on a terminal (never in a
/// log: a service's stderr usually is one), and always the file it is in, which clients
/// can read it from.
fn announce_generated(token: &Token, file: &TokenFile, local: SocketAddr) {
    use std::io::IsTerminal;
    let out = crate::output::Out::new(false);
    let path = crate::terminal::escape_text(&file.path().display().to_string());
    if std::io::stderr().is_terminal() {
        out.note(format!(
            "sandbox mcp: clients of http://{local}{ENDPOINT_PATH} must send the header\n  Authorization: Bearer {}\nThe token is also in {path} (mode 0600, removed when the server stops).",
            token.reveal()
        ));
    } else {
        out.note(format!(
            "sandbox mcp: clients of http://{local}{ENDPOINT_PATH} must send `Authorization: Bearer <token>`, the token being in {path} (mode 0600, removed when the server stops)."
        ));
    }
    tracing::info!(path = %file.path().display(), "mcp bearer token generated");
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox::ErrorCode;

    fn env_with(value: Option<&'static str>) -> impl Fn(&str) -> Option<String> {
        move |_| value.map(str::to_string)
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    #[test]
    fn loopback_needs_no_token_flag() {
        for a in ["127.0.0.1:0", "[::1]:8931"] {
            let o = HttpOptions::new(addr(a), false, None, env_with(None)).expect(a);
            assert!(o.token.is_none());
        }
    }

    #[test]
    fn non_loopback_needs_the_flag_and_a_token() {
        let any = addr("0.0.0.0:8931");
        let e = HttpOptions::new(any, false, Some("T"), env_with(Some("s3cret-token")))
            .expect_err("no flag");
        assert_eq!(e.code(), ErrorCode::Configuration);
        let e = HttpOptions::new(any, true, None, env_with(None)).expect_err("no token");
        assert_eq!(e.code(), ErrorCode::Configuration);
        let o = HttpOptions::new(any, true, Some("T"), env_with(Some("s3cret-token")))
            .expect("flag and token");
        assert!(o.token.is_some());
    }

    #[test]
    fn a_missing_token_variable_is_named_and_no_value_leaks() {
        let e = HttpOptions::new(addr("127.0.0.1:0"), false, Some("MY_TOKEN"), env_with(None))
            .expect_err("unset");
        assert_eq!(e.code(), ErrorCode::Configuration);
        assert!(e.render().contains("MY_TOKEN"), "{}", e.render());
        let e = HttpOptions::new(
            addr("127.0.0.1:0"),
            false,
            Some("MY_TOKEN"),
            env_with(Some("  ")),
        )
        .expect_err("empty");
        assert_eq!(e.code(), ErrorCode::Configuration);
        let o = HttpOptions::new(
            addr("127.0.0.1:0"),
            false,
            Some("MY_TOKEN"),
            env_with(Some("s3cret-token")),
        )
        .expect("set");
        assert!(!format!("{o:?}").contains("s3cret"), "{o:?}");
    }
}
