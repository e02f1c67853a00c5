//! Text from a sandbox (or from labels anyone can set) on a terminal.
//!
//! A terminal obeys the bytes it is given: ESC and CSI sequences move the cursor, clear the
//! screen and rewrite earlier lines (so sandboxed code can forge what `sandbox run` appears
//! to have printed, or hide its own output); OSC sequences set the window title, write the
//! clipboard (OSC 52) and make links (OSC 8); some terminals answer queries by typing into
//! the shell. So every control character but `\n` and `\t` is shown as a visible escape
//! (`\x1b`, `\u{9b}`), and so is every byte that is not UTF-8 (a lone `0x9b` is CSI to
//! 8-bit terminals). Printable text, including all non-ASCII characters, passes unchanged.

/// Escapes one byte stream for a terminal, chunk by chunk: a UTF-8 character split
/// across two chunks is held back and passed whole, not escaped as two broken halves.
#[derive(Debug, Default)]
pub struct TerminalEscaper {
    /// The start of an incomplete UTF-8 sequence at the end of the last chunk (≤ 3 bytes).
    pending: Vec<u8>,
}

impl TerminalEscaper {
    /// The escaped form of `data` (possibly holding its last 1–3 bytes back).
    pub fn push(&mut self, data: &[u8]) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(data);
        let mut out = String::with_capacity(buf.len());
        let mut rest = buf.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    escape_into(s, &mut out);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is UTF-8 by construction of `valid_up_to`.
                    escape_into(std::str::from_utf8(valid).unwrap_or_default(), &mut out);
                    match e.error_len() {
                        // Incomplete at the end: wait for the next chunk.
                        None => {
                            self.pending = after.to_vec();
                            break;
                        }
                        Some(n) => {
                            let (bad, next) = after.split_at(n.min(after.len()));
                            bad.iter().for_each(|b| push_byte_escape(*b, &mut out));
                            rest = next;
                        }
                    }
                }
            }
        }
        out.into_bytes()
    }

    /// What is still held back, escaped (the stream ended inside a character).
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = String::new();
        std::mem::take(&mut self.pending)
            .iter()
            .for_each(|b| push_byte_escape(*b, &mut out));
        out.into_bytes()
    }
}

/// `text` with every control character but `\n` and `\t` escaped.
pub fn escape_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    escape_into(text, &mut out);
    out
}

fn escape_into(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            // C0 and DEL.
            '\0'..='\x1f' | '\x7f' => push_byte_escape(c as u8, out),
            // C1 (U+0080–U+009F: CSI is U+009B, OSC U+009D).
            '\u{80}'..='\u{9f}' => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            _ => out.push(c),
        }
    }
}

fn push_byte_escape(b: u8, out: &mut String) {
    out.push_str(&format!("\\x{b:02x}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(data: &[u8]) -> String {
        let mut e = TerminalEscaper::default();
        let mut out = e.push(data);
        out.extend(e.finish());
        String::from_utf8(out).expect("escaped output is UTF-8")
    }

    #[test]
    fn csi_and_osc_sequences_are_shown_not_obeyed() {
        // Clear screen + home, a forged prompt, a window title, a clipboard write.
        assert_eq!(escaped(b"\x1b[2J\x1b[Hok"), "\\x1b[2J\\x1b[Hok");
        assert_eq!(
            escaped(b"\x1b]0;pwned\x07\x1b]52;c;ZWNobyBoaQ==\x1b\\"),
            "\\x1b]0;pwned\\x07\\x1b]52;c;ZWNobyBoaQ==\\x1b\\"
        );
    }

    #[test]
    fn newline_and_tab_pass_every_other_c0_and_del_do_not() {
        assert_eq!(escaped(b"a\tb\nc"), "a\tb\nc");
        assert_eq!(escaped(b"done\rFAKE"), "done\\x0dFAKE");
        assert_eq!(escaped(b"\x00\x08\x7f"), "\\x00\\x08\\x7f");
        for b in (0u8..0x20).chain([0x7f]) {
            let out = escaped(&[b]);
            if b == b'\n' || b == b'\t' {
                assert_eq!(out.as_bytes(), [b]);
            } else {
                assert!(
                    out.bytes().all(|c| c >= 0x20 && c != 0x7f),
                    "{b:#x}: {out:?}"
                );
            }
        }
    }

    #[test]
    fn c1_controls_are_escaped_in_utf8_and_as_raw_bytes() {
        // U+009B (CSI) encoded in UTF-8, and a raw 0x9b byte (CSI for 8-bit terminals).
        assert_eq!(escaped("\u{9b}31m".as_bytes()), "\\u{9b}31m");
        assert_eq!(escaped(b"\x9b31m"), "\\x9b31m");
        assert_eq!(escaped(b"\xc2\x9d0;t\xc2\x9c"), "\\u{9d}0;t\\u{9c}");
    }

    #[test]
    fn printable_unicode_passes_unchanged() {
        let text = "héllo wörld → ✓ 日本語 🦀";
        assert_eq!(escaped(text.as_bytes()), text);
    }

    #[test]
    fn characters_split_across_chunks_pass_whole() {
        let crab = "🦀".as_bytes();
        let mut e = TerminalEscaper::default();
        let mut out = e.push(&crab[..1]);
        out.extend(e.push(&crab[1..3]));
        out.extend(e.push(&crab[3..]));
        out.extend(e.finish());
        assert_eq!(out, crab);
        // An escape sequence split across chunks is escaped all the same.
        let mut e = TerminalEscaper::default();
        let mut out = e.push(b"\x1b");
        out.extend(e.push(b"[2J"));
        assert_eq!(out, b"\\x1b[2J");
    }

    #[test]
    fn a_stream_ending_mid_character_is_flushed_escaped() {
        assert_eq!(escaped(&"🦀".as_bytes()[..2]), "\\xf0\\x9f");
        assert_eq!(escaped(b"ok\xff"), "ok\\xff");
    }

    #[test]
    fn output_never_contains_a_control_byte_but_newline_and_tab() {
        // Every 1- and 2-byte input, through one push and through two.
        for a in 0u8..=255 {
            for b in 0u8..=255 {
                let whole = escaped(&[a, b]);
                let mut e = TerminalEscaper::default();
                let mut split = e.push(&[a]);
                split.extend(e.push(&[b]));
                split.extend(e.finish());
                assert_eq!(whole.as_bytes(), split, "{a:#x} {b:#x}");
                for c in whole.chars() {
                    let control = c.is_control() && c != '\n' && c != '\t';
                    assert!(!control, "{a:#x} {b:#x}: {whole:?}");
                }
            }
        }
    }

    #[test]
    fn label_text_is_escaped() {
        assert_eq!(escape_text("team=\x1b[31mred"), "team=\\x1b[31mred");
    }
}
