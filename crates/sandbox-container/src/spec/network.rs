//! How a container is networked ([`NetworkMode`]) and the engine networks the egress
//! policy creates for it ([`NetworkSpec`], [`Subnet`], [`NetworkInfo`]).

use std::collections::BTreeMap;

/// How the container is networked. Decided by the container layer from the
/// `NetworkPolicy`; the adapter applies it or refuses the create.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NetworkMode {
    /// No network at all (only loopback).
    None,
    /// A network the engine provides, with `publish` ports published on the host's
    /// loopback at engine-chosen ports.
    Bridge {
        /// Container ports to publish on 127.0.0.1.
        publish: Vec<u16>,
    },
    /// The library's own network (created with [`ContainerEngine::create_network`]:
    /// labelled, inter-container traffic off), with `dns` as the container's name servers
    /// and `publish` ports published on the host's loopback. Used for egress `Allow` and
    /// `AllowList`; the egress rules are loaded into the container's namespace after start.
    Isolated {
        /// The network's name.
        network: String,
        /// Container ports to publish on 127.0.0.1.
        publish: Vec<u16>,
        /// Name servers written into the container's resolver configuration.
        dns: Vec<std::net::IpAddr>,
    },
}

impl NetworkMode {
    /// The ports to publish on the host's loopback (none without a network).
    pub fn published(&self) -> &[u16] {
        match self {
            NetworkMode::None => &[],
            NetworkMode::Bridge { publish } | NetworkMode::Isolated { publish, .. } => publish,
        }
    }
}

/// A network the container layer asks the engine for (see [`ContainerEngine::create_network`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkSpec {
    /// The network's name.
    pub name: String,
    /// Labels, including `io.sandbox-rs.managed=true` and the backend.
    pub labels: BTreeMap<String, String>,
}

impl NetworkSpec {
    /// A spec named `name` with `labels`.
    pub fn new(name: impl Into<String>, labels: BTreeMap<String, String>) -> Self {
        NetworkSpec {
            name: name.into(),
            labels,
        }
    }
}

/// One subnet of a network: its address range and the host's address on it (the gateway).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Subnet {
    /// The network address.
    pub addr: std::net::IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// The gateway (the host's address on the bridge), when the engine reports one.
    pub gateway: Option<std::net::IpAddr>,
}

impl Subnet {
    /// A subnet; `None` when `cidr` is not `addr/prefix`.
    pub fn parse(cidr: &str, gateway: Option<&str>) -> Option<Subnet> {
        let (a, p) = cidr.split_once('/')?;
        let addr: std::net::IpAddr = a.parse().ok()?;
        let prefix: u8 = p.parse().ok()?;
        if prefix > if addr.is_ipv4() { 32 } else { 128 } {
            return None;
        }
        Some(Subnet {
            addr,
            prefix,
            gateway: gateway.and_then(|g| g.split('/').next()?.parse().ok()),
        })
    }
}

/// What the engine reports about one network.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkInfo {
    /// The network's name.
    pub name: String,
    /// The engine's id for it (empty when unknown): containers join by id, since Docker
    /// allows two networks of one name (two processes creating it at once).
    pub id: String,
    /// Its subnets (IPv4 and IPv6).
    pub subnets: Vec<Subnet>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Whether it keeps its containers apart the way [`ContainerEngine::create_network`]
    /// creates it (Docker: inter-container traffic off; Podman: `isolate`). A network of
    /// the library's name without it is foreign and refused.
    pub isolated: bool,
}

impl NetworkInfo {
    /// A record (not isolated, no id).
    pub fn new(
        name: impl Into<String>,
        subnets: Vec<Subnet>,
        labels: BTreeMap<String, String>,
    ) -> Self {
        NetworkInfo {
            name: name.into(),
            id: String::new(),
            subnets,
            labels,
            isolated: false,
        }
    }
}
