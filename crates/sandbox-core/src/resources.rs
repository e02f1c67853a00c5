//! Resource caps. `None` means a modest concrete default, never unlimited.

use crate::{Result, SandboxError};

/// Default CPU quota (cores) when none is requested.
pub const DEFAULT_CPU: f64 = 1.0;
/// Default memory limit in MiB (swap disabled: memory+swap == memory).
pub const DEFAULT_MEMORY_MB: u64 = 512;
/// Default process limit.
pub const DEFAULT_PIDS: u64 = 512;

/// Requested resource caps. Every `None` becomes a concrete default
/// ([`DEFAULT_CPU`], [`DEFAULT_MEMORY_MB`], [`DEFAULT_PIDS`]); a caller can raise a cap but
/// never unset it. Zero or negative values are a configuration error.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default)
)]
#[non_exhaustive]
pub struct Resources {
    /// CPU quota in cores (e.g. `0.5`).
    pub cpu: Option<f64>,
    /// Memory limit in MiB; swap is disabled.
    pub memory_mb: Option<u64>,
    /// Disk limit in MiB: with it, the root filesystem is read-only and each writable place
    /// the backend documents (for containers: the workdir and `/tmp`, RAM-backed and
    /// charged to the memory limit) holds at most this much. `None` leaves writes bounded
    /// only by the engine's storage. Needs [`Capability::DISK_LIMIT`](crate::Capability);
    /// backends without it refuse it.
    pub disk_mb: Option<u64>,
    /// Process/thread limit.
    pub pids: Option<u64>,
    /// Number of GPUs (needs the GPU capability).
    pub gpu: Option<u32>,
}

/// Resources after defaults were applied and values validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EffectiveResources {
    /// CPU quota in cores.
    pub cpu: f64,
    /// Memory limit in MiB (== memory+swap).
    pub memory_mb: u64,
    /// Disk limit in MiB, if requested.
    pub disk_mb: Option<u64>,
    /// Process limit.
    pub pids: u64,
    /// GPUs requested (0 = none).
    pub gpu: u32,
}

impl Resources {
    /// Sets the CPU quota in cores.
    pub fn cpu(mut self, cores: f64) -> Self {
        self.cpu = Some(cores);
        self
    }
    /// Sets the memory limit in MiB.
    pub fn memory_mb(mut self, mb: u64) -> Self {
        self.memory_mb = Some(mb);
        self
    }
    /// Sets the disk limit in MiB.
    pub fn disk_mb(mut self, mb: u64) -> Self {
        self.disk_mb = Some(mb);
        self
    }
    /// Sets the process limit.
    pub fn pids(mut self, pids: u64) -> Self {
        self.pids = Some(pids);
        self
    }
    /// Requests GPUs.
    pub fn gpu(mut self, count: u32) -> Self {
        self.gpu = Some(count);
        self
    }

    /// Validates and applies defaults.
    pub fn effective(&self) -> Result<EffectiveResources> {
        let cpu = self.cpu.unwrap_or(DEFAULT_CPU);
        if !cpu.is_finite() || cpu <= 0.0 {
            return Err(SandboxError::config(
                format!("resources.cpu must be a positive number of cores, got {cpu}"),
                "use e.g. Resources::default().cpu(0.5), or leave it unset for 1 core",
            ));
        }
        if cpu > 1024.0 {
            return Err(SandboxError::config(
                format!("resources.cpu {cpu} is not a plausible core count"),
                "request at most the host's core count",
            ));
        }
        let check = |name: &str, v: Option<u64>, default: Option<u64>| -> Result<Option<u64>> {
            match v {
                Some(0) => Err(SandboxError::config(
                    format!("resources.{name} must be positive, got 0"),
                    format!(
                        "leave resources.{name} unset for the default, or give a positive value"
                    ),
                )),
                Some(v) => Ok(Some(v)),
                None => Ok(default),
            }
        };
        let memory_mb = check("memory_mb", self.memory_mb, Some(DEFAULT_MEMORY_MB))?
            .unwrap_or(DEFAULT_MEMORY_MB);
        if memory_mb < 6 {
            return Err(SandboxError::config(
                format!("resources.memory_mb {memory_mb} is below the 6 MiB engines accept"),
                "request at least 6 MiB",
            ));
        }
        let pids = check("pids", self.pids, Some(DEFAULT_PIDS))?.unwrap_or(DEFAULT_PIDS);
        let disk_mb = check("disk_mb", self.disk_mb, None)?;
        let gpu = match self.gpu {
            Some(0) => {
                return Err(SandboxError::config(
                    "resources.gpu must be positive when set",
                    "leave resources.gpu unset for no GPU",
                ));
            }
            Some(n) => n,
            None => 0,
        };
        Ok(EffectiveResources {
            cpu,
            memory_mb,
            disk_mb,
            pids,
            gpu,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn defaults_are_concrete() {
        let e = Resources::default().effective().unwrap();
        assert_eq!((e.cpu, e.memory_mb, e.pids, e.gpu), (1.0, 512, 512, 0));
    }

    #[test]
    fn zero_and_negative_refused() {
        for r in [
            Resources::default().cpu(0.0),
            Resources::default().cpu(-1.0),
            Resources::default().cpu(f64::NAN),
            Resources::default().memory_mb(0),
            Resources::default().pids(0),
            Resources::default().gpu(0),
            Resources::default().disk_mb(0),
        ] {
            assert_eq!(
                r.effective().unwrap_err().code(),
                ErrorCode::Configuration,
                "{r:?}"
            );
        }
    }
}
