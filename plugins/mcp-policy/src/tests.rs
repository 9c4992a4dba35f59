use serde_json::json;
use sluice_plugin_sdk::testing::{chat_request, mcp_request};

use super::*;

fn parse(config: Value) -> Result<McpPolicy, String> {
    sluice_plugin_sdk::configure::<McpPolicy>(&config.to_string())
}

fn example() -> McpPolicy {
    parse(json!({
        "rules": [
            {"consumers": ["alice", "ops-*"], "allow": ["weather__*"], "deny": ["weather__delete_*"]},
            {"consumers": ["ops-blocked"], "allow": ["*"]},
            {"consumers": ["*"], "allow": ["search__*"]}
        ],
        "anonymous": {"allow": ["weather__forecast"]},
        "arguments": {"weather__forecast": {"units": "metric"}}
    }))
    .unwrap()
}

fn call(tool: &str, arguments: Value, consumer: Option<&str>) -> Request {
    let req = mcp_request("tools/call", Some(tool), Some(&arguments));
    match consumer {
        Some(consumer) => req.with_consumer(consumer),
        None => req,
    }
}

/// A refusal's status, headers and body.
type Refusal = (u16, Vec<(String, String)>, Value);

/// The plugin's answer to `req`: `Ok(())` to go on, or its refusal.
fn answer(policy: &McpPolicy, req: &Request) -> Result<(), Refusal> {
    match policy.on_request(req, &mut ()).unwrap() {
        Action::Continue => Ok(()),
        Action::Respond(response) => {
            Err((response.status, response.headers, serde_json::from_slice(&response.body).unwrap()))
        }
    }
}

#[test]
fn the_first_matching_rule_decides() {
    let policy = example();
    let cases = [
        (Some("alice"), "weather__forecast", true),
        (Some("alice"), "weather__delete_city", false),
        (Some("alice"), "search__web", false),
        (Some("ops-1"), "weather__alerts", true),
        // `ops-*` matches first: the later `*` rule's tools are not added.
        (Some("ops-blocked"), "mail__send", false),
        (Some("bob"), "search__web", true),
        (Some("bob"), "weather__forecast", false),
        (None, "weather__forecast", true),
        (None, "weather__alerts", false),
        (None, "search__web", false),
    ];
    for (consumer, tool, allowed) in cases {
        assert_eq!(policy.allows(consumer, tool), allowed, "{consumer:?} calling {tool}");
    }
}

#[test]
fn no_rule_for_the_consumer_and_no_anonymous_rule_deny() {
    let policy = parse(json!({"rules": [{"consumers": ["key:*"], "allow": ["*"]}]})).unwrap();
    assert!(policy.allows(Some("key:svc"), "anything__at_all"));
    assert!(!policy.allows(Some("jwt:ann"), "anything__at_all"), "no rule names her");
    assert!(!policy.allows(None, "anything__at_all"), "no anonymous rule");
    let empty_allow = parse(json!({"rules": [{"consumers": ["*"]}]})).unwrap();
    assert!(!empty_allow.allows(Some("x"), "a__b"));
}

#[test]
fn a_denied_call_is_a_403_naming_tool_and_consumer() {
    let policy = example();
    let (status, headers, body) = answer(&policy, &call("weather__delete_city", json!({}), Some("alice"))).unwrap_err();
    assert_eq!(status, 403);
    assert_eq!(headers, [("content-type".to_string(), "application/json".to_string())]);
    assert_eq!(
        body,
        json!({"error": {"message": "tool `weather__delete_city` is not allowed for consumer `alice`",
            "type": "permission_denied", "code": "tool_denied"}})
    );
    let (_, _, body) = answer(&policy, &call("search__web", json!({}), None)).unwrap_err();
    assert_eq!(body["error"]["message"], "tool `search__web` is not allowed without a consumer");
}

#[test]
fn a_call_that_names_no_tool_is_denied() {
    let policy = parse(json!({"rules": [{"consumers": ["*"], "allow": ["*"]}]})).unwrap();
    let req = mcp_request("tools/call", None, None).with_consumer("alice");
    let (status, _, body) = answer(&policy, &req).unwrap_err();
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("tool_denied")));
}

#[test]
fn chat_requests_and_other_mcp_methods_pass_untouched() {
    let policy = parse(json!({"rules": [], "anonymous": {"allow": []}})).unwrap();
    for req in [
        chat_request("gpt-4o-mini", &json!({"messages": [{"role": "user", "content": "hi"}]})),
        mcp_request("tools/list", None, None),
        mcp_request("initialize", None, None),
        mcp_request("prompts/get", Some("weather__prompt"), None),
    ] {
        assert_eq!(answer(&policy, &req), Ok(()), "{:?}", req.mcp_method());
        assert_eq!(req.edited_tool_arguments(), None);
        assert!(!req.host_calls().iter().any(|call| call.starts_with("set-")), "{:?}", req.host_calls());
    }
    let chat = chat_request("m", &json!({"messages": []}));
    answer(&policy, &chat).unwrap();
    assert_eq!(chat.host_calls(), ["kind"], "a chat request costs one host call");
}

#[test]
fn forced_arguments_are_set_over_the_clients() {
    let policy = example();
    let req = call("weather__forecast", json!({"city": "Oslo", "units": "imperial"}), Some("alice"));
    answer(&policy, &req).unwrap();
    assert_eq!(req.edited_tool_arguments(), Some(json!({"city": "Oslo", "units": "metric"})));

    // Already as forced: no edit.
    let req = call("weather__forecast", json!({"units": "metric", "city": "Oslo"}), None);
    answer(&policy, &req).unwrap();
    assert_eq!(req.edited_tool_arguments(), None);

    // Other tools keep theirs, and a denied call is not edited.
    let req = call("weather__alerts", json!({"city": "Oslo"}), Some("alice"));
    answer(&policy, &req).unwrap();
    assert_eq!(req.edited_tool_arguments(), None);
    let req = call("weather__forecast", json!({"city": "Oslo"}), Some("bob"));
    answer(&policy, &req).unwrap_err();
    assert_eq!(req.edited_tool_arguments(), None);
}

#[test]
fn a_call_without_arguments_gets_the_forced_ones() {
    let policy = example();
    let req = mcp_request("tools/call", Some("weather__forecast"), None).with_consumer("alice");
    answer(&policy, &req).unwrap();
    assert_eq!(req.edited_tool_arguments(), Some(json!({"units": "metric"})));
}

#[test]
fn invalid_configs_are_refused_with_the_field_named() {
    let cases = [
        (json!({}), "missing field `rules`"),
        (json!({"rules": []}), "`rules` is empty and there is no `anonymous`"),
        (json!({"rules": [{"consumers": [], "allow": ["*"]}]}), "`rules[0].consumers` is empty"),
        (json!({"rules": [{"consumers": ["a", ""]}]}), "`rules[0].consumers[1]` is empty"),
        (json!({"rules": [{"consumers": ["a"], "allow": ["x", ""]}]}), "`rules[0].allow[1]` is empty"),
        (json!({"rules": [], "anonymous": {"deny": [""]}}), "`anonymous.deny[0]` is empty"),
        (json!({"rules": [{"consumers": ["a"], "alow": ["*"]}]}), "unknown field `alow`"),
        (json!({"rules": [{"consumers": ["a"]}], "arguments": {"t": {}}}), "`arguments.t` is empty"),
        (json!({"rules": [{"consumers": ["a"]}], "arguments": {"t": 5}}), "invalid type at `arguments.t`"),
        (json!({"rules": [{"consumers": ["a"]}], "arguments": {"": {"a": 1}}}), "empty tool name"),
    ];
    for (config, expected) in cases {
        let error = parse(config.clone()).unwrap_err();
        assert!(error.starts_with("mcp-policy: "), "{error}");
        assert!(error.contains(expected), "{config}: {error}");
    }
}
