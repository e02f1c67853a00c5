#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod capture;
pub mod ctx;
pub mod probes;

#[cfg(feature = "broken")]
pub mod broken;

mod cancellation;
mod capabilities;
mod credentials;
mod disk;
mod egress;
mod egress_live;
mod errors;
mod files;
mod fork;
mod git_gate;
mod hardening;
mod host_ports;
mod hostile;
mod lifecycle;
mod lifetime;
mod limits;
pub mod observability;
mod pause;
mod policy;
mod pty;
mod run;
mod run_code;
mod snapshot;
mod ssh_agent;
mod stopstart;
mod streaming;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use libtest_mimic::{Arguments, Conclusion, Trial};
use sandbox_core::labels::{LABEL_SESSION, session_id};
use sandbox_core::teardown::{teardown_grace, wait_for_teardowns};
use sandbox_core::{
    Backend, Capability, CreateOptions, ErrorCode, IsolationTier, Sandbox, SandboxError,
};
use tokio::io::AsyncWriteExt;

pub use crate::credentials::READABLE_DUMP_PY;
pub use crate::ctx::{Ctx, Need, NotApplicable, Skip};
pub use crate::probes::{
    CanarySpec, EgressNames, EngineLimits, Faults, Injection, MAX_PIDS_HEADROOM, NoProbes, Probes,
};
pub use anyhow;
pub use libtest_mimic;

/// Makes the backend under test, on the suite's runtime.
pub type BackendFactory =
    Box<dyn FnOnce() -> BoxFuture<'static, sandbox_core::Result<Arc<dyn Backend>>> + Send>;

/// Runs the whole suite against one backend with the process's command-line arguments
/// (libtest flags: name filters, `--exact`, `--list`, `--ignored`, `--test-threads` …) and
/// returns the exit code. This is the one call an adapter's `tests/contract.rs`
/// (`harness = false`) makes.
pub fn run(factory: BackendFactory, probes: Arc<dyn Probes>) -> ExitCode {
    let args = Arguments::from_args();
    build(factory, probes).run(&args).exit_code()
}

/// A built suite: the shared context and every trial, ready to run.
pub struct Suite {
    ctx: Arc<Ctx>,
    trials: Vec<Trial>,
}

/// The outcome of [`Suite::run`].
#[derive(Debug)]
pub struct Report {
    /// What libtest-mimic concluded (its `num_ignored` includes the not-applicable ones).
    pub conclusion: Conclusion,
    /// Ids of this session's sandboxes still held by the engine after all trials (they
    /// have been killed since). Non-empty fails the run.
    pub leaked: Vec<String>,
    /// Trials that reported "not applicable: in-process backend" (kernel evidence on the
    /// fake): neither passes nor ignored.
    pub not_applicable: u64,
    /// Trials ignored for any other reason (a missing probe, an undeclared capability a
    /// positive trial needs, a runtime skip). Non-zero fails the run unless ignoring is
    /// allowed (see [`ignored_allowed`]) or the engine is absent outside CI.
    pub ignored: u64,
    /// Whether ignored trials are tolerated in this run.
    pub ignored_allowed: bool,
}

/// Whether this run tolerates ignored trials: `SBX_CONTRACT_ALLOW_IGNORED=1` (what
/// `cargo xtask contract <backend> --allow-ignored` sets, for local use). Without it a
/// first-party backend's run with any ignored trial fails: an ignored security trial is
/// an unproven one, and CI must not go green on it.
pub fn ignored_allowed() -> bool {
    std::env::var("SBX_CONTRACT_ALLOW_IGNORED").is_ok_and(|v| v == "1" || v == "true")
}

impl Report {
    /// Whether any trial failed, anything leaked, or a trial was ignored where that is
    /// not allowed.
    pub fn failed(&self) -> bool {
        self.conclusion.has_failed()
            || !self.leaked.is_empty()
            || (self.ignored > 0 && !self.ignored_allowed)
    }

    /// The process exit code for this report.
    pub fn exit_code(&self) -> ExitCode {
        if self.failed() {
            ExitCode::from(101)
        } else {
            ExitCode::SUCCESS
        }
    }
}

/// Builds the suite: installs the teardown-event capture, starts the shared runtime, calls
/// the factory on it, resolves the probes (starting the canary server) and builds every
/// trial. Use [`Suite::run`] to run it; [`run`] does both with the process's arguments.
pub fn build(factory: BackendFactory, probes: Arc<dyn Probes>) -> Suite {
    build_with(factory, probes, true)
}

/// [`build`] without core's enforcement layer in front of the backend: the trials then
/// judge the backend alone. Only for the broken-adapter self-test, which proves that each
/// trial itself catches its flaw (the layer would mask some flaws — an undeclared
/// capability, a refusal after provisioning — before the trial could see them).
#[cfg(feature = "broken")]
pub fn build_without_layer(factory: BackendFactory, probes: Arc<dyn Probes>) -> Suite {
    build_with(factory, probes, false)
}

fn build_with(factory: BackendFactory, probes: Arc<dyn Probes>, layered: bool) -> Suite {
    capture::install();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sandbox-contract")
        .build()
        .expect("the suite needs a tokio runtime");
    let made = rt.block_on(factory());
    let required = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
        || std::env::var("SBX_CONTRACT_REQUIRED").is_ok_and(|v| v == "1");
    let (backend, unavailable) = match made {
        // Core's enforcement layer, as the facade applies it: the suite proves adapters
        // as users reach them (a wrapped backend is kept as is).
        Ok(b) if layered => (sandbox_core::layer::enforce(b), None),
        Ok(b) => (b, None),
        Err(e) => {
            // A missing engine is skipped locally and fails in CI; any other factory error
            // is a real failure everywhere.
            let missing = matches!(
                e.code(),
                ErrorCode::EngineUnavailable | ErrorCode::BackendNotInstalled
            );
            let u = ctx::Unavailable {
                reason: e.render(),
                fail: required || !missing,
            };
            (Arc::new(UnavailableBackend) as Arc<dyn Backend>, Some(u))
        }
    };
    let caps = backend.capabilities();
    let tier = backend.isolation();
    let (canary, faults) = if unavailable.is_none() {
        let canary = rt.block_on(start_canary(probes.as_ref()));
        let faults = rt.block_on(probes.faults());
        (canary, faults)
    } else {
        (Ok(None), Ok(None))
    };
    // A probe that errors is not a probe that is absent: its trials fail with the error.
    let (canary, canary_error) = match canary {
        Ok(c) => (c, None),
        Err(e) => (None, Some(e)),
    };
    let (faults, faults_error) = match faults {
        Ok(f) => (f, None),
        Err(e) => (None, Some(format!("the faults probe failed: {e:#}"))),
    };
    let ctx = Arc::new(Ctx {
        rt,
        backend,
        probes,
        caps,
        tier,
        canary,
        canary_error,
        faults,
        faults_error,
        unavailable,
        fault_lock: tokio::sync::Mutex::new(()),
        heavy_lock: tokio::sync::Mutex::new(()),
        background_kills: Arc::new(AtomicUsize::new(0)),
        not_applicable: Arc::new(AtomicUsize::new(0)),
    });
    let trials = all_trials(&ctx);
    Suite { ctx, trials }
}

/// Every trial of every area, in area order.
fn all_trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let mut t = Vec::new();
    t.extend(lifecycle::trials(ctx));
    t.extend(cancellation::trials(ctx));
    t.extend(run::trials(ctx));
    t.extend(run_code::trials(ctx));
    t.extend(streaming::trials(ctx));
    t.extend(pty::trials(ctx));
    t.extend(pause::trials(ctx));
    t.extend(lifetime::trials(ctx));
    t.extend(snapshot::trials(ctx));
    t.extend(stopstart::trials(ctx));
    t.extend(fork::trials(ctx));
    t.extend(files::trials(ctx));
    // The run and files areas once more on every other test image the adapter knows
    // (busybox `ls`/`stat`/`sh` differ from Debian's).
    for template in ctx.probes.extra_templates() {
        t.extend(ctx.on_template(&template, || run::trials(ctx)));
        t.extend(ctx.on_template(&template, || files::trials(ctx)));
    }
    t.extend(policy::trials(ctx));
    t.extend(egress::trials(ctx));
    t.extend(egress_live::trials(ctx));
    t.extend(host_ports::trials(ctx));
    t.extend(hostile::trials(ctx));
    t.extend(hardening::trials(ctx));
    t.extend(disk::trials(ctx));
    t.extend(errors::trials(ctx));
    t.extend(capabilities::trials(ctx));
    t.extend(observability::trials(ctx));
    t.extend(ssh_agent::trials(ctx));
    t.extend(git_gate::trials(ctx));
    t.extend(credentials::trials(ctx));
    t
}

impl Suite {
    /// Names of all trials (ignored ones carry `[ignored: reason]`).
    pub fn trial_names(&self) -> Vec<String> {
        self.trials.iter().map(|t| t.name().to_string()).collect()
    }

    /// The shared context.
    pub fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Runs the trials selected by `args`, then the leak check: every sandbox of this
    /// session still held by the engine is reported, killed, and fails the run.
    pub fn run(self, args: &Arguments) -> Report {
        let Suite { ctx, trials } = self;
        let conclusion = libtest_mimic::run(args, trials);
        let leaked = if ctx.unavailable.is_some() || args.list {
            vec![]
        } else {
            ctx.rt.block_on(leak_check(&ctx))
        };
        if !leaked.is_empty() {
            eprintln!(
                "sandbox-contract: {} sandbox(es) of this session leaked and were killed: {leaked:?}",
                leaked.len()
            );
        }
        let not_applicable = ctx.not_applicable.load(Ordering::SeqCst) as u64;
        let ignored = conclusion.num_ignored.saturating_sub(not_applicable);
        // A missing engine outside CI is a visible local skip, not an unproven trial; in
        // CI its trials already fail.
        let ignored_allowed = ignored_allowed() || ctx.unavailable.is_some();
        if not_applicable > 0 {
            eprintln!(
                "sandbox-contract: {not_applicable} trial(s) not applicable (kernel evidence on \
                 an in-process backend, or a state the backend cannot be in; each names its \
                 reason); they are not passes"
            );
        }
        if ignored > 0 && !args.list {
            if ignored_allowed {
                eprintln!("sandbox-contract: {ignored} trial(s) ignored (allowed in this run)");
            } else {
                eprintln!(
                    "sandbox-contract: FAILED: {ignored} trial(s) ignored; an ignored trial is \
                     an unproven one (SBX_CONTRACT_ALLOW_IGNORED=1, or `cargo xtask contract \
                     <backend> --allow-ignored`, tolerates it for local use)"
                );
            }
        }
        Report {
            conclusion,
            leaked,
            not_applicable,
            ignored,
            ignored_allowed,
        }
    }
}

async fn leak_check(ctx: &Ctx) -> Vec<String> {
    let grace = teardown_grace();
    ctx.wait_background_kills(grace * 2 + Duration::from_secs(1))
        .await;
    wait_for_teardowns(grace + Duration::from_secs(1)).await;
    let Some(reaper) = ctx.backend.as_reapable() else {
        return vec![];
    };
    let mut filter = BTreeMap::new();
    filter.insert(LABEL_SESSION.to_string(), session_id().to_string());
    let deadline = tokio::time::Instant::now() + grace + Duration::from_secs(2);
    let left = loop {
        let left = match reaper.list_managed(&filter).await {
            Ok(l) => l,
            Err(e) => return vec![format!("<list_managed failed: {}>", e.render())],
        };
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut leaked = Vec::new();
    for m in left {
        let case = m
            .labels
            .get("io.sandbox-rs.meta.contract")
            .cloned()
            .unwrap_or_default();
        let _ = reaper.kill_managed(&m.id).await;
        leaked.push(format!("{} (case {case}, {:?})", m.id, m.state));
    }
    leaked
}

/// Binds the canary server the adapter asked for and serves `<token>\n` to every client.
async fn start_canary(probes: &dyn Probes) -> Result<Option<ctx::Canary>, String> {
    let spec = match probes.canary().await {
        Ok(Some(spec)) => spec,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("the canary probe failed: {e:#}")),
    };
    let listener = probes
        .bind_canary(&spec)
        .await
        .and_then(|l| {
            l.set_nonblocking(true)?;
            Ok(tokio::net::TcpListener::from_std(l)?)
        })
        .map_err(|e| format!("canary server cannot bind {}: {e:#}", spec.bind))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("canary server address: {e}"))?
        .port();
    let token = ctx::token("sbx-canary-");
    let line = format!("{token}\n");
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let line = line.clone();
            tokio::spawn(async move {
                let _ = sock.write_all(line.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    Ok(Some(ctx::Canary { spec, port, token }))
}

/// Stands in for a backend whose factory failed; no trial calls it.
#[derive(Debug)]
struct UnavailableBackend;

#[sandbox_core::async_trait]
impl Backend for UnavailableBackend {
    fn name(&self) -> &str {
        "unavailable"
    }
    fn capabilities(&self) -> Capability {
        Capability::all()
    }
    fn isolation(&self) -> IsolationTier {
        IsolationTier::Unknown
    }
    async fn create(&self, _options: CreateOptions) -> sandbox_core::Result<Box<dyn Sandbox>> {
        Err(SandboxError::config(
            "backend unavailable",
            "see the suite output",
        ))
    }
    async fn connect(&self, _id: &str) -> sandbox_core::Result<Box<dyn Sandbox>> {
        Err(SandboxError::config(
            "backend unavailable",
            "see the suite output",
        ))
    }
}
