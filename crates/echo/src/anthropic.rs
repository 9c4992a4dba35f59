//! Anthropic's Messages API, `POST /v1/messages`: Anthropic's headers,
//! message objects, server-sent events and error shape.
//!
//! The reply's text is the echo document. If the request has `tools` and its
//! last user message's text contains `call tool`, a `tool_use` block for the
//! first tool follows the text, with input [`TOOL_INPUT`] and stop reason
//! `tool_use`, so that tool translation can be tested.

use std::time::Duration;

use http::header::AUTHORIZATION;
use http::{HeaderMap, Response, StatusCode};
use serde_json::{Value, json};

use crate::stream::{Body, Delivery, Frame};
use crate::{Arrived, Rejection, approx_tokens, next_id, split};

/// The input of a scripted tool call, as the JSON text that is streamed.
pub const TOOL_INPUT: &str = r#"{"echo": true}"#;

/// The context window the scripted context-length error claims.
const CONTEXT_WINDOW: u64 = 200_000;

/// Anthropic checks the key and the API version before it reads the body.
/// The key comes in `x-api-key` or, as Anthropic's 2.x SDKs send it, as
/// `authorization: Bearer …`. Versions are dates, and new ones appear: any
/// `YYYY-MM-DD` passes.
pub(crate) fn check_headers(headers: &HeaderMap) -> Result<(), Rejection> {
    let present = |name| headers.get(name).is_some_and(|value| !value.is_empty());
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|token| !token.trim().is_empty());
    if !present("x-api-key") && !bearer {
        return Err(invalid(StatusCode::UNAUTHORIZED, "x-api-key header is required"));
    }
    let Some(version) = headers.get("anthropic-version") else {
        return Err(invalid(StatusCode::BAD_REQUEST, "anthropic-version: header is required"));
    };
    let version = String::from_utf8_lossy(version.as_bytes());
    if !is_date(&version) {
        return Err(invalid(StatusCode::BAD_REQUEST, format!("anthropic-version: {version:?} is not a valid version")));
    }
    Ok(())
}

/// `YYYY-MM-DD`, digits where digits go.
fn is_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 10
        && bytes
            .iter()
            .enumerate()
            .all(|(at, byte)| if at == 4 || at == 7 { *byte == b'-' } else { byte.is_ascii_digit() })
}

fn invalid(status: StatusCode, message: impl Into<String>) -> Rejection {
    Rejection::new(status, "invalid_request_error", message)
}

/// `{"type": "error", "error": {"type", "message"}, "request_id"}`, the
/// error type following the status as Anthropic's do.
pub(crate) fn error_body(rejection: &Rejection, request_id: &str) -> Value {
    let kind = match rejection.status.as_u16() {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    };
    json!({
        "type": "error",
        "error": {"type": kind, "message": rejection.message},
        "request_id": request_id,
    })
}

pub(crate) fn context_length_message(prompt_tokens: u64) -> String {
    let tokens = CONTEXT_WINDOW + prompt_tokens.max(1);
    format!("prompt is too long: {tokens} tokens > {CONTEXT_WINDOW} maximum")
}

pub(crate) fn messages(arrived: &Arrived, delivery: Delivery) -> Result<Response<Body>, Rejection> {
    for field in ["model", "max_tokens", "messages"] {
        if arrived.field(field).is_none() {
            return Err(invalid(StatusCode::BAD_REQUEST, format!("{field}: Field required")));
        }
    }
    let text = arrived.echoed();
    let tool = called_tool(arrived).map(|name| (format!("toolu_echo{}", next_id()), name.to_owned()));
    let output_chars = text.chars().count() + tool.as_ref().map_or(0, |_| TOOL_INPUT.len());
    let reply = Reply {
        id: format!("msg_echo{}", next_id()),
        model: arrived.model_name("claude-echo"),
        input_tokens: arrived.prompt_tokens(),
        output_tokens: approx_tokens(output_chars),
        stop_reason: if tool.is_some() { "tool_use" } else { "end_turn" },
        text,
        tool,
    };
    if !arrived.streamed() {
        return Ok(delivery.json(&reply.message()));
    }
    let frames = reply.frames(delivery.chunks, delivery.chunk_delay);
    Ok(delivery.events(frames, "text/event-stream; charset=utf-8"))
}

/// The first tool's name, if the request asks for a tool call.
fn called_tool<'a>(arrived: &Arrived<'a>) -> Option<&'a str> {
    let name = arrived.request.get("tools")?.as_array()?.first()?.get("name")?.as_str()?;
    let messages = arrived.request.get("messages")?.as_array()?;
    let last_user = messages.iter().rev().find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    let asks = match last_user.get("content")? {
        Value::String(text) => text.contains("call tool"),
        // Text blocks; a turn of tool results alone asks for nothing.
        Value::Array(blocks) => blocks.iter().any(|block| {
            block.get("type").and_then(Value::as_str) == Some("text")
                && block.get("text").and_then(Value::as_str).is_some_and(|text| text.contains("call tool"))
        }),
        _ => false,
    };
    asks.then_some(name)
}

struct Reply {
    id: String,
    model: String,
    text: String,
    /// The tool call's id and tool name.
    tool: Option<(String, String)>,
    stop_reason: &'static str,
    input_tokens: u64,
    output_tokens: u64,
}

impl Reply {
    fn message(&self) -> Value {
        let mut content = vec![json!({"type": "text", "text": self.text})];
        if let Some((id, name)) = &self.tool {
            let input: Value = serde_json::from_str(TOOL_INPUT).unwrap_or_default();
            content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
        self.envelope(content, Some(self.stop_reason), self.output_tokens)
    }

    fn envelope(&self, content: Vec<Value>, stop_reason: Option<&str>, output_tokens: u64) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": {
                "input_tokens": self.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                "output_tokens": output_tokens,
                "service_tier": "standard",
            },
        })
    }

    /// The event sequence Anthropic streams: `message_start`, a `ping`, each
    /// content block's start, deltas and stop, `message_delta` with the stop
    /// reason and usage, `message_stop`.
    fn frames(&self, chunks: usize, chunk_delay: Duration) -> Vec<Frame> {
        let event = |value: Value, delay, content| {
            let name = value["type"].as_str().unwrap_or_default().to_owned();
            Frame::event(&name, &value, delay, content)
        };
        // The first output token is counted as the message starts.
        let start = self.envelope(Vec::new(), None, 1);
        let mut frames = vec![
            event(json!({"type": "message_start", "message": start}), Duration::ZERO, false),
            event(
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                Duration::ZERO,
                false,
            ),
            event(json!({"type": "ping"}), Duration::ZERO, false),
        ];
        for piece in split(&self.text, chunks) {
            let delta =
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}});
            frames.push(event(delta, chunk_delay, true));
        }
        frames.push(event(json!({"type": "content_block_stop", "index": 0}), Duration::ZERO, false));
        if let Some((id, name)) = &self.tool {
            let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
            frames.push(event(
                json!({"type": "content_block_start", "index": 1, "content_block": block}),
                Duration::ZERO,
                false,
            ));
            for piece in split(TOOL_INPUT, 2) {
                let delta = json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": piece}});
                frames.push(event(delta, chunk_delay, true));
            }
            frames.push(event(json!({"type": "content_block_stop", "index": 1}), Duration::ZERO, false));
        }
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": null},
            "usage": {
                "input_tokens": self.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": self.output_tokens,
            },
        });
        frames.push(event(delta, Duration::ZERO, false));
        frames.push(event(json!({"type": "message_stop"}), Duration::ZERO, false));
        frames
    }
}
