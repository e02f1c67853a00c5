//! The engine-independent settings of every container backend ([`ContainerConfig`]) and
//! their defaults. Adapters expose them through `layer_settings!`; the live sandbox reads
//! its caps and bounds from here.

use std::time::Duration;

/// Prefix of every container name this crate gives (provenance for the sweep).
pub const NAME_PREFIX: &str = "sbx-";

/// Default bound of one engine call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Default bound of a whole `create`.
pub const DEFAULT_CREATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Default cap of `files().read`.
pub const DEFAULT_READ_CAP: u64 = 64 * 1024 * 1024;

/// Default cap of the sum of file sizes one `download` writes to the host
/// (`ResourceLimitExceeded` past it, refused from the archive's headers before the
/// entry's data is written).
pub const DEFAULT_DOWNLOAD_CAP: u64 = 1024 * 1024 * 1024;

/// Default cap of the archive entries (files, directories, links) one `download` creates
/// on the host: a sandbox can hold millions of empty files for free, the host's inodes
/// are not free.
pub const DEFAULT_DOWNLOAD_ENTRIES: u64 = 100_000;

/// Default cap of stateful contexts per sandbox.
pub const DEFAULT_MAX_CONTEXTS: usize = 16;

/// Default cap of concurrently forwarded ingress connections per sandbox.
pub const DEFAULT_MAX_INGRESS_CONNECTIONS: usize = 64;

/// Leftovers past their deadline by more than this are swept regardless of owner.
pub const SWEEP_PAST_DEADLINE: Duration = Duration::from_secs(60);

/// Engine-independent settings of a [`ContainerBackend`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerConfig {
    /// Image used when `CreateOptions::template` is `None`.
    pub default_template: String,
    /// Whether the backend sweeps leftovers when it starts (see [`ContainerBackend::sweep`]).
    pub startup_sweep: bool,
    /// How often the backend sweeps again while it lives (`None`: never; default
    /// [`DEFAULT_SWEEP_INTERVAL`](crate::provision::expiry::DEFAULT_SWEEP_INTERVAL), at
    /// least [`MIN_SWEEP_INTERVAL`](crate::provision::expiry::MIN_SWEEP_INTERVAL)). The
    /// sweep stops when the last clone of the backend drops.
    pub sweep_interval: Option<Duration>,
    /// Bound of one engine call (a wedged engine fails the call after this).
    pub call_timeout: Duration,
    /// Bound of a whole `create` (`CreateTimeout`, SBX_E1203, after this).
    pub create_timeout: Duration,
    /// Largest file `files().read` returns (`ResourceLimitExceeded` past it).
    pub read_cap: u64,
    /// Most bytes of files one `files().download` writes to the host.
    pub download_cap: u64,
    /// Most archive entries one `files().download` creates on the host.
    pub download_entries: u64,
    /// Most stateful contexts one sandbox may hold.
    pub max_contexts: usize,
    /// Most ingress connections forwarded at once per sandbox.
    pub max_ingress_connections: usize,
    /// Receives the progress of the image pulls `create` waits for (they are also
    /// `tracing` events, target [`PULL_TARGET`](crate::image::PULL_TARGET)).
    pub pull_progress: Option<crate::image::PullProgressHook>,
    /// Whether sandboxes run the in-sandbox agent as PID 1 and send `run`/`stream`
    /// through it (default `true`). Off, or where the engine cannot attach, no agent is
    /// shipped for this architecture, or the agent does not answer, the engine's exec
    /// path is used ([`ContainerSandbox::exec_path`] says which).
    pub agent: bool,
    /// Whether egress `Allow` may run without the always-blocked set where the library
    /// cannot load its rules (a remote engine, gVisor's netstack, a host without nft, an
    /// engine adapter without networks): default `false`, such a create is refused with
    /// `Configuration`. On, those sandboxes reach link-local and the cloud metadata
    /// service, this host's own services and other containers' networks (one warning is
    /// logged).
    pub allow_unfiltered_egress: bool,
}

impl ContainerConfig {
    /// Defaults with `default_template`.
    pub fn new(default_template: impl Into<String>) -> Self {
        ContainerConfig {
            default_template: default_template.into(),
            startup_sweep: true,
            sweep_interval: Some(crate::provision::expiry::DEFAULT_SWEEP_INTERVAL),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            create_timeout: DEFAULT_CREATE_TIMEOUT,
            read_cap: DEFAULT_READ_CAP,
            download_cap: DEFAULT_DOWNLOAD_CAP,
            download_entries: DEFAULT_DOWNLOAD_ENTRIES,
            max_contexts: DEFAULT_MAX_CONTEXTS,
            max_ingress_connections: DEFAULT_MAX_INGRESS_CONNECTIONS,
            pull_progress: None,
            agent: true,
            allow_unfiltered_egress: false,
        }
    }

    /// Uses the in-sandbox agent (default) or forces the engine's exec path.
    pub fn agent(mut self, on: bool) -> Self {
        self.agent = on;
        self
    }

    /// Lets egress `Allow` run without the always-blocked set where the rules cannot be
    /// loaded (see [`ContainerConfig::allow_unfiltered_egress`]; default off: refused).
    pub fn allow_unfiltered_egress(mut self, on: bool) -> Self {
        self.allow_unfiltered_egress = on;
        self
    }

    /// Sends the progress of every image pull `create` waits for to `hook`.
    pub fn on_pull_progress(mut self, hook: crate::image::PullProgressHook) -> Self {
        self.pull_progress = Some(hook);
        self
    }

    /// Enables or disables the startup sweep.
    pub fn startup_sweep(mut self, on: bool) -> Self {
        self.startup_sweep = on;
        self
    }

    /// Sets how often the backend sweeps again while it lives (`None` turns the periodic
    /// sweep off; an interval under
    /// [`MIN_SWEEP_INTERVAL`](crate::provision::expiry::MIN_SWEEP_INTERVAL) is raised to it).
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every.map(|d| d.max(crate::provision::expiry::MIN_SWEEP_INTERVAL));
        self
    }

    /// Sets the bound of one engine call (at least 1 ms).
    pub fn call_timeout(mut self, t: Duration) -> Self {
        self.call_timeout = t.max(Duration::from_millis(1));
        self
    }

    /// Sets the bound of a whole `create` (at least 1 ms).
    pub fn create_timeout(mut self, t: Duration) -> Self {
        self.create_timeout = t.max(Duration::from_millis(1));
        self
    }

    /// Sets the `files().read` cap.
    pub fn read_cap(mut self, bytes: u64) -> Self {
        self.read_cap = bytes;
        self
    }

    /// Sets the caps of one `files().download`: bytes of files and archive entries.
    pub fn download_caps(mut self, bytes: u64, entries: u64) -> Self {
        self.download_cap = bytes;
        self.download_entries = entries;
        self
    }

    /// Sets the cap on stateful contexts per sandbox.
    pub fn max_contexts(mut self, n: usize) -> Self {
        self.max_contexts = n;
        self
    }
}
