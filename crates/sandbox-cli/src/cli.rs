//! Command-line grammar (clap derive).

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Printed after `--help`.
const EXIT_CODES: &str = "Every command takes --json (one JSON object on stdout; errors as {\"error\": {code, message, hint, url}}).\nColor only on a terminal and when NO_COLOR is unset.\n\nExit codes:\n  0    ok\n  1    failure (engine error, unhealthy default engine, failed demo step, failed kill)\n  2    usage or configuration error (bad flags, bad DSN, unknown backend)\n  124  `run`: the command timed out (and was killed)\n  130  interrupted by Ctrl-C (after teardown)\n  `run` otherwise exits with the command's own exit code.";

/// Run untrusted code in sandboxes (Docker, Podman, fake).
///
/// Exit codes: 0 ok; 1 failure; 2 usage or configuration error; 124 `run` timed out;
/// 130 interrupted (Ctrl-C, after teardown). `sandbox run` otherwise exits with the
/// command's own exit code.
#[derive(Debug, Parser)]
#[command(name = "sandbox", version, about, long_about = None, after_help = EXIT_CODES)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Cmd,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Run one command in a fresh sandbox, streaming its output; exits with its exit code.
    Run(RunArgs),
    /// Create a sandbox, run code, stream, prove egress is denied, tear down — timed.
    Demo(DemoArgs),
    /// Check every engine: reachable, version, socket, runtimes, images, tier, fixes.
    Doctor(DoctorArgs),
    /// List sandboxes sandbox-rs manages on every reachable engine; kill with --kill.
    Reap(ReapArgs),
}

/// Egress policy of `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkArg {
    /// No network but loopback (default).
    Deny,
    /// Unrestricted outbound traffic.
    Allow,
}

/// `sandbox run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Command timeout in seconds (the sandbox lives 30 s longer). Default: 300.
    #[arg(long, value_name = "S", value_parser = parse_positive_secs)]
    pub timeout: Option<Duration>,
    /// Memory limit in MiB (default 512).
    #[arg(long, value_name = "MB")]
    pub memory: Option<u64>,
    /// CPU quota in cores, e.g. 0.5 (default 1).
    #[arg(long, value_name = "N")]
    pub cpus: Option<f64>,
    /// Egress policy.
    #[arg(long, value_enum, default_value_t = NetworkArg::Deny)]
    pub network: NetworkArg,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Print one JSON object instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// Write the sandbox's output to a terminal byte for byte. By default, on a terminal,
    /// control characters but newline and tab (escape sequences) are shown escaped (`\x1b`),
    /// so sandboxed code cannot drive the terminal; pipes and files always get raw bytes.
    #[arg(long)]
    pub raw: bool,
    /// Where to run: `docker://sandbox-rs/busybox:latest`, `podman://…`, `fake://`.
    #[arg(value_name = "DSN")]
    pub dsn: String,
    /// The command and its arguments (after `--`); run directly, not through a shell.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// `sandbox demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Where to run the demo.
    #[arg(value_name = "DSN", default_value = "docker://sandbox-rs/python:3.11")]
    pub dsn: String,
}

/// `sandbox doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Check only this engine (repeatable; default: every compiled-in and registered one).
    #[arg(long = "engine", value_name = "NAME")]
    pub engines: Vec<String>,
}

/// `sandbox reap`.
#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Kill (and remove) listed sandboxes whose owner process is proven gone or whose
    /// deadline has passed. Without it, only list. The whole command gives up after 60 s.
    #[arg(long)]
    pub kill: bool,
    /// With --kill, also kill live sandboxes (owner alive or unverifiable, deadline
    /// ahead). Sandboxes without the labels sandbox-rs sets are never killed.
    #[arg(long, requires = "kill")]
    pub force: bool,
    /// Only sandboxes with this metadata label (repeatable; `io.sandbox-rs.*` keys as given).
    #[arg(long = "label", value_name = "K=V", value_parser = parse_key_value)]
    pub labels: Vec<(String, String)>,
    /// Only sandboxes created longer ago than this: `30s`, `10m`, `2h`, `1d`.
    #[arg(long, value_name = "DUR", value_parser = parse_age)]
    pub older_than: Option<Duration>,
    /// Only this sandbox id, or a unique prefix of it (repeatable).
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<String>,
    /// Only this engine (repeatable; default: every compiled-in and registered one).
    #[arg(long = "engine", value_name = "NAME")]
    pub engines: Vec<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

impl ReapArgs {
    /// The label filter as a map.
    pub fn label_map(&self) -> BTreeMap<String, String> {
        self.labels.iter().cloned().collect()
    }
}

impl Cmd {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        match self {
            Cmd::Run(a) => a.json,
            Cmd::Demo(a) => a.json,
            Cmd::Doctor(a) => a.json,
            Cmd::Reap(a) => a.json,
        }
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}

fn parse_positive_secs(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("expected seconds in (0, 86400], got {s:?}")),
    }
}

/// `30s`, `10m`, `2h`, `1d`.
pub fn parse_age(s: &str) -> Result<Duration, String> {
    let bad = || format!("expected a number with a unit (30s, 10m, 2h, 1d), got {s:?}");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(secs).map(Duration::from_secs).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(parse_age("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_age("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_age("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_age("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["", "10", "m", "1w", "-1s", "1.5h", "99999999999999999999d"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn key_values() {
        assert_eq!(parse_key_value("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(parse_key_value("=x").is_err());
        assert!(parse_key_value("novalue").is_err());
    }

    #[test]
    fn grammar_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
