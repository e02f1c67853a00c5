//! The host side of the lifetime on a real engine, the same for every adapter: the
//! deadline timer that removes an abandoned sandbox whose in-sandbox backstop was
//! defeated, the periodic sweep, the startup sweep and `kill_managed`. For the last two:
//! the adapters once disagreed (one sweep removed owner-gone-or-expired leftovers while
//! the other removed only running owner-gone ones, and `kill_managed` of a container
//! sandbox-rs does not manage was `Configuration` on one engine and `Ok(false)` on the
//! other), so one trial now holds both to the same rules.
//!
//! The containers these trials start from are made with the engine CLI (`docker` /
//! `podman`), as another process, a crashed run or a user would have left them, and
//! removed by a guard when the trial ends, whatever its outcome.

use std::collections::BTreeMap;
use std::future::Future;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use sandbox_core::labels::{LABEL_DEADLINE, LABEL_OWNER, Owner, sandbox_labels, unix_now};
use sandbox_core::{Backend, CreateOptions, ErrorCode, ReapableBackend, RunOptions};

use sandbox_container::{DEADLINE_GRACE, MIN_SWEEP_INTERVAL, NAME_PREFIX, SWEEP_PAST_DEADLINE};

use crate::engine_cli::{cli_out, cli_succeeds};

/// The image the leftovers run (built by `cargo xtask setup`).
const IMAGE: &str = "sandbox-rs/busybox:latest";

/// Containers made through the CLI; each is removed (`rm -f`) when this is dropped.
pub struct Leftovers {
    cli: &'static str,
    names: Vec<String>,
}

impl Leftovers {
    /// None yet, on the engine `cli` drives.
    pub fn new(cli: &'static str) -> Leftovers {
        Leftovers {
            cli,
            names: Vec::new(),
        }
    }

    /// Makes a container `name` (removing one of that name left by an earlier run) with
    /// `labels`, no network, running `sleep 300` when `running`, else created only.
    /// Returns its id.
    pub fn add(&mut self, name: &str, labels: &BTreeMap<String, String>, running: bool) -> String {
        let id = self.make(name, labels, &["sleep", "300"]);
        if running {
            cli_out(Command::new(self.cli).args(["start", &id]));
        }
        id
    }

    /// Makes a container `name` with `labels` whose first process exited with `status`
    /// (stopped, as a sandbox whose agent ended it is). Returns its id.
    pub fn add_exited(
        &mut self,
        name: &str,
        labels: &BTreeMap<String, String>,
        status: i32,
    ) -> String {
        let id = self.make(name, labels, &["sh", "-c", &format!("exit {status}")]);
        // `start --attach` returns once the process has exited.
        let _ = Command::new(self.cli)
            .args(["start", "--attach", &id])
            .output();
        id
    }

    fn make(&mut self, name: &str, labels: &BTreeMap<String, String>, argv: &[&str]) -> String {
        remove(self.cli, name);
        self.names.push(name.to_string());
        let mut cmd = Command::new(self.cli);
        cmd.args(["create", "--name", name, "--network", "none"]);
        for (k, v) in labels {
            cmd.arg("--label").arg(format!("{k}={v}"));
        }
        cli_out(cmd.arg(IMAGE).args(argv))
    }

    /// Removes the container `id` (made by the adapter under test) when this is dropped,
    /// should the trial fail before the adapter removed it.
    pub fn adopt(&mut self, id: &str) {
        self.names.push(id.to_string());
    }

    /// Whether the engine still holds `id`, asked through the CLI (not the adapter).
    pub fn exists(&self, id: &str) -> bool {
        cli_succeeds(self.cli, &["container", "inspect", id])
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for n in &self.names {
            remove(self.cli, n);
        }
    }
}

fn remove(cli: &str, name: &str) {
    cli_succeeds(cli, &["rm", "-f", name]);
}

/// An owner on this host that is proven gone: this process's pid with another start
/// time (the pid was reused, so the process that wrote the label has ended).
fn gone_owner() -> Owner {
    let me = Owner::current();
    Owner {
        start_time: me.start_time + 12_345,
        ..me.clone()
    }
}

/// Leftovers of `backend` made through `cli`, then a backend connected with `connect`
/// (whose startup sweep runs before it is returned). Swept, on every engine: a stopped
/// and a running container whose owner is gone, and a running one past its deadline
/// (by more than [`SWEEP_PAST_DEADLINE`]) although its owner, this process, is alive.
/// Swept too: a stopped one with an idle limit whose agent ended it for being idle (its
/// exit status, [`sandbox_agent::protocol::IDLE_EXIT_STATUS`]), owner alive and within its
/// deadline. Kept: a live owner's container within its deadline, the same with an idle
/// limit but stopped otherwise (status 0: at `stop`), and an expired one that only claims
/// to be managed (not named by sandbox-rs, as an image's labels can claim).
pub async fn startup_sweep_removes_gone_owners_and_expired<B, F>(
    cli: &'static str,
    backend: &str,
    connect: F,
) where
    F: Future<Output = sandbox_core::Result<B>>,
{
    let pid = std::process::id();
    let now = unix_now();
    let meta = BTreeMap::from([("test".to_string(), "sweep".to_string())]);
    let live = sandbox_labels(backend, now + 600, &meta);
    let mut gone = live.clone();
    gone.insert(LABEL_OWNER.into(), gone_owner().to_label());
    let mut expired = live.clone();
    // Past the sweep's grace, yet within the clock slack of the creation time (now), as
    // a deadline sandbox-rs wrote would be: a deadline far from it reads as an image's.
    let past = now - SWEEP_PAST_DEADLINE.as_secs() - 30;
    assert!(now - past < sandbox_core::CLOCK_SLACK.as_secs());
    expired.insert(LABEL_DEADLINE.into(), past.to_string());

    let mut with_idle = live.clone();
    with_idle.insert(sandbox_core::labels::LABEL_IDLE_TIMEOUT.into(), "3".into());
    let idle_status = sandbox_agent::protocol::IDLE_EXIT_STATUS;

    let mut left = Leftovers::new(cli);
    let name = |case: &str| format!("{NAME_PREFIX}sweeptest-{pid}-{case}");
    let swept = [
        (
            "stopped, ended idle, owner alive",
            left.add_exited(&name("ended-idle"), &with_idle, idle_status),
        ),
        (
            "stopped, owner gone",
            left.add(&name("stopped-gone"), &gone, false),
        ),
        (
            "running, owner gone",
            left.add(&name("running-gone"), &gone, true),
        ),
        (
            "running, expired",
            left.add(&name("expired"), &expired, true),
        ),
    ];
    let kept = [
        ("running, owner alive", left.add(&name("live"), &live, true)),
        (
            "stopped with an idle limit, not idle (status 0), owner alive",
            left.add_exited(&name("stopped-idle-limit"), &with_idle, 0),
        ),
        (
            "ended with the idle status, no idle limit",
            left.add_exited(&name("idle-status-no-limit"), &live, idle_status),
        ),
        (
            "expired, not named by sandbox-rs",
            left.add(&format!("sweeptest-{pid}-foreign"), &expired, true),
        ),
    ];
    match connect.await {
        Ok(b) => drop(b),
        Err(e) => panic!("connect: {}", e.render()),
    }
    for (what, id) in &swept {
        assert!(
            !left.exists(id),
            "the startup sweep kept a leftover ({what})"
        );
    }
    for (what, id) in &kept {
        assert!(
            left.exists(id),
            "the startup sweep removed a container ({what})"
        );
    }
}

/// A sandbox on the engine's exec path (`connect` gives a backend with the agent off)
/// whose code, as root inside, stops its lifetime process (`kill -STOP` on the `sleep`
/// that would end the container at the deadline), and whose handle is then forgotten
/// (`std::mem::forget`: no drop, no kill, as a leaked or wedged caller leaves it). The
/// backend's deadline timer removes it: never before its deadline, and no later than the
/// deadline plus the timer's grace (`grace`) plus a few seconds of slack.
pub async fn an_abandoned_sandbox_is_removed_at_its_deadline<B, F>(cli: &'static str, connect: F)
where
    B: Backend,
    F: Future<Output = sandbox_core::Result<B>>,
{
    const LIFETIME: Duration = Duration::from_secs(3);
    const SLACK: Duration = Duration::from_secs(6);
    let b = match connect.await {
        Ok(b) => b,
        Err(e) => panic!("connect: {}", e.render()),
    };
    let mut left = Leftovers::new(cli);
    let s = b
        .create(
            CreateOptions::new(IMAGE)
                .timeout(LIFETIME)
                .metadata("test", "deadline_timer"),
        )
        .await
        .unwrap_or_else(|e| panic!("create: {}", e.render()));
    let id = s.id().to_string();
    left.adopt(&id);
    let deadline = deadline_of(cli, &id);
    // The backstop on this path is the `sleep` under the engine's init; root inside can
    // stop it, and then nothing in the container ends it.
    let stop = r#"for p in /proc/[0-9]*; do
        if [ "$(cat $p/comm 2>/dev/null)" = sleep ] && kill -STOP "${p#/proc/}"; then
            for i in 1 2 3 4 5 6 7 8 9 10; do
                grep -q '^State:.*stopped' $p/status && break
                sleep 0.1
            done
            grep '^State' $p/status
        fi
    done"#;
    let r = s
        .run(
            sandbox_core::Command::Shell(stop.into()),
            RunOptions::default().timeout(Duration::from_secs(10)),
        )
        .await
        .unwrap_or_else(|e| panic!("stopping the lifetime process: {}", e.render()));
    assert!(
        r.stdout_text().contains("stopped"),
        "the lifetime process was not stopped (exit {}): {} {}",
        r.exit_code,
        r.stdout_text(),
        r.stderr_text()
    );
    std::mem::forget(s);
    let give_up = deadline + DEADLINE_GRACE + SLACK;
    let gone_at = loop {
        let now = SystemTime::now();
        if !left.exists(&id) {
            break now;
        }
        assert!(
            now < give_up,
            "the abandoned sandbox still runs {:?} after its deadline",
            now.duration_since(deadline).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        gone_at >= deadline,
        "the sandbox was removed {:?} before its deadline",
        deadline.duration_since(gone_at).unwrap_or_default()
    );
    drop(b);
}

/// The deadline the engine's labels of `id` carry.
fn deadline_of(cli: &str, id: &str) -> SystemTime {
    let label = cli_out(Command::new(cli).args([
        "container",
        "inspect",
        "--format",
        &format!("{{{{index .Config.Labels \"{LABEL_DEADLINE}\"}}}}"),
        id,
    ]));
    let secs: u64 = label
        .parse()
        .unwrap_or_else(|_| panic!("deadline label {label:?}"));
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// A backend that sweeps every second (`connect` gives it, startup sweep off) removes a
/// leftover that appears after it started: another process's sandbox on another host,
/// long past its deadline. A live owner's sandbox within its deadline stays.
pub async fn periodic_sweep_removes_expired_leftovers<B, F>(
    cli: &'static str,
    backend: &str,
    connect: F,
) where
    F: Future<Output = sandbox_core::Result<B>>,
{
    const SLACK: Duration = Duration::from_secs(8);
    let b = match connect.await {
        Ok(b) => b,
        Err(e) => panic!("connect: {}", e.render()),
    };
    let pid = std::process::id();
    let now = unix_now();
    let meta = BTreeMap::from([("test".to_string(), "periodic_sweep".to_string())]);
    let live = sandbox_labels(backend, now + 600, &meta);
    let mut expired = live.clone();
    // Another host's owner cannot be proven gone: only the expiry can remove it.
    let elsewhere = Owner {
        host: "another-host.invalid".into(),
        ..Owner::current().clone()
    };
    expired.insert(LABEL_OWNER.into(), elsewhere.to_label());
    let past = now - SWEEP_PAST_DEADLINE.as_secs() - 30;
    expired.insert(LABEL_DEADLINE.into(), past.to_string());
    let mut left = Leftovers::new(cli);
    let name = |case: &str| format!("{NAME_PREFIX}periodictest-{pid}-{case}");
    let started = Instant::now();
    let swept = left.add(&name("expired"), &expired, true);
    let kept = left.add(&name("live"), &live, true);
    while left.exists(&swept) {
        assert!(
            started.elapsed() < MIN_SWEEP_INTERVAL + SLACK,
            "the periodic sweep kept an expired leftover for {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        left.exists(&kept),
        "the periodic sweep removed a live sandbox"
    );
    drop(b);
}

/// `kill_managed` refuses a container sandbox-rs does not manage (`Configuration`, and
/// the container is untouched: a typo never looks like success nor removes a user's
/// container), and answers `Ok(false)` for an id the engine does not hold.
pub async fn kill_managed_refuses_an_unmanaged_container(
    b: &dyn ReapableBackend,
    cli: &'static str,
) {
    let mut left = Leftovers::new(cli);
    let id = left.add(
        &format!("sweeptest-{}-unmanaged", std::process::id()),
        &BTreeMap::new(),
        true,
    );
    let e = b
        .kill_managed(&id)
        .await
        .expect_err("kill_managed of an unmanaged container");
    assert_eq!(e.code(), ErrorCode::Configuration, "{}", e.render());
    assert!(
        left.exists(&id),
        "kill_managed touched an unmanaged container"
    );
    let missing = "0000000000000000000000000000000000000000000000000000000000000000";
    assert!(
        !b.kill_managed(missing)
            .await
            .expect("kill_managed of a missing id"),
        "nothing to remove"
    );
}
