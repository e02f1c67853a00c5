//! The engine trials both adapters run, written once, generic over the backend or the
//! engine. Each module has a macro that lists its trials as `#[tokio::test]`s of the
//! calling test binary, so an adapter's test file is its setup plus one call.
//!
//! What the trials leave to the adapter: connecting to its engine (and skipping without
//! one, [`crate::skip`]), and reading what only its engine's API shows.

pub mod agent;
pub mod binds;
pub mod caps;
pub mod credentials;
pub mod disk;
pub mod egress;
pub mod pull;
pub mod reap;
pub mod snapshot;
pub mod ssh;
pub mod sweep;
