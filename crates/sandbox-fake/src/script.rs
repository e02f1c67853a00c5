//! Scripted responses: make a command or a code snippet return what a test needs.
//!
//! Rules are consulted before the built-in commands, for the top-level command *and* for
//! every program a `sh -c` string runs, so scripting `python3` also works inside shell
//! strings. The most recently registered matching rule wins.
//!
//! This module holds the rules and responses as data; a program plays a response
//! (`Proc::play`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::{ExecResult, OutputChunk, SandboxError};

type ArgvPredicate = Arc<dyn Fn(&[String]) -> bool + Send + Sync>;
type CodePredicate = Arc<dyn Fn(&str) -> bool + Send + Sync>;
type ErrorFactory = Arc<dyn Fn() -> SandboxError + Send + Sync>;

/// Which commands a rule applies to (matched against the argv; a shell string is
/// `["sh", "-c", string]`).
#[derive(Clone)]
pub struct RunMatch(RunMatchKind);

#[derive(Clone)]
enum RunMatchKind {
    Exact(Vec<String>),
    Prefix(Vec<String>),
    When(ArgvPredicate),
    Any,
}

impl std::fmt::Debug for RunMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            RunMatchKind::Exact(v) => write!(f, "RunMatch::argv({v:?})"),
            RunMatchKind::Prefix(v) => write!(f, "RunMatch::prefix({v:?})"),
            RunMatchKind::When(_) => f.write_str("RunMatch::when(..)"),
            RunMatchKind::Any => f.write_str("RunMatch::any()"),
        }
    }
}

fn strings(v: impl IntoIterator<Item = impl Into<String>>) -> Vec<String> {
    v.into_iter().map(Into::into).collect()
}

impl RunMatch {
    /// Exactly this argv.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RunMatch(RunMatchKind::Exact(strings(argv)))
    }
    /// Any argv starting with these elements (`prefix(["git"])` matches every git call).
    pub fn prefix<I, S>(prefix: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RunMatch(RunMatchKind::Prefix(strings(prefix)))
    }
    /// Exactly this shell string (`run("…")`, i.e. `["sh", "-c", s]`).
    pub fn shell(s: impl Into<String>) -> Self {
        RunMatch::argv(["sh".to_string(), "-c".to_string(), s.into()])
    }
    /// Every argv for which `f` returns true.
    pub fn when(f: impl Fn(&[String]) -> bool + Send + Sync + 'static) -> Self {
        RunMatch(RunMatchKind::When(Arc::new(f)))
    }
    /// Every command.
    pub fn any() -> Self {
        RunMatch(RunMatchKind::Any)
    }

    /// Whether `argv` matches.
    pub fn matches(&self, argv: &[String]) -> bool {
        match &self.0 {
            RunMatchKind::Exact(v) => v.as_slice() == argv,
            RunMatchKind::Prefix(p) => argv.starts_with(p),
            RunMatchKind::When(f) => f(argv),
            RunMatchKind::Any => true,
        }
    }
}

impl<const N: usize> From<[&str; N]> for RunMatch {
    fn from(v: [&str; N]) -> Self {
        RunMatch::argv(v)
    }
}
impl From<Vec<String>> for RunMatch {
    fn from(v: Vec<String>) -> Self {
        RunMatch::argv(v)
    }
}
impl From<&str> for RunMatch {
    /// A shell string, like `Command::from(&str)`.
    fn from(s: &str) -> Self {
        RunMatch::shell(s)
    }
}

/// Which `run_code` snippets a rule applies to.
#[derive(Clone)]
pub struct CodeMatch(CodeMatchKind);

#[derive(Clone)]
enum CodeMatchKind {
    Exact(String),
    Contains(String),
    When(CodePredicate),
    Any,
}

impl std::fmt::Debug for CodeMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            CodeMatchKind::Exact(_) => f.write_str("CodeMatch::exact(..)"),
            CodeMatchKind::Contains(s) => write!(f, "CodeMatch::contains({s:?})"),
            CodeMatchKind::When(_) => f.write_str("CodeMatch::when(..)"),
            CodeMatchKind::Any => f.write_str("CodeMatch::any()"),
        }
    }
}

impl CodeMatch {
    /// Exactly this code (leading/trailing whitespace ignored).
    pub fn exact(code: impl Into<String>) -> Self {
        CodeMatch(CodeMatchKind::Exact(code.into().trim().to_string()))
    }
    /// Code containing `needle`.
    pub fn contains(needle: impl Into<String>) -> Self {
        CodeMatch(CodeMatchKind::Contains(needle.into()))
    }
    /// Code for which `f` returns true.
    pub fn when(f: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        CodeMatch(CodeMatchKind::When(Arc::new(f)))
    }
    /// Every snippet.
    pub fn any() -> Self {
        CodeMatch(CodeMatchKind::Any)
    }
    /// Whether `code` matches.
    pub fn matches(&self, code: &str) -> bool {
        match &self.0 {
            CodeMatchKind::Exact(c) => c == code.trim(),
            CodeMatchKind::Contains(n) => code.contains(n.as_str()),
            CodeMatchKind::When(f) => f(code),
            CodeMatchKind::Any => true,
        }
    }
}

impl From<&str> for CodeMatch {
    fn from(s: &str) -> Self {
        CodeMatch::exact(s)
    }
}

/// One step of a scripted output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Emit a chunk.
    Chunk(OutputChunk),
    /// Wait (virtual time).
    Sleep(Duration),
}

impl Step {
    /// A stdout chunk.
    pub fn stdout(data: impl Into<Bytes>) -> Self {
        Step::Chunk(OutputChunk::stdout(data))
    }
    /// A stderr chunk.
    pub fn stderr(data: impl Into<Bytes>) -> Self {
        Step::Chunk(OutputChunk::stderr(data))
    }
    /// A pause.
    pub fn sleep(d: Duration) -> Self {
        Step::Sleep(d)
    }
}

/// What a scripted command or snippet does.
#[derive(Clone)]
pub struct Response {
    pub(crate) steps: Vec<Step>,
    pub(crate) end: End,
}

/// How a scripted response ends, once its steps are played.
#[derive(Clone)]
pub(crate) enum End {
    Exit(i64),
    Hang,
    Error(ErrorFactory),
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let end = match &self.end {
            End::Exit(c) => format!("exit {c}"),
            End::Hang => "hang".into(),
            End::Error(e) => format!("error {}", e().code()),
        };
        f.debug_struct("Response")
            .field("steps", &self.steps)
            .field("end", &end)
            .finish()
    }
}

impl Response {
    /// Exit `exit_code` after writing `stdout` then `stderr`.
    pub fn output(exit_code: i64, stdout: impl Into<Bytes>, stderr: impl Into<Bytes>) -> Self {
        let chunks = [OutputChunk::stdout(stdout), OutputChunk::stderr(stderr)];
        let steps = chunks.into_iter().filter(|c| !c.data.is_empty());
        Response::steps(steps.map(Step::Chunk)).exit_code(exit_code)
    }
    /// Exit 0 with this stdout.
    pub fn ok(stdout: impl Into<Bytes>) -> Self {
        Response::output(0, stdout, Bytes::new())
    }
    /// Replays an [`ExecResult`] (its stdout, stderr and exit code).
    pub fn result(r: ExecResult) -> Self {
        Response::output(r.exit_code, r.stdout, r.stderr)
    }
    /// Plays `steps` (chunks and pauses, in order) then exits 0; see
    /// [`Response::exit_code`].
    pub fn steps(steps: impl IntoIterator<Item = Step>) -> Self {
        Response {
            steps: steps.into_iter().collect(),
            end: End::Exit(0),
        }
    }
    /// Never completes (until killed or timed out).
    pub fn hang() -> Self {
        Response::steps([]).then_hang()
    }
    /// Fails the whole call with the error `f` builds (called once per use).
    pub fn error(f: impl Fn() -> SandboxError + Send + Sync + 'static) -> Self {
        let end = End::Error(Arc::new(f));
        Response { steps: vec![], end }
    }
    /// Sets the exit code played after the steps.
    pub fn exit_code(mut self, code: i64) -> Self {
        self.end = End::Exit(code);
        self
    }
    /// Hangs after the steps instead of exiting.
    pub fn then_hang(mut self) -> Self {
        self.end = End::Hang;
        self
    }
}

struct Rule<M> {
    matcher: M,
    response: Response,
    remaining: Option<usize>,
}

/// The rules of one engine.
#[derive(Default)]
pub(crate) struct Script {
    run: Vec<Rule<RunMatch>>,
    code: Vec<Rule<CodeMatch>>,
}

fn take<M>(rules: &mut [Rule<M>], is_match: impl Fn(&M) -> bool) -> Option<Response> {
    let idx = rules
        .iter()
        .rposition(|r| r.remaining != Some(0) && is_match(&r.matcher))?;
    let rule = &mut rules[idx];
    if let Some(n) = rule.remaining.as_mut() {
        *n -= 1;
    }
    Some(rule.response.clone())
}

fn add<M>(rules: &mut Vec<Rule<M>>, matcher: M, response: Response, remaining: Option<usize>) {
    rules.push(Rule {
        matcher,
        response,
        remaining,
    });
}

impl Script {
    pub(crate) fn add_run(&mut self, m: RunMatch, response: Response, times: Option<usize>) {
        add(&mut self.run, m, response, times);
    }
    pub(crate) fn add_code(&mut self, m: CodeMatch, response: Response, times: Option<usize>) {
        add(&mut self.code, m, response, times);
    }
    pub(crate) fn match_run(&mut self, argv: &[String]) -> Option<Response> {
        take(&mut self.run, |m| m.matches(argv))
    }
    pub(crate) fn match_code(&mut self, code: &str) -> Option<Response> {
        take(&mut self.code, |m| m.matches(code))
    }
    pub(crate) fn clear(&mut self) {
        self.run.clear();
        self.code.clear();
    }
}
