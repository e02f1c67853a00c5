//! The per-sandbox certificate authority of the credentials proxy: made at create, its
//! key kept in this process's memory only (never written, never sent), name-constrained
//! to the sandbox's bound hosts, and the leaf certificates it mints on demand for those
//! names only. What the sandbox receives is the CA's certificate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose,
    NameConstraints,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// A sandbox's CA and the leaves it minted (one per bound host, made on first use).
pub(crate) struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
    hosts: Vec<String>,
    leaves: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Ca").field("hosts", &self.hosts).finish()
    }
}

impl Ca {
    /// A fresh CA that can vouch for `hosts` and nothing else (name constraints: a
    /// client that checks them refuses any other name even if this process were made to
    /// mint one).
    pub(crate) fn new(hosts: &[String]) -> Result<Ca, String> {
        let key = KeyPair::generate().map_err(|e| format!("generating the CA key: {e}"))?;
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| format!("the CA's parameters: {e}"))?;
        params.distinguished_name.push(
            DnType::CommonName,
            "sandbox-rs credentials proxy (this sandbox only)",
        );
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: hosts
                .iter()
                .map(|h| GeneralSubtree::DnsName(h.clone()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("signing the CA: {e}"))?;
        Ok(Ca {
            cert,
            key,
            hosts: hosts.to_vec(),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM (what the sandbox trusts).
    pub(crate) fn pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA certificate, DER (tests trust it).
    #[cfg(test)]
    pub(crate) fn der(&self) -> rustls::pki_types::CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// The leaf for `host` (minted on first use), or `None` for a host not bound.
    pub(crate) fn leaf(&self, host: &str) -> Option<Arc<CertifiedKey>> {
        if !self.hosts.iter().any(|h| h == host) {
            return None;
        }
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = leaves.get(host) {
            return Some(l.clone());
        }
        let leaf = self.mint(host).map_err(|e| {
            tracing::warn!(host, error = %e, "credentials proxy: minting a leaf certificate failed");
        });
        let leaf = Arc::new(leaf.ok()?);
        leaves.insert(host.to_string(), leaf.clone());
        Some(leaf)
    }

    fn mint(&self, host: &str) -> Result<CertifiedKey, String> {
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut params =
            CertificateParams::new(vec![host.to_string()]).map_err(|e| e.to_string())?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.is_ca = IsCa::NoCa;
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(|e| e.to_string())?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer =
            rustls::crypto::ring::sign::any_supported_type(&der).map_err(|e| e.to_string())?;
        Ok(CertifiedKey::new(vec![cert.der().clone()], signer))
    }
}

/// Picks the leaf by the client's SNI: a name that is not bound gets no certificate, and
/// the handshake fails.
#[derive(Debug)]
pub(crate) struct BySni(pub Arc<Ca>);

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello
            .server_name()?
            .trim_end_matches('.')
            .to_ascii_lowercase();
        self.0.leaf(&name)
    }
}
