//! The proxy end to end in this process: a TLS server with a test CA stands in for the
//! bound host and echoes what it received; a client trusting only the sandbox's CA
//! stands in for the sandbox.

use std::sync::Mutex;

use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use sandbox_core::Credential;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const SECRET: &str = "sk-live-0123456789abcdef";

/// A TLS server for `host` on loopback whose answer echoes the request head it
/// received; what it received is kept too.
async fn echo_server(host: &str) -> (u16, Vec<u8>, Arc<Mutex<Vec<String>>>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = p.self_signed(&key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![host.to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &key)
        .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(s).await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = tls.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                head.extend_from_slice(&buf[..n]);
            }
            let text = String::from_utf8_lossy(&head).into_owned();
            keep.lock().unwrap().push(text.clone());
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-echo: {}\r\nconnection: close\r\n\r\n{}",
                text.len(),
                text.lines()
                    .find(|l| l.to_ascii_lowercase().starts_with("authorization"))
                    .unwrap_or(""),
                text
            );
            tls.write_all(reply.as_bytes()).await.unwrap();
            let _ = tls.shutdown().await;
        }
    });
    (port, ca.der().to_vec(), seen)
}

struct Harness {
    port: u16,
    ca: Arc<ca::Ca>,
    placeholder: String,
    seen: Arc<Mutex<Vec<String>>>,
    _broker: Broker,
}

async fn harness() -> Harness {
    let (up_port, up_ca, seen) = echo_server("api.bound.test").await;
    let mut options = CreateOptions::new("img").credential(Credential::new(
        "API_KEY",
        SECRET,
        ["api.bound.test"],
        Placement::header_template("Authorization", "Bearer {}"),
    ));
    let plan = plan(&mut options).unwrap().unwrap();
    let placeholder = options.env["API_KEY"].clone();
    assert!(!placeholder.contains(SECRET));
    assert_eq!(options.env["SSL_CERT_FILE"], CA_BUNDLE_PATH);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(up_ca.into()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let proxy = Arc::new(proxy::Proxy {
        sandbox_id: "t".into(),
        bindings: plan.bindings.clone(),
        upstream: [("api.bound.test".to_string(), vec![Ipv4Addr::LOCALHOST])].into(),
        sources: Arc::new(RwLock::new(vec![IpAddr::V4(Ipv4Addr::LOCALHOST)])),
        tls_server: server_config(plan.ca.clone()).unwrap(),
        tls_client: Arc::new(client),
        upstream_port: up_port,
        slots: Arc::new(tokio::sync::Semaphore::new(proxy::MAX_CONNECTIONS)),
        events: plan.events.clone(),
    });
    let task = tokio::spawn(proxy::serve(listener, proxy));
    Harness {
        port,
        ca: plan.ca.clone(),
        placeholder,
        seen,
        _broker: Broker {
            task,
            sources: Arc::new(RwLock::new(Vec::new())),
        },
    }
}

/// A request through the proxy as the sandbox sends it: TLS to `sni`, trusting only
/// the sandbox's CA. The status and the body.
async fn send(
    h: &Harness,
    sni: &str,
    auth: &str,
    path: &str,
) -> Result<(u16, String, String), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(h.ca.der()).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", h.port))
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(
            rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap(),
            tcp,
        )
        .await
        .map_err(|e| e.to_string())?;
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", sni)
        .header("authorization", auth)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = tx.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let echo = resp
        .headers()
        .get("x-echo")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned(), echo))
}

/// The bound host receives the real value where the placeholder was; the answer that
/// echoes it carries the placeholder again, in the body and in the headers.
#[tokio::test]
async fn the_bound_host_gets_the_secret_and_the_sandbox_never_does() {
    let h = harness().await;
    let (status, body, echo) = send(
        &h,
        "api.bound.test",
        &format!("Bearer {}", h.placeholder),
        "/v1/x",
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    let seen = h.seen.lock().unwrap().join("\n");
    assert!(
        seen.contains(&format!("authorization: Bearer {SECRET}")),
        "{seen}"
    );
    assert!(
        !body.contains(SECRET),
        "the echo carried the secret back: {body}"
    );
    assert!(body.contains(&h.placeholder), "{body}");
    assert!(
        !echo.contains(SECRET) && echo.contains(&h.placeholder),
        "{echo}"
    );
}

/// The placeholder anywhere but the bound placement stays a placeholder.
#[tokio::test]
async fn only_the_bound_placement_is_replaced() {
    let h = harness().await;
    // Not the template's shape: left alone.
    let (status, _, _) = send(
        &h,
        "api.bound.test",
        &format!("Token {}", h.placeholder),
        "/",
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    let seen = h.seen.lock().unwrap().join("\n");
    assert!(!seen.contains(SECRET), "{seen}");
    assert!(seen.contains(&format!("Token {}", h.placeholder)));
}

/// A name that is not bound gets no certificate from the sandbox's CA, and plain HTTP
/// is refused: the secret never leaves for anywhere but the bound host over TLS.
#[tokio::test]
async fn other_hosts_and_plain_http_are_refused() {
    let h = harness().await;
    let e = send(&h, "other.test", "x", "/").await.unwrap_err();
    assert!(!e.is_empty());
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", h.port))
        .await
        .unwrap();
    tcp.write_all(
        format!(
            "GET / HTTP/1.1\r\nhost: api.bound.test\r\nauthorization: Bearer {}\r\n\r\n",
            h.placeholder
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = vec![0u8; 1024];
    let n = tcp.read(&mut out).await.unwrap();
    assert!(String::from_utf8_lossy(&out[..n]).starts_with("HTTP/1.1 403"));
    assert!(h.seen.lock().unwrap().is_empty());
}

/// A value cut across chunks is still replaced.
#[test]
fn the_scrubber_catches_a_value_split_across_chunks() {
    let mut options = CreateOptions::new("img").credential(Credential::new(
        "K",
        SECRET,
        ["a.test"],
        Placement::header("X-Key"),
    ));
    let plan = plan(&mut options).unwrap().unwrap();
    let ph = options.env["K"].clone();
    let text = format!("before {SECRET} middle {SECRET} after");
    for cut in 0..text.len() {
        let mut s = proxy::Scrubber::new(plan.bindings.clone());
        let mut out = s.push(&text.as_bytes()[..cut]);
        out.extend(s.push(&text.as_bytes()[cut..]));
        out.extend(s.finish());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("before {ph} middle {ph} after"),
            "cut at {cut}"
        );
    }
}

/// The query placement: the parameter whose value is the placeholder, and no other.
#[test]
fn the_query_placement_replaces_only_its_parameter() {
    let mut options = CreateOptions::new("img").credential(Credential::new(
        "K",
        "s3cr3t&x",
        ["a.test"],
        Placement::query("key"),
    ));
    let plan = plan(&mut options).unwrap().unwrap();
    let ph = options.env["K"].clone();
    let req = |uri: &str| http::Request::get(uri).body(()).unwrap().into_parts().0;
    let mut p = req(&format!("/v1?key={ph}&other={ph}"));
    assert_eq!(proxy::inject(&mut p, &plan.bindings, "a.test"), ["K"]);
    assert_eq!(p.uri.to_string(), format!("/v1?key=s3cr3t%26x&other={ph}"));
    // Another host: untouched.
    let mut p = req(&format!("/v1?key={ph}"));
    assert!(proxy::inject(&mut p, &plan.bindings, "b.test").is_empty());
    assert_eq!(p.uri.to_string(), format!("/v1?key={ph}"));
}

/// A connection from an address that is not the sandbox's is closed unread.
#[tokio::test]
async fn only_the_sandbox_address_is_answered() {
    let h = harness().await;
    // The harness answers 127.0.0.1 only; 127.0.0.2 is loopback too, but not it.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut s = sock
        .connect(format!("127.0.0.1:{}", h.port).parse().unwrap())
        .await
        .unwrap();
    let _ = s
        .write_all(b"GET / HTTP/1.1\r\nhost: api.bound.test\r\n\r\n")
        .await;
    let mut out = Vec::new();
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("closed at once");
    assert!(n.is_err() || out.is_empty(), "answered: {out:?}");
    assert!(h.seen.lock().unwrap().is_empty());
}
