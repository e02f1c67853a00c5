//! What both adapters' contract binaries share: the suite's [`Faults`] answered through
//! the [`FaultProxy`] in front of the engine socket, and its canary probes answered by the
//! egress lab ([`crate::egress_lab`]). An adapter's `tests/contract.rs` keeps only what
//! its own engine's API tells.

use std::net::SocketAddr;
use std::sync::Arc;

use sandbox_contract::anyhow;
use sandbox_contract::{CanarySpec, EgressNames, Faults, Injection};
use sandbox_core::{Backend, async_trait};

use crate::egress_lab;
use crate::fault_proxy::{Fault, FaultProxy};

/// The canary on the egress lab address: reachable from every sandbox with a network,
/// never leaving the machine, and not an engine network's address (those, the host's
/// bridge addresses, are blocked by the egress rules). For `Probes::canary`.
pub fn lab_canary() -> anyhow::Result<Option<CanarySpec>> {
    let ip = egress_lab::install().map_err(anyhow::Error::msg)?;
    Ok(Some(CanarySpec {
        bind: SocketAddr::new(ip, 0),
        dial_host: ip.to_string(),
    }))
}

/// The canary's listener, inside the lab's namespace (the canary is not one of this
/// host's addresses). For `Probes::bind_canary`.
pub fn bind_lab_canary(spec: &CanarySpec) -> anyhow::Result<std::net::TcpListener> {
    egress_lab::bind(spec.bind).map_err(anyhow::Error::msg)
}

/// The names the lab teaches the egress resolver. For `Probes::egress_names`.
pub fn lab_egress_names() -> Option<EgressNames> {
    Some(EgressNames {
        listed: egress_lab::LISTED.into(),
        unlisted: egress_lab::UNLISTED.into(),
    })
}

/// The suite's faults, injected by a [`FaultProxy`] in front of the engine socket into
/// the calls of a backend connected through it.
#[derive(Debug)]
pub struct ProxyFaults {
    proxy: FaultProxy,
    backend: Arc<dyn Backend>,
    cli: &'static str,
}

impl ProxyFaults {
    /// `backend` connected to `proxy`'s endpoint (with a create bound of seconds: the
    /// stalled-create trial waits it out); `cli` (`docker` / `podman`) exports the image
    /// the locked registry serves.
    pub fn new(proxy: FaultProxy, backend: Arc<dyn Backend>, cli: &'static str) -> Self {
        ProxyFaults {
            proxy,
            backend,
            cli,
        }
    }
}

#[async_trait]
impl Faults for ProxyFaults {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn hang_kills(&self) {
        self.proxy.set(Fault::Hang);
    }
    async fn fail_kills(&self) {
        self.proxy.set(Fault::Fail);
    }
    async fn heal(&self) {
        self.proxy.set(Fault::Pass);
        self.proxy.set_create(Fault::Pass);
        self.proxy.redirect_pulls(None);
    }
    async fn fail_creates(&self) -> Injection {
        self.proxy.set_create(Fault::Fail);
        Injection::Injected
    }
    async fn stall_creates(&self) -> Injection {
        self.proxy.set_create(Fault::Hang);
        Injection::Injected
    }
    /// Every pull goes to a loopback registry that demands a credential this backend is
    /// not given, and every image reads as missing ([`FaultProxy::lock_pulls`]), so the
    /// create pulls and the real engine meets a real registry refusal.
    #[allow(clippy::print_stderr)]
    async fn withhold_credential(&self) -> Injection {
        match self.proxy.lock_pulls(self.cli).await {
            Ok(()) => Injection::Injected,
            Err(e) => {
                eprintln!("withhold_credential: {e}");
                Injection::NotProvided
            }
        }
    }
}
