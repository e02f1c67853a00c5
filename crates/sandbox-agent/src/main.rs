//! The `sandbox-agent` binary: PID 1 of a container sandbox.
fn main() {}
