//! The echo's replies are what the real APIs send: the official Anthropic
//! and OpenAI Python SDKs parse its messages, streams, tool calls, responses
//! and errors, and every object they parse is validated against the SDKs'
//! own pydantic models (the SDKs themselves build objects without checking
//! required fields). The echoes run in this process, each scripted to
//! misbehave in its own way, and count what reached them.
//!
//! Needs a venv with the pinned `openai` and `anthropic` SDKs
//! (`$SLUICE_TOOLS_VENV`, else `target/tools/venv`; `cargo xtask test`
//! makes it).

use std::time::Duration;

use serde_json::json;
use sluice_tests::{Echo, Script, Step, eventually, run_sdk_script};

/// The SDK script takes seconds; a hung exchange fails instead of waiting.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

/// What the script prints as it passes each part.
const CHECKS: &[&str] = &[
    "anthropic message",
    "anthropic stream",
    "anthropic tool use",
    "anthropic errors",
    "openai response",
    "openai response stream",
    "openai chat",
];

#[tokio::test(flavor = "multi_thread")]
async fn official_sdks_parse_the_echo() {
    let plain = Echo::start().await;
    let limited = Echo::start().await;
    limited.script().always(Some(Step::rate_limited("1")));
    let overloaded = Echo::start().await;
    overloaded.script().always(Some(Step::overloaded()));
    let too_long = Echo::start().await;
    too_long.script().always(Some(Step::context_length_exceeded()));
    // Retried at once: a retry-after of 0 is below what the SDK honours, so
    // it backs off for under a second.
    let flaky = Echo::start().await;
    flaky.script().push(Step::rate_limited("0"), 1);
    let urls = json!({
        "plain": plain.origin(),
        "limited": limited.origin(),
        "overloaded": overloaded.origin(),
        "too_long": too_long.origin(),
        "flaky": flaky.origin(),
    });

    run_sdk_script(SDK_SCRIPT, &[&urls.to_string()], &[], CHECKS, SCRIPT_TIMEOUT).await;

    // Every call reached the echo meant for it, and only the plain one and
    // the flaky one's retry answered normally.
    let counts = |script: &Script| (script.requests(), script.completed());
    // A stream counts once its last event is out, just after the client
    // may have read it.
    eventually("the plain echo's streams to count", Duration::from_secs(5), async || {
        (counts(plain.script()) == (11, 11)).then_some(())
    })
    .await;
    assert_eq!(counts(limited.script()), (2, 0), "one Anthropic and one OpenAI call, not retried");
    assert_eq!(counts(overloaded.script()), (1, 0));
    assert_eq!(counts(too_long.script()), (1, 0));
    assert_eq!(counts(flaky.script()), (2, 1), "the SDK retried the 429 once");
}

/// Calls every echo through the SDKs; `sys.argv[1]` maps echo names to base
/// URLs. Each assert names what it saw when it fails.
const SDK_SCRIPT: &str = r#"
import json, math, re, sys

import anthropic
import openai
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

urls = json.loads(sys.argv[1])
KEY = "sk-ant-echo"
SYSTEM = "be brief"
MESSAGES = [{"role": "user", "content": "héllo"}]
TOOLS = [{"name": "get_weather", "description": "The weather", "input_schema": {"type": "object", "properties": {}}}]


def chars(value):
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(chars(v) for v in value)
    if isinstance(value, dict):
        return sum(chars(v) for v in value.values())
    return 0


def tokens(*values):
    """The echo's estimate: a quarter of the characters, rounded up."""
    return math.ceil(sum(chars(v) for v in values) / 4)


def strict(model, parsed):
    """The SDKs build objects without validation; validate what they parsed
    against their own pydantic models, required fields and literals too."""
    TypeAdapter(model).validate_python(parsed.to_dict())


def ok(check):
    print("ok", check, flush=True)


def claude(name, retries=0):
    return anthropic.Anthropic(base_url=urls[name], api_key=KEY, max_retries=retries)


def gpt(name):
    return openai.OpenAI(base_url=urls[name] + "/v1", api_key="sk-echo", max_retries=0)


def expect(error, call):
    try:
        call()
    except error as raised:
        return raised
    raise AssertionError(f"no {error.__name__}")


# Anthropic: a message, whole.
ask = dict(model="claude-echo", max_tokens=64, system=SYSTEM, messages=MESSAGES)
message = claude("plain").messages.create(**ask)
strict(Message, message)
assert isinstance(message, anthropic.types.Message)
assert (message.type, message.role, message.model) == ("message", "assistant", "claude-echo"), message
assert message.id.startswith("msg_") and message.stop_reason == "end_turn" and message.stop_sequence is None
[block] = message.content
assert block.type == "text"
echoed = json.loads(block.text)
assert echoed["messages"] == MESSAGES and echoed["system"] == SYSTEM and echoed["path"] == "/v1/messages", echoed
# 1.x SDKs send the key as x-api-key, 2.x as a bearer token.
headers = echoed["headers"]
assert KEY in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")), headers
assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", headers["anthropic-version"]), headers
usage = message.usage
assert usage.input_tokens == tokens(SYSTEM, MESSAGES) and usage.output_tokens == tokens(block.text), usage
assert usage.cache_creation_input_tokens == 0 and usage.cache_read_input_tokens == 0, usage
ok("anthropic message")

# Streamed: every raw event validated, then the SDK's accumulating helper.
events = list(claude("plain").messages.create(**ask, stream=True))
for event in events:
    strict(RawMessageStreamEvent, event)
kinds = [event.type for event in events]
# The SDK drops `ping` events itself.
assert kinds[:2] == ["message_start", "content_block_start"], kinds
assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
assert set(kinds[2:-3]) == {"content_block_delta"} and len(kinds) > 6, kinds
with claude("plain").messages.stream(**ask) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
strict(Message, final)
assert final.content[0].text == text and json.loads(text)["messages"] == MESSAGES
assert final.stop_reason == "end_turn", final
assert final.usage.input_tokens == tokens(SYSTEM, MESSAGES) and final.usage.output_tokens == tokens(text), final.usage
ok("anthropic stream")

# Tool use, whole and streamed; the tool's result asks for nothing more.
call = dict(model="claude-echo", max_tokens=64, tools=TOOLS, messages=[{"role": "user", "content": "call tool"}])
message = claude("plain").messages.create(**call)
strict(Message, message)
assert message.stop_reason == "tool_use", message
text_block, tool = message.content
assert json.loads(text_block.text)["body"]["tools"] == TOOLS
assert tool.type == "tool_use" and tool.name == "get_weather" and tool.input == {"echo": True}, tool
assert tool.id.startswith("toolu_")
with claude("plain").messages.stream(**call) as stream:
    final = stream.get_final_message()
strict(Message, final)
assert final.stop_reason == "tool_use" and final.content[1].name == "get_weather", final
assert final.content[1].input == {"echo": True}, final.content[1]
turns = call["messages"] + [
    {"role": "assistant", "content": [
        {"type": "text", "text": text_block.text},
        {"type": "tool_use", "id": tool.id, "name": tool.name, "input": tool.input},
    ]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "sunny"}]},
]
answer = claude("plain").messages.create(**{**call, "messages": turns})
assert answer.stop_reason == "end_turn" and [b.type for b in answer.content] == ["text"], answer
ok("anthropic tool use")

# Errors, as the SDK's own exception classes.
error = expect(anthropic.RateLimitError, lambda: claude("limited").messages.create(**ask))
assert error.status_code == 429 and error.response.headers["retry-after"] == "1"
assert error.body["type"] == "error" and error.body["error"]["type"] == "rate_limit_error", error.body
assert error.request_id == error.response.headers["request-id"], error.request_id
error = expect(anthropic.InternalServerError, lambda: claude("overloaded").messages.create(**ask))
assert isinstance(error, anthropic.OverloadedError) and error.status_code == 529, error
assert error.body["error"]["type"] == "overloaded_error", error.body
error = expect(anthropic.BadRequestError, lambda: claude("too_long").messages.create(**ask))
assert re.fullmatch(r"prompt is too long: \d+ tokens > 200000 maximum", error.body["error"]["message"]), error.body
# The SDK retries a 429 by itself, and the second try succeeds.
assert claude("flaky", retries=2).messages.create(**ask).stop_reason == "end_turn"
ok("anthropic errors")

# OpenAI's Responses API, whole.
ask = dict(model="gpt-echo", input="héllo", instructions=SYSTEM)
response = gpt("plain").responses.create(**ask)
strict(Response, response)
assert (response.object, response.status, response.model) == ("response", "completed", "gpt-echo"), response
assert response.id.startswith("resp_") and response.instructions == SYSTEM
echoed = json.loads(response.output_text)
assert echoed["input"] == "héllo" and echoed["instructions"] == SYSTEM and echoed["path"] == "/v1/responses", echoed
[item] = response.output
assert (item.type, item.role, item.status) == ("message", "assistant", "completed"), item
[part] = item.content
assert part.type == "output_text" and part.annotations == [], part
usage = response.usage
assert usage.input_tokens == tokens(SYSTEM, "héllo") and usage.output_tokens == tokens(response.output_text), usage
assert usage.total_tokens == usage.input_tokens + usage.output_tokens, usage
assert usage.input_tokens_details.cached_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0, usage
ok("openai response")

# Streamed: every event validated and numbered, then the SDK's helper.
events = list(gpt("plain").responses.create(**ask, stream=True))
for event in events:
    strict(ResponseStreamEvent, event)
assert [event.sequence_number for event in events] == list(range(len(events)))
assert events[0].type == "response.created" and events[-1].type == "response.completed", events
deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
completed = events[-1].response
assert completed.output_text == deltas and json.loads(deltas)["input"] == "héllo"
assert completed.usage.output_tokens == tokens(deltas), completed.usage
with gpt("plain").responses.stream(**ask) as stream:
    kinds = [event.type for event in stream]
    final = stream.get_final_response()
assert kinds == [event.type for event in events], kinds
assert json.loads(final.output_text)["instructions"] == SYSTEM and final.status == "completed"
error = expect(openai.RateLimitError, lambda: gpt("limited").responses.create(**ask))
assert error.status_code == 429 and error.response.headers["retry-after"] == "1" and error.code == "rate_limit_exceeded"
ok("openai response stream")

# Chat completions, whole and streamed with usage.
completion = gpt("plain").chat.completions.create(model="echo", messages=MESSAGES)
strict(ChatCompletion, completion)
assert json.loads(completion.choices[0].message.content)["messages"] == MESSAGES
chunks = list(gpt("plain").chat.completions.create(
    model="echo", messages=MESSAGES, stream=True, stream_options={"include_usage": True}))
for chunk in chunks:
    strict(ChatCompletionChunk, chunk)
text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
assert json.loads(text)["messages"] == MESSAGES
assert chunks[-1].usage.completion_tokens == tokens(text), chunks[-1].usage
ok("openai chat")
"#;
