//! Deliberately broken backend decorators (feature `broken`), to prove the suite catches
//! broken adapters.
//!
//! [`wrap`] puts one [`Flaw`] around any working backend; [`BrokenProbes`] forwards an
//! adapter's probes and wraps its fault backend the same way. Each flaw names the one
//! trial that must catch it ([`Flaw::caught_by`]); `tests/broken_adapters.rs` runs that
//! trial against the wrapped fake, requires it to fail, and requires the same trial to
//! pass on the unbroken fake. `CASES.md` lists, per trial, the flaws that prove it can
//! fail. Never use these outside tests.
//!
//! Some flaws model an adapter that skipped a kernel-level setting (capabilities, cgroup
//! limits) by rewriting what the sandbox reports about itself: a wrapper cannot take a
//! setting away from a real container, and what these flaws prove is that the trial reads
//! and judges that evidence rather than passing whatever it sees.

use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use sandbox_core::teardown::OrphanInfo;
use sandbox_core::{
    Backend, Capability, CodeOptions, Command, CreateOptions, Egress, ErrorCode, ExecResult,
    FileInfo, FileSystem, IsolationTier, ManagedSandbox, NetworkPolicy, Process, ReapableBackend,
    Resources, Result, RichResult, RunOptions, Sandbox, SandboxError, StartedExec,
};

use crate::probes::{CanarySpec, EngineLimits, Faults, Injection, Probes};

/// One way an adapter can be broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flaw {
    /// `run`/`run_code` ignore the timeout (they inherit the lifetime instead) and turn
    /// `ExecutionTimeout` into a successful exit 0.
    SwallowTimeouts,
    /// Declares `NETWORK_POLICY` but creates with egress `Allow` when `Deny` was asked.
    PretendNetworkPolicy,
    /// `Debug` of a sandbox prints the secret values it was created with.
    LeakSecrets,
    /// A failing kill surfaces as a raw `Engine` error instead of `Connect` (no reap hint).
    LeakKillError,
    /// Processes are never killed: a dropped `run` future or `Process` leaves the remote
    /// process running.
    OrphanProcesses,
    /// Declares `INGRESS_PORTS` and accepts ingress ports at create, but publishes nothing:
    /// `ingress_address` names a loopback port where no sandbox program answers.
    PretendIngress,
    /// `run_code` returns its printed output a second time as an untyped rich result.
    UntypedRichResults,
    /// A stream ends after one second without output, reporting exit 0 while the
    /// process still runs.
    StreamEndsOnPause,
    /// After a refused kill, every later call reports that kill's failure instead of its
    /// own outcome.
    PoisonAfterFailedKill,
    /// `mkdir` always creates missing parents, even without `parents`.
    MkdirAlwaysParents,
    /// Capabilities are not dropped: the sandbox's processes keep root's bounding and
    /// permitted sets (modelled on what `/proc/<pid>/status` reports).
    KeepCapabilities,
    /// A sandbox reports a different isolation tier than its backend.
    TierMismatch,
    /// Memory and pids limits are ignored: the sandbox gets the defaults.
    IgnoreLimits,
    /// Without explicit limits the sandbox is unlimited (modelled on the cgroup files
    /// reading `max`).
    UnlimitedDefaults,
    /// Dropping a handle without `kill()` leaves the sandbox running.
    LeakOnDrop,
    /// Declares `EGRESS_ALLOWLIST` without honouring it.
    DeclareUnhonoured,
    /// Does not declare `STATEFUL_CODE` but still runs code in contexts.
    EmulateUndeclared,
    /// An exec timeout kills the whole sandbox, not just that process.
    TimeoutKillsSandbox,
    /// An exec timeout kills only the exec's pid, not its process group: background
    /// children survive.
    KillOnlyExecPid,
    /// An exec timeout also kills what earlier commands left running in the background
    /// (every process group any command started), not just the timed-out command's.
    TimeoutKillsStrays,
    /// `stream()` ignores the timeout it was given.
    IgnoreStreamTimeout,
    /// Egress `Allow` is silently turned into `Deny`.
    SilentlyDenyAllow,
    /// The sandbox lifetime is ignored (the sandbox lives for an hour).
    IgnoreLifetime,
    /// An argv command is joined into a `sh -c` string.
    ArgvViaShell,
    /// A missing executable exits 126 with its message on stdout.
    MissingBinary126,
    /// Secrets are passed as plain environment, so the engine stores them.
    SecretsInEngineEnv,
    /// `connect` of a dead id creates a new sandbox instead of failing.
    ConnectRevives,
    /// A create that is refused provisions a sandbox first (and leaves it).
    RefuseAfterProvisioning,
    /// Output past `output_cap` is silently truncated instead of refused.
    TruncateSilently,
    /// `stream()` starts the process at once, before the first poll.
    EagerStream,
    /// A dropped handle is never reported when its teardown cannot happen: no orphan
    /// warning (the handle's drop does nothing).
    NoOrphanWarning,
    /// `read` of a directory returns empty data instead of `IsADirectory`.
    ReadDirReturnsData,
    /// Engine errors escape unmapped: a failed create is a raw `Engine` error.
    RawEngineErrors,
    /// `stat` reports no modification time and mode 0.
    StaleFileInfo,
    /// `CreateOptions::workdir` is ignored: commands run in the default directory.
    IgnoreWorkdir,
    /// Metadata keys are not checked: a key with control characters reaches the engine.
    UncheckedLabelKeys,
    /// No init as PID 1: the main process is a plain `sleep` (modelled on `/proc/1/comm`).
    NoInit,
    /// Swap is left on (modelled on `memory.swap.max` reading `max`).
    SwapEnabled,
    /// No CPU quota (modelled on `cpu.max` reading `max`).
    NoCpuQuota,
    /// `list_managed` shows running sandboxes only: a stopped one the engine still holds
    /// is never found by `reap`.
    HideStopped,
    /// A provider's failure becomes a `Creation` error without its cause.
    CauselessCreationError,
    /// A create past its bound is reported as a plain `Creation` failure, not
    /// `CreateTimeout`.
    CreateTimeoutAsCreation,
    /// A missing credential is reported as a plain `Creation` failure, not `Auth`.
    AuthAsCreation,
    /// `stream()` reads the process's output as fast as it comes into an unbounded
    /// buffer, however slowly the consumer reads it.
    UnboundedStreamBuffer,
    /// `upload` copies what a local tree's symlinks point at (outside the tree, too).
    UploadFollowsLinks,
    /// `download` writes an archive's escaping symlinks as they are instead of refusing
    /// them.
    UnsafeUnpack,
    /// `stat` drops the setuid, setgid and sticky bits (an engine's Go file mode read as
    /// if it were a Unix one).
    DropSpecialModeBits,
    /// `read` of a file past the read cap returns (here: empty) data instead of
    /// `ResourceLimitExceeded`.
    UncappedRead,
    /// Declares `STDIN` but drops `RunOptions::stdin` and `interactive`: the command reads
    /// end of input at once and takes no live input.
    DropStdin,
    /// `ls` reads its listing line by line: a name with a newline in it becomes several
    /// entries (the helper-script listings the adapters once printed one per line).
    SplitNamesOnNewline,
}

impl Flaw {
    /// Every flaw.
    pub const ALL: [Flaw; 50] = [
        Flaw::SwallowTimeouts,
        Flaw::PretendNetworkPolicy,
        Flaw::LeakSecrets,
        Flaw::LeakKillError,
        Flaw::OrphanProcesses,
        Flaw::PretendIngress,
        Flaw::UntypedRichResults,
        Flaw::StreamEndsOnPause,
        Flaw::PoisonAfterFailedKill,
        Flaw::MkdirAlwaysParents,
        Flaw::KeepCapabilities,
        Flaw::TierMismatch,
        Flaw::IgnoreLimits,
        Flaw::UnlimitedDefaults,
        Flaw::LeakOnDrop,
        Flaw::DeclareUnhonoured,
        Flaw::EmulateUndeclared,
        Flaw::TimeoutKillsSandbox,
        Flaw::KillOnlyExecPid,
        Flaw::TimeoutKillsStrays,
        Flaw::IgnoreStreamTimeout,
        Flaw::SilentlyDenyAllow,
        Flaw::IgnoreLifetime,
        Flaw::ArgvViaShell,
        Flaw::MissingBinary126,
        Flaw::SecretsInEngineEnv,
        Flaw::ConnectRevives,
        Flaw::RefuseAfterProvisioning,
        Flaw::TruncateSilently,
        Flaw::EagerStream,
        Flaw::NoOrphanWarning,
        Flaw::ReadDirReturnsData,
        Flaw::RawEngineErrors,
        Flaw::StaleFileInfo,
        Flaw::IgnoreWorkdir,
        Flaw::UncheckedLabelKeys,
        Flaw::NoInit,
        Flaw::SwapEnabled,
        Flaw::NoCpuQuota,
        Flaw::HideStopped,
        Flaw::CauselessCreationError,
        Flaw::CreateTimeoutAsCreation,
        Flaw::AuthAsCreation,
        Flaw::UnboundedStreamBuffer,
        Flaw::UploadFollowsLinks,
        Flaw::UnsafeUnpack,
        Flaw::DropSpecialModeBits,
        Flaw::UncappedRead,
        Flaw::DropStdin,
        Flaw::SplitNamesOnNewline,
    ];

    /// The trials that must fail on a backend with this flaw (each passes without it).
    pub fn caught_by(self) -> &'static [&'static str] {
        match self {
            Flaw::SwallowTimeouts => &["contract::run::timeout_kills_only_that_process"],
            Flaw::PretendNetworkPolicy => &[
                "contract::policy::egress_deny_really_denies",
                "contract::policy::deny_leaves_only_loopback",
            ],
            Flaw::LeakSecrets => &["contract::lifecycle::debug_shows_id_never_secrets"],
            Flaw::LeakKillError => {
                &["contract::cancellation::failing_kill_is_connect_error_with_reap_hint"]
            }
            Flaw::OrphanProcesses => &[
                "contract::cancellation::drop_mid_run_kills_process",
                "contract::streaming::cleanup_after_drop",
            ],
            Flaw::PretendIngress => &["contract::policy::ingress_published_or_refused"],
            Flaw::UntypedRichResults => &["contract::run_code::rich_results_typed_or_absent"],
            Flaw::StreamEndsOnPause => &["contract::streaming::cleanup_after_full_iteration"],
            Flaw::PoisonAfterFailedKill => {
                &["contract::cancellation::teardown_failure_never_hides_callers_error"]
            }
            Flaw::MkdirAlwaysParents => &["contract::files::mkdir_parents"],
            Flaw::KeepCapabilities => &[
                "contract::hardening::cap_eff_zero_pid1",
                "contract::hardening::cap_eff_zero_self",
            ],
            Flaw::TierMismatch => &["contract::lifecycle::sandbox_tier_equals_backend_tier"],
            Flaw::IgnoreLimits => &[
                "contract::hardening::limits_as_requested",
                "contract::hostile::fork_bomb_bounded_by_pids",
                "contract::hostile::memory_hog_killed_sandbox_survives",
            ],
            Flaw::UnlimitedDefaults => &["contract::policy::caps_cannot_be_unset"],
            Flaw::LeakOnDrop => &["contract::lifecycle::drop_without_kill_tears_down"],
            Flaw::DeclareUnhonoured => &["contract::policy::allowlist_enforced_or_refused"],
            Flaw::EmulateUndeclared => &["contract::capabilities::every_undeclared_flag_refuses"],
            Flaw::TimeoutKillsSandbox => &[
                "contract::run::timeout_kills_only_that_process",
                "contract::hostile::junk_in_shm_tmp_run_cannot_break_the_timeout",
            ],
            Flaw::KillOnlyExecPid => &[
                "contract::run::timeout_kills_process_tree",
                "contract::hostile::timeout_kills_background_and_setsid_children",
            ],
            Flaw::TimeoutKillsStrays => &["contract::run::detached_child_survives_another_timeout"],
            Flaw::IgnoreStreamTimeout => &["contract::streaming::timeout_from_iteration"],
            Flaw::SilentlyDenyAllow => &["contract::policy::allow_adds_an_interface"],
            Flaw::IgnoreLifetime => &[
                "contract::lifecycle::lifetime_backstop_ends_sandbox",
                "contract::lifecycle::default_lifetime_is_applied",
            ],
            Flaw::ArgvViaShell => &["contract::run::list_not_via_shell"],
            Flaw::MissingBinary126 => &["contract::run::missing_binary_argv_is_127"],
            Flaw::SecretsInEngineEnv => &["contract::hardening::secrets_not_in_engine_env"],
            Flaw::ConnectRevives => &["contract::lifecycle::connect_dead_is_connect_error"],
            Flaw::RefuseAfterProvisioning => &["contract::policy::gpu_refused_without_capability"],
            Flaw::TruncateSilently => &[
                "contract::run::output_cap_exceeded_is_typed",
                "contract::hostile::huge_output_capped",
            ],
            Flaw::EagerStream => &["contract::streaming::starts_on_first_poll"],
            Flaw::NoOrphanWarning => &[
                "contract::cancellation::grace_expiry_warns_orphan_with_id",
                "contract::cancellation::failing_teardown_only_warns",
            ],
            Flaw::ReadDirReturnsData => &["contract::files::read_of_dir_is_typed_error"],
            Flaw::RawEngineErrors => &["contract::errors::no_raw_engine_error_escapes"],
            Flaw::StaleFileInfo => &["contract::files::stat_mode_and_modified"],
            Flaw::IgnoreWorkdir => &["contract::run::create_workdir_applies"],
            Flaw::UncheckedLabelKeys => &["contract::policy::label_key_with_control_chars_refused"],
            Flaw::NoInit => &["contract::hardening::pid1_is_an_init"],
            Flaw::SwapEnabled => &["contract::hardening::swap_disabled_and_follows_memory"],
            Flaw::NoCpuQuota => &["contract::hardening::cpu_quota_read_back"],
            Flaw::HideStopped => &["contract::lifecycle::list_managed_shows_stopped"],
            Flaw::CauselessCreationError => {
                &["contract::errors::provider_failure_is_creation_error"]
            }
            Flaw::CreateTimeoutAsCreation => {
                &["contract::errors::stalled_create_is_create_timeout"]
            }
            Flaw::AuthAsCreation => &["contract::errors::missing_credential_is_auth_error"],
            Flaw::UnboundedStreamBuffer => &["contract::streaming::large_output_bounded_memory"],
            Flaw::UploadFollowsLinks => &["contract::files::upload_never_follows_links_out"],
            Flaw::UnsafeUnpack => &["contract::files::download_rejects_tar_path_escape"],
            Flaw::DropSpecialModeBits => &["contract::files::stat_keeps_special_mode_bits"],
            Flaw::UncappedRead => {
                &["contract::hostile::huge_sparse_file_read_and_download_refused"]
            }
            Flaw::DropStdin => &[
                "contract::run::stdin_reaches_the_command",
                "contract::streaming::stdin_streams_through",
                "contract::streaming::live_input_is_read_as_it_is_written",
            ],
            Flaw::SplitNamesOnNewline => &["contract::files::ls_name_with_a_newline_is_one_entry"],
        }
    }
}

/// Wraps `inner` so that it has `flaw`.
pub fn wrap(inner: Arc<dyn Backend>, flaw: Flaw) -> Arc<dyn Backend> {
    Arc::new(BrokenBackend {
        inner,
        flaw,
        last_options: Mutex::new(None),
    })
}

/// Remote work a flaw deliberately abandons (never killed by a drop), held until the
/// process ends so the suite's leak check, not a destructor, finds it.
static ABANDONED: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());

fn abandon(thing: impl Any + Send) {
    if let Ok(mut held) = ABANDONED.lock() {
        held.push(Box::new(thing));
    }
}

/// A backend with a flaw.
#[derive(Debug)]
pub struct BrokenBackend {
    inner: Arc<dyn Backend>,
    flaw: Flaw,
    /// The last options a create succeeded with (`ConnectRevives` creates from them).
    last_options: Mutex<Option<CreateOptions>>,
}

impl BrokenBackend {
    fn sandbox(
        &self,
        inner: Box<dyn Sandbox>,
        secrets: Vec<String>,
        ingress: Vec<u16>,
    ) -> Box<dyn Sandbox> {
        Box::new(BrokenSandbox {
            inner: Arc::from(inner),
            flaw: self.flaw,
            secrets,
            ingress,
            poisoned: Mutex::new(None),
        })
    }

    /// Options with the same metadata that the inner backend accepts.
    fn plain(options: &CreateOptions) -> CreateOptions {
        let mut plain = CreateOptions::default();
        plain.template = options.template.clone();
        plain.metadata = options.metadata.clone();
        plain
    }
}

#[async_trait]
impl Backend for BrokenBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capability {
        adjust_caps(self.flaw, self.inner.capabilities())
    }
    fn isolation(&self) -> IsolationTier {
        self.inner.isolation()
    }
    async fn create(&self, mut options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        match self.flaw {
            Flaw::PretendNetworkPolicy if options.network.egress == Egress::Deny => {
                options.network.egress = Egress::Allow;
            }
            Flaw::SilentlyDenyAllow if options.network.egress == Egress::Allow => {
                options.network = NetworkPolicy::deny();
            }
            Flaw::DeclareUnhonoured if matches!(options.network.egress, Egress::AllowList(_)) => {
                // Says it filters, gives full egress.
                options.network.egress = Egress::Allow;
            }
            Flaw::IgnoreLimits => {
                options.resources = Resources::default();
            }
            Flaw::IgnoreLifetime => {
                options.timeout = Duration::from_secs(3600);
            }
            Flaw::SecretsInEngineEnv => {
                for (k, v) in std::mem::take(&mut options.secrets) {
                    options.env.insert(k, v.expose().to_string());
                }
            }
            Flaw::IgnoreWorkdir => {
                options.workdir = None;
            }
            Flaw::UncheckedLabelKeys => {
                // The keys the engine would receive, control characters and all: the
                // inner backend only sees them cleaned, as if the engine took them.
                let bad = options
                    .metadata
                    .keys()
                    .any(|k| k.chars().any(char::is_control));
                if bad {
                    options.metadata = options
                        .metadata
                        .into_iter()
                        .map(|(k, v)| (k.chars().filter(|c| !c.is_control()).collect(), v))
                        .collect();
                }
            }
            _ => {}
        }
        let ingress = if self.flaw == Flaw::PretendIngress {
            std::mem::take(&mut options.network.ingress_ports)
        } else {
            vec![]
        };
        let secrets: Vec<String> = options
            .secrets
            .values()
            .map(|s| s.expose().to_string())
            .collect();
        let created = self.inner.create(options.clone()).await;
        let inner = match created {
            Ok(inner) => inner,
            Err(e) if self.flaw == Flaw::RefuseAfterProvisioning => {
                // Provisions first, then refuses, and leaves what it provisioned.
                if let Ok(provisioned) = self.inner.create(Self::plain(&options)).await {
                    abandon(provisioned);
                }
                return Err(e);
            }
            Err(e) if self.flaw == Flaw::RawEngineErrors => {
                return Err(SandboxError::engine(
                    self.inner.name(),
                    format!("raw engine error: {e}"),
                ));
            }
            Err(e)
                if (self.flaw == Flaw::CauselessCreationError
                    && e.code() == ErrorCode::Creation)
                    || (self.flaw == Flaw::CreateTimeoutAsCreation
                        && e.code() == ErrorCode::CreateTimeout)
                    || (self.flaw == Flaw::AuthAsCreation && e.code() == ErrorCode::Auth) =>
            {
                return Err(SandboxError::creation(self.inner.name(), "create failed"));
            }
            Err(e) => return Err(e),
        };
        if let Ok(mut last) = self.last_options.lock() {
            *last = Some(Self::plain(&options));
        }
        Ok(self.sandbox(inner, secrets, ingress))
    }
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        match self.inner.connect(id).await {
            Ok(inner) => Ok(self.sandbox(inner, vec![], vec![])),
            Err(e) if self.flaw == Flaw::ConnectRevives && e.code() == ErrorCode::Connect => {
                let options = self
                    .last_options
                    .lock()
                    .ok()
                    .and_then(|o| o.clone())
                    .unwrap_or_default();
                let inner = self.inner.create(options).await?;
                Ok(self.sandbox(inner, vec![], vec![]))
            }
            Err(e) => Err(e),
        }
    }
    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        self.inner
            .as_reapable()
            .map(|_| self as &dyn ReapableBackend)
    }
}

fn adjust_caps(flaw: Flaw, caps: Capability) -> Capability {
    match flaw {
        Flaw::PretendIngress => caps | Capability::INGRESS_PORTS,
        Flaw::DeclareUnhonoured => caps | Capability::EGRESS_ALLOWLIST,
        Flaw::EmulateUndeclared => caps - Capability::STATEFUL_CODE,
        _ => caps,
    }
}

#[async_trait]
impl ReapableBackend for BrokenBackend {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        let mut listed = match self.inner.as_reapable() {
            Some(r) => r.list_managed(labels).await?,
            None => return Err(SandboxError::unsupported(Capability::empty(), self.name())),
        };
        if self.flaw == Flaw::HideStopped {
            listed.retain(|m| m.state != sandbox_core::SandboxState::Stopped);
        }
        Ok(listed)
    }
    async fn kill_managed(&self, id: &str) -> Result<bool> {
        match self.inner.as_reapable() {
            Some(r) => r.kill_managed(id).await,
            None => Err(SandboxError::unsupported(Capability::empty(), self.name())),
        }
    }
}

struct BrokenSandbox {
    inner: Arc<dyn Sandbox>,
    flaw: Flaw,
    secrets: Vec<String>,
    /// Ingress ports asked for (and silently dropped) under `PretendIngress`.
    ingress: Vec<u16>,
    /// Under `PoisonAfterFailedKill`: the failed kill every later call reports.
    poisoned: Mutex<Option<String>>,
}

impl std::fmt::Debug for BrokenSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("BrokenSandbox");
        d.field("inner", &self.inner);
        if self.flaw == Flaw::LeakSecrets {
            d.field("secrets", &self.secrets);
        }
        d.finish()
    }
}

impl Drop for BrokenSandbox {
    fn drop(&mut self) {
        // The handle's own teardown never runs: the sandbox is neither killed nor, when
        // that matters (a hanging engine), reported as orphaned.
        if matches!(self.flaw, Flaw::LeakOnDrop | Flaw::NoOrphanWarning) {
            abandon(self.inner.clone());
        }
    }
}

/// A started process's output, re-wrapped: the flaws that change how a stream ends.
fn rewrap(inner: Process, timeout: Duration, info: OrphanInfo, end_on_pause: bool) -> Process {
    let start = async move {
        let mut inner = inner;
        inner.start().await?;
        let held = Arc::new(tokio::sync::Mutex::new(Some(inner)));
        let out = held.clone();
        let output = futures::stream::unfold(out, move |out| async move {
            let next = {
                let mut guard = out.lock().await;
                let p = guard.as_mut()?;
                if end_on_pause {
                    match tokio::time::timeout(Duration::from_secs(1), p.next()).await {
                        Ok(item) => item,
                        Err(_) => {
                            // Ends the stream; the process is left running.
                            if let Some(p) = guard.take() {
                                abandon(p);
                            }
                            None
                        }
                    }
                } else {
                    p.next().await
                }
            };
            next.map(|item| (item, out))
        })
        .boxed();
        let exit_code = Box::pin(async move {
            let guard = held.lock().await;
            Ok(guard.as_ref().and_then(|p| p.returncode()).unwrap_or(0))
        });
        Ok(StartedExec {
            output,
            exit_code,
            killer: Arc::new(|| Box::pin(async { Ok(()) })),
            input: None,
        })
    };
    Process::new(Box::pin(start), timeout, info)
}

impl BrokenSandbox {
    fn info(&self) -> OrphanInfo {
        OrphanInfo::new(self.inner.id(), self.inner.backend(), BTreeMap::new())
    }

    /// A process whose killer does nothing and whose real process is never dropped (so
    /// its own drop-kill never runs).
    fn orphaning_stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        let timeout = options.timeout;
        let mut inner = self.inner.stream(cmd, options)?;
        let start = async move {
            inner.start().await?;
            let held: &'static Mutex<Process> = Box::leak(Box::new(Mutex::new(inner)));
            let output = futures::stream::poll_fn(move |cx| match held.lock() {
                Ok(mut p) => p.poll_next_unpin(cx),
                Err(_) => std::task::Poll::Ready(None),
            })
            .boxed();
            let exit_code = Box::pin(async move {
                held.lock()
                    .ok()
                    .and_then(|p| p.returncode())
                    .ok_or_else(|| SandboxError::engine("broken", "no exit code"))
            });
            Ok(StartedExec {
                output,
                exit_code,
                killer: Arc::new(|| Box::pin(async { Ok(()) })),
                input: None,
            })
        };
        Ok(Process::new(
            Box::pin(start),
            timeout.unwrap_or(Duration::from_secs(300)),
            self.info(),
        ))
    }

    fn poison(&self) -> Result<()> {
        match self.poisoned.lock().ok().and_then(|p| p.clone()) {
            Some(msg) => Err(SandboxError::connect(self.inner.id(), msg)),
            None => Ok(()),
        }
    }

    /// Runs `cmd` with its shell's pid (its process group) recorded in a list every
    /// command appends to; on a timeout, kills every group on the list —
    /// `TimeoutKillsStrays`.
    async fn run_killing_every_group(
        &self,
        cmd: Command,
        options: RunOptions,
    ) -> Result<ExecResult> {
        const GROUPS: &str = "/tmp/.sbx-broken-groups";
        let cmd = match cmd {
            Command::Shell(script) => Command::Shell(format!("echo $$ >> {GROUPS}; {script}")),
            cmd => cmd,
        };
        let r = self.inner.run(cmd, options).await;
        if matches!(&r, Err(e) if e.code() == ErrorCode::ExecutionTimeout) {
            let groups = self
                .inner
                .run(
                    vec!["cat".to_string(), GROUPS.to_string()].into(),
                    RunOptions::default(),
                )
                .await?
                .stdout_text();
            for g in groups.lines().map(str::trim).filter(|g| !g.is_empty()) {
                let _ = self
                    .inner
                    .run(
                        vec!["kill".to_string(), "-9".to_string(), format!("-{g}")].into(),
                        RunOptions::default(),
                    )
                    .await;
            }
        }
        r
    }

    /// Runs `cmd` as a shell job whose pid is recorded, and on expiry kills only that
    /// pid (its group lives on) — `KillOnlyExecPid`.
    async fn run_killing_only_the_pid(
        &self,
        script: &str,
        options: RunOptions,
    ) -> Result<ExecResult> {
        static N: AtomicU64 = AtomicU64::new(0);
        let Some(timeout) = options.timeout else {
            return self
                .inner
                .run(Command::Shell(script.to_string()), options)
                .await;
        };
        let pid_file = format!("/tmp/.sbx-broken-pid-{}", N.fetch_add(1, Ordering::SeqCst));
        let wrapped = format!("echo $$ > {pid_file}; {script}");
        let mut long = options.clone();
        long.timeout = Some(Duration::from_secs(300));
        let mut p = self.inner.stream(Command::Shell(wrapped), long)?;
        p.start().await?;
        let cap = options.output_cap.unwrap_or(64 << 20);
        match tokio::time::timeout(timeout, collect_all(&mut p, cap)).await {
            Ok(r) => r,
            Err(_) => {
                let pid = self
                    .inner
                    .run(
                        ["cat".to_string(), pid_file].to_vec().into(),
                        RunOptions::default(),
                    )
                    .await?
                    .stdout_text();
                let _ = self
                    .inner
                    .run(
                        vec!["kill".to_string(), "-9".to_string(), pid.trim().to_string()].into(),
                        RunOptions::default(),
                    )
                    .await;
                abandon(p);
                Err(SandboxError::execution_timeout(timeout))
            }
        }
    }
}

/// Copies the tree at `from` to `to`, following every symlink (what `UploadFollowsLinks`
/// uploads).
fn copy_dereferenced(from: &Path, to: &Path) -> std::io::Result<()> {
    if std::fs::metadata(from)?.is_dir() {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            copy_dereferenced(&e.path(), &to.join(e.file_name()))?;
        }
        Ok(())
    } else {
        std::fs::copy(from, to).map(|_| ())
    }
}

/// A started process whose output a task reads as fast as it comes into an unbounded
/// queue (`UnboundedStreamBuffer`).
fn buffer_eagerly(inner: Process, timeout: Duration, info: OrphanInfo) -> Process {
    let start = async move {
        let mut inner = inner;
        inner.start().await?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (code_tx, code_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            while let Some(item) = inner.next().await {
                // Each chunk in its own allocation, as read off a socket (an in-process
                // backend may hand out slices of one shared buffer).
                let item = item.map(|mut c| {
                    c.data = Bytes::copy_from_slice(&c.data);
                    c
                });
                if tx.send(item).is_err() {
                    break;
                }
            }
            let _ = code_tx.send(inner.returncode().unwrap_or(-1));
        });
        let output = futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).boxed();
        let exit_code = Box::pin(async move {
            code_rx
                .await
                .map_err(|_| SandboxError::engine("broken", "no exit code"))
        });
        Ok(StartedExec {
            output,
            exit_code,
            killer: Arc::new(|| Box::pin(async { Ok(()) })),
            input: None,
        })
    };
    Process::new(Box::pin(start), timeout, info)
}

/// Collects a started process's output into a result (the `run` shape).
async fn collect_all(p: &mut Process, cap: usize) -> Result<ExecResult> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(item) = p.next().await {
        let chunk = item?;
        match chunk.stream {
            sandbox_core::StreamKind::Stdout => out.extend_from_slice(&chunk.data),
            sandbox_core::StreamKind::Stderr => err.extend_from_slice(&chunk.data),
        }
        if out.len() + err.len() > cap {
            return Err(SandboxError::resource_limit("output", None));
        }
    }
    Ok(ExecResult::new(p.returncode().unwrap_or(-1), out, err))
}

fn swallow(r: Result<ExecResult>) -> Result<ExecResult> {
    match r {
        Err(e) if e.code() == ErrorCode::ExecutionTimeout => Ok(ExecResult::new(0, "", "")),
        r => r,
    }
}

/// Replaces the value of `field:` lines in a `/proc/<pid>/status` text.
fn with_status_field(text: &str, field: &str, value: &str) -> String {
    text.lines()
        .map(|l| match l.split_once(':') {
            Some((k, _)) if k.trim() == field => format!("{k}:\t{value}"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// What a command reads, for the flaws that model kernel settings.
fn reads(cmd: &Command, what: &str) -> bool {
    match cmd {
        Command::Argv(v) => v.iter().any(|a| a.contains(what)),
        Command::Shell(s) => s.contains(what),
    }
}

impl BrokenSandbox {
    /// What the sandbox reports about itself under the kernel-setting flaws.
    fn rewrite_evidence(&self, cmd: &Command, mut r: ExecResult) -> ExecResult {
        match self.flaw {
            Flaw::KeepCapabilities if reads(cmd, "/status") => {
                // Root's full bounding and permitted sets (CAP_LAST_CAP 40).
                let mut text = r.stdout_text();
                for set in ["CapPrm", "CapEff", "CapBnd"] {
                    text = with_status_field(&text, set, "000001ffffffffff");
                }
                r.stdout = Bytes::from(text);
                r
            }
            Flaw::UnlimitedDefaults
                if r.exit_code == 0
                    && (reads(cmd, "memory.max")
                        || reads(cmd, "pids.max")
                        || reads(cmd, "memory.limit_in_bytes")) =>
            {
                r.stdout = Bytes::from_static(b"max\n");
                r
            }
            Flaw::NoInit if r.exit_code == 0 && reads(cmd, "/proc/1/comm") => {
                r.stdout = Bytes::from_static(b"sleep\n");
                r
            }
            Flaw::SwapEnabled if r.exit_code == 0 && reads(cmd, "memory.swap.max") => {
                r.stdout = Bytes::from_static(b"max\n");
                r
            }
            Flaw::NoCpuQuota if r.exit_code == 0 && reads(cmd, "cpu.max") => {
                r.stdout = Bytes::from_static(b"max 100000\n");
                r
            }
            _ => r,
        }
    }
}

#[async_trait]
impl Sandbox for BrokenSandbox {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn backend(&self) -> &str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capability {
        adjust_caps(self.flaw, self.inner.capabilities())
    }
    fn isolation(&self) -> IsolationTier {
        match (self.flaw, self.inner.isolation()) {
            (Flaw::TierMismatch, IsolationTier::Gvisor) => IsolationTier::Container,
            (Flaw::TierMismatch, _) => IsolationTier::Gvisor,
            (_, tier) => tier,
        }
    }
    async fn run(&self, cmd: Command, mut options: RunOptions) -> Result<ExecResult> {
        self.poison()?;
        match self.flaw {
            Flaw::SwallowTimeouts => {
                options.timeout = None;
                swallow(self.inner.run(cmd, options).await)
            }
            Flaw::OrphanProcesses => {
                let cap = options.output_cap.unwrap_or(64 << 20);
                self.orphaning_stream(cmd, options)?.collect(cap).await
            }
            Flaw::TimeoutKillsSandbox => {
                let r = self.inner.run(cmd, options).await;
                if matches!(&r, Err(e) if e.code() == ErrorCode::ExecutionTimeout) {
                    self.inner.kill().await?;
                }
                r
            }
            Flaw::TimeoutKillsStrays => self.run_killing_every_group(cmd, options).await,
            Flaw::KillOnlyExecPid => match cmd {
                Command::Shell(script) => self.run_killing_only_the_pid(&script, options).await,
                cmd => self.inner.run(cmd, options).await,
            },
            Flaw::ArgvViaShell => {
                let cmd = match cmd {
                    Command::Argv(v) => Command::Shell(v.join(" ")),
                    cmd => cmd,
                };
                self.inner.run(cmd, options).await
            }
            Flaw::DropStdin => {
                options.stdin = None;
                self.inner.run(cmd, options).await
            }
            Flaw::MissingBinary126 => {
                let mut r = self.inner.run(cmd, options).await?;
                if r.exit_code == 127 {
                    r.exit_code = 126;
                    r.stdout = std::mem::take(&mut r.stderr);
                }
                Ok(r)
            }
            Flaw::TruncateSilently => {
                // The cap asked for, or the documented 64 MiB default, applied by cutting
                // the output instead of refusing it.
                let cap = options.output_cap.take().unwrap_or(64 << 20);
                options.output_cap = Some(1 << 30);
                let mut r = self.inner.run(cmd, options).await?;
                r.stdout.truncate(cap);
                r.stderr.truncate(cap.saturating_sub(r.stdout.len()));
                Ok(r)
            }
            Flaw::KeepCapabilities
            | Flaw::UnlimitedDefaults
            | Flaw::NoInit
            | Flaw::SwapEnabled
            | Flaw::NoCpuQuota => {
                let r = self.inner.run(cmd.clone(), options).await?;
                Ok(self.rewrite_evidence(&cmd, r))
            }
            _ => self.inner.run(cmd, options).await,
        }
    }
    async fn run_code(&self, code: &str, mut options: CodeOptions) -> Result<ExecResult> {
        self.poison()?;
        match self.flaw {
            Flaw::SwallowTimeouts => {
                options.timeout = None;
                swallow(self.inner.run_code(code, options).await)
            }
            Flaw::UntypedRichResults => {
                let mut r = self.inner.run_code(code, options).await?;
                let out = r.stdout.clone();
                r.results.push(RichResult::new("", out));
                Ok(r)
            }
            _ => self.inner.run_code(code, options).await,
        }
    }
    fn stream(&self, cmd: Command, mut options: RunOptions) -> Result<Process> {
        self.poison()?;
        match self.flaw {
            Flaw::OrphanProcesses => self.orphaning_stream(cmd, options),
            Flaw::StreamEndsOnPause => {
                let timeout = options.timeout.unwrap_or(Duration::from_secs(300));
                let p = self.inner.stream(cmd, options)?;
                Ok(rewrap(p, timeout, self.info(), true))
            }
            Flaw::IgnoreStreamTimeout => {
                options.timeout = Some(Duration::from_secs(300));
                self.inner.stream(cmd, options)
            }
            Flaw::UnboundedStreamBuffer => {
                let timeout = options.timeout.unwrap_or(Duration::from_secs(300));
                let p = self.inner.stream(cmd, options)?;
                Ok(buffer_eagerly(p, timeout, self.info()))
            }
            Flaw::EagerStream => {
                // Starts a copy at once, whether or not the process is ever polled.
                let inner = self.inner.clone();
                let (c, o) = (cmd.clone(), options.clone());
                tokio::spawn(async move {
                    let _ = inner.run(c, o).await;
                });
                self.inner.stream(cmd, options)
            }
            Flaw::DropStdin => {
                options.stdin = None;
                options.interactive = false;
                self.inner.stream(cmd, options)
            }
            _ => self.inner.stream(cmd, options),
        }
    }
    fn files(&self) -> Result<&dyn FileSystem> {
        self.inner.files()?;
        Ok(self)
    }
    fn ingress_address(&self, port: u16) -> Result<std::net::SocketAddr> {
        if self.flaw == Flaw::PretendIngress && self.ingress.contains(&port) {
            return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        }
        self.inner.ingress_address(port)
    }
    async fn kill(&self) -> Result<()> {
        match self.inner.kill().await {
            Err(e) if self.flaw == Flaw::LeakKillError && e.code() == ErrorCode::Connect => Err(
                SandboxError::engine(self.inner.backend(), format!("raw engine error: {e}")),
            ),
            Err(e) if self.flaw == Flaw::PoisonAfterFailedKill => {
                if let Ok(mut p) = self.poisoned.lock() {
                    *p = Some(format!("kill failed: {e}"));
                }
                Err(e)
            }
            r => r,
        }
    }
    fn native(&self) -> &dyn Any {
        self.inner.native()
    }
}

#[async_trait]
impl FileSystem for BrokenSandbox {
    async fn read(&self, path: &str) -> Result<Bytes> {
        match self.inner.files()?.read(path).await {
            Err(e)
                if self.flaw == Flaw::UncappedRead
                    && e.code() == ErrorCode::ResourceLimitExceeded =>
            {
                Ok(Bytes::new())
            }
            Err(e)
                if self.flaw == Flaw::ReadDirReturnsData && e.code() == ErrorCode::IsADirectory =>
            {
                Ok(Bytes::new())
            }
            r => r,
        }
    }
    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        self.inner.files()?.write(path, data).await
    }
    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        if self.flaw == Flaw::UploadFollowsLinks && local.is_dir() {
            // Uploads a copy in which every symlink is replaced by what it points at.
            let copy =
                tempfile::tempdir().map_err(|e| SandboxError::engine("broken", e.to_string()))?;
            let root = copy.path().join("tree");
            copy_dereferenced(local, &root)
                .map_err(|e| SandboxError::engine("broken", e.to_string()))?;
            return self.inner.files()?.upload(&root, remote).await;
        }
        self.inner.files()?.upload(local, remote).await
    }
    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        match self.inner.files()?.download(remote, local).await {
            Err(e)
                if self.flaw == Flaw::UnsafeUnpack && e.code() == ErrorCode::UnsafeArchiveEntry =>
            {
                // Unpacks anyway, links as the archive names them.
                std::fs::create_dir_all(local)
                    .map_err(|e| SandboxError::engine("broken", e.to_string()))?;
                std::os::unix::fs::symlink("/", local.join("escape"))
                    .map_err(|e| SandboxError::engine("broken", e.to_string()))?;
                Ok(())
            }
            r => r,
        }
    }
    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        let entries = self.inner.files()?.ls(path).await?;
        if self.flaw != Flaw::SplitNamesOnNewline {
            return Ok(entries);
        }
        Ok(entries
            .into_iter()
            .flat_map(|e| {
                e.name
                    .split('\n')
                    .map(|part| {
                        let mut piece = e.clone();
                        piece.name = part.to_string();
                        piece
                    })
                    .collect::<Vec<_>>()
            })
            .collect())
    }
    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let parents = parents || self.flaw == Flaw::MkdirAlwaysParents;
        self.inner.files()?.mkdir(path, parents).await
    }
    async fn remove(&self, path: &str) -> Result<()> {
        self.inner.files()?.remove(path).await
    }
    async fn stat(&self, path: &str) -> Result<FileInfo> {
        let info = self.inner.files()?.stat(path).await?;
        if self.flaw == Flaw::StaleFileInfo {
            let mut stale = info;
            stale.mode = 0;
            stale.modified = None;
            return Ok(stale);
        }
        if self.flaw == Flaw::DropSpecialModeBits {
            let mut masked = info;
            masked.mode &= 0o777;
            return Ok(masked);
        }
        Ok(info)
    }
}

/// Forwards an adapter's probes; the fault backend gets the same flaw.
pub struct BrokenProbes {
    inner: Arc<dyn Probes>,
    flaw: Flaw,
}

impl BrokenProbes {
    /// Wraps `inner`'s probes for a backend with `flaw`.
    pub fn new(inner: Arc<dyn Probes>, flaw: Flaw) -> Self {
        BrokenProbes { inner, flaw }
    }
}

#[async_trait]
impl Probes for BrokenProbes {
    fn base_options(&self) -> CreateOptions {
        self.inner.base_options()
    }
    fn template_without_python(&self) -> Option<String> {
        self.inner.template_without_python()
    }
    fn extra_templates(&self) -> Vec<String> {
        self.inner.extra_templates()
    }
    fn in_process(&self) -> bool {
        self.inner.in_process()
    }
    fn egress_allow(&self) -> bool {
        self.inner.egress_allow()
    }
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        self.inner.canary().await
    }
    async fn bind_canary(&self, spec: &CanarySpec) -> anyhow::Result<std::net::TcpListener> {
        self.inner.bind_canary(spec).await
    }
    async fn engine_env(&self, sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        self.inner.engine_env(sandbox_id).await
    }
    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        let Some(inner) = self.inner.faults().await? else {
            return Ok(None);
        };
        Ok(Some(Arc::new(BrokenFaults {
            backend: wrap(inner.backend(), self.flaw),
            inner,
        })))
    }
    fn symlinks(&self) -> bool {
        self.inner.symlinks()
    }
    fn in_process_storage(&self) -> bool {
        self.inner.in_process_storage()
    }
    async fn engine_limits(&self, sandbox_id: &str) -> anyhow::Result<Option<EngineLimits>> {
        self.inner.engine_limits(sandbox_id).await
    }
    async fn stop_sandbox(&self, sandbox_id: &str) -> anyhow::Result<Injection> {
        self.inner.stop_sandbox(sandbox_id).await
    }
}

struct BrokenFaults {
    inner: Arc<dyn Faults>,
    backend: Arc<dyn Backend>,
}

#[async_trait]
impl Faults for BrokenFaults {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn hang_kills(&self) {
        self.inner.hang_kills().await
    }
    async fn fail_kills(&self) {
        self.inner.fail_kills().await
    }
    async fn heal(&self) {
        self.inner.heal().await
    }
    async fn fail_creates(&self) -> Injection {
        self.inner.fail_creates().await
    }
    async fn stall_creates(&self) -> Injection {
        self.inner.stall_creates().await
    }
    async fn withhold_credential(&self) -> Injection {
        self.inner.withhold_credential().await
    }
}

/// A model of the kernel's view of a sandbox (`/proc/<pid>/status`, `/proc/net/dev`,
/// cgroup v2 files, `/proc/1/comm`), answered from the options the sandbox was created
/// with, in front of an in-process backend. The real suite reports kernel-evidence
/// trials "not applicable" on such a backend; the self-test puts this model in front of
/// the fake so those trials have evidence to judge, and a flaw that changes the options
/// (or the evidence) must make them fail. Not evidence of anything else.
pub fn kernel_model(inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
    Arc::new(ModelBackend { inner })
}

#[derive(Debug)]
struct ModelBackend {
    inner: Arc<dyn Backend>,
}

/// What a hardened container of these options shows its processes.
#[derive(Debug, Clone)]
struct KernelView {
    memory_bytes: u64,
    pids: u64,
    cpu_quota_us: u64,
    egress: bool,
}

impl KernelView {
    fn of(options: &CreateOptions) -> KernelView {
        let r = &options.resources;
        KernelView {
            memory_bytes: r.memory_mb.unwrap_or(sandbox_core::DEFAULT_MEMORY_MB) << 20,
            pids: r.pids.unwrap_or(sandbox_core::DEFAULT_PIDS),
            cpu_quota_us: (r.cpu.unwrap_or(sandbox_core::DEFAULT_CPU) * 100_000.0) as u64,
            egress: options.network.egress != Egress::Deny,
        }
    }

    fn file(&self, path: &str) -> Option<String> {
        const STATUS: &str = "Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nCapInh:\t0000000000000000\n\
             CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n\
             CapAmb:\t0000000000000000\nNoNewPrivs:\t1\n";
        let net = |ifs: &[&str]| {
            let mut s = String::from(
                "Inter-|   Receive                |  Transmit\n face |bytes    packets|bytes    packets\n",
            );
            for i in ifs {
                s.push_str(&format!("{i:>6}: 0 0 0 0\n"));
            }
            s
        };
        Some(match path {
            "/proc/1/status" | "/proc/self/status" => STATUS.to_string(),
            "/proc/1/comm" => "docker-init\n".to_string(),
            "/proc/net/dev" if self.egress => net(&["lo", "eth0"]),
            "/proc/net/dev" => net(&["lo"]),
            "/sys/fs/cgroup/memory.max" => format!("{}\n", self.memory_bytes),
            "/sys/fs/cgroup/memory.swap.max" => "0\n".to_string(),
            "/sys/fs/cgroup/pids.max" => format!("{}\n", self.pids),
            "/sys/fs/cgroup/cpu.max" => format!("{} 100000\n", self.cpu_quota_us),
            _ => return None,
        })
    }
}

#[async_trait]
impl Backend for ModelBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capability {
        self.inner.capabilities()
    }
    fn isolation(&self) -> IsolationTier {
        self.inner.isolation()
    }
    async fn create(&self, options: CreateOptions) -> Result<Box<dyn Sandbox>> {
        let view = KernelView::of(&options);
        let inner = self.inner.create(options).await?;
        Ok(Box::new(ModelSandbox::new(inner, view)))
    }
    async fn connect(&self, id: &str) -> Result<Box<dyn Sandbox>> {
        let inner = self.inner.connect(id).await?;
        Ok(Box::new(ModelSandbox::new(
            inner,
            KernelView::of(&CreateOptions::default()),
        )))
    }
    fn as_reapable(&self) -> Option<&dyn ReapableBackend> {
        self.inner
            .as_reapable()
            .map(|_| self as &dyn ReapableBackend)
    }
}

#[async_trait]
impl ReapableBackend for ModelBackend {
    async fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        match self.inner.as_reapable() {
            Some(r) => r.list_managed(labels).await,
            None => Err(SandboxError::unsupported(Capability::empty(), self.name())),
        }
    }
    async fn kill_managed(&self, id: &str) -> Result<bool> {
        match self.inner.as_reapable() {
            Some(r) => r.kill_managed(id).await,
            None => Err(SandboxError::unsupported(Capability::empty(), self.name())),
        }
    }
}

#[derive(Debug)]
struct ModelSandbox {
    inner: Box<dyn Sandbox>,
    view: KernelView,
    /// Paths `truncate -s` made sparse and huge (the fake stores files densely).
    sparse: Mutex<Vec<String>>,
}

impl ModelSandbox {
    fn new(inner: Box<dyn Sandbox>, view: KernelView) -> Self {
        ModelSandbox {
            inner,
            view,
            sparse: Mutex::new(Vec::new()),
        }
    }

    fn is_sparse(&self, path: &str) -> bool {
        self.sparse
            .lock()
            .is_ok_and(|s| s.iter().any(|p| p == path))
    }

    /// The hostile trials' programs, answered from the configured limits the way a
    /// kernel enforcing them would.
    fn hostile_program(&self, argv: &[String]) -> Option<ExecResult> {
        let [prog, flag, code] = argv else {
            return None;
        };
        if prog != "python3" || flag != "-c" {
            return None;
        }
        if code.contains(crate::hostile::FORK_BOMB_MARK) {
            // Forks succeed until the pids limit (the program itself is one process).
            let attempts: u64 = code
                .split("range(")
                .nth(1)
                .and_then(|r| r.split(')').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let forked = attempts.min(self.view.pids.saturating_sub(1));
            return Some(ExecResult::new(0, format!("{forked}\n"), ""));
        }
        if code.contains(crate::hostile::MEMORY_HOG_MARK) {
            return Some(
                if self.view.memory_bytes < crate::hostile::MEMORY_HOG_MB << 20 {
                    ExecResult::new(137, "", "Killed\n")
                } else {
                    ExecResult::new(0, "survived\n", "")
                },
            );
        }
        None
    }
}

#[async_trait]
impl Sandbox for ModelSandbox {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn backend(&self) -> &str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capability {
        self.inner.capabilities()
    }
    fn isolation(&self) -> IsolationTier {
        self.inner.isolation()
    }
    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult> {
        if let Command::Argv(argv) = &cmd {
            if let [cat, path] = argv.as_slice()
                && cat == "cat"
                && let Some(text) = self.view.file(path)
            {
                return Ok(ExecResult::new(0, text, ""));
            }
            if let [truncate, flag, size, path] = argv.as_slice()
                && truncate == "truncate"
                && flag == "-s"
                && size == crate::hostile::SPARSE_FILE
            {
                if let Ok(mut s) = self.sparse.lock() {
                    s.push(path.clone());
                }
                return Ok(ExecResult::new(0, "", ""));
            }
            if let Some(r) = self.hostile_program(argv) {
                return Ok(r);
            }
        }
        if let Command::Shell(script) = &cmd
            && script.contains(crate::hostile::JUNK_MARK)
        {
            // No /dev/shm, /tmp or /run bookkeeping to overwrite in the fake: what
            // is left of the attack is its pid file and its sleep.
            let rest = "echo $$ > /work/junk-pid; exec sleep 300".to_string();
            return self.inner.run(Command::Shell(rest), options).await;
        }
        self.inner.run(cmd, options).await
    }
    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        self.inner.run_code(code, options).await
    }
    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        self.inner.stream(cmd, options)
    }
    fn files(&self) -> Result<&dyn FileSystem> {
        self.inner.files()?;
        Ok(self)
    }
    fn ingress_address(&self, port: u16) -> Result<std::net::SocketAddr> {
        self.inner.ingress_address(port)
    }
    async fn kill(&self) -> Result<()> {
        self.inner.kill().await
    }
    fn native(&self) -> &dyn Any {
        self.inner.native()
    }
}

/// Files of the model: a sparse 4 GiB file is refused as a capped adapter refuses it;
/// everything else is the inner backend's.
#[async_trait]
impl FileSystem for ModelSandbox {
    async fn read(&self, path: &str) -> Result<Bytes> {
        if self.is_sparse(path) {
            return Err(SandboxError::resource_limit(
                "the model's read cap",
                Some("stream it with download".into()),
            ));
        }
        self.inner.files()?.read(path).await
    }
    async fn write(&self, path: &str, data: Bytes) -> Result<()> {
        self.inner.files()?.write(path, data).await
    }
    async fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        self.inner.files()?.upload(local, remote).await
    }
    async fn download(&self, remote: &str, local: &Path) -> Result<()> {
        if self.is_sparse(remote) {
            return Err(SandboxError::resource_limit(
                "the model's download cap",
                Some("download less".into()),
            ));
        }
        self.inner.files()?.download(remote, local).await
    }
    async fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        self.inner.files()?.ls(path).await
    }
    async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        self.inner.files()?.mkdir(path, parents).await
    }
    async fn remove(&self, path: &str) -> Result<()> {
        self.inner.files()?.remove(path).await
    }
    async fn stat(&self, path: &str) -> Result<FileInfo> {
        self.inner.files()?.stat(path).await
    }
}
