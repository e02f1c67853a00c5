//! Where an engine is: endpoint discovery from the environment (the order the engines' own
//! CLIs use) and `ssh://` endpoints forwarded to a private local socket. Connecting to the
//! endpoint is the adapter's job.

pub mod discovery;
pub mod ssh;
