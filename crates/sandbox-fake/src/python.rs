//! A deliberately small Python: enough for agents' smoke snippets and the contract suite,
//! honest about the rest.
//!
//! Supported: integers, floats, strings (quotes, triple quotes, escapes, f-strings with
//! plain expressions), `True/False/None`, lists, `+ - * / // % **`, comparisons, `and or
//! not in`, assignments and augmented assignments, `import` / `from … import` of `sys`,
//! `os`, `os.path` and `time`, `print(…, sep=, end=, file=)`, `sys.stdout/stderr.write`,
//! `sys.exit`, `os.getcwd/getenv/environ/listdir/getpid`, `os.path.exists/join`,
//! `time.sleep/time/monotonic` (tokio time, so paused clocks work), `open(path[, mode])`
//! with `.read()`/`.write()`, `len str int float bool repr abs min max sum range sorted
//! list`, common string methods and `list.append/extend/pop`, `raise`, `assert`, `del`,
//! `pass`. Exceptions print a traceback and exit 1, like `python3`.
//!
//! Compound statements (`def`, `if`, `for`, …) raise `NotImplementedError` pointing at
//! `FakeBackend::on_run_code`; malformed input raises `SyntaxError` before anything runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sandbox_core::{Result, StreamKind};

use crate::exec::Proc;
use crate::memfs;
use crate::sandbox::SandboxInner;

/// The variables of one interpreter (a persistent context keeps them between calls).
#[derive(Debug, Default)]
pub(crate) struct Globals {
    vars: HashMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Value>),
    Module(&'static str),
    Builtin(&'static str),
    Method(Box<Value>, String),
    ExcType(String),
    Exc(String, String),
    Stream(StreamKind),
    Environ,
    File(String),
}

impl Value {
    fn type_name(&self) -> &'static str {
        match self {
            Value::None => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::List(_) => "list",
            Value::Module(_) => "module",
            Value::Builtin(_) | Value::Method(..) => "builtin_function_or_method",
            Value::ExcType(_) => "type",
            Value::Exc(..) => "Exception",
            Value::Stream(_) => "TextIOWrapper",
            Value::Environ => "_Environ",
            Value::File(_) => "TextIOWrapper",
        }
    }

    fn truthy(&self) -> bool {
        match self {
            Value::None => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            _ => true,
        }
    }

    fn repr(&self) -> String {
        match self {
            Value::Str(s) => {
                let q = if s.contains('\'') && !s.contains('"') {
                    '"'
                } else {
                    '\''
                };
                let mut out = String::new();
                out.push(q);
                for c in s.chars() {
                    match c {
                        '\n' => out.push_str("\\n"),
                        '\t' => out.push_str("\\t"),
                        '\\' => out.push_str("\\\\"),
                        c if c == q => {
                            out.push('\\');
                            out.push(c);
                        }
                        c => out.push(c),
                    }
                }
                out.push(q);
                out
            }
            other => other.str(),
        }
    }

    fn str(&self) -> String {
        match self {
            Value::None => "None".into(),
            Value::Bool(true) => "True".into(),
            Value::Bool(false) => "False".into(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => float_repr(*f),
            Value::Str(s) => s.clone(),
            Value::List(l) => format!(
                "[{}]",
                l.iter().map(Value::repr).collect::<Vec<_>>().join(", ")
            ),
            Value::Module(m) => format!("<module '{m}'>"),
            Value::Builtin(n) => format!("<built-in function {n}>"),
            Value::Method(_, n) => format!("<built-in method {n}>"),
            Value::ExcType(n) => format!("<class '{n}'>"),
            Value::Exc(_, m) => m.clone(),
            Value::Stream(StreamKind::Stdout) => "<_io.TextIOWrapper name='<stdout>'>".into(),
            Value::Stream(StreamKind::Stderr) => "<_io.TextIOWrapper name='<stderr>'>".into(),
            Value::Environ => "environ({...})".into(),
            Value::File(p) => format!("<_io.TextIOWrapper name='{p}'>"),
        }
    }
}

fn float_repr(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf".into() } else { "-inf".into() }
    } else if f == f.trunc() && f.abs() < 1e16 {
        format!("{f:.1}")
    } else {
        format!("{f}")
    }
}

/// A Python exception: type name and message.
#[derive(Debug, Clone, PartialEq)]
struct Exc {
    kind: String,
    msg: String,
}

fn exc(kind: &str, msg: impl Into<String>) -> Exc {
    Exc {
        kind: kind.to_string(),
        msg: msg.into(),
    }
}

type PyResult<T> = std::result::Result<T, Exc>;

const EXCEPTIONS: &[&str] = &[
    "BaseException",
    "Exception",
    "ValueError",
    "TypeError",
    "RuntimeError",
    "KeyError",
    "IndexError",
    "NameError",
    "ZeroDivisionError",
    "AssertionError",
    "AttributeError",
    "NotImplementedError",
    "OSError",
    "FileNotFoundError",
    "PermissionError",
    "TimeoutError",
    "KeyboardInterrupt",
    "SystemExit",
    "ImportError",
    "ModuleNotFoundError",
    "ArithmeticError",
    "OverflowError",
    "LookupError",
    "StopIteration",
];

const BUILTINS: &[&str] = &[
    "print", "len", "str", "int", "float", "bool", "repr", "abs", "min", "max", "sum", "range",
    "sorted", "list", "open", "exit", "quit",
];

// ---------------------------------------------------------------------------------------
// Lexer

#[derive(Debug, Clone, PartialEq)]
enum T {
    Int(i64),
    Float(f64),
    Str(String),
    FStr(String),
    Name(String),
    Op(&'static str),
    Newline,
    Indent,
}

#[derive(Debug, Clone)]
struct Tok {
    t: T,
    line: usize,
    col: usize,
}

/// A syntax error at (line, column).
#[derive(Debug, Clone, PartialEq)]
struct SyntaxErr {
    kind: &'static str,
    msg: String,
    line: usize,
    col: usize,
}

fn syntax(msg: impl Into<String>, line: usize, col: usize) -> SyntaxErr {
    SyntaxErr {
        kind: "SyntaxError",
        msg: msg.into(),
        line,
        col,
    }
}

const OPS: &[&str] = &[
    "**=", "//=", "**", "//", "==", "!=", "<=", ">=", "+=", "-=", "*=", "/=", "%=", "->", ":=",
    "+", "-", "*", "/", "%", "(", ")", "[", "]", "{", "}", ",", ":", ".", "=", "<", ">", ";", "@",
    "&", "|", "^", "~",
];

fn lex(src: &str) -> std::result::Result<Vec<Tok>, SyntaxErr> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let mut col = 0;
    let mut depth = 0usize;
    let mut at_line_start = true;
    while i < chars.len() {
        let c = chars[i];
        if at_line_start && depth == 0 {
            // Measure indentation; blank and comment-only lines do not count.
            let mut j = i;
            while j < chars.len() && (chars[j] == ' ' || chars[j] == '\t') {
                j += 1;
            }
            let blank = j >= chars.len() || chars[j] == '\n' || chars[j] == '#' || chars[j] == '\r';
            if j > i && !blank {
                toks.push(Tok {
                    t: T::Indent,
                    line,
                    col: 0,
                });
            }
            col += j - i;
            i = j;
            at_line_start = false;
            continue;
        }
        let start_col = col;
        let ln = line;
        let tok = move |t| Tok {
            t,
            line: ln,
            col: start_col,
        };
        match c {
            '\n' => {
                if depth == 0 {
                    toks.push(tok(T::Newline));
                }
                line += 1;
                col = 0;
                i += 1;
                at_line_start = true;
            }
            ' ' | '\t' | '\r' => {
                i += 1;
                col += 1;
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\\' if chars.get(i + 1) == Some(&'\n') => {
                i += 2;
                line += 1;
                col = 0;
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) =>
            {
                let s0 = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_')
                {
                    // Exponent sign: 1e-5.
                    if (chars[i] == 'e' || chars[i] == 'E')
                        && matches!(chars.get(i + 1), Some('+' | '-'))
                    {
                        i += 1;
                    }
                    i += 1;
                }
                let text: String = chars[s0..i].iter().filter(|&&c| c != '_').collect();
                col += i - s0;
                let t = if let Ok(n) = text.parse::<i64>() {
                    T::Int(n)
                } else if let Some(hex) = text.strip_prefix("0x") {
                    T::Int(
                        i64::from_str_radix(hex, 16)
                            .map_err(|_| syntax("invalid hexadecimal literal", line, start_col))?,
                    )
                } else if let Ok(f) = text.parse::<f64>() {
                    T::Float(f)
                } else {
                    return Err(syntax("invalid decimal literal", line, start_col));
                };
                toks.push(tok(t));
            }
            c if c.is_alphabetic() || c == '_' => {
                let s0 = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                let word: String = chars[s0..i].iter().collect();
                col += i - s0;
                let prefix = word.to_ascii_lowercase();
                if matches!(chars.get(i), Some('"' | '\''))
                    && matches!(
                        prefix.as_str(),
                        "r" | "b" | "f" | "u" | "rb" | "br" | "fr" | "rf"
                    )
                {
                    let raw = prefix.contains('r');
                    let (s, consumed, lines) = lex_string(&chars[i..], raw)
                        .ok_or_else(|| syntax("unterminated string literal", line, start_col))?;
                    i += consumed;
                    col += consumed;
                    line += lines;
                    toks.push(tok(if prefix.contains('f') {
                        T::FStr(s)
                    } else {
                        T::Str(s)
                    }));
                } else {
                    toks.push(tok(T::Name(word)));
                }
            }
            '"' | '\'' => {
                let (s, consumed, lines) = lex_string(&chars[i..], false)
                    .ok_or_else(|| syntax("unterminated string literal", line, start_col))?;
                i += consumed;
                col += consumed;
                line += lines;
                toks.push(tok(T::Str(s)));
            }
            _ => {
                let rest: String = chars[i..(i + 3).min(chars.len())].iter().collect();
                let Some(op) = OPS.iter().find(|op| rest.starts_with(**op)) else {
                    return Err(syntax("invalid syntax", line, start_col));
                };
                match *op {
                    "(" | "[" | "{" => depth += 1,
                    ")" | "]" | "}" => {
                        if depth == 0 {
                            return Err(syntax(format!("unmatched '{op}'"), line, start_col));
                        }
                        depth -= 1;
                    }
                    _ => {}
                }
                i += op.len();
                col += op.len();
                toks.push(tok(T::Op(op)));
            }
        }
    }
    if depth > 0 {
        return Err(syntax("'(' was never closed", line, col));
    }
    toks.push(Tok {
        t: T::Newline,
        line,
        col,
    });
    Ok(toks)
}

/// Lexes a string literal starting at the quote; returns (value, chars consumed, newlines).
fn lex_string(chars: &[char], raw: bool) -> Option<(String, usize, usize)> {
    let q = chars[0];
    let triple = chars.len() >= 3 && chars[1] == q && chars[2] == q;
    let mut i = if triple { 3 } else { 1 };
    let mut out = String::new();
    let mut lines = 0;
    loop {
        let c = *chars.get(i)?;
        if triple {
            if c == q && chars.get(i + 1) == Some(&q) && chars.get(i + 2) == Some(&q) {
                return Some((out, i + 3, lines));
            }
        } else if c == q {
            return Some((out, i + 1, lines));
        } else if c == '\n' {
            return None;
        }
        if c == '\n' {
            lines += 1;
        }
        if c == '\\' && !raw {
            let n = *chars.get(i + 1)?;
            i += 2;
            match n {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '0' => out.push('\0'),
                '\\' => out.push('\\'),
                '\'' => out.push('\''),
                '"' => out.push('"'),
                '\n' => lines += 1,
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
            continue;
        }
        if c == '\\' && raw {
            if let Some(&n) = chars.get(i + 1) {
                out.push('\\');
                out.push(n);
                i += 2;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
}

// ---------------------------------------------------------------------------------------
// Parser

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Const(Value),
    Name(String),
    FStr(Vec<FPart>),
    List(Vec<Expr>),
    Unary(&'static str, Box<Expr>),
    Bin(&'static str, Box<Expr>, Box<Expr>),
    Cmp(Box<Expr>, Vec<(String, Expr)>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Call(Box<Expr>, Vec<Expr>, Vec<(String, Expr)>),
    Attr(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    IfElse(Box<Expr>, Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone, PartialEq)]
enum FPart {
    Lit(String),
    Expr(Expr, bool),
}

#[derive(Debug, Clone, PartialEq)]
enum Stmt {
    Expr(Expr),
    Assign(Vec<Expr>, Expr),
    AugAssign(Expr, &'static str, Expr),
    Import(Vec<(String, String)>),
    FromImport(String, Vec<(String, String)>),
    Raise(Option<Expr>),
    Assert(Expr, Option<Expr>),
    Del(Vec<String>),
    Pass,
    Compound(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Line {
    stmt: Stmt,
    line: usize,
}

const COMPOUND: &[&str] = &[
    "def", "class", "if", "elif", "else", "for", "while", "with", "try", "except", "finally",
    "async", "match", "lambda", "global", "nonlocal", "yield", "return", "await", "break",
    "continue",
];

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &T {
        &self.toks[self.pos.min(self.toks.len() - 1)].t
    }
    fn here(&self) -> (usize, usize) {
        let t = &self.toks[self.pos.min(self.toks.len() - 1)];
        (t.line, t.col)
    }
    fn err<X>(&self, msg: &str) -> std::result::Result<X, SyntaxErr> {
        let (l, c) = self.here();
        Err(syntax(msg, l, c))
    }
    fn bump(&mut self) -> T {
        let t = self.peek().clone();
        self.pos += 1;
        t
    }
    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), T::Op(o) if *o == op)
    }
    fn is_name(&self, n: &str) -> bool {
        matches!(self.peek(), T::Name(x) if x == n)
    }
    fn eat_op(&mut self, op: &str) -> bool {
        if self.is_op(op) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect_op(&mut self, op: &str) -> std::result::Result<(), SyntaxErr> {
        if self.eat_op(op) {
            Ok(())
        } else {
            self.err("invalid syntax")
        }
    }
    fn name(&mut self) -> std::result::Result<String, SyntaxErr> {
        match self.peek().clone() {
            T::Name(n) if !is_keyword(&n) => {
                self.pos += 1;
                Ok(n)
            }
            _ => self.err("invalid syntax"),
        }
    }

    fn program(&mut self) -> std::result::Result<Vec<Line>, SyntaxErr> {
        let mut lines = Vec::new();
        loop {
            match self.peek() {
                T::Newline if self.pos + 1 >= self.toks.len() => return Ok(lines),
                T::Newline => {
                    self.pos += 1;
                }
                T::Indent => {
                    let (l, c) = self.here();
                    return Err(SyntaxErr {
                        kind: "IndentationError",
                        msg: "unexpected indent".into(),
                        line: l,
                        col: c,
                    });
                }
                _ => {
                    let line = self.here().0;
                    if let T::Name(kw) = self.peek().clone() {
                        if COMPOUND.contains(&kw.as_str()) {
                            self.compound(&kw)?;
                            lines.push(Line {
                                stmt: Stmt::Compound(kw),
                                line,
                            });
                            continue;
                        }
                    }
                    loop {
                        let stmt = self.simple_stmt()?;
                        lines.push(Line { stmt, line });
                        if self.eat_op(";") && !matches!(self.peek(), T::Newline) {
                            continue;
                        }
                        break;
                    }
                    match self.peek() {
                        T::Newline => self.pos += 1,
                        _ => return self.err("invalid syntax"),
                    }
                }
            }
        }
    }

    /// Validates a compound statement's header and skips its indented body.
    fn compound(&mut self, kw: &str) -> std::result::Result<(), SyntaxErr> {
        self.pos += 1;
        let ok_start = match kw {
            "def" | "class" => matches!(self.peek(), T::Name(n) if !is_keyword(n)),
            "else" | "try" | "finally" => self.is_op(":"),
            "break" | "continue" | "pass" | "return" | "global" | "nonlocal" | "yield"
            | "await" => true,
            _ => !matches!(self.peek(), T::Newline | T::Op(":")),
        };
        if !ok_start {
            return self.err("invalid syntax");
        }
        if kw == "def" {
            self.pos += 1;
            if !self.is_op("(") {
                return self.err("invalid syntax");
            }
        }
        // Header up to the end of the logical line.
        let mut last = T::Newline;
        while !matches!(self.peek(), T::Newline) {
            last = self.bump();
        }
        let needs_colon = !matches!(
            kw,
            "break"
                | "continue"
                | "return"
                | "global"
                | "nonlocal"
                | "yield"
                | "await"
                | "lambda"
                | "async"
        );
        if needs_colon && last != T::Op(":") {
            // `if x: y` one-liners end with something else but contain a colon.
            let header_has_colon = self.toks[..self.pos]
                .iter()
                .rev()
                .take_while(|t| t.t != T::Newline)
                .any(|t| t.t == T::Op(":"));
            if !header_has_colon {
                return self.err("expected ':'");
            }
        }
        self.pos += 1;
        // Skip the indented block.
        while matches!(self.peek(), T::Indent) {
            while !matches!(self.peek(), T::Newline) {
                self.pos += 1;
            }
            self.pos += 1;
        }
        Ok(())
    }

    fn simple_stmt(&mut self) -> std::result::Result<Stmt, SyntaxErr> {
        match self.peek().clone() {
            T::Name(n) if n == "pass" => {
                self.pos += 1;
                Ok(Stmt::Pass)
            }
            T::Name(n) if n == "import" => {
                self.pos += 1;
                let mut mods = Vec::new();
                loop {
                    let mut m = self.name()?;
                    while self.eat_op(".") {
                        m = format!("{m}.{}", self.name()?);
                    }
                    let alias = if self.is_name("as") {
                        self.pos += 1;
                        self.name()?
                    } else {
                        m.split('.').next().unwrap_or(&m).to_string()
                    };
                    mods.push((m, alias));
                    if !self.eat_op(",") {
                        return Ok(Stmt::Import(mods));
                    }
                }
            }
            T::Name(n) if n == "from" => {
                self.pos += 1;
                let mut m = self.name()?;
                while self.eat_op(".") {
                    m = format!("{m}.{}", self.name()?);
                }
                if !self.is_name("import") {
                    return self.err("invalid syntax");
                }
                self.pos += 1;
                let paren = self.eat_op("(");
                let mut names = Vec::new();
                loop {
                    let n = if self.eat_op("*") {
                        "*".to_string()
                    } else {
                        self.name()?
                    };
                    let alias = if self.is_name("as") {
                        self.pos += 1;
                        self.name()?
                    } else {
                        n.clone()
                    };
                    names.push((n, alias));
                    if !self.eat_op(",") {
                        break;
                    }
                }
                if paren {
                    self.expect_op(")")?;
                }
                Ok(Stmt::FromImport(m, names))
            }
            T::Name(n) if n == "raise" => {
                self.pos += 1;
                if matches!(self.peek(), T::Newline) || self.is_op(";") {
                    return Ok(Stmt::Raise(None));
                }
                let e = self.expr()?;
                if self.is_name("from") {
                    self.pos += 1;
                    self.expr()?;
                }
                Ok(Stmt::Raise(Some(e)))
            }
            T::Name(n) if n == "assert" => {
                self.pos += 1;
                let e = self.expr()?;
                let msg = if self.eat_op(",") {
                    Some(self.expr()?)
                } else {
                    None
                };
                Ok(Stmt::Assert(e, msg))
            }
            T::Name(n) if n == "del" => {
                self.pos += 1;
                let mut names = vec![self.name()?];
                while self.eat_op(",") {
                    names.push(self.name()?);
                }
                Ok(Stmt::Del(names))
            }
            _ => {
                let first = self.expr_list()?;
                for (op, bin) in [
                    ("+=", "+"),
                    ("-=", "-"),
                    ("*=", "*"),
                    ("/=", "/"),
                    ("//=", "//"),
                    ("%=", "%"),
                    ("**=", "**"),
                ] {
                    if self.is_op(op) {
                        self.pos += 1;
                        check_target(&first).map_err(|m| {
                            let (l, c) = self.here();
                            syntax(m, l, c)
                        })?;
                        let value = self.expr_list()?;
                        return Ok(Stmt::AugAssign(first, bin, value));
                    }
                }
                if self.is_op("=") {
                    let mut targets = vec![first];
                    let mut value;
                    loop {
                        self.expect_op("=")?;
                        value = self.expr_list()?;
                        if self.is_op("=") {
                            targets.push(value);
                        } else {
                            break;
                        }
                    }
                    for t in &targets {
                        check_target(t).map_err(|m| {
                            let (l, c) = self.here();
                            syntax(m, l, c)
                        })?;
                    }
                    return Ok(Stmt::Assign(targets, value));
                }
                Ok(Stmt::Expr(first))
            }
        }
    }

    /// `a, b` becomes a list expression (tuples are lists here).
    fn expr_list(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let first = self.expr()?;
        if !self.is_op(",") {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.eat_op(",") {
            if matches!(self.peek(), T::Newline) || self.is_op("=") || self.is_op(";") {
                break;
            }
            items.push(self.expr()?);
        }
        Ok(Expr::List(items))
    }

    fn expr(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let e = self.or_expr()?;
        if self.is_name("if") {
            self.pos += 1;
            let cond = self.or_expr()?;
            if !self.is_name("else") {
                return self.err("expected 'else' after 'if' expression");
            }
            self.pos += 1;
            let other = self.expr()?;
            return Ok(Expr::IfElse(Box::new(cond), Box::new(e), Box::new(other)));
        }
        Ok(e)
    }

    fn or_expr(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let mut l = self.and_expr()?;
        while self.is_name("or") {
            self.pos += 1;
            l = Expr::Or(Box::new(l), Box::new(self.and_expr()?));
        }
        Ok(l)
    }

    fn and_expr(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let mut l = self.not_expr()?;
        while self.is_name("and") {
            self.pos += 1;
            l = Expr::And(Box::new(l), Box::new(self.not_expr()?));
        }
        Ok(l)
    }

    fn not_expr(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        if self.is_name("not") {
            self.pos += 1;
            return Ok(Expr::Not(Box::new(self.not_expr()?)));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let l = self.arith()?;
        let mut ops = Vec::new();
        loop {
            let op = match self.peek() {
                T::Op(o @ ("==" | "!=" | "<" | ">" | "<=" | ">=")) => o.to_string(),
                T::Name(n) if n == "in" => "in".to_string(),
                T::Name(n) if n == "is" => {
                    self.pos += 1;
                    if self.is_name("not") {
                        self.pos += 1;
                        ops.push(("is not".to_string(), self.arith()?));
                    } else {
                        ops.push(("is".to_string(), self.arith()?));
                    }
                    continue;
                }
                T::Name(n) if n == "not" => {
                    self.pos += 1;
                    if !self.is_name("in") {
                        return self.err("invalid syntax");
                    }
                    self.pos += 1;
                    ops.push(("not in".to_string(), self.arith()?));
                    continue;
                }
                _ => break,
            };
            self.pos += 1;
            ops.push((op, self.arith()?));
        }
        Ok(if ops.is_empty() {
            l
        } else {
            Expr::Cmp(Box::new(l), ops)
        })
    }

    fn arith(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let mut l = self.term()?;
        loop {
            let op = match self.peek() {
                T::Op("+") => "+",
                T::Op("-") => "-",
                _ => return Ok(l),
            };
            self.pos += 1;
            l = Expr::Bin(op, Box::new(l), Box::new(self.term()?));
        }
    }

    fn term(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let mut l = self.unary()?;
        loop {
            let op = match self.peek() {
                T::Op("*") => "*",
                T::Op("/") => "/",
                T::Op("//") => "//",
                T::Op("%") => "%",
                _ => return Ok(l),
            };
            self.pos += 1;
            l = Expr::Bin(op, Box::new(l), Box::new(self.unary()?));
        }
    }

    fn unary(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        if self.eat_op("-") {
            return Ok(Expr::Unary("-", Box::new(self.unary()?)));
        }
        if self.eat_op("+") {
            return Ok(Expr::Unary("+", Box::new(self.unary()?)));
        }
        self.power()
    }

    fn power(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let base = self.postfix()?;
        if self.eat_op("**") {
            return Ok(Expr::Bin("**", Box::new(base), Box::new(self.unary()?)));
        }
        Ok(base)
    }

    fn postfix(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let mut e = self.atom()?;
        loop {
            if self.eat_op("(") {
                let mut args = Vec::new();
                let mut kwargs = Vec::new();
                while !self.is_op(")") {
                    if let (T::Name(n), Some(Tok { t: T::Op("="), .. })) =
                        (self.peek().clone(), self.toks.get(self.pos + 1))
                    {
                        self.pos += 2;
                        kwargs.push((n, self.expr()?));
                    } else {
                        if self.eat_op("*") {
                            return self.err("star-arguments are not supported by sandbox-fake");
                        }
                        args.push(self.expr()?);
                    }
                    if !self.eat_op(",") {
                        break;
                    }
                }
                self.expect_op(")")?;
                e = Expr::Call(Box::new(e), args, kwargs);
            } else if self.eat_op(".") {
                let n = match self.bump() {
                    T::Name(n) => n,
                    _ => return self.err("invalid syntax"),
                };
                e = Expr::Attr(Box::new(e), n);
            } else if self.eat_op("[") {
                let idx = self.expr()?;
                if self.is_op(":") {
                    return self.err("slices are not supported by sandbox-fake");
                }
                self.expect_op("]")?;
                e = Expr::Index(Box::new(e), Box::new(idx));
            } else {
                return Ok(e);
            }
        }
    }

    fn atom(&mut self) -> std::result::Result<Expr, SyntaxErr> {
        let (line, col) = self.here();
        match self.bump() {
            T::Int(i) => Ok(Expr::Const(Value::Int(i))),
            T::Float(f) => Ok(Expr::Const(Value::Float(f))),
            first @ (T::Str(_) | T::FStr(_)) => {
                // Adjacent literals concatenate.
                let mut parts = Vec::new();
                let mut push = |t: T| -> std::result::Result<(), SyntaxErr> {
                    match t {
                        T::Str(s) => parts.push(FPart::Lit(s)),
                        T::FStr(s) => parts.extend(parse_fstring(&s, line, col)?),
                        _ => {}
                    }
                    Ok(())
                };
                push(first)?;
                while matches!(self.peek(), T::Str(_) | T::FStr(_)) {
                    push(self.bump())?;
                }
                if parts.iter().all(|p| matches!(p, FPart::Lit(_))) {
                    let s: String = parts
                        .into_iter()
                        .map(|p| match p {
                            FPart::Lit(s) => s,
                            FPart::Expr(..) => String::new(),
                        })
                        .collect();
                    Ok(Expr::Const(Value::Str(s)))
                } else {
                    Ok(Expr::FStr(parts))
                }
            }
            T::Name(n) => match n.as_str() {
                "True" => Ok(Expr::Const(Value::Bool(true))),
                "False" => Ok(Expr::Const(Value::Bool(false))),
                "None" => Ok(Expr::Const(Value::None)),
                kw if is_keyword(kw) => Err(syntax("invalid syntax", line, col)),
                _ => Ok(Expr::Name(n)),
            },
            T::Op("(") => {
                if self.eat_op(")") {
                    return Ok(Expr::List(vec![]));
                }
                let e = self.expr()?;
                if self.is_op(",") {
                    let mut items = vec![e];
                    while self.eat_op(",") {
                        if self.is_op(")") {
                            break;
                        }
                        items.push(self.expr()?);
                    }
                    self.expect_op(")")?;
                    return Ok(Expr::List(items));
                }
                self.expect_op(")")?;
                Ok(e)
            }
            T::Op("[") => {
                let mut items = Vec::new();
                while !self.is_op("]") {
                    items.push(self.expr()?);
                    if self.is_name("for") {
                        return self.err("comprehensions are not supported by sandbox-fake");
                    }
                    if !self.eat_op(",") {
                        break;
                    }
                }
                self.expect_op("]")?;
                Ok(Expr::List(items))
            }
            _ => Err(syntax("invalid syntax", line, col)),
        }
    }
}

fn is_keyword(n: &str) -> bool {
    COMPOUND.contains(&n)
        || matches!(
            n,
            "and"
                | "or"
                | "not"
                | "in"
                | "is"
                | "import"
                | "from"
                | "as"
                | "raise"
                | "assert"
                | "del"
                | "pass"
        )
}

fn check_target(e: &Expr) -> std::result::Result<(), &'static str> {
    match e {
        Expr::Name(_) | Expr::Index(..) | Expr::Attr(..) => Ok(()),
        Expr::List(items) => items.iter().try_for_each(check_target),
        Expr::Call(..) => {
            Err("cannot assign to function call here. Maybe you meant '==' instead of '='?")
        }
        _ => Err("cannot assign to literal here. Maybe you meant '==' instead of '='?"),
    }
}

fn parse_fstring(s: &str, line: usize, col: usize) -> std::result::Result<Vec<FPart>, SyntaxErr> {
    let mut parts = Vec::new();
    let mut lit = String::new();
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '{' if chars.get(i + 1) == Some(&'{') => {
                lit.push('{');
                i += 2;
            }
            '}' if chars.get(i + 1) == Some(&'}') => {
                lit.push('}');
                i += 2;
            }
            '{' => {
                let start = i + 1;
                let Some(len) = chars[start..].iter().position(|&c| c == '}') else {
                    return Err(syntax("f-string: expecting '}'", line, col));
                };
                let mut inner: String = chars[start..start + len].iter().collect();
                let mut repr = false;
                if let Some(stripped) = inner.strip_suffix("!r") {
                    inner = stripped.to_string();
                    repr = true;
                }
                if inner.contains(':') && !inner.contains('[') {
                    return Err(syntax(
                        "f-string format specs are not supported by sandbox-fake",
                        line,
                        col,
                    ));
                }
                let toks =
                    lex(&inner).map_err(|_| syntax("f-string: invalid syntax", line, col))?;
                let mut p = Parser { toks, pos: 0 };
                let e = p
                    .expr()
                    .map_err(|_| syntax("f-string: invalid syntax", line, col))?;
                if !matches!(p.peek(), T::Newline) {
                    return Err(syntax("f-string: invalid syntax", line, col));
                }
                if !lit.is_empty() {
                    parts.push(FPart::Lit(std::mem::take(&mut lit)));
                }
                parts.push(FPart::Expr(e, repr));
                i = start + len + 1;
            }
            '}' => return Err(syntax("f-string: single '}' is not allowed", line, col)),
            c => {
                lit.push(c);
                i += 1;
            }
        }
    }
    if !lit.is_empty() {
        parts.push(FPart::Lit(lit));
    }
    Ok(parts)
}

fn parse(src: &str) -> std::result::Result<Vec<Line>, SyntaxErr> {
    let toks = lex(src)?;
    Parser { toks, pos: 0 }.program()
}

// ---------------------------------------------------------------------------------------
// Evaluation

/// Side effects of a statement, replayed in order (with real waits) after it evaluated.
enum Effect {
    Out(StreamKind, String),
    Sleep(Duration),
}

struct Interp<'a> {
    sb: &'a Arc<SandboxInner>,
    cwd: String,
    env: &'a std::collections::BTreeMap<String, String>,
    pid: u32,
    effects: Vec<Effect>,
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::Bool(b) => Some(i64::from(*b)),
        _ => None,
    }
}

fn type_error(op: &str, a: &Value, b: &Value) -> Exc {
    exc(
        "TypeError",
        format!(
            "unsupported operand type(s) for {op}: '{}' and '{}'",
            a.type_name(),
            b.type_name()
        ),
    )
}

fn overflow() -> Exc {
    exc(
        "OverflowError",
        "integer result too large for sandbox-fake's 64-bit ints",
    )
}

fn binop(op: &str, a: Value, b: Value) -> PyResult<Value> {
    use Value::*;
    if let (Some(x), Some(y)) = (int_of(&a), int_of(&b)) {
        return match op {
            "+" => x.checked_add(y).map(Int).ok_or_else(overflow),
            "-" => x.checked_sub(y).map(Int).ok_or_else(overflow),
            "*" => x.checked_mul(y).map(Int).ok_or_else(overflow),
            "/" if y == 0 => Err(exc("ZeroDivisionError", "division by zero")),
            "/" => Ok(Float(x as f64 / y as f64)),
            "//" if y == 0 => Err(exc(
                "ZeroDivisionError",
                "integer division or modulo by zero",
            )),
            "//" => Ok(Int(
                x.div_euclid(y) - i64::from(y < 0 && x.rem_euclid(y) != 0)
            )),
            "%" if y == 0 => Err(exc("ZeroDivisionError", "integer modulo by zero")),
            "%" => {
                let r = x.rem_euclid(y);
                Ok(Int(if y < 0 && r != 0 { r + y } else { r }))
            }
            "**" if y < 0 => Ok(Float((x as f64).powf(y as f64))),
            "**" => u32::try_from(y)
                .ok()
                .and_then(|e| x.checked_pow(e))
                .map(Int)
                .ok_or_else(overflow),
            _ => Err(type_error(op, &a, &b)),
        };
    }
    if let (Some(x), Some(y)) = (num(&a), num(&b)) {
        return match op {
            "+" => Ok(Float(x + y)),
            "-" => Ok(Float(x - y)),
            "*" => Ok(Float(x * y)),
            "/" | "//" | "%" if y == 0.0 => Err(exc("ZeroDivisionError", "float division by zero")),
            "/" => Ok(Float(x / y)),
            "//" => Ok(Float((x / y).floor())),
            "%" => Ok(Float(x - y * (x / y).floor())),
            "**" => Ok(Float(x.powf(y))),
            _ => Err(type_error(op, &a, &b)),
        };
    }
    match (op, &a, &b) {
        ("+", Str(x), Str(y)) => Ok(Str(format!("{x}{y}"))),
        ("+", List(x), List(y)) => Ok(List(x.iter().chain(y).cloned().collect())),
        ("*", Str(s), n) | ("*", n, Str(s)) if int_of(n).is_some() => {
            Ok(Str(s.repeat(int_of(n).unwrap_or(0).max(0) as usize)))
        }
        ("*", List(l), n) | ("*", n, List(l)) if int_of(n).is_some() => {
            let times = int_of(n).unwrap_or(0).max(0) as usize;
            Ok(List(
                l.iter().cloned().cycle().take(l.len() * times).collect(),
            ))
        }
        _ => Err(type_error(op, &a, &b)),
    }
}

fn compare(op: &str, a: &Value, b: &Value) -> PyResult<bool> {
    let ord = |a: &Value, b: &Value| -> PyResult<std::cmp::Ordering> {
        match (num(a), num(b), a, b) {
            (Some(x), Some(y), ..) => x.partial_cmp(&y).ok_or_else(|| exc("ValueError", "nan")),
            (_, _, Value::Str(x), Value::Str(y)) => Ok(x.cmp(y)),
            _ => Err(exc(
                "TypeError",
                format!(
                    "'{op}' not supported between instances of '{}' and '{}'",
                    a.type_name(),
                    b.type_name()
                ),
            )),
        }
    };
    let eq = |a: &Value, b: &Value| match (num(a), num(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    };
    Ok(match op {
        "==" => eq(a, b),
        "!=" => !eq(a, b),
        "<" => ord(a, b)?.is_lt(),
        ">" => ord(a, b)?.is_gt(),
        "<=" => ord(a, b)?.is_le(),
        ">=" => ord(a, b)?.is_ge(),
        "is" => a == b && matches!(a, Value::None | Value::Bool(_)),
        "is not" => !(a == b && matches!(a, Value::None | Value::Bool(_))),
        "in" | "not in" => {
            let found = match b {
                Value::Str(s) => match a {
                    Value::Str(n) => s.contains(n.as_str()),
                    _ => {
                        return Err(exc(
                            "TypeError",
                            "'in <string>' requires string as left operand",
                        ));
                    }
                },
                Value::List(l) => l.iter().any(|x| eq(x, a)),
                other => {
                    return Err(exc(
                        "TypeError",
                        format!("argument of type '{}' is not iterable", other.type_name()),
                    ));
                }
            };
            if op == "in" { found } else { !found }
        }
        _ => false,
    })
}

fn module(name: &str) -> Option<&'static str> {
    ["sys", "os", "os.path", "time"]
        .into_iter()
        .find(|m| *m == name)
}

impl Interp<'_> {
    fn path(&self, p: &str) -> String {
        sandbox_core::resolve_path(&self.cwd, p).unwrap_or_else(|_| self.cwd.clone())
    }

    fn exec(&mut self, stmt: &Stmt, g: &mut Globals) -> PyResult<()> {
        match stmt {
            Stmt::Pass => Ok(()),
            Stmt::Expr(e) => self.eval(e, g).map(|_| ()),
            Stmt::Assign(targets, value) => {
                let v = self.eval(value, g)?;
                for t in targets {
                    self.assign(t, v.clone(), g)?;
                }
                Ok(())
            }
            Stmt::AugAssign(target, op, value) => {
                let cur = self.eval(target, g)?;
                let v = self.eval(value, g)?;
                let r = binop(op, cur, v)?;
                self.assign(target, r, g)
            }
            Stmt::Import(mods) => {
                for (m, alias) in mods {
                    let Some(found) = module(m) else {
                        return Err(exc("ModuleNotFoundError", format!("No module named '{m}'")));
                    };
                    let bound = if alias.contains('.')
                        || found.contains('.') && alias == m.split('.').next().unwrap_or("")
                    {
                        module(m.split('.').next().unwrap_or(m)).unwrap_or(found)
                    } else {
                        found
                    };
                    g.vars.insert(alias.clone(), Value::Module(bound));
                }
                Ok(())
            }
            Stmt::FromImport(m, names) => {
                let Some(found) = module(m) else {
                    return Err(exc("ModuleNotFoundError", format!("No module named '{m}'")));
                };
                for (n, alias) in names {
                    if n == "*" {
                        return Err(exc(
                            "NotImplementedError",
                            "`import *` is not supported by sandbox-fake",
                        ));
                    }
                    let v = self.attr(Value::Module(found), n).map_err(|_| {
                        exc(
                            "ImportError",
                            format!("cannot import name '{n}' from '{m}'"),
                        )
                    })?;
                    g.vars.insert(alias.clone(), v);
                }
                Ok(())
            }
            Stmt::Raise(None) => Err(exc("RuntimeError", "No active exception to reraise")),
            Stmt::Raise(Some(e)) => match self.eval(e, g)? {
                Value::Exc(kind, msg) => Err(Exc { kind, msg }),
                Value::ExcType(kind) => Err(Exc {
                    kind,
                    msg: String::new(),
                }),
                _ => Err(exc(
                    "TypeError",
                    "exceptions must derive from BaseException",
                )),
            },
            Stmt::Assert(e, msg) => {
                if self.eval(e, g)?.truthy() {
                    Ok(())
                } else {
                    let m = match msg {
                        Some(m) => self.eval(m, g)?.str(),
                        None => String::new(),
                    };
                    Err(exc("AssertionError", m))
                }
            }
            Stmt::Del(names) => {
                for n in names {
                    if g.vars.remove(n).is_none() {
                        return Err(exc("NameError", format!("name '{n}' is not defined")));
                    }
                }
                Ok(())
            }
            Stmt::Compound(kw) => Err(exc(
                "NotImplementedError",
                format!(
                    "sandbox-fake's mini-Python does not run `{kw}` statements; script this snippet with FakeBackend::on_run_code"
                ),
            )),
        }
    }

    fn assign(&mut self, target: &Expr, v: Value, g: &mut Globals) -> PyResult<()> {
        match target {
            Expr::Name(n) => {
                g.vars.insert(n.clone(), v);
                Ok(())
            }
            Expr::List(items) => {
                let Value::List(vals) = v else {
                    return Err(exc(
                        "TypeError",
                        format!("cannot unpack non-iterable {} object", v.type_name()),
                    ));
                };
                if vals.len() != items.len() {
                    return Err(exc(
                        "ValueError",
                        format!(
                            "not enough values to unpack (expected {}, got {})",
                            items.len(),
                            vals.len()
                        ),
                    ));
                }
                for (t, v) in items.iter().zip(vals) {
                    self.assign(t, v, g)?;
                }
                Ok(())
            }
            Expr::Index(base, idx) => {
                let Expr::Name(n) = base.as_ref() else {
                    return Err(exc(
                        "NotImplementedError",
                        "item assignment only on plain names in sandbox-fake",
                    ));
                };
                let i = self.eval(idx, g)?;
                match g.vars.get_mut(n) {
                    Some(Value::List(l)) => {
                        let len = l.len() as i64;
                        let k = int_of(&i)
                            .ok_or_else(|| exc("TypeError", "list indices must be integers"))?;
                        let k = if k < 0 { k + len } else { k };
                        match l.get_mut(usize::try_from(k).unwrap_or(usize::MAX)) {
                            Some(slot) => {
                                *slot = v;
                                Ok(())
                            }
                            None => Err(exc("IndexError", "list assignment index out of range")),
                        }
                    }
                    Some(other) => Err(exc(
                        "TypeError",
                        format!(
                            "'{}' object does not support item assignment",
                            other.type_name()
                        ),
                    )),
                    None => Err(exc("NameError", format!("name '{n}' is not defined"))),
                }
            }
            _ => Err(exc(
                "NotImplementedError",
                "attribute assignment is not supported by sandbox-fake",
            )),
        }
    }

    fn eval(&mut self, e: &Expr, g: &mut Globals) -> PyResult<Value> {
        match e {
            Expr::Const(v) => Ok(v.clone()),
            Expr::Name(n) => {
                if let Some(v) = g.vars.get(n) {
                    return Ok(v.clone());
                }
                if let Some(b) = BUILTINS.iter().find(|b| **b == n) {
                    return Ok(Value::Builtin(b));
                }
                if EXCEPTIONS.contains(&n.as_str()) {
                    return Ok(Value::ExcType(n.clone()));
                }
                Err(exc("NameError", format!("name '{n}' is not defined")))
            }
            Expr::FStr(parts) => {
                let mut s = String::new();
                for p in parts {
                    match p {
                        FPart::Lit(l) => s.push_str(l),
                        FPart::Expr(e, repr) => {
                            let v = self.eval(e, g)?;
                            s.push_str(&if *repr { v.repr() } else { v.str() });
                        }
                    }
                }
                Ok(Value::Str(s))
            }
            Expr::List(items) => {
                let mut v = Vec::with_capacity(items.len());
                for i in items {
                    v.push(self.eval(i, g)?);
                }
                Ok(Value::List(v))
            }
            Expr::Unary(op, x) => {
                let v = self.eval(x, g)?;
                match (*op, &v) {
                    ("-", Value::Int(i)) => i.checked_neg().map(Value::Int).ok_or_else(overflow),
                    ("-", Value::Float(f)) => Ok(Value::Float(-f)),
                    ("-", Value::Bool(b)) => Ok(Value::Int(-i64::from(*b))),
                    ("+", Value::Int(_) | Value::Float(_)) => Ok(v),
                    _ => Err(exc(
                        "TypeError",
                        format!("bad operand type for unary {op}: '{}'", v.type_name()),
                    )),
                }
            }
            Expr::Bin(op, a, b) => {
                let a = self.eval(a, g)?;
                let b = self.eval(b, g)?;
                binop(op, a, b)
            }
            Expr::Cmp(first, rest) => {
                let mut left = self.eval(first, g)?;
                for (op, r) in rest {
                    let right = self.eval(r, g)?;
                    if !compare(op, &left, &right)? {
                        return Ok(Value::Bool(false));
                    }
                    left = right;
                }
                Ok(Value::Bool(true))
            }
            Expr::And(a, b) => {
                let l = self.eval(a, g)?;
                if !l.truthy() { Ok(l) } else { self.eval(b, g) }
            }
            Expr::Or(a, b) => {
                let l = self.eval(a, g)?;
                if l.truthy() { Ok(l) } else { self.eval(b, g) }
            }
            Expr::Not(x) => Ok(Value::Bool(!self.eval(x, g)?.truthy())),
            Expr::IfElse(c, a, b) => {
                if self.eval(c, g)?.truthy() {
                    self.eval(a, g)
                } else {
                    self.eval(b, g)
                }
            }
            Expr::Attr(base, name) => {
                let b = self.eval(base, g)?;
                self.attr(b, name)
            }
            Expr::Index(base, idx) => {
                let b = self.eval(base, g)?;
                let i = self.eval(idx, g)?;
                self.index(b, i)
            }
            Expr::Call(f, args, kwargs) => {
                // In-place list methods need the variable, not a copy.
                if let Expr::Attr(base, m) = f.as_ref() {
                    if let Expr::Name(var) = base.as_ref() {
                        if matches!(g.vars.get(var), Some(Value::List(_)))
                            && matches!(m.as_str(), "append" | "extend" | "pop" | "clear")
                        {
                            let mut vals = Vec::new();
                            for a in args {
                                vals.push(self.eval(a, g)?);
                            }
                            return list_method(g, var, m, vals);
                        }
                    }
                }
                let callee = self.eval(f, g)?;
                let mut vals = Vec::new();
                for a in args {
                    vals.push(self.eval(a, g)?);
                }
                let mut kws = Vec::new();
                for (k, a) in kwargs {
                    kws.push((k.clone(), self.eval(a, g)?));
                }
                self.call(callee, vals, kws)
            }
        }
    }

    fn index(&self, b: Value, i: Value) -> PyResult<Value> {
        match (&b, &i) {
            (Value::List(l), _) if int_of(&i).is_some() => {
                let len = l.len() as i64;
                let k = int_of(&i).unwrap_or(0);
                let k = if k < 0 { k + len } else { k };
                l.get(usize::try_from(k).unwrap_or(usize::MAX))
                    .cloned()
                    .ok_or_else(|| exc("IndexError", "list index out of range"))
            }
            (Value::Str(s), _) if int_of(&i).is_some() => {
                let chars: Vec<char> = s.chars().collect();
                let len = chars.len() as i64;
                let k = int_of(&i).unwrap_or(0);
                let k = if k < 0 { k + len } else { k };
                chars
                    .get(usize::try_from(k).unwrap_or(usize::MAX))
                    .map(|c| Value::Str(c.to_string()))
                    .ok_or_else(|| exc("IndexError", "string index out of range"))
            }
            (Value::Environ, Value::Str(k)) => self
                .env
                .get(k)
                .map(|v| Value::Str(v.clone()))
                .ok_or_else(|| exc("KeyError", format!("'{k}'"))),
            _ => Err(exc(
                "TypeError",
                format!("'{}' object is not subscriptable", b.type_name()),
            )),
        }
    }

    fn attr(&self, base: Value, name: &str) -> PyResult<Value> {
        let method = |b: Value| Ok(Value::Method(Box::new(b), name.to_string()));
        match (&base, name) {
            (Value::Module("sys"), "stdout") => Ok(Value::Stream(StreamKind::Stdout)),
            (Value::Module("sys"), "stderr") => Ok(Value::Stream(StreamKind::Stderr)),
            (Value::Module("sys"), "argv") => Ok(Value::List(vec![Value::Str("-c".into())])),
            (Value::Module("sys"), "version") => {
                Ok(Value::Str("3.11.2 (sandbox-fake mini-Python)".into()))
            }
            (Value::Module("sys"), "platform") => Ok(Value::Str("linux".into())),
            (Value::Module("sys"), "exit") => method(base),
            (Value::Module("os"), "environ") => Ok(Value::Environ),
            (Value::Module("os"), "path") => Ok(Value::Module("os.path")),
            (Value::Module("os"), "sep") => Ok(Value::Str("/".into())),
            (
                Value::Module("os"),
                "getcwd" | "getenv" | "listdir" | "getpid" | "getuid" | "makedirs" | "remove",
            ) => method(base),
            (
                Value::Module("os.path"),
                "exists" | "join" | "isdir" | "isfile" | "basename" | "dirname",
            ) => method(base),
            (Value::Module("time"), "sleep" | "time" | "monotonic" | "perf_counter") => {
                method(base)
            }
            (Value::Stream(_), "write" | "flush") => method(base),
            (Value::Environ, "get" | "keys") => method(base),
            (Value::File(_), "read" | "write" | "close" | "readlines") => method(base),
            (
                Value::Str(_),
                "upper" | "lower" | "strip" | "lstrip" | "rstrip" | "split" | "join" | "replace"
                | "startswith" | "endswith" | "format" | "splitlines" | "find" | "count" | "encode"
                | "decode",
            ) => method(base),
            (Value::Exc(_, m), "args") => Ok(Value::List(vec![Value::Str(m.clone())])),
            (Value::Module(m), _) => Err(exc(
                "AttributeError",
                format!("module '{m}' has no attribute '{name}'"),
            )),
            _ => Err(exc(
                "AttributeError",
                format!("'{}' object has no attribute '{name}'", base.type_name()),
            )),
        }
    }

    fn arg<'v>(args: &'v [Value], i: usize, f: &str) -> PyResult<&'v Value> {
        args.get(i)
            .ok_or_else(|| exc("TypeError", format!("{f}() missing required argument")))
    }

    fn str_arg(args: &[Value], i: usize, f: &str) -> PyResult<String> {
        match Self::arg(args, i, f)? {
            Value::Str(s) => Ok(s.clone()),
            other => Err(exc(
                "TypeError",
                format!("{f}() argument must be str, not {}", other.type_name()),
            )),
        }
    }

    fn call(
        &mut self,
        callee: Value,
        args: Vec<Value>,
        kwargs: Vec<(String, Value)>,
    ) -> PyResult<Value> {
        match callee {
            Value::Builtin(name) => self.builtin(name, args, kwargs),
            Value::ExcType(kind) => {
                let msg = match args.as_slice() {
                    [] => String::new(),
                    [one] => one.str(),
                    many => format!(
                        "({})",
                        many.iter().map(Value::repr).collect::<Vec<_>>().join(", ")
                    ),
                };
                Ok(Value::Exc(kind, msg))
            }
            Value::Method(base, m) => self.method(*base, &m, args),
            other => Err(exc(
                "TypeError",
                format!("'{}' object is not callable", other.type_name()),
            )),
        }
    }

    fn builtin(
        &mut self,
        name: &str,
        args: Vec<Value>,
        kwargs: Vec<(String, Value)>,
    ) -> PyResult<Value> {
        let kw = |k: &str| kwargs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        match name {
            "print" => {
                let sep = kw("sep")
                    .filter(|v| *v != Value::None)
                    .map(|v| v.str())
                    .unwrap_or_else(|| " ".into());
                let end = kw("end")
                    .filter(|v| *v != Value::None)
                    .map(|v| v.str())
                    .unwrap_or_else(|| "\n".into());
                let stream = match kw("file") {
                    Some(Value::Stream(k)) => k,
                    Some(Value::None) | None => StreamKind::Stdout,
                    Some(Value::File(path)) => {
                        let text =
                            args.iter().map(Value::str).collect::<Vec<_>>().join(&sep) + &end;
                        self.file_append(&path, &text)?;
                        return Ok(Value::None);
                    }
                    Some(other) => {
                        return Err(exc(
                            "AttributeError",
                            format!("'{}' object has no attribute 'write'", other.type_name()),
                        ));
                    }
                };
                let text = args.iter().map(Value::str).collect::<Vec<_>>().join(&sep) + &end;
                self.effects.push(Effect::Out(stream, text));
                Ok(Value::None)
            }
            "len" => match Self::arg(&args, 0, "len")? {
                Value::Str(s) => Ok(Value::Int(s.chars().count() as i64)),
                Value::List(l) => Ok(Value::Int(l.len() as i64)),
                other => Err(exc(
                    "TypeError",
                    format!("object of type '{}' has no len()", other.type_name()),
                )),
            },
            "str" => Ok(Value::Str(args.first().map(Value::str).unwrap_or_default())),
            "repr" => Ok(Value::Str(Self::arg(&args, 0, "repr")?.repr())),
            "bool" => Ok(Value::Bool(args.first().is_some_and(Value::truthy))),
            "int" => match args.first() {
                None => Ok(Value::Int(0)),
                Some(Value::Int(i)) => Ok(Value::Int(*i)),
                Some(Value::Bool(b)) => Ok(Value::Int(i64::from(*b))),
                Some(Value::Float(f)) if f.is_finite() => Ok(Value::Int(f.trunc() as i64)),
                Some(Value::Str(s)) => s.trim().parse::<i64>().map(Value::Int).map_err(|_| {
                    exc(
                        "ValueError",
                        format!(
                            "invalid literal for int() with base 10: {}",
                            Value::Str(s.clone()).repr()
                        ),
                    )
                }),
                Some(other) => Err(exc(
                    "TypeError",
                    format!(
                        "int() argument must be a string or a number, not '{}'",
                        other.type_name()
                    ),
                )),
            },
            "float" => match args.first() {
                None => Ok(Value::Float(0.0)),
                Some(Value::Str(s)) => s.trim().parse::<f64>().map(Value::Float).map_err(|_| {
                    exc(
                        "ValueError",
                        format!(
                            "could not convert string to float: {}",
                            Value::Str(s.clone()).repr()
                        ),
                    )
                }),
                Some(v) => num(v).map(Value::Float).ok_or_else(|| {
                    exc("TypeError", "float() argument must be a string or a number")
                }),
            },
            "abs" => match Self::arg(&args, 0, "abs")? {
                Value::Int(i) => i.checked_abs().map(Value::Int).ok_or_else(overflow),
                Value::Float(f) => Ok(Value::Float(f.abs())),
                other => Err(exc(
                    "TypeError",
                    format!("bad operand type for abs(): '{}'", other.type_name()),
                )),
            },
            "min" | "max" | "sum" | "sorted" | "list" => {
                let items = match args.as_slice() {
                    [Value::List(l)] => l.clone(),
                    [Value::Str(s)] if name == "list" || name == "sorted" => {
                        s.chars().map(|c| Value::Str(c.to_string())).collect()
                    }
                    [] if name == "list" => vec![],
                    many if name == "min" || name == "max" => many.to_vec(),
                    _ => {
                        return Err(exc(
                            "TypeError",
                            format!("{name}() argument must be a list in sandbox-fake"),
                        ));
                    }
                };
                match name {
                    "list" => Ok(Value::List(items)),
                    "sum" => items
                        .into_iter()
                        .try_fold(Value::Int(0), |acc, v| binop("+", acc, v)),
                    "sorted" => {
                        let mut items = items;
                        let mut err = None;
                        items.sort_by(|a, b| match compare("<", a, b) {
                            Ok(true) => std::cmp::Ordering::Less,
                            Ok(false) => match compare("<", b, a) {
                                Ok(true) => std::cmp::Ordering::Greater,
                                _ => std::cmp::Ordering::Equal,
                            },
                            Err(e) => {
                                err = Some(e);
                                std::cmp::Ordering::Equal
                            }
                        });
                        match err {
                            Some(e) => Err(e),
                            None => Ok(Value::List(items)),
                        }
                    }
                    _ => {
                        let mut it = items.into_iter();
                        let mut best = it.next().ok_or_else(|| {
                            exc("ValueError", format!("{name}() arg is an empty sequence"))
                        })?;
                        for v in it {
                            let better = if name == "min" {
                                compare("<", &v, &best)?
                            } else {
                                compare(">", &v, &best)?
                            };
                            if better {
                                best = v;
                            }
                        }
                        Ok(best)
                    }
                }
            }
            "range" => {
                let ints: Option<Vec<i64>> = args.iter().map(int_of).collect();
                let (start, stop, step) = match ints.as_deref() {
                    Some([n]) => (0, *n, 1),
                    Some([a, b]) => (*a, *b, 1),
                    Some([a, b, s]) if *s != 0 => (*a, *b, *s),
                    _ => return Err(exc("TypeError", "range() takes 1 to 3 integer arguments")),
                };
                let mut v = Vec::new();
                let mut i = start;
                while (step > 0 && i < stop) || (step < 0 && i > stop) {
                    if v.len() >= 1_000_000 {
                        return Err(exc("MemoryError", "range too large for sandbox-fake"));
                    }
                    v.push(Value::Int(i));
                    i += step;
                }
                Ok(Value::List(v))
            }
            "open" => {
                let path = self.path(&Self::str_arg(&args, 0, "open")?);
                let mode = match args.get(1).or(kw("mode").as_ref()) {
                    Some(Value::Str(m)) => m.clone(),
                    _ => "r".into(),
                };
                let now = self.sb.now();
                if mode.contains('w') {
                    self.sb
                        .fs()
                        .write(&path, Vec::new(), false, now)
                        .map_err(|e| os_error(&path, e))?;
                } else if mode.contains('a') {
                    self.sb
                        .fs()
                        .append(&path, &[], now)
                        .map_err(|e| os_error(&path, e))?;
                } else {
                    self.sb.open(&path).map_err(|e| os_error(&path, e))?;
                }
                Ok(Value::File(path))
            }
            "exit" | "quit" => Err(system_exit(args.first())),
            _ => Err(exc("NameError", format!("name '{name}' is not defined"))),
        }
    }

    fn file_append(&self, path: &str, text: &str) -> PyResult<()> {
        let now = self.sb.now();
        self.sb
            .fs()
            .append(path, text.as_bytes(), now)
            .map_err(|e| os_error(path, e))
    }

    fn method(&mut self, base: Value, m: &str, args: Vec<Value>) -> PyResult<Value> {
        match (&base, m) {
            (Value::Module("sys"), "exit") => Err(system_exit(args.first())),
            (Value::Module("os"), "getcwd") => Ok(Value::Str(self.cwd.clone())),
            (Value::Module("os"), "getpid") => Ok(Value::Int(i64::from(self.pid))),
            (Value::Module("os"), "getuid") => Ok(Value::Int(i64::from(self.sb.uid))),
            (Value::Module("os"), "getenv") | (Value::Environ, "get") => {
                let k = Self::str_arg(&args, 0, "getenv")?;
                Ok(self
                    .env
                    .get(&k)
                    .map(|v| Value::Str(v.clone()))
                    .unwrap_or_else(|| args.get(1).cloned().unwrap_or(Value::None)))
            }
            (Value::Environ, "keys") => Ok(Value::List(
                self.env.keys().map(|k| Value::Str(k.clone())).collect(),
            )),
            (Value::Module("os"), "listdir") => {
                let p = self.path(&args.first().map(Value::str).unwrap_or_else(|| ".".into()));
                let names = self.sb.fs().list(&p).map_err(|e| os_error(&p, e))?;
                Ok(Value::List(
                    names.into_iter().map(|(n, _)| Value::Str(n)).collect(),
                ))
            }
            (Value::Module("os"), "makedirs") => {
                let p = self.path(&Self::str_arg(&args, 0, "makedirs")?);
                let now = self.sb.now();
                self.sb
                    .fs()
                    .mkdir(&p, true, now)
                    .map_err(|e| os_error(&p, e))?;
                Ok(Value::None)
            }
            (Value::Module("os"), "remove") => {
                let p = self.path(&Self::str_arg(&args, 0, "remove")?);
                self.sb
                    .fs()
                    .remove(&p, false)
                    .map_err(|e| os_error(&p, e))?;
                Ok(Value::None)
            }
            (Value::Module("os.path"), "exists" | "isdir" | "isfile") => {
                let p = self.path(&Self::str_arg(&args, 0, m)?);
                let node = self.sb.fs().get(&p).map(|n| n.is_dir());
                Ok(Value::Bool(match m {
                    "isdir" => node == Some(true),
                    "isfile" => node == Some(false),
                    _ => node.is_some(),
                }))
            }
            (Value::Module("os.path"), "join") => {
                let mut out = String::new();
                for a in &args {
                    let s = a.str();
                    if s.starts_with('/') || out.is_empty() {
                        out = s;
                    } else {
                        if !out.ends_with('/') {
                            out.push('/');
                        }
                        out.push_str(&s);
                    }
                }
                Ok(Value::Str(out))
            }
            (Value::Module("os.path"), "basename") => Ok(Value::Str(
                memfs::base_name(&Self::str_arg(&args, 0, m)?).to_string(),
            )),
            (Value::Module("os.path"), "dirname") => {
                let s = Self::str_arg(&args, 0, m)?;
                Ok(Value::Str(
                    s.rsplit_once('/')
                        .map(|(d, _)| if d.is_empty() { "/" } else { d })
                        .unwrap_or("")
                        .to_string(),
                ))
            }
            (Value::Module("time"), "sleep") => {
                let secs = num(Self::arg(&args, 0, "sleep")?).ok_or_else(|| {
                    exc(
                        "TypeError",
                        "'str' object cannot be interpreted as a number",
                    )
                })?;
                if secs < 0.0 {
                    return Err(exc("ValueError", "sleep length must be non-negative"));
                }
                self.effects
                    .push(Effect::Sleep(Duration::from_secs_f64(secs.min(1e9))));
                Ok(Value::None)
            }
            (Value::Module("time"), "time") => Ok(Value::Float(
                self.sb
                    .now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0),
            )),
            (Value::Module("time"), _) => Ok(Value::Float(
                tokio::time::Instant::now()
                    .duration_since(self.sb.clock_origin())
                    .as_secs_f64(),
            )),
            (Value::Stream(kind), "write") => {
                let s = Self::str_arg(&args, 0, "write")?;
                let n = s.chars().count();
                self.effects.push(Effect::Out(*kind, s));
                Ok(Value::Int(n as i64))
            }
            (Value::Stream(_), "flush") | (Value::File(_), "close") => Ok(Value::None),
            (Value::File(path), "read" | "readlines") => {
                let data = self
                    .sb
                    .read_all(path, 64 << 20)
                    .map_err(|e| os_error(path, e))?;
                let text = String::from_utf8_lossy(&data).into_owned();
                if m == "read" {
                    Ok(Value::Str(text))
                } else {
                    Ok(Value::List(
                        text.split_inclusive('\n')
                            .map(|l| Value::Str(l.to_string()))
                            .collect(),
                    ))
                }
            }
            (Value::File(path), "write") => {
                let s = Self::str_arg(&args, 0, "write")?;
                self.file_append(path, &s)?;
                Ok(Value::Int(s.chars().count() as i64))
            }
            (Value::Str(s), _) => str_method(s, m, &args),
            _ => Err(exc(
                "AttributeError",
                format!("'{}' object has no attribute '{m}'", base.type_name()),
            )),
        }
    }
}

fn system_exit(code: Option<&Value>) -> Exc {
    match code {
        None | Some(Value::None) => exc("SystemExit", "0"),
        Some(Value::Int(i)) => exc("SystemExit", i.to_string()),
        Some(other) => exc("SystemExit", format!("message:{}", other.str())),
    }
}

fn os_error(path: &str, e: crate::memfs::FsError) -> Exc {
    let kind = match e {
        crate::memfs::FsError::NotFound => "FileNotFoundError",
        crate::memfs::FsError::IsADirectory => "IsADirectoryError",
        _ => "OSError",
    };
    let errno = match e {
        crate::memfs::FsError::NotFound => 2,
        crate::memfs::FsError::IsADirectory => 21,
        _ => 5,
    };
    exc(
        kind,
        format!("[Errno {errno}] {}: '{path}'", e.errno_text()),
    )
}

fn list_method(g: &mut Globals, var: &str, m: &str, args: Vec<Value>) -> PyResult<Value> {
    let Some(Value::List(l)) = g.vars.get_mut(var) else {
        return Err(exc("NameError", format!("name '{var}' is not defined")));
    };
    match m {
        "append" => {
            l.push(
                args.into_iter()
                    .next()
                    .ok_or_else(|| exc("TypeError", "append() takes exactly one argument"))?,
            );
            Ok(Value::None)
        }
        "extend" => match args.into_iter().next() {
            Some(Value::List(more)) => {
                l.extend(more);
                Ok(Value::None)
            }
            _ => Err(exc(
                "TypeError",
                "extend() argument must be a list in sandbox-fake",
            )),
        },
        "clear" => {
            l.clear();
            Ok(Value::None)
        }
        _ => {
            let idx = match args.first() {
                Some(v) => int_of(v).ok_or_else(|| exc("TypeError", "pop index must be an int"))?,
                None => -1,
            };
            let len = l.len() as i64;
            let k = if idx < 0 { idx + len } else { idx };
            if k < 0 || k >= len {
                return Err(exc("IndexError", "pop index out of range"));
            }
            Ok(l.remove(k as usize))
        }
    }
}

fn str_method(s: &str, m: &str, args: &[Value]) -> PyResult<Value> {
    let sarg = |i: usize| -> PyResult<String> {
        match args.get(i) {
            Some(Value::Str(x)) => Ok(x.clone()),
            Some(other) => Err(exc(
                "TypeError",
                format!("must be str, not {}", other.type_name()),
            )),
            None => Err(exc("TypeError", format!("{m}() missing required argument"))),
        }
    };
    Ok(match m {
        "upper" => Value::Str(s.to_uppercase()),
        "lower" => Value::Str(s.to_lowercase()),
        "strip" => Value::Str(s.trim().to_string()),
        "lstrip" => Value::Str(s.trim_start().to_string()),
        "rstrip" => Value::Str(s.trim_end().to_string()),
        "split" => Value::List(match args.first() {
            None | Some(Value::None) => {
                s.split_whitespace().map(|x| Value::Str(x.into())).collect()
            }
            Some(_) => s
                .split(sarg(0)?.as_str())
                .map(|x| Value::Str(x.into()))
                .collect(),
        }),
        "splitlines" => Value::List(s.lines().map(|x| Value::Str(x.into())).collect()),
        "join" => match args.first() {
            Some(Value::List(items)) => {
                let mut parts = Vec::new();
                for it in items {
                    match it {
                        Value::Str(x) => parts.push(x.clone()),
                        other => {
                            return Err(exc(
                                "TypeError",
                                format!(
                                    "sequence item: expected str instance, {} found",
                                    other.type_name()
                                ),
                            ));
                        }
                    }
                }
                Value::Str(parts.join(s))
            }
            _ => return Err(exc("TypeError", "can only join a list in sandbox-fake")),
        },
        "replace" => Value::Str(s.replace(sarg(0)?.as_str(), &sarg(1)?)),
        "startswith" => Value::Bool(s.starts_with(sarg(0)?.as_str())),
        "endswith" => Value::Bool(s.ends_with(sarg(0)?.as_str())),
        "find" => Value::Int(
            s.find(sarg(0)?.as_str())
                .map_or(-1, |i| s[..i].chars().count() as i64),
        ),
        "count" => Value::Int(s.matches(sarg(0)?.as_str()).count() as i64),
        "encode" | "decode" => Value::Str(s.to_string()),
        "format" => {
            let mut out = String::new();
            let mut rest = s;
            let mut i = 0;
            while let Some(pos) = rest.find("{}") {
                out.push_str(&rest[..pos]);
                out.push_str(&args.get(i).map(Value::str).unwrap_or_default());
                i += 1;
                rest = &rest[pos + 2..];
            }
            out.push_str(rest);
            Value::Str(out)
        }
        _ => {
            return Err(exc(
                "AttributeError",
                format!("'str' object has no attribute '{m}'"),
            ));
        }
    })
}

fn render_syntax_error(src: &str, e: &SyntaxErr, file: &str) -> String {
    let text = src.lines().nth(e.line.saturating_sub(1)).unwrap_or("");
    let trimmed = text.trim_start();
    let indent = text.len() - trimmed.len();
    let caret = e.col.saturating_sub(indent);
    format!(
        "  File \"{file}\", line {}\n    {trimmed}\n    {}^\n{}: {}\n",
        e.line,
        " ".repeat(caret),
        e.kind,
        e.msg
    )
}

fn render_traceback(src: &str, line: usize, e: &Exc, file: &str) -> String {
    let text = src.lines().nth(line.saturating_sub(1)).unwrap_or("").trim();
    let head = if e.msg.is_empty() {
        e.kind.clone()
    } else {
        format!("{}: {}", e.kind, e.msg)
    };
    format!(
        "Traceback (most recent call last):\n  File \"{file}\", line {line}, in <module>\n    {text}\n{head}\n"
    )
}

/// Runs `code` in `globals`, streaming output as statements produce it.
async fn execute(proc: &Proc, code: &str, globals: &mut Globals, file: &str) -> Result<i64> {
    let program = match parse(code) {
        Ok(p) => p,
        Err(e) => {
            proc.err(render_syntax_error(code, &e, file)).await;
            return Ok(1);
        }
    };
    for line in &program {
        let (result, effects) = {
            let mut it = Interp {
                sb: &proc.sb,
                cwd: proc.cwd.clone(),
                env: &proc.env,
                pid: proc.pid,
                effects: Vec::new(),
            };
            let r = it.exec(&line.stmt, globals);
            (r, it.effects)
        };
        for effect in effects {
            match effect {
                Effect::Out(StreamKind::Stdout, s) => {
                    proc.out(Bytes::from(s)).await;
                }
                Effect::Out(StreamKind::Stderr, s) => {
                    proc.err(Bytes::from(s)).await;
                }
                Effect::Sleep(d) => tokio::time::sleep(d).await,
            }
        }
        if let Err(e) = result {
            if e.kind == "SystemExit" {
                if let Ok(code) = e.msg.parse::<i64>() {
                    return Ok(code & 0xff);
                }
                let msg = e.msg.strip_prefix("message:").unwrap_or(&e.msg);
                proc.err(format!("{msg}\n")).await;
                return Ok(1);
            }
            proc.err(render_traceback(code, line.line, &e, file)).await;
            return Ok(1);
        }
    }
    Ok(0)
}

/// `run_code`: runs a snippet, in the persistent context `context` when given.
pub(crate) async fn run_snippet(proc: Proc, code: String, context: Option<String>) -> Result<i64> {
    match context {
        Some(id) => {
            let ctx = proc.sb.context(&id);
            let mut globals = ctx.lock().await;
            execute(&proc, &code, &mut globals, "<stdin>").await
        }
        None => execute(&proc, &code, &mut Globals::default(), "<stdin>").await,
    }
}

/// The `python3` program: `python3 -c CODE`, `python3 FILE`, `python3 --version`, or a
/// script on stdin.
pub(crate) async fn python_main(proc: Proc, argv: Vec<String>) -> Result<i64> {
    match argv.get(1).map(String::as_str) {
        Some("--version" | "-V") => {
            proc.out("Python 3.11.2\n").await;
            Ok(0)
        }
        Some("-c") => match argv.get(2) {
            Some(code) => execute(&proc, code, &mut Globals::default(), "<string>").await,
            None => {
                proc.err("Argument expected for the -c option\n").await;
                Ok(2)
            }
        },
        Some("-u" | "-B" | "-I" | "-E" | "-s") if argv.len() > 2 => {
            let mut rest = argv.clone();
            rest.remove(1);
            Box::pin(python_main(proc, rest)).await
        }
        Some(file) if !file.starts_with('-') => match proc.read_file(file) {
            Ok(b) => {
                let code = String::from_utf8_lossy(&b).into_owned();
                execute(&proc, &code, &mut Globals::default(), file).await
            }
            Err(e) => {
                proc.err(format!(
                    "python3: can't open file '{}': [Errno 2] {}\n",
                    proc.path(file),
                    e.errno_text()
                ))
                .await;
                Ok(2)
            }
        },
        Some(opt) => {
            proc.err(format!(
                "python3: option {opt} not supported by sandbox-fake\n"
            ))
            .await;
            Ok(2)
        }
        None => {
            let code = String::from_utf8_lossy(&proc.stdin).into_owned();
            execute(&proc, &code, &mut Globals::default(), "<stdin>").await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parses(src: &str) -> bool {
        parse(src).is_ok()
    }

    #[test]
    fn syntax_errors() {
        assert_eq!(parse("def (:").unwrap_err().kind, "SyntaxError");
        assert!(!parses("print(1"));
        assert!(!parses("x = = 1"));
        assert!(!parses("1 = x"));
        assert!(!parses("print('a)"));
        assert_eq!(parse("  x = 1").unwrap_err().kind, "IndentationError");
        assert!(parses("def f():\n    return 1\nprint(1)"));
        assert!(parses("import sys; sys.stderr.write(\"err\\n\")"));
        assert!(parses("x = 41\n\n# comment\nprint(x + 1)\n"));
    }

    #[test]
    fn arithmetic() {
        let ev = |src: &str| -> PyResult<Value> {
            let toks = lex(src).unwrap();
            let e = Parser { toks, pos: 0 }.expr().unwrap();
            eval_pure(&e)
        };
        assert_eq!(ev("1 + 2 * 3").unwrap(), Value::Int(7));
        assert_eq!(ev("2 ** 10 - 1").unwrap(), Value::Int(1023));
        assert_eq!(ev("-7 // 2").unwrap(), Value::Int(-4));
        assert_eq!(ev("-7 % 3").unwrap(), Value::Int(2));
        assert_eq!(ev("7 / 2").unwrap(), Value::Float(3.5));
        assert_eq!(ev("'a' * 3").unwrap(), Value::Str("aaa".into()));
        assert_eq!(ev("1 < 2 < 3").unwrap(), Value::Bool(true));
        assert_eq!(ev("1/0").unwrap_err().kind, "ZeroDivisionError");
        assert_eq!(ev("2 ** 100").unwrap_err().kind, "OverflowError");
        assert_eq!(ev("'a' + 1").unwrap_err().kind, "TypeError");
        assert_eq!(float_repr(2.0), "2.0");
        assert_eq!(float_repr(0.1), "0.1");
    }

    /// Evaluates an expression that needs no sandbox.
    fn eval_pure(e: &Expr) -> PyResult<Value> {
        match e {
            Expr::Const(v) => Ok(v.clone()),
            Expr::Bin(op, a, b) => {
                let a = eval_pure(a)?;
                let b = eval_pure(b)?;
                binop(op, a, b)
            }
            Expr::Unary("-", x) => match eval_pure(x)? {
                Value::Int(i) => Ok(Value::Int(-i)),
                v => Ok(v),
            },
            Expr::Cmp(first, rest) => {
                let mut left = eval_pure(first)?;
                for (op, r) in rest {
                    let right = eval_pure(r)?;
                    if !compare(op, &left, &right)? {
                        return Ok(Value::Bool(false));
                    }
                    left = right;
                }
                Ok(Value::Bool(true))
            }
            _ => Err(exc("TypeError", "not pure")),
        }
    }

    #[test]
    fn fstrings_and_reprs() {
        let parts = parse_fstring("a{x}b{y!r}", 1, 0).unwrap();
        assert_eq!(parts.len(), 4);
        assert_eq!(Value::Str("it's".into()).repr(), "\"it's\"");
        assert_eq!(
            Value::List(vec![Value::Int(1), Value::Str("a".into())]).str(),
            "[1, 'a']"
        );
    }

    #[test]
    fn syntax_error_rendering_points_at_column() {
        let src = "def (:";
        let e = parse(src).unwrap_err();
        let text = render_syntax_error(src, &e, "<stdin>");
        assert!(text.contains("SyntaxError: "), "{text}");
        assert!(text.contains("line 1"));
    }
}
