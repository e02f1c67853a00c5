//! `sandbox-bench`: measures sandbox-rs against the engine crates called plainly and the
//! engine CLIs, in one interleaved run, and writes `docs/benchmarks.md`.
//!
//! ```text
//! sandbox-bench [--backend docker|podman|fake|all] [--runs 30] [--warmup 3] [--json]
//!               [--report docs/benchmarks.md] [--quick] [--only forks|snapshots]
//! ```
//!
//! Every container is labelled `io.sandbox-rs.managed=true` and
//! `io.sandbox-rs.meta.bench=<run id>`; the run sweeps that label at the end, on error and
//! on Ctrl-C.
#![forbid(unsafe_code)]
#![allow(
    clippy::print_stdout,
    reason = "a command-line benchmark: the table on stdout is its interface"
)]
#![allow(
    missing_docs,
    reason = "a binary crate; its items are not a public API"
)]

mod cli;
mod docker_raw;
mod driver;
mod engines;
mod load;
mod machine;
mod ours;
mod podman_raw;
mod profile;
mod report;
mod stats;
mod suite;
mod transfer;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use crate::driver::{Spec, Variant};
use crate::report::{BackendResult, Recorder, Report, Settings};
use crate::suite::Plan;

/// Benchmarks sandbox-rs against the raw engine crates and the engine CLIs.
#[derive(Debug, Parser)]
#[command(name = "sandbox-bench", version)]
struct Args {
    #[command(subcommand)]
    command: Option<Sub>,
    /// Backend to measure: docker, podman, fake, or all (docker, podman and fake).
    #[arg(long, default_value = "docker")]
    backend: String,
    /// Measured iterations per latency figure.
    #[arg(long, default_value_t = 30)]
    runs: usize,
    /// Unmeasured iterations before them.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Print the results as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write the markdown report to this path.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Smoke test: 3 runs, 4 MiB transfers, one batch of 3 concurrent cycles.
    #[arg(long)]
    quick: bool,
    /// Size of the large transfer in MiB.
    #[arg(long, default_value_t = 64)]
    transfer_mib: u64,
    /// Measured large transfers per variant (each in its own child process).
    #[arg(long, default_value_t = 10)]
    transfer_runs: usize,
    /// Batches per concurrency level (10 and 50) and variant.
    #[arg(long, default_value_t = 3)]
    concurrent_runs: usize,
    /// Skip the request-level profile of ours vs raw.
    #[arg(long)]
    no_profile: bool,
    /// Measure only these rows: `forks` (fork n = 1 and 4) or `snapshots` (snapshot and
    /// create from it); no profile, no other rows.
    #[arg(long, value_parser = ["forks", "snapshots"])]
    only: Option<String>,
    /// Progress on stderr.
    #[arg(long, short)]
    verbose: bool,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Many live sandboxes at once: ramp, hold, churn, kill; the load section of the report.
    Load(load::LoadArgs),
    /// Internal: one large transfer in a fresh process (prints one JSON line).
    #[command(hide = true)]
    TransferChild {
        #[arg(long)]
        backend: String,
        #[arg(long)]
        variant: String,
        #[arg(long)]
        source: PathBuf,
        #[arg(long)]
        scratch: PathBuf,
        #[arg(long)]
        run_id: String,
        #[arg(long)]
        image: String,
        #[arg(long)]
        lifetime: u64,
    },
}

const IMAGE: &str = "sandbox-rs/python:3.11";
const LIFETIME: Duration = Duration::from_secs(900);

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandbox-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(async_main(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandbox-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn async_main(args: Args) -> Result<ExitCode> {
    if let Some(Sub::Load(load)) = &args.command {
        return load_main(load.clone()).await;
    }
    if let Some(Sub::TransferChild {
        backend,
        variant,
        source,
        scratch,
        run_id,
        image,
        lifetime,
    }) = args.command
    {
        let variant = Variant::parse(&variant).context("unknown variant")?;
        let r = transfer::child(transfer::ChildArgs {
            backend,
            variant,
            source,
            scratch,
            spec: Spec {
                image,
                lifetime: Duration::from_secs(lifetime),
                run_id,
            },
        })
        .await?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(ExitCode::SUCCESS);
    }

    let backends: Vec<String> = match args.backend.as_str() {
        "all" => engines::BACKENDS.iter().map(|s| s.to_string()).collect(),
        b if engines::BACKENDS.contains(&b) => vec![b.to_string()],
        other => bail!("unknown backend {other:?}: use docker, podman, fake or all"),
    };
    let settings = if args.quick {
        Settings {
            runs: 3,
            warmup: 1,
            transfer_mib: 4,
            transfer_runs: 1,
            concurrency: (3, 0),
            concurrent_runs: 1,
            quick: true,
        }
    } else {
        Settings {
            runs: args.runs.max(1),
            warmup: args.warmup,
            transfer_mib: args.transfer_mib.max(1),
            transfer_runs: args.transfer_runs.max(1),
            concurrency: (10, 50),
            concurrent_runs: args.concurrent_runs.max(1),
            quick: false,
        }
    };
    let run_id = format!(
        "{}-{}",
        sandbox_core::labels::unix_now(),
        std::process::id()
    );
    let scratch = std::env::temp_dir().join(format!("sandbox-bench-{run_id}"));
    std::fs::create_dir_all(&scratch)?;
    let started = Instant::now();
    let machine = machine::Machine::describe();
    let spec = Spec {
        image: IMAGE.into(),
        lifetime: LIFETIME,
        run_id: run_id.clone(),
    };

    let work = run_all(&args, &settings, &backends, &spec, &scratch);
    let outcome = tokio::select! {
        r = work => Some(r),
        _ = tokio::signal::ctrl_c() => None,
    };
    // Whatever happened: remove every container of this run.
    sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(10)).await;
    for b in &backends {
        match engines::sweep(b, &spec).await {
            Ok(0) => {}
            Ok(n) => eprintln!("sandbox-bench: swept {n} leftover {b} container(s)"),
            Err(e) => eprintln!("sandbox-bench: sweeping {b} failed: {e:#}"),
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let Some(results) = outcome else {
        eprintln!("sandbox-bench: interrupted; containers removed");
        return Ok(ExitCode::from(130));
    };
    let results = results?;

    let report = Report {
        date: machine::utc_now(),
        command: command_line(),
        machine,
        load_at_end: machine::Machine::describe().load_at_start,
        settings,
        backends: results,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for b in &report.backends {
            print!("{}", report::text_table(b));
        }
        println!("\ntotal wall time: {:.0} s", report.wall_seconds);
    }
    if let Some(path) = &args.report {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        // The load section is `cargo xtask bench --load`'s: carried over untouched.
        let mut md = report::markdown(&report);
        if let Some(section) = std::fs::read_to_string(path)
            .ok()
            .as_deref()
            .and_then(load::report::load_section)
        {
            md = load::report::replace_section(&md, section);
        }
        std::fs::write(path, md).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("sandbox-bench: wrote {}", path.display());
    }
    let failed = report.backends.iter().any(|b| b.rows.is_empty());
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The load run: every engine in turn, then the sweep of this run's label whatever
/// happened (also on Ctrl-C), then the report.
async fn load_main(args: load::LoadArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let guard = load::phases::Guard {
        deadline: match &args.stop_by {
            Some(s) => Some(load::parse_stop_by(s, std::time::SystemTime::now())?),
            None => None,
        },
        min_available_mib: args.min_available_mib,
    };
    for e in &args.engines {
        if load::probe::Engine::parse(e).is_none() {
            bail!("unknown engine {e:?}: use docker and/or podman");
        }
    }
    let run_id = format!(
        "load-{}-{}",
        sandbox_core::labels::unix_now(),
        std::process::id()
    );
    // Long enough that no sandbox reaches its deadline during the run (an expiry would
    // show up as a churn error that is not one).
    let lifetime = Duration::from_secs(1800 + 60 * args.churn_minutes as u64 * 2);
    let spec = Spec {
        image: args.image.clone(),
        lifetime,
        run_id,
    };
    let machine = machine::Machine::describe();
    let work = async {
        let mut out = Vec::new();
        for e in &args.engines {
            out.push(load::run_engine(&args, e, &spec, &guard).await);
        }
        out
    };
    let outcome = tokio::select! {
        r = work => Some(r),
        _ = tokio::signal::ctrl_c() => None,
    };
    sandbox_core::teardown::wait_for_teardowns(Duration::from_secs(10)).await;
    for e in &args.engines {
        match engines::sweep(e, &spec).await {
            Ok(0) => {}
            Ok(n) => eprintln!("sandbox-bench: swept {n} leftover {e} container(s)"),
            Err(err) => eprintln!("sandbox-bench: sweeping {e} failed: {err:#}"),
        }
    }
    let Some(engines) = outcome else {
        eprintln!("sandbox-bench: interrupted; containers removed");
        return Ok(ExitCode::from(130));
    };
    let report = load::LoadReport {
        date: machine::utc_now(),
        command: command_line(),
        machine,
        load_at_end: machine::Machine::describe().load_at_start,
        settings: args.clone(),
        engines,
        wall_seconds: started.elapsed().as_secs_f64(),
    };
    if let Some(path) = &args.json_out {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let md = load::report::markdown(&report);
    print!("{md}");
    if let Some(path) = &args.report {
        let old = std::fs::read_to_string(path).unwrap_or_default();
        std::fs::write(path, load::report::replace_section(&old, &md))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "sandbox-bench: wrote the load section of {}",
            path.display()
        );
    }
    let failed = report.engines.iter().any(|e| e.ours.ramp.reached == 0);
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// How the run was invoked: `cargo xtask bench` says so through `SANDBOX_BENCH_COMMAND`.
fn command_line() -> String {
    if let Ok(c) = std::env::var("SANDBOX_BENCH_COMMAND")
        && !c.trim().is_empty()
    {
        return c;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("sandbox-bench {}", args.join(" "))
}

async fn run_all(
    args: &Args,
    settings: &Settings,
    backends: &[String],
    spec: &Spec,
    scratch: &std::path::Path,
) -> Result<Vec<BackendResult>> {
    let mut out = Vec::new();
    for name in backends {
        out.push(run_backend(args, settings, name, spec, scratch).await);
    }
    Ok(out)
}

async fn run_backend(
    args: &Args,
    s: &Settings,
    name: &str,
    spec: &Spec,
    scratch: &std::path::Path,
) -> BackendResult {
    let started = Instant::now();
    let (engine, cli) = engines::describe(name, spec).await;
    let conc = s.concurrency;
    let mut result = BackendResult {
        backend: name.to_string(),
        engine,
        cli,
        rows: Vec::new(),
        targets: Vec::new(),
        profile: Vec::new(),
        notes: Vec::new(),
        wall_seconds: 0.0,
    };
    let variants = engines::variants_of(name);
    let (backend, drivers) = match engines::drivers(name, spec, &variants).await {
        Ok(d) => d,
        Err(e) => {
            result
                .notes
                .push(format!("Not measured: the backend is unavailable ({e:#})."));
            eprintln!("sandbox-bench: {name}: unavailable: {e:#}");
            return result;
        }
    };
    let plan = Plan {
        backend: name.to_string(),
        runs: s.runs,
        warmup: s.warmup,
        transfer_mib: s.transfer_mib,
        transfer_runs: s.transfer_runs,
        concurrency: [conc.0, conc.1].into_iter().filter(|n| *n > 0).collect(),
        concurrent_runs: s.concurrent_runs,
        spec: spec.clone(),
        scratch: scratch.to_path_buf(),
        verbose: args.verbose,
    };
    let mut rec = Recorder::default();
    if let Some(only) = args.only.as_deref() {
        match (only, &backend) {
            ("snapshots", Some(b)) => suite::snapshots(&plan, b.clone(), &mut rec).await,
            ("snapshots", None) => {}
            _ => suite::forks(&plan, &mut rec).await,
        }
        result.rows = rec.rows(s.transfer_mib, conc);
        result.targets = report::check_targets(&rec);
        result.wall_seconds = started.elapsed().as_secs_f64();
        return result;
    }
    suite::lifecycle(&plan, &drivers, &mut rec).await;
    suite::execs(&plan, &drivers, &mut rec).await;
    if let Err(e) = suite::transfers(&plan, &variants, &mut rec).await {
        result.notes.push(format!("Transfers not measured: {e:#}"));
    }
    suite::concurrent(&plan, &drivers, &mut rec).await;
    if let Some(b) = &backend {
        suite::pool(&plan, b.clone(), &mut rec).await;
        suite::snapshots(&plan, b.clone(), &mut rec).await;
    }
    suite::forks(&plan, &mut rec).await;
    if !args.no_profile {
        result.profile = profile::run(&plan, &drivers, &rec).await;
    }
    result.rows = rec.rows(s.transfer_mib, conc);
    result.targets = report::check_targets(&rec);
    result.notes.extend(notes(name, s));
    result.wall_seconds = started.elapsed().as_secs_f64();
    result
}

fn notes(name: &str, s: &Settings) -> Vec<String> {
    let mut n = vec![format!(
        "Transfer rows: throughput counts the {mib} MiB payload (upload+download = {two} MiB over \
         the summed time); peak RSS growth is the child process's VmHWM after the transfer minus \
         its VmRSS before it (peak reset via /proc/self/clear_refs). The raw floor streams too \
         (the tar archive is produced on a blocking thread while the crate sends it, and \
         unpacked while it arrives, to the archive's end), the fastest correct plain use of the \
         crate; the CLI row is \
         `docker cp` / `podman cp` of the file, whose memory is in the CLI process, not ours.",
        mib = s.transfer_mib,
        two = 2 * s.transfer_mib
    )];
    if name == "fake" {
        n.push(
            "Fake backend: its filesystem lives in the benchmark's own process, so the transfer's \
             RSS growth includes the stored file itself; the RSS target concerns engine backends."
                .into(),
        );
    }
    if name == "podman" {
        n.push(
            "Raw Podman floor: podman-api 0.11 can only send the misspelled `no_new_privilages`, \
             which Podman ignores, so the plain floor runs without no-new-privileges (the adapter \
             patches the spec to apply it). The CLI talks to libpod directly, not through the \
             API service."
                .into(),
        );
    }
    n
}
