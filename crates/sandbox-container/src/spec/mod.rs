//! What a container is made of, as typed, vetted values: the OCI runtime, extra Linux
//! capabilities, CDI devices, mounts and lifecycle hooks. Adapters take these in their
//! options and the engine trait carries them in its create spec; nothing here talks to an
//! engine.

pub mod cdi;
pub mod hooks;
pub mod linux_capability;
pub mod mounts;
pub mod runtime;
