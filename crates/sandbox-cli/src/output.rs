//! Output: JSON or plain text, optional color, errors, progress for long steps.
//!
//! Writes go through locked handles with `writeln!` instead of `println!`, so a closed pipe
//! (`sandbox reap | head -1`) ends quietly instead of panicking.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
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
                // A pull draws its own bar on this line.
                if PULL_BAR_ACTIVE.load(Ordering::Relaxed) {
                    continue;
                }
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

/// The `tracing` target of the library's pull events (`sandbox_container::image::PULL_TARGET`;
/// the CLI sees the library only through the `sandbox` facade).
const PULL_TARGET: &str = "sandbox_container::pull";

/// The events a [`PullBar`] reads (the per-event `pull progress` ones are `DEBUG`).
pub fn pull_events() -> tracing_subscriber::filter::Targets {
    tracing_subscriber::filter::Targets::new().with_target(PULL_TARGET, tracing::Level::DEBUG)
}

/// Set while a pull bar is drawn, so the "… creating sandbox" notes keep off its line.
static PULL_BAR_ACTIVE: AtomicBool = AtomicBool::new(false);

/// A progress bar for image pulls, drawn on stderr from the library's pull events
/// (`pulling image`, `pull progress` per engine message, `pulled image` / `pull
/// failed`). Only on a terminal and never with `--json`: [`PullBar::layer`] is `None`
/// otherwise.
#[derive(Debug, Default)]
pub struct PullBar {
    state: Mutex<BarState>,
}

#[derive(Debug, Default)]
struct BarState {
    image: String,
    started: Option<Instant>,
    /// Layer → (bytes done, size), as the engine last reported them.
    layers: BTreeMap<String, (u64, u64)>,
    status: String,
    events: u64,
}

impl BarState {
    fn line(&self) -> String {
        let (done, total) = self.layers.values().fold((0u64, 0u64), |(d, t), (c, s)| {
            (d.saturating_add(*c.min(s)), t.saturating_add(*s))
        });
        let width = 24usize;
        let filled = done
            .saturating_mul(width as u64)
            .checked_div(total)
            .map_or(0, |f| usize::try_from(f).unwrap_or(width));
        let bytes = if total == 0 {
            String::new()
        } else {
            format!(" {} / {}", human_bytes(done), human_bytes(total))
        };
        format!(
            "pulling {} [{}{}]{bytes} {}",
            self.image,
            "#".repeat(filled.min(width)),
            ".".repeat(width - filled.min(width)),
            self.status
        )
    }
}

/// `1.2 MB`-style sizes for the bar.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "kB", "MB", "GB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Reads the fields of one pull event.
#[derive(Default)]
struct PullFields {
    message: String,
    image: String,
    layer: String,
    status: String,
    current: u64,
    total: u64,
}

impl tracing::field::Visit for PullFields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "image" => self.image = value.to_string(),
            "layer" => self.layer = value.to_string(),
            "status" => self.status = value.to_string(),
            "message" => self.message = value.to_string(),
            _ => {}
        }
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        match field.name() {
            "current" => self.current = value,
            "total" => self.total = value,
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        let text = text.trim_matches('"').to_string();
        self.record_str(field, &text);
    }
}

impl PullBar {
    /// The layer to install: `None` with `--json` or when stderr is not a terminal.
    pub fn layer(json: bool) -> Option<PullBar> {
        (!json && std::io::stderr().is_terminal()).then(PullBar::default)
    }

    /// Applies one event; returns what to print (the bar line, or a final line).
    fn apply(&self, f: PullFields) -> Option<String> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match f.message.as_str() {
            "pulling image" => {
                *st = BarState {
                    image: f.image,
                    started: Some(Instant::now()),
                    ..BarState::default()
                };
                PULL_BAR_ACTIVE.store(true, Ordering::Relaxed);
                Some(format!("\r\x1b[2K{}", st.line()))
            }
            "pull progress" => {
                st.events += 1;
                if !f.layer.is_empty() && f.total > 0 {
                    st.layers.insert(f.layer, (f.current, f.total));
                } else if !f.layer.is_empty() && f.status.contains("complete") {
                    // "Pull complete" carries no sizes: the layer is done.
                    if let Some((c, t)) = st.layers.get_mut(&f.layer) {
                        *c = *t;
                    }
                }
                st.status = crate::terminal::escape_text(&f.status)
                    .chars()
                    .take(40)
                    .collect();
                Some(format!("\r\x1b[2K{}", st.line()))
            }
            "pulled image" | "pull failed" => {
                PULL_BAR_ACTIVE.store(false, Ordering::Relaxed);
                let secs = st.started.map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0);
                let verb = if f.message == "pulled image" {
                    "pulled"
                } else {
                    "pull failed:"
                };
                Some(format!(
                    "\r\x1b[2K{verb} {} ({secs:.1} s, {} progress messages)\n",
                    st.image, st.events
                ))
            }
            _ => None,
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PullBar {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if event.metadata().target() != PULL_TARGET {
            return;
        }
        let mut fields = PullFields::default();
        event.record(&mut fields);
        if let Some(text) = self.apply(fields) {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "{text}");
            let _ = e.flush();
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

    fn event(message: &str, layer: &str, status: &str, current: u64, total: u64) -> PullFields {
        PullFields {
            message: message.into(),
            image: "127.0.0.1:5000/sbx/busybox:1".into(),
            layer: layer.into(),
            status: status.into(),
            current,
            total,
        }
    }

    #[test]
    fn pull_bar_sums_layers_and_ends_with_a_line() {
        let bar = PullBar::default();
        let start = bar.apply(event("pulling image", "", "", 0, 0)).unwrap();
        assert!(start.contains("pulling 127.0.0.1:5000/sbx/busybox:1"));
        assert!(PULL_BAR_ACTIVE.load(Ordering::Relaxed));
        bar.apply(event("pull progress", "a", "Downloading", 500, 1000));
        let line = bar
            .apply(event("pull progress", "b", "Downloading", 0, 1000))
            .unwrap();
        assert!(line.contains("500 B / 2.0 kB"), "{line}");
        assert!(
            line.contains(&format!("[{}{}]", "#".repeat(6), ".".repeat(18))),
            "{line}"
        );
        let line = bar
            .apply(event("pull progress", "a", "Pull complete", 0, 0))
            .unwrap();
        assert!(line.contains("1.0 kB / 2.0 kB"), "{line}");
        let end = bar.apply(event("pulled image", "", "", 0, 0)).unwrap();
        assert!(
            end.ends_with('\n') && end.contains("3 progress messages"),
            "{end}"
        );
        assert!(!PULL_BAR_ACTIVE.load(Ordering::Relaxed));
        assert!(bar.apply(event("something else", "", "", 0, 0)).is_none());
    }

    #[test]
    fn pull_bar_escapes_engine_text() {
        let bar = PullBar::default();
        bar.apply(event("pulling image", "", "", 0, 0));
        let line = bar
            .apply(event("pull progress", "", "\x1b]0;owned\x07", 0, 0))
            .unwrap();
        assert!(!line.contains('\x07'), "{line:?}");
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
