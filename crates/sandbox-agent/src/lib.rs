#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

#[cfg(target_os = "linux")]
pub mod agent;
#[cfg(feature = "client")]
pub mod client;
pub mod protocol;

/// The static agent binary for x86_64 Linux containers, as committed under
/// `prebuilt/x86_64/` by `cargo xtask agent` (CI rebuilds it and fails when the bytes
/// differ from this source). `None` where no binary is shipped for the engine's likely
/// architecture: the container layer then uses the engine's exec path.
///
/// Only with the `client` feature: the agent binary itself is built without it, so it
/// never embeds a copy of itself.
#[cfg(feature = "client")]
pub fn prebuilt() -> Option<&'static [u8]> {
    // The engine usually runs on the host's architecture; an x86_64 binary on another
    // engine fails its hello and the sandbox falls back to the exec path.
    #[cfg(target_arch = "x86_64")]
    {
        Some(include_bytes!("../prebuilt/x86_64/sandbox-agent"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}
