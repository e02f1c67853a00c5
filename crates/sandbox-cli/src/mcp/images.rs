//! The MCP server's image allowlist: which images a client's `sandbox_create` may name, and
//! so make the engine pull (a pull has no size cap, and the image's code is what runs).
//!
//! The operator gives patterns with `--allow-image`; without any, only the server's default
//! image is allowed. Both sides are read as the engines read a reference
//! ([`sandbox::ImageRef`]: `busybox` is `docker.io/library/busybox:latest`) before they are
//! compared, so the spelling of a name neither opens nor closes anything. A pattern is
//! either
//! - a tag reference, where `*` stands for any run of characters inside one component of
//!   the repository path (never across a `/`) or of the tag; the tag defaults to `latest`
//!   as the engines' does (`team/*:*` is every tag of every image directly under `team/`);
//!   it admits tag references only; or
//! - a digest reference (`name@sha256:<64 hex digits>`), admitting exactly that digest of
//!   that repository and nothing else.
//!
//! The registry is never a wildcard: a pattern names the registry it trusts.

use sandbox::{ImageRef, SandboxError};

/// The image the server's engines use when a call names none (every first-party
/// adapter's default template): what the allowlist holds when `--allow-image` is not given.
pub const DEFAULT_IMAGE: &str = "sandbox-rs/python:3.11";

/// The registry Docker Hub is also reached by.
const DOCKER_HUB_ALIAS: &str = "index.docker.io";

/// The images the server lets clients name.
#[derive(Debug, Clone)]
pub struct ImageAllowlist {
    patterns: Vec<Pattern>,
}

/// One `--allow-image` pattern, normalised.
#[derive(Debug, Clone)]
struct Pattern {
    registry: String,
    repository: Vec<String>,
    reference: Reference,
}

#[derive(Debug, Clone)]
enum Reference {
    /// A tag glob.
    Tag(String),
    /// `algorithm:hex`, compared exactly.
    Digest(String),
}

impl Default for ImageAllowlist {
    fn default() -> Self {
        ImageAllowlist::new(&[]).expect("the default image is a valid pattern")
    }
}

impl ImageAllowlist {
    /// The allowlist of `patterns` (the `--allow-image` values); just [`DEFAULT_IMAGE`] when
    /// empty. A malformed pattern is a `Configuration` error naming it.
    pub fn new(patterns: &[String]) -> sandbox::Result<Self> {
        let patterns = if patterns.is_empty() {
            vec![Pattern::parse(DEFAULT_IMAGE)?]
        } else {
            patterns
                .iter()
                .map(|p| Pattern::parse(p))
                .collect::<sandbox::Result<_>>()?
        };
        Ok(ImageAllowlist { patterns })
    }

    /// Whether a client may create a sandbox from `image`; `Configuration` naming the
    /// image and the flag when not (also for a reference that does not parse).
    pub fn check(&self, image: &str) -> sandbox::Result<()> {
        let refused = || {
            SandboxError::config(
                format!("image {image:?} is not on this MCP server's image allowlist"),
                "use an image the server allows, or restart the server with --allow-image \
                 naming it (a reference with * wildcards, or name@sha256:<digest>)",
            )
        };
        let Some(r) = ImageRef::parse(image) else {
            return Err(refused());
        };
        let registry = normalise_registry(&r.registry);
        let repository: Vec<&str> = r.repository.split('/').collect();
        let allowed = self.patterns.iter().any(|p| {
            p.registry == registry
                && p.repository.len() == repository.len()
                && p.repository
                    .iter()
                    .zip(&repository)
                    .all(|(pat, part)| glob(pat, part))
                && match (&p.reference, r.reference.split_at(1)) {
                    (Reference::Tag(pat), (":", tag)) => glob(pat, tag),
                    (Reference::Digest(d), ("@", digest)) => d == digest,
                    _ => false,
                }
        });
        if allowed { Ok(()) } else { Err(refused()) }
    }
}

impl Pattern {
    fn parse(pattern: &str) -> sandbox::Result<Pattern> {
        let bad = |why: &str| {
            SandboxError::config(
                format!("--allow-image {pattern:?}: {why}"),
                "give an image reference such as sandbox-rs/python:3.11, team/*:*, or \
                 name@sha256:<64 hex digits>",
            )
        };
        let r = ImageRef::parse(pattern).ok_or_else(|| bad("not an image reference"))?;
        if r.registry.contains('*') {
            return Err(bad("the registry cannot be a wildcard"));
        }
        let reference = match r.reference.split_at(1) {
            (":", tag) => Reference::Tag(tag.to_string()),
            (_, digest) => {
                if !is_digest(digest) {
                    return Err(bad(
                        "a digest is sha256:<64 hex digits> or sha512:<128 hex digits>, without wildcards",
                    ));
                }
                if r.repository.contains('*') {
                    return Err(bad(
                        "a pinned digest names one repository, without wildcards",
                    ));
                }
                Reference::Digest(digest.to_string())
            }
        };
        Ok(Pattern {
            registry: normalise_registry(&r.registry),
            repository: r.repository.split('/').map(str::to_string).collect(),
            reference,
        })
    }
}

fn normalise_registry(registry: &str) -> String {
    let registry = registry.to_ascii_lowercase();
    if registry == DOCKER_HUB_ALIAS {
        sandbox::image_ref::DEFAULT_REGISTRY.to_string()
    } else {
        registry
    }
}

fn is_digest(d: &str) -> bool {
    let hex_of = |h: &str, len: usize| {
        h.len() == len
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    match d.split_once(':') {
        Some(("sha256", h)) => hex_of(h, 64),
        Some(("sha512", h)) => hex_of(h, 128),
        _ => false,
    }
}

/// Whether `text` matches `pattern`, where `*` is any run of characters (callers give one
/// path component or one tag, so it never spans a `/`).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            backtrack = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((star, matched)) = backtrack {
            // The last `*` takes one more character.
            pi = star + 1;
            ti = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn list(patterns: &[&str]) -> ImageAllowlist {
        ImageAllowlist::new(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn allows(l: &ImageAllowlist, image: &str) -> bool {
        l.check(image).is_ok()
    }

    #[test]
    fn without_patterns_only_the_default_image_is_allowed() {
        let l = ImageAllowlist::default();
        assert!(allows(&l, DEFAULT_IMAGE));
        assert!(allows(&l, "docker.io/sandbox-rs/python:3.11"));
        for refused in [
            "sandbox-rs/python:3.12",
            "sandbox-rs/python",
            "sandbox-rs/busybox:latest",
            "python:3.11",
            "evil.example/sandbox-rs/python:3.11",
        ] {
            let e = l.check(refused).unwrap_err();
            assert_eq!(e.code(), sandbox::ErrorCode::Configuration, "{refused}");
            assert!(e.to_string().contains(refused), "{e}");
            assert!(e.hint().contains("--allow-image"), "{}", e.hint());
        }
    }

    #[test]
    fn short_and_full_names_are_the_same_image() {
        let l = list(&["busybox"]);
        for same in [
            "busybox",
            "busybox:latest",
            "library/busybox:latest",
            "docker.io/library/busybox:latest",
            "index.docker.io/library/busybox",
        ] {
            assert!(allows(&l, same), "{same}");
        }
        let l = list(&["docker.io/library/busybox:latest"]);
        assert!(allows(&l, "busybox"));
    }

    #[test]
    fn an_exact_tag_admits_that_tag_only() {
        let l = list(&["busybox:latest"]);
        for refused in [
            "busybox:latest-evil",
            "busybox:latestx",
            "busybox:lates",
            "busybox:1.36",
            "busybox-evil:latest",
            "evil/busybox:latest",
            "library/busybox/evil:latest",
            "quay.io/library/busybox:latest",
            "localhost:5000/library/busybox:latest",
        ] {
            assert!(!allows(&l, refused), "{refused}");
        }
    }

    #[test]
    fn wildcards_stay_inside_one_component() {
        let l = list(&["team/*:*"]);
        assert!(allows(&l, "team/app:1.0"));
        assert!(allows(&l, "team/app"));
        assert!(!allows(&l, "team/app/evil:1.0"), "a * never spans a /");
        assert!(!allows(&l, "team:1.0"));
        assert!(!allows(&l, "teamx/app:1.0"));
        assert!(
            !allows(&l, &format!("team/app@{DIGEST}")),
            "a tag pattern admits no digest"
        );
        let l = list(&["python:3.*"]);
        assert!(allows(&l, "python:3.11"));
        assert!(allows(&l, "python:3.12-slim"));
        assert!(!allows(&l, "python:2.7"));
        assert!(!allows(&l, "python"), "latest is not 3.*");
        let l = list(&["sandbox-rs/*"]);
        assert!(allows(&l, "sandbox-rs/busybox"));
        assert!(
            !allows(&l, "sandbox-rs/busybox:1"),
            "the tag defaults to latest in a pattern too"
        );
        let l = list(&["registry.local:5000/*/base-*:v*"]);
        assert!(allows(&l, "registry.local:5000/ml/base-cuda:v2"));
        assert!(!allows(&l, "registry.local:5000/ml/x/base-cuda:v2"));
        assert!(!allows(&l, "registry.local:5001/ml/base-cuda:v2"));
    }

    #[test]
    fn a_digest_admits_exactly_that_digest() {
        let l = list(&[&format!("alpine@{DIGEST}")]);
        assert!(allows(&l, &format!("alpine@{DIGEST}")));
        assert!(allows(
            &l,
            &format!("docker.io/library/alpine:3.19@{DIGEST}")
        ));
        let other = DIGEST.replace("0123", "0124");
        assert!(!allows(&l, &format!("alpine@{other}")));
        assert!(!allows(&l, &format!("alpine@{DIGEST}0")));
        assert!(
            !allows(&l, "alpine:latest"),
            "a digest pattern admits no tag"
        );
        assert!(!allows(&l, &format!("evil/alpine@{DIGEST}")));
    }

    #[test]
    fn malformed_patterns_are_refused_by_name() {
        for bad in [
            "",
            "a b",
            "*.example.com/app:1",
            "reg*.io/app:1",
            "alpine@sha256:abc",
            "alpine@sha256:*",
            &format!("team/*@{DIGEST}"),
            &format!("alpine@md5:{}", &DIGEST[7..]),
        ] {
            let e = ImageAllowlist::new(&[bad.to_string()]).unwrap_err();
            assert_eq!(e.code(), sandbox::ErrorCode::Configuration, "{bad:?}");
            assert!(e.to_string().contains("--allow-image"), "{e}");
        }
    }

    #[test]
    fn unparsable_requests_are_refused() {
        let l = list(&["*"]);
        assert!(allows(&l, "anything"));
        for bad in ["", "a b", "x//y", "a\n", "team/app"] {
            assert!(!allows(&l, bad), "{bad:?}");
        }
    }

    #[test]
    fn glob_matches_runs_of_characters() {
        assert!(glob("*", ""));
        assert!(glob("a*c", "abbbc"));
        assert!(glob("*-slim", "3.12-slim"));
        assert!(!glob("*-slim", "3.12-slimx"));
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "axxcyyb"));
        assert!(!glob("abc", "abcd"));
    }

    #[cfg(feature = "docker")]
    #[test]
    fn the_default_image_is_the_engines_default_template() {
        assert_eq!(DEFAULT_IMAGE, sandbox::docker::DEFAULT_TEMPLATE);
    }
}
