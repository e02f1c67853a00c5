//! Testing your agent with the fake: scripted responses (`on_run` / `on_run_code`), fault
//! injection, recorded calls and virtual time (a paused tokio clock). Written as a program
//! that asserts; in your crate the same code goes into `#[tokio::test(start_paused = true)]`
//! functions, with `sandbox = { version = "0.1", features = ["fake"] }` under
//! `[dev-dependencies]`.
//!
//! ```text
//! cargo run -p sandbox-rs --example testing_with_fake --features fake
//! ```
//!
//! Each scenario uses its own `FakeBackend` (not the process-wide `fake://`), so scripts,
//! faults and recorded calls of one test never leak into another running in parallel.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use sandbox::fake::{Call, CodeMatch, FakeBackend, Response, RunMatch};
use sandbox::{
    Backend, CodeOptions, CreateOptions, ErrorCode, Result, RunOptions, Sandbox, SandboxError,
};

// ---------------------------------------------------------------------------------------
// The code under test: one step of a coding agent. It installs dependencies (retrying once
// after a back-off when the install times out), runs the test suite, then asks the
// project for its answer. This is the part of *your* crate the tests below exercise.
// ---------------------------------------------------------------------------------------

/// What the agent step reports.
#[derive(Debug, PartialEq)]
struct Report {
    tests_passed: bool,
    answer: String,
    install_attempts: u32,
}

const INSTALL_TIMEOUT: Duration = Duration::from_secs(60);
const BACKOFF: Duration = Duration::from_secs(30);

async fn agent_step(sb: &dyn Sandbox) -> Result<Report> {
    let mut install_attempts = 0;
    loop {
        install_attempts += 1;
        let install = sb
            .run(
                "pip install -r requirements.txt".into(),
                RunOptions::default().timeout(INSTALL_TIMEOUT),
            )
            .await;
        match install {
            Ok(r) => {
                r.raise_for_status()?;
                break;
            }
            Err(e) if e.is_timeout() && install_attempts < 2 => {
                tokio::time::sleep(BACKOFF).await;
            }
            Err(e) => return Err(e),
        }
    }
    let tests = sb
        .run(["pytest", "-q"].into(), RunOptions::default())
        .await?;
    let answer = sb
        .run_code("import app; print(app.answer())", CodeOptions::default())
        .await?
        .raise_for_status()?;
    Ok(Report {
        tests_passed: tests.ok(),
        answer: answer.stdout_text().trim().to_string(),
        install_attempts,
    })
}

/// The agent's entry point: creates a sandbox on the backend it is given, runs the step,
/// and always kills the sandbox (the step's error wins over a kill error).
async fn run_agent(backend: Arc<dyn Backend>) -> Result<Report> {
    let sb = sandbox::create(backend, CreateOptions::default()).await?;
    let report = agent_step(&*sb).await;
    let killed = sb.kill().await;
    let report = report?;
    killed?;
    Ok(report)
}

// ---------------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------------

/// A fake with the project's commands scripted; the rest of the vocabulary still works.
fn scripted() -> FakeBackend {
    let fake = FakeBackend::new();
    fake.on_run(
        RunMatch::prefix(["pip", "install"]),
        Response::ok("Successfully installed app-1.0\n"),
    );
    fake.on_run(["pytest", "-q"], Response::ok("3 passed in 0.01s\n"));
    fake.on_run_code(CodeMatch::contains("import app"), Response::ok("42\n"));
    fake
}

fn as_backend(fake: &FakeBackend) -> Arc<dyn Backend> {
    Arc::new(fake.clone())
}

async fn scripted_responses() -> Result<()> {
    let fake = scripted();
    let report = run_agent(as_backend(&fake)).await?;
    assert_eq!(
        report,
        Report {
            tests_passed: true,
            answer: "42".into(),
            install_attempts: 1
        }
    );

    // The recorded calls show what the agent did, in order, with the policy in effect.
    let argvs: Vec<Vec<String>> = fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Run { argv, .. } => Some(argv),
            _ => None,
        })
        .collect();
    assert_eq!(argvs.len(), 2, "{argvs:?}");
    assert_eq!(argvs[0], ["sh", "-c", "pip install -r requirements.txt"]);
    assert_eq!(argvs[1], ["pytest", "-q"]);
    assert!(fake.sandboxes().is_empty(), "the agent killed its sandbox");

    // A failing test suite is reported, not an error: the most recent matching rule wins.
    fake.on_run(
        ["pytest", "-q"],
        Response::output(1, "1 failed, 2 passed\n", ""),
    );
    let report = run_agent(as_backend(&fake)).await?;
    assert!(!report.tests_passed);
    println!(
        "ok: scripted responses ({} calls recorded)",
        fake.calls().len()
    );
    Ok(())
}

async fn virtual_time() -> Result<()> {
    let fake = scripted();
    // The first install hangs until the agent's 60 s timeout; the retry succeeds.
    fake.on_run_once(RunMatch::prefix(["pip", "install"]), Response::hang());
    let wall = std::time::Instant::now();
    let virtual_start = tokio::time::Instant::now();
    let report = run_agent(as_backend(&fake)).await?;
    let virtual_elapsed = virtual_start.elapsed();
    assert_eq!(report.install_attempts, 2);
    // 60 s timeout + 30 s back-off passed on the paused clock...
    assert!(
        virtual_elapsed >= INSTALL_TIMEOUT + BACKOFF,
        "{virtual_elapsed:?}"
    );
    // ...in (far) less than a second of real time.
    assert!(
        wall.elapsed() < Duration::from_secs(5),
        "{:?}",
        wall.elapsed()
    );
    println!(
        "ok: virtual time ({virtual_elapsed:?} virtual in {:?} real)",
        wall.elapsed()
    );
    Ok(())
}

async fn fault_injection() -> Result<()> {
    // The engine is down: the agent surfaces a typed error with a fix, never a panic.
    let fake = scripted();
    fake.faults().set_provider_failure(true);
    let e = run_agent(as_backend(&fake)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Creation);
    assert!(!e.hint().is_empty());
    fake.faults().heal();

    // A missing credential names the variable to set.
    fake.faults().set_missing_credential(Some("FAKE_API_KEY"));
    let e = run_agent(as_backend(&fake)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Auth);
    assert!(e.to_string().contains("FAKE_API_KEY"));
    fake.faults().heal();

    // A kill that fails is reported (with a `reap` hint), after the step's own result.
    fake.faults().set_kill_failure(true);
    let e = run_agent(as_backend(&fake)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Connect);
    fake.faults().heal();
    for sb in fake.sandboxes() {
        // The sandbox left by the failed kill: what `sandbox reap --kill` would remove.
        assert!(fake.expire(sb.id()));
    }

    // The sandbox expires mid-step (its lifetime ended): SandboxGone, not a timeout.
    let fake = scripted();
    let backend = as_backend(&fake);
    let sb = sandbox::create(backend, CreateOptions::default()).await?;
    assert!(fake.expire(sb.id()));
    let e = agent_step(&*sb).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxGone);
    assert!(!e.is_timeout());
    let _ = sb.kill().await;

    // A scripted error response: the tool itself errors the way an engine would.
    let fake = scripted();
    fake.on_run_code(
        CodeMatch::contains("import app"),
        Response::error(|| SandboxError::config("interpreter crashed", "retry the call")),
    );
    let e = run_agent(as_backend(&fake)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Configuration);
    assert!(
        fake.sandboxes().is_empty(),
        "killed also when the step failed"
    );
    println!("ok: fault injection (provider failure, credential, kill failure, expiry, errors)");
    Ok(())
}

async fn all() -> Result<()> {
    scripted_responses().await?;
    virtual_time().await?;
    fault_injection().await?;
    println!("ok: all scenarios");
    Ok(())
}

fn main() -> ExitCode {
    if let Some(dsn) = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("SBX_EXAMPLE_DSN").ok())
    {
        println!("note: this example is about the fake; ignoring {dsn:?}");
    }
    // What `#[tokio::test(start_paused = true)]` builds: a paused clock that jumps to the
    // next timer whenever every task waits, so timeouts and back-offs cost no real time.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot build a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(all()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error [{}]: {e}\nhint: {}", e.code(), e.hint());
            ExitCode::FAILURE
        }
    }
}
