//! `sandbox`: the sandbox-rs command line. See the crate README for commands, JSON
//! schemas and exit codes.

#![forbid(unsafe_code)]

mod cli;
mod demo;
mod doctor;
mod egress;
mod exit_code;
mod holder;
mod mcp;
mod output;
mod reap;
mod run;
mod secret_env;
mod session;
mod signals;
mod stdin;
mod target;
mod terminal;
mod tty;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sandbox::SandboxError;

use crate::cli::{Cli, Cmd};
use crate::output::Out;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version are exit 0; usage errors exit 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                exit_code::USAGE
            } else {
                exit_code::OK
            });
        }
    };
    if let Cmd::Completions(args) = &cli.command {
        return completions(args.shell);
    }
    init_tracing(cli.command.json());
    raise_open_files_limit();
    let out = Out::new(cli.command.json());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            out.error(&SandboxError::engine(
                "cli",
                format!("cannot start the async runtime: {e}"),
            ));
            return ExitCode::from(exit_code::FAILURE);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            // These own their signal handling: they must tear down sandboxes that live in
            // tasks or other processes, which dropping their future would not reach.
            Cmd::Mcp(args) => {
                let code = match serve_mcp(&args).await {
                    Ok(code) => code,
                    Err(e) => {
                        out.error(&e);
                        exit_code::for_error(&e)
                    }
                };
                let grace = sandbox::teardown::teardown_grace() + Duration::from_secs(1);
                sandbox::teardown::wait_for_teardowns(grace).await;
                code
            }
            Cmd::Create(args) if std::env::var_os(holder::HOLDER_ENV).is_some() => {
                holder::hold(args).await
            }
            command => run_command(command, out).await,
        }
    });
    ExitCode::from(code)
}

/// Runs a command until it ends or a termination signal arrives, then waits (bounded) for
/// the teardowns it scheduled.
async fn run_command(command: Cmd, out: Out) -> u8 {
    {
        // Installed before any sandbox exists, so a signal never kills us mid-create.
        let interrupted = signals::terminated();
        let code = tokio::select! {
            r = dispatch(command, out) => match r {
                Ok(code) => code,
                Err(e) => {
                    out.error(&e);
                    exit_code::for_error(&e)
                }
            },
            _ = interrupted => {
                // Dropping the command's future dropped its sandbox and process handles,
                // which scheduled their bounded kills; they finish below.
                if out.json {
                    out.json_value(&serde_json::json!({"interrupted": true}));
                } else {
                    out.note("interrupted; tearing down");
                }
                exit_code::INTERRUPTED
            }
        };
        let grace = sandbox::teardown::teardown_grace() + Duration::from_secs(1);
        if !sandbox::teardown::wait_for_teardowns(grace).await {
            out.note("warning: a teardown did not finish; list leftovers with `sandbox reap`");
        }
        code
    }
}

/// `sandbox completions SHELL`.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    use clap::CommandFactory;
    use std::io::Write;
    let mut cmd = Cli::command();
    // Into a buffer first: clap_complete panics when its writer fails (`| head`).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "sandbox", &mut script);
    let _ = std::io::stdout().lock().write_all(&script);
    ExitCode::from(exit_code::OK)
}

async fn dispatch(cmd: Cmd, out: Out) -> sandbox::Result<u8> {
    match cmd {
        Cmd::Run(args) => run::run(args, out).await,
        Cmd::Demo(args) => demo::demo(args, out).await,
        Cmd::Doctor(args) => doctor::doctor(args, out).await,
        Cmd::Reap(args) => reap::reap(args, out).await,
        Cmd::Create(args) => session::create(args, out).await,
        Cmd::Exec(args) => session::exec(args, out).await,
        Cmd::Cp(args) => session::cp(args, out).await,
        Cmd::Ls(args) => session::ls(args, out).await,
        Cmd::Kill(args) => session::kill(args, out).await,
        Cmd::Pause(args) => session::pause_or_resume(args, true, out).await,
        Cmd::Egress(args) => session::egress(args, out).await,
        Cmd::Resume(args) => session::pause_or_resume(args, false, out).await,
        Cmd::Stop(args) => session::stop_or_start(args, true, out).await,
        Cmd::Start(args) => session::stop_or_start(args, false, out).await,
        Cmd::Extend(args) => session::extend(args, out).await,
        Cmd::Fork(args) => holder::fork(args, out).await,
        // Handled before dispatch.
        Cmd::Mcp(args) => serve_mcp(&args).await,
        Cmd::Completions(_) => Ok(exit_code::OK),
    }
}

/// `sandbox mcp`: stdio, or streamable HTTP with `--http`.
async fn serve_mcp(args: &cli::McpArgs) -> sandbox::Result<u8> {
    mcp::serve(mcp::McpOptions::try_from(args)?).await
}

/// Warnings (e.g. "orphaned sandbox") go to stderr; `SANDBOX_LOG` (an env-filter) raises
/// the level. stdout stays clean for `--json`. Image pulls draw a progress bar on a
/// terminal from the library's pull events, whatever the log level.
///
/// Records of the `log` crate are deliberately not forwarded: bollard logs every request
/// body at debug level, and an exec body carries the command's environment, secrets
/// included (`SubscriberInitExt::try_init` would install a `log` bridge).
fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_from_env("SANDBOX_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(!no_color && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    let subscriber = tracing_subscriber::registry()
        .with(log)
        .with(output::PullBar::layer(json).map(|bar| bar.with_filter(output::pull_events())));
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// Raises this process's open-files soft limit to its hard limit. Every live sandbox a
/// process holds keeps one descriptor (its agent's attach stream), and the soft limit a
/// shell hands down is often 1024: `sandbox mcp` serving many sessions, or a holder of
/// many forks, would run out long before the engine does. A binary may decide this for
/// itself; the library leaves it to its caller (docs/benchmarks.md).
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(error = %e, "cannot raise the open-files limit");
        }
    }
}
