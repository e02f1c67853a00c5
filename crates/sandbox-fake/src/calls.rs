//! Recorded calls: what the code under test asked the fake to do, with the policy in
//! effect. Secrets are redacted before anything is recorded.

use std::path::PathBuf;
use std::time::Duration;

use sandbox_core::{
    CreateOptions, EffectiveResources, ErrorCode, IsolationTier, NetworkPolicy, Secret,
};

/// The value every recorded secret is replaced with.
pub const REDACTED: &str = "<redacted>";

/// One recorded call, in the order the fake received them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
// Records are few and inspected by tests; matching on plain fields beats boxing.
#[allow(clippy::large_enum_variant)]
pub enum Call {
    /// `Backend::create`.
    Create {
        /// The options, with every secret value replaced by [`REDACTED`].
        options: CreateOptions,
        /// The network policy in effect.
        policy: NetworkPolicy,
        /// Resources after defaults (`None` when the options were refused).
        resources: Option<EffectiveResources>,
        /// Isolation tier of the backend.
        isolation: IsolationTier,
        /// The new sandbox's id, or the error code it was refused with.
        outcome: Result<String, ErrorCode>,
    },
    /// `Backend::connect`.
    Connect {
        /// Requested id.
        sandbox_id: String,
        /// Whether it was found alive.
        found: bool,
    },
    /// `Sandbox::run` or `Sandbox::stream`.
    Run {
        /// Sandbox id.
        sandbox_id: String,
        /// The argv executed (`["sh", "-c", s]` for a shell string).
        argv: Vec<String>,
        /// Whether it came from `stream` (else `run`).
        streamed: bool,
        /// Keys of the per-call environment (never values).
        env_keys: Vec<String>,
        /// Working directory in effect.
        workdir: String,
        /// Timeout requested (`None` = inherit the lifetime).
        timeout: Option<Duration>,
        /// Network policy of the sandbox.
        policy: NetworkPolicy,
    },
    /// `Sandbox::run_code`.
    RunCode {
        /// Sandbox id.
        sandbox_id: String,
        /// The code.
        code: String,
        /// Context id, if stateful.
        context_id: Option<String>,
        /// Timeout requested.
        timeout: Option<Duration>,
        /// Network policy of the sandbox.
        policy: NetworkPolicy,
    },
    /// The fake answered something outside its vocabulary (a command, a form of one, a
    /// shell construct, a `run_code` snippet) with its documented refusal. A test that
    /// means to stay inside the vocabulary asserts there is none.
    OutsideVocabulary {
        /// Sandbox id.
        sandbox_id: String,
        /// What was outside it (the refusal's text).
        what: String,
    },
    /// `Sandbox::kill` (also recorded for a drop-triggered teardown).
    Kill {
        /// Sandbox id.
        sandbox_id: String,
    },
    /// A `FileSystem` operation.
    File {
        /// Sandbox id.
        sandbox_id: String,
        /// The operation.
        op: FileOp,
        /// Sandbox path as given.
        path: String,
    },
    /// `ReapableBackend::list_managed`.
    ListManaged,
    /// `ReapableBackend::kill_managed`.
    KillManaged {
        /// Sandbox id.
        sandbox_id: String,
    },
}

/// The kind of a recorded file operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileOp {
    /// `read`.
    Read,
    /// `write` of `len` bytes.
    Write {
        /// Bytes written.
        len: usize,
    },
    /// `upload` from a host path.
    Upload {
        /// Host path.
        local: PathBuf,
    },
    /// `download` to a host path.
    Download {
        /// Host path.
        local: PathBuf,
    },
    /// `ls`.
    Ls,
    /// `mkdir`.
    Mkdir {
        /// `-p`.
        parents: bool,
    },
    /// `remove`.
    Remove,
    /// `stat`.
    Stat,
}

impl Call {
    /// The sandbox this call concerns, when it concerns one.
    pub fn sandbox_id(&self) -> Option<&str> {
        match self {
            Call::Create { outcome, .. } => outcome.as_deref().ok(),
            Call::Connect { sandbox_id, .. }
            | Call::Run { sandbox_id, .. }
            | Call::RunCode { sandbox_id, .. }
            | Call::Kill { sandbox_id }
            | Call::File { sandbox_id, .. }
            | Call::OutsideVocabulary { sandbox_id, .. }
            | Call::KillManaged { sandbox_id } => Some(sandbox_id),
            Call::ListManaged => None,
        }
    }
}

/// `options` with every secret value replaced by [`REDACTED`].
pub(crate) fn redact(options: &CreateOptions) -> CreateOptions {
    let mut o = options.clone();
    for v in o.secrets.values_mut() {
        *v = Secret::new(REDACTED);
    }
    o
}
