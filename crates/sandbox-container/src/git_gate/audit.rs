//! The gate's audit records: one `git.request` per request it answers, served or refused,
//! written to the sinks of the layer the sandbox was created under (the reporter the gate
//! took during that create, which also hides the gate's token).
//!
//! A record names the repository by its name in the gate's URLs (never its host path),
//! the service asked for (`git-upload-pack`: a fetch or clone; `git-receive-pack`: a
//! push), the status answered and, for a push, the refs it asked to update. What the
//! sandbox wrote — method, path, ref names, a refusal's text that quotes them — is capped.
//! A request the gate refuses itself is recorded at once, as an error with its code; one
//! the backend answers is recorded when the backend ends, after a push's refs were read
//! back from the repository: it is an error when git did not land every update.

use std::path::Path;
use std::time::{Duration, SystemTime};

use hyper::{Request, StatusCode};
use sandbox_core::ErrorCode;
use sandbox_core::layer::{AuditRecord, EventReporter, Outcome};

use super::http::{Endpoint, RefUpdate};
use super::{Gate, Served};

/// Most refs one record lists (then one entry says how many more there were).
pub(super) const MAX_REFS: usize = 32;
/// Longest ref name a record keeps.
pub(super) const MAX_REF: usize = 255;
/// Longest method a record keeps.
const MAX_METHOD: usize = 32;
/// Longest path a record keeps.
const MAX_PATH: usize = 1024;
/// Longest error text a record keeps (a refusal quotes the ref it refused).
const MAX_ERROR: usize = 1024;
/// Longest the read-back of a push's refs may take.
const READ_BACK_TIME: Duration = Duration::from_secs(30);

/// The record of one request, until it is written; nothing when no sink reads it.
pub(super) struct Audit(Option<Box<Pending>>);

struct Pending {
    events: EventReporter,
    sandbox_id: String,
    started: SystemTime,
    method: String,
    path: String,
    repo: Option<String>,
    request: Option<&'static str>,
    refs: Option<Vec<String>>,
}

impl Audit {
    /// The record of `req`, started now (its method and path, capped).
    pub(super) fn begin<B>(gate: &Gate, req: &Request<B>) -> Audit {
        if !gate.events.is_active() {
            return Audit(None);
        }
        Audit(Some(Box::new(Pending {
            events: gate.events.clone(),
            sandbox_id: gate.sandbox_id.clone(),
            started: SystemTime::now(),
            method: AuditRecord::capped(req.method().as_str(), MAX_METHOD),
            path: AuditRecord::capped(req.uri().path(), MAX_PATH),
            repo: None,
            request: None,
            refs: None,
        })))
    }

    /// Whether the record will be written (a sink reads it).
    pub(super) fn is_active(&self) -> bool {
        self.0.is_some()
    }

    /// The repository and service the request asked for.
    pub(super) fn routed(&mut self, repo: &Served, endpoint: Endpoint) {
        if let Some(p) = self.0.as_mut() {
            p.repo = Some(repo.name.clone());
            p.request = Some(match endpoint {
                Endpoint::Refs { push: false } | Endpoint::UploadPack => "git-upload-pack",
                Endpoint::Refs { push: true } | Endpoint::ReceivePack => "git-receive-pack",
            });
        }
    }

    /// The ref updates a push asked for.
    pub(super) fn refs(&mut self, updates: &[RefUpdate]) {
        if let Some(p) = self.0.as_mut() {
            let names: Vec<String> = updates.iter().map(|u| u.name.clone()).collect();
            p.refs = Some(recorded_refs(&names));
        }
    }

    /// The record, leaving an inactive one here (for the task that writes it).
    pub(super) fn take(&mut self) -> Audit {
        Audit(self.0.take())
    }

    /// Writes the record of a request the gate refused itself, answered `status`.
    pub(super) fn refused(self, status: StatusCode, code: ErrorCode, why: &str) {
        self.write(status, Some((Some(code), why.to_string())));
    }

    /// Writes the record of a request that failed on the host side, answered `status`.
    pub(super) fn failed(self, status: StatusCode, why: &str) {
        self.write(status, Some((None, why.to_string())));
    }

    /// Writes the record of a request the backend answered with `status`; `failure` says
    /// what went wrong after all (the backend failed, a push did not land).
    pub(super) fn served(self, status: StatusCode, failure: Option<String>) {
        self.write(status, failure.map(|why| (None, why)));
    }

    fn write(self, status: StatusCode, error: Option<(Option<ErrorCode>, String)>) {
        let Some(p) = self.0 else { return };
        let mut r = p.events.record("git.request", &p.sandbox_id, p.started);
        r.method = Some(p.method);
        r.path = Some(p.path);
        r.repo = p.repo;
        r.request = p.request.map(str::to_string);
        r.refs = p.refs;
        r.status = Some(status.as_u16());
        if let Some((code, why)) = error {
            r.outcome = Outcome::Error;
            r.error_code = code.map(ErrorCode::as_str);
            r.error = Some(AuditRecord::capped(why, MAX_ERROR));
        }
        p.events.report(r);
    }
}

/// The refs of a push as its record lists them: the first [`MAX_REFS`], each cut at
/// [`MAX_REF`] bytes, then `… N more` when there were more.
pub(super) fn recorded_refs(refs: &[String]) -> Vec<String> {
    let mut kept: Vec<String> = refs
        .iter()
        .take(MAX_REFS)
        .map(|r| AuditRecord::capped(r.as_str(), MAX_REF))
        .collect();
    if refs.len() > MAX_REFS {
        kept.push(format!("… {} more", refs.len() - MAX_REFS));
    }
    kept
}

/// The updates of a push that the repository does not show after the backend ended (a
/// ref not at its new object, a deleted one still there), read back with `git
/// for-each-ref` under the sandbox's prefix (every update the gate let through is under
/// it); `Err` with why when the refs cannot be read.
pub(super) async fn not_landed(
    git_dir: &Path,
    prefix: &str,
    updates: &[RefUpdate],
) -> Result<Vec<String>, String> {
    let read = tokio::process::Command::new("git")
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["for-each-ref", "--format=%(objectname) %(refname)", prefix])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(READ_BACK_TIME, read).await {
        Ok(Ok(out)) if out.status.success() => out,
        Ok(Ok(out)) => return Err(format!("git for-each-ref exited with {}", out.status)),
        Ok(Err(e)) => return Err(format!("git for-each-ref cannot run: {e}")),
        Err(_) => return Err("git for-each-ref did not answer in time".into()),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let now: std::collections::HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(oid, name)| (name, oid))
        .collect();
    Ok(updates
        .iter()
        .filter(|u| {
            let deleted = u.new.bytes().all(|b| b == b'0');
            match now.get(u.name.as_str()) {
                Some(oid) => deleted || !oid.eq_ignore_ascii_case(&u.new),
                None => !deleted,
            }
        })
        .map(|u| u.name.clone())
        .collect())
}
