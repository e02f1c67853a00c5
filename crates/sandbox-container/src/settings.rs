//! `layer_settings!`: the builder methods of the engine-independent settings
//! ([`ContainerConfig`](crate::ContainerConfig)) on an adapter's own config type, written
//! once for every engine instead of each adapter repeating (and drifting from) them.

/// Implements, on `$ty` whose field `$field` is a [`ContainerConfig`](crate::ContainerConfig),
/// the builder methods `default_template`, `startup_sweep`, `sweep_interval`, `call_timeout`,
/// `create_timeout`, `agent`, `read_cap` and `download_caps`, each delegating to the
/// `ContainerConfig` method of that name (same bounds, same defaults).
///
/// ```ignore
/// sandbox_container::layer_settings!(DockerConfig, layer);
/// ```
#[macro_export]
macro_rules! layer_settings {
    ($ty:ty, $field:ident) => {
        impl $ty {
            /// Sets the image used when `CreateOptions::template` is `None`.
            pub fn default_template(mut self, template: impl Into<String>) -> Self {
                self.$field.default_template = template.into();
                self
            }

            /// Whether connecting removes this host's leftovers (default on): sandboxes
            /// whose owning process is proven gone, or long past their deadline.
            pub fn startup_sweep(mut self, on: bool) -> Self {
                self.$field = self.$field.startup_sweep(on);
                self
            }

            /// How often the backend sweeps again while it lives (default every 5 min, at
            /// least every second; `None` turns it off): the same removals as the startup
            /// sweep, so a process that lives for days still clears what crashed ones
            /// left. It stops when the last clone of the backend drops.
            pub fn sweep_interval(mut self, every: Option<::std::time::Duration>) -> Self {
                self.$field = self.$field.sweep_interval(every);
                self
            }

            /// Bound of one engine call (default 30 s, at least 1 ms): a wedged engine
            /// fails the call; a streamed body may stall this long between chunks.
            pub fn call_timeout(mut self, limit: ::std::time::Duration) -> Self {
                self.$field = self.$field.call_timeout(limit);
                self
            }

            /// Bound of a whole `create` (default 60 s; `CreateTimeout`, SBX_E1203, past it).
            pub fn create_timeout(mut self, limit: ::std::time::Duration) -> Self {
                self.$field = self.$field.create_timeout(limit);
                self
            }

            /// Runs the in-sandbox agent as PID 1 and sends `run`/`stream` through it
            /// (default `true`), or forces the engine's exec path.
            pub fn agent(mut self, on: bool) -> Self {
                self.$field = self.$field.agent(on);
                self
            }

            /// Lets egress `Allow` run without the always-blocked set (link-local and
            /// cloud metadata, this host's services, other containers' networks) where
            /// the library cannot load its rules: a remote engine, gVisor's netstack, a
            /// host without nft. Default off: such a create is refused with
            /// `Configuration`.
            pub fn allow_unfiltered_egress(mut self, on: bool) -> Self {
                self.$field = self.$field.allow_unfiltered_egress(on);
                self
            }

            /// Largest file `files().read` returns (default 64 MiB;
            /// `ResourceLimitExceeded` past it).
            pub fn read_cap(mut self, bytes: u64) -> Self {
                self.$field = self.$field.read_cap(bytes);
                self
            }

            /// Caps of one `files().download`: bytes of files written to this host
            /// (default 1 GiB) and archive entries created (default 100,000).
            pub fn download_caps(mut self, bytes: u64, entries: u64) -> Self {
                self.$field = self.$field.download_caps(bytes, entries);
                self
            }
        }
    };
}
