//! What a plugin's `log` call may write: its message and fields cut to size
//! and escaped so they cannot start a line of their own (log forging) or
//! drive a terminal, at a rate a plugin cannot turn into a flood.

use std::time::Instant;

use parking_lot::Mutex;

/// The longest message written, in bytes; the rest is cut.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4096;
/// The most fields written per line; the rest are counted.
pub(crate) const MAX_FIELDS: usize = 32;
pub(crate) const MAX_KEY_BYTES: usize = 64;
pub(crate) const MAX_VALUE_BYTES: usize = 1024;

/// `text`, at most `max` bytes of it, with control characters and Unicode
/// line and paragraph separators escaped (`\n`, `\u{1b}`, …).
pub(crate) fn escape(text: &str, max: usize) -> String {
    let kept = &text[..text.floor_char_boundary(max)];
    let mut out = String::with_capacity(kept.len() + 16);
    for c in kept.chars() {
        if c.is_control() || c == '\u{2028}' || c == '\u{2029}' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if kept.len() < text.len() {
        out.push_str(&format!("…(+{} bytes)", text.len() - kept.len()));
    }
    out
}

/// The fields as `key=value` pairs on one line. Keys keep only
/// `[A-Za-z0-9_.-]`; values are escaped, and quoted if they hold a space,
/// a quote or an `=` (so a value cannot pose as another field).
pub(crate) fn fields(fields: &[(String, String)]) -> String {
    let mut out = String::new();
    for (key, value) in fields.iter().take(MAX_FIELDS) {
        if !out.is_empty() {
            out.push(' ');
        }
        let key: String = key[..key.floor_char_boundary(MAX_KEY_BYTES)]
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '_' })
            .collect();
        out.push_str(if key.is_empty() { "_" } else { &key });
        out.push('=');
        let value = escape(value, MAX_VALUE_BYTES);
        if value.is_empty() || value.contains([' ', '"', '=']) {
            out.push('"');
            out.push_str(&value.replace('\\', "\\\\").replace('"', "\\\""));
            out.push('"');
        } else {
            out.push_str(&value);
        }
    }
    if fields.len() > MAX_FIELDS {
        out.push_str(&format!(" fields_dropped={}", fields.len() - MAX_FIELDS));
    }
    out
}

/// A token bucket per plugin: `rate` lines a second, in bursts of up to
/// twice that; lines past it are dropped and counted.
pub(crate) struct RateLimit {
    rate: f64,
    state: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    last: Instant,
    dropped: u64,
}

/// Whether a line may be written.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Write it; `dropped` lines were dropped since the last one written.
    Write {
        dropped: u64,
    },
    Drop,
}

impl RateLimit {
    pub fn new(lines_per_second: u32) -> Self {
        let rate = f64::from(lines_per_second.max(1));
        Self { rate, state: Mutex::new(Bucket { tokens: 2.0 * rate, last: Instant::now(), dropped: 0 }) }
    }

    pub fn admit(&self, now: Instant) -> Admit {
        let mut bucket = self.state.lock();
        let refill = now.saturating_duration_since(bucket.last).as_secs_f64() * self.rate;
        bucket.tokens = (bucket.tokens + refill).min(2.0 * self.rate);
        bucket.last = now;
        if bucket.tokens < 1.0 {
            bucket.dropped += 1;
            return Admit::Drop;
        }
        bucket.tokens -= 1.0;
        Admit::Write { dropped: std::mem::take(&mut bucket.dropped) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn control_characters_and_line_separators_are_escaped() {
        let forged = "one\n2030-01-01T00:00:00Z ERROR forged\r\x1b[2K\u{2028}x\u{85}\ttab";
        let escaped = escape(forged, MAX_MESSAGE_BYTES);
        assert_eq!(escaped, r"one\n2030-01-01T00:00:00Z ERROR forged\r\u{1b}[2K\u{2028}x\u{85}\ttab");
        assert!(!escaped.chars().any(|c| c.is_control()));
        assert_eq!(escape("plain text, naïve", 100), "plain text, naïve");
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let text = "é".repeat(10); // 20 bytes
        assert_eq!(escape(&text, 5), "éé…(+16 bytes)");
        assert_eq!(escape(&"x".repeat(10_000), MAX_MESSAGE_BYTES).len(), MAX_MESSAGE_BYTES + "…(+5904 bytes)".len());
    }

    #[test]
    fn fields_cannot_break_the_line_or_pose_as_other_fields() {
        let line = fields(&[
            ("user\nFORGED".into(), "x\nFORGED".into()),
            ("k".into(), "a b=c".into()),
            ("q".into(), r#"say "hi""#.into()),
            ("".into(), "".into()),
            ("usage".into(), "1/2/3".into()),
        ]);
        assert_eq!(line, r#"user_FORGED=x\nFORGED k="a b=c" q="say \"hi\"" _="" usage=1/2/3"#);
    }

    #[test]
    fn fields_are_capped_in_number_and_size() {
        let many: Vec<(String, String)> = (0..100).map(|i| (format!("k{i}"), "v".repeat(5000))).collect();
        let line = fields(&many);
        assert_eq!(line.matches('=').count(), MAX_FIELDS + 1);
        assert!(line.ends_with(" fields_dropped=68"), "{}", &line[line.len() - 40..]);
        assert!(line.len() < MAX_FIELDS * (MAX_VALUE_BYTES + 32), "{}", line.len());
        let long_key = fields(&[("k".repeat(1000), "v".into())]);
        assert_eq!(long_key, format!("{}=v", "k".repeat(MAX_KEY_BYTES)));
    }

    #[test]
    fn a_flood_is_cut_to_the_rate_and_the_dropped_lines_are_counted() {
        let limit = RateLimit::new(10);
        let start = Instant::now();
        let written = (0..1000).filter(|_| limit.admit(start) != Admit::Drop).count();
        assert_eq!(written, 20, "a burst of twice the rate");
        // Half a second later, five more lines, the first reporting the drops.
        let later = start + Duration::from_millis(500);
        assert_eq!(limit.admit(later), Admit::Write { dropped: 980 });
        let more = (0..100).filter(|_| limit.admit(later) != Admit::Drop).count();
        assert_eq!(more, 4);
    }
}
