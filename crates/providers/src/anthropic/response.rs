//! Anthropic's answers (a message, or an error) as OpenAI's.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::{TranslateError, Usage, finish_reason, mapped_error, now};

/// Anthropic Messages response (200) -> OpenAI chat.completion JSON bytes.
///
/// Text blocks make the message's `content` (null without any), tool_use
/// blocks its `tool_calls`; thinking and server tools' blocks are left out.
pub fn chat_response(anthropic_body: &[u8]) -> Result<Vec<u8>, TranslateError> {
    let message: MessageResponse = serde_json::from_slice(anthropic_body).map_err(upstream)?;
    let mut content: Option<String> = None;
    let mut tool_calls = Vec::new();
    for block in &message.content {
        // Each block is read as its type says; other types are skipped
        // unread, so blocks added to the API later do not break this.
        let head: BlockHead = serde_json::from_str(block.get()).map_err(upstream)?;
        match head.kind.as_str() {
            "text" => {
                let text: TextBlock = serde_json::from_str(block.get()).map_err(upstream)?;
                content.get_or_insert_default().push_str(&text.text);
            }
            "tool_use" => {
                let call: ToolUseBlock = serde_json::from_str(block.get()).map_err(upstream)?;
                let arguments = call.input.as_deref().map_or("{}", RawValue::get);
                tool_calls.push(json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                }));
            }
            _ => {}
        }
    }
    let mut reply = json!({"role": "assistant", "content": content, "refusal": null});
    if let Some(fields) = reply.as_object_mut().filter(|_| !tool_calls.is_empty()) {
        fields.insert("tool_calls".to_owned(), Value::Array(tool_calls));
    }
    let completion = json!({
        "id": message.id,
        "object": "chat.completion",
        "created": now(),
        "model": message.model,
        "choices": [{
            "index": 0,
            "message": reply,
            "finish_reason": finish_reason(message.stop_reason.as_deref().unwrap_or_default()),
            "logprobs": null,
        }],
        "usage": Usage::read(&message.usage).openai(),
    });
    Ok(completion.to_string().into_bytes())
}

/// Any non-2xx Anthropic response -> OpenAI error JSON
/// `{"error":{"message","type","param","code"}}`. Never fails (falls back to a
/// generic error with the status).
pub fn error_response(status: u16, anthropic_body: &[u8]) -> Vec<u8> {
    // `{"type":"error","error":{"type":"not_found_error","message":"..."}}`
    let body: Value = serde_json::from_slice(anthropic_body).unwrap_or_default();
    let error = body.get("error");
    let field = |name: &str| error.and_then(|error| error.get(name)).and_then(Value::as_str);
    let generic = format!("the upstream answered HTTP {status}");
    let message = field("message").unwrap_or(&generic);
    mapped_error(field("type"), message, Some(status)).to_string().into_bytes()
}

/// Whether an error message says the prompt does not fit the model's context
/// window: Anthropic's `prompt is too long: 208310 tokens > 200000 maximum`
/// and `input length and max_tokens exceed context limit: ...`, and other
/// providers' "context length" and "context window" wordings.
pub fn is_context_length_error(message: &str) -> bool {
    let message = message.to_lowercase();
    ["prompt is too long", "exceed context limit", "context window", "context length"]
        .iter()
        .any(|phrase| message.contains(phrase))
}

fn upstream(error: serde_json::Error) -> TranslateError {
    TranslateError::InvalidUpstream(error.to_string())
}

#[derive(Deserialize)]
struct MessageResponse {
    id: String,
    model: String,
    content: Vec<Box<RawValue>>,
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Value,
}

#[derive(Deserialize)]
struct BlockHead {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct TextBlock {
    text: String,
}

#[derive(Deserialize)]
struct ToolUseBlock {
    id: String,
    name: String,
    input: Option<Box<RawValue>>,
}
