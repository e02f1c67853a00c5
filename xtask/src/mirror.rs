//! Which Debian mirror debootstrap uses: the one apt is already configured with (CI machines
//! reach only their package mirror), found in `/etc/apt/sources.list` or
//! `/etc/apt/sources.list.d/*.{list,sources}` (one-line and deb822 formats).

use std::fs;
use std::path::Path;

/// The suite the Python image is built from (Debian 12; its python3 is 3.11).
pub const SUITE: &str = "bookworm";

const FALLBACK: &str = "http://deb.debian.org/debian";

/// One `deb` source: its URI and suites.
#[derive(Debug, PartialEq)]
struct Source {
    uri: String,
    suites: Vec<String>,
}

/// The mirror to debootstrap from, and where it came from (for the log).
pub fn debian_mirror() -> (String, String) {
    if let Ok(mirror) = std::env::var("SBX_DEBIAN_MIRROR") {
        return (mirror, "$SBX_DEBIAN_MIRROR".into());
    }
    // A non-Debian host's mirror (Ubuntu's) does not carry bookworm.
    if !host_is_debian() {
        return (FALLBACK.into(), "default; the host is not Debian".into());
    }
    let mut sources = Vec::new();
    let mut files = vec![Path::new("/etc/apt/sources.list").to_path_buf()];
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut extra: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        extra.sort();
        files.extend(extra);
    }
    for file in &files {
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        match file.extension().and_then(|e| e.to_str()) {
            Some("sources") => sources.extend(parse_deb822(&text)),
            _ if file.ends_with("sources.list")
                || file.extension().is_some_and(|e| e == "list") =>
            {
                sources.extend(parse_one_line(&text))
            }
            _ => {}
        }
    }
    match pick(&sources) {
        Some(uri) => (uri, "apt sources".into()),
        None => (
            FALLBACK.into(),
            "default; no Debian mirror in apt sources".into(),
        ),
    }
}

fn host_is_debian() -> bool {
    fs::read_to_string("/etc/os-release")
        .map(|text| text.lines().any(|l| l.trim() == "ID=debian"))
        .unwrap_or(false)
}

/// A source listing bookworm itself first; otherwise any main-archive suite (no `-security`
/// or `-updates` suffix), since a Debian mirror carries every release.
fn pick(sources: &[Source]) -> Option<String> {
    let usable = || sources.iter().filter(|s| !s.uri.starts_with("cdrom:"));
    usable()
        .find(|s| s.suites.iter().any(|suite| suite == SUITE))
        .or_else(|| usable().find(|s| s.suites.iter().any(|suite| !suite.contains('-'))))
        .map(|s| s.uri.trim_end_matches('/').to_string())
}

/// `deb [options] uri suite component...` lines.
fn parse_one_line(text: &str) -> Vec<Source> {
    text.lines()
        .filter_map(|line| {
            let line = line.split('#').next()?.trim();
            let rest = line.strip_prefix("deb ")?.trim_start();
            let rest = match rest.strip_prefix('[') {
                Some(options) => options.split_once(']')?.1,
                None => rest,
            };
            let mut words = rest.split_whitespace();
            let uri = words.next()?.to_string();
            let suite = words.next()?.to_string();
            Some(Source {
                uri,
                suites: vec![suite],
            })
        })
        .collect()
}

/// deb822 stanzas (`Types:`, `URIs:`, `Suites:`, optional `Enabled: no`).
fn parse_deb822(text: &str) -> Vec<Source> {
    let mut sources = Vec::new();
    for stanza in text.split("\n\n") {
        let mut types = Vec::new();
        let mut uris = Vec::new();
        let mut suites = Vec::new();
        let mut enabled = true;
        for line in stanza.lines().filter(|l| !l.trim_start().starts_with('#')) {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let words = || value.split_whitespace().map(str::to_string);
            match key.trim().to_ascii_lowercase().as_str() {
                "types" => types = words().collect(),
                "uris" => uris = words().collect(),
                "suites" => suites = words().collect(),
                "enabled" => enabled = value.trim() != "no",
                _ => {}
            }
        }
        if enabled && types.iter().any(|t| t == "deb") {
            sources.extend(uris.into_iter().map(|uri| Source {
                uri,
                suites: suites.clone(),
            }));
        }
    }
    sources
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deb822_debian_sources_give_the_main_mirror() {
        let text = "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
                    URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n\
                    Components: main\n\n\
                    Types: deb\nURIs: http://deb.debian.org/debian-security\n\
                    Suites: bookworm-security\nComponents: main\n";
        let sources = parse_deb822(text);
        assert_eq!(sources.len(), 2);
        assert_eq!(pick(&sources).unwrap(), "http://deb.debian.org/debian");
    }

    #[test]
    fn disabled_and_source_only_stanzas_are_ignored() {
        let text = "Types: deb-src\nURIs: http://a/debian\nSuites: bookworm\n\n\
                    Types: deb\nURIs: http://b/debian\nSuites: bookworm\nEnabled: no\n";
        assert!(parse_deb822(text).is_empty());
    }

    #[test]
    fn one_line_sources_with_options_are_parsed() {
        let text = "# comment\ndeb-src http://x/debian bookworm main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main\n\
                    deb http://security.debian.org/debian-security bookworm-security main\n";
        let sources = parse_one_line(text);
        assert_eq!(sources.len(), 2);
        assert_eq!(pick(&sources).unwrap(), "http://mirror.example/debian");
    }

    #[test]
    fn another_release_mirror_still_serves_bookworm() {
        let sources = parse_one_line(
            "deb http://m/debian trixie main\ndeb http://s/debian-security trixie-security main\n",
        );
        assert_eq!(pick(&sources).unwrap(), "http://m/debian");
    }
}
