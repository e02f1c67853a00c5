//! Bringing sandboxes into being and out again: the engine-independent configuration, the
//! backend that creates, connects, lists and kills managed sandboxes, the sealed copy-in
//! of copy mounts, the image's declared volumes a disk limit bounds, the sweep of
//! leftovers, the host-side expiry (a deadline timer per sandbox, the periodic sweep)
//! while a backend lives, and the deadline in force each sandbox has on this host. What a live sandbox does once it exists is in
//! [`crate::sandbox`].

pub(crate) mod agent_copy;
mod attempt;
pub(crate) mod backend;
pub(crate) mod config;
pub mod copy_in;
pub(crate) mod create;
pub(crate) mod deadlines;
pub mod expiry;
pub(crate) mod image_volumes;
pub(crate) mod sweep;
pub(crate) mod teardown;
