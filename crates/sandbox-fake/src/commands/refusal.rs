//! How the fake answers what is outside its vocabulary: the exit statuses and stderr lines
//! of a refusal (public through `sandbox_fake::vocabulary`), and the refusal of a form a
//! command does not list, which is also recorded as a `Call::OutsideVocabulary`.

use sandbox_core::Result;

use crate::program::{Proc, fail};

/// Exit status of a command outside the vocabulary (like a shell's "not found").
pub const NOT_IN_VOCABULARY_EXIT: i64 = 127;
/// Exit status of a vocabulary command given a form outside its documented forms, and of
/// a `sh -c` script using a construct outside `SHELL_FORMS` (like a shell's usage error).
pub const FORM_NOT_IN_VOCABULARY_EXIT: i64 = 2;
/// Exit status of a `run_code` snippet outside `SNIPPETS`.
pub const SNIPPET_NOT_IN_TABLE_EXIT: i64 = 127;

/// The stderr line of a command outside the vocabulary.
pub fn not_in_vocabulary_message(name: &str) -> String {
    format!("fake: command not in vocabulary: {name}\n")
}

/// The answer to a vocabulary command used in a form the vocabulary does not list.
pub(crate) async fn form_not_in_vocabulary(p: &Proc, argv: &[String]) -> Result<i64> {
    let msg = format!("fake: form not in vocabulary: {}", argv.join(" "));
    p.sb.outside_vocabulary(msg.clone());
    fail(p, msg, FORM_NOT_IN_VOCABULARY_EXIT).await
}
