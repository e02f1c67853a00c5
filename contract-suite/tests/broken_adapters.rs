//! The suite catches broken adapters: the fake backend, wrapped with one deliberate flaw
//! each (`sandbox_contract::broken`), fails every trial named for that flaw
//! (`Flaw::caught_by`) — and the same trial passes on the unbroken fake.
//!
//! The suite runs WITHOUT core's enforcement layer here (`build_without_layer`): the
//! layer would mask some flaws before a trial could see them, and what is proven is that
//! each trial catches its flaw by itself.
//!
//! The fake has no kernel, which is why the real fake run reports the kernel-evidence
//! trials (`/proc/*/status`, cgroup files, `/proc/net/dev`) "not applicable". Here the
//! probes say the backend is NOT in-process and `broken::kernel_model` answers those reads
//! from the options each sandbox was created with: what is proven is that each trial
//! judges the evidence it reads and fails when a flaw changes it.

use std::sync::Arc;

use sandbox_contract::broken::{self, BrokenProbes, Flaw};
use sandbox_contract::libtest_mimic::Arguments;
use sandbox_contract::{BackendFactory, CanarySpec, Faults, Injection, Probes};
use sandbox_core::{Backend, async_trait};
use sandbox_fake::FakeBackend;

/// Probes for the fake, written against its public API.
struct FakeSuiteProbes {
    backend: FakeBackend,
}

struct FakeFaults {
    backend: FakeBackend,
}

#[async_trait]
impl Faults for FakeFaults {
    fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }
    async fn hang_kills(&self) {
        self.backend.faults().set_kill_hang(true);
    }
    async fn fail_kills(&self) {
        self.backend.faults().set_kill_failure(true);
    }
    async fn heal(&self) {
        self.backend.faults().heal();
    }
    async fn fail_creates(&self) -> Injection {
        self.backend.faults().set_provider_failure(true);
        Injection::Injected
    }
    async fn stall_creates(&self) -> Injection {
        self.backend.faults().set_create_stall(true);
        Injection::Injected
    }
    async fn withhold_credential(&self) -> Injection {
        self.backend
            .faults()
            .set_missing_credential(Some("SBX_FAKE_TOKEN"));
        Injection::Injected
    }
}

#[async_trait]
impl Probes for FakeSuiteProbes {
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        Ok(Some(CanarySpec {
            bind: "127.0.0.1:0".parse()?,
            dial_host: "127.0.0.1".into(),
        }))
    }
    /// As the fake's own contract run names them: `localhost` is the canary's address in
    /// `/etc/hosts`; `.invalid` never resolves.
    fn egress_names(&self) -> Option<sandbox_contract::EgressNames> {
        Some(sandbox_contract::EgressNames {
            listed: "localhost".into(),
            unlisted: "unlisted.sbx-contract.invalid".into(),
        })
    }
    async fn engine_env(&self, sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        let handle = self
            .backend
            .sandbox(sandbox_id)
            .ok_or_else(|| anyhow::anyhow!("the fake holds no sandbox {sandbox_id}"))?;
        Ok(Some(handle.engine_env()))
    }
    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        Ok(Some(Arc::new(FakeFaults {
            backend: self.backend.with_own_faults(),
        })))
    }
    async fn stop_sandbox(&self, sandbox_id: &str) -> anyhow::Result<Injection> {
        let handle = self
            .backend
            .sandbox(sandbox_id)
            .ok_or_else(|| anyhow::anyhow!("the fake holds no sandbox {sandbox_id}"))?;
        handle.stop();
        Ok(Injection::Injected)
    }
    fn in_process_storage(&self) -> bool {
        true
    }
    /// Deliberately `false` (see the module docs).
    fn in_process(&self) -> bool {
        false
    }
}

/// Runs exactly one trial against the fake (optionally with a flaw); returns
/// (passed, failed, ignored).
fn run_one(flaw: Option<Flaw>, trial: &str) -> (u64, u64, u64) {
    // A short create bound keeps the stalled-create trial fast.
    let fake = FakeBackend::builder()
        .create_timeout(std::time::Duration::from_secs(2))
        .build();
    let probes: Arc<dyn Probes> = Arc::new(FakeSuiteProbes {
        backend: fake.clone(),
    });
    // The kernel model sits between the flaw and the fake (see the module docs).
    let modelled = broken::kernel_model(Arc::new(fake));
    let (probes, backend): (Arc<dyn Probes>, Arc<dyn Backend>) = match flaw {
        Some(f) => (
            Arc::new(BrokenProbes::new(probes, f)),
            broken::wrap(modelled, f),
        ),
        None => (probes, modelled),
    };
    let factory: BackendFactory = Box::new(move || Box::pin(async move { Ok(backend) }));
    let suite = sandbox_contract::build_without_layer(factory, probes);
    assert!(
        suite.trial_names().iter().any(|n| n == trial),
        "trial {trial} is not runnable against the fake: {:?}",
        suite
            .trial_names()
            .into_iter()
            .filter(|n| n.starts_with(trial))
            .collect::<Vec<_>>()
    );
    let args = Arguments {
        filter: Some(trial.to_string()),
        exact: true,
        quiet: true,
        test_threads: Some(1),
        // A flawed run is meant to fail: its report would read as a failure in the log
        // (and in the CI failure digest). An unbroken run's failure is real and prints.
        logfile: flaw.map(|_| "/dev/null".to_string()),
        ..Arguments::default()
    };
    let report = suite.run(&args);
    (
        report.conclusion.num_passed,
        report.conclusion.num_failed,
        report.conclusion.num_ignored,
    )
}

/// Every trial named for `flaw` passes on the unbroken fake and fails with the flaw.
fn check(flaw: Flaw) {
    let trials = flaw.caught_by();
    assert!(!trials.is_empty(), "no trial is named for {flaw:?}");
    // Fault trials read the process-wide tracing capture by sandbox id, and the fake's
    // ids repeat across instances: they never run concurrently with each other.
    static FAULT_TRIALS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = trials
        .iter()
        .any(|t| t.starts_with("contract::cancellation::"))
        .then(|| FAULT_TRIALS.lock().unwrap_or_else(|p| p.into_inner()));
    // Every flawed run first: the fake's ids repeat across instances, and the tracing
    // capture is process-wide, so evidence an unbroken run leaves (an orphan warning for
    // "its" id) must not be seen by a flawed run.
    for trial in trials {
        assert_eq!(
            run_one(Some(flaw), trial),
            (0, 1, 0),
            "{trial} must FAIL on the fake with {flaw:?}"
        );
    }
    for trial in trials {
        assert_eq!(
            run_one(None, trial),
            (1, 0, 0),
            "{trial} must pass on the unbroken fake"
        );
    }
}

macro_rules! caught {
    ($($test:ident => $flaw:ident,)*) => {
        $(
            #[test]
            fn $test() {
                check(Flaw::$flaw);
            }
        )*

        /// Every flaw has its own test above.
        #[test]
        fn every_flaw_is_tested() {
            let tested = [$(Flaw::$flaw),*];
            for f in Flaw::ALL {
                assert!(tested.contains(&f), "{f:?} has no test");
            }
            assert!(Flaw::ALL.len() >= 25, "at least 25 flaws");
        }
    };
}

caught! {
    timeout_swallower_is_caught => SwallowTimeouts,
    pretended_network_policy_is_caught => PretendNetworkPolicy,
    secret_leak_is_caught => LeakSecrets,
    raw_kill_error_is_caught => LeakKillError,
    orphan_leaver_is_caught => OrphanProcesses,
    pretended_ingress_is_caught => PretendIngress,
    untyped_rich_results_are_caught => UntypedRichResults,
    stream_ending_on_a_pause_is_caught => StreamEndsOnPause,
    poison_after_failed_kill_is_caught => PoisonAfterFailedKill,
    mkdir_always_parents_is_caught => MkdirAlwaysParents,
    kept_capabilities_are_caught => KeepCapabilities,
    tier_mismatch_is_caught => TierMismatch,
    ignored_limits_are_caught => IgnoreLimits,
    unlimited_defaults_are_caught => UnlimitedDefaults,
    leak_on_drop_is_caught => LeakOnDrop,
    declared_but_unhonoured_is_caught => DeclareUnhonoured,
    emulated_but_undeclared_is_caught => EmulateUndeclared,
    silent_fallback_is_caught => FallBackSilently,
    timeout_killing_the_sandbox_is_caught => TimeoutKillsSandbox,
    killing_only_the_exec_pid_is_caught => KillOnlyExecPid,
    stray_killer_is_caught => TimeoutKillsStrays,
    ignored_stream_timeout_is_caught => IgnoreStreamTimeout,
    silently_denied_allow_is_caught => SilentlyDenyAllow,
    ignored_lifetime_is_caught => IgnoreLifetime,
    argv_via_shell_is_caught => ArgvViaShell,
    missing_binary_126_is_caught => MissingBinary126,
    secrets_in_engine_env_are_caught => SecretsInEngineEnv,
    connect_reviving_is_caught => ConnectRevives,
    refusal_after_provisioning_is_caught => RefuseAfterProvisioning,
    silent_truncation_is_caught => TruncateSilently,
    eager_stream_is_caught => EagerStream,
    missing_orphan_warning_is_caught => NoOrphanWarning,
    read_of_dir_returning_data_is_caught => ReadDirReturnsData,
    raw_engine_errors_are_caught => RawEngineErrors,
    stale_file_info_is_caught => StaleFileInfo,
    ignored_workdir_is_caught => IgnoreWorkdir,
    unchecked_label_keys_are_caught => UncheckedLabelKeys,
    missing_init_is_caught => NoInit,
    enabled_swap_is_caught => SwapEnabled,
    missing_cpu_quota_is_caught => NoCpuQuota,
    hidden_stopped_sandboxes_are_caught => HideStopped,
    causeless_creation_error_is_caught => CauselessCreationError,
    create_timeout_as_creation_is_caught => CreateTimeoutAsCreation,
    auth_as_creation_is_caught => AuthAsCreation,
    unbounded_stream_buffer_is_caught => UnboundedStreamBuffer,
    upload_following_links_is_caught => UploadFollowsLinks,
    unsafe_unpack_is_caught => UnsafeUnpack,
    dropped_special_mode_bits_are_caught => DropSpecialModeBits,
    uncapped_read_is_caught => UncappedRead,
    dropped_stdin_is_caught => DropStdin,
    newline_split_listing_is_caught => SplitNamesOnNewline,
    unchecked_allowlist_is_caught => UncheckedAllowlist,
    pause_that_freezes_nothing_is_caught => PauseDoesNotFreeze,
    resume_that_thaws_nothing_is_caught => ResumeDoesNotThaw,
    extend_that_moves_nothing_is_caught => ExtendMovesNothing,
    extend_that_overruns_is_caught => ExtendOverruns,
    forgotten_maximum_lifetime_is_caught => ForgetMaximumLifetime,
    ignored_idle_limit_is_caught => IgnoreIdleLimit,
    idle_limit_ending_busy_sandboxes_is_caught => IdleEndsBusySandboxes,
    idle_sandbox_left_stopped_is_caught => IdleLeavesItStopped,
    snapshot_without_its_files_is_caught => SnapshotFilesLost,
    snapshot_keeping_secrets_is_caught => SnapshotKeepsSecrets,
    unlisted_snapshots_are_caught => SnapshotsUnlisted,
    snapshot_ending_its_source_is_caught => SnapshotEndsTheSource,
    pids_exhaustion_as_an_exit_code_is_caught => PidsAsExitCode,
    ignored_hostname_is_caught => IgnoreHostname,
    ignored_set_egress_is_caught => SetEgressIgnored,
    late_egress_change_is_caught => EgressChangeLate,
    stale_egress_read_back_is_caught => EgressReadBackStale,
    ignored_deny_tier_is_caught => DenyTierIgnored,
    ignored_exception_tier_is_caught => ExceptionTierIgnored,
    stop_that_leaves_it_running_is_caught => StopLeavesItRunning,
    start_that_leaves_it_stopped_is_caught => StartLeavesItStopped,
    start_that_loses_files_is_caught => StartLosesFiles,
    start_without_egress_rules_is_caught => StartWithoutEgressRules,
    fork_forgetting_contexts_is_caught => ForkForgetsContexts,
    forks_sharing_contexts_are_caught => ForksShareContexts,
    fork_ending_the_original_is_caught => ForkEndsTheOriginal,
    fork_losing_files_is_caught => ForkLosesFiles,
    forks_left_behind_are_caught => ForksLeftBehind,
    host_port_opening_the_whole_host_is_caught => HostPortOpensWholeHost,
    credential_in_the_environment_is_caught => CredentialInEnvironment,
}
