//! A warm pool of never-used sandboxes.
//!
//! [`Pool`] keeps up to `size` fresh sandboxes of one [`CreateOptions`] ready, so
//! [`Pool::acquire`] can hand one out without waiting for the engine. A sandbox is handed
//! out once and never returns to the pool (no sharing across tenants, ever). Spares whose
//! remaining lifetime falls below [`PoolConfig::min_remaining`] are killed and replaced,
//! not handed out. Dropping the pool (or [`Pool::shutdown`]) kills every spare.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Backend, CreateOptions, Result, Sandbox, SandboxError};

/// How a [`Pool`] behaves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Spares kept ready (at least 1).
    pub size: usize,
    /// Options every spare is created with.
    pub options: CreateOptions,
    /// A spare with less lifetime left than this is replaced instead of handed out.
    /// Default: a fifth of the lifetime, at most 60 s.
    pub min_remaining: Option<Duration>,
}

impl PoolConfig {
    /// `size` spares created with `options`.
    pub fn new(size: usize, options: CreateOptions) -> Self {
        PoolConfig {
            size,
            options,
            min_remaining: None,
        }
    }

    /// Sets the minimum remaining lifetime of a spare handed out.
    pub fn min_remaining(mut self, d: Duration) -> Self {
        self.min_remaining = Some(d);
        self
    }

    fn effective_min_remaining(&self) -> Duration {
        self.min_remaining
            .unwrap_or_else(|| (self.options.timeout / 5).min(Duration::from_secs(60)))
    }
}

struct Spare {
    sandbox: Box<dyn Sandbox>,
    expires: Instant,
}

struct State {
    spares: VecDeque<Spare>,
    creating: usize,
    closed: bool,
    last_error: Option<Arc<SandboxError>>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    config: PoolConfig,
    state: Mutex<State>,
    wake_refill: Notify,
    spare_ready: Notify,
}

/// Pool statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Spares ready now.
    pub ready: usize,
    /// Spares being created.
    pub creating: usize,
}

/// A bounded warm pool; see the module docs.
pub struct Pool {
    inner: Arc<Inner>,
    /// The background refill; taken (aborted and awaited) by the first `shutdown`.
    refill: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("backend", &self.inner.backend.name())
            .field("size", &self.inner.config.size)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Pool {
    /// Starts a pool and begins filling it in the background. Must be called inside a tokio
    /// runtime. The options are validated now, so a bad configuration fails here.
    pub fn new(backend: Arc<dyn Backend>, config: PoolConfig) -> Result<Pool> {
        if config.size == 0 || config.size > 256 {
            return Err(SandboxError::config(
                format!("pool size {} is out of range", config.size),
                "use a pool size from 1 to 256",
            ));
        }
        config.options.validate()?;
        if config.effective_min_remaining() >= config.options.timeout {
            return Err(SandboxError::config(
                "pool min_remaining is not below the sandbox lifetime",
                "lower PoolConfig::min_remaining or raise CreateOptions::timeout",
            ));
        }
        let inner = Arc::new(Inner {
            backend,
            config,
            state: Mutex::new(State {
                spares: VecDeque::new(),
                creating: 0,
                closed: false,
                last_error: None,
            }),
            wake_refill: Notify::new(),
            spare_ready: Notify::new(),
        });
        let refill = Mutex::new(Some(tokio::spawn(refill_loop(inner.clone()))));
        Ok(Pool { inner, refill })
    }

    /// Current statistics.
    pub fn stats(&self) -> PoolStats {
        let s = self.inner.lock();
        PoolStats {
            ready: s.spares.len(),
            creating: s.creating,
        }
    }

    /// The last error the background refill hit, if any (cleared by a successful create).
    /// Shared, since the pool keeps it for every caller that asks.
    pub fn last_error(&self) -> Option<Arc<SandboxError>> {
        self.inner.lock().last_error.clone()
    }

    /// Hands out a never-used sandbox: a ready spare at once, else a cold create.
    pub async fn acquire(&self) -> Result<Box<dyn Sandbox>> {
        if let Some(sb) = self.take_spare() {
            return Ok(sb);
        }
        if self.inner.lock().closed {
            return Err(SandboxError::config(
                "the pool was shut down",
                "create a new Pool",
            ));
        }
        self.inner
            .backend
            .create(self.inner.config.options.clone())
            .await
    }

    /// Waits up to `max` for a spare before falling back to a cold create.
    pub async fn acquire_within(&self, max: Duration) -> Result<Box<dyn Sandbox>> {
        let deadline = Instant::now() + max;
        loop {
            if let Some(sb) = self.take_spare() {
                return Ok(sb);
            }
            let notified = self.inner.spare_ready.notified();
            if let Some(sb) = self.take_spare() {
                return Ok(sb);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.acquire().await;
            }
        }
    }

    /// Waits until `n` spares are ready (at most `size`), or `max` elapsed; returns the
    /// number ready.
    pub async fn wait_ready(&self, n: usize, max: Duration) -> usize {
        let deadline = Instant::now() + max;
        let n = n.min(self.inner.config.size);
        loop {
            let notified = self.inner.spare_ready.notified();
            let ready = self.stats().ready;
            if ready >= n {
                return ready;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.stats().ready;
            }
        }
    }

    fn take_spare(&self) -> Option<Box<dyn Sandbox>> {
        let now = Instant::now();
        let min_remaining = self.inner.config.effective_min_remaining();
        let mut stale = Vec::new();
        let found = {
            let mut s = self.inner.lock();
            let mut found = None;
            while let Some(spare) = s.spares.pop_front() {
                if is_stale(spare.expires, now, min_remaining) {
                    stale.push(spare.sandbox);
                } else {
                    found = Some(spare.sandbox);
                    break;
                }
            }
            found
        };
        // Dropping a stale spare kills it in the background (its own teardown guard).
        drop(stale);
        self.inner.wake_refill.notify_one();
        found
    }

    /// Stops refilling and kills every spare (bounded by the teardown grace each). Returns
    /// once the creates still in flight are dropped too: their removal is then scheduled
    /// by the adapter's teardown guard (see `teardown::wait_for_teardowns`).
    pub async fn shutdown(&self) {
        let spares: Vec<Spare> = {
            let mut s = self.inner.lock();
            s.closed = true;
            s.spares.drain(..).collect()
        };
        let refill = self.refill.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = refill {
            // Aborting only asks; awaiting the task is what drops its creates.
            task.abort();
            let _ = task.await;
        }
        let kills = spares.iter().map(|s| s.sandbox.kill());
        let _ = futures::future::join_all(kills).await;
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(task) = self
            .refill
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
        let mut s = self.inner.lock();
        s.closed = true;
        // Each spare's own drop schedules its bounded kill.
        s.spares.clear();
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A spare is stale once its remaining lifetime is at most `min_remaining`. One predicate
/// for hand-out and refill, so the refill loop never wakes for a spare it then keeps.
fn is_stale(expires: Instant, now: Instant, min_remaining: Duration) -> bool {
    expires.saturating_duration_since(now) <= min_remaining
}

// Holds a strong reference; `Pool::drop` / `shutdown` abort this task.
async fn refill_loop(inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let wanted = {
            let mut s = inner.lock();
            if s.closed {
                return;
            }
            let now = Instant::now();
            let min_remaining = inner.config.effective_min_remaining();
            // Replace spares about to expire instead of handing them out later.
            s.spares
                .retain(|sp| !is_stale(sp.expires, now, min_remaining));
            let have = s.spares.len() + s.creating;
            let wanted = inner.config.size.saturating_sub(have);
            s.creating += wanted;
            wanted
        };
        let mut failed = false;
        if wanted > 0 {
            let creates = (0..wanted).map(|_| {
                let inner = inner.clone();
                async move {
                    let r = inner.backend.create(inner.config.options.clone()).await;
                    let expires = Instant::now() + inner.config.options.timeout;
                    let mut s = inner.lock();
                    s.creating -= 1;
                    match r {
                        Ok(sandbox) if !s.closed => {
                            s.spares.push_back(Spare { sandbox, expires });
                            s.last_error = None;
                            drop(s);
                            inner.spare_ready.notify_waiters();
                            true
                        }
                        Ok(_closed) => true,
                        Err(e) => {
                            s.last_error = Some(Arc::new(e));
                            false
                        }
                    }
                }
            });
            failed = futures::future::join_all(creates)
                .await
                .iter()
                .any(|ok| !ok);
        }
        // Sleep until woken by an acquire, or until the next spare needs replacing.
        let next_expiry = {
            let s = inner.lock();
            s.spares
                .iter()
                .map(|sp| sp.expires - inner.config.effective_min_remaining())
                .min()
        };
        let wake = inner.wake_refill.notified();
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        backoff = Duration::from_millis(100);
        if wanted > 0 {
            continue;
        }
        match next_expiry {
            Some(at) => {
                let _ = tokio::time::timeout_at(at, wake).await;
            }
            None => wake.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Capability, CodeOptions, Command, ExecResult, FileSystem, IsolationTier, Process,
        RunOptions,
    };
    use async_trait::async_trait;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, Default)]
    struct Counts {
        created: AtomicUsize,
        killed: AtomicUsize,
        /// Creates dropped before they finished (what an engine's teardown guard removes).
        abandoned: AtomicUsize,
    }

    /// Counts a create dropped before it finished.
    struct InFlightCreate(Arc<Counts>, bool);

    impl Drop for InFlightCreate {
        fn drop(&mut self) {
            if !self.1 {
                self.0.abandoned.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    #[derive(Debug)]
    struct TestBackend {
        counts: Arc<Counts>,
        create_delay: Duration,
    }

    #[derive(Debug)]
    struct TestSandbox {
        id: String,
        counts: Arc<Counts>,
        killed: std::sync::atomic::AtomicBool,
    }

    impl Drop for TestSandbox {
        fn drop(&mut self) {
            if !self.killed.swap(true, Ordering::SeqCst) {
                self.counts.killed.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    #[async_trait]
    impl Backend for TestBackend {
        fn name(&self) -> &str {
            "test"
        }
        fn capabilities(&self) -> Capability {
            Capability::RUN_COMMAND | Capability::NETWORK_POLICY
        }
        fn isolation(&self) -> IsolationTier {
            IsolationTier::Container
        }
        async fn create(&self, _o: CreateOptions) -> Result<Box<dyn Sandbox>> {
            let mut in_flight = InFlightCreate(self.counts.clone(), false);
            tokio::time::sleep(self.create_delay).await;
            in_flight.1 = true;
            let n = self.counts.created.fetch_add(1, Ordering::SeqCst);
            Ok(Box::new(TestSandbox {
                id: format!("sb-{n}"),
                counts: self.counts.clone(),
                killed: Default::default(),
            }))
        }
        async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
            Err(SandboxError::Connect {
                id: id.into(),
                message: "unknown".into(),
                source: None,
            })
        }
    }

    #[async_trait]
    impl Sandbox for TestSandbox {
        fn id(&self) -> &str {
            &self.id
        }
        fn backend(&self) -> &str {
            "test"
        }
        fn capabilities(&self) -> Capability {
            Capability::RUN_COMMAND
        }
        fn isolation(&self) -> IsolationTier {
            IsolationTier::Container
        }
        async fn run(&self, _c: Command, _o: RunOptions) -> Result<ExecResult> {
            Ok(ExecResult::new(0, "", ""))
        }
        async fn run_code(&self, _c: &str, _o: CodeOptions) -> Result<ExecResult> {
            Err(SandboxError::unsupported(Capability::RUN_CODE, "test"))
        }
        fn stream(&self, _c: Command, _o: RunOptions) -> Result<Process> {
            Err(SandboxError::unsupported(Capability::STREAMING, "test"))
        }
        fn files(&self) -> Result<&dyn FileSystem> {
            Err(SandboxError::unsupported(Capability::FILESYSTEM, "test"))
        }
        async fn kill(&self) -> Result<()> {
            if !self.killed.swap(true, Ordering::SeqCst) {
                self.counts.killed.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
        fn native(&self) -> &dyn std::any::Any {
            self
        }
    }

    fn pool(size: usize, lifetime: Duration, delay: Duration) -> (Pool, Arc<Counts>) {
        let counts = Arc::new(Counts::default());
        let backend = Arc::new(TestBackend {
            counts: counts.clone(),
            create_delay: delay,
        });
        let cfg = PoolConfig::new(size, CreateOptions::default().timeout(lifetime));
        (Pool::new(backend, cfg).unwrap(), counts)
    }

    #[tokio::test(start_paused = true)]
    async fn last_error_is_the_typed_error() {
        let _serial = crate::layer::tests::SERIAL.lock().await;
        // The layer refuses a GPU the backend lacks, so every refill fails the same way.
        let backend = crate::layer::enforce(Arc::new(TestBackend {
            counts: Arc::default(),
            create_delay: Duration::ZERO,
        }));
        let options = CreateOptions::default().resources(crate::Resources::default().gpu(1));
        let p = Pool::new(backend, PoolConfig::new(1, options)).unwrap();
        assert_eq!(p.wait_ready(1, Duration::from_secs(1)).await, 0);
        let e = p.last_error().expect("the refill failure is kept");
        assert_eq!(e.code(), crate::ErrorCode::CapabilityNotSupported);
    }

    #[tokio::test(start_paused = true)]
    async fn fills_and_refills_without_reuse() {
        let (p, counts) = pool(3, Duration::from_secs(300), Duration::from_millis(200));
        assert_eq!(p.wait_ready(3, Duration::from_secs(5)).await, 3);
        let a = p.acquire().await.unwrap();
        let b = p.acquire().await.unwrap();
        assert_ne!(a.id(), b.id());
        assert_eq!(p.wait_ready(3, Duration::from_secs(5)).await, 3);
        assert_eq!(
            counts.created.load(Ordering::SeqCst),
            5,
            "two refills, never a reuse"
        );
        assert!(p.stats().ready + p.stats().creating <= 3, "bounded");
    }

    #[tokio::test(start_paused = true)]
    async fn spare_near_deadline_is_replaced_not_handed_out() {
        let (p, counts) = pool(1, Duration::from_secs(100), Duration::from_millis(10));
        p.wait_ready(1, Duration::from_secs(1)).await;
        let first = counts.created.load(Ordering::SeqCst);
        // min_remaining defaults to 20 s: after 85 s the spare must have been replaced.
        tokio::time::sleep(Duration::from_secs(85)).await;
        assert!(counts.created.load(Ordering::SeqCst) > first);
        assert!(
            counts.killed.load(Ordering::SeqCst) >= 1,
            "stale spare killed"
        );
        let sb = p.acquire().await.unwrap();
        assert_ne!(sb.id(), "sb-0");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_kills_spares() {
        let (p, counts) = pool(4, Duration::from_secs(300), Duration::from_millis(10));
        p.wait_ready(4, Duration::from_secs(1)).await;
        p.shutdown().await;
        assert_eq!(counts.killed.load(Ordering::SeqCst), 4);
        assert!(p.acquire().await.is_err(), "closed pool refuses");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_returns_after_the_creates_in_flight_are_dropped() {
        // A create dropped mid-way is removed by the adapter's teardown guard, which its
        // drop schedules: a shutdown that returned before that drop would let a caller
        // (a process about to exit) miss the removal.
        let (p, counts) = pool(2, Duration::from_secs(300), Duration::from_secs(10));
        tokio::task::yield_now().await;
        assert_eq!(p.stats().creating, 2, "both creates in flight");
        p.shutdown().await;
        assert_eq!(counts.abandoned.load(Ordering::SeqCst), 2);
        assert_eq!(counts.created.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn drop_kills_spares() {
        let (p, counts) = pool(2, Duration::from_secs(300), Duration::from_millis(10));
        p.wait_ready(2, Duration::from_secs(1)).await;
        drop(p);
        assert_eq!(counts.killed.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_acquires_get_distinct_sandboxes() {
        let (p, _counts) = pool(4, Duration::from_secs(300), Duration::from_millis(50));
        p.wait_ready(4, Duration::from_secs(1)).await;
        let got = futures::future::join_all((0..8).map(|_| p.acquire())).await;
        let mut ids: Vec<String> = got
            .into_iter()
            .map(|r| r.unwrap().id().to_string())
            .collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 8);
    }

    #[test]
    fn bad_config_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let counts = Arc::new(Counts::default());
            let b: Arc<dyn Backend> = Arc::new(TestBackend {
                counts,
                create_delay: Duration::ZERO,
            });
            assert!(Pool::new(b.clone(), PoolConfig::new(0, CreateOptions::default())).is_err());
            let cfg = PoolConfig::new(1, CreateOptions::default())
                .min_remaining(Duration::from_secs(999));
            assert!(Pool::new(b, cfg).is_err());
        });
    }
}
