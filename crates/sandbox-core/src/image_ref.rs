//! Image references ([`ImageRef`]) split the way Docker and Podman resolve short names:
//! registry, repository, and tag or digest. Here, below every engine, so the container
//! layer (pulls, credentials) and the tools that vet a reference before any engine sees
//! it (the MCP server's image allowlist) read a reference the same way.

use std::fmt;

/// The registry of short names (`python:3.12` is `docker.io/library/python:3.12`).
pub const DEFAULT_REGISTRY: &str = "docker.io";

/// An image reference split the way Docker and Podman resolve short names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageRef {
    /// Registry host (and port): `docker.io` for short names.
    pub registry: String,
    /// Repository path inside the registry (`library/python`, `team/app`).
    pub repository: String,
    /// `:tag` or `@sha256:…`, as written (`:latest` when absent).
    pub reference: String,
}

impl ImageRef {
    /// Splits `image`; `None` when it is not an image reference (empty, whitespace,
    /// control characters, an empty path component).
    pub fn parse(image: &str) -> Option<ImageRef> {
        if image.is_empty()
            || image.len() > 512
            || image.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return None;
        }
        let (name, reference) = match image.find('@') {
            // `name:tag@digest` pulls by the digest alone: the tag is dropped.
            Some(at) => {
                let name = &image[..at];
                let last_slash = name.rfind('/').map_or(0, |i| i + 1);
                let name = match name[last_slash..].rfind(':') {
                    Some(c) => &name[..last_slash + c],
                    None => name,
                };
                (name, image[at..].to_string())
            }
            None => {
                let last_slash = image.rfind('/').map_or(0, |i| i + 1);
                match image[last_slash..].rfind(':') {
                    Some(c) => (
                        &image[..last_slash + c],
                        image[last_slash + c..].to_string(),
                    ),
                    None => (image, ":latest".to_string()),
                }
            }
        };
        if reference.len() < 2 {
            return None;
        }
        // The first component is a registry when it looks like a host: Docker's rule.
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), rest.to_string())
            }
            _ if name.contains('/') => (DEFAULT_REGISTRY.to_string(), name.to_string()),
            _ => (DEFAULT_REGISTRY.to_string(), format!("library/{name}")),
        };
        if repository.is_empty() || repository.split('/').any(str::is_empty) {
            return None;
        }
        Some(ImageRef {
            registry,
            repository,
            reference,
        })
    }

    /// Whether the registry is on this machine (`localhost`, `127.0.0.0/8`, `::1`): the
    /// engines allow plain HTTP to those (Docker always; Podman when asked per pull).
    pub fn registry_is_loopback(&self) -> bool {
        let host = match self.registry.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => self.registry.split(':').next().unwrap_or(""),
        };
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}{}", self.registry, self.repository, self.reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap()
    }

    #[test]
    fn short_names_resolve_to_docker_hub_library() {
        let i = r("python:3.12-slim");
        assert_eq!(
            (
                i.registry.as_str(),
                i.repository.as_str(),
                i.reference.as_str()
            ),
            ("docker.io", "library/python", ":3.12-slim")
        );
        assert_eq!(r("team/app").reference, ":latest");
        assert_eq!(r("team/app").repository, "team/app");
        assert_eq!(r("sandbox-rs/busybox:latest").registry, "docker.io");
    }

    #[test]
    fn registries_with_ports_and_digests_split() {
        let i = r("127.0.0.1:5000/sbx/busybox:1");
        assert_eq!(i.registry, "127.0.0.1:5000");
        assert_eq!(i.repository, "sbx/busybox");
        assert_eq!(i.reference, ":1");
        assert!(i.registry_is_loopback());
        let d = r("localhost:5000/a@sha256:abcd");
        assert_eq!(
            (d.registry.as_str(), d.reference.as_str()),
            ("localhost:5000", "@sha256:abcd")
        );
        assert!(d.registry_is_loopback());
        let t = r("python:3.12@sha256:abcd");
        assert_eq!(
            (t.repository.as_str(), t.reference.as_str()),
            ("library/python", "@sha256:abcd"),
            "a tag beside a digest is not part of the name"
        );
        let p = r("localhost:5000/a");
        assert_eq!(p.reference, ":latest");
        assert!(!r("quay.io/x/y:1").registry_is_loopback());
        assert!(!r("python").registry_is_loopback());
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in ["", "a b", "x//y", "reg.io/", "a:", "a\n"] {
            assert!(ImageRef::parse(bad).is_none(), "{bad:?}");
        }
    }
}
