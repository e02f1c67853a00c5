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
//!
//! Where each family of flaws lives:
//!
//! - `flaw`: the catalogue — every [`Flaw`] and the trials that catch it;
//! - `backend`: [`BrokenBackend`], the flaws of create, connect and the reap listing;
//! - `sandbox`: the broken sandbox handle — how its calls are routed to the flaws below,
//!   and the flaws of kill, drop, `Debug`, tier and ingress;
//! - `exec`: the flaws of runs and streams — timeouts, kills, orphaned processes, how a
//!   stream ends and buffers;
//! - `evidence`: the flaws that rewrite what a sandbox reports about its kernel settings;
//! - `files`: the flaws of the file system;
//! - `probes`: [`BrokenProbes`], which gives an adapter's fault backend the same flaw;
//! - `model`: [`kernel_model`], the kernel evidence the in-process fake cannot give;
//! - `abandoned`: the remote work a flaw leaves behind on purpose.

mod abandoned;
mod backend;
mod evidence;
mod exec;
mod files;
mod flaw;
mod model;
mod probes;
mod sandbox;

pub use backend::{BrokenBackend, wrap};
pub use flaw::Flaw;
pub use model::kernel_model;
pub use probes::BrokenProbes;
