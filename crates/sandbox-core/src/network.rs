//! Network policy: egress deny by default, ingress ports published only when asked.

use crate::{Result, SandboxError};

/// What outbound traffic a sandbox may send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Egress {
    /// No network at all (only loopback). The default.
    #[default]
    Deny,
    /// Unrestricted outbound traffic.
    Allow,
    /// Only these hostnames or CIDRs (needs `EGRESS_ALLOWLIST`).
    AllowList(Vec<String>),
}

/// Network policy of a sandbox. Default: deny all egress, no ingress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkPolicy {
    /// Outbound policy.
    pub egress: Egress,
    /// Container ports to publish on the host's loopback (needs `INGRESS_PORTS`).
    pub ingress_ports: Vec<u16>,
}

impl NetworkPolicy {
    /// Deny all egress (the default).
    pub fn deny() -> Self {
        Self::default()
    }
    /// Allow all egress.
    pub fn allow() -> Self {
        NetworkPolicy {
            egress: Egress::Allow,
            ingress_ports: vec![],
        }
    }
    /// Allow only the given hosts / CIDRs.
    pub fn allow_list<I, S>(hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        NetworkPolicy {
            egress: Egress::AllowList(hosts.into_iter().map(Into::into).collect()),
            ingress_ports: vec![],
        }
    }
    /// Adds a port to publish on the host's loopback.
    pub fn ingress_port(mut self, port: u16) -> Self {
        self.ingress_ports.push(port);
        self
    }

    /// Validates ports and allowlist entries.
    pub fn validate(&self) -> Result<()> {
        for p in &self.ingress_ports {
            if *p == 0 {
                return Err(SandboxError::config(
                    "ingress port 0 is not a port",
                    "publish ports in 1..=65535",
                ));
            }
        }
        if let Egress::AllowList(hosts) = &self.egress {
            for h in hosts {
                let ok = !h.is_empty()
                    && h.len() <= 253
                    && h.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-._:/".contains(c));
                if !ok {
                    return Err(SandboxError::config(
                        format!("allowlist entry {h:?} is not a hostname or CIDR"),
                        "use hostnames like `pypi.org` or CIDRs like `10.0.0.0/8`",
                    ));
                }
            }
        }
        Ok(())
    }
}
