//! Results: the recorder the measurement loops fill, the per-backend result with its
//! ratios and target checks, and its renderings (terminal table, JSON, markdown).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::driver::Variant;
use crate::machine::Machine;
use crate::stats::{Summary, ratio, summarize};

/// Every measured operation, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Create,
    RunTrue,
    RunCode,
    RunCodeFresh,
    RunCodeWarm,
    FirstChunk,
    PauseResume,
    #[serde(rename = "write_read_1mib")]
    WriteRead1M,
    Kill,
    Upload,
    Download,
    Transfer,
    TransferRss,
    ConcurrentSmall,
    ConcurrentLarge,
    PoolAcquire,
    Snapshot,
    CreateFromSnapshot,
    Fork1,
    Fork4,
}

impl Op {
    pub fn label(self, transfer_mib: u64, c: (usize, usize)) -> String {
        match self {
            Op::Create => "create (until usable)".into(),
            Op::RunTrue => "run([\"true\"])".into(),
            Op::RunCode => "run_code(\"print(1)\")".into(),
            Op::RunCodeFresh => "run_code(\"print(1)\"), first call in a new sandbox".into(),
            Op::RunCodeWarm => "run_code(\"print(1)\") in a warm stateful context".into(),
            Op::FirstChunk => "first streamed chunk".into(),
            Op::PauseResume => "pause + resume".into(),
            Op::WriteRead1M => "1 MiB write+read".into(),
            Op::Kill => "kill".into(),
            Op::Upload => format!("{transfer_mib} MiB upload"),
            Op::Download => format!("{transfer_mib} MiB download"),
            Op::Transfer => format!("{transfer_mib} MiB upload+download"),
            Op::TransferRss => format!("{transfer_mib} MiB upload+download, peak RSS growth"),
            Op::ConcurrentSmall => format!("{} concurrent create+run+kill, total", c.0),
            Op::ConcurrentLarge => format!("{} concurrent create+run+kill, total", c.1),
            Op::PoolAcquire => "Pool::acquire(), spare ready".into(),
            Op::Snapshot => "snapshot (a sandbox's files into a template)".into(),
            Op::CreateFromSnapshot => "create from a snapshot's template (until usable)".into(),
            Op::Fork1 => "fork (n = 1) of a sandbox with a warm Python context".into(),
            Op::Fork4 => "fork (n = 4) of a sandbox with a warm Python context".into(),
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Op::Upload | Op::Download | Op::Transfer => "MiB/s",
            Op::TransferRss => "MiB",
            _ => "ms",
        }
    }
}

/// Samples per (operation, variant), plus the errors seen.
#[derive(Debug, Default)]
pub struct Recorder {
    samples: BTreeMap<(Op, Variant), Vec<f64>>,
    errors: BTreeMap<(Op, Variant), (usize, String)>,
}

impl Recorder {
    pub fn add(&mut self, op: Op, v: Variant, value: f64) {
        self.samples.entry((op, v)).or_default().push(value);
    }

    pub fn error(&mut self, op: Op, v: Variant, e: &anyhow::Error) {
        let msg = format!("{e:#}");
        let slot = self.errors.entry((op, v)).or_insert((0, msg));
        slot.0 += 1;
    }

    pub fn samples(&self, op: Op, v: Variant) -> &[f64] {
        self.samples.get(&(op, v)).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn median(&self, op: Op, v: Variant) -> Option<f64> {
        summarize(self.samples(op, v)).map(|s| s.median)
    }

    fn series(&self, op: Op, v: Variant) -> Option<Series> {
        let summary = summarize(self.samples(op, v));
        let err = self.errors.get(&(op, v));
        if summary.is_none() && err.is_none() {
            return None;
        }
        Some(Series {
            summary,
            errors: err.map(|e| e.0).unwrap_or(0),
            first_error: err.map(|e| e.1.clone()),
        })
    }

    /// The table rows, in `Op` order.
    pub fn rows(&self, transfer_mib: u64, conc: (usize, usize)) -> Vec<Row> {
        let mut ops: Vec<Op> = self
            .samples
            .keys()
            .chain(self.errors.keys())
            .map(|k| k.0)
            .collect();
        ops.sort();
        ops.dedup();
        ops.into_iter()
            .map(|op| {
                let ours = self.series(op, Variant::Ours);
                let raw = self.series(op, Variant::Raw);
                let cli = self.series(op, Variant::Cli);
                let med = |s: &Option<Series>| s.as_ref().and_then(|s| s.summary).map(|s| s.median);
                Row {
                    op,
                    label: op.label(transfer_mib, conc),
                    unit: op.unit(),
                    ours_raw: ratio(med(&ours), med(&raw)),
                    ours_cli: ratio(med(&ours), med(&cli)),
                    ours,
                    raw,
                    cli,
                }
            })
            .collect()
    }
}

/// One variant's figures for one operation.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub summary: Option<Summary>,
    pub errors: usize,
    pub first_error: Option<String>,
}

/// One operation across the variants.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub op: Op,
    pub label: String,
    pub unit: &'static str,
    pub ours: Option<Series>,
    pub raw: Option<Series>,
    pub cli: Option<Series>,
    /// Ratio of medians, ours / raw.
    pub ours_raw: Option<f64>,
    /// Ratio of medians, ours / CLI.
    pub ours_cli: Option<f64>,
}

/// One target of the issue, checked against this run.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub name: String,
    pub value: Option<f64>,
    pub threshold: String,
    /// `None` when it could not be measured.
    pub met: Option<bool>,
}

/// Everything measured for one backend.
#[derive(Debug, Clone, Serialize)]
pub struct BackendResult {
    pub backend: String,
    pub engine: String,
    pub cli: Option<String>,
    pub rows: Vec<Row>,
    pub targets: Vec<TargetCheck>,
    /// Where the time goes: request counts and component timings (see `profile.rs`).
    pub profile: Vec<String>,
    pub notes: Vec<String>,
    pub wall_seconds: f64,
}

/// The settings of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub runs: usize,
    pub warmup: usize,
    pub transfer_mib: u64,
    pub transfer_runs: usize,
    pub concurrency: (usize, usize),
    pub concurrent_runs: usize,
    pub quick: bool,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub date: String,
    pub command: String,
    pub machine: Machine,
    pub settings: Settings,
    pub backends: Vec<BackendResult>,
    pub wall_seconds: f64,
    /// Load average when the run ended.
    pub load_at_end: String,
}

/// The targets, from a backend's rows (enforced on Docker; reported for all).
pub fn check_targets(rec: &Recorder) -> Vec<TargetCheck> {
    let mut t = Vec::new();
    let mut le = |name: &str, value: Option<f64>, max: f64, fmt: &str| {
        t.push(TargetCheck {
            name: name.into(),
            value,
            threshold: format!("{fmt} {max}"),
            met: value.map(|v| v <= max),
        });
    };
    let m = |op, v| rec.median(op, v);
    le(
        "create: ours / raw",
        ratio(m(Op::Create, Variant::Ours), m(Op::Create, Variant::Raw)),
        1.10,
        "≤",
    );
    le(
        "run([\"true\"]): ours / raw",
        ratio(m(Op::RunTrue, Variant::Ours), m(Op::RunTrue, Variant::Raw)),
        1.10,
        "≤",
    );
    le(
        "run([\"true\"]): ours / CLI exec",
        ratio(m(Op::RunTrue, Variant::Ours), m(Op::RunTrue, Variant::Cli)),
        0.75,
        "≤",
    );
    le(
        "run_code(\"print(1)\") in a warm stateful context p50 (ms)",
        m(Op::RunCodeWarm, Variant::Ours),
        5.0,
        "≤",
    );
    le(
        "fork (n = 1) of a warm Python context p50 (ms)",
        m(Op::Fork1, Variant::Ours),
        1000.0,
        "≤",
    );
    le(
        "transfer: peak RSS growth (MiB)",
        m(Op::TransferRss, Variant::Ours),
        32.0,
        "≤",
    );
    let thr = ratio(
        m(Op::Transfer, Variant::Ours),
        m(Op::Transfer, Variant::Raw),
    );
    t.push(TargetCheck {
        name: "transfer throughput: ours / raw".into(),
        value: thr,
        threshold: "≥ 0.9".into(),
        met: thr.map(|v| v >= 0.9),
    });
    let pool = m(Op::PoolAcquire, Variant::Ours);
    t.push(TargetCheck {
        name: "Pool::acquire() p50 (ms), spare ready".into(),
        value: pool,
        threshold: "< 5".into(),
        met: pool.map(|v| v < 5.0),
    });
    let speedup = ratio(m(Op::Create, Variant::Ours), pool);
    t.push(TargetCheck {
        name: "cold create / Pool::acquire()".into(),
        value: speedup,
        threshold: "≥ 30".into(),
        met: speedup.map(|v| v >= 30.0),
    });
    t
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn cell(s: &Option<Series>, pick: fn(&Summary) -> f64) -> String {
    match s {
        None => "–".into(),
        Some(s) => match &s.summary {
            Some(sum) => {
                let mut c = fmt_num(pick(sum));
                if s.errors > 0 {
                    let _ = write!(c, " ({} err)", s.errors);
                }
                c
            }
            None => format!("error ×{}", s.errors),
        },
    }
}

fn ratio_cell(r: Option<f64>) -> String {
    r.map(|v| format!("{v:.2}")).unwrap_or_else(|| "–".into())
}

fn met_cell(m: Option<bool>) -> &'static str {
    match m {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "not measured",
    }
}

/// The figures of one backend as a plain-text table (stdout).
pub fn text_table(b: &BackendResult) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n== {} — {} ==", b.backend, b.engine);
    let header = [
        "operation",
        "unit",
        "ours p50",
        "ours p90",
        "raw p50",
        "raw p90",
        "cli p50",
        "cli p90",
        "ours/raw",
        "ours/cli",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for r in &b.rows {
        lines.push(vec![
            r.label.clone(),
            r.unit.into(),
            cell(&r.ours, |s| s.median),
            cell(&r.ours, |s| s.p90),
            cell(&r.raw, |s| s.median),
            cell(&r.raw, |s| s.p90),
            cell(&r.cli, |s| s.median),
            cell(&r.cli, |s| s.p90),
            ratio_cell(r.ours_raw),
            ratio_cell(r.ours_cli),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            lines
                .iter()
                .map(|l| l[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (n, l) in lines.iter().enumerate() {
        let cells: Vec<String> = l
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  "));
        if n == 0 {
            let _ = writeln!(
                out,
                "{}",
                "-".repeat(widths.iter().sum::<usize>() + 2 * widths.len())
            );
        }
    }
    let _ = writeln!(out, "\ntargets:");
    for t in &b.targets {
        let _ = writeln!(
            out,
            "  {:<42} {:>8}  {:<6}  {}",
            t.name,
            t.value.map(fmt_num).unwrap_or_else(|| "–".into()),
            t.threshold,
            met_cell(t.met)
        );
    }
    if !b.profile.is_empty() {
        let _ = writeln!(out, "\nprofile:");
        for p in &b.profile {
            let _ = writeln!(out, "  - {p}");
        }
    }
    for r in &b.rows {
        for (v, s) in [("ours", &r.ours), ("raw", &r.raw), ("cli", &r.cli)] {
            if let Some(Series {
                first_error: Some(e),
                errors,
                ..
            }) = s
            {
                let _ = writeln!(out, "  error in {} ({v}, ×{errors}): {e}", r.label);
            }
        }
    }
    out
}

/// The markdown report (docs/benchmarks.md).
pub fn markdown(r: &Report) -> String {
    let mut o = String::new();
    let s = &r.settings;
    let _ = writeln!(o, "# Benchmarks\n");
    let _ = writeln!(
        o,
        "Generated by `cargo xtask bench` (the `sandbox-bench` binary, `crates/sandbox-bench`); \
         do not edit by hand, rerun it. Every figure below comes from one run on one machine: \
         sandbox-rs (\"ours\"), the engine crate called plainly (\"raw\": bollard / podman-api, \
         the floor a user reaches by hand) and the engine CLI (\"cli\": `docker` / `podman` \
         child processes) measured in the same loop, interleaved (the order rotates every \
         iteration), so machine noise hits all three alike. Ratios are ratios of medians.\n"
    );
    let _ = writeln!(o, "- Date: {}", r.date);
    let _ = writeln!(o, "- Command: `{}`", r.command);
    let _ = writeln!(
        o,
        "- Machine: {} ({} logical CPUs), {} GiB RAM, kernel {}, {}",
        r.machine.cpu, r.machine.cores, r.machine.memory_gib, r.machine.kernel, r.machine.os
    );
    let _ = writeln!(
        o,
        "- Load average (1/5/15 min) when the run started: {}; at the end: {}",
        r.machine.load_at_start, r.load_at_end
    );
    let _ = writeln!(
        o,
        "- Runs: {} measured after {} warm-up for latencies; {} × {} MiB transfers (each in a \
         fresh child process, after 1 warm-up); {} runs of each concurrent batch ({} and {})",
        s.runs,
        s.warmup,
        s.transfer_runs,
        s.transfer_mib,
        s.concurrent_runs,
        s.concurrency.0,
        s.concurrency.1
    );
    let _ = writeln!(
        o,
        "- Containers: image `sandbox-rs/python:3.11`, network none, cap_drop ALL, \
         no-new-privileges, 512 pids, 512 MiB memory (= memory+swap), 1 CPU, init, removed on \
         exit, labelled `io.sandbox-rs.managed=true` — the same settings for all three.\n"
    );
    let _ = writeln!(o, "Total wall time: {:.0} s.\n", r.wall_seconds);
    for b in &r.backends {
        let _ = writeln!(o, "## {}\n", b.backend);
        let _ = writeln!(o, "Engine: {}.", b.engine);
        if let Some(cli) = &b.cli {
            let _ = writeln!(o, "CLI: {cli}.");
        }
        let _ = writeln!(o, "Wall time for this backend: {:.0} s.\n", b.wall_seconds);
        let _ = writeln!(
            o,
            "| operation | unit | ours p50 | ours p90 | raw p50 | raw p90 | CLI p50 | CLI p90 | ours/raw | ours/CLI |"
        );
        let _ = writeln!(o, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for row in &b.rows {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.label.replace('|', "\\|"),
                row.unit,
                cell(&row.ours, |s| s.median),
                cell(&row.ours, |s| s.p90),
                cell(&row.raw, |s| s.median),
                cell(&row.raw, |s| s.p90),
                cell(&row.cli, |s| s.median),
                cell(&row.cli, |s| s.p90),
                ratio_cell(row.ours_raw),
                ratio_cell(row.ours_cli),
            );
        }
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "Targets (binding on Docker, reported for every backend):\n"
        );
        let _ = writeln!(o, "| target | value | threshold | result |");
        let _ = writeln!(o, "|---|---:|---|---|");
        for t in &b.targets {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} |",
                t.name.replace('|', "\\|"),
                t.value.map(fmt_num).unwrap_or_else(|| "–".into()),
                t.threshold,
                met_cell(t.met)
            );
        }
        let _ = writeln!(o);
        if !b.profile.is_empty() {
            let _ = writeln!(o, "Where the time goes (measured in this run):\n");
            for p in &b.profile {
                let _ = writeln!(o, "- {p}");
            }
            let _ = writeln!(o);
        }
        let errors: Vec<String> = b
            .rows
            .iter()
            .flat_map(|r| {
                [("ours", &r.ours), ("raw", &r.raw), ("cli", &r.cli)]
                    .into_iter()
                    .filter_map(move |(v, s)| {
                        let s = s.as_ref()?;
                        let e = s.first_error.as_ref()?;
                        Some(format!("{} ({v}, ×{}): {}", r.label, s.errors, e))
                    })
            })
            .collect();
        if !errors.is_empty() {
            let _ = writeln!(o, "Errors:\n");
            for e in errors {
                let _ = writeln!(o, "- {}", e.replace('\n', " "));
            }
            let _ = writeln!(o);
        }
        for n in &b.notes {
            let _ = writeln!(o, "{n}\n");
        }
    }
    o
}
