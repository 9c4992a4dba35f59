//! Provider adapters through the real binary, driven by the official
//! `openai` Python SDK: a route whose backend speaks Anthropic's Messages
//! API (the echo's Anthropic mode, itself checked against the `anthropic`
//! SDK in upstream_shapes.rs) answers plain, streamed and tool-calling chat
//! completions in OpenAI's shapes, and its errors too; `/v1/responses`
//! passes through to an OpenAI-compatible backend with usage accounted.

use std::time::Duration;

use sluice_echo::Step;
use sluice_tests::{ConfigDir, Echo, Gateway, run_sdk_script};

const BACKEND_KEY: &str = "sk-ant-backend-key";

#[tokio::test]
async fn the_openai_sdk_through_an_anthropic_backed_route() {
    let (claude, limited, openai) = (Echo::start().await, Echo::start().await, Echo::start().await);
    limited.script().always(Some(Step::rate_limited("30")));
    let dir = ConfigDir::new();
    dir.write("anthropic-key", BACKEND_KEY);
    let route = |name: &str, model: &str, echo: &Echo, extra: &str| {
        format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {{name: {name}}}\nspec:\n  models: [{model}]\n  \
             backends: [{{url: '{}'{extra}}}]\n",
            echo.url()
        )
    };
    let anthropic = ", provider: anthropic, apiKeyFile: anthropic-key, model: claude-sonnet-4-5";
    let yaml = [
        route("claude", "claude", &claude, anthropic),
        route("limited", "limited", &limited, anthropic),
        route("openai", "gpt", &openai, ""),
    ]
    .join("---\n");
    dir.write("routes.yaml", &yaml);
    let gateway = Gateway::start(&dir).await;

    let checks = ["plain", "stream", "tool", "tool-stream", "rate-limited", "responses", "responses-stream"];
    let env = [("BACKEND_KEY", BACKEND_KEY)];
    run_sdk_script(SCRIPT, &[&gateway.url("/v1")], &env, &checks, Duration::from_secs(120)).await;
    // The SDK does not retry a 429 whose retry-after is this long: one call.
    assert_eq!(limited.script().requests(), 1);

    // Usage from Anthropic's events and from the Responses API is counted.
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    for route in ["default/claude", "default/openai"] {
        let input: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("sluice_tokens_total{") && l.contains(&format!("route=\"{route}\"")))
            .filter(|l| l.contains("token_type=\"input\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(input > 0.0, "no input tokens counted for {route}:\n{metrics}");
    }
    // The GenAI conventions name the provider that served it.
    let usage = |provider: &str| {
        metrics.lines().any(|l| {
            l.starts_with("gen_ai_client_token_usage_count{")
                && l.contains(&format!("gen_ai_provider_name=\"{provider}\""))
                && l.contains(&format!(
                    "gen_ai_request_model=\"{}\"",
                    if provider == "anthropic" { "claude" } else { "gpt" }
                ))
        })
    };
    assert!(usage("anthropic") && usage("openai"), "{metrics}");
}

/// `sys.argv[1]`: the gateway's `/v1`. Each check prints `ok NAME`.
const SCRIPT: &str = r#"
import json, os, sys

import openai
from openai.types.chat import ChatCompletion

client = openai.OpenAI(base_url=sys.argv[1], api_key="client-key-for-the-gateway", max_retries=0)
key = os.environ["BACKEND_KEY"]

def echoed(text):
    doc = json.loads(text)
    headers = doc["headers"]
    assert headers.get("x-api-key") == key, headers
    assert "anthropic-version" in headers, headers
    assert "authorization" not in headers, "the client's credential reached Anthropic: %r" % headers
    assert doc["path"] == "/v1/messages", doc["path"]
    return doc

messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]

reply = client.chat.completions.create(model="claude", messages=messages)
assert isinstance(reply, ChatCompletion)
assert reply.object == "chat.completion", reply
assert reply.choices[0].finish_reason == "stop", reply
doc = echoed(reply.choices[0].message.content)
assert doc["model"] == "claude-sonnet-4-5", doc["model"]
assert doc["body"]["system"] in ("Be brief.", [{"type": "text", "text": "Be brief."}]), doc["body"]
assert doc["body"]["max_tokens"] > 0, doc["body"]
assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0, reply.usage
assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens, reply.usage
print("ok plain")

stream = client.chat.completions.create(
    model="claude", messages=messages, stream=True, stream_options={"include_usage": True})
text, finish, usage, chunks = "", None, None, 0
for chunk in stream:
    chunks += 1
    assert chunk.object == "chat.completion.chunk", chunk
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
assert chunks > 3, chunks
assert finish == "stop", finish
echoed(text)
assert usage is not None and usage.completion_tokens > 0, usage
print("ok stream")

tools = [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
ask = [{"role": "user", "content": "please call tool get_weather"}]
reply = client.chat.completions.create(model="claude", messages=ask, tools=tools)
choice = reply.choices[0]
assert choice.finish_reason == "tool_calls", reply
call = choice.message.tool_calls[0]
assert call.type == "function" and call.function.name == "get_weather", call
json.loads(call.function.arguments)
# The tool's result goes back, and Anthropic receives it as a tool_result.
follow = ask + [choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
reply = client.chat.completions.create(model="claude", messages=follow, tools=tools)
doc = echoed(reply.choices[0].message.content)
blocks = [b for m in doc["messages"] for b in (m["content"] if isinstance(m["content"], list) else [])]
assert any(b.get("type") == "tool_result" and b.get("tool_use_id") == call.id for b in blocks), doc["messages"]
assert any(b.get("type") == "tool_use" and b.get("id") == call.id for b in blocks), doc["messages"]
print("ok tool")

stream = client.chat.completions.create(model="claude", messages=ask, tools=tools, stream=True)
name, arguments, finish = None, "", None
for chunk in stream:
    for choice in chunk.choices:
        for delta in choice.delta.tool_calls or []:
            assert delta.index == 0, delta
            name = (delta.function.name if delta.function and delta.function.name else name)
            arguments += (delta.function.arguments or "") if delta.function else ""
        finish = choice.finish_reason or finish
assert name == "get_weather" and finish == "tool_calls", (name, finish)
json.loads(arguments)
print("ok tool-stream")

try:
    client.chat.completions.create(model="limited", messages=messages)
    raise AssertionError("a 429 went unnoticed")
except openai.RateLimitError as error:
    assert error.status_code == 429, error
    body = error.body if isinstance(error.body, dict) else {}
    assert body.get("code") == "rate_limit_exceeded" or body.get("type"), error.body
    assert error.response.headers.get("retry-after") == "30", dict(error.response.headers)
print("ok rate-limited")

response = client.responses.create(model="gpt", input="hello there")
assert response.object == "response" and response.status == "completed", response
assert response.output_text, response
assert response.usage.input_tokens > 0, response.usage
print("ok responses")

completed = None
with client.responses.stream(model="gpt", input="hello there") as stream:
    for event in stream:
        if event.type == "response.completed":
            completed = event.response
assert completed is not None and completed.usage.output_tokens > 0, completed
print("ok responses-stream")
"#;
