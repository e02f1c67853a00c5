//! The leak ledger: what an engine and the host hold before the load run and after it
//! (containers, networks, volumes, checkpoint and egress-state directories, host
//! processes, this process's descriptors and threads), read the same way both times.

use std::collections::BTreeSet;
use std::process::Stdio;

use serde::Serialize;
use tokio::process::Command;

use crate::cli::{Engine as CliEngine, find_program};
use crate::load::probe::{self, Engine};

/// One counted thing, before and after.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub what: String,
    pub before: Option<usize>,
    pub after: Option<usize>,
}

impl Line {
    /// What the run left behind (`None` when either reading failed).
    pub fn leaked(&self) -> Option<i64> {
        Some(self.after? as i64 - self.before? as i64)
    }
}

/// One reading of everything the ledger counts.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    pub items: Vec<(String, Option<usize>)>,
}

/// Lines of output of `<engine> args…` (`None` when it fails).
pub async fn cli_lines(engine: Engine, args: &[&str]) -> Option<usize> {
    let program = find_program(match engine {
        Engine::Docker => CliEngine::Docker,
        Engine::Podman => CliEngine::Podman,
    });
    let out = Command::new(program)
        .args(args)
        .env("PODMAN_IGNORE_CGROUPSV1_WARNING", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    })
}

/// Containers carrying `label` (`key=value`), running or not.
pub async fn containers(engine: Engine, label: &str) -> Option<usize> {
    cli_lines(
        engine,
        &["ps", "-a", "-q", "--filter", &format!("label={label}")],
    )
    .await
}

/// Reads the ledger. `ids` are every container id this run ever created (processes in
/// their cgroups after the end are leaks whatever the engine lists).
pub async fn read(engine: Engine, run_label: &str, ids: &BTreeSet<String>) -> Reading {
    let mut items = vec![
        (
            "containers of this run".to_string(),
            containers(engine, run_label).await,
        ),
        (
            "containers labelled io.sandbox-rs.managed (any program)".to_string(),
            containers(engine, "io.sandbox-rs.managed=true").await,
        ),
        (
            "networks (any program; this run creates none)".to_string(),
            cli_lines(engine, &["network", "ls", "-q"]).await,
        ),
        (
            "volumes (any program; this run creates none)".to_string(),
            cli_lines(engine, &["volume", "ls", "-q"]).await,
        ),
    ];
    if engine == Engine::Docker {
        items.push((
            "checkpoint directories (/var/lib/docker/containers/*/checkpoints/*)".into(),
            Some(probe::checkpoint_dirs(engine)),
        ));
        items.push((
            "container directories (/var/lib/docker/containers)".into(),
            Some(probe::entries("/var/lib/docker/containers")),
        ));
    } else {
        items.push((
            "container directories (/var/lib/containers/storage/overlay-containers)".into(),
            Some(probe::entries(
                "/var/lib/containers/storage/overlay-containers",
            )),
        ));
    }
    items.push((
        "egress state files (/run/sandbox-rs/egress)".into(),
        Some(probe::entries("/run/sandbox-rs/egress")),
    ));
    let (helpers, inside) = probe::host_processes(engine, ids);
    let helper = match engine {
        Engine::Docker => "host processes: containerd-shim (any container)",
        Engine::Podman => "host processes: conmon (any container)",
    };
    items.push((helper.into(), Some(helpers)));
    items.push((
        "host processes in this run's container cgroups".into(),
        Some(inside),
    ));
    let (_, fds, threads) = probe::own();
    items.push(("this process: open descriptors".into(), Some(fds)));
    items.push(("this process: threads".into(), Some(threads)));
    Reading { items }
}

/// Pairs two readings into ledger lines.
pub fn ledger(before: &Reading, after: &Reading) -> Vec<Line> {
    before
        .items
        .iter()
        .map(|(what, b)| Line {
            what: what.clone(),
            before: *b,
            after: after
                .items
                .iter()
                .find(|(w, _)| w == what)
                .and_then(|(_, a)| *a),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_pairs_by_name_and_counts_leaks() {
        let before = Reading {
            items: vec![("a".into(), Some(3)), ("b".into(), None)],
        };
        let after = Reading {
            items: vec![("b".into(), Some(1)), ("a".into(), Some(5))],
        };
        let l = ledger(&before, &after);
        assert_eq!(l[0].leaked(), Some(2));
        assert_eq!(l[1].leaked(), None);
    }
}
