//! DSN grammar: `<backend>://[template][?timeout=N]`.
//!
//! `N` is the sandbox lifetime in whole seconds. Unknown parameters are a configuration
//! error, and credential-looking ones (`token`, `password`, …) are refused outright: a
//! credential belongs in an environment variable, never in a string that ends up in logs.

use std::fmt;
use std::time::Duration;

use crate::options::validate_lifetime;
use crate::{CreateOptions, Result, SandboxError};

/// Parameter names refused because they look like credentials.
const CREDENTIAL_WORDS: &[&str] = &[
    "token",
    "password",
    "passwd",
    "pass",
    "pwd",
    "secret",
    "key",
    "apikey",
    "api_key",
    "auth",
    "credential",
    "credentials",
    "cert",
    "private",
];

/// A parsed DSN.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dsn {
    /// Backend scheme (`docker`, `podman`, `fake`, or a registered one).
    pub scheme: String,
    /// Template (image), when given.
    pub template: Option<String>,
    /// Sandbox lifetime, when given.
    pub timeout: Option<Duration>,
}

impl Dsn {
    /// A DSN for `scheme` with no template or parameters.
    pub fn new(scheme: impl Into<String>) -> Self {
        Dsn {
            scheme: scheme.into(),
            template: None,
            timeout: None,
        }
    }

    /// Parses a DSN. Never panics; every malformed input is a `Configuration` error.
    pub fn parse(input: &str) -> Result<Dsn> {
        let bad = |why: &str| {
            SandboxError::config(
                format!("invalid DSN {:?}: {why}", truncate(input)),
                "write it as <backend>://[template][?timeout=SECONDS], e.g. docker://sandbox-rs/python:3.11?timeout=60",
            )
        };
        if input.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("it contains whitespace or control characters"));
        }
        let (scheme, rest) = input
            .split_once("://")
            .ok_or_else(|| bad("missing `://`"))?;
        if !valid_scheme(scheme) {
            return Err(bad("the scheme must match [a-z][a-z0-9+.-]*"));
        }
        if rest.contains('#') {
            return Err(bad("fragments (`#`) are not allowed"));
        }
        let (template, query) = match rest.split_once('?') {
            Some((t, q)) => (t, Some(q)),
            None => (rest, None),
        };
        let mut dsn = Dsn::new(scheme);
        if !template.is_empty() {
            if template.contains('%') {
                return Err(bad("percent-encoding is not supported in templates"));
            }
            if let Some((user, _)) = template.split_once('@') {
                if user.contains(':') && !user.contains('/') {
                    return Err(SandboxError::config(
                        "DSN looks like it carries credentials (`user:password@…`)",
                        "remove credentials from the DSN and pass them through the backend's environment variable",
                    ));
                }
            }
            dsn.template = Some(template.to_string());
        }
        if let Some(q) = query {
            if q.is_empty() {
                return Err(bad("empty query after `?`"));
            }
            for pair in q.split('&') {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| bad("parameters are key=value"))?;
                let lower = k.to_ascii_lowercase();
                if CREDENTIAL_WORDS.iter().any(|w| lower.contains(w)) {
                    return Err(SandboxError::config(
                        format!("DSN parameter `{}` looks like a credential", truncate(k)),
                        "never put credentials in a DSN; pass them through the backend's environment variable",
                    ));
                }
                match k {
                    "timeout" => {
                        if dsn.timeout.is_some() {
                            return Err(bad("`timeout` given twice"));
                        }
                        let secs: u64 = v
                            .parse()
                            .map_err(|_| bad("timeout must be a whole number of seconds"))?;
                        let t = Duration::from_secs(secs);
                        validate_lifetime(t)?;
                        dsn.timeout = Some(t);
                    }
                    other => {
                        return Err(SandboxError::config(
                            format!("unknown DSN parameter `{}`", truncate(other)),
                            "the only DSN parameter is `timeout` (seconds); set everything else in CreateOptions",
                        ));
                    }
                }
            }
        }
        Ok(dsn)
    }

    /// Applies the template and timeout on top of `base`.
    pub fn apply(&self, mut base: CreateOptions) -> CreateOptions {
        if let Some(t) = &self.template {
            base.template = Some(t.clone());
        }
        if let Some(t) = self.timeout {
            base.timeout = t;
        }
        base
    }
}

impl std::str::FromStr for Dsn {
    type Err = SandboxError;
    fn from_str(s: &str) -> Result<Dsn> {
        Dsn::parse(s)
    }
}

impl fmt::Display for Dsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}",
            self.scheme,
            self.template.as_deref().unwrap_or("")
        )?;
        if let Some(t) = self.timeout {
            write!(f, "?timeout={}", t.as_secs())?;
        }
        Ok(())
    }
}

fn valid_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+.-".contains(c))
        && s.len() <= 32
}

fn truncate(s: &str) -> String {
    if s.chars().count() > 80 {
        format!("{}…", s.chars().take(80).collect::<String>())
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use proptest::prelude::*;

    #[test]
    fn parses_examples() {
        let d = Dsn::parse("docker://sandbox-rs/python:3.11?timeout=60").unwrap();
        assert_eq!(d.scheme, "docker");
        assert_eq!(d.template.as_deref(), Some("sandbox-rs/python:3.11"));
        assert_eq!(d.timeout, Some(Duration::from_secs(60)));
        assert_eq!(Dsn::parse("fake://").unwrap(), Dsn::new("fake"));
        assert!(Dsn::parse("docker://img@sha256:abc").is_ok());
    }

    #[test]
    fn refusals() {
        for bad in [
            "docker",
            "Docker://x",
            "docker://x?foo=1",
            "docker://x?timeout=0",
            "docker://x?timeout=-1",
            "docker://x?timeout=1&timeout=2",
            "docker://x?token=abc",
            "docker://x?api_key=abc",
            "docker://user:pw@img",
            "docker://x y",
            "docker://x#frag",
            "docker://x?",
        ] {
            assert_eq!(
                Dsn::parse(bad).unwrap_err().code(),
                ErrorCode::Configuration,
                "{bad}"
            );
        }
    }

    #[test]
    fn credential_never_echoed() {
        let e = Dsn::parse("docker://x?password=hunter2").unwrap_err();
        assert!(!e.to_string().contains("hunter2"));
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = Dsn::parse(&s);
        }

        #[test]
        fn round_trips(
            scheme in "[a-z][a-z0-9]{0,10}",
            template in proptest::option::of("[a-z0-9][a-z0-9./:_-]{0,30}"),
            timeout in proptest::option::of(1u64..86400),
        ) {
            let d = Dsn { scheme, template, timeout: timeout.map(Duration::from_secs) };
            let text = d.to_string();
            prop_assert_eq!(Dsn::parse(&text).unwrap(), d);
        }

        #[test]
        fn unknown_parameters_refused(k in "[a-z]{1,12}", v in "[a-z0-9]{1,8}") {
            prop_assume!(k != "timeout");
            let e = Dsn::parse(&format!("docker://img?{k}={v}")).unwrap_err();
            prop_assert_eq!(e.code(), ErrorCode::Configuration);
        }

        #[test]
        fn credential_parameters_refused(
            pre in "[a-z_]{0,4}",
            word in proptest::sample::select(CREDENTIAL_WORDS),
            v in "[A-Za-z0-9]{1,12}",
        ) {
            let e = Dsn::parse(&format!("docker://img?{pre}{word}={v}")).unwrap_err();
            prop_assert!(e.to_string().contains("credential"));
            prop_assert!(!e.to_string().contains(&v) || v.len() < 3);
        }
    }
}
