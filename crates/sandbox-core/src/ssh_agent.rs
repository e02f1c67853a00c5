//! SSH agent forwarding settings (`CreateOptions::ssh_agent`): which agent on the host a
//! sandbox's `SSH_AUTH_SOCK` reaches, and which of its keys the sandbox may list and sign
//! with. The keys themselves never leave the host agent; a backend that declares
//! [`Capability::SSH_AGENT`](crate::Capability::SSH_AGENT) enforces the selection on the
//! host, outside the sandbox's reach.

use std::fmt;
use std::path::PathBuf;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use sha2::{Digest, Sha256};

use crate::{Result, SandboxError};

/// Most keys one sandbox may be given.
pub const MAX_SSH_KEYS: usize = 16;

/// Largest public key blob accepted (an RSA-16384 key is about 2 KiB).
pub const MAX_SSH_KEY_BLOB: usize = 8 * 1024;

/// Where the socket is inside the sandbox; `SSH_AUTH_SOCK` names it in every command's
/// environment.
pub const SSH_AUTH_SOCK_PATH: &str = "/run/sandbox-rs/ssh-agent.sock";

/// One key of the host agent, named the way `ssh-add -l` and `ssh-keygen -l` print it, or
/// by its public key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum SshKey {
    /// The SHA-256 fingerprint: `SHA256:` and 43 characters of unpadded base64.
    Fingerprint(String),
    /// The public key blob (the base64-decoded second field of a `.pub` line).
    Blob(Vec<u8>),
}

impl SshKey {
    /// A key by its SHA-256 fingerprint (`SHA256:…`, as `ssh-add -l` prints it).
    pub fn fingerprint(fingerprint: &str) -> Result<Self> {
        let bad = || {
            SandboxError::config(
                format!("{fingerprint:?} is not an SSH key fingerprint"),
                "give the SHA-256 fingerprint as `ssh-add -l` prints it (`SHA256:` and 43 \
                 base64 characters), or the key's public key line",
            )
        };
        let b64 = fingerprint.strip_prefix("SHA256:").ok_or_else(bad)?;
        match STANDARD_NO_PAD.decode(b64) {
            Ok(digest) if digest.len() == 32 => Ok(SshKey::Fingerprint(fingerprint.to_string())),
            _ => Err(bad()),
        }
    }

    /// A key by its public key line (`ssh-ed25519 AAAA… comment`, a `.pub` file's
    /// content); the comment is ignored.
    pub fn public_key(line: &str) -> Result<Self> {
        let bad = |why: &str| {
            SandboxError::config(
                format!("not an SSH public key line: {why}"),
                "give the content of the key's `.pub` file (`ssh-ed25519 AAAA… comment`), \
                 or its SHA-256 fingerprint",
            )
        };
        let mut fields = line.split_whitespace();
        let (Some(kind), Some(b64)) = (fields.next(), fields.next()) else {
            return Err(bad("it needs a key type and a base64 key"));
        };
        let blob = STANDARD
            .decode(b64)
            .map_err(|_| bad("the key is not base64"))?;
        if blob.len() > MAX_SSH_KEY_BLOB {
            return Err(bad("the key is longer than any SSH key"));
        }
        // The blob starts with its own type as an SSH string: a line whose two disagree
        // is a paste error, refused rather than matched against nothing.
        let named = blob
            .get(..4)
            .map(|l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize)
            .and_then(|n| blob.get(4..4 + n));
        if named != Some(kind.as_bytes()) {
            return Err(bad("the key's type does not match the type it starts with"));
        }
        Ok(SshKey::Blob(blob))
    }

    /// A fingerprint when `s` starts with `SHA256:`, else a public key line.
    pub fn parse(s: &str) -> Result<Self> {
        if s.starts_with("SHA256:") {
            Self::fingerprint(s)
        } else {
            Self::public_key(s)
        }
    }

    /// Whether the key with public key blob `blob` is this one.
    pub fn matches(&self, blob: &[u8]) -> bool {
        match self {
            SshKey::Blob(b) => b == blob,
            SshKey::Fingerprint(f) => *f == fingerprint_of(blob),
        }
    }
}

/// The SHA-256 fingerprint of a public key blob, as `ssh-add -l` prints it.
pub fn fingerprint_of(blob: &[u8]) -> String {
    format!("SHA256:{}", STANDARD_NO_PAD.encode(Sha256::digest(blob)))
}

impl fmt::Debug for SshKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string())
    }
}

/// The fingerprint, whichever way the key was named (a public key is no secret, but the
/// fingerprint is what `ssh-add -l` shows).
impl fmt::Display for SshKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SshKey::Fingerprint(s) => f.write_str(s),
            SshKey::Blob(b) => f.write_str(&fingerprint_of(b)),
        }
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for SshKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for SshKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        SshKey::parse(&s).map_err(|e| serde::de::Error::custom(e.render()))
    }
}

/// SSH agent forwarding for one sandbox: the host agent and the keys it may use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default)
)]
#[non_exhaustive]
pub struct SshAgentOptions {
    /// The host agent's socket; `None`: `$SSH_AUTH_SOCK` of the creating process, read at
    /// create.
    pub socket: Option<PathBuf>,
    /// The keys offered, at most [`MAX_SSH_KEYS`]. Each must be in the host agent when
    /// the sandbox is created.
    pub keys: Vec<SshKey>,
    /// Offer every key the host agent holds when the sandbox is created (instead of
    /// `keys`; keys added to the agent later are not offered).
    pub all_keys: bool,
}

impl SshAgentOptions {
    /// The keys `keys` of the agent at `$SSH_AUTH_SOCK`.
    pub fn keys(keys: impl IntoIterator<Item = SshKey>) -> Self {
        SshAgentOptions {
            keys: keys.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Every key the agent holds at create.
    pub fn all_keys() -> Self {
        SshAgentOptions {
            all_keys: true,
            ..Self::default()
        }
    }

    /// Adds a key.
    pub fn key(mut self, key: SshKey) -> Self {
        self.keys.push(key);
        self
    }

    /// Uses the agent at `socket` instead of `$SSH_AUTH_SOCK`.
    pub fn socket(mut self, socket: impl Into<PathBuf>) -> Self {
        self.socket = Some(socket.into());
        self
    }

    /// Keys given or `all_keys`, not both, not neither; at most [`MAX_SSH_KEYS`]; a
    /// socket path that is absolute.
    pub fn validate(&self) -> Result<()> {
        if self.all_keys != self.keys.is_empty() {
            return Err(SandboxError::config(
                if self.all_keys {
                    "ssh_agent names keys and also asks for all keys"
                } else {
                    "ssh_agent names no key"
                },
                "name the keys the sandbox may use (SshAgentOptions::keys, fingerprints as \
                 `ssh-add -l` prints them), or SshAgentOptions::all_keys() for every key the \
                 agent holds",
            ));
        }
        if self.keys.len() > MAX_SSH_KEYS {
            return Err(SandboxError::config(
                format!(
                    "ssh_agent names {} keys, at most {MAX_SSH_KEYS} are allowed",
                    self.keys.len()
                ),
                "name fewer keys",
            ));
        }
        if let Some(s) = &self.socket
            && !s.is_absolute()
        {
            return Err(SandboxError::config(
                format!("ssh agent socket {} is not an absolute path", s.display()),
                "give the agent's socket as an absolute path (what SSH_AUTH_SOCK holds)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    /// `ssh-keygen -t ed25519` output, and what `ssh-keygen -lf` prints for it.
    const LINE: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICEEqZZg5K91Ce5+23k0yxQeDvysT7lga91UISUGKslm test@host";
    const FP: &str = "SHA256:Xkj6rkMDyisuyYv2cI/gnuroU0yE2PYZqpy0Ghp6E08";

    #[test]
    fn a_public_key_line_and_its_fingerprint_name_the_same_key() {
        let blob = match SshKey::public_key(LINE).unwrap() {
            SshKey::Blob(b) => b,
            other => panic!("{other:?}"),
        };
        assert_eq!(fingerprint_of(&blob), FP);
        assert!(SshKey::fingerprint(FP).unwrap().matches(&blob));
        assert!(SshKey::parse(LINE).unwrap().matches(&blob));
        assert!(!SshKey::parse(FP).unwrap().matches(&blob[1..]));
        assert_eq!(SshKey::parse(LINE).unwrap().to_string(), FP);
    }

    #[test]
    fn malformed_keys_are_configuration_errors() {
        for bad in [
            "SHA256:short",
            "MD5:aa:bb",
            "ssh-ed25519",
            "ssh-ed25519 !!!",
            // The type named differs from the blob's.
            "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAICEEqZZg5K91Ce5+23k0yxQeDvysT7lga91UISUGKslm",
        ] {
            assert_eq!(
                SshKey::parse(bad).unwrap_err().code(),
                ErrorCode::Configuration,
                "{bad}"
            );
        }
    }

    /// Keys travel as fingerprints (a public key line becomes its fingerprint), and a
    /// malformed one is refused when read, not ignored.
    #[cfg(feature = "serde")]
    #[test]
    fn options_round_trip_as_fingerprints() {
        let o = crate::CreateOptions::new("img").ssh_agent(
            SshAgentOptions::keys([SshKey::parse(LINE).unwrap()]).socket("/run/agent.sock"),
        );
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(v["ssh_agent"]["keys"], serde_json::json!([FP]));
        assert_eq!(v["ssh_agent"]["socket"], "/run/agent.sock");
        let back: crate::CreateOptions = serde_json::from_value(v).unwrap();
        let keys = &back.ssh_agent.as_ref().unwrap().keys;
        assert_eq!(keys, &[SshKey::fingerprint(FP).unwrap()]);
        let bad = serde_json::json!({ "ssh_agent": { "keys": ["SHA256:short"] } });
        assert!(serde_json::from_value::<crate::CreateOptions>(bad).is_err());
    }

    #[test]
    fn a_selection_is_keys_or_all_bounded() {
        let key = SshKey::parse(FP).unwrap();
        assert!(SshAgentOptions::keys([key.clone()]).validate().is_ok());
        assert!(SshAgentOptions::all_keys().validate().is_ok());
        assert!(SshAgentOptions::default().validate().is_err());
        assert!(
            SshAgentOptions::all_keys()
                .key(key.clone())
                .validate()
                .is_err()
        );
        assert!(
            SshAgentOptions::keys(vec![key.clone(); MAX_SSH_KEYS + 1])
                .validate()
                .is_err()
        );
        assert!(
            SshAgentOptions::keys([key])
                .socket("relative.sock")
                .validate()
                .is_err()
        );
        // The sandbox's SSH_AUTH_SOCK is the forwarding's; another value would win or lose
        // silently.
        let clash = crate::CreateOptions::new("img")
            .env("SSH_AUTH_SOCK", "/elsewhere")
            .ssh_agent(SshAgentOptions::all_keys());
        assert_eq!(
            clash.validate().unwrap_err().code(),
            ErrorCode::Configuration
        );
        assert!(
            crate::CreateOptions::new("img")
                .ssh_agent(SshAgentOptions::all_keys())
                .validate()
                .is_ok()
        );
    }
}
