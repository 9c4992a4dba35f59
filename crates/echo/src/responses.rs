//! OpenAI's Responses API, `POST /v1/responses`: a `response` object whose
//! one output message carries the echo document, or, streamed, the events
//! OpenAI sends, each named and numbered.

use std::time::Duration;

use http::Response;
use serde_json::{Map, Value, json};

use crate::stream::{Body, Delivery, Frame};
use crate::{Arrived, approx_tokens, next_id, split, unix_seconds};

pub(crate) fn create(arrived: &Arrived, delivery: Delivery) -> Response<Body> {
    let text = arrived.echoed();
    let id = next_id();
    let input_tokens = arrived.prompt_tokens();
    let output_tokens = approx_tokens(text.chars().count());
    let reply = Reply {
        id: format!("resp_echo{id}"),
        item_id: format!("msg_echo{id}"),
        created_at: unix_seconds(),
        model: arrived.model_name("echo"),
        settings: settings(arrived.request),
        usage: json!({
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        }),
        text,
    };
    if !arrived.streamed() {
        return delivery.json(&reply.response(true));
    }
    let frames = reply.frames(delivery.chunks, delivery.chunk_delay);
    delivery.events(frames, "text/event-stream; charset=utf-8")
}

/// The request's settings a response reports back, where the request gave
/// them with the right type, else OpenAI's defaults.
fn settings(request: &Map<String, Value>) -> Map<String, Value> {
    let given = |name: &str, fits: fn(&Value) -> bool, default: Value| {
        let value = request.get(name).filter(|value| fits(value)).cloned().unwrap_or(default);
        (name.to_owned(), value)
    };
    let string_or_object = |value: &Value| value.is_string() || value.is_object();
    [
        given("instructions", Value::is_string, Value::Null),
        given("max_output_tokens", Value::is_u64, Value::Null),
        given("metadata", Value::is_object, json!({})),
        given("parallel_tool_calls", Value::is_boolean, json!(true)),
        given("previous_response_id", Value::is_string, Value::Null),
        given("store", Value::is_boolean, json!(true)),
        given("temperature", Value::is_number, json!(1.0)),
        given("text", Value::is_object, json!({"format": {"type": "text"}})),
        given("tool_choice", string_or_object, json!("auto")),
        given("tools", Value::is_array, json!([])),
        given("top_p", Value::is_number, json!(1.0)),
        given("user", Value::is_string, Value::Null),
    ]
    .into_iter()
    .collect()
}

struct Reply {
    id: String,
    item_id: String,
    created_at: u64,
    model: String,
    settings: Map<String, Value>,
    usage: Value,
    text: String,
}

impl Reply {
    /// The `response` object: finished, or as it starts (no output, no usage).
    fn response(&self, completed: bool) -> Value {
        let mut response = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": if completed { "completed" } else { "in_progress" },
            "background": false,
            "error": null,
            "incomplete_details": null,
            "model": self.model,
            "output": if completed { vec![self.message(true)] } else { Vec::new() },
            "reasoning": {"effort": null, "summary": null},
            "service_tier": "default",
            "truncation": "disabled",
            "usage": if completed { self.usage.clone() } else { Value::Null },
        });
        if completed {
            response["completed_at"] = json!(self.created_at);
        }
        if let Value::Object(fields) = &mut response {
            fields.extend(self.settings.clone());
        }
        response
    }

    fn message(&self, completed: bool) -> Value {
        json!({
            "type": "message",
            "id": self.item_id,
            "status": if completed { "completed" } else { "in_progress" },
            "role": "assistant",
            "content": if completed { vec![self.part(&self.text)] } else { Vec::new() },
        })
    }

    fn part(&self, text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    }

    /// `response.created`, `response.in_progress`, the message item and its
    /// text part added, the text deltas, then everything done, in reverse,
    /// and `response.completed` with the usage.
    fn frames(&self, chunks: usize, chunk_delay: Duration) -> Vec<Frame> {
        let at = json!({"item_id": self.item_id, "output_index": 0, "content_index": 0});
        let with_at = |mut value: Value| {
            if let (Value::Object(fields), Value::Object(at)) = (&mut value, &at) {
                fields.extend(at.clone());
            }
            value
        };
        let mut events = vec![
            (json!({"type": "response.created", "response": self.response(false)}), Duration::ZERO, false),
            (json!({"type": "response.in_progress", "response": self.response(false)}), Duration::ZERO, false),
            (
                json!({"type": "response.output_item.added", "output_index": 0, "item": self.message(false)}),
                Duration::ZERO,
                false,
            ),
            (with_at(json!({"type": "response.content_part.added", "part": self.part("")})), Duration::ZERO, false),
        ];
        for piece in split(&self.text, chunks) {
            let delta = with_at(json!({"type": "response.output_text.delta", "delta": piece, "logprobs": []}));
            events.push((delta, chunk_delay, true));
        }
        let done = [
            with_at(json!({"type": "response.output_text.done", "text": self.text, "logprobs": []})),
            with_at(json!({"type": "response.content_part.done", "part": self.part(&self.text)})),
            json!({"type": "response.output_item.done", "output_index": 0, "item": self.message(true)}),
            json!({"type": "response.completed", "response": self.response(true)}),
        ];
        events.extend(done.into_iter().map(|event| (event, Duration::ZERO, false)));
        events
            .into_iter()
            .enumerate()
            .map(|(sequence_number, (mut event, delay, content))| {
                event["sequence_number"] = json!(sequence_number);
                let name = event["type"].as_str().unwrap_or_default().to_owned();
                Frame::event(&name, &event, delay, content)
            })
            .collect()
    }
}
