//! `sandbox reap`: list managed sandboxes on every reachable engine (including stopped
//! ones); kill them only with `--kill`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox::labels::LABEL_META_PREFIX;
use sandbox::{ManagedSandbox, SandboxError};
use serde::Serialize;

use crate::cli::ReapArgs;
use crate::doctor::{ENGINE_TIMEOUT, selected_engines};
use crate::output::Out;
use crate::{EXIT_FAILURE, EXIT_OK};

#[derive(Debug, Serialize)]
struct EngineStatus {
    backend: String,
    reachable: bool,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Entry {
    id: String,
    backend: String,
    state: String,
    created_at: Option<u64>,
    age_s: Option<u64>,
    labels: BTreeMap<String, String>,
    /// `null` when listing; whether it was killed (false: already gone) with `--kill`.
    killed: Option<bool>,
    /// Why killing failed.
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct ReapReport {
    kill: bool,
    engines: Vec<EngineStatus>,
    sandboxes: Vec<Entry>,
    /// `--id` values that matched nothing.
    not_found: Vec<String>,
}

pub async fn reap(args: ReapArgs, out: Out) -> sandbox::Result<u8> {
    let selected = selected_engines(&args.engines)?;
    let filter = args.label_map();
    let now = SystemTime::now();
    let mut report = ReapReport {
        kill: args.kill,
        engines: vec![],
        sandboxes: vec![],
        not_found: vec![],
    };
    let mut failed = false;
    let mut backends = Vec::new();
    for scheme in &selected {
        match list(scheme, &filter).await {
            Ok((backend, items)) => {
                report.engines.push(EngineStatus {
                    backend: scheme.clone(),
                    reachable: true,
                    error: None,
                });
                for m in items {
                    if keep(&m, &args, now) {
                        report.sandboxes.push(entry(&m, now));
                    }
                }
                backends.push((scheme.clone(), backend));
            }
            Err(e) => report.engines.push(EngineStatus {
                backend: scheme.clone(),
                reachable: false,
                error: Some(e.render()),
            }),
        }
    }
    report.not_found = args
        .ids
        .iter()
        .filter(|want| !report.sandboxes.iter().any(|s| matches_id(&s.id, want)))
        .cloned()
        .collect();
    if !report.not_found.is_empty() {
        failed = true;
    }
    if args.kill {
        for s in &mut report.sandboxes {
            let Some((_, backend)) = backends.iter().find(|(n, _)| *n == s.backend) else {
                continue;
            };
            let Some(r) = backend.as_reapable() else {
                continue;
            };
            match r.kill_managed(&s.id).await {
                Ok(k) => s.killed = Some(k),
                Err(e) => {
                    failed = true;
                    s.killed = Some(false);
                    s.error = Some(e.render());
                }
            }
        }
    }
    if report.engines.iter().all(|e| !e.reachable) {
        failed = true;
    }
    if out.json {
        out.json_value(&report);
    } else {
        print_human(&report, &out);
    }
    Ok(if failed { EXIT_FAILURE } else { EXIT_OK })
}

async fn list(
    scheme: &str,
    filter: &BTreeMap<String, String>,
) -> sandbox::Result<(std::sync::Arc<dyn sandbox::Backend>, Vec<ManagedSandbox>)> {
    let target = format!("{scheme}://");
    let backend = tokio::time::timeout(ENGINE_TIMEOUT, sandbox::backend(target.as_str()))
        .await
        .map_err(|_| timeout_error(scheme))??;
    let reapable = backend.as_reapable().ok_or_else(|| {
        SandboxError::config(
            format!("backend `{scheme}` cannot list managed sandboxes"),
            "use the engine's own tooling",
        )
    })?;
    let items = tokio::time::timeout(ENGINE_TIMEOUT, reapable.list_managed(filter))
        .await
        .map_err(|_| timeout_error(scheme))??;
    Ok((backend, items))
}

fn timeout_error(scheme: &str) -> SandboxError {
    SandboxError::EngineUnavailable {
        backend: scheme.to_string(),
        endpoint: "unknown".into(),
        hint: format!("check that the {scheme} engine is running and responsive"),
        source: None,
    }
}

fn keep(m: &ManagedSandbox, args: &ReapArgs, now: SystemTime) -> bool {
    if !args.ids.is_empty() && !args.ids.iter().any(|want| matches_id(&m.id, want)) {
        return false;
    }
    if let Some(min_age) = args.older_than {
        // Without a creation time the age cannot be proven: never reap it by age.
        match age(m, now) {
            Some(a) if a >= min_age => {}
            _ => return false,
        }
    }
    true
}

/// Exact id, or a prefix of at least 4 characters (Docker's short ids).
fn matches_id(id: &str, want: &str) -> bool {
    id == want || (want.len() >= 4 && id.starts_with(want))
}

fn age(m: &ManagedSandbox, now: SystemTime) -> Option<Duration> {
    m.created_at.and_then(|c| now.duration_since(c).ok())
}

fn entry(m: &ManagedSandbox, now: SystemTime) -> Entry {
    let state = serde_json::to_value(m.state)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| "unknown".into());
    Entry {
        id: m.id.clone(),
        backend: m.backend.clone(),
        state,
        created_at: m
            .created_at
            .and_then(|c| c.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs()),
        age_s: age(m, now).map(|d| d.as_secs()),
        labels: m.labels.clone(),
        killed: None,
        error: None,
    }
}

fn print_human(report: &ReapReport, out: &Out) {
    for e in &report.engines {
        if let Some(err) = &e.error {
            out.note(format!("{} {}: {err}", out.yellow("skipped"), e.backend));
        }
    }
    if report.sandboxes.is_empty() {
        out.line("no managed sandboxes");
    } else {
        out.line(out.bold(&format!(
            "{:<8} {:<14} {:<9} {:>8}  {}",
            "BACKEND", "ID", "STATE", "AGE", "METADATA"
        )));
        for s in &report.sandboxes {
            let meta: Vec<String> = s
                .labels
                .iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix(LABEL_META_PREFIX)
                        .map(|k| format!("{k}={v}"))
                })
                .collect();
            let age = s.age_s.map(human_age).unwrap_or_else(|| "?".into());
            let killed = match (s.killed, &s.error) {
                (_, Some(err)) => format!("  {} {err}", out.red("kill failed:")),
                (Some(true), _) => format!("  {}", out.green("killed")),
                (Some(false), _) => "  already gone".to_string(),
                (None, _) => String::new(),
            };
            out.line(format!(
                "{:<8} {:<14} {:<9} {:>8}  {}{killed}",
                s.backend,
                s.id.get(..12).unwrap_or(&s.id),
                s.state,
                age,
                meta.join(",")
            ));
        }
        if !report.kill {
            out.line("(listing only; add --kill to remove them)");
        }
    }
    for id in &report.not_found {
        out.note(format!(
            "{} no managed sandbox matches id {id}",
            out.red("error:")
        ));
    }
}

fn human_age(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_matching() {
        assert!(matches_id("abcdef123", "abcdef123"));
        assert!(matches_id("abcdef123", "abcd"));
        assert!(!matches_id("abcdef123", "abc"));
        assert!(!matches_id("abcdef123", "bcd"));
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(600), "10m");
        assert_eq!(human_age(7200), "2h");
        assert_eq!(human_age(172_800), "2d");
    }
}
