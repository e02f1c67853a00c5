//! The simple commands of the vocabulary (the `COMMANDS` table of `vocabulary`), each in
//! exactly the forms listed there. A form outside the list is answered with a usage error,
//! never guessed at. The commands that run other programs (`sh`, `setsid`) and the egress
//! probe (`nc`) live beside this module.

use bytes::Bytes;
use sandbox_core::Result;
use tokio::task::AbortHandle;

use crate::commands::refusal::form_not_in_vocabulary;
use crate::processes::INIT_PID;
use crate::program::{BROKEN_PIPE_EXIT, MAX_CHUNK, Proc, fail};

/// Writes to stdout and exits 0 (or with the broken-pipe status).
async fn emit(p: &Proc, s: impl Into<Bytes>) -> Result<i64> {
    Ok(if p.out(s).await { 0 } else { BROKEN_PIPE_EXIT })
}

pub(crate) async fn echo(p: Proc, a: Vec<String>) -> Result<i64> {
    emit(&p, format!("{}\n", a[1..].join(" "))).await
}

pub(crate) async fn printf(p: Proc, a: Vec<String>) -> Result<i64> {
    let Some(format) = a.get(1) else {
        return form_not_in_vocabulary(&p, &a).await;
    };
    let mut args = a[2..].iter();
    let mut out = Vec::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('n') => out.push(b'\n'),
                Some('t') => out.push(b'\t'),
                Some('r') => out.push(b'\r'),
                Some('a') => out.push(7),
                Some('e') => out.push(0x1b),
                Some('\\') | None => out.push(b'\\'),
                Some(d @ '0'..='7') => {
                    let mut v = d.to_digit(8).unwrap_or(0);
                    for _ in 0..2 {
                        match chars.peek().and_then(|c| c.to_digit(8)) {
                            Some(n) => {
                                v = v * 8 + n;
                                chars.next();
                            }
                            None => break,
                        }
                    }
                    out.push((v & 0xff) as u8);
                }
                Some(other) => {
                    out.push(b'\\');
                    out.extend(other.to_string().as_bytes());
                }
            },
            '%' => match chars.next() {
                Some('%') => out.push(b'%'),
                Some('s') => out.extend(args.next().map_or("", String::as_str).as_bytes()),
                Some('d') => {
                    let arg = args.next().map_or("0", String::as_str);
                    match arg.parse::<i64>() {
                        Ok(n) => out.extend(n.to_string().as_bytes()),
                        Err(_) => {
                            return fail(&p, format!("printf: invalid number '{arg}'"), 1).await;
                        }
                    }
                }
                _ => return form_not_in_vocabulary(&p, &a).await,
            },
            c => out.extend(c.to_string().as_bytes()),
        }
    }
    emit(&p, out).await
}

pub(crate) async fn cat(p: Proc, a: Vec<String>) -> Result<i64> {
    if a.len() < 2 {
        // Piece by piece as it arrives (live input is echoed before it ends).
        while let Some(input) = p.next_stdin().await {
            if !p.out(input).await {
                return Ok(BROKEN_PIPE_EXIT);
            }
        }
        return Ok(0);
    }
    let mut code = 0;
    for f in &a[1..] {
        match p.read_file(f) {
            Ok(bytes) => {
                if !p.out(bytes).await {
                    return Ok(BROKEN_PIPE_EXIT);
                }
            }
            Err(e) => code = fail(&p, format!("cat: {f}: {}", e.errno_text()), 1).await?,
        }
    }
    Ok(code)
}

pub(crate) async fn pwd(p: Proc, a: Vec<String>) -> Result<i64> {
    if a.len() != 1 {
        return form_not_in_vocabulary(&p, &a).await;
    }
    emit(&p, format!("{}\n", p.cwd)).await
}

pub(crate) async fn printenv(p: Proc, a: Vec<String>) -> Result<i64> {
    let [_, name] = a.as_slice() else {
        return form_not_in_vocabulary(&p, &a).await;
    };
    match p.env.get(name) {
        Some(v) => emit(&p, format!("{v}\n")).await,
        None => Ok(1),
    }
}

pub(crate) async fn sleep(p: Proc, a: Vec<String>) -> Result<i64> {
    let [_, secs] = a.as_slice() else {
        return form_not_in_vocabulary(&p, &a).await;
    };
    match secs.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => sleep_secs(s).await,
        _ => fail(&p, format!("sleep: invalid number '{secs}'"), 1).await,
    }
}

/// Sleeps `secs` (finite, not negative) seconds of tokio time, capped at a year: longer is
/// "forever" for any test, and `from_secs_f64` would panic past `Duration::MAX`.
pub(crate) async fn sleep_secs(secs: f64) -> Result<i64> {
    tokio::time::sleep(std::time::Duration::from_secs_f64(secs.min(31_536_000.0))).await;
    Ok(0)
}

pub(crate) async fn seq(p: Proc, a: Vec<String>) -> Result<i64> {
    let (first, last) = match a.as_slice() {
        [_, last] => ("1", last.as_str()),
        [_, first, last] => (first.as_str(), last.as_str()),
        _ => return form_not_in_vocabulary(&p, &a).await,
    };
    let (Ok(first), Ok(last)) = (first.parse::<i64>(), last.parse::<i64>()) else {
        return fail(&p, "seq: invalid number", 1).await;
    };
    let mut out = String::new();
    let mut i = first;
    while i <= last {
        out.push_str(&i.to_string());
        out.push('\n');
        // Large ranges go out as they are produced, so memory stays bounded.
        if out.len() >= 64 * 1024 {
            if !p.out(std::mem::take(&mut out)).await {
                return Ok(BROKEN_PIPE_EXIT);
            }
            // Output to /dev/null never waits: yield so a huge range cannot hog the runtime.
            tokio::task::yield_now().await;
        }
        let Some(next) = i.checked_add(1) else { break };
        i = next;
    }
    emit(&p, out).await
}

pub(crate) async fn kill(p: Proc, a: Vec<String>) -> Result<i64> {
    let (probe, target) = match a.as_slice() {
        [_, flag, pid] if flag == "-0" => (true, pid),
        [_, flag, pid] if flag == "-9" || flag == "-KILL" => (false, pid),
        [_, pid] => (false, pid),
        _ => return form_not_in_vocabulary(&p, &a).await,
    };
    // `-PGID` names a process group (not for the `-0` probe).
    let group = target.strip_prefix('-').filter(|_| !probe);
    let Ok(pid) = group.unwrap_or(target).parse::<u32>() else {
        return fail(&p, format!("kill: invalid number '{target}'"), 1).await;
    };
    if pid == INIT_PID && !probe && group.is_none() {
        let msg = format!("kill: can't kill pid {pid}: Operation not permitted");
        return fail(&p, msg, 1).await;
    }
    // Take the entries out under the lock, abort outside it (the tasks' exit guards lock).
    let found = if probe {
        p.sb.procs().alive(pid)
    } else if group.is_some() {
        let handles = p.sb.procs().kill_group(pid);
        handles.iter().for_each(AbortHandle::abort);
        !handles.is_empty()
    } else {
        let killed = p.sb.procs().kill(pid);
        killed.iter().flatten().for_each(AbortHandle::abort);
        killed.is_some()
    };
    if found {
        return Ok(0);
    }
    let sign = if group.is_some() { "-" } else { "" };
    let msg = format!("kill: can't kill pid {sign}{pid}: No such process");
    fail(&p, msg, 1).await
}

pub(crate) async fn test(p: Proc, a: Vec<String>) -> Result<i64> {
    let path = match a.as_slice() {
        [_, flag, path] if flag == "-e" => path,
        _ => return form_not_in_vocabulary(&p, &a).await,
    };
    let exists = p.sb.fs().get_followed(&p.path(path)).is_some();
    Ok(if exists { 0 } else { 1 })
}

pub(crate) async fn dd(p: Proc, a: Vec<String>) -> Result<i64> {
    let (mut zero, mut bs, mut count) = (false, None, None);
    for arg in &a[1..] {
        match arg.split_once('=') {
            Some(("if", "/dev/zero")) => zero = true,
            Some(("bs", v)) => bs = v.parse::<usize>().ok().filter(|n| *n > 0),
            Some(("count", v)) => count = v.parse::<usize>().ok(),
            _ => return form_not_in_vocabulary(&p, &a).await,
        }
    }
    let (true, Some(bs), Some(count)) = (zero, bs, count) else {
        return form_not_in_vocabulary(&p, &a).await;
    };
    let total = bs.saturating_mul(count);
    let piece = Bytes::from(vec![0u8; total.min(MAX_CHUNK)]);
    let mut left = total;
    while left > 0 {
        let n = left.min(piece.len());
        if !p.out(piece.slice(..n)).await {
            return Ok(BROKEN_PIPE_EXIT);
        }
        left -= n;
        tokio::task::yield_now().await;
    }
    p.err(format!("{count}+0 records in\n{count}+0 records out\n"))
        .await;
    Ok(0)
}

pub(crate) async fn ln(p: Proc, a: Vec<String>) -> Result<i64> {
    let (target, link) = match a.as_slice() {
        [_, flag, target, link] if flag == "-s" => (target, link),
        _ => return form_not_in_vocabulary(&p, &a).await,
    };
    let path = p.path(link);
    let now = p.sb.now();
    let made = p.sb.fs().symlink(&path, target, now);
    match made {
        Ok(()) => Ok(0),
        Err(e) => fail(&p, format!("ln: {link}: {}", e.errno_text()), 1).await,
    }
}

pub(crate) async fn chmod(p: Proc, a: Vec<String>) -> Result<i64> {
    let (mode, path) = match a.as_slice() {
        [_, mode, path] => match u32::from_str_radix(mode, 8) {
            Ok(m) if m <= 0o7777 => (m, path),
            _ => return form_not_in_vocabulary(&p, &a).await,
        },
        _ => return form_not_in_vocabulary(&p, &a).await,
    };
    let changed = p.sb.fs().chmod(&p.path(path), mode);
    match changed {
        Ok(()) => Ok(0),
        Err(e) => fail(&p, format!("chmod: {path}: {}", e.errno_text()), 1).await,
    }
}
