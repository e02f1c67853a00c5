//! Images: references split the way the engines resolve short names, registry credentials
//! read where the engines' own CLIs keep them, and the pull policy applied on create with
//! one pull per image however many creates wait for it.
//!
//! `create` checks the image before provisioning: with [`PullPolicy::Missing`] (the
//! default) an image the engine lacks is pulled, with [`PullPolicy::Always`] it is pulled
//! every time, with [`PullPolicy::Never`] a missing image is a typed error. Concurrent
//! creates of one image share one engine pull, so ten creates do not hit the registry ten
//! times; each waiter's progress hook sees the shared pull's events.
//!
//! Progress goes two ways: the [`PullProgressHook`] of the backend's
//! [`ContainerConfig`](crate::ContainerConfig), and `tracing` events with target
//! [`PULL_TARGET`] (`pulling image`, one `pull progress` per engine message, `pulled
//! image`), which the CLI turns into a progress bar. Credentials never appear in either:
//! [`RegistryAuth`]'s `Debug` shows the user name only.
//!
//! [`PullPolicy::Missing`]: sandbox_core::PullPolicy::Missing
//! [`PullPolicy::Always`]: sandbox_core::PullPolicy::Always
//! [`PullPolicy::Never`]: sandbox_core::PullPolicy::Never

mod credentials;
mod pull;

pub use crate::engine::pull::{
    CredentialStore, PullProgress, PullProgressHook, PullRequest, RegistryAuth,
};
pub use pull::{
    DEFAULT_PULL_TIMEOUT, PULL_TARGET, classify_pull_failure, next_pull_item, pull_failure_kind,
};
pub(crate) use pull::{Ensured, ensure, forget};
pub use sandbox_core::image_ref::{DEFAULT_REGISTRY, ImageRef};

/// The small test image `sandbox doctor` checks for beside the default template (built by
/// `cargo xtask setup`; the contract suite's second template).
pub const TEST_BUSYBOX: &str = "sandbox-rs/busybox:latest";
