//! The programs a fake sandbox "has installed": busybox-like behaviour and messages for
//! `echo printf cat sh sleep true false printenv env seq ls mkdir rm rmdir pwd kill head wc
//! nc id test [ dd touch ln cp mv hostname whoami uname basename dirname which` and, on
//! templates with Python, `python3`/`python`. Anything else exits 127 with
//! "<name>: not found".

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use sandbox_core::Result;

use crate::exec::{BROKEN_PIPE_EXIT, MAX_CHUNK, Origin, Proc, run_program};
use crate::memfs::{self, Content, Device, FsError};
use crate::sandbox::pseudo_random;
use crate::shell::Shell;
use crate::{netcat, python};

/// A built-in program.
pub(crate) type Program = fn(Proc, Vec<String>) -> BoxFuture<'static, Result<i64>>;

const BIN_DIRS: &[&str] = &[
    "/bin/",
    "/usr/bin/",
    "/sbin/",
    "/usr/sbin/",
    "/usr/local/bin/",
];

static ZEROS: [u8; MAX_CHUNK] = [0; MAX_CHUNK];

/// The program called `name` (a bare name or one under a standard bin directory).
pub(crate) fn lookup(name: &str, has_python: bool) -> Option<Program> {
    let base = BIN_DIRS
        .iter()
        .find_map(|d| name.strip_prefix(d))
        .unwrap_or(name);
    if base.contains('/') {
        return None;
    }
    let p: Program = match base {
        "echo" => |p, a| Box::pin(echo(p, a)),
        "printf" => |p, a| Box::pin(printf(p, a)),
        "cat" => |p, a| Box::pin(cat(p, a)),
        "sh" | "ash" | "bash" => |p, a| Box::pin(sh(p, a)),
        "sleep" => |p, a| Box::pin(sleep(p, a)),
        "true" | ":" => |_, _| Box::pin(async { Ok(0) }),
        "false" => |_, _| Box::pin(async { Ok(1) }),
        "printenv" => |p, a| Box::pin(printenv(p, a)),
        "env" => |p, a| Box::pin(env(p, a)),
        "seq" => |p, a| Box::pin(seq(p, a)),
        "ls" => |p, a| Box::pin(ls(p, a)),
        "mkdir" => |p, a| Box::pin(mkdir(p, a)),
        "rm" => |p, a| Box::pin(rm(p, a)),
        "rmdir" => |p, a| Box::pin(rmdir(p, a)),
        "pwd" => |p, _| Box::pin(async move { emit(&p, format!("{}\n", p.cwd)).await }),
        "kill" => |p, a| Box::pin(kill(p, a)),
        "head" => |p, a| Box::pin(head(p, a)),
        "wc" => |p, a| Box::pin(wc(p, a)),
        "nc" => |p, a| Box::pin(netcat::nc(p, a)),
        "id" => |p, a| Box::pin(id(p, a)),
        "whoami" => |p, _| Box::pin(async move { emit(&p, format!("{}\n", user(&p))).await }),
        "test" => |p, a| Box::pin(test(p, a, false)),
        "[" => |p, a| Box::pin(test(p, a, true)),
        "dd" => |p, a| Box::pin(dd(p, a)),
        "touch" => |p, a| Box::pin(touch(p, a)),
        "ln" => |p, a| Box::pin(ln(p, a)),
        "cp" => |p, a| Box::pin(cp_mv(p, a, false)),
        "mv" => |p, a| Box::pin(cp_mv(p, a, true)),
        "hostname" => {
            |p, _| Box::pin(async move { emit(&p, format!("{}\n", p.sb.hostname())).await })
        }
        "uname" => |p, a| Box::pin(uname(p, a)),
        "basename" => |p, a| Box::pin(basename(p, a)),
        "dirname" => |p, a| Box::pin(dirname(p, a)),
        "which" => |p, a| Box::pin(which(p, a)),
        "python3" | "python" if has_python => |p, a| Box::pin(python::python_main(p, a)),
        _ => return None,
    };
    Some(p)
}

/// Writes to stdout and exits 0 (or with the broken-pipe status).
async fn emit(p: &Proc, s: impl Into<Bytes>) -> Result<i64> {
    Ok(if p.out(s).await { 0 } else { BROKEN_PIPE_EXIT })
}

/// Writes an error line to stderr and returns `code`.
async fn fail(p: &Proc, msg: impl Into<String>, code: i64) -> Result<i64> {
    let mut m = msg.into();
    m.push('\n');
    p.err(m).await;
    Ok(code)
}

fn user(p: &Proc) -> &'static str {
    if p.sb.uid == 0 { "root" } else { "sandbox" }
}

/// Splits `-abc` style flags off the front; returns (flags, operands). `--` ends flags.
fn flags(args: &[String], known: &str) -> (String, Vec<String>) {
    let mut f = String::new();
    let mut rest = Vec::new();
    let mut done = false;
    for a in args {
        if !done && a == "--" {
            done = true;
        } else if !done
            && a.len() > 1
            && a.starts_with('-')
            && a[1..].chars().all(|c| known.contains(c))
        {
            f.push_str(&a[1..]);
        } else {
            done = true;
            rest.push(a.clone());
        }
    }
    (f, rest)
}

fn unescape(s: &str) -> (String, bool) {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('a') => out.push('\x07'),
            Some('b') => out.push('\x08'),
            Some('f') => out.push('\x0c'),
            Some('v') => out.push('\x0b'),
            Some('e') => out.push('\x1b'),
            Some('\\') => out.push('\\'),
            Some('c') => return (out, true),
            Some('0') => {
                let mut v = 0u32;
                for _ in 0..3 {
                    match chars.peek().and_then(|c| c.to_digit(8)) {
                        Some(d) => {
                            v = v * 8 + d;
                            chars.next();
                        }
                        None => break,
                    }
                }
                out.push(char::from_u32(v).unwrap_or('\0'));
            }
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    (out, false)
}

async fn echo(p: Proc, a: Vec<String>) -> Result<i64> {
    let mut newline = true;
    let mut escapes = false;
    let mut i = 1;
    while i < a.len() {
        let s = &a[i];
        if s.len() > 1 && s.starts_with('-') && s[1..].chars().all(|c| "neE".contains(c)) {
            for c in s[1..].chars() {
                match c {
                    'n' => newline = false,
                    'e' => escapes = true,
                    _ => escapes = false,
                }
            }
            i += 1;
        } else {
            break;
        }
    }
    let mut text = a[i..].join(" ");
    if escapes {
        let (t, stop) = unescape(&text);
        text = t;
        if stop {
            newline = false;
        }
    }
    if newline {
        text.push('\n');
    }
    emit(&p, text).await
}

/// Renders one pass of a printf format; returns the text, args consumed and an error flag.
fn printf_pass(fmt: &str, args: &[String], mut idx: usize) -> (String, usize, bool) {
    let mut out = String::new();
    let mut bad = false;
    let chars: Vec<char> = fmt.chars().collect();
    let mut i = 0;
    let next_arg = |idx: &mut usize| -> Option<String> {
        let v = args.get(*idx).cloned();
        if v.is_some() {
            *idx += 1;
        }
        v
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' {
            let end = (i + 2).min(chars.len());
            let mut seq: String = chars[i..end].iter().collect();
            let mut consumed = end - i;
            if chars.get(i + 1) == Some(&'0') {
                let mut j = i + 2;
                while j < chars.len() && j < i + 5 && chars[j].is_digit(8) {
                    j += 1;
                }
                seq = chars[i..j].iter().collect();
                consumed = j - i;
            }
            out.push_str(&unescape(&seq).0);
            i += consumed;
            continue;
        }
        if c != '%' {
            out.push(c);
            i += 1;
            continue;
        }
        i += 1;
        if chars.get(i) == Some(&'%') {
            out.push('%');
            i += 1;
            continue;
        }
        let mut flags = String::new();
        while i < chars.len() && "-+ 0#".contains(chars[i]) {
            flags.push(chars[i]);
            i += 1;
        }
        let mut width = String::new();
        while i < chars.len() && chars[i].is_ascii_digit() {
            width.push(chars[i]);
            i += 1;
        }
        let mut prec: Option<usize> = None;
        if chars.get(i) == Some(&'.') {
            i += 1;
            let mut p = String::new();
            while i < chars.len() && chars[i].is_ascii_digit() {
                p.push(chars[i]);
                i += 1;
            }
            prec = Some(p.parse().unwrap_or(0));
        }
        let Some(&conv) = chars.get(i) else {
            out.push('%');
            break;
        };
        i += 1;
        let arg = next_arg(&mut idx);
        let body = match conv {
            's' => {
                let s = arg.unwrap_or_default();
                match prec {
                    Some(p) => s.chars().take(p).collect(),
                    None => s,
                }
            }
            'b' => unescape(&arg.unwrap_or_default()).0,
            'c' => arg
                .and_then(|s| s.chars().next())
                .map(String::from)
                .unwrap_or_default(),
            'd' | 'i' | 'u' | 'x' | 'X' | 'o' => {
                let s = arg.unwrap_or_else(|| "0".into());
                let n = match s.trim().parse::<i64>() {
                    Ok(n) => n,
                    Err(_) => {
                        bad = true;
                        0
                    }
                };
                match conv {
                    'x' => format!("{n:x}"),
                    'X' => format!("{n:X}"),
                    'o' => format!("{n:o}"),
                    _ if flags.contains('+') && n >= 0 => format!("+{n}"),
                    _ => n.to_string(),
                }
            }
            'f' | 'e' | 'g' => {
                let s = arg.unwrap_or_else(|| "0".into());
                let v = s.trim().parse::<f64>().unwrap_or_else(|_| {
                    bad = true;
                    0.0
                });
                match conv {
                    'e' => format!("{:.*e}", prec.unwrap_or(6), v),
                    'g' => format!("{v}"),
                    _ => format!("{:.*}", prec.unwrap_or(6), v),
                }
            }
            other => {
                bad = true;
                format!("%{other}")
            }
        };
        let w: usize = width.parse().unwrap_or(0);
        let len = body.chars().count();
        if len >= w {
            out.push_str(&body);
        } else if flags.contains('-') {
            out.push_str(&body);
            out.push_str(&" ".repeat(w - len));
        } else if flags.contains('0') && "diuxXofe".contains(conv) {
            let (sign, digits) = match body.strip_prefix('-') {
                Some(d) => ("-", d.to_string()),
                None => ("", body.clone()),
            };
            out.push_str(sign);
            out.push_str(&"0".repeat(w - len));
            out.push_str(&digits);
        } else {
            out.push_str(&" ".repeat(w - len));
            out.push_str(&body);
        }
    }
    (out, idx, bad)
}

async fn printf(p: Proc, a: Vec<String>) -> Result<i64> {
    let Some(fmt) = a.get(1) else {
        return fail(&p, "printf: missing format", 1).await;
    };
    let args = &a[2..];
    let mut out = String::new();
    let mut idx = 0;
    let mut bad = false;
    loop {
        let (text, next, b) = printf_pass(fmt, args, idx);
        out.push_str(&text);
        bad |= b;
        // The format is reused while arguments remain (and it consumes some).
        if next >= args.len() || next == idx {
            break;
        }
        idx = next;
    }
    if !p.out(out).await {
        return Ok(BROKEN_PIPE_EXIT);
    }
    if bad {
        return fail(&p, "printf: invalid argument", 1).await;
    }
    Ok(0)
}

/// Streams an endless device until the reader goes away.
async fn stream_device(p: &Proc, d: Device, limit: Option<u64>) -> bool {
    let mut left = limit.unwrap_or(u64::MAX);
    let random = Bytes::from(pseudo_random(MAX_CHUNK));
    while left > 0 {
        let n = left.min(MAX_CHUNK as u64) as usize;
        let chunk = match d {
            Device::Zero => Bytes::from_static(&ZEROS[..n]),
            Device::Random => random.slice(..n),
            Device::Null => return true,
        };
        if !p.out(chunk).await {
            return false;
        }
        left -= n as u64;
        // Give the runtime a chance to deliver a kill or timeout.
        tokio::task::yield_now().await;
    }
    true
}

async fn cat(p: Proc, a: Vec<String>) -> Result<i64> {
    let (_, files) = flags(&a[1..], "u");
    if files.is_empty() {
        return emit(&p, p.stdin.clone()).await;
    }
    let mut code = 0;
    for f in files {
        if f == "-" {
            p.out(p.stdin.clone()).await;
            continue;
        }
        match p.sb.open(&p.path(&f)) {
            Ok(Content::Bytes(b)) => {
                if !p.out(b).await {
                    return Ok(BROKEN_PIPE_EXIT);
                }
            }
            Ok(Content::Device(d)) => {
                if !stream_device(&p, d, None).await {
                    return Ok(BROKEN_PIPE_EXIT);
                }
            }
            Ok(Content::Pseudo(_)) => {}
            Err(FsError::IsADirectory) => {
                code = fail(&p, "cat: read error: Is a directory", 1).await?;
            }
            Err(e) => {
                code = fail(&p, format!("cat: can't open '{f}': {}", e.errno_text()), 1).await?;
            }
        }
    }
    Ok(code)
}

async fn sh(p: Proc, a: Vec<String>) -> Result<i64> {
    let (script, args) = match a.get(1).map(String::as_str) {
        Some("-c") => match a.get(2) {
            Some(s) => {
                let mut args = a.get(3..).unwrap_or_default().to_vec();
                if args.is_empty() {
                    args.push("sh".into());
                }
                (s.clone(), args)
            }
            None => return fail(&p, "sh: -c requires an argument", 2).await,
        },
        Some(file) => match p.read_file(file) {
            Ok(b) => (String::from_utf8_lossy(&b).into_owned(), a[1..].to_vec()),
            Err(e) => {
                return fail(
                    &p,
                    format!("sh: can't open '{file}': {}", e.errno_text()),
                    2,
                )
                .await;
            }
        },
        None => (
            String::from_utf8_lossy(&p.stdin).into_owned(),
            vec!["sh".into()],
        ),
    };
    let mut shell = Shell::new(&p, args);
    shell.run(&p, &script).await
}

fn parse_duration(s: &str) -> Option<Option<Duration>> {
    if matches!(s, "inf" | "infinity") {
        return Some(None);
    }
    let (num, mult) = match s.chars().last()? {
        's' => (&s[..s.len() - 1], 1.0),
        'm' => (&s[..s.len() - 1], 60.0),
        'h' => (&s[..s.len() - 1], 3600.0),
        'd' => (&s[..s.len() - 1], 86400.0),
        _ => (s, 1.0),
    };
    let v: f64 = num.parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    Some(Some(Duration::from_secs_f64((v * mult).min(1e9))))
}

async fn sleep(p: Proc, a: Vec<String>) -> Result<i64> {
    if a.len() < 2 {
        return fail(&p, "sleep: missing operand", 1).await;
    }
    let mut total = Duration::ZERO;
    for s in &a[1..] {
        match parse_duration(s) {
            Some(Some(d)) => total += d,
            Some(None) => futures::future::pending::<()>().await,
            None => return fail(&p, format!("sleep: invalid number '{s}'"), 1).await,
        }
    }
    tokio::time::sleep(total).await;
    Ok(0)
}

fn env_listing(p: &Proc) -> String {
    p.env.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

async fn printenv(p: Proc, a: Vec<String>) -> Result<i64> {
    if a.len() == 1 {
        return emit(&p, env_listing(&p)).await;
    }
    let mut out = String::new();
    let mut code = 0;
    for name in &a[1..] {
        match p.env.get(name) {
            Some(v) => {
                out.push_str(v);
                out.push('\n');
            }
            None => code = 1,
        }
    }
    p.out(out).await;
    Ok(code)
}

async fn env(p: Proc, a: Vec<String>) -> Result<i64> {
    let mut child = p.clone();
    let mut i = 1;
    if a.get(1).map(String::as_str) == Some("-i") {
        child.env.clear();
        i = 2;
    }
    while let Some((k, v)) = a.get(i).and_then(|s| s.split_once('=')) {
        child.env.insert(k.to_string(), v.to_string());
        i += 1;
    }
    if i >= a.len() {
        return emit(&p, env_listing(&child)).await;
    }
    run_program(child, a[i..].to_vec(), Origin::Exec).await
}

async fn seq(p: Proc, a: Vec<String>) -> Result<i64> {
    let nums: Option<Vec<i64>> = a[1..].iter().map(|s| s.parse().ok()).collect();
    let (first, step, last) = match nums.as_deref() {
        Some([l]) => (1, 1, *l),
        Some([f, l]) => (*f, 1, *l),
        Some([f, s, l]) if *s != 0 => (*f, *s, *l),
        _ => {
            return fail(
                &p,
                "seq: invalid arguments (usage: seq [FIRST [INC]] LAST)",
                1,
            )
            .await;
        }
    };
    let mut buf = String::new();
    let mut n = first;
    while (step > 0 && n <= last) || (step < 0 && n >= last) {
        buf.push_str(&n.to_string());
        buf.push('\n');
        if buf.len() >= MAX_CHUNK && !p.out(std::mem::take(&mut buf)).await {
            return Ok(BROKEN_PIPE_EXIT);
        }
        match n.checked_add(step) {
            Some(v) => n = v,
            None => break,
        }
    }
    emit(&p, buf).await
}

fn mode_string(is_dir: bool, mode: u32) -> String {
    let mut s = String::from(if is_dir { "d" } else { "-" });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// `YYYY-MM-DD HH:MM` of a time (UTC), for `ls -l`.
fn civil(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

async fn ls(p: Proc, a: Vec<String>) -> Result<i64> {
    let (f, mut paths) = flags(&a[1..], "aAl1F");
    let all = f.contains('a');
    let almost = f.contains('A');
    let long = f.contains('l');
    if paths.is_empty() {
        paths.push(".".into());
    }
    let multi = paths.len() > 1;
    let mut out = String::new();
    let mut code = 0;
    let line = |name: &str, node: &memfs::Node| -> String {
        if long {
            format!(
                "{} {:>4} {:<8} {:<8} {:>9} {} {}\n",
                mode_string(node.is_dir(), node.mode),
                1,
                user(&p),
                user(&p),
                node.size(),
                civil(node.mtime),
                name
            )
        } else {
            format!("{name}\n")
        }
    };
    let mut missing = Vec::new();
    {
        let fs = p.sb.fs();
        for (i, path) in paths.iter().enumerate() {
            let abs = p.path(path);
            match fs.get(&abs) {
                None => missing.push(path.clone()),
                Some(n) if !n.is_dir() => out.push_str(&line(path, n)),
                Some(n) => {
                    if multi {
                        if i > 0 {
                            out.push('\n');
                        }
                        out.push_str(&format!("{path}:\n"));
                    }
                    if all {
                        out.push_str(&line(".", n));
                        out.push_str(&line("..", n));
                    }
                    for (name, child) in fs.list(&abs).unwrap_or_default() {
                        if name.starts_with('.') && !all && !almost {
                            continue;
                        }
                        out.push_str(&line(&name, &child));
                    }
                }
            }
        }
    }
    for path in missing {
        code = fail(&p, format!("ls: {path}: No such file or directory"), 1).await?;
    }
    p.out(out).await;
    Ok(code)
}

async fn mkdir(p: Proc, a: Vec<String>) -> Result<i64> {
    let (f, paths) = flags(&a[1..], "pv");
    let parents = f.contains('p');
    if paths.is_empty() {
        return fail(&p, "mkdir: missing operand", 1).await;
    }
    let mut code = 0;
    for path in paths {
        let now = p.sb.now();
        let r = p.sb.fs().mkdir(&p.path(&path), parents, now);
        if let Err(e) = r {
            code = fail(
                &p,
                format!("mkdir: can't create directory '{path}': {}", e.errno_text()),
                1,
            )
            .await?;
        }
    }
    Ok(code)
}

async fn rm(p: Proc, a: Vec<String>) -> Result<i64> {
    let (f, paths) = flags(&a[1..], "rRfvd");
    let recursive = f.contains('r') || f.contains('R');
    let force = f.contains('f');
    if paths.is_empty() && !force {
        return fail(&p, "rm: missing operand", 1).await;
    }
    let mut code = 0;
    for path in paths {
        let abs = p.path(&path);
        let is_dir = p.sb.fs().get(&abs).map(|n| n.is_dir());
        let msg = match is_dir {
            None if force => continue,
            None => format!("rm: can't remove '{path}': No such file or directory"),
            Some(true) if !recursive => format!("rm: '{path}' is a directory"),
            Some(_) => match p.sb.fs().remove(&abs, true) {
                Ok(()) => continue,
                Err(e) => format!("rm: can't remove '{path}': {}", e.errno_text()),
            },
        };
        code = fail(&p, msg, 1).await?;
    }
    Ok(code)
}

async fn rmdir(p: Proc, a: Vec<String>) -> Result<i64> {
    let mut code = 0;
    for path in &a[1..] {
        let abs = p.path(path);
        let is_dir = p.sb.fs().get(&abs).map(|n| n.is_dir());
        let r = match is_dir {
            Some(true) => p.sb.fs().remove(&abs, false),
            Some(false) => Err(FsError::NotADirectory),
            None => Err(FsError::NotFound),
        };
        if let Err(e) = r {
            code = fail(&p, format!("rmdir: '{path}': {}", e.errno_text()), 1).await?;
        }
    }
    Ok(code)
}

async fn kill(p: Proc, a: Vec<String>) -> Result<i64> {
    let mut probe = false;
    let mut i = 1;
    match a.get(1).map(String::as_str) {
        Some("-l") => {
            return emit(
                &p,
                "HUP INT QUIT ILL TRAP ABRT BUS FPE KILL USR1 SEGV USR2 PIPE ALRM TERM\n",
            )
            .await;
        }
        Some("-s") => i = 3,
        Some("-0") => {
            probe = true;
            i = 2;
        }
        Some(s) if s.starts_with('-') && s.len() > 1 && s != "--" => i = 2,
        _ => {}
    }
    if a.get(i).map(String::as_str) == Some("--") {
        i += 1;
    }
    if i >= a.len() {
        return fail(&p, "kill: usage: kill [-0|-9|-s SIG] PID...", 2).await;
    }
    let mut code = 0;
    let mut self_killed = false;
    for s in &a[i..] {
        let Ok(pid) = s.parse::<u32>() else {
            code = fail(&p, format!("kill: invalid number '{s}'"), 1).await?;
            continue;
        };
        if probe {
            if !p.sb.procs().alive(pid) {
                code = fail(
                    &p,
                    format!("kill: can't kill pid {pid}: No such process"),
                    1,
                )
                .await?;
            }
            continue;
        }
        if pid == crate::processes::INIT_PID {
            code = fail(
                &p,
                format!("kill: can't kill pid {pid}: Operation not permitted"),
                1,
            )
            .await?;
            continue;
        }
        let killed = p.sb.procs().kill(pid);
        match killed {
            Some(handle) => {
                if pid == p.pid {
                    self_killed = true;
                }
                if let Some(h) = handle {
                    h.abort();
                }
            }
            None => {
                code = fail(
                    &p,
                    format!("kill: can't kill pid {pid}: No such process"),
                    1,
                )
                .await?;
            }
        }
    }
    if self_killed {
        // Our own task was aborted: let the cancellation land.
        futures::future::pending::<()>().await;
    }
    Ok(code)
}

/// The first `limit` bytes of a file or device (or stdin).
fn read_prefix(p: &Proc, file: Option<&str>, limit: usize) -> std::result::Result<Bytes, String> {
    let Some(f) = file.filter(|f| *f != "-") else {
        return Ok(p.stdin.slice(..limit.min(p.stdin.len())));
    };
    match p.sb.open(&p.path(f)) {
        Ok(Content::Bytes(b)) => Ok(b.slice(..limit.min(b.len()))),
        Ok(Content::Device(Device::Null)) | Ok(Content::Pseudo(_)) => Ok(Bytes::new()),
        Ok(Content::Device(Device::Zero)) => Ok(Bytes::from(vec![0u8; limit.min(64 << 20)])),
        Ok(Content::Device(Device::Random)) => Ok(Bytes::from(pseudo_random(limit.min(64 << 20)))),
        Err(FsError::IsADirectory) => Err(format!("read error: {f}: Is a directory")),
        Err(e) => Err(format!("can't open '{f}': {}", e.errno_text())),
    }
}

async fn head(p: Proc, a: Vec<String>) -> Result<i64> {
    let mut bytes: Option<usize> = None;
    let mut lines = 10usize;
    let mut files = Vec::new();
    let mut i = 1;
    while i < a.len() {
        let s = &a[i];
        match s.as_str() {
            "-c" | "-n" => {
                let Some(v) = a.get(i + 1).and_then(|v| v.parse::<usize>().ok()) else {
                    return fail(
                        &p,
                        format!(
                            "head: invalid number '{}'",
                            a.get(i + 1).map(String::as_str).unwrap_or("")
                        ),
                        1,
                    )
                    .await;
                };
                if s == "-c" {
                    bytes = Some(v);
                } else {
                    lines = v;
                }
                i += 2;
                continue;
            }
            _ if s.starts_with('-')
                && s.len() > 1
                && s[1..].chars().all(|c| c.is_ascii_digit()) =>
            {
                lines = s[1..].parse().unwrap_or(10);
            }
            _ => files.push(s.clone()),
        }
        i += 1;
    }
    let file = files.first().map(String::as_str);
    let limit = bytes.unwrap_or(64 << 20);
    let data = match read_prefix(&p, file, limit) {
        Ok(d) => d,
        Err(msg) => return fail(&p, format!("head: {msg}"), 1).await,
    };
    let out = if bytes.is_some() {
        data
    } else {
        let mut end = 0;
        let mut seen = 0;
        while seen < lines && end < data.len() {
            match data[end..].iter().position(|&b| b == b'\n') {
                Some(pos) => {
                    end += pos + 1;
                    seen += 1;
                }
                None => end = data.len(),
            }
        }
        data.slice(..end)
    };
    emit(&p, out).await
}

async fn wc(p: Proc, a: Vec<String>) -> Result<i64> {
    let (f, files) = flags(&a[1..], "clwm");
    let file = files.first().map(String::as_str);
    let data = match read_prefix(&p, file, usize::MAX) {
        Ok(d) => d,
        Err(msg) => return fail(&p, format!("wc: {msg}"), 1).await,
    };
    let lines = data.iter().filter(|&&b| b == b'\n').count();
    let words = String::from_utf8_lossy(&data).split_whitespace().count();
    let bytes = data.len();
    let mut cols = Vec::new();
    let all = f.is_empty();
    if all || f.contains('l') {
        cols.push(lines);
    }
    if all || f.contains('w') {
        cols.push(words);
    }
    if all || f.contains('c') || f.contains('m') {
        cols.push(bytes);
    }
    let mut line = if all {
        cols.iter()
            .map(|c| format!("{c:>7}"))
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        cols.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    if let Some(name) = file {
        line.push(' ');
        line.push_str(name);
    }
    line.push('\n');
    emit(&p, line).await
}

async fn id(p: Proc, a: Vec<String>) -> Result<i64> {
    let (f, _) = flags(&a[1..], "ugnGr");
    let uid = p.sb.uid;
    let name = user(&p);
    let text = if f.contains('u') || f.contains('g') || f.contains('G') {
        if f.contains('n') {
            name.to_string()
        } else {
            uid.to_string()
        }
    } else {
        format!("uid={uid}({name}) gid={uid}({name}) groups={uid}({name})")
    };
    emit(&p, format!("{text}\n")).await
}

fn test_unary(p: &Proc, op: &str, arg: &str) -> std::result::Result<bool, String> {
    let node = || p.sb.fs().get_followed(&p.path(arg)).cloned();
    let is_link = || {
        matches!(
            p.sb.fs().get(&p.path(arg)).map(|n| &n.kind),
            Some(memfs::NodeKind::Symlink(_))
        )
    };
    Ok(match op {
        "-e" | "-r" | "-w" => node().is_some(),
        "-f" => node().is_some_and(|n| !n.is_dir()),
        "-d" => node().is_some_and(|n| n.is_dir()),
        "-s" => node().is_some_and(|n| n.size() > 0),
        "-x" => node().is_some_and(|n| n.mode & 0o111 != 0),
        "-L" | "-h" => is_link(),
        "-z" => arg.is_empty(),
        "-n" => !arg.is_empty(),
        _ => return Err(format!("{op}: unary operator expected")),
    })
}

fn test_binary(l: &str, op: &str, r: &str) -> std::result::Result<bool, String> {
    let num = |s: &str| {
        s.trim()
            .parse::<i64>()
            .map_err(|_| format!("{s}: integer expected"))
    };
    Ok(match op {
        "=" | "==" => l == r,
        "!=" => l != r,
        "-eq" => num(l)? == num(r)?,
        "-ne" => num(l)? != num(r)?,
        "-lt" => num(l)? < num(r)?,
        "-le" => num(l)? <= num(r)?,
        "-gt" => num(l)? > num(r)?,
        "-ge" => num(l)? >= num(r)?,
        _ => return Err(format!("{op}: binary operator expected")),
    })
}

fn test_expr(p: &Proc, args: &[String]) -> std::result::Result<bool, String> {
    match args {
        [] => Ok(false),
        [s] => Ok(!s.is_empty()),
        [bang, rest @ ..] if bang == "!" => test_expr(p, rest).map(|b| !b),
        [op, arg] => test_unary(p, op, arg),
        [l, op, r] => test_binary(l, op, r),
        _ => Err("too many arguments".into()),
    }
}

async fn test(p: Proc, a: Vec<String>, bracket: bool) -> Result<i64> {
    let mut args = a[1..].to_vec();
    if bracket {
        if args.last().map(String::as_str) != Some("]") {
            return fail(&p, "[: missing ]", 2).await;
        }
        args.pop();
    }
    match test_expr(&p, &args) {
        Ok(true) => Ok(0),
        Ok(false) => Ok(1),
        Err(msg) => fail(&p, format!("{}: {msg}", a[0]), 2).await,
    }
}

fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.chars().last()? {
        'c' => (&s[..s.len() - 1], 1),
        'w' => (&s[..s.len() - 1], 2),
        'b' => (&s[..s.len() - 1], 512),
        'k' | 'K' => (&s[..s.len() - 1], 1024),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

async fn dd(p: Proc, a: Vec<String>) -> Result<i64> {
    let mut input: Option<String> = None;
    let mut output: Option<String> = None;
    let mut bs: u64 = 512;
    let mut count: Option<u64> = None;
    let mut quiet = false;
    for arg in &a[1..] {
        let Some((k, v)) = arg.split_once('=') else {
            return fail(&p, format!("dd: invalid operand '{arg}'"), 1).await;
        };
        match k {
            "if" => input = Some(v.to_string()),
            "of" => output = Some(v.to_string()),
            "bs" | "ibs" | "obs" => match parse_size(v) {
                Some(n) if n > 0 => bs = n,
                _ => return fail(&p, format!("dd: invalid number '{v}'"), 1).await,
            },
            "count" => match parse_size(v) {
                Some(n) => count = Some(n),
                None => return fail(&p, format!("dd: invalid number '{v}'"), 1).await,
            },
            "status" => quiet = v == "none",
            _ => {}
        }
    }
    let limit = count.map(|c| c.saturating_mul(bs));
    let source = match input.as_deref() {
        None | Some("-") => Content::Bytes(p.stdin.clone()),
        Some(f) => match p.sb.open(&p.path(f)) {
            Ok(c) => c,
            Err(e) => {
                return fail(&p, format!("dd: can't open '{f}': {}", e.errno_text()), 1).await;
            }
        },
    };
    let mut target = p.clone();
    if let Some(of) = &output {
        let path = p.path(of);
        let now = p.sb.now();
        let created = p.sb.fs().write(&path, Vec::new(), false, now);
        if let Err(e) = created {
            return fail(&p, format!("dd: can't open '{of}': {}", e.errno_text()), 1).await;
        }
        target.stdout = crate::exec::Sink::File(path);
    }
    let copied: u64 = match source {
        Content::Bytes(b) => {
            let n = limit.map_or(b.len(), |l| (l as usize).min(b.len()));
            if !target.out(b.slice(..n)).await {
                return Ok(BROKEN_PIPE_EXIT);
            }
            n as u64
        }
        Content::Device(Device::Null) | Content::Pseudo(_) => 0,
        Content::Device(d) => {
            if !stream_device(&target, d, limit).await {
                return Ok(BROKEN_PIPE_EXIT);
            }
            limit.unwrap_or(0)
        }
    };
    if !quiet {
        let full = copied / bs;
        let partial = u64::from(copied % bs != 0);
        p.err(format!(
            "{full}+{partial} records in\n{full}+{partial} records out\n{copied} bytes copied\n"
        ))
        .await;
    }
    Ok(0)
}

async fn touch(p: Proc, a: Vec<String>) -> Result<i64> {
    let (_, paths) = flags(&a[1..], "cam");
    let mut code = 0;
    for path in paths {
        let now = p.sb.now();
        let r = p.sb.fs().touch(&p.path(&path), now);
        if let Err(e) = r {
            code = fail(&p, format!("touch: {path}: {}", e.errno_text()), 1).await?;
        }
    }
    Ok(code)
}

async fn ln(p: Proc, a: Vec<String>) -> Result<i64> {
    let (f, operands) = flags(&a[1..], "sfnv");
    let [target, link] = operands.as_slice() else {
        return fail(&p, "ln: usage: ln [-sf] TARGET LINK", 1).await;
    };
    let mut link_abs = p.path(link);
    if p.sb.fs().get(&link_abs).is_some_and(|n| n.is_dir()) {
        link_abs = memfs::join(&link_abs, memfs::base_name(target));
    }
    let now = p.sb.now();
    let r = {
        let mut fs = p.sb.fs();
        if f.contains('f') && fs.get(&link_abs).is_some_and(|n| !n.is_dir()) {
            let _ = fs.remove(&link_abs, false);
        }
        if f.contains('s') {
            fs.symlink(&link_abs, target, now)
        } else {
            // A hard link is approximated by a copy.
            let src = p.path(target);
            fs.copy(&src, &link_abs, false, now)
        }
    };
    match r {
        Ok(()) => Ok(0),
        Err(e) => fail(&p, format!("ln: {link}: {}", e.errno_text()), 1).await,
    }
}

async fn cp_mv(p: Proc, a: Vec<String>, rename: bool) -> Result<i64> {
    let name = if rename { "mv" } else { "cp" };
    let (f, operands) = flags(&a[1..], "rRafpvnT");
    let recursive = rename || f.contains('r') || f.contains('R') || f.contains('a');
    if operands.len() < 2 {
        return fail(&p, format!("{name}: missing operand"), 1).await;
    }
    let (sources, dest) = operands.split_at(operands.len() - 1);
    let dest_abs = p.path(&dest[0]);
    let dest_is_dir = p.sb.fs().get(&dest_abs).is_some_and(|n| n.is_dir());
    let mut code = 0;
    for src in sources {
        let src_abs = p.path(src);
        let target = if dest_is_dir {
            memfs::join(&dest_abs, memfs::base_name(&src_abs))
        } else {
            dest_abs.clone()
        };
        let now = p.sb.now();
        let src_is_dir = p.sb.fs().get(&src_abs).map(|n| n.is_dir());
        let r = match src_is_dir {
            None => Err(format!(
                "{name}: can't stat '{src}': No such file or directory"
            )),
            Some(true) if !recursive => Err(format!("{name}: omitting directory '{src}'")),
            Some(_) => {
                let mut fs = p.sb.fs();
                let r = if rename {
                    fs.rename(&src_abs, &target, now)
                } else {
                    fs.copy(&src_abs, &target, recursive, now)
                };
                r.map_err(|e| format!("{name}: can't create '{}': {}", dest[0], e.errno_text()))
            }
        };
        if let Err(msg) = r {
            code = fail(&p, msg, 1).await?;
        }
    }
    Ok(code)
}

async fn uname(p: Proc, a: Vec<String>) -> Result<i64> {
    let (f, _) = flags(&a[1..], "asnrvmpio");
    let host = p.sb.hostname();
    let text = if f.contains('a') {
        format!("Linux {host} 6.1.0-fake #1 SMP x86_64 GNU/Linux")
    } else {
        let mut parts = Vec::new();
        for (flag, v) in [
            ('s', "Linux".to_string()),
            ('n', host),
            ('r', "6.1.0-fake".into()),
            ('v', "#1 SMP".into()),
            ('m', "x86_64".into()),
        ] {
            if f.contains(flag) {
                parts.push(v);
            }
        }
        if parts.is_empty() {
            "Linux".to_string()
        } else {
            parts.join(" ")
        }
    };
    emit(&p, format!("{text}\n")).await
}

async fn basename(p: Proc, a: Vec<String>) -> Result<i64> {
    let Some(path) = a.get(1) else {
        return fail(&p, "basename: missing operand", 1).await;
    };
    let trimmed = path.trim_end_matches('/');
    let mut base = trimmed.rsplit('/').next().unwrap_or("").to_string();
    if trimmed.is_empty() && !path.is_empty() {
        base = "/".into();
    }
    if let Some(suffix) = a.get(2) {
        if base.len() > suffix.len() && base.ends_with(suffix.as_str()) {
            base.truncate(base.len() - suffix.len());
        }
    }
    emit(&p, format!("{base}\n")).await
}

async fn dirname(p: Proc, a: Vec<String>) -> Result<i64> {
    let Some(path) = a.get(1) else {
        return fail(&p, "dirname: missing operand", 1).await;
    };
    let trimmed = path.trim_end_matches('/');
    let dir = match trimmed.rfind('/') {
        Some(0) => "/".to_string(),
        Some(i) => trimmed[..i].trim_end_matches('/').to_string(),
        None if path.starts_with('/') => "/".to_string(),
        None => ".".to_string(),
    };
    emit(&p, format!("{dir}\n")).await
}

async fn which(p: Proc, a: Vec<String>) -> Result<i64> {
    let mut out = String::new();
    let mut code = 0;
    for name in &a[1..] {
        if lookup(name, p.sb.has_python).is_some() {
            let dir = if matches!(name.as_str(), "python3" | "python") {
                "/usr/bin"
            } else {
                "/bin"
            };
            out.push_str(&format!("{dir}/{name}\n"));
        } else {
            code = 1;
        }
    }
    p.out(out).await;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn printf_formats_and_reuse() {
        assert_eq!(
            printf_pass("%s-%d\\n", &s(&["a", "7"]), 0),
            ("a-7\n".into(), 2, false)
        );
        assert_eq!(
            printf_pass("[%5s|%-3d|%03d]", &s(&["ab", "1", "7"]), 0).0,
            "[   ab|1  |007]"
        );
        assert_eq!(printf_pass("%x %%", &s(&["255"]), 0).0, "ff %");
        assert!(printf_pass("%d", &s(&["x"]), 0).2);
    }

    #[test]
    fn flags_and_sizes() {
        assert_eq!(
            flags(&s(&["-rf", "a", "-x"]), "rf"),
            ("rf".into(), s(&["a", "-x"]))
        );
        assert_eq!(flags(&s(&["--", "-r"]), "r"), ("".into(), s(&["-r"])));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(
            parse_duration("0.5"),
            Some(Some(Duration::from_millis(500)))
        );
        assert_eq!(parse_duration("2m"), Some(Some(Duration::from_secs(120))));
        assert_eq!(parse_duration("x"), None);
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil(std::time::UNIX_EPOCH), "1970-01-01 00:00");
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(civil(t), "2023-11-14 22:13");
    }

    #[test]
    fn echo_escapes() {
        assert_eq!(unescape("a\\tb\\n"), ("a\tb\n".into(), false));
        assert_eq!(unescape("x\\cy"), ("x".into(), true));
        assert_eq!(unescape("\\0101"), ("A".into(), false));
    }
}
