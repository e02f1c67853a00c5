//! The gate against a real repository and the real `git` client on the host, over a
//! loopback listener standing in for the forwarded port.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

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
    let gate = Arc::new(Gate::new(&[GitRepo::new(&repo, GitAccess::ReadWrite)], "sbx1").unwrap());
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
    let other = Gate::new(&[GitRepo::new(&repo, GitAccess::ReadWrite)], "sbx2").unwrap();
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
    let gate = Arc::new(Gate::new(&[GitRepo::new(&repo, GitAccess::ReadOnly)], "ro").unwrap());
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
    let gate = Gate::new(&[GitRepo::new(&repo, GitAccess::ReadWrite)], "x").unwrap();
    let hooks = gate.hooks_dir().to_path_buf();
    let token = gate.token.expose().to_string();
    assert_eq!(token.len(), 64);
    assert!(!format!("{gate:?}").contains(&token));
    drop(gate);
    assert!(!hooks.exists(), "the hooks directory is removed");
    let e = Gate::new(&[GitRepo::new(tmp.path(), GitAccess::ReadOnly)], "x").unwrap_err();
    assert!(e.to_string().contains("not a git repository"), "{e}");
}
