//! What an adapter tells the suite about itself beyond the core traits.
//!
//! Every method has a default meaning "not provided"; a trial that needs a probe the
//! adapter does not provide is reported as ignored with the reason in its name (or in the
//! runtime-ignore reason), never as a silent pass — and a first-party backend's run with
//! any ignored trial fails. A probe that is provided but errors (`Err`) fails the trials
//! that need it with that error: it never turns into "not provided".

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use sandbox_core::{Backend, CreateOptions};

/// Adapter-specific knowledge the suite needs to prove behaviour from the outside.
#[async_trait]
pub trait Probes: Send + Sync {
    /// Options every trial starts from (a template with python3 and busybox applets).
    /// Default: `CreateOptions::default()`.
    fn base_options(&self) -> CreateOptions {
        CreateOptions::default()
    }

    /// A template WITHOUT python3, for the interpreter-missing trial. `None` → that trial
    /// is ignored.
    fn template_without_python(&self) -> Option<String> {
        None
    }

    /// Every test image the `run` and `files` areas run on, besides `base_options`'s own
    /// template (e.g. a busybox image next to a Debian-based python one, so busybox
    /// `ls`/`stat` differences are covered). Each extra template gets its own copy of
    /// those trials, named `…::<case>@<template>`. Default: none.
    fn extra_templates(&self) -> Vec<String> {
        vec![]
    }

    /// Whether sandboxes of this backend can be given egress `Allow` on this engine.
    /// `false` only where the adapter documents why not (Docker on a `runsc` runtime the
    /// engine registers with `--network=none`): `Allow` must then be refused with
    /// `Configuration` before anything is provisioned, and the trials check that refusal
    /// instead of the network. Default `true`.
    fn egress_allow(&self) -> bool {
        true
    }

    /// Two names only this test run knows, both resolving for the backend's sandboxes to
    /// the canary's dial address (taught to the adapter's egress resolver by the test, or
    /// in the host's `/etc/hosts`; never a public name), for the `egress` trials. `None`
    /// (the default) → those trials are ignored.
    fn egress_names(&self) -> Option<EgressNames> {
        None
    }

    /// Whether this backend runs sandboxes inside this process (the fake). Kernel
    /// evidence (capabilities, cgroups, `/proc/net/dev`) read from such a sandbox is not
    /// evidence of anything, so those trials report "not applicable: in-process backend",
    /// counted apart from passes. Default `false`.
    fn in_process(&self) -> bool {
        false
    }

    /// Where the suite's canary TCP server binds, and the host name or IP a sandbox with
    /// egress `Allow` dials to reach it. Docker: bind `0.0.0.0:0` on the host, dial the
    /// bridge gateway IP. The fake: bind `127.0.0.1:0`, dial `"127.0.0.1"`. `Ok(None)` →
    /// egress trials are ignored; `Err` → they fail with it.
    async fn canary(&self) -> anyhow::Result<Option<CanarySpec>> {
        Ok(None)
    }

    /// Opens the canary's listener for `spec`. Default: a TCP listener bound to
    /// `spec.bind` in this process's network namespace. An adapter whose canary address
    /// is not one of this host's (Docker and Podman keep it in a namespace of its own, so
    /// that blocking the host's addresses does not block the canary) binds it there.
    async fn bind_canary(&self, spec: &CanarySpec) -> anyhow::Result<std::net::TcpListener> {
        let l = std::net::TcpListener::bind(spec.bind)?;
        l.set_nonblocking(true)?;
        Ok(l)
    }

    /// The engine-side view of a sandbox's configured environment (`docker inspect`
    /// `Config.Env`), to prove secrets are not stored there. `Ok(None)` → that trial is
    /// ignored; `Err` → it fails with it.
    async fn engine_env(&self, _sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        Ok(None)
    }

    /// Fault injection sharing the same engine; `Ok(None)` → fault trials are ignored;
    /// `Err` → they fail with it.
    async fn faults(&self) -> anyhow::Result<Option<Arc<dyn Faults>>> {
        Ok(None)
    }

    /// Whether `ln -s TARGET LINK` works inside a sandbox, so the suite can plant a
    /// symlink that escapes a downloaded directory. Default `true`; an adapter whose
    /// sandboxes cannot hold symlinks (the fake) returns `false`, which marks the tar
    /// path-escape trial ignored with that reason in its name.
    fn symlinks(&self) -> bool {
        true
    }

    /// Whether sandbox files live in THIS process's memory (the fake). The bounded-memory
    /// transfer trial then allows the transferred file's own size on top of its bound,
    /// since storing it is not buffering it. Default `false`.
    fn in_process_storage(&self) -> bool {
        false
    }

    /// The limits the ENGINE holds for a sandbox (Docker: `docker inspect` `HostConfig`
    /// `Memory`, `MemorySwap`, `PidsLimit`), plus the pids headroom the adapter documents
    /// adding for its runtime. Used ONLY for a sandbox whose `isolation()` is
    /// [`IsolationTier::Gvisor`](sandbox_core::IsolationTier::Gvisor) when no cgroup view
    /// of the pids limit exists inside it (gVisor mounts no cgroup filesystem): the limit
    /// trials then assert the engine holds exactly what was asked. `None` (the default) →
    /// those trials fail for such a sandbox, since a security default that cannot be
    /// verified is not proven; so does `Err`.
    async fn engine_limits(&self, _sandbox_id: &str) -> anyhow::Result<Option<EngineLimits>> {
        Ok(None)
    }

    /// Stops sandbox `id` from outside, as a crashed init or `docker stop` would: its
    /// processes end. [`Injection::Injected`] when the engine still holds it afterwards
    /// (`list_managed` must show it `Stopped`, so `reap` can find it);
    /// [`Injection::Removed`] when the engine deletes a stopped sandbox itself (Docker's
    /// `AutoRemove`, Podman's `--rm`: it must then leave `list_managed` and every call on
    /// it be `SandboxGone`); `NotProvided` (the default) marks the trial ignored.
    async fn stop_sandbox(&self, _sandbox_id: &str) -> anyhow::Result<Injection> {
        Ok(Injection::NotProvided)
    }

    /// The checkpoints the engine keeps for sandbox `id` (forks with memory), or `None`
    /// when the adapter cannot show them (the default): the fork trials then check less.
    async fn checkpoints(&self, _sandbox_id: &str) -> anyhow::Result<Option<Vec<String>>> {
        Ok(None)
    }
}

/// What a probe did about a state the suite asked it to bring about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Injection {
    /// The state is in place (a fault until [`Faults::heal`]).
    Injected,
    /// This backend cannot be in that state, for the reason given (e.g. a local engine
    /// socket takes no credential, so none can be missing). The trial reports "not
    /// applicable: &lt;reason&gt;", counted apart from passes — never a silent pass.
    Impossible(String),
    /// This adapter's probes do not provide it: the trial is ignored with that reason
    /// (which fails a first-party run).
    NotProvided,
    /// Only from [`Probes::stop_sandbox`]: the sandbox was stopped, and the engine deletes
    /// a stopped sandbox itself, for the reason given (e.g. an engine's auto-removal). The
    /// trial then proves the sandbox is gone rather than held.
    Removed(String),
}

/// The limits an engine holds for one sandbox, as [`Probes::engine_limits`] reads them.
/// `0` means "not set" (unlimited), which never satisfies a limit trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLimits {
    /// Memory limit in bytes (Docker `HostConfig.Memory`).
    pub memory_bytes: u64,
    /// Memory + swap limit in bytes (Docker `HostConfig.MemorySwap`); equal to
    /// `memory_bytes` when swap is disabled, as a sandbox must have it (swap would let it
    /// exceed its memory limit).
    pub memory_swap_bytes: u64,
    /// Engine pids limit (Docker `HostConfig.PidsLimit`).
    pub pids: u64,
    /// CPU quota in billionths of a core (Docker `HostConfig.NanoCpus`, or
    /// `CpuQuota * 1e9 / CpuPeriod`).
    pub nano_cpus: u64,
    /// What the adapter documents adding to the requested pids limit for this sandbox's
    /// runtime (e.g. sandbox-docker's `RUNSC_PIDS_HEADROOM`: gVisor's own host threads
    /// count against the engine limit). The trials require `pids == requested +
    /// pids_headroom` and bound the headroom by
    /// [`MAX_PIDS_HEADROOM`].
    pub pids_headroom: u64,
}

/// The largest runtime pids headroom the limit trials accept: beyond it, the engine limit
/// no longer bounds the sandbox's processes in any useful sense.
pub const MAX_PIDS_HEADROOM: u64 = 1024;

/// Where the canary server listens and how a sandbox reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanarySpec {
    /// Address the suite binds its canary TCP server to (port 0 = any free port).
    pub bind: SocketAddr,
    /// Host name or IP a sandbox with egress `Allow` dials to reach the server.
    pub dial_host: String,
}

/// Two names only this test run knows, for the allowlist trials: `listed` resolves (for
/// the backend's sandboxes) to the canary's dial address and is put on the allowlist;
/// `unlisted` resolves to the same address and is not, so its refusal is the resolver's
/// doing, not the firewall's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressNames {
    /// The allowlisted name.
    pub listed: String,
    /// A name the backend could resolve but must refuse.
    pub unlisted: String,
}

/// Fault injection on a backend that shares the engine of the one under test.
#[async_trait]
pub trait Faults: Send + Sync {
    /// A backend (same engine) whose sandboxes' kill requests can be made to hang or fail.
    fn backend(&self) -> Arc<dyn Backend>;
    /// From now on kills through `backend()` hang (never complete) until `heal()`.
    async fn hang_kills(&self);
    /// From now on kills through `backend()` fail with an engine error until `heal()`.
    async fn fail_kills(&self);
    /// Back to normal (every fault below included).
    async fn heal(&self);

    /// From now on creates through `backend()` fail the way a broken provider fails them
    /// (the engine answers the create request with an error). Default: not provided.
    async fn fail_creates(&self) -> Injection {
        Injection::NotProvided
    }

    /// From now on creates through `backend()` never get an answer from the engine (a
    /// wedged engine), so the adapter's own create bound must end them with
    /// `CreateTimeout`. `backend()` should have a short create bound (seconds) so the
    /// trial stays fast. Default: not provided.
    async fn stall_creates(&self) -> Injection {
        Injection::NotProvided
    }

    /// From now on creates through `backend()` lack the credential they need, so they
    /// fail with `Auth` naming its environment variable; [`Injection::Impossible`] when
    /// the backend uses no credential at all. Default: not provided.
    async fn withhold_credential(&self) -> Injection {
        Injection::NotProvided
    }
}

/// Probes that provide nothing beyond the defaults (every probe-dependent trial is
/// ignored with its reason).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProbes;

impl Probes for NoProbes {}
