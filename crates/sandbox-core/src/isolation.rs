//! How strongly a sandbox resists a kernel escape.

use serde::{Deserialize, Serialize};

/// Isolation tier, ordered by kernel-escape resistance only.
///
/// `Unknown` satisfies nothing, and requiring `Unknown` is a configuration error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum IsolationTier {
    /// The backend cannot say.
    Unknown = 0,
    /// Linux namespaces and cgroups with the host kernel (runc, crun).
    Container = 10,
    /// A user-space kernel (gVisor / runsc).
    Gvisor = 20,
    /// A hardware-virtualised guest kernel.
    MicroVm = 30,
}

impl IsolationTier {
    /// The explicit rank (0, 10, 20, 30).
    pub fn rank(self) -> u8 {
        self as u8
    }

    /// Whether this tier meets `min`. `Unknown` satisfies nothing.
    pub fn satisfies(self, min: IsolationTier) -> bool {
        self != IsolationTier::Unknown && min != IsolationTier::Unknown && self.rank() >= min.rank()
    }

    /// The stable lower-case name (`"container"`).
    pub fn as_str(self) -> &'static str {
        match self {
            IsolationTier::Unknown => "unknown",
            IsolationTier::Container => "container",
            IsolationTier::Gvisor => "gvisor",
            IsolationTier::MicroVm => "micro_vm",
        }
    }
}

impl std::fmt::Display for IsolationTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::IsolationTier::*;

    #[test]
    fn ordering_and_satisfaction() {
        assert!(Gvisor.satisfies(Container));
        assert!(Container.satisfies(Container));
        assert!(!Container.satisfies(Gvisor));
        assert!(!Unknown.satisfies(Unknown));
        assert!(!MicroVm.satisfies(Unknown));
        assert!(Unknown < Container && Container < Gvisor && Gvisor < MicroVm);
    }
}
