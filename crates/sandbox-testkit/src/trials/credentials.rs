//! Brokered credentials against a real engine: what `CreateOptions::credential` promises,
//! against servers the trial starts in the egress lab ([`crate::egress_lab`]), so nothing
//! leaves the machine. The bound host is an HTTPS server with a test CA that records and
//! echoes what it receives; another host, reachable through the allowlist, is a plain
//! HTTP server that does the same. A Python program inside calls both with the
//! placeholder, dials the bound host past the proxy, and gathers everything it can read
//! (its environment, every process's environ, cmdline and writable memory, the files
//! under /etc, /run and /tmp, the answers) for the host to search for the secret.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sandbox_core::layer::{Layer, MemorySink, Outcome};
use sandbox_core::{
    Backend, Capability, Credential, ErrorCode, NetworkPolicy, Placement, ReapableBackend, Sandbox,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::egress_lab;
use crate::tagged::{managed_ids, test_options};

/// The image the trial creates (Python, and a system CA bundle to extend).
const PYTHON: &str = "sandbox-rs/python:3.11";

/// The bound host's name (`.test` is reserved, RFC 6761).
pub const BOUND: &str = "api.cred-lab.test";
/// Another host the allowlist opens, which must only ever see the placeholder.
pub const OTHER: &str = "other.cred-lab.test";
/// The other host's address in the lab (a neighbour of the canary).
const OTHER_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// The secret. Nothing inside the sandbox may ever hold these bytes.
const SECRET: &str = "sk-cred-lab-7f3a9c21d4e8b6f0a5c3e1d9";

const PROBE: &str = r#"
import json, os, socket, sys, urllib.error, urllib.request
ph = os.environ["API_KEY"]
bound_port, other_port = sys.argv[1], sys.argv[2]
out = {"placeholder": ph, "ssl_cert_file": os.environ.get("SSL_CERT_FILE", "")}
def get(url):
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + ph})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return [r.status, r.read().decode("latin-1"), dict(r.headers)]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode("latin-1"), {}]
    except Exception as e:
        return [-1, repr(e), {}]
out["bound"] = get("https://api.cred-lab.test/v1/echo?x=1")
out["plain"] = get("http://api.cred-lab.test/v1/echo")
out["other"] = get("http://other.cred-lab.test:%s/echo" % other_port)
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("api.cred-lab.test", int(bound_port)))
    out["direct"] = "connected"
except Exception as e:
    out["direct"] = repr(e)
dump = readable_dump()
out["memory_scanned"] = MEMORY_SCANNED
dump += json.dumps(out).encode()
open("/tmp/dump.bin", "wb").write(dump)
print(json.dumps(out))
"#;

/// The trials set the process-wide lookup and upstream port: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a lab server received: each request's head, as text.
type Seen = Arc<Mutex<Vec<String>>>;

async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn echo_reply(head: &str) -> String {
    let auth = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
        .unwrap_or("");
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-echo: {}\r\nconnection: close\r\n\r\n{head}",
        head.len(),
        auth.trim()
    )
}

/// An HTTPS server for [`BOUND`] in the lab at the canary's address (ephemeral port),
/// with a certificate from a test CA the library is told to trust upstream.
fn bound_server() -> (u16, Seen) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = p.self_signed(&key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![BOUND.to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &key)
        .unwrap();
    sandbox_container::credentials::add_upstream_root(ca.der().to_vec());
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let std = egress_lab::bind(SocketAddr::from((egress_lab::CANARY, 0))).unwrap();
    let port = std.local_addr().unwrap().port();
    let listener = tokio::net::TcpListener::from_std(std).unwrap();
    let seen: Seen = Arc::default();
    let keep = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let keep = keep.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let head = read_head(&mut tls).await;
                keep.lock().unwrap().push(head.clone());
                let _ = tls.write_all(echo_reply(&head).as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, seen)
}

/// A plain HTTP server for [`OTHER`] at [`OTHER_ADDR`] in the lab.
fn other_server() -> (u16, Seen) {
    egress_lab::ensure_address(OTHER_ADDR).unwrap();
    let std = egress_lab::bind(SocketAddr::from((OTHER_ADDR, 0))).unwrap();
    let port = std.local_addr().unwrap().port();
    let listener = tokio::net::TcpListener::from_std(std).unwrap();
    let seen: Seen = Arc::default();
    let keep = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let head = read_head(&mut s).await;
            keep.lock().unwrap().push(head.clone());
            let _ = s.write_all(echo_reply(&head).as_bytes()).await;
            let _ = s.shutdown().await;
        }
    });
    (port, seen)
}

/// Waits (10 s at most) until no container of `test` is listed.
async fn assert_none_left<B: ReapableBackend>(b: &B, test: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !managed_ids(b, test).await.is_empty() {
        assert!(Instant::now() < deadline, "a container is left");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lab's two servers, with the library pointed at them.
struct Lab {
    bound_port: u16,
    bound_seen: Seen,
    other_port: u16,
    other_seen: Seen,
}

/// Starts the bound and the other host's servers in the egress lab and points the
/// library at them: the bound name and the other name resolve to their addresses, and
/// proxies started from now on go upstream to the bound server's port.
fn lab() -> Lab {
    egress_lab::ensure().unwrap();
    let (bound_port, bound_seen) = bound_server();
    let (other_port, other_seen) = other_server();
    sandbox_container::credentials::set_upstream_port(bound_port);
    sandbox_container::egress::set_lookup(Arc::new(
        egress_lab::Names::new()
            .with(BOUND, IpAddr::V4(egress_lab::CANARY))
            .with(OTHER, IpAddr::V4(OTHER_ADDR)),
    ))
    .unwrap();
    Lab {
        bound_port,
        bound_seen,
        other_port,
        other_seen,
    }
}

/// The proxy's address as the sandbox's recorded egress state names it (the resolver's
/// address on the network, the proxy's port).
fn proxy_address(id: &str) -> Option<SocketAddr> {
    let safe: String = id.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    let text = std::fs::read_to_string(format!("/run/sandbox-rs/egress/{safe}.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let gw: SocketAddr = v["resolver"].as_str()?.parse().ok()?;
    let port = u16::try_from(v["proxy"]["port"].as_u64()?).ok()?;
    Some(SocketAddr::new(gw.ip(), port))
}

/// The bound host receives the real secret, in the bound header only; the other host
/// receives only the placeholder; plain HTTP to the bound host is refused; the bound
/// host cannot be dialled past the proxy (its other ports are refused even with its
/// network on the allowlist); the secret's bytes are nowhere the sandbox can read; after
/// kill the proxy's port is closed and no rule, state or container is left. The sandbox
/// is created through the enforcement layer with an audit sink: each request the proxy
/// took is one `credentials.request` record (host, method, path, status, the variables
/// injected), the refused one with its code, and no record holds the secret.
pub async fn the_bound_host_alone_receives_the_secret<B>(b: &B)
where
    B: Backend + ReapableBackend + Clone + 'static,
{
    let test = "credentials-e2e";
    let _serial = SERIAL.lock().await;
    if !b.capabilities().contains(Capability::CREDENTIALS) {
        let e = b
            .create(credential_options(test))
            .await
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            e.code(),
            ErrorCode::CapabilityNotSupported,
            "{}",
            e.render()
        );
        return;
    }
    let Lab {
        bound_port,
        bound_seen,
        other_port,
        other_seen,
    } = lab();
    let sink = Arc::new(MemorySink::default());
    let audited = Layer::new()
        .audit(sink.clone())
        .wrap(Arc::new(b.clone()) as Arc<dyn Backend>);
    let sb = audited.create(credential_options(test)).await.unwrap();
    let outcome = probe(&*sb, bound_port, other_port).await;
    let proxy = proxy_address(sb.id());
    sb.kill().await.unwrap();
    let (out, dump) = outcome;
    eprintln!(
        "probe: {out}\nbound saw: {:?}\nother saw: {:?}",
        bound_seen.lock().unwrap(),
        other_seen.lock().unwrap()
    );
    let placeholder = out["placeholder"].as_str().unwrap_or_default().to_string();
    assert!(
        placeholder.starts_with("sbx-placeholder-"),
        "API_KEY inside: {placeholder:?}"
    );
    // The bound host: the real value in the bound header.
    let bound = bound_seen.lock().unwrap().join("\n---\n");
    assert!(
        bound.contains(&format!("authorization: Bearer {SECRET}")),
        "the bound host did not receive the secret: {bound}"
    );
    assert_eq!(out["bound"][0], 200, "{}", out["bound"]);
    // Its echo came back with the placeholder in place of the secret.
    let body = out["bound"][1].as_str().unwrap_or_default();
    assert!(body.contains(&placeholder), "{body}");
    // Another host: only the placeholder.
    let other = other_seen.lock().unwrap().join("\n---\n");
    assert!(
        other.contains(&format!("Bearer {placeholder}")),
        "the other host was not reached with the placeholder: {other} ({})",
        out["other"]
    );
    assert!(!other.contains(SECRET), "another host received the secret");
    // Plain HTTP to the bound host is refused by the proxy and never forwarded.
    assert_eq!(out["plain"][0], 403, "{}", out["plain"]);
    assert_eq!(
        bound_seen.lock().unwrap().len(),
        1,
        "only the one HTTPS request reached the bound host"
    );
    // Past the proxy: refused, though 198.18.0.0/24 is on the allowlist.
    assert_ne!(
        out["direct"], "connected",
        "the bound host was dialled directly"
    );
    // Nothing the sandbox can read holds the secret: not its files, not any process's
    // environment, arguments or writable memory (the agent's among them).
    assert!(!dump.is_empty());
    assert!(
        out["memory_scanned"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "the probe could read the memory of no other process: {}",
        out["memory_scanned"]
    );
    assert!(
        dump.windows(placeholder.len())
            .any(|w| w == placeholder.as_bytes()),
        "the dump is not what the probe gathered"
    );
    assert!(
        !dump.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
        "the secret's bytes were readable inside the sandbox"
    );
    // The audit sink: one record per request the proxy took, none with the secret.
    let records = sink.records();
    for r in &records {
        assert!(
            !r.to_json().contains(SECRET),
            "an audit record holds the secret: {}",
            r.to_json()
        );
    }
    let requests: Vec<_> = records
        .iter()
        .filter(|r| r.operation == "credentials.request")
        .collect();
    let forwarded = requests
        .iter()
        .find(|r| r.method.as_deref() == Some("GET") && r.status == Some(200))
        .unwrap_or_else(|| panic!("no record of the forwarded request: {requests:?}"));
    assert_eq!(forwarded.host.as_deref(), Some(BOUND));
    assert_eq!(forwarded.path.as_deref(), Some("/v1/echo"));
    assert_eq!(forwarded.sandbox_id.as_deref(), Some(sb.id()));
    assert_eq!(forwarded.credentials, Some(vec!["API_KEY".to_string()]));
    assert_eq!(forwarded.outcome, Outcome::Ok);
    let refused = requests
        .iter()
        .find(|r| r.status == Some(403))
        .unwrap_or_else(|| panic!("no record of the refused plain request: {requests:?}"));
    assert_eq!(refused.outcome, Outcome::Error);
    assert_eq!(refused.error_code, Some("SBX_E1401"));
    assert_eq!(refused.credentials, Some(vec![]));
    assert_eq!(
        requests.len(),
        2,
        "the proxy took two requests (the other host's never reaches it): {requests:?}"
    );
    // After kill: the proxy's port is closed, its state (and so its rules) gone, and
    // no container is left.
    let proxy = proxy.expect("the sandbox's state named its proxy");
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if tokio::net::TcpStream::connect(proxy).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the proxy at {proxy} still accepts after kill"
    );
    assert!(
        proxy_address(sb.id()).is_none(),
        "the sandbox's state is left"
    );
    assert_none_left(b, test).await;
}

/// The proxy outlives a stop and serves the sandbox again after its start (the
/// engine may give it a new address; the rules are loaded again with the same port).
pub async fn the_proxy_serves_again_after_stop_and_start<B: Backend + ReapableBackend>(b: &B) {
    let test = "credentials-restart";
    let _serial = SERIAL.lock().await;
    if !b
        .capabilities()
        .contains(Capability::CREDENTIALS | Capability::STOP_START)
    {
        return;
    }
    egress_lab::ensure().unwrap();
    let (bound_port, bound_seen) = bound_server();
    sandbox_container::credentials::set_upstream_port(bound_port);
    sandbox_container::egress::set_lookup(Arc::new(
        egress_lab::Names::new().with(BOUND, IpAddr::V4(egress_lab::CANARY)),
    ))
    .unwrap();
    let sb = b.create(credential_options(test)).await.unwrap();
    sb.stop().await.unwrap();
    sb.start().await.unwrap();
    let r = sb
        .run(
            sandbox_core::Command::Argv(vec![
                "python3".into(),
                "-c".into(),
                "import os, urllib.request as u; print(u.urlopen(u.Request('https://api.cred-lab.test/again', headers={'Authorization': 'Bearer ' + os.environ['API_KEY']}), timeout=20).status)".into(),
            ]),
            sandbox_core::RunOptions::default(),
        )
        .await
        .unwrap();
    sb.kill().await.unwrap();
    assert_eq!(r.exit_code, 0, "after start: {}", r.stderr_text());
    assert_eq!(r.stdout_text().trim(), "200");
    let seen = bound_seen.lock().unwrap().join("\n");
    assert!(
        seen.contains(&format!("authorization: Bearer {SECRET}")),
        "the bound host did not receive the secret after start: {seen}"
    );
    assert_none_left(b, test).await;
}

/// A live egress change keeps the broker: after `set_egress` closes the lab network and
/// opens only the other host, the bound host is still reached through the proxy (with
/// the secret), its other ports are still refused (the redirect and the refusal are
/// loaded again with the new policy, not dropped with the old one), and the other host
/// still gets only the placeholder.
pub async fn the_proxy_serves_through_a_live_egress_change<B: Backend + ReapableBackend>(b: &B) {
    let test = "credentials-live-egress";
    let _serial = SERIAL.lock().await;
    if !b
        .capabilities()
        .contains(Capability::CREDENTIALS | Capability::LIVE_EGRESS)
    {
        return;
    }
    let Lab {
        bound_port,
        bound_seen,
        other_port,
        other_seen,
    } = lab();
    let sb = b.create(credential_options(test)).await.unwrap();
    // The lab's network no longer on the list: only the other host by name.
    let changed = sb
        .set_egress(sandbox_core::Egress::AllowList(vec![OTHER.to_string()]))
        .await;
    let outcome = match changed {
        Ok(()) => Some(probe(&*sb, bound_port, other_port).await),
        Err(e) => {
            eprintln!("set_egress: {}", e.render());
            None
        }
    };
    sb.kill().await.unwrap();
    let (out, _dump) = outcome.expect("set_egress failed on a sandbox with a credential");
    eprintln!(
        "probe after the change: {out}\nbound saw: {:?}\nother saw: {:?}",
        bound_seen.lock().unwrap(),
        other_seen.lock().unwrap()
    );
    assert_eq!(
        out["bound"][0], 200,
        "through the proxy after the change: {}",
        out["bound"]
    );
    let bound = bound_seen.lock().unwrap().join("\n---\n");
    assert!(
        bound.contains(&format!("authorization: Bearer {SECRET}")),
        "the bound host did not receive the secret after the change: {bound}"
    );
    assert_ne!(
        out["direct"], "connected",
        "the bound host was dialled directly after the change"
    );
    let other = other_seen.lock().unwrap().join("\n---\n");
    assert!(
        !other.contains(SECRET),
        "another host received the secret after the change"
    );
    assert_eq!(
        out["other"][0], 200,
        "the other host after the change: {}",
        out["other"]
    );
    assert_none_left(b, test).await;
}

fn credential_options(test: &str) -> sandbox_core::CreateOptions {
    test_options(PYTHON, test)
        .network(NetworkPolicy::allow_list(["198.18.0.0/24", OTHER]))
        .credential(Credential::new(
            "API_KEY",
            SECRET,
            [BOUND],
            Placement::header_template("Authorization", "Bearer {}"),
        ))
}

/// Runs the probe; its JSON and the dump it gathered.
async fn probe(sb: &dyn Sandbox, bound_port: u16, other_port: u16) -> (serde_json::Value, Vec<u8>) {
    // A process that holds the placeholder and lives on beside the probe, whose memory
    // the probe reads (the agent's it cannot: PID 1 is undumpable).
    let held = sb
        .run(
            sandbox_core::Command::Argv(vec![
                "sh".into(),
                "-c".into(),
                "python3 -c 'import os, time; held = os.environ[\"API_KEY\"]; time.sleep(300)' \
                 >/dev/null 2>&1 &"
                    .into(),
            ]),
            sandbox_core::RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(held.exit_code, 0, "{}", held.stderr_text());
    let files = sb.files().unwrap();
    files
        .write(
            "/tmp/cred_probe.py",
            Bytes::from(format!("{}{PROBE}", sandbox_contract::READABLE_DUMP_PY)),
        )
        .await
        .unwrap();
    let r = sb
        .run(
            sandbox_core::Command::Argv(vec![
                "python3".to_string(),
                "/tmp/cred_probe.py".to_string(),
                bound_port.to_string(),
                other_port.to_string(),
            ]),
            sandbox_core::RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "probe: {}", r.stderr_text());
    let out: serde_json::Value = serde_json::from_str(r.stdout_text().trim()).unwrap();
    let dump = files.read("/tmp/dump.bin").await.unwrap().to_vec();
    (out, dump)
}

/// The engine trials of brokered credentials, as `#[tokio::test]`s of the calling binary.
#[macro_export]
macro_rules! credentials_trials {
    (backend: $backend:expr $(,)?) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn the_bound_host_alone_receives_the_secret() {
            let Some(b) = $backend else { return };
            $crate::trials::credentials::the_bound_host_alone_receives_the_secret(&b).await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn the_proxy_serves_through_a_live_egress_change() {
            let Some(b) = $backend else { return };
            $crate::trials::credentials::the_proxy_serves_through_a_live_egress_change(&b).await;
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn the_proxy_serves_again_after_stop_and_start() {
            let Some(b) = $backend else { return };
            $crate::trials::credentials::the_proxy_serves_again_after_stop_and_start(&b).await;
        }
    };
}
