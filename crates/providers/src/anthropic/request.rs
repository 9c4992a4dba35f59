//! An OpenAI chat request as an Anthropic Messages request.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Number, Value, json};

use super::{DEFAULT_MAX_TOKENS, TranslateError, invalid};

/// A translated request.
#[derive(Debug)]
pub struct ChatRequest {
    /// The Messages request body.
    pub body: Vec<u8>,
    /// The client asked for a stream (`stream: true`), and so does `body`.
    pub stream: bool,
    /// The client asked for a last chunk with the usage
    /// (`stream_options.include_usage`); only ever set with `stream`.
    pub include_usage: bool,
}

/// OpenAI chat request body -> Anthropic Messages request body. `model`: the
/// model to send (backend override), else the request's.
///
/// Fields Anthropic has no counterpart for (penalties, seed, logprobs,
/// response_format, ...) are dropped; `n` other than 1 is refused, as one
/// answer cannot stand for several.
pub fn chat_request(openai_body: &[u8], model: Option<&str>) -> Result<ChatRequest, TranslateError> {
    let request: OpenAiRequest =
        serde_json::from_slice(openai_body).map_err(|error| invalid(format!("invalid request body: {error}")))?;
    if request.n.is_some_and(|n| n != 1) {
        return Err(invalid("n: only one choice (n = 1) is supported by this backend"));
    }
    let model = match (model, request.model) {
        (Some(model), _) => model.to_owned(),
        (None, Some(model)) => model,
        (None, None) => return Err(invalid("model is required")),
    };
    let (system, messages) = messages(request.messages)?;
    if messages.is_empty() {
        return Err(invalid("messages: at least one user or assistant message is required"));
    }
    let tools = request.tools.unwrap_or_default().into_iter().enumerate().map(tool).collect::<Result<Vec<_>, _>>()?;
    // Anthropic refuses a tool_choice without tools; OpenAI's is moot then.
    let tool_choice = match tools.is_empty() {
        true => None,
        false => tool_choice(request.tool_choice, request.parallel_tool_calls)?,
    };
    let user_id = request
        .user
        .filter(|user| !user.is_empty())
        .or_else(|| request.metadata.as_ref()?.get("user_id")?.as_str().map(str::to_owned));
    let stream = request.stream.unwrap_or(false);
    let include_usage = stream && request.stream_options.and_then(|options| options.include_usage).unwrap_or(false);
    let body = MessagesRequest {
        model,
        max_tokens: request.max_completion_tokens.or(request.max_tokens).unwrap_or(DEFAULT_MAX_TOKENS),
        system: (!system.is_empty()).then(|| system.join("\n\n")),
        messages,
        temperature: request.temperature,
        top_p: request.top_p,
        stop_sequences: stop_sequences(request.stop)?,
        tools,
        tool_choice,
        metadata: user_id.map(|user_id| Metadata { user_id }),
        stream,
    };
    let body = serde_json::to_vec(&body).map_err(|error| invalid(format!("request not encodable: {error}")))?;
    Ok(ChatRequest { body, stream, include_usage })
}

/// The fields read from an OpenAI request; the rest are dropped. `null`
/// means absent, as OpenAI's clients send it.
#[derive(Deserialize)]
struct OpenAiRequest {
    model: Option<String>,
    messages: Vec<OpenAiMessage>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<Number>,
    top_p: Option<Number>,
    stop: Option<Value>,
    tools: Option<Vec<OpenAiTool>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    user: Option<String>,
    metadata: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u64>,
}

#[derive(Deserialize)]
struct OpenAiMessage {
    role: String,
    content: Option<Value>,
    tool_calls: Option<Vec<OpenAiToolCall>>,
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
struct OpenAiToolCall {
    id: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    function: OpenAiFunctionCall,
}

#[derive(Deserialize)]
struct OpenAiFunctionCall {
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Deserialize)]
struct OpenAiTool {
    #[serde(rename = "type")]
    kind: String,
    function: Option<OpenAiFunction>,
}

#[derive(Deserialize)]
struct OpenAiFunction {
    name: String,
    description: Option<String>,
    parameters: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// The Messages request.
#[derive(Serialize)]
struct MessagesRequest {
    model: String,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<String>,
    messages: Vec<Message>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<Number>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stop_sequences: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Serialize)]
struct Message {
    role: Role,
    content: Vec<Block>,
}

#[derive(Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    User,
    Assistant,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    Image {
        source: ImageSource,
    },
    ToolUse {
        id: String,
        name: String,
        input: Json,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        content: Vec<Block>,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

#[derive(Serialize)]
struct Tool {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    input_schema: Json,
}

#[derive(Serialize)]
struct ToolChoice {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    disable_parallel_tool_use: bool,
}

#[derive(Serialize)]
struct Metadata {
    user_id: String,
}

/// JSON passed through as the client wrote it, or made here.
#[derive(Serialize)]
#[serde(untagged)]
enum Json {
    Raw(Box<RawValue>),
    Made(Value),
}

/// OpenAI's messages as Anthropic's system prompt and messages. Anthropic
/// wants user and assistant turns alternating, so consecutive messages with
/// the same role (a tool result is a user message) become one.
fn messages(openai: Vec<OpenAiMessage>) -> Result<(Vec<String>, Vec<Message>), TranslateError> {
    let mut system = Vec::new();
    let mut messages: Vec<Message> = Vec::new();
    for (i, message) in openai.into_iter().enumerate() {
        let (role, blocks) = match message.role.as_str() {
            "system" | "developer" => {
                for block in blocks(message.content, false, i)? {
                    if let Block::Text { text } = block {
                        system.push(text);
                    }
                }
                continue;
            }
            "user" => (Role::User, blocks(message.content, true, i)?),
            "assistant" => {
                let mut blocks = blocks(message.content, false, i)?;
                for (j, call) in message.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    blocks
                        .push(tool_use(call).map_err(|why| invalid(format!("messages[{i}].tool_calls[{j}]: {why}")))?);
                }
                (Role::Assistant, blocks)
            }
            "tool" => {
                let tool_use_id =
                    message.tool_call_id.ok_or_else(|| invalid(format!("messages[{i}].tool_call_id is required")))?;
                (Role::User, vec![Block::ToolResult { tool_use_id, content: blocks(message.content, false, i)? }])
            }
            other => return Err(invalid(format!("messages[{i}].role {other:?} is not supported"))),
        };
        // A message with nothing to say (an empty string) is left out.
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            _ => messages.push(Message { role, content: blocks }),
        }
    }
    // Anthropic wants a user turn's tool results before anything else in it;
    // a stable sort keeps each kind's order.
    for message in &mut messages {
        message.content.sort_by_key(|block| !matches!(block, Block::ToolResult { .. }));
    }
    Ok((system, messages))
}

/// A message's `content` (a string, or text and, where `images`, image
/// parts) as blocks. Empty text is left out: Anthropic refuses it.
///
/// Text is sent only from where policy plugins read it: a string content,
/// or a `text` part's `text`. Any other part that carries text (a
/// `refusal`'s `refusal`, ...) is refused like any unknown part: sent as
/// text, it would reach the model unseen by a prompt guard.
fn blocks(content: Option<Value>, images: bool, i: usize) -> Result<Vec<Block>, TranslateError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(text)) => return Ok(text_block(text).into_iter().collect()),
        Some(Value::Array(parts)) => parts,
        Some(_) => return Err(invalid(format!("messages[{i}].content must be a string or an array of parts"))),
    };
    let mut blocks = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let at = || format!("messages[{i}].content[{j}]");
        let string = |field: &str| {
            part.get(field).and_then(Value::as_str).ok_or_else(|| invalid(format!("{}.{field} must be a string", at())))
        };
        match part.get("type").and_then(Value::as_str) {
            Some("text") => blocks.extend(text_block(string("text")?.to_owned())),
            Some("image_url") if images => {
                let url = part
                    .get("image_url")
                    .and_then(|image| image.get("url"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("{}.image_url.url must be a string", at())))?;
                let source = image_source(url).map_err(|why| invalid(format!("{}.image_url.url: {why}", at())))?;
                blocks.push(Block::Image { source });
            }
            Some(kind) => return Err(invalid(format!("{}: content part type {kind:?} is not supported here", at()))),
            None => return Err(invalid(format!("{}.type must be a string", at()))),
        }
    }
    Ok(blocks)
}

fn text_block(text: String) -> Option<Block> {
    (!text.is_empty()).then_some(Block::Text { text })
}

/// An image URL as Anthropic's source: a `data:` URL's base64 bytes, or an
/// http(s) URL Anthropic fetches itself.
fn image_source(url: &str) -> Result<ImageSource, &'static str> {
    let (scheme, rest) = url.split_once(':').ok_or("only http(s) and data URLs are supported")?;
    match scheme.to_ascii_lowercase().as_str() {
        "http" | "https" => Ok(ImageSource::Url { url: url.to_owned() }),
        "data" => {
            // data:<media type>[;<parameter>...];base64,<data>
            let (header, data) = rest.split_once(',').ok_or("a data URL needs a comma before its data")?;
            let mut header = header.split(';');
            let media_type = header.next().unwrap_or_default();
            if !header.any(|parameter| parameter.eq_ignore_ascii_case("base64")) {
                return Err("only base64 data URLs are supported");
            }
            if media_type.is_empty() || data.is_empty() {
                return Err("a data URL needs a media type and data");
            }
            Ok(ImageSource::Base64 { media_type: media_type.to_owned(), data: data.to_owned() })
        }
        _ => Err("only http(s) and data URLs are supported"),
    }
}

/// An assistant's tool call as a `tool_use` block, its arguments (a JSON
/// string) as the object `input`.
fn tool_use(call: OpenAiToolCall) -> Result<Block, String> {
    if let Some(kind) = call.kind.filter(|kind| kind != "function") {
        return Err(format!("tool call type {kind:?} is not supported"));
    }
    let arguments = call.function.arguments;
    // Some clients send "" for a function without parameters.
    let input = if arguments.trim().is_empty() {
        Json::Made(json!({}))
    } else {
        let raw: Box<RawValue> = serde_json::from_str(&arguments)
            .map_err(|error| format!("function.arguments is not valid JSON: {error}"))?;
        if !raw.get().starts_with('{') {
            return Err("function.arguments must be a JSON object".into());
        }
        Json::Raw(raw)
    };
    Ok(Block::ToolUse { id: call.id, name: call.function.name, input })
}

/// A function tool as Anthropic's tool.
fn tool((j, tool): (usize, OpenAiTool)) -> Result<Tool, TranslateError> {
    if tool.kind != "function" {
        return Err(invalid(format!("tools[{j}].type {:?} is not supported; only \"function\" is", tool.kind)));
    }
    let function = tool.function.ok_or_else(|| invalid(format!("tools[{j}].function is required")))?;
    let input_schema = match function.parameters {
        Some(schema) if schema.get().starts_with('{') => Json::Raw(schema),
        Some(_) => return Err(invalid(format!("tools[{j}].function.parameters must be a JSON Schema object"))),
        // OpenAI: no parameters is a function taking none.
        None => Json::Made(json!({"type": "object", "properties": {}})),
    };
    Ok(Tool { name: function.name, description: function.description, input_schema })
}

/// OpenAI's tool_choice and parallel_tool_calls as Anthropic's tool_choice;
/// none when both are absent (Anthropic's default is OpenAI's, auto).
fn tool_choice(choice: Option<Value>, parallel: Option<bool>) -> Result<Option<ToolChoice>, TranslateError> {
    let (kind, name) = match &choice {
        None | Some(Value::Null) => ("auto", None),
        Some(Value::String(choice)) => match choice.as_str() {
            "none" => ("none", None),
            "auto" => ("auto", None),
            "required" => ("any", None),
            other => return Err(invalid(format!("tool_choice {other:?} is not supported"))),
        },
        Some(choice @ Value::Object(_)) => {
            let name = match choice.get("type").and_then(Value::as_str) {
                Some("function") => choice.pointer("/function/name").and_then(Value::as_str),
                _ => None,
            };
            let name = name.ok_or_else(|| invalid("tool_choice must be none, auto, required or a function by name"))?;
            ("tool", Some(name.to_owned()))
        }
        Some(_) => return Err(invalid("tool_choice must be a string or an object")),
    };
    // Anthropic's "none" takes no other field.
    let disable_parallel_tool_use = parallel == Some(false) && kind != "none";
    let given = !matches!(choice, None | Some(Value::Null));
    Ok((given || disable_parallel_tool_use).then_some(ToolChoice { kind, name, disable_parallel_tool_use }))
}

/// OpenAI's `stop` (a string or up to four) as `stop_sequences`.
fn stop_sequences(stop: Option<Value>) -> Result<Vec<String>, TranslateError> {
    let refuse = || invalid("stop must be a string or an array of strings");
    let sequences = match stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(stop)) => vec![stop],
        Some(Value::Array(stops)) => stops
            .into_iter()
            .map(|stop| stop.as_str().map(str::to_owned).ok_or_else(refuse))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(refuse()),
    };
    // An empty sequence would stop nothing; Anthropic refuses it.
    Ok(sequences.into_iter().filter(|stop| !stop.is_empty()).collect())
}
