//! The access log: one line per request at `info`, target `sluice::access`.
//! It never holds prompt text or secrets: only what the gateway decided
//! (route, model, backend, status, plugin outcomes) and what it measured.
//!
//! Written straight into the line, with no JSON tree in between and no
//! `core::fmt`: it runs for every request. Formatted with `write!`, the line
//! cost the plain hop 16.6 thousand instructions a request (callgrind), a
//! seventh of all it ran.

use std::time::{Duration, SystemTime};

use crate::logging::{LogFormat, push_zero_padded, write_access, write_timestamp};
use crate::record::RequestRecord;

pub(crate) fn log(record: &RequestRecord, duration: Duration) {
    write_access(|format, out| {
        let mut line = Line { out, format };
        match format {
            LogFormat::Json => {
                line.out.push_str(r#"{"timestamp":""#);
                write_timestamp(line.out, SystemTime::now());
                line.out.push_str(r#"","level":"INFO","target":"sluice::access","message":"request""#);
            }
            LogFormat::Text => {
                write_timestamp(line.out, SystemTime::now());
                line.out.push_str("  INFO sluice::access: request");
            }
        }
        fields(record, duration, &mut line);
        if format == LogFormat::Json {
            line.out.push('}');
        }
    });
}

/// A field's name as each format writes it before the value, put together
/// at compile time: `,"name":` and ` name=`.
#[derive(Clone, Copy)]
struct Key {
    json: &'static str,
    text: &'static str,
}

macro_rules! key {
    ($name:literal) => {
        Key { json: concat!(",\"", $name, "\":"), text: concat!(" ", $name, "=") }
    };
}

/// A line being written: `,"key":value` in JSON, ` key=value` in text
/// (values as JSON would write them, so a string cannot pose as another
/// field or start a line; text leaves out what is null).
struct Line<'a> {
    out: &'a mut String,
    format: LogFormat,
}

impl Line<'_> {
    fn key(&mut self, key: Key) {
        self.out.push_str(match self.format {
            LogFormat::Json => key.json,
            LogFormat::Text => key.text,
        });
    }

    fn str(&mut self, key: Key, value: Option<&str>) {
        match value {
            Some(value) => {
                self.key(key);
                json_string(self.out, value);
            }
            None => self.null(key),
        }
    }

    fn int(&mut self, key: Key, value: Option<impl itoa::Integer>) {
        match value {
            Some(value) => {
                self.key(key);
                self.out.push_str(itoa::Buffer::new().format(value));
            }
            None => self.null(key),
        }
    }

    /// Milliseconds to the microsecond, as an `f64` of them would print.
    fn ms(&mut self, key: Key, value: Option<Duration>) {
        match value {
            Some(value) => {
                self.key(key);
                write_ms(self.out, value);
            }
            None => self.null(key),
        }
    }

    fn bool(&mut self, key: Key, value: bool) {
        self.key(key);
        self.out.push_str(if value { "true" } else { "false" });
    }

    fn null(&mut self, key: Key) {
        if self.format == LogFormat::Json {
            self.key(key);
            self.out.push_str("null");
        }
    }
}

/// `duration` in milliseconds, rounded to the microsecond, written as `{}`
/// wrote the `f64` of them this replaced (`1.5`, `12`, `0.003`): the same
/// text for every duration a request can take, without the float.
fn write_ms(out: &mut String, duration: Duration) {
    let micros = duration.as_nanos().saturating_add(500) / 1000;
    out.push_str(itoa::Buffer::new().format(micros / 1000));
    let mut fraction = (micros % 1000) as u16;
    if fraction == 0 {
        return;
    }
    let mut digits = 3;
    while fraction.is_multiple_of(10) {
        fraction /= 10;
        digits -= 1;
    }
    out.push('.');
    push_zero_padded(out, u32::from(fraction), digits);
}

fn fields(record: &RequestRecord, duration: Duration, line: &mut Line) {
    let upstream = record.attempts.last().map(|a| a.end.saturating_sub(a.start));
    line.str(key!("request_id"), Some(&record.id));
    line.str(key!("method"), Some(&record.method));
    line.str(key!("path"), Some(&record.path));
    line.str(key!("route"), record.route.as_deref());
    line.str(key!("model"), record.model.as_deref());
    line.str(key!("requested_model"), record.requested_model.as_deref());
    line.str(key!("backend"), record.backend.as_deref());
    line.int(key!("status"), Some(record.status));
    line.str(key!("error_code"), record.error_code);
    line.bool(key!("streamed"), record.streamed);
    line.bool(key!("completed"), record.completed);
    line.ms(key!("duration_ms"), Some(duration));
    line.ms(key!("time_to_first_token_ms"), record.first_byte);
    line.ms(key!("upstream_ms"), upstream);
    line.int(key!("attempts"), Some(record.attempts.len()));
    line.int(key!("input_tokens"), record.tokens.map(|t| t.input));
    line.int(key!("output_tokens"), record.tokens.map(|t| t.output));
    line.str(key!("response_model"), record.response_model.as_deref());
    line.str(key!("consumer"), record.consumer.as_deref());
    // Only on MCP routes: a chat request's line keeps its fields.
    if let Some(method) = &record.mcp_method {
        line.str(key!("mcp_method"), Some(method));
        line.str(key!("tool"), record.tool.as_deref());
    }
    line.int(key!("response_bytes"), Some(record.response_bytes));
    line.key(key!("plugins"));
    let out = &mut *line.out;
    out.push('[');
    for (i, calls) in record.plugins.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let plugin = &calls.plugin;
        out.push_str(plugin.access.get_or_init(|| {
            // Resource names are DNS labels; escaped all the same.
            let mut written = String::from(r#"{"plugin":""#);
            escaped(&mut written, &plugin.namespace);
            written.push('/');
            escaped(&mut written, &plugin.name);
            written.push_str(r#"","digest":"#);
            json_string(&mut written, &plugin.digest);
            written.into()
        }));
        out.push_str(r#","hook":""#);
        out.push_str(calls.hook.as_str());
        out.push_str(r#"","outcome":""#);
        out.push_str(calls.outcome.as_str());
        out.push_str(r#"","calls":"#);
        out.push_str(itoa::Buffer::new().format(calls.calls));
        out.push_str(r#","duration_us":"#);
        out.push_str(itoa::Buffer::new().format(calls.busy.as_micros()));
        out.push_str(r#","skipped":"#);
        out.push_str(if calls.skipped { "true" } else { "false" });
        out.push('}');
    }
    out.push(']');
    line.str(key!("trace_id"), record.trace.as_ref().map(|t| t.trace_id_hex()).as_deref());
}

/// `text` as a JSON string: quotes, backslashes and control characters
/// escaped.
fn json_string(out: &mut String, text: &str) {
    out.push('"');
    escaped(out, text);
    out.push('"');
}

/// `text` escaped for the inside of a JSON string (and of a log line: no
/// line or paragraph separator either).
fn escaped(out: &mut String, text: &str) {
    // Most values are printable ASCII with nothing to escape: one pass over
    // the bytes, then one copy.
    if plain_ascii(text.as_bytes()) {
        out.push_str(text);
        return;
    }
    let mut plain = 0;
    for (i, c) in text.char_indices() {
        let escape = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => "",
            _ => continue,
        };
        out.push_str(&text[plain..i]);
        if escape.is_empty() {
            // `\u` and four hex digits: control characters and the two
            // separators are all under U+FFFF.
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u");
            let code = c as u32;
            for shift in [12, 8, 4, 0] {
                out.push(HEX[((code >> shift) & 0xf) as usize] as char);
            }
        } else {
            out.push_str(escape);
        }
        plain = i + c.len_utf8();
    }
    out.push_str(&text[plain..]);
}

/// No byte of `bytes` needs a look: all printable ASCII, no `"` or `\`.
/// Eight bytes at a time (the bit tricks of Hacker's Delight 6-1, exact
/// for "some byte is zero" and "some byte is under n" with n ≤ 128): the
/// byte by byte test was a third of the access line's instructions.
fn plain_ascii(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let under = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH != 0;
    let has = |word: u64, byte: u8| under(word ^ (ONES * u64::from(byte)), 1);
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let word = u64::from_ne_bytes(word.try_into().unwrap_or_default());
        // 0x7f and up: 0x7f + 1 sets the high bit; carries only come out of
        // bytes whose high bit is set already.
        let high = (word | word.wrapping_add(ONES)) & HIGH != 0;
        if high || under(word, 0x20) || has(word, b'"') || has(word, b'\\') {
            return false;
        }
    }
    words.remainder().iter().all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the line wrote before `write_ms`: the milliseconds as an `f64`.
    fn ms(duration: Duration) -> f64 {
        (duration.as_secs_f64() * 1e6).round() / 1e3
    }

    #[test]
    fn milliseconds_read_as_the_float_they_replace() {
        let mut nanos: Vec<u64> = vec![0, 1, 499, 500, 999, 1_000, 1_499, 1_500, 1_000_000, 1_234_567, 59_999_999_999];
        // Every fraction of a millisecond, and a spread of larger durations.
        nanos.extend((0..3_000_000).step_by(997));
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Up to 73 minutes. Beyond about a day, the float itself misrounds
            // a duration of an exact half microsecond (545562284453500 ns
            // came out as ….453); the integers round it up, as they should.
            nanos.push(seed % (1 << 42));
        }
        for n in nanos {
            let duration = Duration::from_nanos(n);
            let mut out = String::new();
            write_ms(&mut out, duration);
            assert_eq!(out, format!("{}", ms(duration)), "{n} ns");
        }
    }

    #[test]
    fn plain_ascii_agrees_with_a_byte_by_byte_test() {
        let bytewise = |bytes: &[u8]| bytes.iter().all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
        // Every byte value at every position of words of one to 17 bytes, in
        // otherwise plain text; then random bytes leaning to the edges.
        for len in 1..=17 {
            for at in 0..len {
                for byte in 0..=255u8 {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = byte;
                    assert_eq!(plain_ascii(&bytes), bytewise(&bytes), "{bytes:?}");
                }
            }
        }
        let edges = [0x00, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x5b, 0x5c, 0x5d, 0x7e, 0x7f, 0x80, 0xff, b'a'];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..50_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 40) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| edges[((seed >> (i % 60)) % edges.len() as u64) as usize]).collect();
            assert_eq!(plain_ascii(&bytes), bytewise(&bytes), "{bytes:?}");
        }
    }

    #[test]
    fn escaping_agrees_with_serde_json_on_every_character_class() {
        let mut texts: Vec<String> =
            (0u32..0x250).chain(0x2000..0x2030).filter_map(char::from_u32).map(String::from).collect();
        texts
            .extend(["plain-ascii_1.2", "mixed \"q\" and \\ and \u{7f}\u{85}é", "\u{2028}x\u{2029}"].map(String::from));
        for text in texts {
            let mut out = String::new();
            json_string(&mut out, &text);
            let parsed: String = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"));
            assert_eq!(parsed, text);
            assert!(!out.chars().any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}'), "{out:?}");
        }
    }

    #[test]
    fn timestamps_read_as_tracing_subscribers() {
        use tracing_subscriber::fmt::format::Writer;
        use tracing_subscriber::fmt::time::FormatTime;
        // Written twice per try, tracing-subscriber's around ours: when both
        // of its stamps fall in one second, ours must match them to the second.
        let mut matched = 0;
        while matched < 20 {
            let mut before = String::new();
            let _ = tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut before));
            let mut ours = String::new();
            write_timestamp(&mut ours, SystemTime::now());
            let mut after = String::new();
            let _ = tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut after));
            assert_eq!(ours.len(), before.len(), "{ours} against {before}");
            assert!(before <= ours && ours <= after, "{before} <= {ours} <= {after}");
            if before[..19] == after[..19] {
                assert_eq!(ours[..19], before[..19]);
                matched += 1;
            }
        }
        // Dates far apart, against chrono's RFC 3339 with microseconds.
        for second in [0u64, 951_782_400, 1_709_164_799, 1_796_083_200, 4_102_444_800, 253_402_300_799] {
            for micros in [0u32, 7, 123_456, 999_999] {
                let time = SystemTime::UNIX_EPOCH + Duration::new(second, micros * 1000);
                let mut ours = String::new();
                write_timestamp(&mut ours, time);
                let expected =
                    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
                assert_eq!(ours, expected);
            }
        }
    }

    #[test]
    fn strings_are_valid_json_that_cannot_break_the_line() {
        for text in ["plain", "quo\"te", "back\\slash", "new\nline", "\u{1b}[31m", "tab\t", "é — 東京", "\u{2028}", ""]
        {
            let mut out = String::new();
            json_string(&mut out, text);
            assert!(!out.contains('\n') && !out.contains('\u{1b}') && !out.contains('\u{2028}'), "{out}");
            let parsed: String = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
            assert_eq!(parsed, text);
        }
    }

    #[test]
    fn a_json_line_is_one_object_and_text_leaves_out_nulls() {
        let mut record = RequestRecord::new("id-1".into(), "POST", "/v1/chat/completions");
        record.status = 404;
        record.error_code = Some("model_not_found");
        for format in [LogFormat::Json, LogFormat::Text] {
            let mut out = String::new();
            let mut line = Line { out: &mut out, format };
            if format == LogFormat::Json {
                line.out.push_str(r#"{"message":"request""#);
            }
            fields(&record, Duration::from_micros(1500), &mut line);
            if format == LogFormat::Json {
                out.push('}');
                let parsed: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
                assert_eq!(parsed["request_id"], "id-1");
                assert_eq!(parsed["status"], 404);
                assert_eq!(parsed["error_code"], "model_not_found");
                assert_eq!(parsed["duration_ms"], 1.5);
                assert_eq!(parsed["route"], serde_json::Value::Null);
                assert_eq!(parsed["plugins"], serde_json::json!([]));
            } else {
                assert!(out.contains(r#" request_id="id-1""#) && out.contains(" status=404"), "{out}");
                assert!(!out.contains("null") && !out.contains("route="), "{out}");
            }
        }
    }
}
