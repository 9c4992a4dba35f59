//! WIT 0.3.3: MCP traffic on the request handle. The probe test plugin
//! makes the new calls through the raw bindings; mcp-policy through the SDK.

use serde_json::{Value, json};

use super::*;
use crate::built_plugin as wasm;
use crate::{Grants, McpRequest, Runtime, RuntimeConfig, test_request};

fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig { max_instances: 10, ..Default::default() }).unwrap()
}

async fn configured(runtime: &Runtime, name: &str, config: Value) -> ConfiguredPlugin {
    let module = runtime.load(wasm(name), None).await.unwrap();
    let limits = Limits { timeout: Duration::from_secs(5), max_memory_bytes: 64 << 20 };
    module.configure(name, &config, limits, Isolation::PerRequest, Grants::default()).await.unwrap()
}

/// An MCP message as the gateway hands it to plugins: the JSON-RPC message
/// as the body, the tool as the model, the MCPRoute as the route, and
/// `mcp` set; `arguments` only for `tools/call`.
fn mcp_request(method: &str, tool: Option<&str>, arguments: Option<Value>, headers: &[(&str, &str)]) -> PluginRequest {
    let mut params = serde_json::Map::new();
    if let Some(tool) = tool {
        params.insert("name".into(), tool.into());
    }
    if let Some(arguments) = &arguments {
        params.insert("arguments".into(), arguments.clone());
    }
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string();
    let mut request = test_request(headers, body);
    request.path = "/mcp".into();
    request.model = tool.unwrap_or_default().into();
    request.route = "default/tools".into();
    request.mcp = Some(McpRequest {
        method: method.into(),
        tool: tool.map(String::from),
        arguments: arguments.map(|arguments| arguments.to_string()),
        arguments_edited: false,
    });
    request
}

fn response_header<'a>(request: &'a PluginRequest, name: &str) -> &'a str {
    request.response_headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or("(unset)")
}

/// What the probe read: kind, method, tool, arguments.
fn probed(request: &PluginRequest) -> [&str; 4] {
    ["x-probe-kind", "x-probe-mcp-method", "x-probe-tool", "x-probe-arguments"]
        .map(|name| response_header(request, name))
}

/// A component built against 0.3.3 reads an MCP call through the new
/// methods and replaces its arguments: the gateway finds them in `mcp`,
/// marked edited, and the body (the JSON-RPC message) as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_3_3_component_reads_and_edits_an_mcp_call() {
    let runtime = runtime();
    let probe = configured(&runtime, "probe", json!({})).await;
    let edited = r#"{"city":"Oslo","units":"metric"}"#;
    let mut call =
        mcp_request("tools/call", Some("weather__forecast"), Some(json!({"city": "Oslo"})), &[("x-probe-mcp", edited)]);
    let body_before = call.body.bytes();
    let action = probe.instance().await.unwrap().request_filter(&mut call).await.unwrap();
    assert!(matches!(action, RequestAction::Continue), "{action:?}");
    assert_eq!(probed(&call), ["mcp", "tools/call", "weather__forecast", r#"{"city":"Oslo"}"#]);
    assert_eq!(response_header(&call, "x-probe-arguments-after"), edited, "a later read sees the edit");
    let mcp = call.mcp.as_ref().unwrap();
    assert_eq!((mcp.arguments.as_deref(), mcp.arguments_edited), (Some(edited), true));
    assert_eq!(call.body.bytes(), body_before, "the gateway rewrites the message, not the plugin");

    // Another method: the tool and arguments are none.
    let mut list = mcp_request("tools/list", None, None, &[("x-probe-mcp", "read")]);
    probe.instance().await.unwrap().request_filter(&mut list).await.unwrap();
    assert_eq!(probed(&list), ["mcp", "tools/list", "-", "-"]);
    assert!(!list.mcp.as_ref().unwrap().arguments_edited);
}

/// On a chat request the new methods read none and `chat`, and
/// `set-tool-arguments` is refused, failing the plugin as any refused edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_chat_request_the_mcp_calls_read_none_and_the_edit_is_refused() {
    let runtime = runtime();
    let probe = configured(&runtime, "probe", json!({})).await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let mut chat = test_request(&[("x-probe-mcp", "read")], body.clone());
    let action = probe.instance().await.unwrap().request_filter(&mut chat).await.unwrap();
    assert!(matches!(action, RequestAction::Continue), "{action:?}");
    assert_eq!(probed(&chat), ["chat", "-", "-", "-"]);

    let mut chat = test_request(&[("x-probe-mcp", "{}")], body);
    let result = probe.instance().await.unwrap().request_filter(&mut chat).await;
    assert!(
        matches!(&result, Err(PluginError::InvalidEdit(why)) if why.contains("not an MCP tools/call")),
        "{result:?}"
    );
    assert!(chat.mcp.is_none());
}

/// `set-tool-arguments` is refused on an MCP message other than
/// `tools/call`, for text that is not a JSON object, and past the body
/// limit; the arguments are then left as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_tool_arguments_is_refused_unless_a_tools_call_gets_a_json_object_within_the_limit() {
    let runtime = runtime();
    let probe = configured(&runtime, "probe", json!({})).await;
    let long = format!(r#"{{"text":"{}"}}"#, "x".repeat(200));
    let cases: [(&str, &str, usize, &str); 6] = [
        ("tools/list", "{}", 1 << 20, "not an MCP tools/call"),
        ("tools/call", "[1, 2]", 1 << 20, "not an object"),
        ("tools/call", "\"text\"", 1 << 20, "not an object"),
        ("tools/call", "{not json", 1 << 20, "not JSON"),
        ("tools/call", r#"{"a": 1, "a": 2}"#, 1 << 20, "not JSON"),
        ("tools/call", &long, 100, "over the limit of 100 bytes"),
    ];
    for (method, arguments, max_body_bytes, why) in cases {
        let tool = (method == "tools/call").then_some("weather__forecast");
        let original = tool.map(|_| json!({"city": "Oslo"}));
        let mut request = mcp_request(method, tool, original.clone(), &[("x-probe-mcp", arguments)]);
        request.max_body_bytes = max_body_bytes;
        let result = probe.instance().await.unwrap().request_filter(&mut request).await;
        assert!(matches!(&result, Err(PluginError::InvalidEdit(e)) if e.contains(why)), "{arguments}: {result:?}");
        let mcp = request.mcp.as_ref().unwrap();
        assert_eq!(mcp.arguments, original.map(|a| a.to_string()), "{arguments}");
        assert!(!mcp.arguments_edited, "{arguments}");
    }
}

fn policy_config() -> Value {
    json!({
        "rules": [{"consumers": ["alice", "ops-*"], "allow": ["weather__*"], "deny": ["weather__delete_*"]}],
        "anonymous": {"allow": []},
        "arguments": {"weather__forecast": {"units": "metric"}}
    })
}

/// mcp-policy, as published: allows and denies calls per consumer, forces
/// arguments into a named tool's calls, and leaves chat requests and other
/// MCP methods alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_policy_authorizes_tool_calls_per_consumer() {
    let runtime = runtime();
    let policy = configured(&runtime, "mcp-policy", policy_config()).await;
    let serve = async |request: &mut PluginRequest| policy.instance().await.unwrap().request_filter(request).await;

    let mut allowed = mcp_request("tools/call", Some("weather__forecast"), Some(json!({"city": "Oslo"})), &[]);
    allowed.consumer = Some("ops-7".into());
    assert!(matches!(serve(&mut allowed).await, Ok(RequestAction::Continue)));
    let mcp = allowed.mcp.as_ref().unwrap();
    let arguments: Value = serde_json::from_str(mcp.arguments.as_deref().unwrap()).unwrap();
    assert_eq!((arguments, mcp.arguments_edited), (json!({"city": "Oslo", "units": "metric"}), true));

    let mut other_tool = mcp_request("tools/call", Some("weather__alerts"), Some(json!({})), &[]);
    other_tool.consumer = Some("alice".into());
    assert!(matches!(serve(&mut other_tool).await, Ok(RequestAction::Continue)));
    assert!(!other_tool.mcp.as_ref().unwrap().arguments_edited);

    for (tool, consumer) in
        [("weather__delete_city", Some("alice")), ("search__web", Some("bob")), ("weather__forecast", None)]
    {
        let mut denied = mcp_request("tools/call", Some(tool), Some(json!({})), &[]);
        denied.consumer = consumer.map(String::from);
        let Ok(RequestAction::Respond(response)) = serve(&mut denied).await else {
            panic!("{tool} for {consumer:?} was not denied");
        };
        assert_eq!(response.status, 403);
        assert_eq!(response.headers, [("content-type".to_string(), "application/json".to_string())]);
        let body: Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(
            (&body["error"]["type"], &body["error"]["code"]),
            (&json!("permission_denied"), &json!("tool_denied"))
        );
        if let Some(consumer) = consumer {
            let message = format!("tool `{tool}` is not allowed for consumer `{consumer}`");
            assert_eq!(body["error"]["message"], message);
        }
        assert!(!denied.mcp.as_ref().unwrap().arguments_edited);
    }

    let mut list = mcp_request("tools/list", None, None, &[]);
    assert!(matches!(serve(&mut list).await, Ok(RequestAction::Continue)));
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let mut chat = test_request(&[], body.clone());
    assert!(matches!(serve(&mut chat).await, Ok(RequestAction::Continue)));
    assert_eq!(chat.body.bytes(), body.as_bytes());
}

/// A config mcp-policy cannot serve is refused at configure, naming the
/// field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_policy_refuses_an_invalid_config_at_configure() {
    let runtime = runtime();
    let module = runtime.load(wasm("mcp-policy"), None).await.unwrap();
    let limits = Limits { timeout: Duration::from_secs(5), max_memory_bytes: 64 << 20 };
    let config = json!({"rules": [{"consumers": [], "allow": ["*"]}]});
    let error = module.configure("p", &config, limits, Isolation::PerRequest, Grants::default()).await.err().unwrap();
    assert!(error.to_string().contains("`rules[0].consumers` is empty"), "{error}");
}
