//! The library's DNS resolver for sandboxes with egress `AllowList` or `Allow`.
//!
//! One per process, on its own thread and runtime (so it outlives any caller's runtime
//! and a busy caller cannot stall DNS), listening on the host's address on each egress
//! network (the bridge gateway), UDP and TCP on the same ephemeral port; the sandbox's
//! ruleset redirects port 53 there. A query is attributed to a sandbox by its source
//! address (the sandbox has no `NET_ADMIN`, so it cannot take another's address).
//!
//! The policy a query is judged by is the sandbox's current one, read from its state on
//! the host (see `state.rs`) under the state's shared lock, so a live change is in force
//! for the next query, whichever process made it. A name the tiers do not let through
//! (denied, or unlisted under a default of deny) is answered NXDOMAIN; a name they let
//! through is resolved the way the host resolves it ([`Lookup`], getaddrinfo by default:
//! `/etc/hosts` first, then the host's DNS); when an exception or the allow list granted
//! it, the answer's addresses are added to the matching pinned set in the sandbox's
//! namespace (and recorded, so a change can re-pin them), and only then is the answer
//! sent: a connect that follows the answer never races the rule.
//!
//! `host.sandbox.internal` is answered here and nowhere else: the host's address on the
//! sandbox's network while the policy grants a host port, NXDOMAIN otherwise (it follows a
//! live change with the next query, which a hosts file written at create could not).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt as _;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use sandbox_core::{EgressDefault, HOST_SANDBOX_NAME, TierVerdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use super::dns::{self, Rcode};
use super::state::{self, PinTier};
use super::{HostLookup, Lookup, nft};

/// TTL of the answers (short: the host's answer may change; the pinned address stays
/// allowed for the sandbox's life either way).
const ANSWER_TTL: u32 = 30;
/// Bound of one host lookup.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Queries answered at once (UDP and TCP together).
const MAX_IN_FLIGHT: usize = 256;
/// Queries one sandbox may have in flight: its fair share, so one sandbox holding
/// connections open cannot take the slots every other sandbox needs.
const MAX_IN_FLIGHT_PER_SANDBOX: usize = 32;
/// A TCP client idle this long is dropped.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Most addresses one sandbox's answers may add to its allowed set. A wildcard entry
/// (`*.example.com`) lets the sandbox ask for as many names as it likes, and each answer
/// would otherwise grow its nft set (and cost an `nsenter nft`) without end; past this, a
/// listed name with a new address is answered SERVFAIL.
const MAX_PINNED: usize = if cfg!(test) { 16 } else { 4096 };

/// Whose queries a source address carries.
#[derive(Debug)]
struct Client {
    /// Where the sandbox's policy and pins are kept.
    files: state::Files,
    /// The host pid whose network namespace is the sandbox's.
    pid: u32,
    /// The namespace's inode when registered: a reused pid or address never inherits.
    ns_inode: u64,
    /// Addresses already in the sandbox's pinned sets under the state's generation (the
    /// first field): asked again, they are answered without another `nsenter nft` (at
    /// most [`MAX_PINNED`]). A change of policy (a new generation) starts it afresh.
    pinned: Mutex<(u64, std::collections::HashSet<(bool, IpAddr)>)>,
    /// This sandbox's share of the in-flight slots ([`MAX_IN_FLIGHT_PER_SANDBOX`]).
    slots: Arc<Semaphore>,
}

pub(crate) struct Resolver {
    handle: tokio::runtime::Handle,
    clients: Mutex<HashMap<IpAddr, Arc<Client>>>,
    /// Gateway address → (port, serving task).
    listeners: tokio::sync::Mutex<HashMap<IpAddr, (u16, tokio::task::JoinHandle<()>)>>,
    lookup: RwLock<Arc<dyn Lookup>>,
    slots: Arc<Semaphore>,
}

/// The process's resolver (started on first use).
pub(crate) fn resolver() -> Result<&'static Resolver, String> {
    static R: OnceLock<Result<Resolver, String>> = OnceLock::new();
    R.get_or_init(start).as_ref().map_err(Clone::clone)
}

fn start() -> Result<Resolver, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("sbx-egress-dns".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("cannot start the egress resolver: {e}")));
                    return;
                }
            };
            let _ = tx.send(Ok(rt.handle().clone()));
            rt.block_on(std::future::pending::<()>());
        })
        .map_err(|e| format!("cannot start the egress resolver thread: {e}"))?;
    let handle = rx
        .recv()
        .map_err(|_| "the egress resolver thread ended at start".to_string())??;
    Ok(Resolver {
        handle,
        clients: Mutex::new(HashMap::new()),
        listeners: tokio::sync::Mutex::new(HashMap::new()),
        lookup: RwLock::new(Arc::new(HostLookup)),
        slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
    })
}

fn ns_inode(pid: u32) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|m| m.ino())
}

impl Resolver {
    /// Replaces how names are resolved (process-wide).
    /// The IPv4 addresses of `name` by the current lookup (bounded like an answer's).
    pub(crate) async fn lookup_v4(&self, name: &str) -> Result<Vec<std::net::Ipv4Addr>, String> {
        let lookup = self.current_lookup();
        let addrs = tokio::time::timeout(LOOKUP_TIMEOUT, lookup.lookup(name))
            .await
            .map_err(|_| format!("resolving {name} took longer than {LOOKUP_TIMEOUT:?}"))?
            .map_err(|e| format!("resolving {name}: {e}"))?;
        Ok(addrs
            .into_iter()
            .filter_map(|a| match a {
                IpAddr::V4(a) => Some(a),
                IpAddr::V6(_) => None,
            })
            .collect())
    }

    pub(crate) fn set_lookup(&self, lookup: Arc<dyn Lookup>) {
        if let Ok(mut l) = self.lookup.write() {
            *l = lookup;
        }
    }

    fn current_lookup(&self) -> Arc<dyn Lookup> {
        match self.lookup.read() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The resolver's address on `gateway` (listening there from now on).
    pub(crate) async fn listen(&'static self, gateway: IpAddr) -> Result<SocketAddr, String> {
        let mut listeners = self.listeners.lock().await;
        if let Some((port, task)) = listeners.get(&gateway)
            && !task.is_finished()
        {
            return Ok(SocketAddr::new(gateway, *port));
        }
        let (udp, tcp) = self
            .handle
            .spawn(bind_pair(gateway))
            .await
            .map_err(|e| format!("the egress resolver failed to bind: {e}"))??;
        let port = udp
            .local_addr()
            .map_err(|e| format!("resolver address: {e}"))?
            .port();
        let task = self.handle.spawn(async move {
            tokio::join!(self.serve_udp(udp), self.serve_tcp(tcp));
        });
        listeners.insert(gateway, (port, task));
        tracing::debug!(%gateway, port, "egress resolver listening");
        Ok(SocketAddr::new(gateway, port))
    }

    /// Attributes queries from `addrs` to the sandbox in `pid`'s network namespace, the
    /// one of inode `inode` (proven the container's); later queries are answered only while
    /// `pid` is still in it.
    pub(crate) fn register(
        &self,
        addrs: &[IpAddr],
        pid: u32,
        inode: u64,
        files: state::Files,
    ) -> Result<(), String> {
        if ns_inode(pid) != Some(inode) {
            return Err(format!(
                "the sandbox's network namespace (/proc/{pid}/ns/net) is gone"
            ));
        }
        let client = Arc::new(Client {
            files,
            pid,
            ns_inode: inode,
            pinned: Mutex::default(),
            slots: Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_SANDBOX)),
        });
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        // Entries of sandboxes that are gone are dropped here, so the map stays as large
        // as the number of live sandboxes.
        clients.retain(|_, c| ns_inode(c.pid) == Some(c.ns_inode));
        for a in addrs {
            clients.insert(*a, client.clone());
        }
        Ok(())
    }

    /// A slot of `client`'s share and one of the resolver's, or `None` when either is
    /// used up (the query is dropped, as a busy server drops it).
    fn take_slots(
        &self,
        client: &Client,
    ) -> Option<(
        tokio::sync::OwnedSemaphorePermit,
        tokio::sync::OwnedSemaphorePermit,
    )> {
        let own = client.slots.clone().try_acquire_owned().ok()?;
        let shared = self.slots.clone().try_acquire_owned().ok()?;
        Some((own, shared))
    }

    fn client(&self, src: IpAddr) -> Option<Arc<Client>> {
        let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients.get(&src).cloned()
    }

    async fn serve_udp(&'static self, sock: UdpSocket) {
        let sock = Arc::new(sock);
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, src) = match sock.recv_from(&mut buf).await {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "egress resolver: udp receive failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            // The source is identified before a slot is taken: a query from an address no
            // sandbox of ours holds is refused at once, holding nothing.
            let Some(client) = self.client(src.ip()) else {
                if let Some(reply) = refused(&buf[..n]) {
                    let _ = sock.try_send_to(&reply, src);
                }
                continue;
            };
            let Some(permits) = self.take_slots(&client) else {
                continue;
            };
            let msg = buf[..n].to_vec();
            let sock = sock.clone();
            tokio::spawn(async move {
                let _permits = permits;
                if let Some(reply) = self.answer(&msg, src.ip(), 512).await {
                    let _ = sock.send_to(&reply, src).await;
                }
            });
        }
    }

    async fn serve_tcp(&'static self, listener: TcpListener) {
        loop {
            let Ok((conn, src)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            // A connection from an address no sandbox of ours holds is closed at once; a
            // known sandbox's takes one of its own slots, then one of the resolver's.
            let Some(client) = self.client(src.ip()) else {
                drop(conn);
                continue;
            };
            let Some(permits) = self.take_slots(&client) else {
                continue;
            };
            tokio::spawn(async move {
                let _permits = permits;
                let _ = self.serve_tcp_conn(conn, src.ip()).await;
            });
        }
    }

    async fn serve_tcp_conn(
        &'static self,
        mut conn: TcpStream,
        src: IpAddr,
    ) -> std::io::Result<()> {
        loop {
            let mut len = [0u8; 2];
            match tokio::time::timeout(TCP_IDLE, conn.read_exact(&mut len)).await {
                Ok(Ok(_)) => {}
                _ => return Ok(()),
            }
            let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
            tokio::time::timeout(TCP_IDLE, conn.read_exact(&mut msg))
                .await
                .map_err(|_| std::io::ErrorKind::TimedOut)??;
            if let Some(reply) = self.answer(&msg, src, u16::MAX as usize).await {
                let mut out = Vec::with_capacity(reply.len() + 2);
                out.extend_from_slice(&(reply.len() as u16).to_be_bytes());
                out.extend_from_slice(&reply);
                conn.write_all(&out).await?;
            }
        }
    }

    /// The answer to one message from `src`; `None` drops it (not even a header).
    pub(crate) async fn answer(&self, msg: &[u8], src: IpAddr, max_len: usize) -> Option<Vec<u8>> {
        let Some(q) = dns::parse_query(msg) else {
            return dns::header_id(msg).map(dns::format_error);
        };
        let Some(client) = self.client(src) else {
            return Some(dns::reply(&q, Rcode::Refused));
        };
        if ns_inode(client.pid) != Some(client.ns_inode) {
            return Some(dns::reply(&q, Rcode::Refused));
        }
        if q.name == HOST_SANDBOX_NAME {
            return Some(host_answer(&client, &q, max_len).await);
        }
        if let Some(answer) = proxied_answer(&client, &q, max_len).await {
            return Some(answer);
        }
        let Some(verdict) = self.verdict(&client, &q.name).await else {
            return Some(dns::reply(&q, Rcode::ServFail));
        };
        if !verdict.reachable() {
            tracing::debug!(name = %q.name, %src, "egress resolver refused a name the policy does not let through");
            return Some(dns::reply(&q, Rcode::NxDomain));
        }
        if !q.wants_addresses() {
            // Only addresses are granted; other record types could carry data out.
            return Some(dns::reply(&q, Rcode::NotImp));
        }
        let lookup = self.current_lookup();
        let addrs = match tokio::time::timeout(LOOKUP_TIMEOUT, lookup.lookup(&q.name)).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Some(dns::reply(&q, Rcode::NxDomain));
            }
            Ok(Err(e)) => {
                tracing::debug!(name = %q.name, error = %e, "egress resolver lookup failed");
                return Some(dns::reply(&q, Rcode::NxDomain));
            }
            Err(_) => return Some(dns::reply(&q, Rcode::ServFail)),
        };
        let wanted: Vec<IpAddr> = addrs
            .into_iter()
            .filter(|a| (q.qtype == dns::TYPE_A) == a.is_ipv4())
            .collect();
        // Judged again under the lock, held until the pin is in: a change made while the
        // host answered is in force for this answer, and no change can come between the
        // verdict and its pin.
        let Ok(_held) = client.files.lock_shared().await else {
            return Some(dns::reply(&q, Rcode::ServFail));
        };
        let Some((generation, verdict)) = judge(&client, &q.name) else {
            return Some(dns::reply(&q, Rcode::ServFail));
        };
        let tier = match verdict {
            TierVerdict::Exception => Some(PinTier::Except),
            TierVerdict::Allowed => Some(PinTier::Allow),
            TierVerdict::Default(EgressDefault::Allow) => None,
            _ => return Some(dns::reply(&q, Rcode::NxDomain)),
        };
        if let Some(tier) = tier
            && !wanted.is_empty()
        {
            let except = tier == PinTier::Except;
            let new: Vec<IpAddr> = {
                let mut pinned = client.pinned.lock().unwrap_or_else(|p| p.into_inner());
                if pinned.0 != generation {
                    *pinned = (generation, Default::default());
                }
                let new: Vec<IpAddr> = wanted
                    .iter()
                    .filter(|a| !pinned.1.contains(&(except, **a)))
                    .copied()
                    .collect();
                if pinned.1.len() + new.len() > MAX_PINNED {
                    tracing::warn!(
                        name = %q.name, %src, max = MAX_PINNED,
                        "egress resolver: the sandbox's answers reached the most addresses one sandbox may add"
                    );
                    return Some(dns::reply(&q, Rcode::ServFail));
                }
                new
            };
            if !new.is_empty() {
                if let Err(e) =
                    nft::allow_addresses(&super::netns::of_pid(client.pid), &new, except).await
                {
                    // Not pinned means not answered: the connect would be rejected anyway.
                    tracing::warn!(name = %q.name, error = %e, "egress resolver could not pin an answer");
                    return Some(dns::reply(&q, Rcode::ServFail));
                }
                let pin = state::Pin {
                    name: q.name.clone(),
                    addrs: new.clone(),
                };
                if let Err(e) = client.files.add_pin(tier, &pin) {
                    // Pinned all the same: only a later change's re-pin misses it.
                    tracing::debug!(error = %e, "egress resolver could not record a pin");
                }
                let mut pinned = client.pinned.lock().unwrap_or_else(|p| p.into_inner());
                if pinned.0 == generation {
                    pinned.1.extend(new.into_iter().map(|a| (except, a)));
                }
            }
        }
        Some(dns::answer(&q, &wanted, ANSWER_TTL, max_len))
    }
}

impl Resolver {
    /// The tier that decides for `name` under the sandbox's current policy (read under
    /// the shared lock); `None` when the policy cannot be read.
    async fn verdict(&self, client: &Client, name: &str) -> Option<TierVerdict> {
        let _held = client.files.lock_shared().await.ok()?;
        judge(client, name).map(|(_, v)| v)
    }
}

/// The answer for [`HOST_SANDBOX_NAME`]: the host's address on the sandbox's network (where
/// this resolver listens for it) while its policy grants a host port, NXDOMAIN otherwise.
/// Never looked up on the host and never pinned: the rules accept that address on the
/// granted ports only, whatever resolves to it.
async fn host_answer(client: &Client, q: &dns::Query, max_len: usize) -> Vec<u8> {
    let Ok(_held) = client.files.lock_shared().await else {
        return dns::reply(q, Rcode::ServFail);
    };
    let st = match client.files.read() {
        Ok(Some(st)) => st,
        _ => return dns::reply(q, Rcode::ServFail),
    };
    let granted = st.egress().ok().is_some_and(|e| !e.host_ports().is_empty());
    if !granted {
        return dns::reply(q, Rcode::NxDomain);
    }
    if !q.wants_addresses() {
        return dns::reply(q, Rcode::NotImp);
    }
    let host = st.resolver.ip();
    let wanted: Vec<IpAddr> = [host]
        .into_iter()
        .filter(|a| (q.qtype == dns::TYPE_A) == a.is_ipv4())
        .collect();
    dns::answer(q, &wanted, ANSWER_TTL, max_len)
}

/// The answer for a credential's bound host: the addresses resolved at create (where the
/// rules redirect to the proxy), whatever the tiers say and without a pin; IPv4 only,
/// since the redirect goes to the IPv4 gateway. `None` when `q` names no bound host.
async fn proxied_answer(client: &Client, q: &dns::Query, max_len: usize) -> Option<Vec<u8>> {
    let Ok(_held) = client.files.lock_shared().await else {
        return Some(dns::reply(q, Rcode::ServFail));
    };
    let st = client.files.read().ok()??;
    let p = st.proxy?;
    if !p.hosts.contains(&q.name) {
        return None;
    }
    if !q.wants_addresses() {
        return Some(dns::reply(q, Rcode::NotImp));
    }
    let wanted: Vec<IpAddr> = if q.qtype == dns::TYPE_A {
        p.addrs.iter().map(|a| IpAddr::V4(*a)).collect()
    } else {
        Vec::new()
    };
    Some(dns::answer(q, &wanted, ANSWER_TTL, max_len))
}

/// The state's generation and the tier that decides for `name` (the caller holds the
/// lock); `None` when the state cannot be read.
fn judge(client: &Client, name: &str) -> Option<(u64, TierVerdict)> {
    let st = match client.files.read() {
        Ok(Some(s)) => s,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "egress resolver: the sandbox's policy cannot be read");
            return None;
        }
    };
    let tiers = st.egress().ok()?.tiers().ok()?;
    Some((st.generation, tiers.verdict_for_host(name)))
}

/// The answer to a message from a source that is no sandbox of ours: REFUSED, or a
/// format error for something that is not a query.
fn refused(msg: &[u8]) -> Option<Vec<u8>> {
    match dns::parse_query(msg) {
        Some(q) => Some(dns::reply(&q, Rcode::Refused)),
        None => dns::header_id(msg).map(dns::format_error),
    }
}

/// A UDP socket and a TCP listener on the same port of `ip`.
async fn bind_pair(ip: IpAddr) -> Result<(UdpSocket, TcpListener), String> {
    let mut last = String::new();
    for _ in 0..16 {
        let udp = UdpSocket::bind(SocketAddr::new(ip, 0))
            .await
            .map_err(|e| format!("the egress resolver cannot listen on {ip}: {e}"))?;
        let port = udp.local_addr().map_err(|e| e.to_string())?.port();
        match TcpListener::bind(SocketAddr::new(ip, port)).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!(
        "the egress resolver found no port free for both UDP and TCP on {ip}: {last}"
    ))
}
