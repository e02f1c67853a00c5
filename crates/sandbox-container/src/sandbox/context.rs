//! A persistent interpreter as the sandbox holds it between `run_code` calls
//! ([`CodeContext`], one per context id in a [`ContextSlot`]). Speaking to it is
//! `interpreter.rs`'s job.

use std::sync::Arc;

use bytes::BytesMut;
use futures::stream::BoxStream;
use sandbox_agent::client::StdinWriter;
use sandbox_core::teardown::Killer;
use sandbox_core::{OutputChunk, Result};

use crate::engine::ExecInput;

/// One context's slot; `None` until started, or after its interpreter was lost.
pub(crate) type ContextSlot = Arc<tokio::sync::Mutex<Option<CodeContext>>>;

/// A live interpreter.
pub(crate) struct CodeContext {
    /// What orphan warnings name: the engine's exec id, or the agent's request.
    pub(crate) name: String,
    pub(crate) input: ContextInput,
    pub(crate) output: BoxStream<'static, Result<OutputChunk>>,
    /// The interpreter's exit code, once its output ended.
    pub(crate) exit: ContextExit,
    pub(crate) buf: BytesMut,
    pub(crate) killer: Killer,
    /// The agent's request id of the interpreter (what a fork keeps and adopts); `None`
    /// on the engine's exec path.
    pub(crate) agent_id: Option<u32>,
}

/// Where requests go: the engine exec's attached stdin, or the agent's stdin stream.
pub(crate) enum ContextInput {
    Engine(ExecInput),
    Agent(StdinWriter),
}

/// How the interpreter's exit code is learned once its output ended.
pub(crate) enum ContextExit {
    /// Inspect the engine's exec.
    Engine(String),
    /// The agent reported it with the end of the output.
    Agent(tokio::sync::oneshot::Receiver<i64>),
}
