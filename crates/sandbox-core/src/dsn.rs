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
    ///
    /// Errors quote the DSN only after redacting userinfo and every parameter
    /// value but `timeout`'s, and the credential refusals run before any other check, so
    /// no error (message, `Debug`, hint) can carry a password, whatever else is wrong.
    pub fn parse(input: &str) -> Result<Dsn> {
        let shown = redact(input);
        let bad = |why: &str| {
            SandboxError::config(
                format!("invalid DSN {:?}: {why}", truncate(&shown)),
                "write it as <backend>://[template][?timeout=SECONDS], e.g. docker://sandbox-rs/python:3.11?timeout=60",
            )
        };
        refuse_credentials(input)?;
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
            if let Some(c) = template.chars().find(|c| !template_char(*c)) {
                return Err(bad(&format!(
                    "templates are image references; {c:?} is not allowed in one"
                )));
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

/// Refuses userinfo (`user:password@`, `token@`) and credential-looking parameter names,
/// before any other check can build a message. Neither refusal quotes the input.
fn refuse_credentials(input: &str) -> Result<()> {
    let rest = input.split_once("://").map_or(input, |(_, r)| r);
    let before_query = rest.split(['?', '#']).next().unwrap_or("");
    // `@` is legal in a template only in front of a digest (`img@sha256:…`); anything
    // else with an `@` is userinfo, however malformed (a password may contain `/` or `@`).
    if let Some((name, after)) = rest.rsplit_once('@') {
        let digest_form = !name.contains('@') && before_query.contains('@') && is_digest(after);
        if !digest_form {
            return Err(SandboxError::config(
                "DSN looks like it carries credentials (`user:password@…`)",
                "remove credentials from the DSN and pass them through the backend's environment variable",
            ));
        }
    }
    let query = rest.split_once('?').map_or("", |(_, q)| q);
    for pair in query.split(['&', '#']) {
        let key = pair.split_once('=').map_or(pair, |(k, _)| k);
        let lower = key.to_ascii_lowercase();
        if CREDENTIAL_WORDS.iter().any(|w| lower.contains(w)) {
            return Err(SandboxError::config(
                format!(
                    "DSN parameter `{}` looks like a credential",
                    truncate_to(key, 32)
                ),
                "never put credentials in a DSN; pass them through the backend's environment variable",
            ));
        }
    }
    Ok(())
}

/// `algorithm:encoded` (OCI digest grammar), up to an optional query.
fn is_digest(s: &str) -> bool {
    let s = s.split('?').next().unwrap_or("");
    let Some((alg, enc)) = s.split_once(':') else {
        return false;
    };
    !alg.is_empty()
        && alg
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+._-".contains(c))
        && !enc.is_empty()
        && enc
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "=_-".contains(c))
}

/// Characters of an image reference (`registry:port/name:tag@alg:digest`).
fn template_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._/:@-".contains(c)
}

/// The DSN as errors may quote it: userinfo becomes `***`, every parameter value but
/// `timeout`'s becomes `***` (as does a bare parameter), and a fragment becomes `#***`.
/// Over-redacting a strange DSN is fine; quoting a password is not.
fn redact(input: &str) -> String {
    let (head, rest) = match input.find("://") {
        Some(i) => input.split_at(i + 3),
        None => ("", input),
    };
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, if f.is_empty() { "#" } else { "#***" }),
        None => (rest, ""),
    };
    let rest = match rest.rsplit_once('@') {
        Some((name, after)) if name.contains(':') || name.contains('@') || !is_digest(after) => {
            format!("***@{after}")
        }
        _ => rest.to_string(),
    };
    let (template, query) = match rest.split_once('?') {
        Some((t, q)) => (t, Some(q)),
        None => (rest.as_str(), None),
    };
    let mut out = String::from(head);
    let mut pieces = template.split('&');
    // A template with `&`/`=` in it (a forgotten `?`) still gets its values redacted.
    let first = pieces.next().unwrap_or("");
    out.push_str(&redact_pair(first, true));
    for p in pieces {
        out.push('&');
        out.push_str(&redact_pair(p, false));
    }
    if let Some(q) = query {
        out.push('?');
        let pairs: Vec<String> = q.split('&').map(|p| redact_pair(p, false)).collect();
        out.push_str(&pairs.join("&"));
    }
    out.push_str(fragment);
    out
}

fn redact_pair(pair: &str, is_template: bool) -> String {
    match pair.split_once('=') {
        Some(("timeout", v)) => format!("timeout={}", truncate_to(v, 20)),
        Some((k, _)) => format!("{}=***", truncate_to(k, 32)),
        None if is_template || pair.is_empty() => pair.to_string(),
        None => "***".to_string(),
    }
}

fn truncate_to(s: &str, n: usize) -> String {
    if s.chars().count() > n {
        format!("{}…", s.chars().take(n).collect::<String>())
    } else {
        s.to_string()
    }
}

fn truncate(s: &str) -> String {
    truncate_to(s, 80)
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

    /// Every way an error could show the input: message, Debug (with the source chain),
    /// hint and the full rendering.
    fn shown(e: &SandboxError) -> String {
        format!("{e}\n{e:?}\n{}\n{}", e.hint(), e.render())
    }

    #[test]
    fn an_earlier_error_never_echoes_a_later_credential() {
        // Each of these fails on something other than the credential first (a bad timeout,
        // a fragment, whitespace, a malformed pair), which used to quote the whole DSN.
        for dsn in [
            "docker://x?timeout=abc&password=hunter2",
            "docker://u:hunter2@img#f",
            "docker://u:hunter2@img?timeout=abc",
            "docker://x?timeout=1&timeout=2&token=hunter2",
            "docker://x y?secret=hunter2",
            "docker://x?hunter2",
            "docker://x?timeout=abc#password=hunter2",
            "docker://u:p/hunter2@img#f",
            "docker://u:hunter2@x@img?timeout=0",
            "Docker://u:hunter2@img",
            "docker//u:hunter2@img",
        ] {
            let e = Dsn::parse(dsn).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Configuration, "{dsn}");
            assert!(!shown(&e).contains("hunter2"), "{dsn}: {}", shown(&e));
        }
    }

    #[test]
    fn redaction_keeps_what_helps() {
        assert_eq!(
            redact("docker://u:pw@img?timeout=abc&password=x&foo=bar#frag"),
            "docker://***@img?timeout=abc&password=***&foo=***#***"
        );
        assert_eq!(
            redact("docker://img@sha256:abc?timeout=1"),
            "docker://img@sha256:abc?timeout=1"
        );
        assert_eq!(redact("docker://x?bare"), "docker://x?***");
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
        fn no_error_ever_shows_a_credential(
            scheme in "(docker|Docker|nosuch|)",
            sep in "(://|:/|)",
            user in "[a-z]{0,6}",
            secret in "[A-Za-z0-9]{10,16}",
            template in "[a-z0-9/:.@ #-]{0,12}",
            word in proptest::sample::select(CREDENTIAL_WORDS),
            pre in "(timeout=[a-z0-9]{0,3}&|&|timeout=1&timeout=2&|)",
            post in "(#[a-z]{0,3}|&x| |)",
            in_userinfo in any::<bool>(),
        ) {
            let dsn = if in_userinfo {
                format!("{scheme}{sep}{user}:{secret}@{template}{post}")
            } else {
                format!("{scheme}{sep}{template}?{pre}{word}={secret}{post}")
            };
            if let Err(e) = Dsn::parse(&dsn) {
                prop_assert!(!shown(&e).contains(&secret), "{}: {}", dsn, shown(&e));
            }
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
