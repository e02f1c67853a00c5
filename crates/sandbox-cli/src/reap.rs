//! `sandbox reap`: list managed sandboxes on every reachable engine (including stopped
//! ones); kill them only with `--kill`.
//!
//! The engine's label filter is not proof of anything: any image or any user of the
//! engine can put `io.sandbox-rs.managed=true` on a container. So every listed sandbox gets
//! a verdict before anything is removed:
//! - `foreign`: its labels are not the set sandbox-rs writes (session, owner, deadline
//!   consistent with the creation time); listed, never removed, not even with `--force`;
//! - `owner_gone`: its owner process is proven gone (same host, boot and pid namespace;
//!   see `Owner::is_proven_gone`);
//! - `expired`: its deadline has passed;
//! - `live`: anything else (owner alive, or on another host / namespace / unverifiable):
//!   removed only with `--force`.
//!
//! `--kill` with an `--id` prefix that matches several sandboxes removes nothing. The
//! whole command is bounded by [`REAP_BUDGET`].
//!
//! Snapshot images (`Sandbox::snapshot`) are listed too, and `--kill` removes them after
//! the sandboxes (a snapshot a sandbox still uses cannot go before it). They carry no
//! metadata and no owner: a `--label` or `--id` selection leaves them out, `--older-than`
//! applies to them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use sandbox::labels::LABEL_META_PREFIX;
use sandbox::{Backend, ManagedSandbox, Provenance, SandboxError, Snapshot};
use serde::Serialize;
use tokio::time::Instant;

use crate::cli::ReapArgs;
use crate::doctor::{ENGINE_TIMEOUT, selected_engines};
use crate::exit_code;
use crate::output::Out;
use crate::terminal::escape_text;

/// The whole `reap` (connecting, listing and killing on every engine) ends within this;
/// what is not done by then is reported as not done.
pub const REAP_BUDGET: Duration = Duration::from_secs(60);
/// One `kill_managed` call.
const KILL_TIMEOUT: Duration = Duration::from_secs(20);
/// Kills in flight at once.
const KILL_CONCURRENCY: usize = 4;

/// Time limits of one reap; tests shrink them.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Everything.
    pub budget: Duration,
    /// Connecting to or listing one engine.
    pub engine: Duration,
    /// One kill.
    pub kill: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            budget: REAP_BUDGET,
            engine: ENGINE_TIMEOUT,
            kill: KILL_TIMEOUT,
        }
    }
}

#[derive(Debug, Serialize)]
struct EngineStatus {
    backend: String,
    reachable: bool,
    error: Option<String>,
}

/// Why a sandbox may or may not be removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    /// The owner process is proven gone.
    OwnerGone,
    /// The deadline has passed.
    Expired,
    /// Owner alive or unverifiable, deadline ahead: only `--force` removes it.
    Live,
    /// Labels not as sandbox-rs sets them: never removed.
    Foreign,
}

#[derive(Debug, Serialize)]
struct Entry {
    id: String,
    backend: String,
    state: String,
    created_at: Option<u64>,
    age_s: Option<u64>,
    labels: BTreeMap<String, String>,
    /// Whether `reap --kill` removes it without `--force`, and why.
    verdict: Verdict,
    /// Why `--kill` left it alone (`null` when it was killed or when only listing).
    skipped: Option<String>,
    /// `null` when listing; whether it was killed (false: already gone) with `--kill`.
    killed: Option<bool>,
    /// Why killing failed.
    error: Option<String>,
}

/// One snapshot image in the report.
#[derive(Debug, Serialize)]
struct SnapshotEntry {
    /// The template (image reference).
    template: String,
    backend: String,
    /// The sandbox it was made from.
    source: String,
    created_at: Option<u64>,
    age_s: Option<u64>,
    /// `null` when listing; whether it was removed (false: already gone) with `--kill`.
    removed: Option<bool>,
    /// Why removing failed.
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Ambiguous {
    /// The `--id` value.
    id: String,
    /// Every sandbox id it is a prefix of.
    matches: Vec<String>,
}

#[derive(Debug, Serialize)]
struct ReapReport {
    kill: bool,
    force: bool,
    engines: Vec<EngineStatus>,
    sandboxes: Vec<Entry>,
    /// Snapshot images (none listed under a `--label` or `--id` selection).
    snapshots: Vec<SnapshotEntry>,
    /// `--id` values that matched nothing.
    not_found: Vec<String>,
    /// `--id` prefixes that matched several sandboxes (nothing is killed then).
    ambiguous: Vec<Ambiguous>,
}

/// One engine's listing, or why there is none.
type Listing = (
    String,
    sandbox::Result<(Arc<dyn Backend>, Vec<ManagedSandbox>)>,
);

pub async fn reap(args: ReapArgs, out: Out) -> sandbox::Result<u8> {
    let selected = selected_engines(&args.engines)?;
    let limits = Limits::default();
    let deadline = Instant::now() + limits.budget;
    let filter = args.label_map();
    let mut listings = Vec::new();
    for scheme in selected {
        let listed = list(&scheme, &filter, limits.engine, deadline).await;
        listings.push((scheme, listed));
    }
    let backends: Vec<Arc<dyn Backend>> = listings
        .iter()
        .filter_map(|(_, l)| l.as_ref().ok().map(|(b, _)| b.clone()))
        .collect();
    let (mut report, mut failed) = reap_listed(listings, &args, limits, deadline).await;
    if args.labels.is_empty() && args.ids.is_empty() {
        let (snapshots, snapshots_failed) =
            reap_snapshots(&backends, &args, limits, deadline).await;
        report.snapshots = snapshots;
        failed |= snapshots_failed;
    }
    if out.json {
        out.json_value(&report);
    } else {
        print_human(&report, &out);
    }
    Ok(if failed {
        exit_code::FAILURE
    } else {
        exit_code::OK
    })
}

/// Selects, judges and (with `--kill`) removes. Returns the report and whether the
/// command failed.
async fn reap_listed(
    listings: Vec<Listing>,
    args: &ReapArgs,
    limits: Limits,
    deadline: Instant,
) -> (ReapReport, bool) {
    let now = SystemTime::now();
    let mut report = ReapReport {
        kill: args.kill,
        force: args.force,
        engines: vec![],
        sandboxes: vec![],
        snapshots: vec![],
        not_found: vec![],
        ambiguous: vec![],
    };
    let mut backends = Vec::new();
    let mut everything = Vec::new();
    for (scheme, listed) in listings {
        match listed {
            Ok((backend, items)) => {
                report.engines.push(EngineStatus {
                    backend: scheme.clone(),
                    reachable: true,
                    error: None,
                });
                everything.extend(items);
                backends.push((scheme, backend));
            }
            Err(e) => report.engines.push(EngineStatus {
                backend: scheme,
                reachable: false,
                error: Some(e.render()),
            }),
        }
    }
    let wanted = resolve_ids(&args.ids, &everything);
    report.not_found = wanted.not_found;
    report.ambiguous = wanted.ambiguous;
    for m in &everything {
        if !args.ids.is_empty() && !wanted.ids.contains(&m.id) {
            continue;
        }
        if keep_by_age(m, args.older_than, now) {
            report.sandboxes.push(entry(m, now));
        }
    }
    let mut failed = !report.not_found.is_empty() || !report.ambiguous.is_empty();
    if report.engines.iter().all(|e| !e.reachable) {
        failed = true;
    }
    if args.kill {
        if report.ambiguous.is_empty() {
            failed |= kill_selected(
                &mut report.sandboxes,
                &backends,
                args.force,
                limits,
                deadline,
            )
            .await;
        } else {
            for s in &mut report.sandboxes {
                s.skipped = Some("an --id prefix is ambiguous: nothing was killed".into());
            }
        }
    }
    (report, failed)
}

/// Kills what the verdicts (and `--force`) allow, a few at a time, each kill bounded and
/// all of them by `deadline`. Returns whether any kill failed or did not finish.
async fn kill_selected(
    sandboxes: &mut [Entry],
    backends: &[(String, Arc<dyn Backend>)],
    force: bool,
    limits: Limits,
    deadline: Instant,
) -> bool {
    let mut jobs = Vec::new();
    for (i, s) in sandboxes.iter_mut().enumerate() {
        match (s.verdict, force) {
            (Verdict::Foreign, _) => {
                s.skipped = Some(
                    "its labels are not the ones sandbox-rs sets; if it is yours, remove it with the engine's own tooling"
                        .into(),
                );
                continue;
            }
            (Verdict::Live, false) => {
                s.skipped = Some(
                    "its owner is alive or unverifiable and its deadline has not passed; add --force to kill it anyway"
                        .into(),
                );
                continue;
            }
            _ => {}
        }
        match backends.iter().find(|(n, _)| *n == s.backend) {
            Some((_, b)) => jobs.push((i, b.clone(), s.id.clone())),
            None => s.skipped = Some("its engine is not selected".into()),
        }
    }
    let outcomes: Vec<(usize, sandbox::Result<bool>)> = futures::stream::iter(jobs)
        .map(|(i, backend, id)| async move {
            let until = deadline.min(Instant::now() + limits.kill);
            let killed = match backend.as_reapable() {
                Some(r) => tokio::time::timeout_at(until, r.kill_managed(&id))
                    .await
                    .unwrap_or_else(|_| {
                        Err(kill_timeout(backend.name(), until >= deadline, limits))
                    }),
                None => Err(SandboxError::config(
                    format!("backend `{}` cannot kill managed sandboxes", backend.name()),
                    "use the engine's own tooling",
                )),
            };
            (i, killed)
        })
        .buffer_unordered(KILL_CONCURRENCY)
        .collect()
        .await;
    let mut failed = false;
    for (i, outcome) in outcomes {
        let s = &mut sandboxes[i];
        match outcome {
            Ok(k) => s.killed = Some(k),
            Err(e) => {
                failed = true;
                s.killed = Some(false);
                s.error = Some(e.render());
            }
        }
    }
    failed
}

/// Lists every engine's snapshot images and, with `--kill`, removes them (after the
/// sandboxes: one a sandbox still uses cannot go). Returns them and whether a listing or
/// a removal failed.
async fn reap_snapshots(
    backends: &[Arc<dyn Backend>],
    args: &ReapArgs,
    limits: Limits,
    deadline: Instant,
) -> (Vec<SnapshotEntry>, bool) {
    let now = SystemTime::now();
    let mut out = Vec::new();
    let mut failed = false;
    for backend in backends {
        let Some(reapable) = backend.as_reapable() else {
            continue;
        };
        let until = deadline.min(Instant::now() + limits.engine);
        let listed: Vec<Snapshot> = match tokio::time::timeout_at(until, reapable.list_snapshots())
            .await
        {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                tracing::warn!(backend = backend.name(), error = %e.render(), "listing snapshots failed");
                failed = true;
                continue;
            }
            Err(_) => {
                failed = true;
                continue;
            }
        };
        for s in listed {
            let age = s.created_at.and_then(|c| now.duration_since(c).ok());
            let old_enough = match args.older_than {
                None => true,
                Some(min) => age.is_some_and(|a| a >= min),
            };
            if !old_enough {
                continue;
            }
            let mut e = SnapshotEntry {
                template: s.template.clone(),
                backend: s.backend.clone(),
                source: s.source.clone(),
                created_at: s.created_at.and_then(unix_secs),
                age_s: age.map(|a| a.as_secs()),
                removed: None,
                error: None,
            };
            if args.kill {
                let until = deadline.min(Instant::now() + limits.kill);
                match tokio::time::timeout_at(until, reapable.remove_snapshot(&s.template)).await {
                    Ok(Ok(r)) => e.removed = Some(r),
                    Ok(Err(err)) => {
                        failed = true;
                        e.removed = Some(false);
                        e.error = Some(err.render());
                    }
                    Err(_) => {
                        failed = true;
                        e.removed = Some(false);
                        e.error =
                            Some(kill_timeout(backend.name(), until >= deadline, limits).render());
                    }
                }
            }
            out.push(e);
        }
    }
    (out, failed)
}

fn kill_timeout(backend: &str, budget_ran_out: bool, limits: Limits) -> SandboxError {
    let why = if budget_ran_out {
        format!(
            "the reap time budget ({}s) ran out",
            limits.budget.as_secs_f64()
        )
    } else {
        format!(
            "the kill did not finish within {}s",
            limits.kill.as_secs_f64()
        )
    };
    SandboxError::engine_unavailable(
        backend.to_string(),
        "unknown",
        format!("{why}; check the {backend} engine and run `sandbox reap --kill` again"),
    )
}

async fn list(
    scheme: &str,
    filter: &BTreeMap<String, String>,
    each: Duration,
    deadline: Instant,
) -> sandbox::Result<(Arc<dyn Backend>, Vec<ManagedSandbox>)> {
    let target = format!("{scheme}://");
    let until = || deadline.min(Instant::now() + each);
    let backend = tokio::time::timeout_at(until(), sandbox::backend(target.as_str()))
        .await
        .map_err(|_| timeout_error(scheme))??;
    let reapable = backend.as_reapable().ok_or_else(|| {
        SandboxError::config(
            format!("backend `{scheme}` cannot list managed sandboxes"),
            "use the engine's own tooling",
        )
    })?;
    let items = tokio::time::timeout_at(until(), reapable.list_managed(filter))
        .await
        .map_err(|_| timeout_error(scheme))??;
    Ok((backend, items))
}

fn timeout_error(scheme: &str) -> SandboxError {
    SandboxError::engine_unavailable(
        scheme.to_string(),
        "unknown",
        format!("check that the {scheme} engine is running and responsive"),
    )
}

/// Which sandboxes the `--id` values name.
#[derive(Debug, Default)]
struct Wanted {
    ids: Vec<String>,
    not_found: Vec<String>,
    ambiguous: Vec<Ambiguous>,
}

/// An exact id wins; otherwise a prefix of at least 4 characters must name exactly one
/// sandbox across every engine: an ambiguous prefix is refused, never resolved to the
/// first match.
fn resolve_ids(wants: &[String], listed: &[ManagedSandbox]) -> Wanted {
    let mut w = Wanted::default();
    for want in wants {
        if listed.iter().any(|m| m.id == *want) {
            w.ids.push(want.clone());
            continue;
        }
        let matches: Vec<String> = listed
            .iter()
            .filter(|m| want.len() >= 4 && m.id.starts_with(want.as_str()))
            .map(|m| m.id.clone())
            .collect();
        match matches.len() {
            0 => w.not_found.push(want.clone()),
            1 => w.ids.extend(matches),
            _ => w.ambiguous.push(Ambiguous {
                id: want.clone(),
                matches,
            }),
        }
    }
    w
}

fn keep_by_age(m: &ManagedSandbox, older_than: Option<Duration>, now: SystemTime) -> bool {
    match older_than {
        None => true,
        // Without a creation time the age cannot be proven: never select it by age.
        Some(min_age) => age(m, now).is_some_and(|a| a >= min_age),
    }
}

/// The verdict core gives every tool that removes leftovers (the adapters' startup sweep
/// too), at the deadline itself: `reap` is asked for by a person, the sweep is not.
fn verdict(m: &ManagedSandbox, now: SystemTime) -> Verdict {
    match Provenance::of(&m.labels, m.created_at, now, Duration::ZERO) {
        Provenance::OwnerGone => Verdict::OwnerGone,
        Provenance::Expired => Verdict::Expired,
        Provenance::Live => Verdict::Live,
        // Foreign, and any verdict core adds later: never removed.
        _ => Verdict::Foreign,
    }
}

fn unix_secs(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
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
        created_at: m.created_at.and_then(unix_secs),
        age_s: age(m, now).map(|d| d.as_secs()),
        labels: m.labels.clone(),
        verdict: verdict(m, now),
        skipped: None,
        killed: None,
        error: None,
    }
}

fn print_human(report: &ReapReport, out: &Out) {
    for e in &report.engines {
        if let Some(err) = &e.error {
            out.note(format!(
                "{} {}: {}",
                out.yellow("skipped"),
                e.backend,
                escape_text(err)
            ));
        }
    }
    if report.sandboxes.is_empty() {
        out.line("no managed sandboxes");
    } else {
        out.line(out.bold(&format!(
            "{:<8} {:<14} {:<9} {:>8}  {:<10} {}",
            "BACKEND", "ID", "STATE", "AGE", "VERDICT", "METADATA"
        )));
        for s in &report.sandboxes {
            // Every field but ours comes from the engine, and labels from whoever created
            // the container: escaped, so a label cannot drive the terminal.
            let meta: Vec<String> = s
                .labels
                .iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix(LABEL_META_PREFIX)
                        .map(|k| escape_text(&format!("{k}={v}")))
                })
                .collect();
            let age = s.age_s.map(human_age).unwrap_or_else(|| "?".into());
            let outcome = match (s.killed, &s.error, &s.skipped) {
                (_, Some(err), _) => format!("  {} {}", out.red("kill failed:"), escape_text(err)),
                (Some(true), _, _) => format!("  {}", out.green("killed")),
                (Some(false), _, _) => "  already gone".to_string(),
                (None, _, Some(why)) => format!("  {} {why}", out.yellow("kept:")),
                (None, _, None) => String::new(),
            };
            out.line(format!(
                "{:<8} {:<14} {:<9} {:>8}  {:<10} {}{outcome}",
                escape_text(&s.backend),
                escape_text(s.id.get(..12).unwrap_or(&s.id)),
                escape_text(&s.state),
                age,
                verdict_name(s.verdict),
                meta.join(",")
            ));
        }
        if !report.kill {
            out.line(
                "(listing only; --kill removes owner_gone and expired ones, --kill --force also live ones; foreign ones never)",
            );
        }
    }
    for id in &report.not_found {
        out.note(format!(
            "{} no managed sandbox matches id {}",
            out.red("error:"),
            escape_text(id)
        ));
    }
    for a in &report.ambiguous {
        out.note(format!(
            "{} id prefix {} matches {} sandboxes ({}); give more characters",
            out.red("error:"),
            escape_text(&a.id),
            a.matches.len(),
            escape_text(&a.matches.join(", "))
        ));
    }
    if !report.snapshots.is_empty() {
        out.line(out.bold(&format!(
            "{:<8} {:<60} {:>8}  {}",
            "BACKEND", "SNAPSHOT", "AGE", "SOURCE"
        )));
        for s in &report.snapshots {
            let age = s.age_s.map(human_age).unwrap_or_else(|| "?".into());
            let outcome = match (s.removed, &s.error) {
                (_, Some(err)) => format!("  {} {}", out.red("remove failed:"), escape_text(err)),
                (Some(true), _) => format!("  {}", out.green("removed")),
                (Some(false), _) => "  already gone".to_string(),
                (None, None) => String::new(),
            };
            out.line(format!(
                "{:<8} {:<60} {:>8}  {}{outcome}",
                escape_text(&s.backend),
                escape_text(&s.template),
                age,
                escape_text(s.source.get(..12).unwrap_or(&s.source)),
            ));
        }
    }
}

fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::OwnerGone => "owner_gone",
        Verdict::Expired => "expired",
        Verdict::Live => "live",
        Verdict::Foreign => "foreign",
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
    use crate::cli::{Cli, Cmd};
    use clap::Parser;
    use sandbox::labels::{LABEL_MANAGED, LABEL_OWNER, Owner};
    use sandbox::labels::{sandbox_labels, unix_now};
    use sandbox::{CreateOptions, ReapableBackend, SandboxState};

    fn args(flags: &[&str]) -> ReapArgs {
        let argv = ["sandbox", "reap"].iter().chain(flags);
        match Cli::try_parse_from(argv).expect("valid flags").command {
            Cmd::Reap(a) => a,
            other => panic!("parsed {other:?}"),
        }
    }

    fn ago(secs: u64) -> SystemTime {
        SystemTime::now() - Duration::from_secs(secs)
    }

    /// A sandbox with the labels sandbox-rs sets, owned by `owner`.
    fn ours(id: &str, owner: &Owner, created: SystemTime, deadline: u64) -> ManagedSandbox {
        let mut labels = sandbox_labels("fake", deadline, &BTreeMap::new());
        labels.insert(LABEL_OWNER.into(), owner.to_label());
        ManagedSandbox::new(id, "fake", SandboxState::Running, Some(created), labels)
    }

    /// This machine's own process, with another start time: proven gone.
    fn dead_owner() -> Owner {
        let me = Owner::current();
        Owner {
            start_time: me.start_time + 1,
            ..me.clone()
        }
    }

    fn soon() -> u64 {
        unix_now() + 600
    }

    fn killed_ids(fake: &sandbox::fake::FakeBackend) -> Vec<String> {
        let mut ids: Vec<String> = fake
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                sandbox::fake::Call::KillManaged { sandbox_id } => Some(sandbox_id),
                _ => None,
            })
            .collect();
        ids.sort();
        ids
    }

    async fn listing(
        fake: &sandbox::fake::FakeBackend,
        extra: Vec<ManagedSandbox>,
    ) -> Vec<Listing> {
        let mut items = fake
            .list_managed(&BTreeMap::new())
            .await
            .expect("fake lists");
        items.extend(extra);
        vec![(
            "fake".into(),
            Ok((Arc::new(fake.clone()) as Arc<dyn Backend>, items)),
        )]
    }

    async fn reap_fake(
        fake: &sandbox::fake::FakeBackend,
        extra: Vec<ManagedSandbox>,
        flags: &[&str],
        limits: Limits,
    ) -> (ReapReport, bool) {
        let deadline = Instant::now() + limits.budget;
        reap_listed(listing(fake, extra).await, &args(flags), limits, deadline).await
    }

    fn verdict_of(report: &ReapReport, id: &str) -> Verdict {
        report
            .sandboxes
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.verdict)
            .unwrap_or_else(|| panic!("{id} not listed"))
    }

    /// The cast of `kill_by_default_*`: one of every verdict.
    fn cast() -> Vec<ManagedSandbox> {
        let me = Owner::current();
        let mut foreign = BTreeMap::new();
        foreign.insert(LABEL_MANAGED.to_string(), "true".to_string());
        let mut baked = sandbox_labels("fake", 1, &BTreeMap::new());
        baked.insert(LABEL_OWNER.into(), dead_owner().to_label());
        let mut old_owner = sandbox_labels("fake", soon(), &BTreeMap::new());
        old_owner.insert(
            LABEL_OWNER.into(),
            format!("{}/{}/{}", me.host, me.pid, me.start_time + 1),
        );
        vec![
            ours("gone-0001", &dead_owner(), ago(60), soon()),
            ours("expired-0001", me, ago(100), unix_now() - 10),
            ManagedSandbox::new(
                "labelonly-0001",
                "fake",
                SandboxState::Running,
                Some(ago(60)),
                foreign,
            ),
            // An image that carries our labels with a deadline in the past: it does not
            // fit the container's creation time.
            ManagedSandbox::new(
                "baked-0001",
                "fake",
                SandboxState::Running,
                Some(ago(60)),
                baked,
            ),
            // An old-format owner label cannot be verified: live, not gone.
            ManagedSandbox::new(
                "oldlabel-0001",
                "fake",
                SandboxState::Running,
                Some(ago(60)),
                old_owner,
            ),
        ]
    }

    #[tokio::test]
    async fn kill_by_default_removes_only_owner_gone_and_expired() {
        let fake = sandbox::fake::FakeBackend::new();
        // A live sandbox of this very process: owner alive, deadline ahead.
        let live = fake.create(CreateOptions::default()).await.unwrap();
        let (report, failed) = reap_fake(&fake, cast(), &["--kill"], Limits::default()).await;
        assert!(!failed, "{report:#?}");
        assert_eq!(verdict_of(&report, live.id()), Verdict::Live);
        assert_eq!(verdict_of(&report, "gone-0001"), Verdict::OwnerGone);
        assert_eq!(verdict_of(&report, "expired-0001"), Verdict::Expired);
        assert_eq!(verdict_of(&report, "labelonly-0001"), Verdict::Foreign);
        assert_eq!(verdict_of(&report, "baked-0001"), Verdict::Foreign);
        assert_eq!(verdict_of(&report, "oldlabel-0001"), Verdict::Live);
        assert_eq!(killed_ids(&fake), ["expired-0001", "gone-0001"]);
        for s in &report.sandboxes {
            let spared = s.killed.is_none();
            assert_eq!(spared, s.skipped.is_some(), "{s:?}");
        }
        // The live one is still there and usable.
        assert!(
            live.run("true".into(), Default::default())
                .await
                .unwrap()
                .ok()
        );
    }

    #[tokio::test]
    async fn force_kills_live_sandboxes_but_never_foreign_ones() {
        let fake = sandbox::fake::FakeBackend::new();
        let live = fake.create(CreateOptions::default()).await.unwrap();
        let (report, failed) =
            reap_fake(&fake, cast(), &["--kill", "--force"], Limits::default()).await;
        assert!(!failed, "{report:#?}");
        let mut want = vec![
            "expired-0001".to_string(),
            "gone-0001".into(),
            "oldlabel-0001".into(),
            live.id().to_string(),
        ];
        want.sort();
        assert_eq!(killed_ids(&fake), want);
        assert!(
            fake.list_managed(&BTreeMap::new())
                .await
                .unwrap()
                .is_empty(),
            "the live fake sandbox was killed"
        );
    }

    #[tokio::test]
    async fn listing_kills_nothing() {
        let fake = sandbox::fake::FakeBackend::new();
        let (report, failed) = reap_fake(&fake, cast(), &[], Limits::default()).await;
        assert!(!failed);
        assert_eq!(report.sandboxes.len(), 5);
        assert!(killed_ids(&fake).is_empty());
    }

    #[test]
    fn force_requires_kill() {
        assert!(Cli::try_parse_from(["sandbox", "reap", "--force"]).is_err());
    }

    #[tokio::test]
    async fn an_ambiguous_id_prefix_kills_nothing() {
        let fake = sandbox::fake::FakeBackend::new();
        let two = vec![
            ours("abcd1111", &dead_owner(), ago(60), soon()),
            ours("abcd2222", &dead_owner(), ago(60), soon()),
        ];
        let (report, failed) = reap_fake(
            &fake,
            two.clone(),
            &["--kill", "--id", "abcd"],
            Limits::default(),
        )
        .await;
        assert!(failed);
        assert_eq!(report.ambiguous.len(), 1, "{report:#?}");
        assert_eq!(report.ambiguous[0].matches, ["abcd1111", "abcd2222"]);
        assert!(killed_ids(&fake).is_empty(), "nothing killed");
        // A longer prefix names one, and only that one is killed.
        let (report, failed) =
            reap_fake(&fake, two, &["--kill", "--id", "abcd2"], Limits::default()).await;
        assert!(!failed, "{report:#?}");
        assert_eq!(killed_ids(&fake), ["abcd2222"]);
    }

    #[test]
    fn an_exact_id_wins_over_prefixes() {
        let listed = vec![
            ours("abcd", Owner::current(), ago(1), soon()),
            ours("abcdef", Owner::current(), ago(1), soon()),
        ];
        let w = resolve_ids(&["abcd".into(), "abc".into(), "zzzz".into()], &listed);
        assert_eq!(w.ids, ["abcd"]);
        assert_eq!(w.not_found, ["abc", "zzzz"], "short prefixes match nothing");
        assert!(w.ambiguous.is_empty());
    }

    #[tokio::test]
    async fn a_hanging_kill_is_bounded() {
        let fake = sandbox::fake::FakeBackend::new();
        let _live = fake.create(CreateOptions::default()).await.unwrap();
        fake.faults().set_kill_hang(true);
        let limits = Limits {
            budget: Duration::from_secs(30),
            engine: Duration::from_secs(1),
            kill: Duration::from_millis(300),
        };
        let started = std::time::Instant::now();
        let (report, failed) = reap_fake(&fake, vec![], &["--kill", "--force"], limits).await;
        assert!(failed);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(report.sandboxes[0].error.is_some(), "{report:#?}");
        fake.faults().heal();
    }

    #[tokio::test]
    async fn the_whole_kill_is_bounded_by_the_budget() {
        let fake = sandbox::fake::FakeBackend::new();
        let mut keep = Vec::new();
        for _ in 0..10 {
            keep.push(fake.create(CreateOptions::default()).await.unwrap());
        }
        fake.faults().set_kill_hang(true);
        let limits = Limits {
            budget: Duration::from_millis(500),
            engine: Duration::from_secs(1),
            kill: Duration::from_secs(30),
        };
        let started = std::time::Instant::now();
        let (report, failed) = reap_fake(&fake, vec![], &["--kill", "--force"], limits).await;
        assert!(failed);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(report.sandboxes.len(), 10);
        assert!(
            report.sandboxes.iter().all(|s| s.error.is_some()),
            "{report:#?}"
        );
        fake.faults().heal();
        drop(keep);
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(600), "10m");
        assert_eq!(human_age(7200), "2h");
        assert_eq!(human_age(172_800), "2d");
    }

    #[tokio::test]
    async fn snapshots_are_listed_and_removed_with_kill_but_not_under_a_selection() {
        let fake = sandbox::fake::FakeBackend::new();
        let sb = fake.create(CreateOptions::default()).await.expect("create");
        let snap = sb.snapshot().await.expect("snapshot");
        sb.kill().await.expect("kill");
        let backends = vec![Arc::new(fake.clone()) as Arc<dyn Backend>];
        let limits = Limits::default();
        let deadline = Instant::now() + limits.budget;
        let (listed, failed) = reap_snapshots(&backends, &args(&[]), limits, deadline).await;
        assert!(!failed);
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].template.as_str(), listed[0].removed),
            (snap.template.as_str(), None)
        );
        let (young, _) = reap_snapshots(
            &backends,
            &args(&["--kill", "--older-than", "1d"]),
            limits,
            deadline,
        )
        .await;
        assert!(
            young.is_empty(),
            "younger than --older-than: neither listed nor removed"
        );
        let (killed, failed) =
            reap_snapshots(&backends, &args(&["--kill"]), limits, deadline).await;
        assert!(!failed);
        assert_eq!(killed[0].removed, Some(true));
        assert!(
            fake.list_snapshots().await.expect("list").is_empty(),
            "removed"
        );
    }
}
