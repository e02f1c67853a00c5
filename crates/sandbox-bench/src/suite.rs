//! The measurement loops for one backend. Variants are interleaved in every iteration and
//! their order rotates, so drift and noise hit all of them alike.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use sandbox_core::{Backend, CodeOptions, ForkOptions, Pool, PoolConfig};

use crate::driver::{Driver, Handle, Spec, Variant, WORKDIR, timed};
use crate::report::{Op, Recorder};
use crate::transfer::{self, ChildResult};

/// Bound on any single operation, so a hang cannot stall the run.
const OP_TIMEOUT: Duration = Duration::from_secs(120);

/// How one backend's benchmark is run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub backend: String,
    pub runs: usize,
    pub warmup: usize,
    pub transfer_mib: u64,
    pub transfer_runs: usize,
    pub concurrency: Vec<usize>,
    pub concurrent_runs: usize,
    pub spec: Spec,
    /// Scratch directory for transfer files.
    pub scratch: PathBuf,
    pub verbose: bool,
}

fn rotated(drivers: &[Arc<dyn Driver>], i: usize) -> Vec<Arc<dyn Driver>> {
    let n = drivers.len().max(1);
    (0..drivers.len())
        .map(|k| drivers[(k + i) % n].clone())
        .collect()
}

async fn bounded<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(OP_TIMEOUT, f)
        .await
        .map_err(|_| anyhow!("timed out after {OP_TIMEOUT:?}"))?
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn progress(plan: &Plan, what: &str) {
    if plan.verbose {
        eprintln!("[{}] {what}", plan.backend);
    }
}

/// Bytes that do not compress (a xorshift stream).
pub fn payload(len: usize) -> Bytes {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

/// Create → run_code (first call) → kill, per variant per iteration.
pub async fn lifecycle(plan: &Plan, drivers: &[Arc<dyn Driver>], rec: &mut Recorder) {
    progress(plan, "create / first run_code / kill");
    for i in 0..plan.warmup + plan.runs {
        let keep = i >= plan.warmup;
        for d in rotated(drivers, i) {
            let v = d.variant();
            let h = match bounded(timed(d.create())).await {
                Ok((t, h)) => {
                    if keep {
                        rec.add(Op::Create, v, ms(t));
                    }
                    h
                }
                Err(e) => {
                    rec.error(Op::Create, v, &e);
                    continue;
                }
            };
            match bounded(timed(d.run_code(&h))).await {
                Ok((t, ())) if keep => rec.add(Op::RunCodeFresh, v, ms(t)),
                Ok(_) => {}
                Err(e) => rec.error(Op::RunCodeFresh, v, &e),
            }
            match bounded(timed(d.kill(h))).await {
                Ok((t, ())) if keep => rec.add(Op::Kill, v, ms(t)),
                Ok(_) => {}
                Err(e) => rec.error(Op::Kill, v, &e),
            }
        }
    }
}

/// Exec and file operations on one long-lived sandbox per variant.
pub async fn execs(plan: &Plan, drivers: &[Arc<dyn Driver>], rec: &mut Recorder) {
    progress(plan, "run / run_code / stream / pause+resume / 1 MiB files");
    let mut live: Vec<(Arc<dyn Driver>, Handle)> = Vec::new();
    for d in drivers {
        match bounded(d.create()).await {
            Ok(h) => live.push((d.clone(), h)),
            Err(e) => {
                for op in [
                    Op::RunTrue,
                    Op::RunCode,
                    Op::FirstChunk,
                    Op::PauseResume,
                    Op::WriteRead1M,
                ] {
                    rec.error(op, d.variant(), &e);
                }
                if d.has_contexts() {
                    rec.error(Op::RunCodeWarm, d.variant(), &e);
                }
            }
        }
    }
    let data = payload(1024 * 1024);
    for i in 0..plan.warmup + plan.runs {
        let keep = i >= plan.warmup;
        let n = live.len().max(1);
        let order: Vec<usize> = (0..live.len()).map(|k| (k + i) % n).collect();
        let ops = [
            Op::RunTrue,
            Op::RunCode,
            Op::RunCodeWarm,
            Op::FirstChunk,
            Op::PauseResume,
            Op::WriteRead1M,
        ];
        for op in ops {
            for &k in &order {
                let (d, h) = &live[k];
                if op == Op::RunCodeWarm && !d.has_contexts() {
                    continue;
                }
                let v = d.variant();
                let r = match op {
                    Op::RunTrue => bounded(timed(d.run_true(h))).await.map(|(t, ())| t),
                    Op::RunCode => bounded(timed(d.run_code(h))).await.map(|(t, ())| t),
                    Op::RunCodeWarm => bounded(timed(d.run_code_warm(h))).await.map(|(t, ())| t),
                    Op::FirstChunk => bounded(d.first_chunk(h)).await,
                    Op::PauseResume => bounded(timed(d.pause_resume(h))).await.map(|(t, ())| t),
                    _ => bounded(timed(d.write_read(h, "bench-1mib.bin", &data)))
                        .await
                        .map(|(t, ())| t),
                };
                match r {
                    Ok(t) if keep => rec.add(op, v, ms(t)),
                    Ok(_) => {}
                    Err(e) => rec.error(op, v, &e),
                }
            }
        }
    }
    for (d, h) in live {
        let _ = bounded(d.kill(h)).await;
    }
}

/// Upload+download of a large file, each in a fresh child process (own RSS peak).
pub async fn transfers(plan: &Plan, variants: &[Variant], rec: &mut Recorder) -> Result<()> {
    progress(plan, "large transfers (child processes)");
    let source = plan
        .scratch
        .join(format!("source-{}mib.bin", plan.transfer_mib));
    if !source.exists() {
        let data = payload((plan.transfer_mib * 1024 * 1024) as usize);
        tokio::fs::write(&source, &data)
            .await
            .with_context(|| format!("writing {}", source.display()))?;
    }
    for i in 0..1 + plan.transfer_runs {
        let keep = i >= 1;
        let n = variants.len().max(1);
        for k in 0..variants.len() {
            let v = variants[(k + i) % n];
            match transfer::spawn_child(plan, v, &source).await {
                Ok(ChildResult {
                    upload_s,
                    download_s,
                    rss_growth_mib,
                    ..
                }) if keep => {
                    let mib = plan.transfer_mib as f64;
                    rec.add(Op::Upload, v, mib / upload_s);
                    rec.add(Op::Download, v, mib / download_s);
                    rec.add(Op::Transfer, v, 2.0 * mib / (upload_s + download_s));
                    rec.add(Op::TransferRss, v, rss_growth_mib);
                }
                Ok(_) => {}
                Err(e) => {
                    for op in [Op::Upload, Op::Download, Op::Transfer, Op::TransferRss] {
                        rec.error(op, v, &e);
                    }
                }
            }
        }
    }
    Ok(())
}

/// `n` concurrent create+run(["true"])+kill cycles; total wall time.
pub async fn concurrent(plan: &Plan, drivers: &[Arc<dyn Driver>], rec: &mut Recorder) {
    for (slot, &n) in plan.concurrency.iter().enumerate() {
        let op = if slot == 0 {
            Op::ConcurrentSmall
        } else {
            Op::ConcurrentLarge
        };
        progress(plan, &format!("{n} concurrent create+run+kill"));
        for i in 0..plan.concurrent_runs {
            for d in rotated(drivers, i) {
                let t = Instant::now();
                let cycles = (0..n).map(|_| {
                    let d = d.clone();
                    async move {
                        let h = bounded(d.create()).await?;
                        let r = bounded(d.run_true(&h)).await;
                        let k = bounded(d.kill(h)).await;
                        r.and(k)
                    }
                });
                let results = futures::future::join_all(cycles).await;
                let elapsed = t.elapsed();
                match results.into_iter().find_map(Result::err) {
                    None => rec.add(op, d.variant(), ms(elapsed)),
                    Some(e) => rec.error(op, d.variant(), &e),
                }
            }
        }
    }
}

/// `Pool::acquire()` with a ready spare (the cold create is the lifecycle's create).
pub async fn pool(plan: &Plan, backend: Arc<dyn Backend>, rec: &mut Recorder) {
    progress(plan, "Pool::acquire()");
    let pool = match Pool::new(backend, PoolConfig::new(1, plan.spec.options())) {
        Ok(p) => p,
        Err(e) => {
            rec.error(Op::PoolAcquire, Variant::Ours, &e.into());
            return;
        }
    };
    for i in 0..plan.warmup + plan.runs {
        if pool.wait_ready(1, Duration::from_secs(60)).await < 1 {
            let e = anyhow!(
                "no spare became ready within 60 s: {}",
                pool.last_error().map(|e| e.render()).unwrap_or_default()
            );
            rec.error(Op::PoolAcquire, Variant::Ours, &e);
            continue;
        }
        let t = Instant::now();
        match pool.acquire().await {
            Ok(sb) => {
                let took = t.elapsed();
                if i >= plan.warmup {
                    rec.add(Op::PoolAcquire, Variant::Ours, ms(took));
                }
                let _ = bounded(async { sb.kill().await.map_err(anyhow::Error::from) }).await;
            }
            Err(e) => rec.error(Op::PoolAcquire, Variant::Ours, &e.into()),
        }
    }
    pool.shutdown().await;
}

/// `snapshot()` of a sandbox holding a file written after create, then a create from the
/// snapshot's template until usable (the file checked there, not timed); each sandbox
/// and the snapshot removed after (not timed). Where the backend does not declare
/// `SNAPSHOT` both rows record why.
pub async fn snapshots(plan: &Plan, backend: Arc<dyn Backend>, rec: &mut Recorder) {
    progress(plan, "snapshot / create from it");
    if !backend
        .capabilities()
        .contains(sandbox_core::Capability::SNAPSHOT)
    {
        let e = anyhow!("{} does not declare SNAPSHOT", plan.backend);
        rec.error(Op::Snapshot, Variant::Ours, &e);
        rec.error(Op::CreateFromSnapshot, Variant::Ours, &e);
        return;
    }
    for i in 0..plan.warmup + plan.runs {
        match snapshot_once(&backend, plan).await {
            Ok((snap, create)) if i >= plan.warmup => {
                rec.add(Op::Snapshot, Variant::Ours, ms(snap));
                rec.add(Op::CreateFromSnapshot, Variant::Ours, ms(create));
            }
            Ok(_) => {}
            Err(e) => {
                rec.error(Op::Snapshot, Variant::Ours, &e);
                rec.error(Op::CreateFromSnapshot, Variant::Ours, &e);
            }
        }
    }
}

/// One measured snapshot and create from it; (snapshot, create) times.
async fn snapshot_once(backend: &Arc<dyn Backend>, plan: &Plan) -> Result<(Duration, Duration)> {
    let sb = bounded(async { Ok(backend.create(plan.spec.options()).await?) }).await?;
    let measured = async {
        let files = sb.files()?;
        files
            .write(
                &format!("{WORKDIR}/bench-snapshot.txt"),
                Bytes::from_static(b"kept\n"),
            )
            .await?;
        let t = Instant::now();
        let snap = bounded(async { Ok(sb.snapshot().await?) }).await?;
        let took = t.elapsed();
        let from = async {
            let t = Instant::now();
            let copy = bounded(async {
                Ok(backend
                    .create(plan.spec.options().template(snap.template.clone()))
                    .await?)
            })
            .await?;
            let created = t.elapsed();
            let kept = match copy.files() {
                Ok(f) => f
                    .read(&format!("{WORKDIR}/bench-snapshot.txt"))
                    .await
                    .map(|b| b.as_ref() == b"kept\n")
                    .map_err(anyhow::Error::from),
                Err(e) => Err(e.into()),
            };
            let _ = bounded(async { copy.kill().await.map_err(anyhow::Error::from) }).await;
            anyhow::ensure!(
                kept?,
                "the sandbox made from the snapshot lacks the file written before it"
            );
            Ok::<_, anyhow::Error>(created)
        }
        .await;
        if let Some(r) = backend.as_reapable() {
            let _ = r.remove_snapshot(&snap.template).await;
        }
        Ok::<_, anyhow::Error>((took, from?))
    }
    .await;
    let _ = bounded(async { sb.kill().await.map_err(anyhow::Error::from) }).await;
    measured
}

/// Whether `path` exists and equals `source` byte for byte (read in chunks).
pub fn same_file(a: &Path, b: &Path) -> Result<bool> {
    use std::io::Read;
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// `fork(1)` and `fork(4)` of a sandbox holding a warm Python context (its variable set
/// before the fork), on the backend that forks (`engines::fork_backend`). A sandbox is
/// forked once (a restored one does not declare `SNAPSHOT_FORK` under gVisor), so each
/// measurement creates and warms its own original first (not timed) and kills it and
/// its forks after (not timed).
pub async fn forks(plan: &Plan, rec: &mut Recorder) {
    progress(plan, "fork (n = 1, 4)");
    let fail = |rec: &mut Recorder, e: &anyhow::Error| {
        rec.error(Op::Fork1, Variant::Ours, e);
        rec.error(Op::Fork4, Variant::Ours, e);
    };
    let backend = match crate::engines::fork_backend(&plan.backend).await {
        Ok(b)
            if b.capabilities()
                .contains(sandbox_core::Capability::SNAPSHOT_FORK) =>
        {
            b
        }
        Ok(_) => {
            let e = anyhow!(
                "{} does not declare SNAPSHOT_FORK here (see `sandbox doctor`)",
                plan.backend
            );
            return fail(rec, &e);
        }
        Err(e) => return fail(rec, &e),
    };
    for i in 0..plan.warmup + plan.runs {
        for (op, n) in [(Op::Fork1, 1), (Op::Fork4, 4)] {
            match fork_once(&*backend, plan, n).await {
                Ok(took) if i >= plan.warmup => rec.add(op, Variant::Ours, ms(took)),
                Ok(_) => {}
                Err(e) => rec.error(op, Variant::Ours, &e),
            }
        }
    }
}

/// One measured `fork(n)` of a new sandbox with a warm context; everything killed after.
async fn fork_once(backend: &dyn Backend, plan: &Plan, n: usize) -> Result<Duration> {
    let sb = bounded(async { Ok(backend.create(plan.spec.options()).await?) }).await?;
    let measured = async {
        sb.run_code("x = 1", CodeOptions::default().context("bench"))
            .await?;
        let t = Instant::now();
        let forks = bounded(async { Ok(sb.fork(ForkOptions::new(n)).await?) }).await?;
        let took = t.elapsed();
        for f in forks {
            let r = f
                .run_code("print(x)", CodeOptions::default().context("bench"))
                .await;
            let _ = bounded(async { f.kill().await.map_err(anyhow::Error::from) }).await;
            let r = r?;
            anyhow::ensure!(
                r.stdout.as_ref() == b"1\n",
                "a fork lost the context: {:?}",
                r.stdout
            );
        }
        Ok::<_, anyhow::Error>(took)
    }
    .await;
    let _ = bounded(async { sb.kill().await.map_err(anyhow::Error::from) }).await;
    measured
}
