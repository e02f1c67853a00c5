//! The catalogue of flaws: every way an adapter is deliberately broken, and the trials
//! that must catch each one. What each flaw does lives with what it breaks (`backend`,
//! `sandbox`, `exec`, `evidence`, `files`).

use sandbox_core::Capability;

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
    /// Declares `AGENT` and accepts `require_agent`, but its sandboxes run without the
    /// agent (they do not declare it): the silent fall back to the weaker path.
    FallBackSilently,
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
    /// Allowlist entries are not judged against the always-blocked set: one inside it
    /// (the metadata service) or wider than any destination is taken, and the sandbox
    /// gets what it names (modelled as egress `Allow`: the inner backend refuses the
    /// entry itself).
    UncheckedAllowlist,
    /// Declares `PAUSE_RESUME` but `pause` only says so: nothing is frozen.
    PauseDoesNotFreeze,
    /// `resume` only says so: the sandbox stays frozen.
    ResumeDoesNotThaw,
    /// `extend` answers a moved deadline but moves nothing: the sandbox ends at the
    /// deadline it was created with.
    ExtendMovesNothing,
    /// `extend` moves the deadline 30 s further than asked (and says it moved it as
    /// asked): the moved deadline does not hold.
    ExtendOverruns,
    /// The maximum lifetime set at create is not kept: every create allows an hour more.
    ForgetMaximumLifetime,
    /// The idle limit is accepted at create and ignored.
    IgnoreIdleLimit,
    /// The idle limit ends a sandbox even while a command runs (modelled as a lifetime
    /// cut to the idle limit).
    IdleEndsBusySandboxes,
    /// The idle limit ends the sandbox's processes and leaves it stopped, its files on
    /// the engine, until its deadline (an adapter that does not remove what its agent
    /// ended idle): `list_managed` still shows it, stopped.
    IdleLeavesItStopped,
    /// `create` from a snapshot's template starts from the backend's default template:
    /// the snapshot's files are not there.
    SnapshotFilesLost,
    /// `create` from a snapshot's template gives the new sandbox the secrets of the
    /// sandbox the snapshot was made from (as an engine commit that stored them would).
    SnapshotKeepsSecrets,
    /// `list_snapshots` lists none: snapshots are made and never found again.
    SnapshotsUnlisted,
    /// `snapshot` ends the sandbox it was made from.
    SnapshotEndsTheSource,
    /// An exhausted pids limit is reported as the command's own failure (exit 126 with
    /// the shell's "Resource temporarily unavailable"), not as `ResourceLimitExceeded`.
    PidsAsExitCode,
    /// `CreateOptions::hostname` is accepted and ignored: the sandbox keeps the engine's
    /// name for it.
    IgnoreHostname,
    /// Declares `LIVE_EGRESS` but `set_egress` only says so: the policy of create stays.
    SetEgressIgnored,
    /// `set_egress` returns at once and the new policy takes hold 2 s later: forbidden
    /// hosts and open connections stay reachable past the second the contract allows.
    EgressChangeLate,
    /// `egress` reads back the policy of create, whatever was set since.
    EgressReadBackStale,
    /// The deny tier is dropped: a denied host that another tier or the default lets
    /// through is reached.
    DenyTierIgnored,
    /// The exception tier is dropped: an excepted host that a deny entry covers stays
    /// blocked.
    ExceptionTierIgnored,
    /// Declares `STOP_START` but `stop` only says so: the sandbox keeps running.
    StopLeavesItRunning,
    /// `start` only says so: the sandbox stays stopped.
    StartLeavesItStopped,
    /// `start` brings the sandbox back from its template: what was written in its
    /// workdir is gone.
    StartLosesFiles,
    /// `start` runs the sandbox without its egress rules (as a restarted container in a
    /// new network namespace nobody loaded them into): modelled as the restarted
    /// sandbox's commands running in a sandbox with egress `Allow`.
    StartWithoutEgressRules,
    /// A fork's interpreter contexts start empty: what was set before the fork is gone.
    ForkForgetsContexts,
    /// The forks' code runs in the original's contexts: nothing diverges.
    ForksShareContexts,
    /// `fork` ends the original.
    ForkEndsTheOriginal,
    /// A fork's workdir starts empty: the files written before the fork are not there.
    ForkLosesFiles,
    /// A fork's `kill` answers success and removes nothing: the fork is left behind.
    ForksLeftBehind,
    /// Declares `HOST_PORTS`, but a granted host port opens the whole host: its address
    /// on every port (modelled as the fake's host address, loopback, added to the allow
    /// tier, as putting the host on the allowlist would).
    HostPortOpensWholeHost,
    /// Declares `CREDENTIALS` and "brokers" a credential by putting its real value in the
    /// sandbox's environment under the credential's variable (what a proxy that hands the
    /// secret to the sandbox, rather than to the bound host, amounts to). A proxy that
    /// injects for every host cannot be modelled here: the broken decorators wrap the
    /// in-process fake, which has no egress path to put a proxy on.
    CredentialInEnvironment,
    /// Declares `CREDENTIALS` and binds each credential to every host name the sandbox's
    /// allowlist opens, not just its own: the proxy injects the secret for every host
    /// (and takes over their traffic). Needs a real engine ([`Flaw::ON_AN_ENGINE`]).
    CredentialForEveryHost,
    /// Declares `GIT_GATE` but widens the push prefix to every branch
    /// (`refs/heads/`): a push outside the prefix the caller chose lands. Needs a real
    /// engine ([`Flaw::ON_AN_ENGINE`]).
    GitPushAnywhere,
    /// Declares `SSH_AGENT` but offers every key of the host agent instead of the
    /// selected ones. Needs a real engine ([`Flaw::ON_AN_ENGINE`]).
    SshAgentEveryKey,
}

impl Flaw {
    /// The flaws whose trials need what only a real engine gives (an egress path with a
    /// proxy on it, the in-sandbox agent's channel to a host-side gate or ssh-agent):
    /// the fake declares none of those capabilities, so `tests/broken_adapters.rs` cannot
    /// run them. Each engine crate runs them against its own backend instead
    /// (`crates/sandbox-docker/tests/engine_flaws.rs`). Not in [`Flaw::ALL`].
    pub const ON_AN_ENGINE: [Flaw; 3] = [
        Flaw::CredentialForEveryHost,
        Flaw::GitPushAnywhere,
        Flaw::SshAgentEveryKey,
    ];

    /// Every flaw the fake can carry.
    pub const ALL: [Flaw; 82] = [
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
        Flaw::FallBackSilently,
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
        Flaw::UncheckedAllowlist,
        Flaw::PauseDoesNotFreeze,
        Flaw::ResumeDoesNotThaw,
        Flaw::ExtendMovesNothing,
        Flaw::ExtendOverruns,
        Flaw::ForgetMaximumLifetime,
        Flaw::IgnoreIdleLimit,
        Flaw::IdleEndsBusySandboxes,
        Flaw::IdleLeavesItStopped,
        Flaw::SnapshotFilesLost,
        Flaw::SnapshotKeepsSecrets,
        Flaw::SnapshotsUnlisted,
        Flaw::SnapshotEndsTheSource,
        Flaw::PidsAsExitCode,
        Flaw::IgnoreHostname,
        Flaw::SetEgressIgnored,
        Flaw::EgressChangeLate,
        Flaw::EgressReadBackStale,
        Flaw::DenyTierIgnored,
        Flaw::ExceptionTierIgnored,
        Flaw::StopLeavesItRunning,
        Flaw::StartLeavesItStopped,
        Flaw::StartLosesFiles,
        Flaw::StartWithoutEgressRules,
        Flaw::ForkForgetsContexts,
        Flaw::ForksShareContexts,
        Flaw::ForkEndsTheOriginal,
        Flaw::ForkLosesFiles,
        Flaw::ForksLeftBehind,
        Flaw::HostPortOpensWholeHost,
        Flaw::CredentialInEnvironment,
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
            Flaw::FallBackSilently => &["contract::lifecycle::required_agent_is_kept_or_refused"],
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
            Flaw::UncheckedAllowlist => {
                &["contract::policy::allowlist_cannot_open_the_blocked_set"]
            }
            Flaw::PauseDoesNotFreeze => {
                &["contract::pause::a_paused_counter_stops_and_resumes_exactly"]
            }
            Flaw::ResumeDoesNotThaw => &[
                "contract::pause::a_paused_counter_stops_and_resumes_exactly",
                "contract::pause::a_reattached_handle_sees_the_pause",
            ],
            Flaw::ExtendMovesNothing | Flaw::ExtendOverruns => {
                &["contract::lifetime::extend_outlives_the_first_deadline_and_the_new_one_holds"]
            }
            Flaw::ForgetMaximumLifetime => {
                &["contract::lifetime::extend_past_the_maximum_is_refused"]
            }
            Flaw::IgnoreIdleLimit | Flaw::IdleEndsBusySandboxes | Flaw::IdleLeavesItStopped => {
                &["contract::lifetime::an_idle_sandbox_is_removed_and_a_busy_one_is_not"]
            }
            Flaw::SnapshotFilesLost | Flaw::SnapshotKeepsSecrets => {
                &["contract::snapshot::a_template_starts_with_the_files_and_without_the_secrets"]
            }
            Flaw::SnapshotsUnlisted => &["contract::snapshot::snapshots_are_listed_and_removable"],
            Flaw::SnapshotEndsTheSource => {
                &["contract::snapshot::the_original_goes_on_after_a_snapshot"]
            }
            Flaw::PidsAsExitCode => {
                &["contract::hostile::pids_exhaustion_is_typed_and_reset_recovers"]
            }
            Flaw::IgnoreHostname => &["contract::lifecycle::hostname_as_asked"],
            Flaw::SetEgressIgnored => &[
                "contract::egress_live::an_added_host_becomes_reachable_and_deny_again_closes_it",
                "contract::egress_live::the_policy_read_back_is_the_one_set",
                "contract::egress_live::root_inside_cannot_change_the_policy",
                "contract::egress_live::allow_all_except_blocks_exactly_the_listed_names",
                "contract::egress_live::a_sandbox_created_without_network_stays_closed",
            ],
            Flaw::EgressChangeLate => {
                &["contract::egress_live::a_forbidden_host_is_cut_within_a_second"]
            }
            Flaw::EgressReadBackStale => &[
                "contract::egress_live::the_policy_read_back_is_the_one_set",
                "contract::egress_live::root_inside_cannot_change_the_policy",
            ],
            Flaw::DenyTierIgnored => &["contract::egress_live::deny_beats_allow"],
            Flaw::ExceptionTierIgnored => &["contract::egress_live::an_exception_beats_deny"],
            Flaw::StopLeavesItRunning => &[
                "contract::stopstart::calls_on_a_stopped_sandbox_are_refused_at_once",
                "contract::stopstart::a_stopped_sandbox_is_killed_or_expires_leaving_nothing",
            ],
            Flaw::StartLeavesItStopped => {
                &["contract::stopstart::start_brings_back_the_agent_and_a_fresh_context"]
            }
            Flaw::StartLosesFiles => {
                &["contract::stopstart::files_and_installed_packages_survive_stop_and_start"]
            }
            Flaw::StartWithoutEgressRules => {
                &["contract::stopstart::the_egress_policy_holds_after_start"]
            }
            Flaw::ForkForgetsContexts => {
                &["contract::fork::a_context_variable_survives_into_each_fork"]
            }
            Flaw::ForksShareContexts => &["contract::fork::forks_diverge_independently"],
            Flaw::ForkEndsTheOriginal => &["contract::fork::the_original_goes_on"],
            Flaw::ForkLosesFiles => &["contract::fork::a_file_survives_into_each_fork"],
            Flaw::ForksLeftBehind => {
                &["contract::fork::each_fork_has_its_own_id_and_kill_leaves_nothing"]
            }
            Flaw::HostPortOpensWholeHost => &[
                "contract::host_ports::a_granted_port_is_reachable_and_no_other_of_the_host",
                "contract::host_ports::root_inside_cannot_open_the_neighbouring_port",
                "contract::host_ports::host_ports_beside_an_allowlist_change_with_the_policy",
                "contract::host_ports::host_ports_hold_after_stop_and_start",
            ],
            Flaw::CredentialInEnvironment => &[
                "contract::credentials::the_sandbox_holds_only_the_placeholder_and_reaches_the_bound_host_through_the_proxy",
            ],
            // The engine trial (`sandbox_testkit::trials::credentials`): only it has a
            // second host to send the placeholder to.
            Flaw::CredentialForEveryHost => {
                &["engine::credentials::the_bound_host_alone_receives_the_secret"]
            }
            Flaw::GitPushAnywhere => {
                &["contract::git_gate::the_sandbox_pushes_under_its_prefix_and_nowhere_else"]
            }
            Flaw::SshAgentEveryKey => {
                &["contract::ssh_agent::the_sandbox_signs_with_the_selected_key_and_nothing_else"]
            }
        }
    }
}

/// The capabilities a backend (or sandbox) with `flaw` declares, given what the unbroken
/// one declares.
pub(super) fn adjust_caps(flaw: Flaw, caps: Capability) -> Capability {
    match flaw {
        Flaw::PretendIngress => caps | Capability::INGRESS_PORTS,
        Flaw::DeclareUnhonoured => caps | Capability::EGRESS_ALLOWLIST,
        Flaw::EmulateUndeclared => caps - Capability::STATEFUL_CODE,
        Flaw::CredentialInEnvironment => caps | Capability::CREDENTIALS,
        _ => caps,
    }
}
