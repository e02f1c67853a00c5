//! The `sh -c` subset of the fake: `;`, newlines, `&&`, `||`, `&` (background jobs with
//! `$!` and `wait`), `$VAR`, `${VAR}`, `${VAR:-default}`, `$$`, `$?`, `$!`, `$0..$9`, `$#`,
//! single and double quotes, backslash escapes, redirections (`>`, `>>`, `<`, `2>`, `>&2`,
//! `2>&1`, `N>&M`), `VAR=value` assignments (alone or before a command), `exec`, `exit`,
//! `cd`, `export`, `unset`, `wait`, and pipes (run one stage after the other, output
//! buffered). Anything else — command substitution, subshells, `if`/`for`/`while`/`case`,
//! globbing, here-documents — is refused with an explicit message and exit status 2, never
//! silently misinterpreted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sandbox_core::Result;
use tokio::task::JoinHandle;

use crate::exec::{Origin, Proc, Sink, run_program};
use crate::memfs::FsError;
use crate::processes::{SpawnError, spawn_process};

/// A piece of a word.
#[derive(Debug, Clone, PartialEq)]
enum Seg {
    /// Literal text; `true` when quoted (no field splitting).
    Lit(String, bool),
    /// `$NAME`; `true` when quoted.
    Var(String, bool),
    /// `${NAME:-default}`.
    VarDefault(String, String, bool),
}

type Word = Vec<Seg>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Semi,
    Amp,
    And,
    Or,
    Pipe,
    Newline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RedirKind {
    Out,
    Append,
    In,
    Dup(u32),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(Word),
    Op(Op),
    Redir(u32, RedirKind),
}

#[derive(Debug, Clone, PartialEq)]
struct Redir {
    fd: u32,
    kind: RedirKind,
    target: Option<Word>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Simple {
    assigns: Vec<(String, Word)>,
    words: Vec<Word>,
    redirs: Vec<Redir>,
}

type Pipeline = Vec<Simple>;

#[derive(Debug, Clone, PartialEq)]
struct AndOr {
    first: Pipeline,
    rest: Vec<(Op, Pipeline)>,
}

#[derive(Debug, Clone, PartialEq)]
struct Item {
    cmd: AndOr,
    background: bool,
}

fn unsupported(what: &str) -> String {
    format!("{what} not supported by sandbox-fake's shell (script it with FakeBackend::on_run)")
}

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

fn push_lit(word: &mut Word, c: char, quoted: bool) {
    if let Some(Seg::Lit(s, q)) = word.last_mut() {
        if *q == quoted {
            s.push(c);
            return;
        }
    }
    word.push(Seg::Lit(c.to_string(), quoted));
}

/// Parses `$…` at `chars[*i]` (which is `$`) into `word`.
fn lex_dollar(
    chars: &[char],
    i: &mut usize,
    word: &mut Word,
    quoted: bool,
) -> std::result::Result<(), String> {
    let next = chars.get(*i + 1).copied();
    match next {
        Some('{') => {
            let start = *i + 2;
            let Some(len) = chars[start..].iter().position(|&c| c == '}') else {
                return Err("missing '}'".into());
            };
            let inner: String = chars[start..start + len].iter().collect();
            *i = start + len + 1;
            if let Some((name, default)) = inner.split_once(":-") {
                if !is_name(name) {
                    return Err(format!("{inner}: bad substitution"));
                }
                word.push(Seg::VarDefault(name.into(), default.into(), quoted));
            } else if is_name(&inner)
                || matches!(inner.as_str(), "$" | "?" | "!" | "#" | "@" | "*")
                || inner.chars().all(|c| c.is_ascii_digit()) && !inner.is_empty()
            {
                word.push(Seg::Var(inner, quoted));
            } else {
                return Err(
                    if inner.starts_with('#') || inner.contains(['%', '/', ':']) {
                        unsupported("parameter operators are")
                    } else {
                        format!("{inner}: bad substitution")
                    },
                );
            }
        }
        Some('(') => return Err(unsupported("command substitution $(...) is")),
        Some(c) if "$?!#@*-".contains(c) || c.is_ascii_digit() => {
            word.push(Seg::Var(c.to_string(), quoted));
            *i += 2;
        }
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {
            let start = *i + 1;
            let mut end = start;
            while end < chars.len() && (chars[end].is_ascii_alphanumeric() || chars[end] == '_') {
                end += 1;
            }
            word.push(Seg::Var(chars[start..end].iter().collect(), quoted));
            *i = end;
        }
        _ => {
            push_lit(word, '$', quoted);
            *i += 1;
        }
    }
    Ok(())
}

#[allow(unused_assignments)]
fn lex(src: &str) -> std::result::Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut word: Word = Vec::new();
    let mut in_word = false;
    let mut i = 0;
    macro_rules! flush {
        () => {
            if in_word {
                toks.push(Tok::Word(std::mem::take(&mut word)));
                in_word = false;
            }
        };
    }
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\r' => {
                flush!();
                i += 1;
            }
            '\n' => {
                flush!();
                toks.push(Tok::Op(Op::Newline));
                i += 1;
            }
            '#' if !in_word => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ';' => {
                flush!();
                if chars.get(i + 1) == Some(&';') {
                    return Err("syntax error: unexpected \";;\"".into());
                }
                toks.push(Tok::Op(Op::Semi));
                i += 1;
            }
            '&' => {
                flush!();
                match chars.get(i + 1) {
                    Some('&') => {
                        toks.push(Tok::Op(Op::And));
                        i += 2;
                    }
                    Some('>') => return Err(unsupported("`&>` is")),
                    _ => {
                        toks.push(Tok::Op(Op::Amp));
                        i += 1;
                    }
                }
            }
            '|' => {
                flush!();
                if chars.get(i + 1) == Some(&'|') {
                    toks.push(Tok::Op(Op::Or));
                    i += 2;
                } else {
                    toks.push(Tok::Op(Op::Pipe));
                    i += 1;
                }
            }
            '>' | '<' => {
                // A word of only unquoted digits right before the operator is the fd.
                let fd = match (in_word, word.as_slice()) {
                    (true, [Seg::Lit(s, false)]) if s.chars().all(|c| c.is_ascii_digit()) => {
                        let fd = s.parse::<u32>().map_err(|_| "bad fd number".to_string())?;
                        word.clear();
                        in_word = false;
                        Some(fd)
                    }
                    _ => {
                        flush!();
                        None
                    }
                };
                if c == '<' {
                    if chars.get(i + 1) == Some(&'<') {
                        return Err(unsupported("here-documents are"));
                    }
                    toks.push(Tok::Redir(fd.unwrap_or(0), RedirKind::In));
                    i += 1;
                    continue;
                }
                let fd = fd.unwrap_or(1);
                match chars.get(i + 1) {
                    Some('>') => {
                        toks.push(Tok::Redir(fd, RedirKind::Append));
                        i += 2;
                    }
                    Some('&') => {
                        let start = i + 2;
                        let mut end = start;
                        while end < chars.len() && chars[end].is_ascii_digit() {
                            end += 1;
                        }
                        let target: String = chars[start..end].iter().collect();
                        let target = target
                            .parse::<u32>()
                            .map_err(|_| "syntax error: bad fd after >&".to_string())?;
                        toks.push(Tok::Redir(fd, RedirKind::Dup(target)));
                        i = end;
                    }
                    Some('|') => {
                        toks.push(Tok::Redir(fd, RedirKind::Out));
                        i += 2;
                    }
                    _ => {
                        toks.push(Tok::Redir(fd, RedirKind::Out));
                        i += 1;
                    }
                }
            }
            '\'' => {
                in_word = true;
                let start = i + 1;
                let Some(len) = chars[start..].iter().position(|&c| c == '\'') else {
                    return Err("syntax error: unterminated quoted string".into());
                };
                word.push(Seg::Lit(chars[start..start + len].iter().collect(), true));
                i = start + len + 1;
            }
            '"' => {
                in_word = true;
                word.push(Seg::Lit(String::new(), true));
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("syntax error: unterminated quoted string".into()),
                        Some('"') => {
                            i += 1;
                            break;
                        }
                        Some('\\') => {
                            match chars.get(i + 1) {
                                Some('\n') => {}
                                Some(&n) if "$`\"\\".contains(n) => push_lit(&mut word, n, true),
                                _ => push_lit(&mut word, '\\', true),
                            }
                            i += if chars.get(i + 1).is_some_and(|n| "$`\"\\\n".contains(*n)) {
                                2
                            } else {
                                1
                            };
                        }
                        Some('$') => lex_dollar(&chars, &mut i, &mut word, true)?,
                        Some('`') => return Err(unsupported("command substitution `...` is")),
                        Some(&other) => {
                            push_lit(&mut word, other, true);
                            i += 1;
                        }
                    }
                }
            }
            '\\' => {
                match chars.get(i + 1) {
                    Some('\n') => {}
                    Some(&n) => {
                        in_word = true;
                        push_lit(&mut word, n, true);
                    }
                    None => {
                        in_word = true;
                        push_lit(&mut word, '\\', false);
                    }
                }
                i += 2;
            }
            '$' => {
                in_word = true;
                lex_dollar(&chars, &mut i, &mut word, false)?;
            }
            '`' => return Err(unsupported("command substitution `...` is")),
            '(' | ')' => return Err(unsupported("subshells and `( )` are")),
            _ => {
                in_word = true;
                push_lit(&mut word, c, false);
                i += 1;
            }
        }
    }
    flush!();
    Ok(toks)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn skip_newlines(&mut self) {
        while self.peek() == Some(&Tok::Op(Op::Newline)) {
            self.pos += 1;
        }
    }

    fn script(&mut self) -> std::result::Result<Vec<Item>, String> {
        let mut items = Vec::new();
        loop {
            while matches!(self.peek(), Some(Tok::Op(Op::Newline | Op::Semi))) {
                if self.peek() == Some(&Tok::Op(Op::Semi)) && items.is_empty() {
                    return Err("syntax error: unexpected \";\"".into());
                }
                self.pos += 1;
            }
            if self.peek().is_none() {
                return Ok(items);
            }
            let cmd = self.and_or()?;
            let background = match self.peek() {
                Some(Tok::Op(Op::Amp)) => {
                    self.pos += 1;
                    true
                }
                Some(Tok::Op(Op::Semi | Op::Newline)) => {
                    self.pos += 1;
                    false
                }
                None => false,
                Some(t) => return Err(format!("syntax error: unexpected {t:?}")),
            };
            items.push(Item { cmd, background });
        }
    }

    fn and_or(&mut self) -> std::result::Result<AndOr, String> {
        let first = self.pipeline()?;
        let mut rest = Vec::new();
        while let Some(Tok::Op(op @ (Op::And | Op::Or))) = self.peek().cloned() {
            self.pos += 1;
            self.skip_newlines();
            rest.push((op, self.pipeline()?));
        }
        Ok(AndOr { first, rest })
    }

    fn pipeline(&mut self) -> std::result::Result<Pipeline, String> {
        let mut stages = vec![self.simple()?];
        while self.peek() == Some(&Tok::Op(Op::Pipe)) {
            self.pos += 1;
            self.skip_newlines();
            stages.push(self.simple()?);
        }
        Ok(stages)
    }

    fn simple(&mut self) -> std::result::Result<Simple, String> {
        let mut cmd = Simple::default();
        loop {
            match self.peek().cloned() {
                Some(Tok::Word(w)) => {
                    self.pos += 1;
                    if cmd.words.is_empty() {
                        if let Some(Seg::Lit(s, false)) = w.first() {
                            if let Some((name, value)) = s.split_once('=') {
                                if is_name(name) {
                                    let mut v: Word = vec![Seg::Lit(value.to_string(), false)];
                                    v.extend(w[1..].iter().cloned());
                                    cmd.assigns.push((name.to_string(), v));
                                    continue;
                                }
                            }
                        }
                    }
                    cmd.words.push(w);
                }
                Some(Tok::Redir(fd, kind)) => {
                    self.pos += 1;
                    let target = match kind {
                        RedirKind::Dup(_) => None,
                        _ => match self.peek().cloned() {
                            Some(Tok::Word(w)) => {
                                self.pos += 1;
                                Some(w)
                            }
                            _ => return Err("syntax error: missing redirection target".into()),
                        },
                    };
                    cmd.redirs.push(Redir { fd, kind, target });
                }
                _ => break,
            }
        }
        if cmd.words.is_empty() && cmd.assigns.is_empty() && cmd.redirs.is_empty() {
            return Err(match self.peek() {
                Some(t) => format!("syntax error: unexpected {}", describe(t)),
                None => "syntax error: unexpected end of file".into(),
            });
        }
        Ok(cmd)
    }
}

fn describe(t: &Tok) -> &'static str {
    match t {
        Tok::Op(Op::Semi) => "\";\"",
        Tok::Op(Op::Amp) => "\"&\"",
        Tok::Op(Op::And) => "\"&&\"",
        Tok::Op(Op::Or) => "\"||\"",
        Tok::Op(Op::Pipe) => "\"|\"",
        Tok::Op(Op::Newline) => "newline",
        Tok::Word(_) => "word",
        Tok::Redir(..) => "redirection",
    }
}

fn parse(src: &str) -> std::result::Result<Vec<Item>, String> {
    let toks = lex(src)?;
    Parser { toks, pos: 0 }.script()
}

/// What a command did to the shell's control flow.
enum Flow {
    Next(i64),
    Exit(i64),
}

impl Flow {
    fn code(&self) -> i64 {
        match self {
            Flow::Next(c) | Flow::Exit(c) => *c,
        }
    }
}

/// Streams of one command after redirections.
struct Io {
    stdin: Bytes,
    stdout: Sink,
    stderr: Sink,
}

/// One shell process.
pub(crate) struct Shell {
    vars: BTreeMap<String, String>,
    exported: BTreeSet<String>,
    last: i64,
    last_bg: Option<u32>,
    children: Vec<(u32, JoinHandle<Result<i64>>)>,
    shell_pid: u32,
    args: Vec<String>,
    cwd: String,
    stdin: Bytes,
    stdout: Sink,
    stderr: Sink,
}

const KEYWORDS: &[&str] = &[
    "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac",
    "function", "select", "{", "}", "!", "[[", "]]",
];

impl Shell {
    /// A shell running as `proc`, with `$0 $1…` = `args`.
    pub(crate) fn new(proc: &Proc, args: Vec<String>) -> Shell {
        Shell {
            exported: proc.env.keys().cloned().collect(),
            vars: proc.env.clone(),
            last: 0,
            last_bg: None,
            children: Vec::new(),
            shell_pid: proc.pid,
            args,
            cwd: proc.cwd.clone(),
            stdin: proc.stdin.clone(),
            stdout: proc.stdout.clone(),
            stderr: proc.stderr.clone(),
        }
    }

    fn fork(&self) -> Shell {
        Shell {
            vars: self.vars.clone(),
            exported: self.exported.clone(),
            last: self.last,
            last_bg: self.last_bg,
            children: Vec::new(),
            shell_pid: self.shell_pid,
            args: self.args.clone(),
            cwd: self.cwd.clone(),
            stdin: Bytes::new(),
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
        }
    }

    /// Runs a script; returns the exit status.
    pub(crate) async fn run(&mut self, proc: &Proc, src: &str) -> Result<i64> {
        let items = match parse(src) {
            Ok(items) => items,
            Err(msg) => {
                proc.write(&self.stderr, Bytes::from(format!("sh: {msg}\n")))
                    .await;
                return Ok(2);
            }
        };
        for item in &items {
            if item.background {
                self.spawn_background(proc, item.cmd.clone()).await;
                continue;
            }
            if let Flow::Exit(code) = self.and_or(proc, &item.cmd).await? {
                return Ok(code);
            }
        }
        Ok(self.last)
    }

    async fn spawn_background(&mut self, proc: &Proc, cmd: AndOr) {
        let mut child = self.fork();
        // Like a forked subshell that applies its redirections before exec'ing the program:
        // a job whose output goes elsewhere must not keep the exec's output stream open.
        if let ([simple], true) = (cmd.first.as_slice(), cmd.rest.is_empty()) {
            if let Ok(io) = self.redirect(proc, &simple.redirs, None, None) {
                child.stdout = io.stdout;
                child.stderr = io.stderr;
            }
        }
        let mut base = proc.clone();
        base.stdout = Sink::Null;
        base.stderr = Sink::Null;
        let spawned = spawn_process(&proc.sb, Some(proc.pgid), "sh".to_string(), move |pid| {
            Box::pin(async move {
                let mut p = base;
                p.pid = pid;
                child.and_or(&p, &cmd).await.map(|f| f.code())
            })
        });
        match spawned {
            Ok((pid, handle)) => {
                self.children.push((pid, handle));
                self.last_bg = Some(pid);
                self.last = 0;
            }
            Err(SpawnError::PidsLimit) => {
                proc.write(
                    &self.stderr,
                    Bytes::from_static(b"sh: can't fork: Resource temporarily unavailable\n"),
                )
                .await;
                self.last = 2;
            }
        }
    }

    async fn and_or(&mut self, proc: &Proc, cmd: &AndOr) -> Result<Flow> {
        let mut flow = self.pipeline(proc, &cmd.first).await?;
        for (op, pl) in &cmd.rest {
            if let Flow::Exit(_) = flow {
                return Ok(flow);
            }
            let run = match op {
                Op::And => self.last == 0,
                _ => self.last != 0,
            };
            if run {
                flow = self.pipeline(proc, pl).await?;
            }
        }
        Ok(flow)
    }

    async fn pipeline(&mut self, proc: &Proc, stages: &Pipeline) -> Result<Flow> {
        if stages.len() == 1 {
            return self.simple(proc, &stages[0], None, None).await;
        }
        // Stages run one after the other; each one's output is the next one's input.
        let mut input: Option<Bytes> = None;
        let mut code = 0;
        for (i, stage) in stages.iter().enumerate() {
            let last = i + 1 == stages.len();
            let buffer = Arc::new(Mutex::new(Vec::new()));
            let out = (!last).then(|| Sink::Buffer(buffer.clone()));
            code = self.simple(proc, stage, input.take(), out).await?.code();
            if !last {
                let data = std::mem::take(&mut *buffer.lock().unwrap_or_else(|p| p.into_inner()));
                input = Some(Bytes::from(data));
            }
        }
        self.last = code;
        Ok(Flow::Next(code))
    }

    fn lookup(&self, name: &str) -> Option<String> {
        match name {
            "$" => Some(self.shell_pid.to_string()),
            "?" => Some(self.last.to_string()),
            "!" => self.last_bg.map(|p| p.to_string()),
            "#" => Some(self.args.len().saturating_sub(1).to_string()),
            "@" | "*" => Some(self.args.get(1..).unwrap_or_default().join(" ")),
            "-" => Some(String::new()),
            n if n.chars().all(|c| c.is_ascii_digit()) => n
                .parse::<usize>()
                .ok()
                .and_then(|i| self.args.get(i).cloned()),
            n => self.vars.get(n).cloned(),
        }
    }

    /// Expands a word into fields (unquoted expansions are split on whitespace).
    fn expand(&self, word: &Word) -> Vec<String> {
        let mut fields = Vec::new();
        let mut cur = String::new();
        let mut have = false;
        for seg in word {
            let (value, quoted) = match seg {
                Seg::Lit(s, q) => {
                    cur.push_str(s);
                    have |= *q || !s.is_empty();
                    continue;
                }
                Seg::Var(n, q) => (self.lookup(n).unwrap_or_default(), *q),
                Seg::VarDefault(n, d, q) => (
                    self.lookup(n)
                        .filter(|v| !v.is_empty())
                        .unwrap_or_else(|| d.clone()),
                    *q,
                ),
            };
            if quoted {
                cur.push_str(&value);
                have = true;
                continue;
            }
            let parts: Vec<&str> = value.split_whitespace().collect();
            if parts.is_empty() {
                continue;
            }
            if value.starts_with(char::is_whitespace) && have {
                fields.push(std::mem::take(&mut cur));
            }
            for (i, p) in parts.iter().enumerate() {
                if i > 0 {
                    fields.push(std::mem::take(&mut cur));
                }
                cur.push_str(p);
            }
            have = true;
            if value.ends_with(char::is_whitespace) {
                fields.push(std::mem::take(&mut cur));
                have = false;
            }
        }
        if have {
            fields.push(cur);
        }
        fields
    }

    fn expand_joined(&self, word: &Word) -> String {
        let mut s = String::new();
        for seg in word {
            match seg {
                Seg::Lit(l, _) => s.push_str(l),
                Seg::Var(n, _) => s.push_str(&self.lookup(n).unwrap_or_default()),
                Seg::VarDefault(n, d, _) => s.push_str(
                    &self
                        .lookup(n)
                        .filter(|v| !v.is_empty())
                        .unwrap_or_else(|| d.clone()),
                ),
            }
        }
        s
    }

    fn open_output(
        &self,
        proc: &Proc,
        target: &str,
        append: bool,
    ) -> std::result::Result<Sink, String> {
        match target {
            "/dev/null" => return Ok(Sink::Null),
            "/dev/stdout" => return Ok(self.stdout.clone()),
            "/dev/stderr" => return Ok(self.stderr.clone()),
            "" => return Err("can't create : nonexistent directory".into()),
            _ => {}
        }
        let path = sandbox_core::resolve_path(&self.cwd, target).map_err(|e| e.to_string())?;
        let now = proc.sb.now();
        let mut fs = proc.sb.fs();
        let r = if append && fs.get(&path).is_some() {
            fs.append(&path, &[], now)
        } else {
            fs.write(&path, Vec::new(), false, now)
        };
        match r {
            Ok(()) => Ok(Sink::File(path)),
            Err(FsError::NotFound) => Err(format!("can't create {target}: nonexistent directory")),
            Err(e) => Err(format!("can't create {target}: {}", e.errno_text())),
        }
    }

    fn redirect(
        &self,
        proc: &Proc,
        redirs: &[Redir],
        stdin: Option<Bytes>,
        stdout: Option<Sink>,
    ) -> std::result::Result<Io, String> {
        let mut io = Io {
            stdin: stdin.unwrap_or_else(|| self.stdin.clone()),
            stdout: stdout.unwrap_or_else(|| self.stdout.clone()),
            stderr: self.stderr.clone(),
        };
        for r in redirs {
            let sink = match r.kind {
                RedirKind::Out | RedirKind::Append => {
                    let target = r
                        .target
                        .as_ref()
                        .map(|w| self.expand_joined(w))
                        .unwrap_or_default();
                    self.open_output(proc, &target, r.kind == RedirKind::Append)?
                }
                RedirKind::In => {
                    let target = r
                        .target
                        .as_ref()
                        .map(|w| self.expand_joined(w))
                        .unwrap_or_default();
                    let path = sandbox_core::resolve_path(&self.cwd, &target)
                        .map_err(|e| e.to_string())?;
                    io.stdin = proc
                        .sb
                        .read_all(&path, 1 << 20)
                        .map_err(|e| format!("can't open '{target}': {}", e.errno_text()))?;
                    continue;
                }
                RedirKind::Dup(1) => io.stdout.clone(),
                RedirKind::Dup(2) => io.stderr.clone(),
                RedirKind::Dup(n) => return Err(format!("{n}: bad file descriptor")),
            };
            match r.fd {
                1 => io.stdout = sink,
                2 => io.stderr = sink,
                // Other descriptors are accepted and ignored (nothing reads them).
                _ => {}
            }
        }
        Ok(io)
    }

    async fn simple(
        &mut self,
        proc: &Proc,
        cmd: &Simple,
        stdin: Option<Bytes>,
        stdout: Option<Sink>,
    ) -> Result<Flow> {
        let mut argv = Vec::new();
        for w in &cmd.words {
            argv.extend(self.expand(w));
        }
        let assigns: Vec<(String, String)> = cmd
            .assigns
            .iter()
            .map(|(k, w)| (k.clone(), self.expand_joined(w)))
            .collect();
        let io = match self.redirect(proc, &cmd.redirs, stdin, stdout) {
            Ok(io) => io,
            Err(msg) => {
                proc.write(&self.stderr, Bytes::from(format!("sh: {msg}\n")))
                    .await;
                self.last = 1;
                return Ok(Flow::Next(1));
            }
        };
        if argv.is_empty() {
            for (k, v) in assigns {
                self.vars.insert(k, v);
            }
            self.last = 0;
            return Ok(Flow::Next(0));
        }
        if KEYWORDS.contains(&argv[0].as_str()) {
            let msg = format!("sh: {}\n", unsupported(&format!("`{}` is", argv[0])));
            proc.write(&io.stderr, Bytes::from(msg)).await;
            return Ok(Flow::Exit(2));
        }
        let code = match argv[0].as_str() {
            "exit" => {
                let code = match argv.get(1) {
                    None => self.last,
                    Some(s) => match s.parse::<i64>() {
                        Ok(c) => c & 0xff,
                        Err(_) => {
                            proc.write(
                                &io.stderr,
                                Bytes::from(format!("sh: exit: Illegal number: {s}\n")),
                            )
                            .await;
                            2
                        }
                    },
                };
                return Ok(Flow::Exit(code));
            }
            "exec" => {
                if argv.len() == 1 {
                    self.stdin = io.stdin;
                    self.stdout = io.stdout;
                    self.stderr = io.stderr;
                    0
                } else {
                    let code = self.program(proc, io, &assigns, argv[1..].to_vec()).await?;
                    return Ok(Flow::Exit(code));
                }
            }
            "wait" => self.wait(&argv[1..]).await?,
            "cd" => self.cd(proc, &io, argv.get(1)).await,
            "export" => {
                for a in &argv[1..] {
                    match a.split_once('=') {
                        Some((k, v)) => {
                            self.vars.insert(k.to_string(), v.to_string());
                            self.exported.insert(k.to_string());
                        }
                        None => {
                            self.exported.insert(a.clone());
                        }
                    }
                }
                0
            }
            "unset" => {
                for a in &argv[1..] {
                    self.vars.remove(a);
                    self.exported.remove(a);
                }
                0
            }
            "set" | ":" => 0,
            _ => self.program(proc, io, &assigns, argv).await?,
        };
        self.last = code;
        Ok(Flow::Next(code))
    }

    async fn program(
        &mut self,
        proc: &Proc,
        io: Io,
        assigns: &[(String, String)],
        argv: Vec<String>,
    ) -> Result<i64> {
        let mut env: BTreeMap<String, String> = self
            .vars
            .iter()
            .filter(|(k, _)| self.exported.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in assigns {
            env.insert(k.clone(), v.clone());
        }
        let child = Proc {
            sb: proc.sb.clone(),
            pid: proc.pid,
            pgid: proc.pgid,
            env,
            cwd: self.cwd.clone(),
            stdin: io.stdin,
            stdout: io.stdout,
            stderr: io.stderr,
        };
        run_program(child, argv, Origin::Shell).await
    }

    async fn wait(&mut self, pids: &[String]) -> Result<i64> {
        let wanted: Option<Vec<u32>> = if pids.is_empty() {
            None
        } else {
            Some(pids.iter().filter_map(|p| p.parse().ok()).collect())
        };
        let mut code = 0;
        let children = std::mem::take(&mut self.children);
        for (pid, handle) in children {
            if wanted.as_ref().is_some_and(|w| !w.contains(&pid)) {
                self.children.push((pid, handle));
                continue;
            }
            code = match handle.await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return Err(e),
                Err(_) => sandbox_core::KILLED_EXIT_CODE,
            };
        }
        Ok(if wanted.is_some() { code } else { 0 })
    }

    async fn cd(&mut self, proc: &Proc, io: &Io, dir: Option<&String>) -> i64 {
        let target = dir
            .cloned()
            .or_else(|| self.vars.get("HOME").cloned())
            .unwrap_or_else(|| "/".into());
        let path = sandbox_core::resolve_path(&self.cwd, &target).unwrap_or_else(|_| "/".into());
        let is_dir = proc.sb.fs().get(&path).map(|n| n.is_dir());
        match is_dir {
            Some(true) => {
                self.cwd = path.clone();
                self.vars.insert("PWD".into(), path);
                0
            }
            other => {
                let why = if other.is_some() {
                    "Not a directory"
                } else {
                    "No such file or directory"
                };
                proc.write(
                    &io.stderr,
                    Bytes::from(format!("sh: cd: can't cd to {target}: {why}\n")),
                )
                .await;
                2
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str, q: bool) -> Seg {
        Seg::Lit(s.into(), q)
    }

    #[test]
    fn lexes_quotes_vars_and_redirections() {
        let toks = lex(r#"echo 'a b' "x$HOME" ${V} 2>&1 >> f"#).unwrap();
        assert_eq!(toks[0], Tok::Word(vec![lit("echo", false)]));
        assert_eq!(toks[1], Tok::Word(vec![lit("a b", true)]));
        assert_eq!(
            toks[2],
            Tok::Word(vec![lit("x", true), Seg::Var("HOME".into(), true)])
        );
        assert_eq!(toks[3], Tok::Word(vec![Seg::Var("V".into(), false)]));
        assert_eq!(toks[4], Tok::Redir(2, RedirKind::Dup(1)));
        assert_eq!(toks[5], Tok::Redir(1, RedirKind::Append));
    }

    #[test]
    fn parses_lists_and_background() {
        let items = parse("sleep 30 & echo $! > pid; wait").unwrap();
        assert_eq!(items.len(), 3);
        assert!(items[0].background);
        assert_eq!(items[1].cmd.first[0].redirs.len(), 1);
        let items = parse("false || echo a && echo b\necho c").unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].cmd.rest.len(), 2);
    }

    #[test]
    fn assignments_are_recognised() {
        let items = parse("A=1 B=\"x y\" env").unwrap();
        let s = &items[0].cmd.first[0];
        assert_eq!(s.assigns.len(), 2);
        assert_eq!(s.words.len(), 1);
    }

    #[test]
    fn refuses_unsupported_constructs() {
        for src in [
            "echo $(id)",
            "echo `id`",
            "(echo a)",
            "cat <<EOF",
            "echo ${#X}",
        ] {
            let e = parse(src).unwrap_err();
            assert!(e.contains("not supported"), "{src}: {e}");
        }
        assert!(parse("echo 'unterminated").is_err());
        assert!(parse("&& echo").is_err());
        assert!(parse("; echo").is_err());
    }
}
