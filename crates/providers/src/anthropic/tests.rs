use serde_json::{Value, json};

use super::*;

/// The Messages request made from an OpenAI request.
fn translate(openai: Value) -> Value {
    let request = chat_request(openai.to_string().as_bytes(), None).expect("translated");
    serde_json::from_slice(&request.body).expect("JSON")
}

/// Why an OpenAI request is refused, after checking it is the client's fault.
fn refused(openai: &str) -> String {
    match chat_request(openai.as_bytes(), None) {
        Ok(request) => panic!("{openai} was translated: {}", String::from_utf8_lossy(&request.body)),
        Err(error) => {
            assert!(error.is_client_error(), "{openai}: {error}");
            error.to_string()
        }
    }
}

fn response(anthropic: &str) -> Value {
    let mut completion: Value =
        serde_json::from_slice(&chat_response(anthropic.as_bytes()).expect("translated")).unwrap();
    // `created` is the clock's: checked for being it, then left out.
    let created = completion.as_object_mut().unwrap().remove("created").unwrap();
    assert!(created.as_u64().unwrap().abs_diff(now()) < 60, "{created}");
    completion
}

fn error(status: u16, anthropic: &str) -> Value {
    serde_json::from_slice(&error_response(status, anthropic.as_bytes())).expect("JSON")
}

// --- Requests ---------------------------------------------------------------

/// OpenAI's reference, "Create chat completion", the default example.
#[test]
fn the_openai_reference_default_example() {
    let openai = json!({
        "model": "gpt-4.1",
        "messages": [
            {"role": "developer", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello!"}
        ]
    });
    assert_eq!(
        translate(openai),
        json!({
            "model": "gpt-4.1",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "system": "You are a helpful assistant.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello!"}]}]
        })
    );
}

#[test]
fn the_backend_model_replaces_the_clients() {
    let openai = json!({"model": "gpt-4.1", "messages": [{"role": "user", "content": "Hi"}]});
    let request = chat_request(openai.to_string().as_bytes(), Some("claude-sonnet-4-5")).unwrap();
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body["model"], "claude-sonnet-4-5");
    // Without a model in the request, the backend's is enough.
    let request = chat_request(br#"{"messages":[{"role":"user","content":"Hi"}]}"#, Some("claude-haiku-4-5")).unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&request.body).unwrap()["model"], "claude-haiku-4-5");
}

/// OpenAI's reference, the "Image input" example, and a data URL, which
/// Anthropic takes as base64 (its vision guide's `source`).
#[test]
fn images_by_url_and_inline() {
    let openai = json!({
        "model": "gpt-4.1",
        "messages": [{
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/wikipedia/commons/thumb/d/dd/Gfp-wisconsin-madison-the-nature-boardwalk.jpg/2560px-Gfp-wisconsin-madison-the-nature-boardwalk.jpg"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}
            ]
        }],
        "max_tokens": 300
    });
    assert_eq!(
        translate(openai),
        json!({
            "model": "gpt-4.1",
            "max_tokens": 300,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image", "source": {"type": "url", "url": "https://upload.wikimedia.org/wikipedia/commons/thumb/d/dd/Gfp-wisconsin-madison-the-nature-boardwalk.jpg/2560px-Gfp-wisconsin-madison-the-nature-boardwalk.jpg"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
            ]}]
        })
    );
}

/// OpenAI's reference, the "Functions" example, becomes the request of
/// Anthropic's tool use guide.
#[test]
fn the_openai_reference_functions_example() {
    let openai = json!({
        "model": "gpt-4.1",
        "messages": [{"role": "user", "content": "What is the weather like in Boston today?"}],
        "tools": [{
            "type": "function",
            "function": {
                "name": "get_current_weather",
                "description": "Get the current weather in a given location",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                    },
                    "required": ["location"]
                }
            }
        }],
        "tool_choice": "auto"
    });
    assert_eq!(
        translate(openai),
        json!({
            "model": "gpt-4.1",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "What is the weather like in Boston today?"}]}],
            "tools": [{
                "name": "get_current_weather",
                "description": "Get the current weather in a given location",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                    },
                    "required": ["location"]
                }
            }],
            "tool_choice": {"type": "auto"}
        })
    );
}

/// A conversation after two parallel tool calls: the assistant's calls (the
/// arguments as OpenAI's reference shows them, with newlines) become
/// tool_use blocks, the two results one user turn, tool results first, as
/// Anthropic's tool use guide requires.
#[test]
fn tool_calls_and_results_in_the_history() {
    let openai = json!({
        "model": "gpt-4.1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the weather like in Boston and Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_abc123", "type": "function", "function": {"name": "get_current_weather", "arguments": "{\n\"location\": \"Boston, MA\"\n}"}},
                {"id": "call_def456", "type": "function", "function": {"name": "get_current_weather", "arguments": "{\"location\": \"Paris\", \"unit\": \"celsius\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_abc123", "content": "22 degrees"},
            {"role": "tool", "tool_call_id": "call_def456", "content": [{"type": "text", "text": "15 degrees"}]},
            {"role": "user", "content": "And tomorrow?"}
        ]
    });
    assert_eq!(
        translate(openai),
        json!({
            "model": "gpt-4.1",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What is the weather like in Boston and Paris?"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_abc123", "name": "get_current_weather", "input": {"location": "Boston, MA"}},
                    {"type": "tool_use", "id": "call_def456", "name": "get_current_weather", "input": {"location": "Paris", "unit": "celsius"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_abc123", "content": [{"type": "text", "text": "22 degrees"}]},
                    {"type": "tool_result", "tool_use_id": "call_def456", "content": [{"type": "text", "text": "15 degrees"}]},
                    {"type": "text", "text": "And tomorrow?"}
                ]}
            ]
        })
    );
}

/// Tool schemas and arguments reach Anthropic as the client wrote them: the
/// schema's property order (which the model reads) and numbers past f64.
#[test]
fn schemas_and_arguments_pass_through_verbatim() {
    let openai = r#"{"model":"m","messages":[
        {"role":"user","content":"Book it"},
        {"role":"assistant","content":"Booking.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"book","arguments":"{\"zone\":\"B\",\"account\":123456789012345678901234567890}"}}]},
        {"role":"tool","tool_call_id":"call_1","content":""}],
      "tools":[{"type":"function","function":{"name":"book","parameters":{"type":"object","properties":{"zone":{"type":"string"},"account":{"type":"integer"}}}}},
               {"type":"function","function":{"name":"noop"}}]}"#;
    let body = String::from_utf8(chat_request(openai.as_bytes(), None).unwrap().body).unwrap();
    assert!(body.contains(r#""input":{"zone":"B","account":123456789012345678901234567890}"#), "{body}");
    assert!(
        body.contains(
            r#""input_schema":{"type":"object","properties":{"zone":{"type":"string"},"account":{"type":"integer"}}}"#
        ),
        "{body}"
    );
    let body: Value = serde_json::from_str(&body).unwrap();
    // A function without parameters takes none; an empty result has no content.
    assert_eq!(body["tools"][1], json!({"name": "noop", "input_schema": {"type": "object", "properties": {}}}));
    assert_eq!(body["messages"][2]["content"], json!([{"type": "tool_result", "tool_use_id": "call_1"}]));
    assert_eq!(body["messages"][1]["content"][0], json!({"type": "text", "text": "Booking."}));
}

#[test]
fn turns_with_the_same_role_merge_and_system_text_joins() {
    let openai = json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "One."},
            {"role": "user", "content": "a"},
            {"role": "developer", "content": [{"type": "text", "text": "Two."}]},
            {"role": "user", "content": [{"type": "text", "text": "b"}, {"type": "text", "text": ""}]},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": [{"type": "text", "text": "d"}, {"type": "text", "text": "No."}]},
            {"role": "assistant", "content": "e", "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": ""}}]}
        ]
    });
    assert_eq!(
        translate(openai),
        json!({
            "model": "m",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "system": "One.\n\nTwo.",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "a"}, {"type": "text", "text": "b"}, {"type": "text", "text": "c"}
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "d"}, {"type": "text", "text": "No."}, {"type": "text", "text": "e"},
                    {"type": "tool_use", "id": "t", "name": "f", "input": {}}
                ]}
            ]
        })
    );
}

#[test]
fn sampling_stop_tools_metadata_and_stream_options() {
    let openai = json!({
        "model": "gpt-4.1",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 100,
        "max_completion_tokens": 200,
        "temperature": 0.7,
        "top_p": 0.9,
        "stop": ["\n\nHuman:", ""],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": false,
        "user": "user-1234",
        "metadata": {"user_id": "ignored"},
        "stream": true,
        "stream_options": {"include_usage": true},
        "n": 1,
        // No counterpart at Anthropic: dropped.
        "frequency_penalty": 0.5, "presence_penalty": 0.5, "seed": 7, "logprobs": true,
        "response_format": {"type": "json_object"}, "service_tier": "auto"
    });
    let request = chat_request(openai.to_string().as_bytes(), None).unwrap();
    assert!(request.stream && request.include_usage);
    assert_eq!(
        serde_json::from_slice::<Value>(&request.body).unwrap(),
        json!({
            "model": "gpt-4.1",
            "max_tokens": 200,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "temperature": 0.7,
            "top_p": 0.9,
            "stop_sequences": ["\n\nHuman:"],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true},
            "metadata": {"user_id": "user-1234"},
            "stream": true
        })
    );

    let with = |fields: Value| {
        let mut openai = json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]});
        openai.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        translate(openai)
    };
    assert_eq!(with(json!({"tool_choice": "required"}))["tool_choice"], json!({"type": "any"}));
    assert_eq!(
        with(json!({"tool_choice": "none", "parallel_tool_calls": false}))["tool_choice"],
        json!({"type": "none"})
    );
    assert_eq!(
        with(json!({"parallel_tool_calls": false}))["tool_choice"],
        json!({"type": "auto", "disable_parallel_tool_use": true})
    );
    assert_eq!(with(json!({"tool_choice": null, "parallel_tool_calls": true}))["tool_choice"], Value::Null);
    assert_eq!(with(json!({"stop": "END", "max_tokens": 5}))["stop_sequences"], json!(["END"]));
    assert_eq!(with(json!({"stop": "END", "max_tokens": 5}))["max_tokens"], 5);
    assert_eq!(with(json!({"metadata": {"user_id": "u-9"}}))["metadata"], json!({"user_id": "u-9"}));
    // Without tools a tool_choice says nothing, and Anthropic refuses one.
    let no_tools =
        translate(json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "tool_choice": "required"}));
    assert_eq!(no_tools.get("tool_choice"), None);
    // include_usage only means something for a stream.
    let plain = json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream_options": {"include_usage": true}});
    let request = chat_request(plain.to_string().as_bytes(), None).unwrap();
    assert!(!request.stream && !request.include_usage);
    assert_eq!(serde_json::from_slice::<Value>(&request.body).unwrap().get("stream"), None);
}

#[test]
fn requests_anthropic_cannot_take_are_refused() {
    let user = r#"{"role":"user","content":"Hi"}"#;
    let cases = [
        ("not json", "invalid request body"),
        (r#"{"model":"m"}"#, "missing field `messages`"),
        (&format!(r#"{{"messages":[{user}]}}"#), "model is required"),
        (&format!(r#"{{"model":"m","messages":[{user}],"n":2}}"#), "n:"),
        (r#"{"model":"m","messages":[]}"#, "at least one user or assistant message"),
        (r#"{"model":"m","messages":[{"role":"system","content":"Only rules."}]}"#, "at least one user or assistant"),
        (r#"{"model":"m","messages":[{"role":"function","name":"f","content":"x"}]}"#, "messages[0].role \"function\""),
        (r#"{"model":"m","messages":[{"role":"user","content":7}]}"#, "messages[0].content must be"),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}"#,
            "\"input_audio\"",
        ),
        (r#"{"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]}"#, "content[0].type"),
        // Text from anywhere but a `text` part's `text` would reach the
        // model unseen by policy plugins, which read only that.
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"refusal","refusal":"x"}]}]}"#,
            "content[0]: content part type \"refusal\"",
        ),
        (
            r#"{"model":"m","messages":[{"role":"assistant","content":[{"type":"refusal","refusal":"x"}]}]}"#,
            "\"refusal\"",
        ),
        (
            r#"{"model":"m","messages":[{"role":"tool","tool_call_id":"t","content":[{"type":"refusal","refusal":"x"}]}]}"#,
            "\"refusal\"",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"input_text","text":"x"}]}]}"#,
            "\"input_text\"",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":3}]}]}"#,
            "content[0].text must be a string",
        ),
        (
            r#"{"model":"m","messages":[{"role":"system","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}"#,
            "\"image_url\"",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"ftp://x/y.png"}}]}]}"#,
            "http(s) and data URLs",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png,abc"}}]}]}"#,
            "base64",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64"}}]}]}"#,
            "comma",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:;base64,abc"}}]}]}"#,
            "media type",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
            "image_url.url",
        ),
        (
            r#"{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]}]}"#,
            "tool_calls[0]: function.arguments is not valid JSON",
        ),
        (
            r#"{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"[1]"}}]}]}"#,
            "must be a JSON object",
        ),
        (
            r#"{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"custom","function":{"name":"f"}}]}]}"#,
            "\"custom\"",
        ),
        (
            r#"{"model":"m","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f"}}]}]}"#,
            "missing field `id`",
        ),
        (r#"{"model":"m","messages":[{"role":"tool","content":"x"}]}"#, "messages[0].tool_call_id is required"),
        (
            &format!(r#"{{"model":"m","messages":[{user}],"tools":[{{"type":"custom","custom":{{"name":"x"}}}}]}}"#),
            "tools[0].type",
        ),
        (
            &format!(r#"{{"model":"m","messages":[{user}],"tools":[{{"type":"function"}}]}}"#),
            "tools[0].function is required",
        ),
        (
            &format!(
                r#"{{"model":"m","messages":[{user}],"tools":[{{"type":"function","function":{{"name":"f","parameters":"x"}}}}]}}"#
            ),
            "parameters must be",
        ),
        (
            &format!(
                r#"{{"model":"m","messages":[{user}],"tools":[{{"type":"function","function":{{"name":"f"}}}}],"tool_choice":"sometimes"}}"#
            ),
            "tool_choice \"sometimes\"",
        ),
        (
            &format!(
                r#"{{"model":"m","messages":[{user}],"tools":[{{"type":"function","function":{{"name":"f"}}}}],"tool_choice":{{"type":"function"}}}}"#
            ),
            "a function by name",
        ),
        (&format!(r#"{{"model":"m","messages":[{user}],"stop":[1]}}"#), "stop must be"),
        (&format!(r#"{{"model":"m","messages":[{user}],"max_tokens":-1}}"#), "expected u64"),
        (&format!(r#"{{"model":"m","messages":[{user}],"temperature":"hot"}}"#), "invalid type: string \"hot\""),
    ];
    for (openai, why) in cases {
        let message = refused(openai);
        assert!(message.contains(why), "{openai}: {message:?} does not say {why:?}");
    }
}

#[test]
fn translate_errors_say_whose_fault() {
    let client = chat_request(b"[]", None).unwrap_err();
    let body: Value = serde_json::from_slice(&client.openai_body()).unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("invalid request body"), "{body}");
    let upstream = chat_response(b"<html>").unwrap_err();
    assert!(!upstream.is_client_error());
    assert_eq!(serde_json::from_slice::<Value>(&upstream.openai_body()).unwrap()["error"]["type"], "server_error");
}

// --- Responses --------------------------------------------------------------

/// Anthropic's reference, "Create a Message", the example response.
#[test]
fn the_anthropic_reference_message() {
    let anthropic = r#"{
      "content": [
        {
          "text": "Hi! My name is Claude.",
          "type": "text"
        }
      ],
      "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
      "model": "claude-sonnet-4-5-20250929",
      "role": "assistant",
      "stop_reason": "end_turn",
      "stop_sequence": null,
      "type": "message",
      "usage": {
        "input_tokens": 2095,
        "output_tokens": 503
      }
    }"#;
    assert_eq!(
        response(anthropic),
        json!({
            "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
            "object": "chat.completion",
            "model": "claude-sonnet-4-5-20250929",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "Hi! My name is Claude.", "refusal": null},
                "finish_reason": "stop",
                "logprobs": null
            }],
            "usage": {"prompt_tokens": 2095, "completion_tokens": 503, "total_tokens": 2598, "prompt_tokens_details": {"cached_tokens": 0}}
        })
    );
}

/// Anthropic's tool use guide, the response with a tool_use block; the
/// arguments are the input's text as Anthropic sent it.
#[test]
fn the_anthropic_tool_use_response() {
    let anthropic = r#"{
      "id": "msg_01Aq9w938a90dw8q",
      "model": "claude-sonnet-4-5",
      "stop_reason": "tool_use",
      "role": "assistant",
      "content": [
        {
          "type": "text",
          "text": "I'll check the current weather in San Francisco for you."
        },
        {
          "type": "tool_use",
          "id": "toolu_01A09q90qw90lq917835lq9",
          "name": "get_weather",
          "input": {"location": "San Francisco, CA", "unit": "celsius"}
        }
      ]
    }"#;
    assert_eq!(
        response(anthropic),
        json!({
            "id": "msg_01Aq9w938a90dw8q",
            "object": "chat.completion",
            "model": "claude-sonnet-4-5",
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "I'll check the current weather in San Francisco for you.",
                    "refusal": null,
                    "tool_calls": [{
                        "id": "toolu_01A09q90qw90lq917835lq9",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"location\": \"San Francisco, CA\", \"unit\": \"celsius\"}"}
                    }]
                },
                "finish_reason": "tool_calls",
                "logprobs": null
            }],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}
        })
    );
}

#[test]
fn thinking_is_left_out_and_cached_tokens_count_as_prompt() {
    let anthropic = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-4-1",
      "content":[{"type":"thinking","thinking":"Let me add.","signature":"EqQB"},
                 {"type":"redacted_thinking","data":"xyz"},
                 {"type":"text","text":"27 * 453 = ","citations":null},{"type":"text","text":"12,231"},
                 {"type":"some_future_block","name":{"not":"a string"}},
                 {"type":"tool_use","id":"toolu_2","name":"noop"}],
      "stop_reason":"max_tokens","stop_sequence":null,
      "usage":{"input_tokens":100,"cache_creation_input_tokens":20,"cache_read_input_tokens":30,"output_tokens":5}}"#;
    let completion = response(anthropic);
    assert_eq!(completion["choices"][0]["message"]["content"], "27 * 453 = 12,231");
    assert_eq!(
        completion["choices"][0]["message"]["tool_calls"][0]["function"],
        json!({"name": "noop", "arguments": "{}"})
    );
    assert_eq!(completion["choices"][0]["finish_reason"], "length");
    assert_eq!(
        completion["usage"],
        json!({"prompt_tokens": 150, "completion_tokens": 5, "total_tokens": 155, "prompt_tokens_details": {"cached_tokens": 30}})
    );

    let only_tools = r#"{"id":"msg_2","model":"m","content":[{"type":"tool_use","id":"t","name":"f","input":{}}],"stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":2,"cache_read_input_tokens":null}}"#;
    let completion = response(only_tools);
    assert_eq!(completion["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(completion["usage"]["total_tokens"], 3);
}

#[test]
fn stop_reasons_become_finish_reasons() {
    for (stop_reason, finish) in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
    ] {
        let anthropic = format!(r#"{{"id":"m","model":"m","content":[],"stop_reason":"{stop_reason}"}}"#);
        assert_eq!(response(&anthropic)["choices"][0]["finish_reason"], finish, "{stop_reason}");
    }
}

#[test]
fn unreadable_responses_are_the_upstreams_fault() {
    for anthropic in [
        "",
        "<html>502 Bad Gateway</html>",
        r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
        r#"{"id":"m","model":"m","content":{}}"#,
        r#"{"id":"m","model":"m","content":[{"text":"no type"}]}"#,
        r#"{"id":"m","model":"m","content":[{"type":"text"}]}"#,
        r#"{"id":"m","model":"m","content":[{"type":"tool_use","id":"t","input":{}}]}"#,
    ] {
        let error = chat_response(anthropic.as_bytes()).unwrap_err();
        assert!(!error.is_client_error(), "{anthropic}: {error}");
    }
}

// --- Errors -----------------------------------------------------------------

/// Anthropic's errors page, the example, and each documented error type.
#[test]
fn anthropic_errors_become_openai_errors() {
    let documented = r#"{
      "type": "error",
      "error": {
        "type": "not_found_error",
        "message": "The requested resource could not be found."
      },
      "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"
    }"#;
    assert_eq!(
        error(404, documented),
        json!({"error": {"message": "The requested resource could not be found.", "type": "not_found_error", "param": null, "code": null}})
    );
    for (status, anthropic_type, kind, code) in [
        (400, "invalid_request_error", "invalid_request_error", None),
        (401, "authentication_error", "invalid_request_error", Some("invalid_api_key")),
        (403, "permission_error", "permission_error", None),
        (413, "request_too_large", "invalid_request_error", Some("request_too_large")),
        (429, "rate_limit_error", "rate_limit_error", Some("rate_limit_exceeded")),
        (500, "api_error", "server_error", None),
        (529, "overloaded_error", "server_error", Some("overloaded")),
    ] {
        let body = json!({"type": "error", "error": {"type": anthropic_type, "message": "Something."}}).to_string();
        assert_eq!(
            error(status, &body),
            json!({"error": {"message": "Something.", "type": kind, "param": null, "code": code}}),
            "{anthropic_type}"
        );
    }
}

#[test]
fn a_prompt_too_long_is_context_length_exceeded() {
    for message in [
        "prompt is too long: 208310 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 197202 + 8192 > 200000, decrease input length or `max_tokens` and try again",
    ] {
        assert!(is_context_length_error(message), "{message}");
        let body = json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}).to_string();
        assert_eq!(error(400, &body)["error"]["code"], "context_length_exceeded");
    }
    assert!(is_context_length_error("This model's maximum context length is 128000 tokens."));
    for message in
        ["max_tokens: Field required", "messages: roles must alternate between \"user\" and \"assistant\"", ""]
    {
        assert!(!is_context_length_error(message), "{message}");
    }
    // Only a bad request says so: an overloaded upstream's wording does not.
    let body = r#"{"type":"error","error":{"type":"overloaded_error","message":"prompt is too long"}}"#;
    assert_eq!(error(529, body)["error"]["code"], "overloaded");
}

#[test]
fn an_unreadable_error_falls_back_on_the_status() {
    assert_eq!(
        error(502, "<html><body>Bad Gateway</body></html>"),
        json!({"error": {"message": "the upstream answered HTTP 502", "type": "server_error", "param": null, "code": null}})
    );
    assert_eq!(error(429, "")["error"]["code"], "rate_limit_exceeded");
    assert_eq!(error(401, "{}")["error"]["code"], "invalid_api_key");
    assert_eq!(error(400, r#"{"error":"flat"}"#)["error"]["type"], "invalid_request_error");
    // Anthropic's message without its type: the status gives the type.
    let body = r#"{"error":{"message":"prompt is too long: 300000 tokens > 200000 maximum"}}"#;
    assert_eq!(error(400, body)["error"]["code"], "context_length_exceeded");
}

// --- Streams ----------------------------------------------------------------

/// Anthropic's streaming guide, "Basic streaming request".
const BASIC_STREAM: &str = r#"event: message_start
data: {"type": "message_start", "message": {"id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "type": "message", "role": "assistant", "content": [], "model": "claude-opus-4-20250514", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}

event: content_block_start
data: {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}

event: content_block_stop
data: {"type": "content_block_stop", "index": 0}

event: message_delta
data: {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence":null}, "usage": {"output_tokens": 15}}

event: message_stop
data: {"type": "message_stop"}
"#;

/// Anthropic's streaming guide, "Streaming request with tool use".
const TOOL_STREAM: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-opus-4-20250514","stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2},"content":[],"stop_reason":null}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":","}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" let"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'s"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" check"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" the"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" weather"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" for"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" San"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" Francisco"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":","}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" CA"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":":"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"San"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" Francisc"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"o,"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" CA\""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":", "}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"unit\": \"fah"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"renheit\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}

event: message_stop
data: {"type":"message_stop"}
"#;

/// Anthropic's streaming guide, "Streaming request with extended thinking".
const THINKING_STREAM: &str = r#"event: message_start
data: {"type": "message_start", "message": {"id": "msg_01...", "type": "message", "role": "assistant", "content": [], "model": "claude-opus-4-20250514", "stop_reason": null, "stop_sequence": null}}

event: content_block_start
data: {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Let me solve this step by step:\n\n1. First break down 27 * 453"}}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "\n2. 453 = 400 + 50 + 3"}}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."}}

event: content_block_stop
data: {"type": "content_block_stop", "index": 0}

event: content_block_start
data: {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}

event: content_block_delta
data: {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "27 * 453 = 12,231"}}

event: content_block_stop
data: {"type": "content_block_stop", "index": 1}

event: message_delta
data: {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}}

event: message_stop
data: {"type": "message_stop"}
"#;

/// A transcript's events: (name, data).
fn events(transcript: &str) -> Vec<(String, String)> {
    transcript
        .split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            let field = |name: &str| event.lines().find_map(|line| line.strip_prefix(name)).unwrap().to_owned();
            (field("event: "), field("data: "))
        })
        .collect()
}

/// Every payload a translator sends for a transcript, then for its end.
fn translate_stream(transcript: &str, include_usage: bool) -> Vec<String> {
    let mut translator = StreamTranslator::new(include_usage);
    let mut payloads = Vec::new();
    for (name, data) in events(transcript) {
        payloads.extend(translator.event(Some(&name), &data));
    }
    payloads.extend(translator.finish());
    payloads
}

/// What an OpenAI client makes of a stream's payloads.
#[derive(Debug, Default, PartialEq)]
struct Assembled {
    role: Option<String>,
    content: String,
    /// (id, name, arguments), by tool call index.
    tool_calls: Vec<(String, String, String)>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    error: Option<Value>,
    done: bool,
}

fn assemble(payloads: &[String]) -> Assembled {
    let mut assembled = Assembled::default();
    let mut id = None;
    for payload in payloads {
        assert!(!assembled.done && assembled.error.is_none(), "{payload} after the end");
        if payload == "[DONE]" {
            assembled.done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(payload).unwrap();
        if let Some(error) = chunk.get("error") {
            assembled.error = Some(error.clone());
            continue;
        }
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert!(chunk["created"].as_u64().unwrap().abs_diff(now()) < 60);
        assert_eq!(id.get_or_insert_with(|| chunk["id"].clone()), &chunk["id"], "one id for all chunks");
        let choices = chunk["choices"].as_array().unwrap();
        if choices.is_empty() {
            assembled.usage = Some(chunk["usage"].clone());
            continue;
        }
        assert_eq!(choices.len(), 1);
        let choice = &choices[0];
        assert_eq!((&choice["index"], &choice["logprobs"]), (&json!(0), &Value::Null));
        assert!(chunk.get("usage").is_none_or(Value::is_null), "usage only on the last chunk: {chunk}");
        if let Some(reason) = choice["finish_reason"].as_str() {
            assert_eq!(assembled.finish_reason.replace(reason.to_owned()), None, "one finish_reason");
        }
        let delta = &choice["delta"];
        if let Some(role) = delta["role"].as_str() {
            assembled.role = Some(role.to_owned());
        }
        assembled.content.push_str(delta["content"].as_str().unwrap_or_default());
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if let Some(id) = call["id"].as_str() {
                assert_eq!(index, assembled.tool_calls.len(), "tool calls are numbered in order");
                assert_eq!(call["type"], "function");
                assembled.tool_calls.push((
                    id.to_owned(),
                    call["function"]["name"].as_str().unwrap().to_owned(),
                    String::new(),
                ));
            }
            let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
            assembled.tool_calls[index].2.push_str(arguments);
        }
    }
    assembled
}

#[test]
fn the_basic_stream() {
    let payloads = translate_stream(BASIC_STREAM, false);
    let chunk = |i: usize| serde_json::from_str::<Value>(&payloads[i]).unwrap();
    let created = chunk(0)["created"].clone();
    let expected = |delta: Value, finish: Value| {
        json!({"id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "object": "chat.completion.chunk", "created": created,
               "model": "claude-opus-4-20250514",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
    };
    assert_eq!(payloads.len(), 5, "{payloads:#?}");
    assert_eq!(chunk(0), expected(json!({"role": "assistant", "content": ""}), Value::Null));
    assert_eq!(chunk(1), expected(json!({"content": "Hello"}), Value::Null));
    assert_eq!(chunk(2), expected(json!({"content": "!"}), Value::Null));
    assert_eq!(chunk(3), expected(json!({}), json!("stop")));
    assert_eq!(payloads[4], "[DONE]");
}

#[test]
fn a_streamed_tool_call_assembles_with_its_usage() {
    let payloads = translate_stream(TOOL_STREAM, true);
    assert_eq!(
        assemble(&payloads),
        Assembled {
            role: Some("assistant".into()),
            content: "Okay, let's check the weather for San Francisco, CA:".into(),
            tool_calls: vec![(
                "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                "get_weather".into(),
                r#"{"location": "San Francisco, CA", "unit": "fahrenheit"}"#.into()
            )],
            finish_reason: Some("tool_calls".into()),
            usage: Some(json!({"prompt_tokens": 472, "completion_tokens": 89, "total_tokens": 561,
                               "prompt_tokens_details": {"cached_tokens": 0}})),
            error: None,
            done: true,
        }
    );
    // With include_usage every other chunk says `"usage": null`, as OpenAI's do.
    let usage_nulls = payloads.iter().filter(|payload| payload.contains(r#""usage":null"#)).count();
    assert_eq!(usage_nulls, payloads.len() - 2, "all but the usage chunk and [DONE]");
    // The tool call's first chunk, as OpenAI's reference shows one.
    let start: Value =
        payloads.iter().find(|payload| payload.contains("toolu_")).map(|p| serde_json::from_str(p).unwrap()).unwrap();
    assert_eq!(
        start["choices"][0]["delta"],
        json!({"tool_calls": [{"index": 0, "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]})
    );
}

#[test]
fn thinking_is_not_streamed() {
    let assembled = assemble(&translate_stream(THINKING_STREAM, true));
    assert_eq!(assembled.content, "27 * 453 = 12,231");
    assert_eq!(assembled.finish_reason.as_deref(), Some("stop"));
    assert!(assembled.done && assembled.tool_calls.is_empty());
    assert_eq!(assembled.usage.unwrap()["total_tokens"], 0);
}

#[test]
fn tool_calls_are_numbered_apart_from_blocks() {
    let transcript = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_1","model":"m","usage":{"input_tokens":10,"cache_read_input_tokens":90,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"query\":\"x\"}"}}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_a","name":"f","input":{}}}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_b","name":"g","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"b\":2}"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":1}"}}

event: some_future_event
data: {"type":"some_future_event","index":"x"}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"input_tokens":10,"cache_read_input_tokens":90,"output_tokens":7}}

event: message_stop
data: {"type":"message_stop"}
"#;
    let assembled = assemble(&translate_stream(transcript, true));
    assert_eq!(
        assembled.tool_calls,
        vec![("toolu_a".into(), "f".into(), r#"{"a":1}"#.into()), ("toolu_b".into(), "g".into(), r#"{"b":2}"#.into())]
    );
    assert_eq!(
        assembled.usage,
        Some(
            json!({"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107, "prompt_tokens_details": {"cached_tokens": 90}})
        )
    );
}

#[test]
fn events_without_names_go_by_their_type() {
    let mut translator = StreamTranslator::new(false);
    let mut payloads = Vec::new();
    for (i, (_, data)) in events(BASIC_STREAM).into_iter().enumerate() {
        // SSE calls an event without a name "message".
        let name = if i % 2 == 0 { None } else { Some("message") };
        payloads.extend(translator.event(name, &data));
    }
    assert_eq!(comparable(&payloads), comparable(&translate_stream(BASIC_STREAM, false)));
    assert_eq!(payloads.len(), 5);
}

/// Payloads as JSON without the clock's `created`.
fn comparable(payloads: &[String]) -> Vec<Value> {
    let comparable = |payload: &String| {
        let mut payload = serde_json::from_str(payload).unwrap_or_else(|_| Value::String(payload.clone()));
        payload.as_object_mut().map(|chunk| chunk.remove("created"));
        payload
    };
    payloads.iter().map(comparable).collect()
}

/// Anthropic's streaming guide: an `overloaded_error` event mid-stream.
#[test]
fn an_error_event_ends_the_stream() {
    let mut translator = StreamTranslator::new(true);
    let events = events(BASIC_STREAM);
    let mut payloads = Vec::new();
    for (name, data) in &events[..4] {
        payloads.extend(translator.event(Some(name), data));
    }
    payloads.extend(
        translator.event(
            Some("error"),
            r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
        ),
    );
    for (name, data) in &events[4..] {
        assert_eq!(translator.event(Some(name), data), Vec::<String>::new(), "nothing after the error");
    }
    assert_eq!(translator.finish(), Vec::<String>::new());
    let assembled = assemble(&payloads);
    assert_eq!(assembled.content, "Hello");
    assert!(!assembled.done && assembled.finish_reason.is_none());
    assert_eq!(
        assembled.error,
        Some(json!({"message": "Overloaded", "type": "server_error", "param": null, "code": "overloaded"}))
    );
}

#[test]
fn a_stream_ending_early_ends_with_an_error() {
    for cut in [0, 1, 4, 7] {
        let mut translator = StreamTranslator::new(false);
        let mut payloads = Vec::new();
        for (name, data) in events(TOOL_STREAM).iter().take(cut) {
            payloads.extend(translator.event(Some(name), data));
        }
        let end = translator.finish();
        assert_eq!(end.len(), 1, "{end:?}");
        payloads.extend(end);
        let assembled = assemble(&payloads);
        assert!(!assembled.done);
        assert_eq!(assembled.error.unwrap()["type"], "server_error");
        assert_eq!(translator.finish(), Vec::<String>::new(), "the end is said once");
    }
    // After message_delta, too: the message is not complete without message_stop.
    let events = events(BASIC_STREAM);
    let mut translator = StreamTranslator::new(false);
    for (name, data) in &events[..events.len() - 1] {
        translator.event(Some(name), data);
    }
    assert!(translator.finish()[0].contains("ended before the message was complete"));
}

#[test]
fn broken_streams_end_with_an_error() {
    let start = r#"{"type":"message_start","message":{"id":"msg_1","model":"m"}}"#;
    let cases: [&[(&str, &str)]; 5] = [
        &[("message_start", "not json")],
        &[(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}"#,
        )],
        &[("message_start", r#"{"type":"message_start","message":{"model":"m"}}"#)],
        &[("message_start", start), ("message_start", start)],
        &[
            ("message_start", start),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f"}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"u","name":"g"}}"#,
            ),
        ],
    ];
    for events in cases {
        let mut translator = StreamTranslator::new(false);
        let payloads: Vec<String> = events.iter().flat_map(|(name, data)| translator.event(Some(name), data)).collect();
        let last: Value = serde_json::from_str(payloads.last().unwrap()).unwrap();
        assert_eq!(last["error"]["type"], "server_error", "{events:?}");
        assert_eq!(translator.event(Some("message_stop"), r#"{"type":"message_stop"}"#), Vec::<String>::new());
        assert_eq!(translator.finish(), Vec::<String>::new());
    }
    // A tool_use block missing its name.
    let mut translator = StreamTranslator::new(false);
    translator.event(Some("message_start"), start);
    let payloads = translator.event(
        Some("content_block_start"),
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t"}}"#,
    );
    assert!(payloads[0].contains("\"error\""), "{payloads:?}");
}

#[test]
fn a_message_stop_without_a_stop_reason_still_finishes() {
    let mut translator = StreamTranslator::new(false);
    translator.event(Some("message_start"), r#"{"type":"message_start","message":{"id":"msg_1","model":"m"}}"#);
    let payloads = translator.event(Some("message_stop"), r#"{"type":"message_stop"}"#);
    let assembled = assemble(&payloads);
    assert_eq!((assembled.finish_reason.as_deref(), assembled.done), (Some("stop"), true));
}
