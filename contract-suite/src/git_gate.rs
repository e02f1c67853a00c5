//! Contract trials: the git gate (`GIT_GATE`).
//!
//! What a declared `GIT_GATE` promises, against a bare repository the trial makes with
//! `git` on this host: a program inside the sandbox speaking git's smart HTTP to
//! `$SANDBOX_GIT_URL` (python's `http.client`, so the template needs no git) reads the
//! refs and fetches a pack; a push under the sandbox's prefix lands (checked on the host
//! with `git`); a push outside it, a delete outside it, a tag, a `..` ref, a sibling
//! sandbox's prefix and an atomic push mixing one inside with one outside are refused and
//! the repository's refs are unchanged; a read-only sandbox's push is refused; no token,
//! a wrong token and another sandbox's token get 401; the repository's config, `HEAD`
//! and object files are not served; after kill nothing of the gate is left on the host
//! (its hooks directory, a backend process). The sandboxes are created through the layer
//! with an audit sink: each request is one `git.request` record (the fetch served, the
//! push under the prefix landed with its ref, every refusal an error with its code and
//! status), and no record holds the token, the repository's host path or its config.
//! Without `GIT_GATE` a create asking for it is refused with `CapabilityNotSupported`
//! (`capabilities::every_undeclared_flag_refuses`).
//!
//! The trial needs `git` (with `git http-backend`) on the host and `python3` in the
//! template; without git it is ignored with the reason.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::layer::{AuditRecord, Layer, MemorySink, Outcome};
use sandbox_core::{Capability as C, ErrorCode, GitAccess, GitRepo, Sandbox};
use tokio::process::Command;

use crate::ctx::{Ctx, Need, Skip, must_code, records_when, sbx};

/// Requests the probe makes: refs, fetch, seven pushes, three token checks, three files.
const PROBE_REQUESTS: usize = 15;

const AREA: &str = "git_gate";

/// The program run inside: every request as raw smart HTTP, one `name value…` line per
/// result. Arguments: the sandbox's id, the commits of `main` and of its parent, and a
/// token of another sandbox.
pub const PROBE: &str = r#"
import base64, hashlib, http.client, os, struct, sys, urllib.parse
u = urllib.parse.urlsplit(os.environ["SANDBOX_GIT_URL"])
host, port, path, token = u.hostname, u.port, u.path, u.password
sid, head, parent, other = sys.argv[1:5]
Z = "0" * 40
def call(method, p, body=None, tok=token, ctype=None):
    c = http.client.HTTPConnection(host, port, timeout=30)
    h = {}
    if tok is not None:
        h["Authorization"] = "Basic " + base64.b64encode(("sandbox:" + tok).encode()).decode()
    if ctype:
        h["Content-Type"] = ctype
    try:
        c.request(method, p, body=body, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    except Exception as e:
        return 0, str(e).encode()
def pkt(s):
    b = s.encode()
    return b"%04x" % (len(b) + 4) + b
def push(cmds):
    body = pkt(cmds[0] + "\0report-status delete-refs\n") + b"".join(pkt(c + "\n") for c in cmds[1:]) + b"0000"
    if any(c.split()[1] != Z for c in cmds):
        h = b"PACK" + struct.pack(">II", 2, 0)
        body += h + hashlib.sha1(h).digest()
    st, out = call("POST", path + "/git-receive-pack", body, ctype="application/x-git-receive-pack-request")
    landed = [c.split()[2] for c in cmds if ("ok " + c.split()[2]).encode() in out]
    return "%d %s" % (st, ",".join(landed) or "none")
refs = path + "/info/refs?service=git-upload-pack"
st, out = call("GET", refs)
print("refs", st, head.encode() in out)
want = pkt("want " + head + "\n") + b"0000" + pkt("done\n")
st, out = call("POST", path + "/git-upload-pack", want, ctype="application/x-git-upload-pack-request")
print("fetch", st, b"PACK" in out)
print("push_in", push([Z + " " + head + " refs/heads/sandbox/" + sid + "/work"]))
print("push_out", push([head + " " + parent + " refs/heads/main"]))
print("delete_out", push([head + " " + Z + " refs/heads/main"]))
print("tag", push([Z + " " + head + " refs/tags/v1"]))
print("dotdot", push([Z + " " + head + " refs/heads/sandbox/" + sid + "/../../x"]))
print("sibling", push([Z + " " + head + " refs/heads/sandbox/" + sid + "x/y"]))
print("mixed", push([Z + " " + head + " refs/heads/sandbox/" + sid + "/m", Z + " " + head + " refs/heads/m2"]))
print("no_token", call("GET", refs, tok=None)[0])
print("wrong_token", call("GET", refs, tok="0" * 64)[0])
print("other_token", call("GET", refs, tok=other)[0])
print("config", call("GET", path + "/config")[0])
print("head_file", call("GET", path + "/HEAD")[0])
print("packs_file", call("GET", path + "/objects/info/packs")[0])
"#;

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    // Undeclared, the trial checks the refusal instead (never an ignored trial).
    let declared = ctx.caps.contains(C::GIT_GATE);
    let needs: &[Need] = if declared {
        &[Need::Cap(C::GIT_GATE | C::RUN_COMMAND | C::FILESYSTEM)]
    } else {
        &[]
    };
    vec![ctx.trial(
        AREA,
        "the_sandbox_pushes_under_its_prefix_and_nowhere_else",
        needs,
        the_sandbox_pushes_under_its_prefix_and_nowhere_else,
    )]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

async fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args([
            "-c",
            "user.name=contract",
            "-c",
            "user.email=contract@example.invalid",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .await
        .map_err(|e| Skip(format!("git cannot run ({e}): install git on the host")))?;
    ensure!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A bare repository with two commits on `main` and a remote with credentials in its
/// config (which must never be served); its path, and the commits of `main` and its
/// parent.
async fn bare_repo(dir: &Path) -> anyhow::Result<(std::path::PathBuf, String, String)> {
    let work = dir.join("work");
    std::fs::create_dir(&work)?;
    git(&work, &["init", "-q"]).await?;
    for (i, f) in ["a.txt", "b.txt"].iter().enumerate() {
        std::fs::write(work.join(f), format!("{i}\n"))?;
        git(&work, &["add", f]).await?;
        git(&work, &["commit", "-qm", f]).await?;
    }
    git(dir, &["clone", "-q", "--bare", "work", "origin.git"]).await?;
    let origin = dir.join("origin.git");
    git(
        &origin,
        &[
            "remote",
            "add",
            "upstream",
            "https://user:hunter2-secret@git.example.invalid/x.git",
        ],
    )
    .await?;
    let head = git(&origin, &["rev-parse", "refs/heads/main"]).await?;
    let parent = git(&origin, &["rev-parse", "refs/heads/main~1"]).await?;
    Ok((origin, head, parent))
}

/// Names of the gates' hooks directories now on this host.
fn hooks_dirs() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sbx-git-gate-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Whether a `git http-backend` of this host runs with `needle` in its environment.
fn backend_running_with(needle: &str) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.filter_map(|e| e.ok()).any(|e| {
        let p = e.path();
        let cmd = std::fs::read(p.join("cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmd).contains("http-backend")
            && String::from_utf8_lossy(&std::fs::read(p.join("environ")).unwrap_or_default())
                .contains(needle)
    })
}

/// The gate's URL variable inside `sb`.
async fn url_in(sb: &dyn Sandbox) -> anyhow::Result<String> {
    let out = crate::ctx::run_ok(sb, ["printenv", sandbox_core::git_gate::GIT_URL_VAR]).await?;
    Ok(out.trim().to_string())
}

/// See the module documentation.
async fn the_sandbox_pushes_under_its_prefix_and_nowhere_else(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("the_sandbox_pushes_under_its_prefix_and_nowhere_else");
    let tmp = tempfile::tempdir().context("temp dir")?;
    if !ctx.caps.contains(C::GIT_GATE) {
        let opts = ctx
            .opts(&c)
            .git_repo(GitRepo::new(tmp.path(), GitAccess::ReadWrite));
        must_code(
            ctx.backend.create(opts).await,
            ErrorCode::CapabilityNotSupported,
        )
        .context("create with a git repository where GIT_GATE is undeclared")?;
        return Ok(());
    }
    let (origin, head, parent) = bare_repo(tmp.path()).await?;
    let before = hooks_dirs();
    let sink = Arc::new(MemorySink::new());
    let audited = Layer::new().audit(sink.clone()).wrap(ctx.backend.clone());
    let rw = ctx
        .create_on(
            &audited,
            &c,
            ctx.opts(&c)
                .git_repo(GitRepo::new(&origin, GitAccess::ReadWrite)),
        )
        .await?;
    let ro = ctx
        .create_on(
            &audited,
            &c,
            ctx.opts(&c)
                .git_repo(GitRepo::new(&origin, GitAccess::ReadOnly)),
        )
        .await?;
    let rw_token = password_of(&url_in(&*rw).await?).context("the sandbox's URL")?;
    let ro_url = url_in(&*ro).await?;
    let ro_token = password_of(&ro_url).context("the read-only sandbox's URL")?;
    let id = rw.id().to_string();
    sbx(
        sbx(rw.files(), "files")?
            .write("/tmp/git_probe.py", Bytes::from_static(PROBE.as_bytes()))
            .await,
        "write the probe",
    )?;
    let r = crate::ctx::run(
        &*rw,
        [
            "python3",
            "/tmp/git_probe.py",
            id.as_str(),
            head.as_str(),
            parent.as_str(),
            ro_token.as_str(),
        ],
    )
    .await?;
    ensure!(
        r.exit_code == 0,
        "probe exited {}: {}",
        r.exit_code,
        r.stderr_text()
    );
    let out: BTreeMap<String, String> = r
        .stdout_text()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let get = |k: &str| out.get(k).map(String::as_str).unwrap_or("<missing>");
    ensure!(get("refs") == "200 True", "info/refs: {}", get("refs"));
    ensure!(get("fetch") == "200 True", "upload-pack: {}", get("fetch"));
    let inside = format!("refs/heads/sandbox/{id}/work");
    ensure!(
        get("push_in") == format!("200 {inside}"),
        "a push under the prefix: {}",
        get("push_in")
    );
    ensure!(
        git(&origin, &["rev-parse", &inside]).await? == head,
        "the push under the prefix did not land"
    );
    for refused in [
        "push_out",
        "delete_out",
        "tag",
        "dotdot",
        "sibling",
        "mixed",
    ] {
        ensure!(
            get(refused).ends_with(" none"),
            "{refused} must land nothing, got {}",
            get(refused)
        );
    }
    for (what, code) in [
        ("no_token", "401"),
        ("wrong_token", "401"),
        ("other_token", "401"),
        ("config", "404"),
        ("head_file", "404"),
        ("packs_file", "404"),
    ] {
        ensure!(get(what) == code, "{what}: {} (want {code})", get(what));
    }
    let refs = git(
        &origin,
        &["for-each-ref", "--format=%(refname) %(objectname)"],
    )
    .await?;
    ensure!(
        refs == format!("refs/heads/main {head}\n{inside} {head}"),
        "the repository's refs changed beyond the push under the prefix: {refs}"
    );
    // Read-only: the same push is refused.
    let ro_id = ro.id().to_string();
    sbx(
        sbx(ro.files(), "files")?
            .write("/tmp/git_probe.py", Bytes::from_static(PROBE.as_bytes()))
            .await,
        "write the probe",
    )?;
    let r = crate::ctx::run(
        &*ro,
        [
            "python3",
            "/tmp/git_probe.py",
            ro_id.as_str(),
            head.as_str(),
            parent.as_str(),
            "x",
        ],
    )
    .await?;
    let ro_push = r
        .stdout_text()
        .lines()
        .find_map(|l| l.strip_prefix("push_in ").map(str::to_string))
        .unwrap_or_default();
    ensure!(
        ro_push == "403 none",
        "a read-only sandbox's push: {ro_push:?} ({})",
        r.stderr_text()
    );
    let restarted = rw.capabilities().contains(C::STOP_START);
    if restarted {
        // A start runs a new agent: the creating handle opens the gate's port again.
        sbx(rw.stop().await, "stop")?;
        sbx(rw.start().await, "start")?;
        let again = crate::ctx::run_ok(
            &*rw,
            [
                "python3",
                "-c",
                "import os,urllib.parse as p,http.client as h,base64 as b;\
                 u=p.urlsplit(os.environ['SANDBOX_GIT_URL']);c=h.HTTPConnection(u.hostname,u.port,timeout=20);\
                 c.request('GET',u.path+'/info/refs?service=git-upload-pack',headers={'Authorization':'Basic '+b.b64encode(('s:'+u.password).encode()).decode()});\
                 print(c.getresponse().status)",
            ],
        )
        .await?;
        ensure!(again.trim() == "200", "after stop and start: {again}");
    }
    rw.kill().await?;
    ro.kill().await?;
    if ctx.backend.as_reapable().is_some() && !ctx.listed(&c).await?.is_empty() {
        bail!("a sandbox is still listed after kill");
    }
    let secrets = [
        rw_token.as_str(),
        ro_token.as_str(),
        "hunter2-secret",
        tmp.path().to_str().unwrap_or("/"),
    ];
    let expected = PROBE_REQUESTS + usize::from(restarted);
    let records = records_when(&sink, "git.request", &id, |r| r.len() >= expected).await;
    audited_as_served_and_refused(&records, expected, &id, &inside, &secrets)?;
    let ro_records =
        records_when(&sink, "git.request", &ro_id, |r| r.len() >= PROBE_REQUESTS).await;
    let ro_push = ro_records
        .iter()
        .find(|r| {
            r.method.as_deref() == Some("POST") && r.request.as_deref() == Some("git-receive-pack")
        })
        .with_context(|| {
            format!(
                "no record of the read-only sandbox's push: {}",
                shown(&ro_records)
            )
        })?;
    ensure!(
        ro_push.status == Some(403)
            && ro_push.outcome == Outcome::Error
            && ro_push.error_code == Some(ErrorCode::NetworkPolicyViolation.as_str()),
        "the read-only sandbox's refused push: {}",
        ro_push.to_json()
    );
    for r in &ro_records {
        let json = r.to_json();
        ensure!(
            !secrets.iter().any(|s| json.contains(s)),
            "a record holds a token, the config's secret or the host path: {json}"
        );
    }
    // The gates' tasks end with the kill; their hooks go with the last connection.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = hooks_dirs();
        let running = backend_running_with(&format!("refs/heads/sandbox/{id}/"));
        if left == before && !running {
            break;
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "after kill: hooks directories {left:?} (before {before:?}), a backend still \
                 running: {running}"
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(())
}

fn shown(records: &[AuditRecord]) -> String {
    records
        .iter()
        .map(AuditRecord::to_json)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The read-write sandbox's records: one per request (`expected`), all of repository
/// `origin`; the fetch served; the push under the prefix landed, naming its ref; the push
/// outside refused with its ref, 403 and `SBX_E1401`; the three token refusals 401 with
/// `SBX_E1501`; the three files 404 with `SBX_E1401`; none holding a secret.
fn audited_as_served_and_refused(
    records: &[AuditRecord],
    expected: usize,
    id: &str,
    inside: &str,
    secrets: &[&str],
) -> anyhow::Result<()> {
    let all = shown(records);
    ensure!(
        records.len() == expected,
        "{} git.request records for {expected} requests:\n{all}",
        records.len()
    );
    for r in records {
        let json = r.to_json();
        ensure!(
            !secrets.iter().any(|s| json.contains(s)),
            "a record holds a token, the config's secret or the host path: {json}"
        );
        ensure!(r.sandbox_id.as_deref() == Some(id), "{json}");
    }
    let one = |what: &str, f: &dyn Fn(&AuditRecord) -> bool| {
        records
            .iter()
            .find(|r| f(r))
            .with_context(|| format!("no record of {what} in:\n{all}"))
    };
    one("the fetch", &|r| {
        r.request.as_deref() == Some("git-upload-pack")
            && r.method.as_deref() == Some("POST")
            && r.repo.as_deref() == Some("origin")
            && r.status == Some(200)
            && r.outcome == Outcome::Ok
    })?;
    one("the push under the prefix, landed", &|r| {
        r.request.as_deref() == Some("git-receive-pack")
            && r.refs == Some(vec![inside.to_string()])
            && r.status == Some(200)
            && r.outcome == Outcome::Ok
    })?;
    one("the push outside the prefix, refused", &|r| {
        r.refs == Some(vec!["refs/heads/main".to_string()])
            && r.status == Some(403)
            && r.outcome == Outcome::Error
            && r.error_code == Some(ErrorCode::NetworkPolicyViolation.as_str())
    })?;
    let count = |status: u16, code: ErrorCode| {
        records
            .iter()
            .filter(|r| {
                r.status == Some(status)
                    && r.outcome == Outcome::Error
                    && r.error_code == Some(code.as_str())
            })
            .count()
    };
    ensure!(
        count(401, ErrorCode::Auth) == 3,
        "no token, a wrong token and another sandbox's token: three 401 records with \
         SBX_E1501 in:\n{all}"
    );
    ensure!(
        count(404, ErrorCode::NetworkPolicyViolation) == 3,
        "config, HEAD and objects/info/packs: three 404 records with SBX_E1401 in:\n{all}"
    );
    Ok(())
}

/// The password of a URL's credentials.
fn password_of(url: &str) -> Option<String> {
    let rest = url.strip_prefix("http://")?;
    let (cred, _) = rest.split_once('@')?;
    let (_, password) = cred.split_once(':')?;
    Some(password.to_string())
}
