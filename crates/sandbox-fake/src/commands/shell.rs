//! `sh -c` in exactly the forms of [`crate::vocabulary::SHELL_FORMS`]: lists (`;`, newline,
//! `&&`, `||`), background jobs (`&`), `exec`, `exit`, comments, output redirections,
//! quotes and `$NAME $$ $! $?`. Anything else is refused with a message naming the
//! construct and exit status 2 — never silently misread.

use std::collections::BTreeMap;

use bytes::Bytes;
use sandbox_core::Result;

use crate::commands::refusal::{FORM_NOT_IN_VOCABULARY_EXIT, form_not_in_vocabulary};
use crate::commands::run_program;
use crate::processes::SpawnError;
use crate::program::{Proc, Sink, spawn_process};

/// `sh -c SCRIPT`, the only form of `sh`.
pub(crate) async fn sh(p: Proc, a: Vec<String>) -> Result<i64> {
    match a.as_slice() {
        [_, flag, script] if flag == "-c" => Shell::new(&p).run(&p, script).await,
        _ => form_not_in_vocabulary(&p, &a).await,
    }
}

/// A piece of a word: literal text, or a parameter to expand (`$NAME`, `$$`, `$!`, `$?`).
#[derive(Debug, Clone, PartialEq)]
enum Seg {
    Lit(String),
    Var(String),
}

/// A word and whether any of it was quoted (quoted words are not split).
#[derive(Debug, Clone, PartialEq, Default)]
struct Word {
    segs: Vec<Seg>,
    quoted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Seq,
    And,
    Or,
    Bg,
}

#[derive(Debug, Clone, PartialEq)]
enum Redir {
    /// `> FILE` (or `2> FILE` with fd 2), `>> FILE` when appending.
    File { fd: u8, append: bool, target: Word },
    /// `N>&M`.
    Dup { fd: u8, to: u8 },
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(Word),
    Op(Op),
    Redir(Redir),
}

#[derive(Debug, Clone, Default)]
struct Simple {
    words: Vec<Word>,
    redirs: Vec<Redir>,
}

/// `first (&& | ||) next …`, run in the foreground or as a background job.
#[derive(Debug, Clone)]
struct AndOr {
    first: Simple,
    rest: Vec<(Op, Simple)>,
    background: bool,
}

fn refuse(what: &str) -> String {
    format!("not in the fake's vocabulary: {what}")
}

/// Answers a refused construct: records it and writes `sh: MSG` to `stderr`.
async fn refused(proc: &Proc, stderr: &Sink, msg: &str) -> i64 {
    proc.sb.outside_vocabulary(format!("sh: {msg}"));
    proc.write(stderr, Bytes::from(format!("sh: {msg}\n")))
        .await;
    FORM_NOT_IN_VOCABULARY_EXIT
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Reads the parameter after a `$` at `chars[*i]`.
fn lex_dollar(chars: &[char], i: &mut usize) -> std::result::Result<Seg, String> {
    *i += 1;
    match chars.get(*i) {
        Some(c @ ('$' | '!' | '?')) => {
            *i += 1;
            Ok(Seg::Var(c.to_string()))
        }
        Some('(') => Err(refuse("command substitution `$(…)`")),
        Some('{') => Err(refuse("parameter expansion `${…}`")),
        Some(c) if is_name_char(*c) => {
            let name: String = chars[*i..]
                .iter()
                .take_while(|c| is_name_char(**c))
                .collect();
            *i += name.len();
            Ok(Seg::Var(name))
        }
        _ => Ok(Seg::Lit("$".into())),
    }
}

fn push_lit(word: &mut Word, c: char) {
    match word.segs.last_mut() {
        Some(Seg::Lit(s)) => s.push(c),
        _ => word.segs.push(Seg::Lit(c.to_string())),
    }
}

fn lex(src: &str) -> std::result::Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut word: Option<Word> = None;
    let mut i = 0;
    let flush = |word: &mut Option<Word>, toks: &mut Vec<Tok>| {
        if let Some(w) = word.take() {
            toks.push(Tok::Word(w));
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => flush(&mut word, &mut toks),
            '\n' | ';' => {
                flush(&mut word, &mut toks);
                toks.push(Tok::Op(Op::Seq));
            }
            '#' if word.is_none() => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '&' | '|' => {
                flush(&mut word, &mut toks);
                let double = chars.get(i + 1) == Some(&c);
                let op = match (c, double) {
                    ('&', true) => Op::And,
                    ('&', false) => Op::Bg,
                    ('|', true) => Op::Or,
                    _ => return Err(refuse("pipe `|`")),
                };
                toks.push(Tok::Op(op));
                i += if double { 2 } else { 1 };
                continue;
            }
            '>' => {
                // `2>` / `1>`: the word so far is the descriptor.
                let digit = word
                    .as_ref()
                    .filter(|w| !w.quoted)
                    .map(|w| w.segs.as_slice());
                let fd = match digit {
                    Some([Seg::Lit(d)]) if d == "2" => 2,
                    Some([Seg::Lit(d)]) if d == "1" => 1,
                    _ => {
                        flush(&mut word, &mut toks);
                        1
                    }
                };
                word = None;
                i += 1;
                if chars.get(i) == Some(&'&') {
                    let to = match chars.get(i + 1) {
                        Some('1') => 1,
                        Some('2') => 2,
                        _ => return Err(refuse("`>&` to a descriptor other than 1 or 2")),
                    };
                    toks.push(Tok::Redir(Redir::Dup { fd, to }));
                    i += 2;
                    continue;
                }
                let append = chars.get(i) == Some(&'>');
                if append {
                    i += 1;
                }
                toks.push(Tok::Redir(Redir::File {
                    fd,
                    append,
                    // The target is the next word; the parser fills it in.
                    target: Word::default(),
                }));
                continue;
            }
            '<' => return Err(refuse("input redirection `<`")),
            '(' | ')' => return Err(refuse("subshell `( … )`")),
            '`' => return Err(refuse("command substitution with backquotes")),
            '*' => return Err(refuse("globbing `*`")),
            '\'' => {
                let w = word.get_or_insert_with(Word::default);
                w.quoted = true;
                let end = chars[i + 1..].iter().position(|c| *c == '\'');
                let Some(end) = end else {
                    return Err("unterminated quoted string".into());
                };
                w.segs
                    .push(Seg::Lit(chars[i + 1..i + 1 + end].iter().collect()));
                i += end + 2;
                continue;
            }
            '"' => {
                let w = word.get_or_insert_with(Word::default);
                w.quoted = true;
                w.segs.push(Seg::Lit(String::new()));
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("unterminated quoted string".into()),
                        Some('"') => break,
                        Some('$') => w.segs.push(lex_dollar(&chars, &mut i)?),
                        Some('`') => return Err(refuse("command substitution with backquotes")),
                        Some('\\') if matches!(chars.get(i + 1), Some('"' | '\\' | '$')) => {
                            push_lit(w, chars[i + 1]);
                            i += 2;
                        }
                        Some(c) => {
                            push_lit(w, *c);
                            i += 1;
                        }
                    }
                }
                i += 1;
                continue;
            }
            '$' => {
                let seg = lex_dollar(&chars, &mut i)?;
                word.get_or_insert_with(Word::default).segs.push(seg);
                continue;
            }
            '\\' => {
                let w = word.get_or_insert_with(Word::default);
                w.quoted = true;
                if let Some(n) = chars.get(i + 1) {
                    push_lit(w, *n);
                }
                i += 2;
                continue;
            }
            c => push_lit(word.get_or_insert_with(Word::default), c),
        }
        i += 1;
    }
    flush(&mut word, &mut toks);
    Ok(toks)
}

const KEYWORDS: &[&str] = &[
    "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac",
    "function", "{", "}", "!", "[[", "cd", "export", "unset", "wait", "set", "eval", ".", "source",
];

fn parse(src: &str) -> std::result::Result<Vec<AndOr>, String> {
    let mut items: Vec<AndOr> = Vec::new();
    let mut cur: Option<AndOr> = None;
    let mut simple = Simple::default();
    let mut pending_op: Option<Op> = None;
    let mut toks = lex(src)?.into_iter();
    let finish = |simple: &mut Simple,
                  cur: &mut Option<AndOr>,
                  pending: &mut Option<Op>|
     -> std::result::Result<(), String> {
        let s = std::mem::take(simple);
        if s.words.is_empty() && s.redirs.is_empty() {
            return match pending {
                Some(_) => Err("syntax error: a list operator without a command".into()),
                None => Ok(()),
            };
        }
        match (cur.as_mut(), pending.take()) {
            (Some(c), Some(op)) => c.rest.push((op, s)),
            _ => {
                *cur = Some(AndOr {
                    first: s,
                    rest: Vec::new(),
                    background: false,
                })
            }
        }
        Ok(())
    };
    while let Some(tok) = toks.next() {
        match tok {
            Tok::Word(w) => simple.words.push(w),
            Tok::Redir(Redir::File { fd, append, .. }) => match toks.next() {
                Some(Tok::Word(target)) => simple.redirs.push(Redir::File { fd, append, target }),
                _ => return Err("syntax error: redirection without a file".into()),
            },
            Tok::Redir(r) => simple.redirs.push(r),
            Tok::Op(op @ (Op::And | Op::Or)) => {
                finish(&mut simple, &mut cur, &mut pending_op)?;
                if cur.is_none() {
                    return Err("syntax error: a list operator without a command".into());
                }
                pending_op = Some(op);
            }
            Tok::Op(op) => {
                finish(&mut simple, &mut cur, &mut pending_op)?;
                if let Some(mut c) = cur.take() {
                    c.background = op == Op::Bg;
                    items.push(c);
                } else if op == Op::Bg {
                    return Err("syntax error: `&` without a command".into());
                }
            }
        }
    }
    finish(&mut simple, &mut cur, &mut pending_op)?;
    items.extend(cur);
    Ok(items)
}

/// What a command did to the shell's control flow.
enum Flow {
    Next(i64),
    Exit(i64),
}

/// One shell process.
#[derive(Clone)]
pub(crate) struct Shell {
    vars: BTreeMap<String, String>,
    last: i64,
    last_bg: Option<u32>,
    shell_pid: u32,
    stdout: Sink,
    stderr: Sink,
}

impl Shell {
    /// A shell running as `proc`.
    pub(crate) fn new(proc: &Proc) -> Shell {
        Shell {
            vars: proc.env.clone(),
            last: 0,
            last_bg: None,
            shell_pid: proc.pid,
            stdout: proc.stdout.clone(),
            stderr: proc.stderr.clone(),
        }
    }

    /// Runs a script; returns the exit status.
    pub(crate) async fn run(&mut self, proc: &Proc, src: &str) -> Result<i64> {
        let items = match parse(src) {
            Ok(items) => items,
            Err(msg) => return Ok(refused(proc, &self.stderr, &msg).await),
        };
        for item in items {
            if item.background {
                self.spawn_background(proc, item).await;
                continue;
            }
            if let Flow::Exit(code) = self.and_or(proc, &item).await? {
                return Ok(code);
            }
        }
        Ok(self.last)
    }

    /// A background job: its own pid in the exec's process group (killing the exec kills
    /// it), with its redirections applied before it starts, like a forked subshell — so a
    /// job whose output goes elsewhere does not hold the exec's output open.
    async fn spawn_background(&mut self, proc: &Proc, item: AndOr) {
        let mut child = self.clone();
        if item.rest.is_empty()
            && let Ok((out, err)) = self.redirect(proc, &item.first.redirs)
        {
            (child.stdout, child.stderr) = (out, err);
        }
        // The job writes through `child`'s sinks only: `base` must not hold the exec's
        // output open.
        let base = Proc {
            stdout: Sink::Null,
            stderr: Sink::Null,
            ..proc.clone()
        };
        let spawned = spawn_process(&proc.sb, Some(proc.pgid), "sh".into(), move |pid| {
            Box::pin(async move {
                let mut p = base;
                p.pid = pid;
                child.and_or(&p, &item).await.map(|f| match f {
                    Flow::Next(c) | Flow::Exit(c) => c,
                })
            })
        });
        match spawned {
            Ok((pid, _handle)) => {
                self.last_bg = Some(pid);
                self.last = 0;
            }
            Err(SpawnError::PidsLimit) => {
                let msg = "sh: can't fork: Resource temporarily unavailable\n";
                proc.write(&self.stderr, Bytes::from_static(msg.as_bytes()))
                    .await;
                self.last = 2;
            }
        }
    }

    async fn and_or(&mut self, proc: &Proc, cmd: &AndOr) -> Result<Flow> {
        let mut flow = self.simple(proc, &cmd.first).await?;
        for (op, next) in &cmd.rest {
            if let Flow::Exit(_) = flow {
                return Ok(flow);
            }
            if (*op == Op::And) == (self.last == 0) {
                flow = self.simple(proc, next).await?;
            }
        }
        Ok(flow)
    }

    fn expand(&self, word: &Word) -> Vec<String> {
        let text: String = word
            .segs
            .iter()
            .map(|s| match s {
                Seg::Lit(l) => l.clone(),
                Seg::Var(v) => match v.as_str() {
                    "$" => self.shell_pid.to_string(),
                    "?" => self.last.to_string(),
                    "!" => self.last_bg.map(|p| p.to_string()).unwrap_or_default(),
                    name => self.vars.get(name).cloned().unwrap_or_default(),
                },
            })
            .collect();
        if word.quoted {
            vec![text]
        } else {
            text.split_whitespace().map(str::to_string).collect()
        }
    }

    /// The stdout and stderr of a command after its redirections.
    fn redirect(&self, proc: &Proc, redirs: &[Redir]) -> std::result::Result<(Sink, Sink), String> {
        let (mut out, mut err) = (self.stdout.clone(), self.stderr.clone());
        for r in redirs {
            let sink = match r {
                Redir::Dup { to: 1, .. } => out.clone(),
                Redir::Dup { .. } => err.clone(),
                Redir::File { append, target, .. } => {
                    let name = self.expand(target).join(" ");
                    if name == "/dev/null" {
                        Sink::Null
                    } else {
                        let path = proc.path(&name);
                        let now = proc.sb.now();
                        let opened = match append {
                            true => proc.sb.fs().append(&path, &[], now),
                            false => proc.sb.fs().write(&path, Vec::new(), false, now),
                        };
                        if let Err(e) = opened {
                            return Err(format!("can't create {name}: {}", e.errno_text()));
                        }
                        Sink::File(path)
                    }
                }
            };
            match r {
                Redir::Dup { fd: 2, .. } | Redir::File { fd: 2, .. } => err = sink,
                _ => out = sink,
            }
        }
        Ok((out, err))
    }

    async fn simple(&mut self, proc: &Proc, cmd: &Simple) -> Result<Flow> {
        let argv: Vec<String> = cmd.words.iter().flat_map(|w| self.expand(w)).collect();
        let refusal = match argv.first() {
            Some(w) if KEYWORDS.contains(&w.as_str()) && !cmd.words[0].quoted => {
                Some(refuse(&format!("`{w}`")))
            }
            Some(w)
                if w.split_once('=').is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(is_name_char) && !cmd.words[0].quoted
                }) =>
            {
                Some(refuse("variable assignment"))
            }
            None => Some(refuse("a redirection without a command")),
            _ => None,
        };
        if let Some(msg) = refusal {
            return Ok(Flow::Exit(refused(proc, &self.stderr, &msg).await));
        }
        let (stdout, stderr) = match self.redirect(proc, &cmd.redirs) {
            Ok(io) => io,
            Err(msg) => {
                proc.write(&self.stderr, Bytes::from(format!("sh: {msg}\n")))
                    .await;
                self.last = 1;
                return Ok(Flow::Next(1));
            }
        };
        let child = Proc {
            env: self.vars.clone(),
            stdout,
            stderr,
            ..proc.clone()
        };
        match argv[0].as_str() {
            "exit" => {
                let code = match argv.get(1).map(|s| s.parse::<i64>()) {
                    None => self.last,
                    Some(Ok(c)) => c & 0xff,
                    Some(Err(_)) => {
                        child
                            .err(format!("sh: exit: Illegal number: {}\n", argv[1]))
                            .await;
                        2
                    }
                };
                Ok(Flow::Exit(code))
            }
            "exec" if argv.len() > 1 => {
                let code = run_program(child, argv[1..].to_vec()).await?;
                Ok(Flow::Exit(code))
            }
            "exec" => {
                let msg = refuse("`exec` without a command");
                Ok(Flow::Exit(refused(&child, &child.stderr, &msg).await))
            }
            _ => {
                self.last = run_program(child, argv).await?;
                Ok(Flow::Next(self.last))
            }
        }
    }
}
