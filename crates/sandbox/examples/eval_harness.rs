//! An evaluation harness: N tasks fanned out over a warm `Pool` of sandboxes with a
//! concurrency limit, one fresh sandbox per task (never reused across tasks), and a results
//! table with pass/fail, exit code and duration.
//!
//! ```text
//! cargo run -p sandbox-rs --example eval_harness --features fake
//! cargo run -p sandbox-rs --example eval_harness --features fake -- docker://sandbox-rs/python:3.11
//! ```
//!
//! Wrong answers, crashes and timeouts are results, not harness failures; the program fails
//! only when the infrastructure does (a sandbox could not be created, an engine error).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sandbox::{CodeOptions, CreateOptions, Dsn, ErrorCode, Pool, PoolConfig, SandboxError};

/// Tasks run at once (and spares the pool keeps warm).
const CONCURRENCY: usize = 3;
/// Per-task time budget; the `hang` task exceeds it on purpose.
const TASK_TIMEOUT: Duration = Duration::from_secs(2);

struct Task {
    name: &'static str,
    code: &'static str,
    expected: &'static str,
}

const TASKS: &[Task] = &[
    Task {
        name: "sum",
        code: "print(2 + 3)",
        expected: "5",
    },
    Task {
        name: "product",
        code: "print(6 * 7)",
        expected: "42",
    },
    Task {
        name: "hello",
        code: "print('hello')",
        expected: "hello",
    },
    Task {
        name: "cwd",
        code: "import os; print(os.getcwd())",
        expected: "/work",
    },
    Task {
        name: "wrong-answer",
        code: "print(7 * 6)",
        expected: "43",
    },
    Task {
        name: "crash",
        code: "1/0",
        expected: "",
    },
    Task {
        name: "syntax",
        code: "print((1)",
        expected: "1",
    },
    Task {
        name: "hang",
        code: "import time; time.sleep(30)",
        expected: "",
    },
];

struct Outcome {
    name: &'static str,
    pass: bool,
    exit_code: Option<i64>,
    duration: Duration,
    note: String,
    /// An error that is the harness's problem, not the task's.
    infra: Option<SandboxError>,
}

/// Tasks in flight now, and the most seen at once (shown to prove the limit holds).
struct InFlight {
    now: AtomicUsize,
    max: AtomicUsize,
}

async fn run_task(pool: &Pool, task: &'static Task, gauge: &InFlight) -> Outcome {
    let n = gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
    gauge.max.fetch_max(n, Ordering::SeqCst);
    let out = run_task_inner(pool, task).await;
    gauge.now.fetch_sub(1, Ordering::SeqCst);
    out
}

async fn run_task_inner(pool: &Pool, task: &'static Task) -> Outcome {
    let started = Instant::now();
    let mut out = Outcome {
        name: task.name,
        pass: false,
        exit_code: None,
        duration: Duration::ZERO,
        note: String::new(),
        infra: None,
    };
    let sb = match pool.acquire().await {
        Ok(sb) => sb,
        Err(e) => {
            out.note = format!("{}: {}", e.code(), e.hint());
            out.infra = Some(e);
            out.duration = started.elapsed();
            return out;
        }
    };
    let result = sb
        .run_code(task.code, CodeOptions::default().timeout(TASK_TIMEOUT))
        .await;
    out.duration = started.elapsed();
    match result {
        Ok(r) => {
            out.exit_code = Some(r.exit_code);
            let got = r.stdout_text().trim().to_string();
            out.pass = r.ok() && got == task.expected;
            out.note = if r.ok() {
                format!("stdout {got:?}, expected {:?}", task.expected)
            } else {
                r.stderr_text().lines().last().unwrap_or("").to_string()
            };
        }
        Err(e) if e.code() == ErrorCode::ExecutionTimeout => {
            out.note = format!("{}: timed out after {TASK_TIMEOUT:?}", e.code());
        }
        Err(e) => {
            out.note = format!("{}: {e}", e.code());
            out.infra = Some(e);
        }
    }
    // One sandbox per task: killed here, never handed back.
    if let Err(e) = sb.kill().await {
        out.note = format!("{} (kill failed: {})", out.note, e.code());
        out.infra.get_or_insert(e);
    }
    out
}

async fn run(dsn: &str) -> Result<(), Box<dyn Error>> {
    // The DSN picks the backend (one shared client) and, with a template, the image.
    let options =
        Dsn::parse(dsn)?.apply(CreateOptions::default().timeout(Duration::from_secs(120)));
    let backend = sandbox::backend(dsn).await?;
    let pool = Arc::new(Pool::new(backend, PoolConfig::new(CONCURRENCY, options))?);
    let warm = pool.wait_ready(CONCURRENCY, Duration::from_secs(30)).await;
    println!(
        "pool warm: {warm}/{CONCURRENCY} spares; {} tasks",
        TASKS.len()
    );

    let gauge = InFlight {
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
    };
    let started = Instant::now();
    let mut outcomes: Vec<Outcome> = futures::stream::iter(TASKS)
        .map(|t| run_task(&pool, t, &gauge))
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let wall = started.elapsed();
    // Spares left in the pool are killed here, also when tasks failed.
    pool.shutdown().await;

    outcomes.sort_by_key(|o| TASKS.iter().position(|t| t.name == o.name));
    println!(
        "{:<14} {:<4} {:>4} {:>9}  note",
        "task", "pass", "exit", "ms"
    );
    for o in &outcomes {
        println!(
            "{:<14} {:<4} {:>4} {:>9}  {}",
            o.name,
            if o.pass { "PASS" } else { "FAIL" },
            o.exit_code.map_or("-".to_string(), |c| c.to_string()),
            o.duration.as_millis(),
            o.note
        );
    }
    let passed = outcomes.iter().filter(|o| o.pass).count();
    println!(
        "summary: {passed}/{} passed in {} ms (concurrency limit {CONCURRENCY}, max in flight {})",
        outcomes.len(),
        wall.as_millis(),
        gauge.max.load(Ordering::SeqCst)
    );
    if let Some(e) = outcomes.into_iter().find_map(|o| o.infra) {
        return Err(e.into());
    }
    Ok(())
}

fn dsn() -> String {
    std::env::args()
        .nth(1)
        .or_else(|| std::env::var("SBX_EXAMPLE_DSN").ok())
        .unwrap_or_else(|| "fake://".to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(&dsn()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<SandboxError>() {
                Some(se) => eprintln!("error [{}]: {se}\nhint: {}", se.code(), se.hint()),
                None => eprintln!("error: {e}"),
            }
            ExitCode::FAILURE
        }
    }
}
