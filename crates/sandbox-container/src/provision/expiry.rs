//! The host side of every sandbox's lifetime, for as long as its backend lives: a timer
//! per sandbox that removes it [`DEADLINE_GRACE`] after its deadline when nothing inside
//! ended it (the engine exec path's `sleep` stopped by root inside, PID 1 unprotected
//! under runsc, a wedged agent), and the periodic sweep of leftovers other processes left.
//!
//! Both run as tokio tasks that hold no handle of the backend (its engine only weakly):
//! `Upkeep`, shared by every clone of one backend, cancels them all when the last clone
//! drops, and a sandbox's timer is cancelled as soon as its container is removed
//! normally. A timer follows its sandbox's deadline when `extend` moves it, through this
//! handle or, by the host's record (`deadlines.rs`), through any other process. What the
//! sweep removes, and why, is `sweep.rs`'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use sandbox_agent::client::AgentClient;
use sandbox_core::SandboxState;
use sandbox_core::teardown::Killer;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::engine::transfer::bounded;
use crate::engine::{ContainerEngine, EngineErrorKind};
use crate::provision::deadlines::Deadlines;
use crate::provision::sweep::{Sweep, sweep};
use crate::provision::teardown::remove_in_state;

/// How long after a sandbox's deadline the host removes it. The in-sandbox backstop ends
/// the container at the deadline itself (rounded up to the second), and the engine
/// removes it within milliseconds: the timer acts only where that did not happen. A
/// removal racing the engine's own is harmless (it waits for it), so the grace only has
/// to cover the deadline's rounding and the engine's reaction, not a clock skew (both
/// ends are this host's clock).
pub const DEADLINE_GRACE: Duration = Duration::from_secs(2);

/// Label (value `true`) of a sandbox whose container is kept, stopped, for inspection once
/// its lifetime ends (Podman's `ephemeral(false)`): the host-side timer leaves it to
/// `sandbox reap`. Every other stopped sandbox past its deadline is removed: engines keep a
/// stopped container (so that `Sandbox::start` can run it again), and the host removes it.
pub const LABEL_RETAINED: &str = "io.sandbox-rs.retained";

/// Default interval of the periodic sweep while a backend lives.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(300);

/// Shortest interval the periodic sweep accepts: one list call per second at most.
pub const MIN_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The background work of one backend. Every clone of the backend holds it; when the last
/// one drops, every timer and the periodic sweep end (at their next poll, without being
/// waited for: dropping a backend never blocks).
#[derive(Debug, Default)]
pub(crate) struct Upkeep {
    stop: CancellationToken,
    /// Where the timers read deadlines other processes moved.
    deadlines: Deadlines,
}

impl Drop for Upkeep {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One sandbox's deadline timer, cancelled once its container is removed, moved with
/// its deadline; it also removes the sandbox as soon as its agent ends it for being idle.
#[derive(Debug, Clone)]
pub(crate) struct Expiry {
    token: CancellationToken,
    moves: Arc<tokio::sync::watch::Sender<SystemTime>>,
    /// Told when one of the sandbox's agent sessions ended by itself.
    agent_ended: Arc<Notify>,
    /// Told to look once whether the sandbox ended idle (while no session of this
    /// process watches its agent).
    look: Arc<Notify>,
    /// Counts the sessions watched: a newer one ends the looks for an older one.
    sessions: Arc<AtomicU64>,
}

/// How often the timer looks whether a sandbox ended idle while another handle holds its
/// agent (a session of this process taken over, e.g. by `sandbox exec`): that handle's
/// process may be gone by the end, so nothing would tell this one.
const SUPERSEDED_LOOK: Duration = Duration::from_secs(2);

impl Expiry {
    /// Moves the timer to `deadline` (plus the grace), earlier or later.
    pub(crate) fn move_to(&self, deadline: SystemTime) {
        self.moves.send_replace(deadline);
    }

    /// Watches `client`'s session: when it ends with the agent gone (not taken over by
    /// another host), the timer looks at why the container stopped and removes a sandbox
    /// that ended idle at once, instead of keeping it stopped until its deadline. Called
    /// for every session a handle opens (create, start, a fork, a session taken back).
    ///
    /// A session another handle took over leaves the agent without a watcher here: the
    /// timer then looks every [`SUPERSEDED_LOOK`] until this process watches a session
    /// again (one taken back, a `start`) or the sandbox is removed.
    pub(crate) fn watch_session(&self, client: &AgentClient) {
        let ended = client.ended();
        let (tell, look, stop) = (
            self.agent_ended.clone(),
            self.look.clone(),
            self.token.clone(),
        );
        let sessions = self.sessions.clone();
        let this = sessions.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::spawn(async move {
            match stop.run_until_cancelled(ended).await {
                Some(false) => tell.notify_one(),
                Some(true) => {
                    let looks = async {
                        while sessions.load(Ordering::SeqCst) == this {
                            tokio::time::sleep(SUPERSEDED_LOOK).await;
                            look.notify_one();
                        }
                    };
                    stop.run_until_cancelled(looks).await;
                }
                None => {}
            }
        });
    }

    /// Wraps `killer` so that a removal that succeeds also cancels this timer.
    pub(crate) fn cancelled_by(&self, killer: Killer) -> Killer {
        let token = self.token.clone();
        Arc::new(move || {
            let kill = killer();
            let token = token.clone();
            Box::pin(async move {
                let removed = kill.await;
                if removed.is_ok() {
                    token.cancel();
                }
                removed
            })
        })
    }
}

impl Upkeep {
    /// Where this backend reads and writes the deadlines in force.
    pub(crate) fn deadlines(&self) -> &Deadlines {
        &self.deadlines
    }

    /// Starts the periodic sweep on `engine` every `interval` (none when `None`).
    pub(crate) fn start_sweeps<E: ContainerEngine>(
        &self,
        engine: &Arc<E>,
        call_timeout: Duration,
        interval: Option<Duration>,
    ) {
        let Some(interval) = interval else {
            return;
        };
        let engine = Arc::downgrade(engine);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let every = interval.max(MIN_SWEEP_INTERVAL);
            while stop
                .run_until_cancelled(tokio::time::sleep(every))
                .await
                .is_some()
            {
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                stop.run_until_cancelled(sweep(&*engine, call_timeout, Sweep::Periodic))
                    .await;
            }
        });
    }

    /// Arms the deadline timer of container `id` on `engine`: at `deadline` plus
    /// [`DEADLINE_GRACE`] it is removed, running, paused or stopped (by `Sandbox::stop` or
    /// by its own end), unless it is stopped and labelled [`LABEL_RETAINED`]. Before it
    /// removes anything it reads the deadline this host records for the sandbox
    /// (`deadlines.rs`, at most `max`): a deadline another process moved (an extension
    /// through a reattached handle) moves this timer too.
    pub(crate) fn arm<E: ContainerEngine>(
        &self,
        engine: &Arc<E>,
        call_timeout: Duration,
        id: &str,
        deadline: SystemTime,
        max: SystemTime,
    ) -> Expiry {
        let token = self.stop.child_token();
        let (moves, mut moved) = tokio::sync::watch::channel(deadline);
        let (agent_ended, look) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let (engine, id, cancel) = (Arc::downgrade(engine), id.to_string(), token.clone());
        let (records, ended, looked) = (self.deadlines.clone(), agent_ended.clone(), look.clone());
        tokio::spawn(async move {
            // However the timer ends, the sessions' watchers end with it.
            let _done = cancel.clone().drop_guard();
            let mut at = *moved.borrow_and_update();
            // Every handle gone: the deadline cannot move in this process any more (it
            // still can in another).
            let mut orphaned = false;
            let why = loop {
                let wait = fires_in(at, SystemTime::now());
                // How long a look whether the agent ended it idle waits for the engine to
                // report the container stopped.
                let patience = tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(wait) => {
                        match records.recorded(&id, max) {
                            Some(later) if later > at => at = later,
                            _ => break End::Deadline,
                        }
                        continue;
                    }
                    () = ended.notified() => STOP_REPORTED_WITHIN,
                    () = looked.notified() => Duration::ZERO,
                    changed = moved.changed(), if !orphaned => {
                        if changed.is_err() {
                            orphaned = true;
                        } else {
                            at = *moved.borrow_and_update();
                        }
                        continue;
                    }
                };
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                let seen = cancel
                    .run_until_cancelled(idleness(&*engine, call_timeout, &id, patience))
                    .await;
                match seen {
                    None | Some(Idleness::Gone) => return,
                    Some(Idleness::EndedIdle) => break End::Idle,
                    Some(Idleness::Not) => {}
                }
            };
            cancel
                .run_until_cancelled(expire(engine, call_timeout, &id, why))
                .await;
        });
        Expiry {
            token,
            moves: Arc::new(moves),
            agent_ended,
            look,
            sessions: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// How long from `now` until the timer of a sandbox with `deadline` fires.
pub(crate) fn fires_in(deadline: SystemTime, now: SystemTime) -> Duration {
    (deadline + DEADLINE_GRACE)
        .duration_since(now)
        .unwrap_or_default()
}

/// Whether a container the engine reports in `state` with `labels` past its deadline is
/// removed: every one but a stopped one kept for inspection ([`LABEL_RETAINED`]). A
/// stopped one is removed too: a sandbox stopped with `Sandbox::stop` lives as long as its
/// deadline, and engines no longer delete a container whose processes ended.
pub(crate) fn outlived(
    state: SandboxState,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    state != SandboxState::Stopped || labels.get(LABEL_RETAINED).map(String::as_str) != Some("true")
}

/// Why the timer removes a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Its deadline passed.
    Deadline,
    /// Its agent ended it for being idle.
    Idle,
}

/// How long after an agent session ended the engine is given to report the container
/// stopped (it does within milliseconds; a session that ended with the container still
/// running was not the agent's exit, and the deadline timer goes on).
const STOP_REPORTED_WITHIN: Duration = Duration::from_secs(3);

/// What a look at a sandbox's container found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idleness {
    /// Stopped by its agent for being idle (its exit status says so:
    /// [`sandbox_agent::protocol::IDLE_EXIT_STATUS`]).
    EndedIdle,
    /// Running (still, after `patience`), stopped otherwise, or unreadable.
    Not,
    /// The engine no longer has it: nothing is left to time.
    Gone,
}

/// Looks whether container `id` ended idle, giving the engine up to `patience` to report
/// a running container stopped (after an agent session ended; none for a periodic look).
async fn idleness<E: ContainerEngine>(
    engine: &E,
    call_timeout: Duration,
    id: &str,
    patience: Duration,
) -> Idleness {
    let until = tokio::time::Instant::now() + patience;
    loop {
        match bounded(call_timeout, "inspect", engine.inspect(id)).await {
            Ok(c) if c.ended_idle() => return Idleness::EndedIdle,
            Ok(c) if c.state != SandboxState::Running => return Idleness::Not,
            Ok(_) => {}
            Err(e) if e.kind == EngineErrorKind::NotFound => return Idleness::Gone,
            Err(_) => return Idleness::Not,
        }
        if tokio::time::Instant::now() >= until {
            return Idleness::Not;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The timer's work once it fires: the container removed if it still runs (past its
/// deadline: stopped too, unless kept for inspection).
async fn expire<E: ContainerEngine>(engine: Weak<E>, call_timeout: Duration, id: &str, why: End) {
    let Some(engine) = engine.upgrade() else {
        return;
    };
    let (state, labels) = match bounded(call_timeout, "inspect", engine.inspect(id)).await {
        // Started again since it ended idle (a `start` in between): it lives on.
        Ok(c) if why == End::Idle && !c.ended_idle() => return,
        Ok(c) => (c.state, c.labels),
        Err(e) if e.kind == EngineErrorKind::NotFound => return,
        // Unknown: removed anyway, the deadline has passed.
        Err(_) if why == End::Deadline => (SandboxState::Unknown, Default::default()),
        Err(_) => return,
    };
    if !outlived(state, &labels) {
        return;
    }
    match remove_in_state(&*engine, call_timeout, id, state).await {
        Ok(()) if why == End::Idle => tracing::info!(
            sandbox_id = %id,
            backend = engine.backend(),
            "the idle limit ended a sandbox; removed by the host"
        ),
        Ok(()) => tracing::warn!(
            sandbox_id = %id,
            backend = engine.backend(),
            "a sandbox outlived its deadline; removed by the host"
        ),
        Err(e) => tracing::warn!(
            sandbox_id = %id,
            backend = engine.backend(),
            error = %e,
            "a sandbox outlived its deadline and could not be removed"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use sandbox_core::{Capability, IsolationTier};

    use super::*;
    use crate::engine::{EngineError, EngineFacts, EngineResult};
    use crate::{
        ArchiveBody, ContainerInfo, ContainerSpec, ExecRequest, ExecState, ExecStream, PathStat,
    };

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn the_timer_fires_the_grace_after_the_deadline_and_at_once_when_late() {
        assert_eq!(fires_in(at(10_000), at(4_000)), Duration::from_secs(8));
        assert_eq!(fires_in(at(10_000), at(11_500)), Duration::from_millis(500));
        assert_eq!(fires_in(at(10_000), at(12_000)), Duration::ZERO);
        assert_eq!(fires_in(at(10_000), at(99_000)), Duration::ZERO);
    }

    #[test]
    fn only_a_stopped_container_kept_for_inspection_is_kept() {
        let retained = BTreeMap::from([(LABEL_RETAINED.to_string(), "true".to_string())]);
        let plain = BTreeMap::new();
        assert!(!outlived(SandboxState::Stopped, &retained));
        assert!(
            outlived(SandboxState::Stopped, &plain),
            "a stopped sandbox past its deadline is removed"
        );
        for s in [
            SandboxState::Running,
            SandboxState::Paused,
            SandboxState::Creating,
            SandboxState::Unknown,
        ] {
            assert!(outlived(s, &plain), "{s:?}");
            assert!(outlived(s, &retained), "{s:?}");
        }
    }

    /// An engine holding running containers by id; it records removals and list calls.
    #[derive(Debug, Default)]
    struct Holding {
        running: Mutex<Vec<String>>,
        /// Stopped containers with their exit status.
        stopped: Mutex<Vec<(String, i64)>>,
        removed: Mutex<Vec<String>>,
        lists: Mutex<usize>,
    }

    fn no<T>() -> EngineResult<T> {
        Err(EngineError::new(EngineErrorKind::Other, "not in this test"))
    }

    #[async_trait::async_trait]
    impl ContainerEngine for Holding {
        fn backend(&self) -> &'static str {
            "holding"
        }
        fn tier(&self) -> IsolationTier {
            IsolationTier::Container
        }
        fn capabilities(&self) -> Capability {
            Capability::all()
        }
        fn endpoint(&self) -> &str {
            "memory://holding"
        }
        async fn create(&self, _: &ContainerSpec) -> EngineResult<String> {
            no()
        }
        async fn start(&self, _: &str) -> EngineResult<()> {
            no()
        }
        async fn inspect(&self, id: &str) -> EngineResult<ContainerInfo> {
            if self.running.lock().unwrap().iter().any(|r| r == id) {
                Ok(ContainerInfo::new(
                    id,
                    id,
                    SandboxState::Running,
                    BTreeMap::new(),
                ))
            } else if let Some((_, code)) = self.stopped.lock().unwrap().iter().find(|s| s.0 == id)
            {
                let mut c = ContainerInfo::new(id, id, SandboxState::Stopped, BTreeMap::new());
                c.exit_code = Some(*code);
                Ok(c)
            } else {
                Err(EngineError::new(EngineErrorKind::NotFound, "no such"))
            }
        }
        async fn remove(&self, id: &str) -> EngineResult<bool> {
            let mut running = self.running.lock().unwrap();
            let mut stopped = self.stopped.lock().unwrap();
            let before = running.len() + stopped.len();
            running.retain(|r| r != id);
            stopped.retain(|s| s.0 != id);
            let running = running.len() + stopped.len();
            self.removed.lock().unwrap().push(id.to_string());
            Ok(running < before)
        }
        async fn list(&self, _: &BTreeMap<String, String>) -> EngineResult<Vec<ContainerInfo>> {
            *self.lists.lock().unwrap() += 1;
            Ok(Vec::new())
        }
        async fn exec(&self, _: &str, _: ExecRequest) -> EngineResult<ExecStream> {
            no()
        }
        async fn exec_state(&self, _: &str) -> EngineResult<ExecState> {
            no()
        }
        async fn put_archive(&self, _: &str, _: &str, _: ArchiveBody) -> EngineResult<()> {
            no()
        }
        async fn get_archive(&self, _: &str, _: &str) -> EngineResult<ArchiveBody> {
            no()
        }
        async fn stat_path(&self, _: &str, _: &str) -> EngineResult<PathStat> {
            no()
        }
        async fn ping(&self) -> EngineResult<()> {
            Ok(())
        }
        async fn facts(&self) -> EngineFacts {
            EngineFacts::default()
        }
    }

    fn holding(ids: &[&str]) -> Arc<Holding> {
        let e = Holding::default();
        *e.running.lock().unwrap() = ids.iter().map(|s| s.to_string()).collect();
        Arc::new(e)
    }

    fn removed(e: &Holding) -> Vec<String> {
        e.removed.lock().unwrap().clone()
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn alive_tasks() -> usize {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    }

    const CALL: Duration = Duration::from_secs(5);

    /// A maximum deadline no test reaches.
    fn far() -> SystemTime {
        SystemTime::now() + Duration::from_secs(86_400)
    }

    /// An upkeep whose timers read recorded deadlines from a directory of this test's.
    fn upkeep_reading(dir: &std::path::Path) -> Upkeep {
        Upkeep {
            stop: CancellationToken::new(),
            deadlines: Deadlines::in_dir(dir),
        }
    }

    /// A deadline another process moved (an extension through a reattached handle, which
    /// records it on the host) moves this process's timer: nothing is removed at the old
    /// deadline, the new one holds, and a record past the maximum counts as the maximum.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_moved_by_another_process_moves_the_timer() {
        let tmp = tempfile::Builder::new()
            .prefix("sbx-expiry-moved-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_path_buf();
        let engine = holding(&["a1", "b1"]);
        let upkeep = upkeep_reading(&dir);
        let start = SystemTime::now();
        let _a = upkeep.arm(&engine, CALL, "a1", start + Duration::from_secs(10), far());
        let _b = upkeep.arm(
            &engine,
            CALL,
            "b1",
            start + Duration::from_secs(10),
            start + Duration::from_secs(20),
        );
        settle().await;
        // Another process extends both, through its own handle: only the record moves.
        let other = Deadlines::in_dir(&dir);
        other.record("a1", start + Duration::from_secs(30)).unwrap();
        other
            .record("b1", start + Duration::from_secs(600))
            .unwrap();
        // (The paused clock moves tokio's time only: the wall clock the timer reads stays
        // near `start`, so after reading the record at 12 s the timer waits the whole
        // 32 s of the new deadline plus grace again, and 22 s for the clamped one.)
        tokio::time::sleep(Duration::from_secs(10) + DEADLINE_GRACE + Duration::from_secs(1)).await;
        settle().await;
        assert!(
            removed(&engine).is_empty(),
            "removed at the old deadline after another process extended it"
        );
        tokio::time::sleep(Duration::from_secs(33)).await;
        settle().await;
        let mut gone = removed(&engine);
        gone.sort();
        assert_eq!(
            gone,
            ["a1", "b1"],
            "the moved deadline and the maximum hold"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// When an agent session ends, a sandbox whose agent exited with the idle status is
    /// removed at once, long before its deadline; one stopped otherwise (its deadline's
    /// notice, `stop`) or still running (the session was taken over) is kept.
    #[tokio::test(start_paused = true)]
    async fn a_sandbox_that_ended_idle_is_removed_when_its_session_ends() {
        let engine = holding(&["runs"]);
        *engine.stopped.lock().unwrap() = vec![
            (
                "idle".to_string(),
                i64::from(sandbox_agent::protocol::IDLE_EXIT_STATUS),
            ),
            ("halted".to_string(), 0),
        ];
        let upkeep = Upkeep::default();
        let deadline = SystemTime::now() + Duration::from_secs(3600);
        let timers: Vec<Expiry> = ["idle", "halted", "runs"]
            .iter()
            .map(|id| upkeep.arm(&engine, CALL, id, deadline, far()))
            .collect();
        settle().await;
        for t in &timers {
            t.agent_ended.notify_one();
        }
        // The running one is looked at for the whole STOP_REPORTED_WITHIN.
        tokio::time::sleep(STOP_REPORTED_WITHIN + Duration::from_secs(1)).await;
        settle().await;
        assert_eq!(removed(&engine), ["idle"]);
        // A look (while another handle holds the agent) removes one that ended idle since,
        // and leaves a running one.
        engine.stopped.lock().unwrap().push((
            "later".to_string(),
            i64::from(sandbox_agent::protocol::IDLE_EXIT_STATUS),
        ));
        let later = upkeep.arm(&engine, CALL, "later", deadline, far());
        settle().await;
        later.look.notify_one();
        timers[2].look.notify_one();
        settle().await;
        assert_eq!(removed(&engine), ["idle", "later"]);
        // The others' timers still hold their deadline.
        tokio::time::sleep(Duration::from_secs(3600) + DEADLINE_GRACE).await;
        settle().await;
        let mut gone = removed(&engine);
        gone.sort();
        assert_eq!(gone, ["halted", "idle", "later", "runs"]);
    }

    /// Left alone, a sandbox is removed at its deadline plus the grace, not before.
    #[tokio::test(start_paused = true)]
    async fn an_abandoned_sandbox_is_removed_at_deadline_plus_grace() {
        let engine = holding(&["a"]);
        let upkeep = Upkeep::default();
        let _timer = upkeep.arm(
            &engine,
            CALL,
            "a",
            SystemTime::now() + Duration::from_secs(10),
            far(),
        );
        tokio::time::sleep(Duration::from_secs(10) + DEADLINE_GRACE - Duration::from_millis(50))
            .await;
        settle().await;
        assert!(
            removed(&engine).is_empty(),
            "removed before deadline + grace"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        settle().await;
        assert_eq!(removed(&engine), ["a"]);
    }

    /// An extension moves the timer: nothing is removed at the old deadline, and the
    /// sandbox is removed at the new one plus the grace.
    #[tokio::test(start_paused = true)]
    async fn a_moved_deadline_moves_the_timer() {
        let engine = holding(&["a"]);
        let upkeep = Upkeep::default();
        let start = SystemTime::now();
        let timer = upkeep.arm(&engine, CALL, "a", start + Duration::from_secs(10), far());
        settle().await;
        // (The paused clock moves tokio's time only: the wall clock the timer reads
        // stays at `start`, so the move is made at once.)
        timer.move_to(start + Duration::from_secs(30));
        tokio::time::sleep(Duration::from_secs(25)).await;
        settle().await;
        assert!(
            removed(&engine).is_empty(),
            "removed at the old deadline after the extension"
        );
        tokio::time::sleep(Duration::from_secs(6) + DEADLINE_GRACE).await;
        settle().await;
        assert_eq!(removed(&engine), ["a"], "the new deadline holds");
        drop(timer);
    }

    /// A sandbox removed normally cancels its timer: nothing is removed later, and the
    /// task is gone.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_normal_removal_cancels_the_timer() {
        let engine = holding(&["a"]);
        let upkeep = Upkeep::default();
        let before = alive_tasks();
        let timer = upkeep.arm(
            &engine,
            CALL,
            "a",
            SystemTime::now() + Duration::from_secs(10),
            far(),
        );
        assert_eq!(alive_tasks(), before + 1);
        let e = engine.clone();
        let killer: Killer = Arc::new(move || {
            let e = e.clone();
            Box::pin(
                async move { crate::provision::teardown::remove_container(&*e, CALL, "a").await },
            )
        });
        timer.cancelled_by(killer)().await.unwrap();
        settle().await;
        assert_eq!(alive_tasks(), before, "the cancelled timer's task ended");
        *engine.running.lock().unwrap() = vec!["a".into()];
        tokio::time::sleep(Duration::from_secs(60)).await;
        settle().await;
        assert_eq!(removed(&engine), ["a"], "only the normal removal");
    }

    /// Dropping the backend's upkeep ends every timer and the periodic sweep: no task
    /// is left, nothing is removed or listed afterwards, and the engine is not kept.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn dropping_the_backend_ends_every_task() {
        let engine = holding(&["a", "b"]);
        let upkeep = Upkeep::default();
        let before = alive_tasks();
        let soon = SystemTime::now() + Duration::from_secs(5);
        let _a = upkeep.arm(&engine, CALL, "a", soon, far());
        let _b = upkeep.arm(&engine, CALL, "b", soon, far());
        upkeep.start_sweeps(&engine, CALL, Some(Duration::from_secs(1)));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        settle().await;
        assert_eq!(*engine.lists.lock().unwrap(), 2, "swept every second");
        assert_eq!(alive_tasks(), before + 3);
        drop(upkeep);
        settle().await;
        assert_eq!(alive_tasks(), before, "a task outlived its backend");
        tokio::time::sleep(Duration::from_secs(60)).await;
        settle().await;
        assert!(removed(&engine).is_empty());
        assert_eq!(*engine.lists.lock().unwrap(), 2);
        assert_eq!(Arc::strong_count(&engine), 1, "the tasks held the engine");
    }

    /// The periodic sweep can be turned off, and never runs faster than its minimum.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_periodic_sweep_is_optional_and_bounded_below() {
        let engine = holding(&[]);
        let upkeep = Upkeep::default();
        let before = alive_tasks();
        upkeep.start_sweeps(&engine, CALL, None);
        assert_eq!(alive_tasks(), before, "off: no task");
        upkeep.start_sweeps(&engine, CALL, Some(Duration::ZERO));
        tokio::time::sleep(MIN_SWEEP_INTERVAL * 3 + Duration::from_millis(10)).await;
        settle().await;
        assert_eq!(*engine.lists.lock().unwrap(), 3);
    }
}
