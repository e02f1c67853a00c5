//! Brokered credentials (`CreateOptions::credential`): a secret bound to destination hosts
//! and to one place in an HTTP request, which the sandbox can use without ever holding
//! it. Inside, an environment variable carries an opaque placeholder; a backend that
//! declares [`Capability::CREDENTIALS`](crate::Capability::CREDENTIALS) swaps it for the
//! real value on the host, in requests to the bound hosts only. This module owns the
//! types and their validation; the proxy that enforces them is the backend's.

use std::fmt;

use crate::{Result, SandboxError, Secret};

/// Most credentials one sandbox may be given.
pub const MAX_CREDENTIALS: usize = 8;

/// Most hosts one credential may be bound to.
pub const MAX_CREDENTIAL_HOSTS: usize = 8;

/// Longest secret accepted (a header line stays well under the proxy's header bound).
pub const MAX_CREDENTIAL_LEN: usize = 4096;

/// Where the real value goes in a request to a bound host.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum Placement {
    /// A request header: `template` with `{}` where the value goes (`Bearer {}`). The
    /// header sent by the sandbox must read exactly `template` with the placeholder in
    /// place of `{}`; that value, and no other, becomes `template` with the secret.
    Header {
        /// The header's name (an HTTP token, compared case-insensitively).
        name: String,
        /// The value's shape, holding `{}` once.
        template: String,
    },
    /// A query parameter of the request target whose value is the placeholder.
    Query {
        /// The parameter's name.
        name: String,
    },
}

impl Placement {
    /// A header whose whole value is the secret.
    pub fn header(name: impl Into<String>) -> Self {
        Placement::Header {
            name: name.into(),
            template: "{}".into(),
        }
    }

    /// A header with a value template (`Authorization`, `Bearer {}`).
    pub fn header_template(name: impl Into<String>, template: impl Into<String>) -> Self {
        Placement::Header {
            name: name.into(),
            template: template.into(),
        }
    }

    /// A query parameter.
    pub fn query(name: impl Into<String>) -> Self {
        Placement::Query { name: name.into() }
    }

    fn validate(&self) -> Result<()> {
        match self {
            Placement::Header { name, template } => {
                let token = !name.is_empty()
                    && name.len() <= 128
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !token {
                    return Err(SandboxError::config(
                        format!(
                            "credential header name {:?} is not an HTTP header name",
                            name.chars().take(80).collect::<String>()
                        ),
                        "use a header name such as `Authorization` or `X-Api-Key` (letters, \
                         digits and `-`)",
                    ));
                }
                if ["host", "content-length", "transfer-encoding", "connection"]
                    .contains(&name.to_ascii_lowercase().as_str())
                {
                    return Err(SandboxError::config(
                        format!("credential header {name:?} frames or routes the request"),
                        "bind the credential to the header the API reads it from, e.g. \
                         `Authorization`",
                    ));
                }
                if template.matches("{}").count() != 1 {
                    return Err(SandboxError::config(
                        format!("credential header template {template:?} must hold `{{}}` once"),
                        "write the value with `{}` where the secret goes, e.g. `Bearer {}`",
                    ));
                }
                if template.len() > 256 || template.bytes().any(|b| b < 0x20 || b == 0x7f) {
                    return Err(SandboxError::config(
                        "credential header template holds control characters or is longer \
                         than 256 bytes",
                        "write a one-line value with `{}` where the secret goes",
                    ));
                }
            }
            Placement::Query { name } => {
                let ok = !name.is_empty()
                    && name.len() <= 128
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b));
                if !ok {
                    return Err(SandboxError::config(
                        format!(
                            "credential query parameter {:?} is not a plain parameter name",
                            name.chars().take(80).collect::<String>()
                        ),
                        "use letters, digits, `-`, `_`, `.` or `~`, e.g. `api_key`",
                    ));
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Header { name, template } => write!(f, "header {name}: {template}"),
            Placement::Query { name } => write!(f, "query {name}"),
        }
    }
}

/// A secret the sandbox may use against `hosts` without holding it. `Debug` and serde
/// show the binding, never the secret.
#[derive(Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Credential {
    /// The environment variable that carries the placeholder inside the sandbox.
    pub env_var: String,
    /// The real value (`"***"` in every rendering).
    pub secret: Secret,
    /// The destination host names (lower-case, no trailing dot).
    pub hosts: Vec<String>,
    /// Where the value goes in a request.
    pub placement: Placement,
}

impl Credential {
    /// A credential read into `env_var`'s placeholder, sent to `hosts` at `placement`.
    /// Host names are lower-cased and a trailing dot dropped; [`Credential::validate`]
    /// (run by `CreateOptions::validate`) checks the rest.
    pub fn new(
        env_var: impl Into<String>,
        secret: impl Into<Secret>,
        hosts: impl IntoIterator<Item = impl Into<String>>,
        placement: Placement,
    ) -> Self {
        Credential {
            env_var: env_var.into(),
            secret: secret.into(),
            hosts: hosts
                .into_iter()
                .map(|h| h.into().trim_end_matches('.').to_ascii_lowercase())
                .collect(),
            placement,
        }
    }

    /// Checks names, hosts, placement and the secret's shape (a secret that could not
    /// travel in a header is refused here rather than failing every request).
    pub fn validate(&self) -> Result<()> {
        validate_env_var(&self.env_var)?;
        if self.hosts.is_empty() || self.hosts.len() > MAX_CREDENTIAL_HOSTS {
            return Err(SandboxError::config(
                format!(
                    "credential {} is bound to {} hosts",
                    self.env_var,
                    self.hosts.len()
                ),
                format!("bind each credential to 1 to {MAX_CREDENTIAL_HOSTS} host names"),
            ));
        }
        for (i, h) in self.hosts.iter().enumerate() {
            validate_host(h)?;
            if self.hosts[..i].contains(h) {
                return Err(SandboxError::config(
                    format!("credential {} names host {h} twice", self.env_var),
                    "name each host once",
                ));
            }
        }
        self.placement.validate()?;
        let s = self.secret.expose();
        if s.is_empty() || s.len() > MAX_CREDENTIAL_LEN || s.bytes().any(|b| b < 0x20 || b == 0x7f)
        {
            // The message never carries the value.
            return Err(SandboxError::config(
                format!(
                    "the secret of credential {} is empty, longer than {MAX_CREDENTIAL_LEN} \
                     bytes, or holds control characters",
                    self.env_var
                ),
                "give the token as one line of printable characters",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("env_var", &self.env_var)
            .field("secret", &self.secret)
            .field("hosts", &self.hosts)
            .field("placement", &self.placement)
            .finish()
    }
}

/// A portable environment variable name (`[A-Za-z_][A-Za-z0-9_]*`): an SDK reads it by
/// that name.
fn validate_env_var(v: &str) -> Result<()> {
    let ok = !v.is_empty()
        && v.len() <= 128
        && !v.as_bytes()[0].is_ascii_digit()
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !ok {
        return Err(SandboxError::config(
            format!(
                "credential variable {:?} is not an environment variable name",
                v.chars().take(80).collect::<String>()
            ),
            "name the variable the program reads its key from, e.g. `OPENAI_API_KEY`",
        ));
    }
    Ok(())
}

/// A destination host name: dot-separated labels of ASCII letters, digits, hyphens (and
/// underscores, which some service names carry), at most 253 bytes. No address, no port,
/// no wildcard: the proxy mints a certificate for exactly this name.
fn validate_host(h: &str) -> Result<()> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    let is_addr = h.parse::<std::net::IpAddr>().is_ok();
    if h.is_empty() || h.len() > 253 || is_addr || !h.split('.').all(label_ok) {
        return Err(SandboxError::config(
            format!(
                "credential host {:?} is not a host name",
                h.chars().take(80).collect::<String>()
            ),
            "name the API's host, e.g. `api.example.com` (no scheme, port, path, wildcard \
             or address)",
        ));
    }
    Ok(())
}

/// Checks a sandbox's credentials together: each one, at most [`MAX_CREDENTIALS`], no
/// environment variable twice, and no host bound twice at the same placement (which one
/// would win is not obvious, so neither is taken).
pub fn validate_all(creds: &[Credential]) -> Result<()> {
    if creds.len() > MAX_CREDENTIALS {
        return Err(SandboxError::config(
            format!("{} credentials for one sandbox", creds.len()),
            format!("give a sandbox at most {MAX_CREDENTIALS} credentials"),
        ));
    }
    for (i, c) in creds.iter().enumerate() {
        c.validate()?;
        for o in &creds[..i] {
            if o.env_var == c.env_var {
                return Err(SandboxError::config(
                    format!("two credentials use the environment variable {}", c.env_var),
                    "give each credential its own variable",
                ));
            }
            if placement_key(&o.placement) == placement_key(&c.placement)
                && o.hosts.iter().any(|h| c.hosts.contains(h))
            {
                return Err(SandboxError::config(
                    format!(
                        "credentials {} and {} go to the same host at the same place ({})",
                        o.env_var, c.env_var, c.placement
                    ),
                    "bind one credential per host and header (or query parameter)",
                ));
            }
        }
    }
    Ok(())
}

fn placement_key(p: &Placement) -> (bool, String) {
    match p {
        Placement::Header { name, .. } => (true, name.to_ascii_lowercase()),
        Placement::Query { name } => (false, name.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    fn bearer(env: &str, hosts: &[&str]) -> Credential {
        Credential::new(
            env,
            "sk-real-value",
            hosts.iter().copied(),
            Placement::header_template("Authorization", "Bearer {}"),
        )
    }

    fn refused(c: Result<()>) -> ErrorCode {
        c.unwrap_err().code()
    }

    #[test]
    fn a_credential_never_prints_its_secret() {
        let c = bearer("API_KEY", &["api.example.com"]);
        let shown = format!("{c:?}");
        assert!(!shown.contains("sk-real-value"), "{shown}");
        assert!(shown.contains("api.example.com"));
    }

    #[test]
    fn hosts_are_normalised_and_checked() {
        let c = bearer("API_KEY", &["API.Example.com."]);
        assert_eq!(c.hosts, ["api.example.com"]);
        assert!(c.validate().is_ok());
        for bad in [
            "",
            "https://api.example.com",
            "api.example.com:443",
            "*.example.com",
            "10.0.0.1",
            "a..b",
        ] {
            assert_eq!(
                refused(bearer("K", &[bad]).validate()),
                ErrorCode::Configuration,
                "{bad}"
            );
        }
        assert!(bearer("K", &[]).validate().is_err());
        let many: Vec<String> = (0..9).map(|i| format!("h{i}.example")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(bearer("K", &many).validate().is_err());
        assert!(bearer("K", &["a.example", "a.example"]).validate().is_err());
    }

    #[test]
    fn placements_are_checked() {
        let with = |p: Placement| Credential::new("K", "v", ["a.example"], p).validate();
        assert!(with(Placement::header("X-Api-Key")).is_ok());
        assert!(with(Placement::query("api_key")).is_ok());
        assert!(with(Placement::header_template("Authorization", "Bearer")).is_err());
        assert!(with(Placement::header_template("Authorization", "{} {}")).is_err());
        assert!(with(Placement::header("Bad Header")).is_err());
        assert!(with(Placement::header("Host")).is_err());
        assert!(with(Placement::header_template("A", "x\r\n{}")).is_err());
        assert!(with(Placement::query("a=b")).is_err());
    }

    #[test]
    fn the_secret_must_fit_a_header_and_the_error_never_shows_it() {
        let c = Credential::new("K", "line\nbreak", ["a.example"], Placement::header("A"));
        let e = c.validate().unwrap_err();
        assert!(!e.render().contains("line\nbreak"));
        assert!(
            Credential::new("K", "", ["a.example"], Placement::header("A"))
                .validate()
                .is_err()
        );
    }

    #[test]
    fn a_sandbox_has_few_distinct_credentials() {
        assert!(validate_all(&[bearer("A", &["a.example"]), bearer("B", &["b.example"])]).is_ok());
        assert!(validate_all(&[bearer("A", &["a.example"]), bearer("A", &["b.example"])]).is_err());
        // Same host, same header: which would win is not obvious.
        assert!(validate_all(&[bearer("A", &["a.example"]), bearer("B", &["a.example"])]).is_err());
        let nine: Vec<Credential> = (0..9)
            .map(|i| bearer(&format!("K{i}"), &[&format!("h{i}.example")]))
            .collect();
        assert!(validate_all(&nine).is_err());
        assert!(validate_all(&nine[..8]).is_ok());
        assert!(refused(bearer("1BAD", &["a.example"]).validate()) == ErrorCode::Configuration);
    }
}
