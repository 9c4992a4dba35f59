//! Anthropic's stream events as OpenAI's `chat.completion.chunk`s.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::{Usage, finish_reason, mapped_error, now, openai_error};

/// Translates Anthropic SSE events (event name + data) into OpenAI
/// `chat.completion.chunk` data payloads, in order.
///
/// Anthropic streams `message_start`; per content block a
/// `content_block_start`, its `content_block_delta`s and a
/// `content_block_stop`; `message_delta` with the stop reason and output
/// tokens; `message_stop`. `ping`s may come anywhere, an `error` instead of
/// the rest, and event types added later are to be ignored.
#[derive(Debug)]
pub struct StreamTranslator {
    include_usage: bool,
    created: u64,
    /// From `message_start`; `None` before it.
    message: Option<MessageStart>,
    /// Each tool_use block's OpenAI tool call index, by Anthropic block index.
    /// OpenAI numbers tool calls alone; Anthropic numbers every block.
    tool_calls: HashMap<u64, usize>,
    usage: Usage,
    finish_sent: bool,
    /// `[DONE]` or an error was sent: nothing more is.
    ended: bool,
}

#[derive(Debug)]
struct MessageStart {
    id: String,
    model: String,
}

impl StreamTranslator {
    pub fn new(include_usage: bool) -> Self {
        Self {
            include_usage,
            created: now(),
            message: None,
            tool_calls: HashMap::new(),
            usage: Usage::default(),
            finish_sent: false,
            ended: false,
        }
    }

    /// One Anthropic event. Returns the OpenAI data payloads to send (each is
    /// what goes after `data: `), possibly none; "[DONE]" after message_stop.
    /// An Anthropic `error` event becomes an OpenAI-shaped error payload
    /// `{"error":{...}}` followed by nothing else.
    pub fn event(&mut self, event: Option<&str>, data: &str) -> Vec<String> {
        if self.ended {
            return Vec::new();
        }
        let Ok(data) = serde_json::from_str::<Value>(data) else {
            return self.fail("the upstream sent an event that is not JSON");
        };
        // SSE names an unnamed event "message"; the data names it too.
        let kind = match event {
            Some(name) if !name.is_empty() && name != "message" => name,
            _ => data.get("type").and_then(Value::as_str).unwrap_or_default(),
        };
        match kind {
            "message_start" => self.message_start(&data),
            "error" => {
                self.ended = true;
                let error = data.get("error");
                let field = |name: &str| error.and_then(|error| error.get(name)).and_then(Value::as_str);
                let message = field("message").unwrap_or("the upstream's stream failed");
                vec![mapped_error(field("type"), message, None).to_string()]
            }
            "content_block_start" | "content_block_delta" | "message_delta" | "message_stop"
                if self.message.is_none() =>
            {
                self.fail(&format!("the upstream sent {kind} before message_start"))
            }
            "content_block_start" => self.content_block_start(&data),
            "content_block_delta" => self.content_block_delta(&data),
            "message_delta" => {
                self.usage.update(Usage::read(&data["usage"]));
                match data["delta"]["stop_reason"].as_str() {
                    Some(reason) if !self.finish_sent => self.finish_chunk(reason),
                    _ => Vec::new(),
                }
            }
            "message_stop" => {
                // A message_delta always says why it stopped; should none
                // have, the client still hears that it did.
                let mut out = if self.finish_sent { Vec::new() } else { self.finish_chunk("end_turn") };
                if self.include_usage {
                    out.push(self.usage_chunk());
                }
                out.push("[DONE]".to_owned());
                self.ended = true;
                out
            }
            // ping, content_block_stop and event types added later.
            _ => Vec::new(),
        }
    }

    /// The upstream stream ended; returns what still must be sent (e.g.
    /// nothing if [DONE] was sent; an OpenAI error payload if the stream ended
    /// before message_stop).
    pub fn finish(&mut self) -> Vec<String> {
        if self.ended {
            return Vec::new();
        }
        self.fail("the upstream's stream ended before the message was complete")
    }

    fn message_start(&mut self, data: &Value) -> Vec<String> {
        if self.message.is_some() {
            return self.fail("the upstream sent message_start twice");
        }
        let message = &data["message"];
        let (Some(id), Some(model)) = (message["id"].as_str(), message["model"].as_str()) else {
            return self.fail("the upstream's message_start has no message id and model");
        };
        self.message = Some(MessageStart { id: id.to_owned(), model: model.to_owned() });
        self.usage = Usage::read(&message["usage"]);
        vec![self.chunk(json!({"role": "assistant", "content": ""}), None)]
    }

    fn content_block_start(&mut self, data: &Value) -> Vec<String> {
        let block = &data["content_block"];
        // Text arrives in deltas; thinking and server tools' blocks are not
        // the client's to see.
        if block["type"] != "tool_use" {
            return Vec::new();
        }
        let (Some(index), Some(id), Some(name)) =
            (data["index"].as_u64(), block["id"].as_str(), block["name"].as_str())
        else {
            return self.fail("the upstream's tool_use block has no index, id or name");
        };
        let tool_call = self.tool_calls.len();
        if self.tool_calls.insert(index, tool_call).is_some() {
            return self.fail("the upstream started a content block twice");
        }
        let delta = json!({"tool_calls": [{
            "index": tool_call,
            "id": id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }]});
        vec![self.chunk(delta, None)]
    }

    fn content_block_delta(&mut self, data: &Value) -> Vec<String> {
        let delta = &data["delta"];
        let delta = match delta["type"].as_str() {
            Some("text_delta") => match delta["text"].as_str() {
                Some(text) if !text.is_empty() => json!({"content": text}),
                _ => return Vec::new(),
            },
            Some("input_json_delta") => {
                // A server tool's input has no tool call to go to.
                let tool_call = data["index"].as_u64().and_then(|index| self.tool_calls.get(&index));
                match (tool_call, delta["partial_json"].as_str()) {
                    (Some(tool_call), Some(json)) if !json.is_empty() => {
                        json!({"tool_calls": [{"index": tool_call, "function": {"arguments": json}}]})
                    }
                    _ => return Vec::new(),
                }
            }
            // thinking_delta, signature_delta, citations_delta, ...
            _ => return Vec::new(),
        };
        vec![self.chunk(delta, None)]
    }

    fn finish_chunk(&mut self, stop_reason: &str) -> Vec<String> {
        self.finish_sent = true;
        vec![self.chunk(json!({}), Some(finish_reason(stop_reason)))]
    }

    /// Sends an error and ends the stream: what follows cannot be trusted.
    fn fail(&mut self, message: &str) -> Vec<String> {
        self.ended = true;
        vec![openai_error(message, "server_error", None).to_string()]
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> String {
        let choices = json!([{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": null}]);
        self.envelope(choices, Value::Null)
    }

    /// The last chunk, asked for with `stream_options.include_usage`: no
    /// choices, the usage.
    fn usage_chunk(&self) -> String {
        self.envelope(json!([]), self.usage.openai())
    }

    fn envelope(&self, choices: Value, usage: Value) -> String {
        let (id, model) = self.message.as_ref().map_or(("", ""), |message| (&message.id, &message.model));
        let mut chunk = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": model,
            "choices": choices,
        });
        // With include_usage, OpenAI's other chunks carry `"usage": null`.
        if let Some(fields) = chunk.as_object_mut().filter(|_| self.include_usage) {
            fields.insert("usage".to_owned(), usage);
        }
        chunk.to_string()
    }
}
