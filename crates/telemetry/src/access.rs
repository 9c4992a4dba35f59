//! The access log: one line per request at `info`, target `sluice::access`.
//! It never holds prompt text or secrets: only what the gateway decided
//! (route, model, backend, status, plugin outcomes) and what it measured.
//!
//! Written straight into the line, with no JSON tree in between: it runs
//! for every request.

use std::fmt::Write;
use std::time::Duration;

use crate::logging::{LogFormat, timestamp, write_access};
use crate::record::RequestRecord;

pub(crate) fn log(record: &RequestRecord, duration: Duration) {
    write_access(|format, out| {
        let mut line = Line { out, format };
        match format {
            LogFormat::Json => {
                let _ = write!(
                    line.out,
                    r#"{{"timestamp":"{}","level":"INFO","target":"sluice::access","message":"request""#,
                    timestamp()
                );
            }
            LogFormat::Text => {
                let _ = write!(line.out, "{}  INFO sluice::access: request", timestamp());
            }
        }
        fields(record, duration, &mut line);
        if format == LogFormat::Json {
            line.out.push('}');
        }
    });
}

/// A line being written: `,"key":value` in JSON, ` key=value` in text
/// (values as JSON would write them, so a string cannot pose as another
/// field or start a line; text leaves out what is null).
struct Line<'a> {
    out: &'a mut String,
    format: LogFormat,
}

impl Line<'_> {
    fn key(&mut self, key: &str) {
        match self.format {
            LogFormat::Json => {
                let _ = write!(self.out, r#","{key}":"#);
            }
            LogFormat::Text => {
                let _ = write!(self.out, " {key}=");
            }
        }
    }

    fn str(&mut self, key: &str, value: Option<&str>) {
        match value {
            Some(value) => {
                self.key(key);
                json_string(self.out, value);
            }
            None => self.null(key),
        }
    }

    fn num(&mut self, key: &str, value: Option<impl std::fmt::Display>) {
        match value {
            Some(value) => {
                self.key(key);
                let _ = write!(self.out, "{value}");
            }
            None => self.null(key),
        }
    }

    fn bool(&mut self, key: &str, value: bool) {
        self.num(key, Some(value));
    }

    fn null(&mut self, key: &str) {
        if self.format == LogFormat::Json {
            self.key(key);
            self.out.push_str("null");
        }
    }
}

/// Milliseconds to the microsecond.
fn ms(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e6).round() / 1e3
}

fn fields(record: &RequestRecord, duration: Duration, line: &mut Line) {
    let upstream = record.attempts.last().map(|a| ms(a.end.saturating_sub(a.start)));
    line.str("request_id", Some(&record.id));
    line.str("method", Some(&record.method));
    line.str("path", Some(&record.path));
    line.str("route", record.route.as_deref());
    line.str("model", record.model.as_deref());
    line.str("backend", record.backend.as_deref());
    line.num("status", Some(record.status));
    line.str("error_code", record.error_code);
    line.bool("streamed", record.streamed);
    line.bool("completed", record.completed);
    line.num("duration_ms", Some(ms(duration)));
    line.num("time_to_first_token_ms", record.first_byte.map(ms));
    line.num("upstream_ms", upstream);
    line.num("attempts", Some(record.attempts.len()));
    line.num("input_tokens", record.tokens.map(|t| t.input));
    line.num("output_tokens", record.tokens.map(|t| t.output));
    line.str("response_model", record.response_model.as_deref());
    line.str("consumer", record.consumer.as_deref());
    line.num("response_bytes", Some(record.response_bytes));
    line.key("plugins");
    line.out.push('[');
    for (i, calls) in record.plugins.iter().enumerate() {
        if i > 0 {
            line.out.push(',');
        }
        let plugin = &calls.plugin;
        line.out.push_str(r#"{"plugin":"#);
        // Resource names are DNS labels; escaped all the same.
        json_string(line.out, &format!("{}/{}", plugin.namespace, plugin.name));
        line.out.push_str(r#","digest":"#);
        json_string(line.out, &plugin.digest);
        let _ = write!(
            line.out,
            r#","hook":"{}","outcome":"{}","calls":{},"duration_us":{},"skipped":{}}}"#,
            calls.hook.as_str(),
            calls.outcome.as_str(),
            calls.calls,
            calls.busy.as_micros(),
            calls.skipped
        );
    }
    line.out.push(']');
    line.str("trace_id", record.trace.as_ref().map(|t| t.trace_id_hex()).as_deref());
}

/// `text` as a JSON string: quotes, backslashes and control characters
/// escaped.
fn json_string(out: &mut String, text: &str) {
    out.push('"');
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
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push_str(escape);
        }
        plain = i + c.len_utf8();
    }
    out.push_str(&text[plain..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

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
