//! Images beyond pulling: the configuration an image declares (read from a sandbox's
//! image so its snapshot runs the same way), what an import of a filesystem is given,
//! and the snapshot images an engine lists.

use std::collections::BTreeMap;
use std::time::SystemTime;

/// The parts of an image's configuration a snapshot keeps from the image its sandbox
/// was created from: how a container of it runs. Never the container's own settings
/// (its labels, its create-time env): those were that sandbox's, not its image's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageConfig {
    /// `KEY=value` entries.
    pub env: Vec<String>,
    /// The default command, when the image declares one.
    pub cmd: Option<Vec<String>>,
    /// The entrypoint, when the image declares one.
    pub entrypoint: Option<Vec<String>>,
    /// The working directory, when declared.
    pub workdir: Option<String>,
    /// The user, when declared.
    pub user: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// A new image made from a container's exported filesystem
/// ([`ContainerEngine::import_image`](crate::engine::ContainerEngine::import_image)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ImageImport {
    /// Repository and tag (`localhost/sandbox-rs/snapshot:<tag>`).
    pub reference: String,
    /// Its whole configuration: nothing else is carried over.
    pub config: ImageConfig,
}

impl ImageImport {
    /// An import named `reference` with `config`.
    pub fn new(reference: impl Into<String>, config: ImageConfig) -> Self {
        ImageImport {
            reference: reference.into(),
            config,
        }
    }

    /// The repository part of [`Self::reference`] (before the tag's `:`).
    pub fn repository(&self) -> &str {
        self.split().0
    }

    /// The tag part of [`Self::reference`] (`latest` when there is none).
    pub fn tag(&self) -> &str {
        self.split().1
    }

    fn split(&self) -> (&str, &str) {
        let r = self.reference.as_str();
        match r.rfind(':') {
            Some(i) if !r[i + 1..].contains('/') => (&r[..i], &r[i + 1..]),
            _ => (r, "latest"),
        }
    }
}

/// One image as an engine's image list reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageInfo {
    /// Image id.
    pub id: String,
    /// Its `repository:tag` names (none for an untagged image).
    pub references: Vec<String>,
    /// Creation time, when reported.
    pub created_at: Option<SystemTime>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

impl ImageInfo {
    /// A record.
    pub fn new(
        id: impl Into<String>,
        references: Vec<String>,
        created_at: Option<SystemTime>,
        labels: BTreeMap<String, String>,
    ) -> Self {
        ImageInfo {
            id: id.into(),
            references,
            created_at,
            labels,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_splits_at_the_tag_not_at_a_registry_port() {
        let i = ImageImport::new(
            "localhost/sandbox-rs/snapshot:abc-1",
            ImageConfig::default(),
        );
        assert_eq!(
            (i.repository(), i.tag()),
            ("localhost/sandbox-rs/snapshot", "abc-1")
        );
        let i = ImageImport::new("localhost:5000/x", ImageConfig::default());
        assert_eq!((i.repository(), i.tag()), ("localhost:5000/x", "latest"));
    }
}
