//! The gate against a real repository and the real `git` client on the host, over a
//! loopback listener standing in for the forwarded port.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use sandbox_core::layer::EventReporter;
use sandbox_core::{GitAccess, GitRepo};

use super::Gate;

fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "protocol.version=2",
        ])
        .args(args)
        .output()
        .expect("git runs")
}

fn ok(o: std::process::Output) -> String {
    assert!(
        o.status.success(),
        "git failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A work tree with one commit on `main` and a remote with credentials in its config.
fn origin(dir: &Path) -> std::path::PathBuf {
    let repo = dir.join("origin");
    std::fs::create_dir(&repo).unwrap();
    ok(git(&repo, &["init", "-q"]));
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();
    ok(git(&repo, &["add", "a.txt"]));
    ok(git(&repo, &["commit", "-qm", "first"]));
    ok(git(
        &repo,
        &[
            "remote",
            "add",
            "upstream",
            "https://user:hunter2-secret@git.example.invalid/x.git",
        ],
    ));
    repo
}

/// Serves `gate` on a loopback port; the port.
async fn listen(gate: Arc<Gate>) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(gate.clone().serve(s));
        }
    });
    port
}

/// The status code of a raw GET of `path` with `auth` as the basic password.
async fn status_of(port: u16, path: &str, auth: Option<&str>) -> u16 {
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    if let Some(a) = auth {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("u:{a}"));
        req.push_str(&format!("Authorization: Basic {b}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let line = String::from_utf8_lossy(&out);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    tokio::task::spawn_blocking(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_and_push_under_the_prefix_work_and_nothing_else_lands() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = origin(tmp.path());
    let main_before = ok(git(&repo, &["rev-parse", "refs/heads/main"]));
    let gate = Arc::new(
        Gate::new(
            &[GitRepo::new(&repo, GitAccess::ReadWrite)],
            "sbx1",
            EventReporter::default(),
        )
        .unwrap(),
    );
    let hooks = gate.hooks_dir().to_path_buf();
    assert!(hooks.join("pre-receive").is_file());
    let port = listen(gate.clone()).await;
    let url = gate.url(0, port).unwrap();
    let dir = tmp.path().to_path_buf();
    let results = blocking(move || {
        ok(git(&dir, &["clone", "-q", &url, "work"]));
        let work = dir.join("work");
        std::fs::write(work.join("b.txt"), "two\n").unwrap();
        ok(git(&work, &["add", "b.txt"]));
        ok(git(&work, &["commit", "-qm", "second"]));
        let head = ok(git(&work, &["rev-parse", "HEAD"]));
        let inside = git(
            &work,
            &["push", "origin", "HEAD:refs/heads/sandbox/sbx1/work"],
        );
        let attacks: Vec<(&str, std::process::Output)> = vec![
            (
                "outside",
                git(&work, &["push", "origin", "HEAD:refs/heads/main"]),
            ),
            (
                "delete",
                git(&work, &["push", "origin", ":refs/heads/main"]),
            ),
            ("tag", git(&work, &["push", "origin", "HEAD:refs/tags/v1"])),
            (
                "sibling",
                git(
                    &work,
                    &["push", "origin", "HEAD:refs/heads/sandbox/sbx10/x"],
                ),
            ),
            (
                "mixed",
                git(
                    &work,
                    &[
                        "push",
                        "--atomic",
                        "origin",
                        "HEAD:refs/heads/sandbox/sbx1/ok2",
                        "HEAD:refs/heads/other",
                    ],
                ),
            ),
        ];
        (head, inside, attacks)
    })
    .await
    .unwrap();
    let (head, inside, attacks) = results;
    assert!(
        inside.status.success(),
        "push inside the prefix: {}",
        String::from_utf8_lossy(&inside.stderr)
    );
    assert_eq!(
        ok(git(&repo, &["rev-parse", "refs/heads/sandbox/sbx1/work"])),
        head,
        "the push landed"
    );
    for (what, o) in &attacks {
        assert!(!o.status.success(), "{what} push was accepted");
    }
    assert_eq!(
        ok(git(&repo, &["rev-parse", "refs/heads/main"])),
        main_before
    );
    let refs = ok(git(&repo, &["for-each-ref", "--format=%(refname)"]));
    assert_eq!(
        refs.lines().collect::<Vec<_>>(),
        ["refs/heads/main", "refs/heads/sandbox/sbx1/work"],
        "no other ref appeared"
    );
    // The token, and only this gate's token, opens it; nothing but the protocol is served.
    let info = "/origin.git/info/refs?service=git-upload-pack";
    let token = gate.token.expose().to_string();
    assert_eq!(status_of(port, info, Some(&token)).await, 200);
    assert_eq!(status_of(port, info, None).await, 401);
    assert_eq!(status_of(port, info, Some("wrong")).await, 401);
    let other = Gate::new(
        &[GitRepo::new(&repo, GitAccess::ReadWrite)],
        "sbx2",
        EventReporter::default(),
    )
    .unwrap();
    assert_eq!(status_of(port, info, Some(other.token.expose())).await, 401);
    for path in [
        "/origin.git/config",
        "/origin.git/HEAD",
        "/origin.git/objects/info/packs",
        "/origin.git/info/refs",
        "/origin.git/../config",
        "/origin.git/hooks/pre-receive",
    ] {
        assert_eq!(status_of(port, path, Some(&token)).await, 404, "{path}");
    }
    drop(other);
    drop(gate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_access_refuses_every_push() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = origin(tmp.path());
    let gate = Arc::new(
        Gate::new(
            &[GitRepo::new(&repo, GitAccess::ReadOnly)],
            "ro",
            EventReporter::default(),
        )
        .unwrap(),
    );
    let port = listen(gate.clone()).await;
    let url = gate.url(0, port).unwrap();
    let dir = tmp.path().to_path_buf();
    let push = blocking(move || {
        ok(git(&dir, &["clone", "-q", &url, "work"]));
        git(
            &dir.join("work"),
            &["push", "origin", "HEAD:refs/heads/sandbox/ro/x"],
        )
    })
    .await
    .unwrap();
    assert!(!push.status.success(), "a read-only push was accepted");
    let refs = ok(git(&repo, &["for-each-ref", "--format=%(refname)"]));
    assert_eq!(refs, "refs/heads/main");
}

#[test]
fn the_hooks_directory_goes_with_the_gate_and_the_token_is_never_printed() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = origin(tmp.path());
    let gate = Gate::new(
        &[GitRepo::new(&repo, GitAccess::ReadWrite)],
        "x",
        EventReporter::default(),
    )
    .unwrap();
    let hooks = gate.hooks_dir().to_path_buf();
    let token = gate.token.expose().to_string();
    assert_eq!(token.len(), 64);
    assert!(!format!("{gate:?}").contains(&token));
    drop(gate);
    assert!(!hooks.exists(), "the hooks directory is removed");
    let e = Gate::new(
        &[GitRepo::new(tmp.path(), GitAccess::ReadOnly)],
        "x",
        EventReporter::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("not a git repository"), "{e}");
}

/// A raw request with the basic password `auth`; its status code.
async fn raw(port: u16, method: &str, path: &str, auth: &str, body: &[u8]) -> u16 {
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let b = base64::engine::general_purpose::STANDARD.encode(format!("u:{auth}"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Basic {b}\r\n\
         Content-Type: application/x-git-receive-pack-request\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// The gate's records in `sink`, once `done` holds for them (the records of requests the
/// backend answered are written when it ends, a moment after the client has its answer).
async fn records_when(
    sink: &sandbox_core::layer::MemorySink,
    done: impl Fn(&[sandbox_core::layer::AuditRecord]) -> bool,
) -> Vec<sandbox_core::layer::AuditRecord> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let records: Vec<_> = sink
            .records()
            .into_iter()
            .filter(|r| r.operation == "git.request")
            .collect();
        if done(&records) || std::time::Instant::now() > deadline {
            return records;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_one_audit_record_and_none_holds_the_token() {
    use sandbox_core::layer::Outcome;
    let (events, sink) = crate::test_events::audited().await;
    let tmp = tempfile::tempdir().unwrap();
    let repo = origin(tmp.path());
    let gate =
        Arc::new(Gate::new(&[GitRepo::new(&repo, GitAccess::ReadWrite)], "sbx1", events).unwrap());
    let port = listen(gate.clone()).await;
    let url = gate.url(0, port).unwrap();
    let token = gate.token.expose().to_string();
    let dir = tmp.path().to_path_buf();
    let (inside, outside) = blocking(move || {
        ok(git(&dir, &["clone", "-q", &url, "work"]));
        let work = dir.join("work");
        std::fs::write(work.join("b.txt"), "two\n").unwrap();
        ok(git(&work, &["add", "b.txt"]));
        ok(git(&work, &["commit", "-qm", "second"]));
        (
            git(
                &work,
                &["push", "origin", "HEAD:refs/heads/sandbox/sbx1/work"],
            ),
            git(&work, &["push", "origin", "HEAD:refs/heads/main"]),
        )
    })
    .await
    .unwrap();
    assert!(inside.status.success() && !outside.status.success());
    // A delete under the prefix whose old value is stale (an object of the repository,
    // but not the ref's): the gate lets it through, git refuses it; the record says it
    // did not land.
    let first = ok(git(&repo, &["rev-parse", "refs/heads/main"]));
    let stale = format!(
        "{first} {} refs/heads/sandbox/sbx1/work\0report-status delete-refs\n",
        "0".repeat(40)
    );
    let body = [
        format!("{:04x}", stale.len() + 4).as_bytes(),
        stale.as_bytes(),
        b"0000",
    ]
    .concat();
    assert_eq!(
        raw(port, "POST", "/origin.git/git-receive-pack", &token, &body).await,
        200
    );
    assert_eq!(
        status_of(
            port,
            "/origin.git/info/refs?service=git-upload-pack",
            Some("wrong")
        )
        .await,
        401
    );
    assert_eq!(
        status_of(port, "/origin.git/config", Some(&token)).await,
        404
    );
    assert_eq!(
        status_of(port, &format!("/{token}/x"), Some(&token)).await,
        404
    );
    let main = "refs/heads/main".to_string();
    let work = "refs/heads/sandbox/sbx1/work".to_string();
    let records = records_when(&sink, |rs| {
        rs.iter()
            .any(|r| r.refs.as_ref() == Some(&vec![work.clone()]) && r.outcome == Outcome::Error)
    })
    .await;
    let shown: Vec<String> = records.iter().map(|r| r.to_json()).collect();
    let shown = shown.join("\n");
    for r in &records {
        assert!(
            !r.to_json().contains(&token),
            "a record holds the token: {}",
            r.to_json()
        );
        assert_eq!(r.sandbox_id.as_deref(), Some("sbx1"));
        assert!(
            r.status.is_some(),
            "every record has the status answered: {}",
            r.to_json()
        );
    }
    let find = |what: &str, f: &dyn Fn(&sandbox_core::layer::AuditRecord) -> bool| {
        let found: Vec<_> = records.iter().filter(|r| f(r)).collect();
        assert!(!found.is_empty(), "no record of {what} in\n{shown}");
        found
    };
    // The clone: the refs and the pack, served.
    find("the clone's refs", &|r| {
        r.request.as_deref() == Some("git-upload-pack")
            && r.repo.as_deref() == Some("origin")
            && r.method.as_deref() == Some("GET")
            && r.path.as_deref() == Some("/origin.git/info/refs")
            && r.status == Some(200)
            && r.outcome == Outcome::Ok
    });
    find("the clone's pack", &|r| {
        r.request.as_deref() == Some("git-upload-pack")
            && r.method.as_deref() == Some("POST")
            && r.status == Some(200)
            && r.outcome == Outcome::Ok
    });
    // The push under the prefix landed.
    find("the push under the prefix", &|r| {
        r.request.as_deref() == Some("git-receive-pack")
            && r.refs.as_ref() == Some(&vec![work.clone()])
            && r.status == Some(200)
            && r.outcome == Outcome::Ok
            && r.error_code.is_none()
    });
    // The push outside it was refused by the gate, with its code.
    let refused = find("the push outside the prefix", &|r| {
        r.refs.as_ref() == Some(&vec![main.clone()])
    });
    assert_eq!(refused.len(), 1, "{shown}");
    assert_eq!(refused[0].status, Some(403));
    assert_eq!(refused[0].outcome, Outcome::Error);
    assert_eq!(refused[0].error_code, Some("SBX_E1401"));
    assert!(
        refused[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("outside")),
        "{shown}"
    );
    // The stale delete: passed by the gate, refused by git.
    let stale = find("the stale delete", &|r| {
        r.refs.as_ref() == Some(&vec![work.clone()]) && r.outcome == Outcome::Error
    });
    assert_eq!(stale[0].status, Some(200));
    assert_eq!(stale[0].error_code, None);
    // A wrong token: refused, naming the repository and service it tried.
    find("the wrong token", &|r| {
        r.status == Some(401)
            && r.error_code == Some("SBX_E1501")
            && r.repo.as_deref() == Some("origin")
            && r.request.as_deref() == Some("git-upload-pack")
    });
    // A path the gate does not serve: one record, refused.
    let config: Vec<_> = records
        .iter()
        .filter(|r| r.path.as_deref() == Some("/origin.git/config"))
        .collect();
    assert_eq!(config.len(), 1, "{shown}");
    assert_eq!(
        (config[0].status, config[0].error_code),
        (Some(404), Some("SBX_E1401"))
    );
    // The token the sandbox wrote into a path is hidden.
    find("the path with the token", &|r| {
        r.path.as_deref() == Some("/***/x")
    });
}

#[test]
fn the_refs_of_a_record_are_capped_in_number_and_length() {
    let many: Vec<String> = (0..100)
        .map(|i| format!("refs/heads/sandbox/s/{i}-{}", "x".repeat(400)))
        .collect();
    let kept = super::audit::recorded_refs(&many);
    assert_eq!(kept.len(), super::audit::MAX_REFS + 1);
    assert!(
        kept[..super::audit::MAX_REFS]
            .iter()
            .all(|r| r.len() <= super::audit::MAX_REF + '…'.len_utf8() && r.ends_with('…'))
    );
    assert_eq!(
        kept[super::audit::MAX_REFS],
        format!("… {} more", 100 - super::audit::MAX_REFS)
    );
    let few = vec!["refs/heads/sandbox/s/a".to_string()];
    assert_eq!(super::audit::recorded_refs(&few), few);
}
