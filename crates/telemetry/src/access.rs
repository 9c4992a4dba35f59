//! The access log: one line per request at `info`, target `sluice::access`.
//! It never holds prompt text or secrets: only what the gateway decided
//! (route, model, backend, status, plugin outcomes) and what it measured.

use std::fmt::Write;
use std::time::Duration;

use serde_json::{Value, json};

use crate::logging::{LogFormat, timestamp, write_access};
use crate::record::RequestRecord;

pub(crate) fn log(record: &RequestRecord, duration: Duration) {
    write_access(|format, out| {
        let fields = fields(record, duration);
        match format {
            LogFormat::Json => {
                // Written by hand to keep the fields in order, the common
                // ones first as in the other lines.
                let _ = write!(
                    out,
                    r#"{{"timestamp":"{}","level":"INFO","target":"sluice::access","message":"request""#,
                    timestamp()
                );
                for (key, value) in fields {
                    let _ = write!(out, ",\"{key}\":{value}");
                }
                out.push('}');
            }
            LogFormat::Text => {
                let _ = write!(out, "{}  INFO sluice::access: request", timestamp());
                for (key, value) in fields {
                    match value {
                        Value::Null => {}
                        // Strings quoted and escaped, as JSON would: a value
                        // cannot pose as another field or start a line.
                        value => {
                            let _ = write!(out, " {key}={value}");
                        }
                    }
                }
            }
        }
    });
}

/// The line's fields, in order.
pub fn fields(record: &RequestRecord, duration: Duration) -> Vec<(&'static str, Value)> {
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let upstream: Option<Duration> = record.attempts.last().map(|a| a.end.saturating_sub(a.start));
    let plugins: Vec<Value> = record
        .plugins
        .iter()
        .map(|p| {
            json!({
                "plugin": format!("{}/{}", p.plugin.namespace, p.plugin.name),
                "digest": &*p.plugin.digest,
                "hook": p.hook.as_str(),
                "outcome": p.outcome.as_str(),
                "calls": p.calls,
                "duration_us": p.busy.as_micros() as u64,
                "skipped": p.skipped,
            })
        })
        .collect();
    let mut fields = Vec::with_capacity(24);
    let mut put = |key: &'static str, value: Value| fields.push((key, value));
    put("request_id", (*record.id).into());
    put("method", record.method.clone().into());
    put("path", record.path.clone().into());
    put("route", record.route.as_deref().into());
    put("model", record.model.as_deref().into());
    put("backend", record.backend.as_deref().into());
    put("status", record.status.into());
    put("error_code", record.error_code.into());
    put("streamed", record.streamed.into());
    put("completed", record.completed.into());
    put("duration_ms", ms(duration).into());
    put("time_to_first_token_ms", record.first_byte.map(ms).into());
    put("upstream_ms", upstream.map(ms).into());
    put("attempts", record.attempts.len().into());
    put("input_tokens", record.tokens.map(|t| t.input).into());
    put("output_tokens", record.tokens.map(|t| t.output).into());
    put("response_model", record.response_model.clone().into());
    put("consumer", record.consumer.clone().into());
    put("response_bytes", record.response_bytes.into());
    put("plugins", plugins.into());
    put("trace_id", record.trace.as_ref().map(|t| t.trace_id_hex()).into());
    fields
}
