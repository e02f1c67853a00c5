//! A code interpreter session: stateful contexts (a variable defined in one call is used in
//! the next) and files moved between a host directory and the sandbox, both ways.
//!
//! ```text
//! cargo run -p sandbox-rs --example code_interpreter --features fake
//! cargo run -p sandbox-rs --example code_interpreter --features fake -- docker://sandbox-rs/python:3.11
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use sandbox::{
    Capability, CodeOptions, CreateOptions, ExecResult, Sandbox, SandboxError, SandboxExt,
};

type Res<T> = Result<T, Box<dyn Error>>;

fn show(label: &str, r: &ExecResult) {
    println!(
        "{label}: exit {} stdout {:?} stderr {:?}",
        r.exit_code,
        r.stdout_text(),
        r.stderr_text().lines().last().unwrap_or("")
    );
}

async fn contexts(sb: &dyn Sandbox) -> Res<()> {
    if !sb.capabilities().contains(Capability::STATEFUL_CODE) {
        // A backend without persistent interpreters refuses contexts with SBX_E1101
        // instead of silently forgetting state; say so and carry on.
        println!("{} has no STATEFUL_CODE: skipping contexts", sb.backend());
        return Ok(());
    }
    let session = CodeOptions::default().context("session-1");
    let r = sb
        .run_code("x = 41", session.clone())
        .await?
        .raise_for_status()?;
    show("session-1 `x = 41`", &r);
    let r = sb
        .run_code("print(x + 1)", session)
        .await?
        .raise_for_status()?;
    show("session-1 `print(x + 1)`", &r);
    if r.stdout_text() != "42\n" {
        return Err(format!("state was not kept: {:?}", r.stdout_text()).into());
    }
    // Contexts are isolated from each other: `x` does not exist in another one.
    let other = sb
        .run_code("print(x)", CodeOptions::default().context("session-2"))
        .await?;
    show("session-2 `print(x)`", &other);
    if other.ok() || !other.stderr_text().contains("NameError") {
        return Err("contexts leaked state into each other".into());
    }
    Ok(())
}

async fn files(sb: &dyn Sandbox, host: &Path) -> Res<()> {
    let fs = sb.files()?;
    // Host -> sandbox: a whole directory.
    let input = host.join("input");
    std::fs::create_dir_all(&input)?;
    std::fs::write(input.join("a.txt"), "alpha\n")?;
    std::fs::write(input.join("b.txt"), "beta\n")?;
    fs.upload(&input, "input").await?;
    let listing: Vec<String> = fs.ls("input").await?.into_iter().map(|f| f.name).collect();
    println!("uploaded: {listing:?}");

    // Work inside the sandbox (relative paths are the same workdir for files and run).
    fs.mkdir("output", true).await?;
    let r = sb
        .exec("cat input/a.txt input/b.txt > output/report.txt && echo done")
        .await?
        .raise_for_status()?;
    show("combine", &r);

    // Sandbox -> host: one file, and a directory.
    let report = fs.read("output/report.txt").await?;
    println!("read back {} bytes", report.len());
    let out = host.join("downloaded");
    fs.download("output", &out).await?;
    let on_host = std::fs::read_to_string(out.join("report.txt"))?;
    println!("downloaded to {}: {on_host:?}", out.display());
    if on_host != "alpha\nbeta\n" || report.as_ref() != on_host.as_bytes() {
        return Err(format!("unexpected report: {on_host:?}").into());
    }
    Ok(())
}

async fn run(dsn: &str, host: &Path) -> Res<()> {
    let sb = sandbox::create(
        dsn,
        CreateOptions::default().timeout(Duration::from_secs(120)),
    )
    .await?;
    println!(
        "sandbox {} on {} ({})",
        sb.id(),
        sb.backend(),
        sb.capabilities()
    );
    let outcome = async {
        contexts(&*sb).await?;
        files(&*sb, host).await
    }
    .await;
    // Always kill, also when a step failed; the step's error is the one reported.
    let killed = sb.kill().await;
    outcome?;
    killed?;
    println!("ok");
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
    let host: PathBuf =
        std::env::temp_dir().join(format!("sbx-code-interpreter-{}", std::process::id()));
    let result = run(&dsn(), &host).await;
    let _ = std::fs::remove_dir_all(&host);
    match result {
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
