//! The load run's phases on one driver: ramping to a population (stopping early, with the
//! reason, on repeated failures, low host memory or the run's deadline), timing commands
//! on random live sandboxes, sequential creates and kills at a population, killing a whole
//! population, and the churn (create+run+kill at a steady rate beside a held population,
//! sampled every minute).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use tokio::task::JoinSet;

use crate::driver::{Driver, Handle};
use crate::load::probe;
use crate::stats::percentile;

/// Failed creates after which a ramp stops.
const MAX_RAMP_FAILURES: usize = 3;

/// When a phase must stop early: the run's deadline, or host memory running out.
#[derive(Debug, Clone)]
pub struct Guard {
    pub deadline: Option<SystemTime>,
    pub min_available_mib: u64,
}

impl Guard {
    /// Why the run must stop now, if it must.
    pub fn why_stop(&self) -> Option<String> {
        if let Some(d) = self.deadline
            && SystemTime::now() >= d
        {
            return Some("the run's deadline (--stop-by) was reached".into());
        }
        let avail = probe::mem_available_kib() / 1024;
        (avail > 0 && avail < self.min_available_mib).then(|| {
            format!(
                "host MemAvailable fell to {avail} MiB (below --min-available-mib {})",
                self.min_available_mib
            )
        })
    }
}

/// A small deterministic generator for picking random live sandboxes (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1) as u64) as usize
    }
}

/// The container id behind a handle.
pub fn id_of(h: &Handle) -> String {
    match h {
        Handle::Sandbox(s) => s.id().to_string(),
        Handle::Container(id) => id.clone(),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// How a ramp went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Ramp {
    pub target: usize,
    pub reached: usize,
    pub seconds: f64,
    /// (population when the create started, its latency in ms).
    pub creates: Vec<(usize, f64)>,
    /// (population reached, seconds since the ramp started), at every tenth of the target.
    pub marks: Vec<(usize, f64)>,
    pub failures: Vec<String>,
    /// Why it stopped before the target.
    pub stopped: Option<String>,
}

/// Creates sandboxes with `driver`, `concurrency` at a time, until `live` holds `target`.
pub async fn ramp(
    driver: &Arc<dyn Driver>,
    target: usize,
    concurrency: usize,
    guard: &Guard,
    live: &mut Vec<Handle>,
    ids: &mut BTreeSet<String>,
    verbose: bool,
) -> Ramp {
    let started = Instant::now();
    let mut r = Ramp {
        target,
        ..Ramp::default()
    };
    let step = (target / 10).max(1);
    let mut set = JoinSet::new();
    loop {
        while r.stopped.is_none() && live.len() + set.len() < target && set.len() < concurrency {
            let d = driver.clone();
            let population = live.len() + set.len();
            set.spawn(async move {
                let t = Instant::now();
                let h = d.create().await;
                (population, h, t.elapsed())
            });
        }
        let Some(joined) = set.join_next().await else {
            break;
        };
        match joined {
            Ok((population, Ok(h), took)) => {
                ids.insert(id_of(&h));
                live.push(h);
                r.creates.push((population, ms(took)));
                if live.len().is_multiple_of(step) || live.len() == target {
                    r.marks.push((live.len(), started.elapsed().as_secs_f64()));
                    if verbose {
                        eprintln!(
                            "load: {} live after {:.1} s",
                            live.len(),
                            started.elapsed().as_secs_f64()
                        );
                    }
                }
            }
            Ok((population, Err(e), _)) => {
                r.failures
                    .push(format!("create with {population} live: {e:#}"));
            }
            Err(e) => r.failures.push(format!("create task failed: {e}")),
        }
        if r.stopped.is_none() {
            if r.failures.len() >= MAX_RAMP_FAILURES {
                r.stopped = Some(format!(
                    "{MAX_RAMP_FAILURES} creates failed (first: {})",
                    r.failures[0]
                ));
            } else if let Some(why) = guard.why_stop() {
                r.stopped = Some(why);
            }
        }
    }
    r.reached = live.len();
    r.seconds = started.elapsed().as_secs_f64();
    r
}

/// Kills every handle, `concurrency` at a time; returns (seconds, failures).
pub async fn kill_all(
    driver: &Arc<dyn Driver>,
    live: Vec<Handle>,
    concurrency: usize,
) -> (f64, Vec<String>) {
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut set = JoinSet::new();
    let mut pending = live.into_iter();
    loop {
        while set.len() < concurrency {
            let Some(h) = pending.next() else { break };
            let d = driver.clone();
            set.spawn(async move { d.kill(h).await });
        }
        match set.join_next().await {
            None => break,
            Some(Ok(Ok(()))) => {}
            Some(Ok(Err(e))) => failures.push(format!("kill: {e:#}")),
            Some(Err(e)) => failures.push(format!("kill task failed: {e}")),
        }
    }
    (started.elapsed().as_secs_f64(), failures)
}

/// `run(["true"])` `n` times, one at a time, each on a random sandbox of `live`; returns
/// the latencies (ms) and the failures.
pub async fn run_samples(
    driver: &Arc<dyn Driver>,
    live: &[Handle],
    n: usize,
    rng: &mut Rng,
) -> (Vec<f64>, Vec<String>) {
    let mut out = Vec::with_capacity(n);
    let mut failures = Vec::new();
    if live.is_empty() {
        return (out, failures);
    }
    for _ in 0..n {
        let h = &live[rng.below(live.len())];
        let t = Instant::now();
        match driver.run_true(h).await {
            Ok(()) => out.push(ms(t.elapsed())),
            Err(e) => failures.push(format!("run: {e:#}")),
        }
    }
    (out, failures)
}

/// `k` creates one after another beside the live population, then their kills one after
/// another; returns (create ms, kill ms, failures).
pub async fn sequential_creates(
    driver: &Arc<dyn Driver>,
    k: usize,
    ids: &mut BTreeSet<String>,
) -> (Vec<f64>, Vec<f64>, Vec<String>) {
    let (mut creates, mut kills, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    let mut made = Vec::new();
    for _ in 0..k {
        let t = Instant::now();
        match driver.create().await {
            Ok(h) => {
                creates.push(ms(t.elapsed()));
                ids.insert(id_of(&h));
                made.push(h);
            }
            Err(e) => failures.push(format!("create: {e:#}")),
        }
    }
    for h in made {
        let t = Instant::now();
        match driver.kill(h).await {
            Ok(()) => kills.push(ms(t.elapsed())),
            Err(e) => failures.push(format!("kill: {e:#}")),
        }
    }
    (creates, kills, failures)
}

/// One minute of churn.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Minute {
    pub minute: usize,
    pub cycles: usize,
    pub errors: usize,
    pub cycle_p50_ms: Option<f64>,
    pub cycle_p99_ms: Option<f64>,
    /// `run(["true"])` p99 on random held sandboxes, sampled at the minute's end.
    pub held_run_p99_ms: Option<f64>,
    /// Of those samples, how many failed.
    pub held_run_errors: usize,
    /// This process (the library's): resident memory, descriptors, threads.
    pub rss_mib: f64,
    pub fds: usize,
    pub threads: usize,
    /// Containers of this run the engine lists at the minute's end (held + in flight).
    pub engine_containers: Option<usize>,
}

/// The churn's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Churn {
    pub minutes_planned: usize,
    pub rate_per_s: f64,
    pub cycles: usize,
    pub errors: usize,
    /// Failed `run(["true"])` samples on held sandboxes.
    pub held_errors: usize,
    /// The first distinct error messages.
    pub error_samples: Vec<String>,
    /// Ticks skipped because `max_in_flight` cycles were still running.
    pub behind: usize,
    pub rows: Vec<Minute>,
    pub stopped: Option<String>,
}

type Cycle = (Option<String>, Result<(), String>, Duration);

async fn cycle(d: Arc<dyn Driver>) -> Cycle {
    let t = Instant::now();
    let h = match d.create().await {
        Ok(h) => h,
        Err(e) => return (None, Err(format!("create: {e:#}")), t.elapsed()),
    };
    let id = id_of(&h);
    let ran = d.run_true(&h).await.map_err(|e| format!("run: {e:#}"));
    let killed = d.kill(h).await.map_err(|e| format!("kill: {e:#}"));
    (Some(id), ran.and(killed), t.elapsed())
}

/// The cycles of the current minute.
#[derive(Debug, Default)]
struct Tally {
    times: Vec<f64>,
    errors: usize,
}

fn record(
    c: &mut Churn,
    minute: &mut Tally,
    (id, result, took): Cycle,
    ids: &mut BTreeSet<String>,
) {
    if let Some(id) = id {
        ids.insert(id);
    }
    c.cycles += 1;
    match result {
        Ok(()) => minute.times.push(ms(took)),
        Err(e) => {
            c.errors += 1;
            minute.errors += 1;
            if c.error_samples.len() < 8 && !c.error_samples.contains(&e) {
                c.error_samples.push(e);
            }
        }
    }
}

/// What the churn needs besides the driver.
pub struct ChurnPlan<'a> {
    pub minutes: usize,
    pub rate_per_s: f64,
    pub max_in_flight: usize,
    pub held: &'a [Handle],
    pub engine: probe::Engine,
    pub run_label: &'a str,
    pub guard: &'a Guard,
    pub verbose: bool,
}

/// Create+run+kill at `rate_per_s` beside the held population for `minutes`, sampling
/// every minute. Every created id goes into `ids`.
pub async fn churn(
    driver: &Arc<dyn Driver>,
    plan: ChurnPlan<'_>,
    rng: &mut Rng,
    ids: &mut BTreeSet<String>,
) -> Churn {
    let mut c = Churn {
        minutes_planned: plan.minutes,
        rate_per_s: plan.rate_per_s,
        ..Churn::default()
    };
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / plan.rate_per_s.max(0.01)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut set: JoinSet<Cycle> = JoinSet::new();
    let mut minute = Tally::default();
    let mut next_sample = started + Duration::from_secs(60);
    let mut finished = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if set.len() < plan.max_in_flight {
                    set.spawn(cycle(driver.clone()));
                } else {
                    c.behind += 1;
                }
            }
            Some(joined) = set.join_next(), if !set.is_empty() => {
                finished.push(joined.unwrap_or_else(|e| (None, Err(format!("cycle task failed: {e}")), Duration::ZERO)));
            }
            () = tokio::time::sleep_until(next_sample) => {
                for f in finished.drain(..) {
                    record(&mut c, &mut minute, f, ids);
                }
                let (held, held_failures) = run_samples(driver, plan.held, 20, rng).await;
                let held_errors = held_failures.len();
                c.held_errors += held_errors;
                for e in held_failures {
                    let e = format!("held sandbox {e}");
                    if c.error_samples.len() < 8 && !c.error_samples.contains(&e) {
                        c.error_samples.push(e);
                    }
                }
                let (rss, fds, threads) = probe::own();
                let row = Minute {
                    minute: c.rows.len() + 1,
                    cycles: minute.times.len() + minute.errors,
                    errors: minute.errors,
                    cycle_p50_ms: percentile(&minute.times, 0.5),
                    cycle_p99_ms: percentile(&minute.times, 0.99),
                    held_run_p99_ms: percentile(&held, 0.99),
                    held_run_errors: held_errors,
                    rss_mib: rss as f64 / 1024.0,
                    fds,
                    threads,
                    engine_containers: crate::load::inventory::containers(plan.engine, plan.run_label).await,
                };
                if plan.verbose {
                    eprintln!("load: churn minute {}: {} cycles, {} errors, RSS {:.1} MiB, {} fds", row.minute, row.cycles, row.errors, row.rss_mib, row.fds);
                }
                c.rows.push(row);
                minute = Tally::default();
                next_sample += Duration::from_secs(60);
                if c.rows.len() >= plan.minutes {
                    break;
                }
                if let Some(why) = plan.guard.why_stop() {
                    c.stopped = Some(why);
                    break;
                }
            }
        }
    }
    while let Some(joined) = set.join_next().await {
        finished
            .push(joined.unwrap_or_else(|e| {
                (None, Err(format!("cycle task failed: {e}")), Duration::ZERO)
            }));
    }
    for f in finished.drain(..) {
        record(&mut c, &mut minute, f, ids);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_stays_in_range_and_moves() {
        let mut r = Rng::new(42);
        let picks: Vec<usize> = (0..100).map(|_| r.below(7)).collect();
        assert!(picks.iter().all(|p| *p < 7));
        assert!(picks.iter().collect::<BTreeSet<_>>().len() > 3);
        assert_eq!(r.below(0), 0);
    }

    #[test]
    fn guard_without_deadline_or_floor_never_stops() {
        let g = Guard {
            deadline: None,
            min_available_mib: 0,
        };
        assert!(g.why_stop().is_none());
        let past = Guard {
            deadline: Some(SystemTime::now() - Duration::from_secs(1)),
            min_available_mib: 0,
        };
        assert!(past.why_stop().unwrap().contains("deadline"));
    }
}
