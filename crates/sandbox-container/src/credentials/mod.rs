//! Brokered credentials on container engines: what `CreateOptions::credential` becomes.
//!
//! At create, each credential gets a placeholder (an opaque random token) in its
//! environment variable, and the sandbox gets a certificate authority of its own
//! (`ca.rs`) whose certificate is installed as a bundle file (the image's system bundle
//! plus the CA) named by the usual variables. After start, a proxy (`proxy.rs`) listens
//! on the host's address on the sandbox's network, and the sandbox's own nft table
//! (`egress/nft.rs`) redirects TCP to the bound hosts' addresses on ports 80 and 443 to
//! it and refuses their other ports; the library's resolver answers the bound names with
//! the addresses resolved here. The secret stays in this process: the proxy puts it into
//! requests to the bound hosts and takes it out of their answers. The proxy is a task
//! of the creating handle, ended at kill (or when the handle or the process goes).

mod ca;
mod proxy;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use futures::StreamExt as _;
use sandbox_core::layer::EventReporter;
use sandbox_core::{Capability, CreateOptions, Placement, Result, SandboxError, Secret};

use crate::engine::{ContainerEngine, NetworkInfo};

/// The CA bundle inside the sandbox (the image's system bundle, then the proxy's CA).
pub const CA_BUNDLE_PATH: &str = "/etc/sandbox-rs/credentials-ca-bundle.pem";

/// The variables naming [`CA_BUNDLE_PATH`] in every command's environment (OpenSSL,
/// Python requests, curl, Node.js, git).
pub const CA_VARIABLES: [&str; 5] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

/// Where images keep their system bundle (Debian, Alpine, Fedora, openSUSE); the first
/// found is copied into [`CA_BUNDLE_PATH`] ahead of the proxy's CA.
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Largest system bundle copied (a full Mozilla bundle is about 220 KiB).
const MAX_SYSTEM_BUNDLE: usize = 4 * 1024 * 1024;

/// One credential as the proxy uses it.
pub(crate) struct Binding {
    env_var: String,
    placeholder: String,
    secret: Secret,
    hosts: Vec<String>,
    placement: Placement,
}

/// An extra root the proxy trusts upstream, beside the host's (tests' servers).
static EXTRA_ROOTS: RwLock<Vec<Vec<u8>>> = RwLock::new(Vec::new());

/// Adds, for this whole process, a root certificate (DER) the credentials proxy trusts
/// when it verifies a bound host, beside the host's own roots: a private CA of an
/// internal API, or a test server's. Process-wide like the egress resolver's lookup
/// ([`crate::egress::set_lookup`]), which decides where a bound name leads.
pub fn add_upstream_root(der: Vec<u8>) {
    EXTRA_ROOTS
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .push(der);
}

/// The upstream port of the proxies this process starts from now on (443; tests move it).
static UPSTREAM_PORT: AtomicU16 = AtomicU16::new(443);

/// Sends the upstream requests of the proxies this process starts from now on to `port`
/// instead of 443 (tests whose servers cannot take 443); a running proxy keeps its port.
pub fn set_upstream_port(port: u16) {
    UPSTREAM_PORT.store(port, Ordering::SeqCst);
}

/// Why brokered credentials cannot work for sandboxes of `engine`, if they cannot: the
/// redirect is a rule of the sandbox's own table, loaded from this host.
pub(crate) fn unavailable<E: ContainerEngine + ?Sized>(engine: &E) -> Option<String> {
    crate::egress::allowlist_available(engine)
        .then_some(())
        .map_or_else(
            || {
                Some(
                    "the sandbox's rules cannot be loaded from this process (a remote engine, \
                     gVisor's netstack, or no nft here), and only they can force its traffic \
                     through the proxy"
                        .to_string(),
                )
            },
            |_| None,
        )
}

/// Refuses credentials on an engine that cannot force traffic through the proxy.
pub(crate) fn check<E: ContainerEngine + ?Sized>(
    engine: &E,
    options: &CreateOptions,
) -> Result<()> {
    if options.credentials.is_empty() {
        return Ok(());
    }
    match unavailable(engine) {
        None => Ok(()),
        Some(why) => {
            tracing::debug!(why, "brokered credentials refused");
            Err(SandboxError::unsupported(
                Capability::CREDENTIALS,
                engine.backend(),
            ))
        }
    }
}

/// What a create with credentials carries from admission to the running proxy: the
/// placeholders (already in the options' environment) and the CA.
pub(crate) struct Plan {
    bindings: Arc<[Binding]>,
    ca: Arc<ca::Ca>,
    hosts: Vec<String>,
    /// The audit sinks of the layer this create runs under (taken here, during create,
    /// while the layer's task-local is visible): the proxy reports every request to them.
    events: EventReporter,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan").field("hosts", &self.hosts).finish()
    }
}

/// Mints the placeholders and the CA of a create with credentials, and puts the
/// placeholders and the CA variables into `options.env` (so every spec built from the
/// options carries them). `None` without credentials.
pub(crate) fn plan(options: &mut CreateOptions) -> Result<Option<Plan>> {
    if options.credentials.is_empty() {
        return Ok(None);
    }
    let mut bindings = Vec::new();
    let mut hosts: Vec<String> = Vec::new();
    for c in &options.credentials {
        let placeholder = placeholder()?;
        options.env.insert(c.env_var.clone(), placeholder.clone());
        for h in &c.hosts {
            if !hosts.contains(h) {
                hosts.push(h.clone());
            }
        }
        bindings.push(Binding {
            env_var: c.env_var.clone(),
            placeholder,
            secret: c.secret.clone(),
            hosts: c.hosts.clone(),
            placement: c.placement.clone(),
        });
    }
    for v in CA_VARIABLES {
        options
            .env
            .entry(v.to_string())
            .or_insert_with(|| CA_BUNDLE_PATH.to_string());
    }
    let ca = ca::Ca::new(&hosts).map_err(|e| {
        SandboxError::creation(
            "credentials",
            format!("the sandbox's CA could not be made: {e}"),
        )
    })?;
    Ok(Some(Plan {
        bindings: bindings.into(),
        ca: Arc::new(ca),
        hosts,
        events: EventReporter::current(),
    }))
}

/// An opaque token: 24 random bytes from the kernel, hex, behind a recognisable prefix.
fn placeholder() -> Result<String> {
    use std::io::Read as _;
    let mut raw = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .map_err(|e| SandboxError::creation("credentials", format!("reading /dev/urandom: {e}")))?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sbx-placeholder-{hex}"))
}

impl Plan {
    /// The bound hosts resolved (IPv4, the way the egress resolver resolves names) and
    /// checked against what the proxy must never reach from the host.
    pub(crate) async fn resolve<E: ContainerEngine + ?Sized>(
        &self,
        engine: &E,
        net: &NetworkInfo,
    ) -> Result<HashMap<String, Vec<Ipv4Addr>>> {
        let mut out = HashMap::new();
        for h in &self.hosts {
            let addrs = crate::egress::resolve_bound(h).await.map_err(|e| {
                SandboxError::config(
                    format!("credential host {h} cannot be resolved: {e}"),
                    "bind credentials to names this host resolves (IPv4)",
                )
            })?;
            if addrs.is_empty() {
                return Err(SandboxError::config(
                    format!("credential host {h} has no IPv4 address"),
                    "bind credentials to names with an IPv4 address: the redirect to the \
                     proxy is IPv4",
                ));
            }
            crate::egress::check_bound(engine, net, h, &addrs).await?;
            out.insert(h.clone(), addrs);
        }
        Ok(out)
    }

    /// Copies the CA bundle into the created, not yet started, container: the image's
    /// system bundle (the first of [`SYSTEM_BUNDLES`] it has) and the proxy's CA.
    pub(crate) async fn install<E: ContainerEngine + ?Sized>(
        &self,
        engine: &E,
        id: &str,
    ) -> Result<()> {
        let mut bundle = Vec::new();
        for path in SYSTEM_BUNDLES {
            if let Some(b) = read_file(engine, id, path).await {
                bundle = b;
                if !bundle.ends_with(b"\n") {
                    bundle.push(b'\n');
                }
                break;
            }
        }
        bundle.extend_from_slice(self.ca.pem().as_bytes());
        let tar = tar_of(&bundle).map_err(|e| {
            SandboxError::creation(engine.backend(), format!("packing the CA bundle: {e}"))
        })?;
        let body = futures::stream::once(async move { Ok(tar) }).boxed();
        engine.put_archive(id, "/", body).await.map_err(|e| {
            SandboxError::creation(
                engine.backend(),
                format!(
                    "the credentials CA could not be installed at {CA_BUNDLE_PATH} (a read-only \
                     root filesystem keeps it out): {e}"
                ),
            )
        })
    }

    /// The redirect the rules need for this plan's proxy on `port`.
    pub(crate) fn proxied(
        &self,
        port: u16,
        upstream: &HashMap<String, Vec<Ipv4Addr>>,
    ) -> crate::egress::Proxied {
        let mut addrs: Vec<Ipv4Addr> = upstream.values().flatten().copied().collect();
        addrs.sort();
        addrs.dedup();
        crate::egress::Proxied {
            port,
            hosts: self.hosts.clone(),
            addrs,
        }
    }

    /// Binds the proxy's listener on the host's address on the sandbox's network.
    pub(crate) async fn bind(backend: &str, gateway: IpAddr) -> Result<tokio::net::TcpListener> {
        tokio::net::TcpListener::bind((gateway, 0))
            .await
            .map_err(|e| {
                SandboxError::creation(
                    backend,
                    format!("the credentials proxy cannot listen on {gateway}: {e}"),
                )
            })
    }

    /// Starts serving on `listener` for sandbox `id`, whose addresses are `sources`.
    pub(crate) fn start(
        &self,
        listener: tokio::net::TcpListener,
        id: &str,
        sources: Vec<IpAddr>,
        upstream: HashMap<String, Vec<Ipv4Addr>>,
    ) -> Result<Broker> {
        let tls_server = server_config(self.ca.clone())?;
        let tls_client = client_config()?;
        let sources = Arc::new(RwLock::new(sources));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        let proxy = Arc::new(proxy::Proxy {
            sandbox_id: id.to_string(),
            bindings: self.bindings.clone(),
            upstream,
            sources: sources.clone(),
            tls_server,
            tls_client,
            upstream_port: UPSTREAM_PORT.load(Ordering::SeqCst),
            slots: Arc::new(tokio::sync::Semaphore::new(proxy::MAX_CONNECTIONS)),
            events: self.events.clone(),
        });
        let task = tokio::spawn(proxy::serve(listener, proxy));
        tracing::debug!(sandbox_id = %id, port, hosts = ?self.hosts, "credentials proxy started");
        Ok(Broker { task, sources })
    }
}

/// A sandbox's running proxy: dropping it (at kill) ends it, its listener and every
/// connection.
#[derive(Debug)]
pub(crate) struct Broker {
    task: tokio::task::JoinHandle<()>,
    sources: Arc<RwLock<Vec<IpAddr>>>,
}

impl Broker {
    /// The sandbox's addresses after a start (the engine may give it new ones).
    pub(crate) fn set_sources(&self, sources: Vec<IpAddr>) {
        *self.sources.write().unwrap_or_else(|p| p.into_inner()) = sources;
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(e: impl std::fmt::Display) -> SandboxError {
    SandboxError::creation("credentials", format!("the proxy's TLS set-up failed: {e}"))
}

fn server_config(ca: Arc<ca::Ca>) -> Result<Arc<rustls::ServerConfig>> {
    let mut c = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(ca::BySni(ca)));
    // The proxy speaks HTTP/1.1 only.
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(c))
}

fn client_config() -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for c in native.certs {
        let _ = roots.add(c);
    }
    for der in EXTRA_ROOTS.read().unwrap_or_else(|p| p.into_inner()).iter() {
        roots
            .add(rustls::pki_types::CertificateDer::from(der.clone()))
            .map_err(tls_error)?;
    }
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(c))
}

/// The file at `path` in the container, when it is a regular file of at most
/// [`MAX_SYSTEM_BUNDLE`] bytes.
async fn read_file<E: ContainerEngine + ?Sized>(
    engine: &E,
    id: &str,
    path: &str,
) -> Option<Vec<u8>> {
    let mut body = engine.get_archive(id, path).await.ok()?;
    let mut tar = Vec::new();
    while let Some(chunk) = body.next().await {
        tar.extend_from_slice(&chunk.ok()?);
        if tar.len() > MAX_SYSTEM_BUNDLE + 64 * 1024 {
            return None;
        }
    }
    let mut archive = tar::Archive::new(&tar[..]);
    let mut entries = archive.entries().ok()?;
    let mut entry = entries.next()?.ok()?;
    // A link (Debian's bundle is a file; some images link it) is not followed into the
    // image: the system bundle is then left out.
    if entry.header().entry_type() != tar::EntryType::Regular {
        return None;
    }
    let mut out = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(&mut entry, MAX_SYSTEM_BUNDLE as u64),
        &mut out,
    )
    .ok()?;
    Some(out)
}

fn tar_of(bundle: &[u8]) -> std::io::Result<Bytes> {
    let mut b = tar::Builder::new(Vec::with_capacity(bundle.len() + 2048));
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_size(0);
    dir.set_mode(0o755);
    dir.set_uid(0);
    dir.set_gid(0);
    dir.set_mtime(0);
    b.append_data(&mut dir, "etc/sandbox-rs/", std::io::empty())?;
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(bundle.len() as u64);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    b.append_data(&mut h, CA_BUNDLE_PATH.trim_start_matches('/'), bundle)?;
    Ok(b.into_inner()?.into())
}

#[cfg(test)]
mod tests;
