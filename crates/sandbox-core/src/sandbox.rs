//! The `Sandbox` port.

use std::any::Any;

use async_trait::async_trait;

use crate::{
    Capability, CodeOptions, Command, ExecResult, FileSystem, ForkOptions, IsolationTier, Process,
    Result, RunOptions, Snapshot,
};

/// One live sandbox.
///
/// Dropping a handle without [`Sandbox::kill`] kills the sandbox in the background,
/// bounded by the teardown grace (an "orphaned sandbox" warning if that cannot finish).
#[async_trait]
pub trait Sandbox: Send + Sync + std::fmt::Debug {
    /// Engine id.
    fn id(&self) -> &str;
    /// Backend name.
    fn backend(&self) -> &str;
    /// Capabilities of this instance.
    fn capabilities(&self) -> Capability;
    /// Isolation tier of this instance.
    fn isolation(&self) -> IsolationTier;
    /// Runs a command to completion, buffering output up to the cap. A list never goes
    /// through a shell; a string runs via `sh -c`. Exit codes are returned, not raised.
    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult>;
    /// Runs code in the language's interpreter; with `context_id`, in a persistent
    /// interpreter (needs `STATEFUL_CODE`).
    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult>;
    /// Starts a streamed process. A plain fn: `CapabilityNotSupported` is returned here,
    /// before anything starts; the process starts on first poll.
    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process>;
    /// The filesystem, or `CapabilityNotSupported`.
    fn files(&self) -> Result<&dyn FileSystem>;
    /// Kills and removes the sandbox. Idempotent and bounded by the teardown grace. When it
    /// returns `Ok`, nothing in the sandbox runs any more; an engine may still be finishing
    /// the removal of what is left (a container's layer), as docs/lifecycle.md describes.
    async fn kill(&self) -> Result<()>;
    /// The host address where a container port listed in
    /// `NetworkPolicy::ingress_ports` is published (on loopback). Needs `INGRESS_PORTS`;
    /// a port that was not requested is a `Configuration` error.
    fn ingress_address(&self, port: u16) -> Result<std::net::SocketAddr> {
        let _ = port;
        Err(crate::SandboxError::unsupported(
            Capability::INGRESS_PORTS,
            self.backend(),
        ))
    }
    /// Freezes every process in the sandbox at once (the cgroup freezer; needs
    /// `PAUSE_RESUME`). They hold their memory, files and connections' state and continue
    /// exactly where they were on [`Sandbox::resume`]; a stream open at the pause goes on
    /// after it. Until then every call but `resume` and `kill` fails at once with
    /// `SandboxPaused`. The lifetime keeps running while paused: a sandbox paused past its
    /// deadline ends as it would running. Pausing a paused sandbox does nothing.
    async fn pause(&self) -> Result<()> {
        Err(crate::SandboxError::unsupported(
            Capability::PAUSE_RESUME,
            self.backend(),
        ))
    }
    /// Continues a paused sandbox's processes (needs `PAUSE_RESUME`); resuming a running
    /// sandbox does nothing.
    async fn resume(&self) -> Result<()> {
        Err(crate::SandboxError::unsupported(
            Capability::PAUSE_RESUME,
            self.backend(),
        ))
    }
    /// Kills every process in the sandbox except its first one (needs `RESET_PROCESSES`)
    /// and returns how many were killed: stray background jobs, daemons a command
    /// started, a fork bomb's leftovers holding every pid of the limit. Files, identity,
    /// policy and lifetime are kept; commands running now end (as killed by a signal) and
    /// stateful interpreter contexts are lost. Refused with `SandboxPaused` while paused.
    async fn reset_processes(&self) -> Result<u32> {
        Err(crate::SandboxError::unsupported(
            Capability::RESET_PROCESSES,
            self.backend(),
        ))
    }

    /// Ends every process in the sandbox but keeps the sandbox (needs `STOP_START`): its
    /// files (written ones and installed packages alike), id, policy and labels stay, and
    /// [`Sandbox::start`] brings it back. Running commands end (their streams report
    /// `SandboxGone`), interpreter contexts are lost, and until `start` every call but
    /// `start`, `kill` and `snapshot` fails at once with `SandboxStopped`. A paused sandbox
    /// is thawed and stopped. The lifetime keeps running while stopped: a stopped sandbox
    /// past its deadline is removed by the host as a running one is. Stopping a stopped
    /// sandbox does nothing.
    async fn stop(&self) -> Result<()> {
        Err(crate::SandboxError::unsupported(
            Capability::STOP_START,
            self.backend(),
        ))
    }
    /// Brings a stopped sandbox back (needs `STOP_START`): when it returns, the network
    /// policy is in force again, ingress ports answer, and `run` works; with the
    /// in-sandbox agent it is the sandbox's first process again. Interpreter contexts
    /// start afresh. Starting a running sandbox does nothing; a sandbox past its
    /// deadline is `SandboxGone`.
    async fn start(&self) -> Result<()> {
        Err(crate::SandboxError::unsupported(
            Capability::STOP_START,
            self.backend(),
        ))
    }
    /// Moves the sandbox's deadline `by` later and returns the new one (needs
    /// `EXTEND_LIFETIME`). The moved deadline is enforced exactly as the one set at create
    /// (inside the sandbox where that was, and by the host), and never passes
    /// `CreateOptions::max_lifetime` counted from create: an extension beyond it is
    /// refused with `ResourceLimitExceeded` naming the maximum, and changes nothing. A
    /// command already running keeps the timeout it started with; a command started
    /// afterwards with `timeout: None` inherits the new remaining lifetime. Refused with
    /// `SandboxPaused` while paused (resume first).
    async fn extend(&self, by: std::time::Duration) -> Result<std::time::SystemTime> {
        let _ = by;
        Err(crate::SandboxError::unsupported(
            Capability::EXTEND_LIFETIME,
            self.backend(),
        ))
    }
    /// Turns the sandbox's current filesystem into a template that `create` accepts
    /// (needs `SNAPSHOT`): files only, never its secrets and never the in-sandbox agent;
    /// the sandbox goes on as before. Works on a paused sandbox too. The template stays
    /// until removed with `ReapableBackend::remove_snapshot` (or `sandbox reap --kill`).
    async fn snapshot(&self) -> Result<Snapshot> {
        Err(crate::SandboxError::unsupported(
            Capability::SNAPSHOT,
            self.backend(),
        ))
    }
    /// Replaces the egress policy of the running sandbox (needs `LIVE_EGRESS`; a policy
    /// that lists entries needs `EGRESS_ALLOWLIST` too). The new policy is in force when
    /// this returns: loaded at once where the rules live and read back, names re-pinned,
    /// and connections it forbids cut (their next packet is refused). The always-blocked
    /// set stays below every tier, and `Allow` keeps it as at create. A sandbox created
    /// with egress `Deny` has no network interface: only `Deny` can be set on it (create
    /// it with [`EgressTiers::deny_by_default`](crate::EgressTiers::deny_by_default) to
    /// open it later).
    async fn set_egress(&self, egress: crate::Egress) -> Result<()> {
        let _ = egress;
        Err(crate::SandboxError::unsupported(
            Capability::LIVE_EGRESS,
            self.backend(),
        ))
    }
    /// The egress policy in force, as the last [`Sandbox::set_egress`] (or the create)
    /// set it, read from where the library keeps it outside the sandbox's reach (needs
    /// `LIVE_EGRESS`); the same from a reattached handle.
    async fn egress(&self) -> Result<crate::Egress> {
        Err(crate::SandboxError::unsupported(
            Capability::LIVE_EGRESS,
            self.backend(),
        ))
    }

    /// Forks the running sandbox with its memory (needs `SNAPSHOT_FORK`): returns
    /// `options.count` new sandboxes whose processes, interpreter contexts (`run_code`
    /// with a `context_id`) and files continue from the instant of the fork, each with an
    /// id, labels, policy and lifetime of its own (see [`ForkOptions::timeout`]); the
    /// original goes on. Each fork is a sandbox like any other (run, files, kill) and
    /// diverges from the others independently. Whatever the fork needed in between (a
    /// checkpoint image) is removed by the time it returns, also when it fails, which
    /// leaves no fork behind. A command streaming on the original while it is forked
    /// keeps running inside, but its output no longer reaches the caller (as after a
    /// takeover); contexts continue. Refused with `SandboxPaused` while paused.
    async fn fork(&self, options: ForkOptions) -> Result<Vec<Box<dyn Sandbox>>> {
        let _ = options;
        Err(crate::SandboxError::unsupported(
            Capability::SNAPSHOT_FORK,
            self.backend(),
        ))
    }
    /// The engine client and container id, unwrapped.
    ///
    /// **Outside the semver contract**: the concrete type may change in any release.
    fn native(&self) -> &dyn Any;
}

/// Convenience methods on any [`Sandbox`] taking `impl Into<Command>`.
#[async_trait]
pub trait SandboxExt: Sandbox {
    /// `run` with default options.
    async fn exec(&self, cmd: impl Into<Command> + Send) -> Result<ExecResult> {
        self.run(cmd.into(), RunOptions::default()).await
    }
    /// `run_code` with default options (Python).
    async fn code(&self, code: &str) -> Result<ExecResult> {
        self.run_code(code, CodeOptions::default()).await
    }
}

impl<S: Sandbox + ?Sized> SandboxExt for S {}
