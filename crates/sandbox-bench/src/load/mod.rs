//! `sandbox-bench load` (`cargo xtask bench --load`): many live sandboxes on one machine.
//! Per engine: plain engine containers with the same limits ramped to the population and
//! measured first (the host's cost of a container without this library), then
//! sandbox-rs: one sandbox alone (command and create latency), a ramp to the population
//! (where and why it stops if it stops early), the host's memory and descriptors per live
//! sandbox, command latency on random live sandboxes, creates and kills at that
//! population, the churn beside the held population, and the time to kill them all;
//! finally the leak ledger. The markdown goes into the load section of
//! `docs/benchmarks.md` (the rest of that file is `cargo xtask bench`'s).

pub mod inventory;
pub mod phases;
pub mod probe;
pub mod report;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::driver::{Driver, Handle, Spec, Variant};
use crate::engines;
use crate::load::phases::{Churn, ChurnPlan, Guard, Ramp, Rng};
use crate::load::probe::{Engine, Snapshot};

/// The load run's settings.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub struct LoadArgs {
    /// Engines, in order: docker, podman or both (comma-separated).
    #[arg(long, default_value = "docker,podman", value_delimiter = ',')]
    pub engines: Vec<String>,
    /// Live sandboxes to ramp to (and plain containers to compare with).
    #[arg(long, default_value_t = 500)]
    pub population: usize,
    /// Minutes of churn beside the held population (0: none).
    #[arg(long, default_value_t = 30)]
    pub churn_minutes: usize,
    /// Churn cycles (create+run+kill) started per second.
    #[arg(long, default_value_t = 1.0)]
    pub churn_rate: f64,
    /// Churn cycles in flight at most (a tick finding this many running is skipped and
    /// counted as "behind").
    #[arg(long, default_value_t = 8)]
    pub churn_in_flight: usize,
    /// Creates in flight during a ramp.
    #[arg(long, default_value_t = 8)]
    pub ramp_concurrency: usize,
    /// Kills in flight when a population is killed.
    #[arg(long, default_value_t = 16)]
    pub kill_concurrency: usize,
    /// `run(["true"])` samples with one sandbox alive and with the population alive.
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// Sequential creates (then kills) timed alone and at the population.
    #[arg(long, default_value_t = 10)]
    pub creates: usize,
    /// Image of every sandbox and plain container.
    #[arg(long, default_value = "sandbox-rs/busybox:latest")]
    pub image: String,
    /// Stop ramping and churning (and go on to cleanup) at this UTC time, `HH:MM` today.
    #[arg(long)]
    pub stop_by: Option<String>,
    /// Stop a ramp when the host's MemAvailable falls below this.
    #[arg(long, default_value_t = 2048)]
    pub min_available_mib: u64,
    /// Write the load section into this markdown file (the rest of it is kept).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Also write every measurement as JSON to this path.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Progress on stderr.
    #[arg(long, short)]
    pub verbose: bool,
}

/// A population of one driver: its ramp, the host read at it, and its end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Population {
    pub ramp: Ramp,
    /// Read just before the ramp, and after it settled.
    pub before: Snapshot,
    pub at: Snapshot,
    pub kill_all_seconds: f64,
    /// From the first kill until the engine lists none of them.
    pub gone_seconds: Option<f64>,
    pub kill_failures: Vec<String>,
}

/// Everything measured on one engine.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineLoad {
    pub engine: String,
    pub version: String,
    pub plain: Option<Population>,
    pub ours: Population,
    pub run_one_ms: Vec<f64>,
    pub run_full_ms: Vec<f64>,
    pub create_one_ms: Vec<f64>,
    pub create_full_ms: Vec<f64>,
    pub kill_one_ms: Vec<f64>,
    pub kill_full_ms: Vec<f64>,
    pub churn: Option<Churn>,
    pub ledger: Vec<inventory::Line>,
    pub errors: Vec<String>,
    pub seconds: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub date: String,
    pub command: String,
    pub machine: crate::machine::Machine,
    pub load_at_end: String,
    pub settings: LoadArgs,
    pub engines: Vec<EngineLoad>,
    pub wall_seconds: f64,
}

/// `HH:MM` (UTC, today) as a time.
pub fn parse_stop_by(s: &str, now: SystemTime) -> Result<SystemTime> {
    let (h, m) = s.split_once(':').context("--stop-by takes HH:MM (UTC)")?;
    let (h, m): (u64, u64) = (h.trim().parse()?, m.trim().parse()?);
    if h > 23 || m > 59 {
        bail!("--stop-by {s:?} is not a time of day (HH:MM, UTC)");
    }
    let secs = now.duration_since(SystemTime::UNIX_EPOCH)?.as_secs();
    let midnight = secs - secs % 86_400;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(midnight + h * 3600 + m * 60))
}

/// Polls the engine until it lists no container of this run (at most 60 s).
async fn wait_gone(engine: Engine, label: &str, since: Instant) -> Option<f64> {
    let give_up = Instant::now() + Duration::from_secs(60);
    while Instant::now() < give_up {
        if inventory::containers(engine, label).await == Some(0) {
            return Some(since.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Ramps `driver` to the population, reads the host, and hands back the live handles.
async fn populate(
    driver: &Arc<dyn Driver>,
    args: &LoadArgs,
    engine: Engine,
    guard: &Guard,
    live: &mut Vec<Handle>,
    ids: &mut BTreeSet<String>,
) -> Population {
    let mut p = Population {
        before: probe::snapshot(engine, &BTreeSet::new()),
        ..Population::default()
    };
    p.ramp = phases::ramp(
        driver,
        args.population,
        args.ramp_concurrency.max(1),
        guard,
        live,
        ids,
        args.verbose,
    )
    .await;
    // Let the engine finish what starting a container leaves to do in the background.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let live_ids: BTreeSet<String> = live.iter().map(phases::id_of).collect();
    p.at = probe::snapshot(engine, &live_ids);
    p
}

async fn finish(
    driver: &Arc<dyn Driver>,
    p: &mut Population,
    live: Vec<Handle>,
    args: &LoadArgs,
    engine: Engine,
    label: &str,
) {
    let t = Instant::now();
    let (secs, failures) = phases::kill_all(driver, live, args.kill_concurrency.max(1)).await;
    p.kill_all_seconds = secs;
    p.kill_failures = failures;
    p.gone_seconds = wait_gone(engine, label, t).await;
}

/// Runs every phase on one engine. Containers are removed by the caller's sweep as well,
/// whatever happens here.
pub async fn run_engine(args: &LoadArgs, name: &str, spec: &Spec, guard: &Guard) -> EngineLoad {
    let started = Instant::now();
    let mut out = EngineLoad {
        engine: name.to_string(),
        ..EngineLoad::default()
    };
    let Some(engine) = Engine::parse(name) else {
        out.errors.push(format!("unknown engine {name:?}"));
        return out;
    };
    out.version = engines::describe(name, spec).await.0;
    let (k, v) = spec.run_label();
    let label = format!("{k}={v}");
    let mut ids = BTreeSet::new();
    let ledger_before = inventory::read(engine, &label, &ids).await;
    let (_, drivers) = match engines::drivers(name, spec, &[Variant::Ours, Variant::Raw]).await {
        Ok(d) => d,
        Err(e) => {
            out.errors.push(format!("not measured: {e:#}"));
            return out;
        }
    };
    let find = |v: Variant| drivers.iter().find(|d| d.variant() == v).cloned();
    let (Some(ours), Some(plain)) = (find(Variant::Ours), find(Variant::Raw)) else {
        out.errors.push("a driver is missing".into());
        return out;
    };
    let mut rng = Rng::new(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7),
    );

    // Plain containers first: the floor the library's per-sandbox cost is compared with.
    if args.verbose {
        eprintln!("load: {name}: plain containers");
    }
    let mut live = Vec::new();
    let mut p = populate(&plain, args, engine, guard, &mut live, &mut ids).await;
    finish(&plain, &mut p, live, args, engine, &label).await;
    out.plain = Some(p);

    // One sandbox alone.
    if args.verbose {
        eprintln!("load: {name}: one sandbox alone");
    }
    let mut live = Vec::new();
    let before = probe::snapshot(engine, &BTreeSet::new());
    match ours.create().await {
        Ok(h) => {
            ids.insert(phases::id_of(&h));
            live.push(h);
        }
        Err(e) => {
            out.errors
                .push(format!("the first sandbox could not be created: {e:#}"));
            return out;
        }
    }
    let (c1, k1, f1) = phases::sequential_creates(&ours, args.creates, &mut ids).await;
    let (r1, rf1) = phases::run_samples(&ours, &live, args.runs, &mut rng).await;
    out.create_one_ms = c1;
    out.kill_one_ms = k1;
    out.run_one_ms = r1;
    out.errors.extend(f1.into_iter().chain(rf1));

    // The population.
    if args.verbose {
        eprintln!("load: {name}: ramp to {}", args.population);
    }
    let mut p = populate(&ours, args, engine, guard, &mut live, &mut ids).await;
    p.before = before;
    let (rn, rfn) = phases::run_samples(&ours, &live, args.runs, &mut rng).await;
    out.run_full_ms = rn;
    let (cn, kn, fcn) = phases::sequential_creates(&ours, args.creates, &mut ids).await;
    out.create_full_ms = cn;
    out.kill_full_ms = kn;
    out.errors.extend(rfn.into_iter().chain(fcn));

    if args.churn_minutes > 0 {
        match guard.why_stop() {
            Some(why) => out.errors.push(format!("churn not run: {why}")),
            None => {
                if args.verbose {
                    eprintln!("load: {name}: churn for {} min", args.churn_minutes);
                }
                let plan = ChurnPlan {
                    minutes: args.churn_minutes,
                    rate_per_s: args.churn_rate,
                    max_in_flight: args.churn_in_flight.max(1),
                    held: &live,
                    engine,
                    run_label: &label,
                    guard,
                    verbose: args.verbose,
                };
                out.churn = Some(phases::churn(&ours, plan, &mut rng, &mut ids).await);
            }
        }
    }

    if args.verbose {
        eprintln!("load: {name}: kill all");
    }
    finish(&ours, &mut p, live, args, engine, &label).await;
    out.ours = p;
    sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(10)).await;
    // Give exited helper processes a moment to be reaped before they are counted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ledger_after = inventory::read(engine, &label, &ids).await;
    out.ledger = inventory::ledger(&ledger_before, &ledger_after);
    out.seconds = started.elapsed().as_secs_f64();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_by_is_today_in_utc() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(86_400 * 3 + 3600);
        let t = parse_stop_by("20:25", now).unwrap();
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
            86_400 * 3 + 20 * 3600 + 25 * 60
        );
        assert!(parse_stop_by("25:00", now).is_err());
        assert!(parse_stop_by("noon", now).is_err());
    }
}
