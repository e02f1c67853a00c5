//! The programs a fake sandbox runs. [`run_program`] answers an argv with a scripted rule,
//! else the vocabulary's command, else the typed "not in vocabulary" refusal; the commands'
//! bodies live in the child modules (`builtins`, `shell` for `sh -c`, `netcat` for `nc`),
//! `snippets` answers `run_code`, and `refusal` holds the answers to everything else. The
//! tables that list all of it are the public `vocabulary` module.
//!
//! `sh` and `setsid` run programs themselves, so the dispatch, the vocabulary table and the
//! shell refer to each other: that recursion is the shell's, and it stays within them.

use futures::future::BoxFuture;
use sandbox_core::Result;

use crate::commands::refusal::{
    NOT_IN_VOCABULARY_EXIT, form_not_in_vocabulary, not_in_vocabulary_message,
};
use crate::program::Proc;
use crate::vocabulary;

pub(crate) mod builtins;
pub(crate) mod netcat;
pub(crate) mod refusal;
pub(crate) mod shell;
pub(crate) mod snippets;

/// Runs one program: a scripted rule, else the vocabulary, else the typed "not in
/// vocabulary" answer.
pub(crate) fn run_program(proc: Proc, argv: Vec<String>) -> BoxFuture<'static, Result<i64>> {
    Box::pin(async move {
        if argv.is_empty() {
            return Ok(0);
        }
        // No program starts in a paused sandbox.
        proc.sb.thawed().await;
        if let Some(response) = proc.sb.scripted_run(&argv) {
            return proc.play(&response).await;
        }
        match vocabulary::lookup(&argv[0]) {
            Some(spec) => (spec.run)(proc, argv).await,
            None => {
                let msg = not_in_vocabulary_message(&argv[0]);
                proc.sb.outside_vocabulary(msg.trim_end());
                proc.err(msg).await;
                Ok(NOT_IN_VOCABULARY_EXIT)
            }
        }
    })
}

/// `setsid CMD [ARG...]`: the fake has no sessions, so CMD is simply run as part of the
/// exec (a timeout or a dropped stream still ends it).
pub(crate) async fn setsid(p: Proc, a: Vec<String>) -> Result<i64> {
    if a.len() < 2 {
        return form_not_in_vocabulary(&p, &a).await;
    }
    run_program(p, a[1..].to_vec()).await
}
