//! Large transfers, measured in a child process per run so each measurement has its own
//! RSS high-water mark (`VmHWM` is per process and monotonic; the child also resets it via
//! `/proc/self/clear_refs` after setup, so only the transfer itself counts).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::driver::{Spec, Variant};
use crate::suite::Plan;

/// What a transfer child reports (one JSON line on stdout).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildResult {
    pub upload_s: f64,
    pub download_s: f64,
    pub rss_before_mib: f64,
    pub rss_growth_mib: f64,
}

/// The child's arguments.
#[derive(Debug, Clone)]
pub struct ChildArgs {
    pub backend: String,
    pub variant: Variant,
    pub source: PathBuf,
    pub scratch: PathBuf,
    pub spec: Spec,
}

/// Spawns `sandbox-bench transfer-child …` and parses its result.
pub async fn spawn_child(plan: &Plan, v: Variant, source: &Path) -> Result<ChildResult> {
    // /proc/self/exe runs this very binary even if a rebuild replaced the file meanwhile.
    let exe = if Path::new("/proc/self/exe").exists() {
        PathBuf::from("/proc/self/exe")
    } else {
        std::env::current_exe().context("locating the bench binary")?
    };
    let out = tokio::process::Command::new(exe)
        .arg("transfer-child")
        .args(["--backend", &plan.backend])
        .args(["--variant", v.as_str()])
        .arg("--source")
        .arg(source)
        .arg("--scratch")
        .arg(&plan.scratch)
        .args(["--run-id", &plan.spec.run_id])
        .args(["--image", &plan.spec.image])
        .args(["--lifetime", &plan.spec.lifetime.as_secs().to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "transfer child ({}) failed: {}",
            v.as_str(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim()).context("parsing the transfer child's result")
}

/// `VmRSS` and `VmHWM` of this process, in MiB.
pub fn rss_mib() -> Result<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> Result<f64> {
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} missing from /proc/self/status"))?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Resets this process's RSS high-water mark to the current RSS (Linux ≥ 4.0).
pub fn reset_peak_rss() -> Result<()> {
    std::fs::write("/proc/self/clear_refs", "5").context("writing /proc/self/clear_refs")
}

/// The child: create a sandbox (not measured), then upload + download with a fresh peak.
pub async fn child(args: ChildArgs) -> Result<ChildResult> {
    let (_backend, drivers) =
        crate::engines::drivers(&args.backend, &args.spec, &[args.variant]).await?;
    let d = drivers.into_iter().next().context("no driver")?;
    let h = d.create().await?;
    let name = "bench-transfer.bin";
    let back = args.scratch.join(format!(
        "back-{}-{}.bin",
        args.variant.as_str(),
        std::process::id()
    ));
    let measured = async {
        reset_peak_rss()?;
        let (before, _) = rss_mib()?;
        let t = Instant::now();
        d.upload(&h, &args.source, name).await?;
        let upload_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        d.download(&h, name, &back).await?;
        let download_s = t.elapsed().as_secs_f64();
        let (_, peak) = rss_mib()?;
        if !crate::suite::same_file(&args.source, &back)? {
            bail!("downloaded file differs from the uploaded one");
        }
        Ok(ChildResult {
            upload_s,
            download_s,
            rss_before_mib: before,
            rss_growth_mib: (peak - before).max(0.0),
        })
    }
    .await;
    let _ = std::fs::remove_file(&back);
    let _ = d.kill(h).await;
    sandbox_core::teardown::wait_for_teardowns(std::time::Duration::from_secs(5)).await;
    measured
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_can_be_reset() {
        let (_, hwm0) = rss_mib().unwrap();
        let big = std::hint::black_box(vec![1u8; 64 * 1024 * 1024]);
        let (_, hwm1) = rss_mib().unwrap();
        assert!(hwm1 >= hwm0 + 60.0, "touching 64 MiB raises the peak");
        drop(big);
        reset_peak_rss().unwrap();
        let (rss, hwm2) = rss_mib().unwrap();
        assert!(
            hwm2 < hwm1 - 32.0,
            "reset brings the peak down to the current RSS"
        );
        assert!(hwm2 >= rss - 1.0);
    }
}
