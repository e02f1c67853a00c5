//! `run_code` without an interpreter: the code is matched against the forms of
//! [`crate::vocabulary::SNIPPETS`] and answered as the table says. Contexts keep the
//! integers bound by `NAME = INT` (their variables are sandbox state, `state::Vars`).

use sandbox_core::Result;

use crate::commands::builtins::sleep_secs;
use crate::commands::refusal::SNIPPET_NOT_IN_TABLE_EXIT;
use crate::program::Proc;
use crate::state::Vars;
use crate::vocabulary::SNIPPETS;

/// A value captured by a placeholder.
#[derive(Debug, Clone, PartialEq)]
enum Cap {
    Int(i64),
    Num(f64),
    Name(String),
    Text(String),
}

/// Matches `code` against a form; the captures in order, or `None`.
fn match_form(form: &str, code: &str) -> Option<Vec<Cap>> {
    let mut caps = Vec::new();
    let mut rest = code;
    let mut f = form;
    while !f.is_empty() {
        if let Some(after) = f.strip_prefix(' ') {
            rest = rest.trim_start_matches(' ');
            f = after;
            continue;
        }
        let placeholder = ["{int}", "{num}", "{name}", "{text}"]
            .into_iter()
            .find(|p| f.starts_with(p));
        let Some(p) = placeholder else {
            let c = f.chars().next()?;
            rest = rest.strip_prefix(c)?;
            f = &f[c.len_utf8()..];
            continue;
        };
        f = &f[p.len()..];
        let len = match p {
            "{int}" => {
                let digits = rest.strip_prefix('-').unwrap_or(rest);
                let n = digits.chars().take_while(char::is_ascii_digit).count();
                (n > 0).then_some(n + rest.len() - digits.len())?
            }
            "{num}" => rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .count(),
            "{name}" => {
                let n = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .count();
                (n > 0 && !rest.starts_with(|c: char| c.is_ascii_digit())).then_some(n)?
            }
            // Text runs to the next literal of the form (which is a quote here).
            _ => rest.find(['\'', '"', '\\', '\n']).unwrap_or(rest.len()),
        };
        let (value, tail) = rest.split_at(len);
        caps.push(match p {
            "{int}" => Cap::Int(value.parse().ok()?),
            "{num}" => Cap::Num(value.parse().ok().filter(|n: &f64| n.is_finite())?),
            "{name}" => Cap::Name(value.to_string()),
            _ => Cap::Text(value.to_string()),
        });
        rest = tail;
    }
    rest.is_empty().then_some(caps)
}

/// Whether brackets and quotes balance (a line-oriented check, enough for the table's
/// "does not balance → SyntaxError" row).
fn balanced(code: &str) -> bool {
    let mut stack = Vec::new();
    let mut quote: Option<char> = None;
    for c in code.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => stack.push(c),
            (None, ')') if stack.pop() != Some('(') => return false,
            (None, ']') if stack.pop() != Some('[') => return false,
            (None, '}') if stack.pop() != Some('{') => return false,
            _ => {}
        }
    }
    quote.is_none() && stack.is_empty()
}

fn traceback(error: &str) -> String {
    format!(
        "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in <module>\n{error}\n"
    )
}

async fn print(p: &Proc, line: String) -> Result<i64> {
    p.out(line + "\n").await;
    Ok(0)
}

async fn raise(p: &Proc, error: String) -> Result<i64> {
    p.err(traceback(&error)).await;
    Ok(1)
}

fn name_error(name: &str) -> String {
    format!("NameError: name '{name}' is not defined")
}

/// Runs `code` as the table says, with `vars` as the context's variables (a fresh, empty
/// set for a context-less run).
pub(crate) async fn run(p: Proc, code: String, vars: Vars) -> Result<i64> {
    let code = code.trim();
    let found = SNIPPETS
        .iter()
        .enumerate()
        .find_map(|(i, s)| match_form(s.form, code).map(|caps| (i, caps)));
    let get = |name: &str| crate::lock(&vars).get(name).copied();
    use Cap::{Int, Name, Num, Text};
    let Some((row, caps)) = found else {
        if !balanced(code) {
            let msg = "  File \"<stdin>\", line 1\nSyntaxError: invalid syntax\n";
            p.err(msg).await;
            return Ok(1);
        }
        let first: String = code.lines().next().unwrap_or("").chars().take(80).collect();
        p.sb.outside_vocabulary(format!("fake: snippet not in table: {first}"));
        p.err(format!("fake: snippet not in table: {first}\n"))
            .await;
        return Ok(SNIPPET_NOT_IN_TABLE_EXIT);
    };
    let overflow = || "OverflowError: the fake's integers are 64-bit".to_string();
    // Rows in the order of `SNIPPETS`.
    match (row, caps.as_slice()) {
        (0, [Int(a)]) => print(&p, a.to_string()).await,
        (1, [Int(a), Int(b)]) => match a.checked_add(*b) {
            Some(v) => print(&p, v.to_string()).await,
            None => raise(&p, overflow()).await,
        },
        (2, [Int(a), Int(b)]) => match a.checked_mul(*b) {
            Some(v) => print(&p, v.to_string()).await,
            None => raise(&p, overflow()).await,
        },
        (3, [Name(n)]) => match get(n) {
            Some(v) => print(&p, v.to_string()).await,
            None => raise(&p, name_error(n)).await,
        },
        (4, [Name(n), Int(b)]) => match get(n).map(|v| v.checked_add(*b)) {
            Some(Some(v)) => print(&p, v.to_string()).await,
            Some(None) => raise(&p, overflow()).await,
            None => raise(&p, name_error(n)).await,
        },
        (5 | 6, [Text(t)]) => print(&p, t.clone()).await,
        (7, [Name(n), Int(v)]) => {
            crate::lock(&vars).insert(n.clone(), *v);
            Ok(0)
        }
        (8, [Text(t)]) => {
            p.err(format!("{t}\n")).await;
            Ok(0)
        }
        (9, []) => print(&p, p.cwd.clone()).await,
        (10, [Num(s)]) => sleep_secs(*s).await,
        (11, [Text(path), Num(s)]) => {
            let path = p.path(path);
            let now = p.sb.now();
            let written =
                p.sb.fs()
                    .write(&path, p.pid.to_string().into_bytes(), false, now);
            if let Err(e) = written {
                return raise(&p, format!("OSError: {}: '{path}'", e.errno_text())).await;
            }
            sleep_secs(*s).await
        }
        (12, [Int(_)]) => raise(&p, "ZeroDivisionError: division by zero".into()).await,
        (13, [Name(n), Text(t)]) => raise(&p, format!("{n}: {t}")).await,
        // A row whose captures do not fit its action cannot happen (the forms fix them);
        // answer like an unknown snippet rather than panic.
        _ => {
            p.sb.outside_vocabulary("fake: snippet not in table");
            p.err("fake: snippet not in table\n").await;
            Ok(SNIPPET_NOT_IN_TABLE_EXIT)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_match_the_suites_snippets() {
        assert_eq!(
            match_form("print({int})", "print(1)"),
            Some(vec![Cap::Int(1)])
        );
        assert_eq!(
            match_form("print({int} + {int})", "print(40+2)"),
            Some(vec![Cap::Int(40), Cap::Int(2)])
        );
        assert_eq!(
            match_form("{name} = {int}", "x = 41"),
            Some(vec![Cap::Name("x".into()), Cap::Int(41)])
        );
        assert_eq!(
            match_form("print('{text}')", "print('tok-1')"),
            Some(vec![Cap::Text("tok-1".into())])
        );
        let f = SNIPPETS[8].form;
        assert_eq!(
            match_form(f, "import sys; sys.stderr.write(\"err\\n\")"),
            Some(vec![Cap::Text("err".into())])
        );
        assert_eq!(match_form("print({int})", "print(1) "), None);
        assert_eq!(match_form("print({int})", "print(x)"), None);
        assert_eq!(match_form("{name} = {int}", "1x = 1"), None);
        assert_eq!(match_form("{int}/0", "1/0"), Some(vec![Cap::Int(1)]));
    }
}
