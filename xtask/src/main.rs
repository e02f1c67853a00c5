//! `cargo xtask` — the project's automation: engine setup, tests, contract runs, docs, CI.
//!
//! `main` only parses arguments and dispatches; each command lives in its own module with a
//! `run(...) -> anyhow::Result<()>` (the rust-analyzer layout, see `STYLE.md`).
#![allow(
    clippy::print_stdout,
    reason = "xtask is a command-line tool: its printed progress is its interface"
)]

mod agent;
mod bench;
mod ci;
mod contract;
mod daemons;
mod demo;
mod digest;
mod docs;
mod engine_config;
mod images;
mod mirror;
mod packages;
mod process;
mod publish;
mod python;
mod report;
mod scratch;
mod setup;
mod teardown;
mod test;
mod verify;

use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::contract::Backend;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  setup [--rebuild-images]   install and configure Docker + Podman (+ gVisor), start their
                             daemons, build the local test images (root, Debian/Ubuntu)
  setup --daemons-only       only start the daemons (or move a misplaced Podman service)
  test [-- <filter>...]      cargo test --workspace, the contract suite on fake,
                             docker and podman, then `python`
  contract <fake|docker|podman> [--allow-ignored] [-- <args>...]
                             run one adapter's contract suite (`--test contract`); an
                             ignored trial fails it unless --allow-ignored (local use)
  docs [--check]             regenerate docs/errors/ (--check: fail on drift)
  ci                         everything CI checks: fmt, clippy, test, docs --check
  demo                       the end-to-end demo
  agent [--check]            build the static in-sandbox agent and copy it to
                             crates/sandbox-agent/prebuilt/ (--check: fail when the
                             committed binary differs from its source; docs/agent.md)
  bench [-- <args>...]       benchmarks: sandbox-rs vs raw engine crates vs engine CLIs on
                             docker, podman and fake; regenerates docs/benchmarks.md
                             (args go to sandbox-bench, e.g. `-- --runs 10 --backend docker`)
  bench --load [-- <args>...]
                             the load run: N live sandboxes per engine against plain
                             containers, latency and host cost at N, churn, leaks; writes
                             the load section of docs/benchmarks.md (long: never part of
                             test or ci; args e.g. `-- --population 100 --churn-minutes 5
                             --engines docker --stop-by 20:25`)
  python                     the Python wheel: build it with maturin, run sandboxio's
                             conformance suite on docker and podman beside the reference
                             sandboxio-docker, the timing comparison and the README's
                             Python example (fresh venvs under target/python/)
  publish-check [--verify]   would `cargo publish` work: names, metadata, versions,
                             packaged files (--verify: also build each packaged crate)
  teardown                   stop the daemons `setup` started (pids in /run/sandbox-rs/)

environment:
  CARGO                      cargo to invoke (set by `cargo xtask`)
  CI=true, SBX_CONTRACT_REQUIRED=1
                             a missing engine fails `contract docker|podman` instead of
                             skipping it
  SBX_PYTHON                 the interpreter `python` uses (default: the newest 3.12+,
                             else python3)
  SBX_DEBIAN_MIRROR          Debian mirror for the Python image (default: the one apt uses)
";

enum Command {
    Setup(setup::Options),
    Test(Vec<String>),
    Contract(Backend, contract::Options, Vec<String>),
    Docs { check: bool },
    Ci,
    Demo,
    Agent { check: bool },
    Bench(Vec<String>),
    BenchLoad(Vec<String>),
    PublishCheck { verify: bool },
    Python,
    Teardown,
    Help,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = parse(&args).and_then(dispatch);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Setup(options) => setup::run(&options),
        Command::Test(passthrough) => test::run(&passthrough),
        Command::Contract(backend, options, passthrough) => {
            contract::run(backend, options, &passthrough)
        }
        Command::Docs { check } => docs::run(check),
        Command::Ci => ci::run(),
        Command::Demo => demo::run(),
        Command::Agent { check } => agent::run(check),
        Command::Bench(passthrough) => bench::run(&passthrough),
        Command::BenchLoad(passthrough) => bench::run_load(&passthrough),
        Command::PublishCheck { verify } => publish::run(verify),
        Command::Python => python::run(),
        Command::Teardown => teardown::run(),
        Command::Help => {
            print!("{USAGE}");
            Ok(())
        }
    }
}

fn parse(args: &[String]) -> Result<Command> {
    let Some((command, rest)) = args.split_first() else {
        return Ok(Command::Help);
    };
    // Everything after `--` is handed to the test binaries untouched.
    let (flags, passthrough) = match rest.iter().position(|a| a == "--") {
        Some(i) => (&rest[..i], rest[i + 1..].to_vec()),
        None => (rest, Vec::new()),
    };
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let command = match (command.as_str(), flags.as_slice()) {
        ("help" | "--help" | "-h", _) => Command::Help,
        ("setup", flags) => {
            let mut options = setup::Options::default();
            for flag in flags {
                match *flag {
                    "--rebuild-images" => options.rebuild_images = true,
                    "--daemons-only" => options.daemons_only = true,
                    other => bail!("setup: unknown flag {other:?}\n\n{USAGE}"),
                }
            }
            Command::Setup(options)
        }
        ("test", []) => Command::Test(passthrough),
        ("contract", [backend, flags @ ..]) => Command::Contract(
            backend.parse()?,
            contract::Options::parse(flags)?,
            passthrough,
        ),
        ("contract", _) => bail!("contract takes exactly one backend: fake, docker or podman"),
        ("docs", []) => Command::Docs { check: false },
        ("docs", ["--check"]) => Command::Docs { check: true },
        ("ci", []) => Command::Ci,
        ("demo", []) => Command::Demo,
        ("agent", []) => Command::Agent { check: false },
        ("agent", ["--check"]) => Command::Agent { check: true },
        ("bench", []) => Command::Bench(passthrough),
        ("bench", ["--load"]) => Command::BenchLoad(passthrough),
        ("publish-check", []) => Command::PublishCheck { verify: false },
        ("publish-check", ["--verify"]) => Command::PublishCheck { verify: true },
        ("teardown", []) => Command::Teardown,
        ("python", []) => Command::Python,
        (name, []) => bail!("unknown command {name:?}\n\n{USAGE}"),
        (name, flags) => bail!("{name}: unexpected arguments {flags:?}\n\n{USAGE}"),
    };
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn contract_takes_a_backend_and_passthrough_args() {
        let Command::Contract(backend, _, rest) =
            parse(&args(&["contract", "podman", "--", "lifecycle"])).unwrap()
        else {
            panic!("not a contract command")
        };
        assert_eq!(backend, Backend::Podman);
        assert_eq!(rest, vec!["lifecycle".to_string()]);
    }

    #[test]
    fn unknown_backend_and_flags_are_refused() {
        assert!(parse(&args(&["contract", "lxc"])).is_err());
        assert!(parse(&args(&["setup", "--fast"])).is_err());
        assert!(parse(&args(&["docs", "--chek"])).is_err());
    }

    #[test]
    fn bench_load_is_its_own_command() {
        let Command::BenchLoad(rest) =
            parse(&args(&["bench", "--load", "--", "--population", "100"])).unwrap()
        else {
            panic!("not the load run")
        };
        assert_eq!(rest, args(&["--population", "100"]));
        assert!(matches!(
            parse(&args(&["bench"])).unwrap(),
            Command::Bench(_)
        ));
        assert!(parse(&args(&["bench", "--lod"])).is_err());
    }

    #[test]
    fn docs_check_flag_is_parsed() {
        assert!(matches!(
            parse(&args(&["docs", "--check"])).unwrap(),
            Command::Docs { check: true }
        ));
    }
}
