//! Output: JSON or plain text, optional color, errors, progress for long steps.
//!
//! Writes go through locked handles with `writeln!` instead of `println!`, so a closed pipe
//! (`sandbox reap | head -1`) ends quietly instead of panicking.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use sandbox::SandboxError;
use serde::Serialize;
use serde_json::json;

/// How to print.
#[derive(Debug, Clone, Copy)]
pub struct Out {
    /// `--json`: one JSON object on stdout, nothing decorative anywhere.
    pub json: bool,
    color: bool,
}

impl Out {
    /// Color only when stdout is a terminal and `NO_COLOR` is unset or empty.
    pub fn new(json: bool) -> Self {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Out {
            json,
            color: !json && !no_color && std::io::stdout().is_terminal(),
        }
    }

    /// A line on stdout.
    pub fn line(&self, text: impl AsRef<str>) {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{}", text.as_ref());
    }

    /// A line on stderr.
    pub fn note(&self, text: impl AsRef<str>) {
        let mut e = std::io::stderr().lock();
        let _ = writeln!(e, "{}", text.as_ref());
    }

    /// The command's JSON result, pretty-printed on stdout.
    pub fn json_value(&self, value: &impl Serialize) {
        let text = serde_json::to_string_pretty(value).unwrap_or_else(|e| {
            format!("{{\"error\":{{\"message\":\"serialisation failed: {e}\"}}}}")
        });
        self.line(text);
    }

    /// An error: `{"error": {...}}` on stdout with `--json`, else the rendering on stderr.
    pub fn error(&self, e: &SandboxError) {
        if self.json {
            self.json_value(&error_json(e));
        } else {
            // Messages can carry engine or sandbox text (a helper's stderr).
            let text = crate::terminal::escape_text(&e.render());
            self.note(format!("{} {text}", self.red("error:")));
            self.note(format!("  docs: {}", e.url()));
        }
    }

    /// `text` in green (when color is on).
    pub fn green(&self, text: &str) -> String {
        self.paint("32", text)
    }
    /// `text` in red.
    pub fn red(&self, text: &str) -> String {
        self.paint("31", text)
    }
    /// `text` in yellow.
    pub fn yellow(&self, text: &str) -> String {
        self.paint("33", text)
    }
    /// `text` in bold.
    pub fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }
    /// `ok`/`FAIL` marker.
    pub fn status(&self, ok: bool) -> String {
        if ok {
            self.green("ok")
        } else {
            self.red("FAIL")
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    /// Progress for a step that may be long (image pull/build while creating): a note on
    /// stderr every few seconds once it has taken over 2 s. Only on a terminal, never in
    /// `--json` mode. Stops when the returned guard is dropped.
    pub fn progress(&self, label: &str) -> Progress {
        if self.json || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let label = label.to_string();
        let started = Instant::now();
        Progress(Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(
                tokio::time::Instant::now() + Duration::from_secs(2),
                Duration::from_secs(3),
            );
            loop {
                tick.tick().await;
                let mut e = std::io::stderr().lock();
                let _ = writeln!(e, "… {label} ({}s)", started.elapsed().as_secs());
            }
        })))
    }
}

/// Stops the progress notes when dropped.
pub struct Progress(Option<tokio::task::JoinHandle<()>>);

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

/// `{"error": {"code", "message", "hint", "url"}}`.
pub fn error_json(e: &SandboxError) -> serde_json::Value {
    json!({
        "error": {
            "code": e.code().as_str(),
            "message": e.to_string(),
            "hint": e.hint(),
            "url": e.url(),
        }
    })
}

/// Milliseconds, for JSON and human output.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Strips `user:password@` from an endpoint URL before it is printed.
pub fn redact_endpoint(endpoint: &str) -> String {
    match (endpoint.find("://"), endpoint.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &endpoint[..scheme_end], &endpoint[at + 1..])
        }
        _ => endpoint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_credentials_are_redacted() {
        assert_eq!(
            redact_endpoint("tcp://user:pw@host:2376"),
            "tcp://***@host:2376"
        );
        assert_eq!(
            redact_endpoint("unix:///var/run/docker.sock"),
            "unix:///var/run/docker.sock"
        );
    }

    #[test]
    fn error_json_has_the_four_fields() {
        let e = SandboxError::gone("abc");
        let v = error_json(&e);
        assert_eq!(v["error"]["code"], "SBX_E1204");
        for k in ["message", "hint", "url"] {
            assert!(v["error"][k].is_string(), "{k}");
        }
    }
}
