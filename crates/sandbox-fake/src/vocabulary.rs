//! The fake's command vocabulary and `run_code` snippet table, as data.
//!
//! The fake does not emulate a userland: it answers exactly the commands listed in
//! [`COMMANDS`] (in the forms listed), the `sh -c` constructs in [`SHELL_FORMS`], and the
//! `run_code` snippets in [`SNIPPETS`]. Anything else gets a typed, documented answer —
//! a command outside the vocabulary exits [`NOT_IN_VOCABULARY_EXIT`] with
//! `fake: command not in vocabulary: <name>` on stderr, never a guess. Script what else a
//! test needs with [`FakeBackend::on_run`](crate::FakeBackend::on_run) and
//! [`FakeBackend::on_run_code`](crate::FakeBackend::on_run_code).
//!
//! The same tables are rendered in `VOCABULARY.md`; a test keeps the two in step. They are
//! machine-readable so that a meta-test of the contract suite can fail when a trial uses a
//! command outside them.
//!
//! ```
//! use sandbox_fake::vocabulary::{COMMANDS, SNIPPETS, is_command};
//! assert!(is_command("echo") && !is_command("python3"));
//! assert!(COMMANDS.iter().any(|c| c.name == "sh" && c.forms.contains(&"sh -c SCRIPT")));
//! assert!(SNIPPETS.iter().any(|s| s.form == "print({int} * {int})"));
//! ```

use crate::commands::builtins;
pub use crate::commands::refusal::{
    FORM_NOT_IN_VOCABULARY_EXIT, NOT_IN_VOCABULARY_EXIT, SNIPPET_NOT_IN_TABLE_EXIT,
    not_in_vocabulary_message,
};
use crate::program::Program;

/// One command of the vocabulary.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CommandSpec {
    /// The program name (`argv[0]`; `/bin/` and `/usr/bin/` prefixes are accepted).
    pub name: &'static str,
    /// The accepted forms, in usage notation (`UPPERCASE` = an operand).
    pub forms: &'static [&'static str],
    /// What it does in a fake sandbox.
    pub behaviour: &'static str,
    pub(crate) run: Program,
}

/// Every command the fake answers.
pub const COMMANDS: &[CommandSpec] = &[
    cmd("true", &["true"], "exits 0", |_, _| {
        Box::pin(async { Ok(0) })
    }),
    cmd("false", &["false"], "exits 1", |_, _| {
        Box::pin(async { Ok(1) })
    }),
    cmd(
        "echo",
        &["echo [WORD...]"],
        "prints the words joined by spaces and a newline (no options, no escapes)",
        |p, a| Box::pin(builtins::echo(p, a)),
    ),
    cmd(
        "printf",
        &["printf FORMAT [ARG...]"],
        "prints FORMAT with `%s %d %%` and the escapes `\\n \\t \\r \\\\ \\a \\e \\NNN` (octal)",
        |p, a| Box::pin(builtins::printf(p, a)),
    ),
    cmd(
        "cat",
        &["cat", "cat FILE..."],
        "prints its input (`RunOptions::stdin`; none: nothing; `interactive`: each piece as \
         it is written, until the input ends), or the files' bytes; a missing file or a \
         directory: message, exit 1",
        |p, a| Box::pin(builtins::cat(p, a)),
    ),
    cmd("pwd", &["pwd"], "prints the working directory", |p, a| {
        Box::pin(builtins::pwd(p, a))
    }),
    cmd(
        "printenv",
        &["printenv NAME"],
        "prints the variable's value (create env, secrets, per-call env); unset: exit 1",
        |p, a| Box::pin(builtins::printenv(p, a)),
    ),
    cmd(
        "sleep",
        &["sleep SECONDS"],
        "waits on tokio time (fractions allowed; instant under a paused clock)",
        |p, a| Box::pin(builtins::sleep(p, a)),
    ),
    cmd(
        "seq",
        &["seq LAST", "seq FIRST LAST"],
        "prints the integers FIRST (default 1) to LAST, one per line",
        |p, a| Box::pin(builtins::seq(p, a)),
    ),
    cmd(
        "kill",
        &[
            "kill -0 PID",
            "kill -9 PID",
            "kill -KILL PID",
            "kill PID",
            "kill -9 -PGID",
        ],
        "`-0` exits 0 iff PID runs in the process table; otherwise ends PID, or with `-PGID` \
         every process of that group (an exec's pid names its group)",
        |p, a| Box::pin(builtins::kill(p, a)),
    ),
    cmd(
        "test",
        &["test -e PATH"],
        "exits 0 iff PATH exists in the in-memory filesystem (links followed)",
        |p, a| Box::pin(builtins::test(p, a)),
    ),
    cmd(
        "dd",
        &["dd if=/dev/zero bs=BYTES count=N"],
        "prints BYTES*N zero bytes, then the record counts on stderr",
        |p, a| Box::pin(builtins::dd(p, a)),
    ),
    cmd(
        "ln",
        &["ln -s TARGET LINK"],
        "creates a symbolic link (followed in the last path component)",
        |p, a| Box::pin(builtins::ln(p, a)),
    ),
    cmd(
        "chmod",
        &["chmod OCTAL PATH"],
        "sets the permission bits (up to `7777`, setuid/setgid/sticky included) of PATH, \
         links followed",
        |p, a| Box::pin(builtins::chmod(p, a)),
    ),
    cmd(
        "nc",
        &["nc -w SECONDS HOST PORT"],
        "egress probe: under Deny `Network is unreachable` (`bad address` for a name), \
                    exit 1; where the policy allows HOST, a real TCP connection whose received \
                    bytes are printed (point it at a loopback server)",
        |p, a| Box::pin(crate::commands::netcat::nc(p, a)),
    ),
    cmd(
        "setsid",
        &["setsid CMD [ARG...]"],
        "runs CMD (the fake has no sessions: CMD stays part of the exec, so a timeout or a \
         dropped stream still ends it, as a real adapter must)",
        |p, a| Box::pin(crate::commands::setsid(p, a)),
    ),
    cmd(
        "sh",
        &["sh -c SCRIPT"],
        "runs SCRIPT in the shell subset of SHELL_FORMS",
        |p, a| Box::pin(crate::commands::shell::sh(p, a)),
    ),
];

const fn cmd(
    name: &'static str,
    forms: &'static [&'static str],
    behaviour: &'static str,
    run: Program,
) -> CommandSpec {
    CommandSpec {
        name,
        forms,
        behaviour,
        run,
    }
}

/// The constructs a `sh -c` script may use; anything else (pipes, loops, `if`, command
/// substitution, globbing, subshells, `cd`, …) exits [`FORM_NOT_IN_VOCABULARY_EXIT`] with
/// `sh: not in the fake's vocabulary: <construct>` on stderr.
pub const SHELL_FORMS: &[&str] = &[
    "CMD ; CMD (also a newline)",
    "CMD && CMD",
    "CMD || CMD",
    "CMD & (a background job in the exec's process group; `$!` is its pid)",
    "exec CMD (the command keeps the shell's pid)",
    "exit [N]",
    "# comment",
    "> FILE, >> FILE, 2> FILE, >&2, 2>&1, > /dev/null",
    "'single' and \"double\" quotes, $NAME, $$ (the shell's pid), $! and $?",
];

/// One form of the `run_code` snippet table.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct SnippetSpec {
    /// The snippet, with placeholders: `{int}` an integer, `{num}` a decimal number,
    /// `{name}` an identifier, `{text}` text without quotes, backslashes or newlines. A
    /// space matches any run of spaces (including none); the code is trimmed first.
    pub form: &'static str,
    /// What it does.
    pub behaviour: &'static str,
}

/// Every `run_code` snippet the fake answers without a script, tried in order. Code
/// matching none exits [`SNIPPET_NOT_IN_TABLE_EXIT`] with `fake: snippet not in table:
/// <first line>` on stderr. Contexts (`CodeOptions::context`) keep the integer variables
/// bound by `{name} = {int}`; a context-less run starts with none.
pub const SNIPPETS: &[SnippetSpec] = &[
    snippet("print({int})", "prints the integer"),
    snippet("print({int} + {int})", "prints the sum"),
    snippet("print({int} * {int})", "prints the product"),
    snippet(
        "print({name})",
        "prints the context's variable; unbound: NameError, exit 1",
    ),
    snippet(
        "print({name} + {int})",
        "prints the context's variable plus the integer; unbound: NameError, exit 1",
    ),
    snippet("print('{text}')", "prints the text"),
    snippet("print(\"{text}\")", "prints the text"),
    snippet(
        "{name} = {int}",
        "binds the variable in the context (nothing outlives a context-less run)",
    ),
    snippet(
        "import sys; sys.stderr.write(\"{text}\\n\")",
        "writes the text and a newline to stderr",
    ),
    snippet(
        "import os; print(os.getcwd())",
        "prints the working directory",
    ),
    snippet("import time; time.sleep({num})", "waits on tokio time"),
    snippet(
        "import os; open(\"{text}\", \"w\").write(str(os.getpid()))\nimport time; time.sleep({num})",
        "writes the interpreter's pid (in the process table until the run ends or \
         is cancelled) to the file, then waits",
    ),
    snippet("{int}/0", "ZeroDivisionError traceback on stderr, exit 1"),
    snippet(
        "raise {name}(\"{text}\")",
        "`{name}: {text}` traceback on stderr, exit 1",
    ),
    snippet(
        "<brackets or quotes that do not balance>",
        "SyntaxError on stderr, exit 1",
    ),
];

const fn snippet(form: &'static str, behaviour: &'static str) -> SnippetSpec {
    SnippetSpec { form, behaviour }
}

/// Commands the contract suite runs only in trials that never run on the fake (kernel
/// evidence, which is "not applicable: in-process backend", and ingress, which the fake
/// does not declare). They are deliberately outside the vocabulary; a meta-test can allow
/// them in exactly those trials.
pub const ENGINE_ONLY: &[&str] = &["python3 -c CODE", "nc -l -p PORT", "while … do … done"];

/// Whether `name` (or `/bin/name`, `/usr/bin/name`) is a command of the vocabulary.
pub fn is_command(name: &str) -> bool {
    lookup(name).is_some()
}

/// The vocabulary entry of `name`.
pub(crate) fn lookup(name: &str) -> Option<&'static CommandSpec> {
    let base = ["/usr/bin/", "/bin/"]
        .iter()
        .find_map(|d| name.strip_prefix(d))
        .unwrap_or(name);
    COMMANDS.iter().find(|c| c.name == base)
}
