use super::*;
use crate::snapshot::McpServer;
use crate::upstream::UpstreamClient;
use dispatch::target;
use jsonrpc::PARSE_ERROR;
use sluice_core::McpRouteDecl;

fn parsed(text: &str) -> Result<Message, (i64, String)> {
    Message::parse(text.as_bytes())
}

#[test]
fn messages_are_requests_notifications_or_answers() {
    let request = parsed(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).unwrap();
    assert_eq!((request.id, request.method.as_deref()), (Some(json!(1)), Some("tools/list")));
    let notification = parsed(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
    assert_eq!(notification.id, None);
    let answer = parsed(r#"{"jsonrpc":"2.0","id":"sluice~a~1","result":{}}"#).unwrap();
    assert_eq!(answer.method, None);
    for (bad, code) in [
        ("{", PARSE_ERROR),
        ("[]", INVALID_REQUEST),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, INVALID_REQUEST),
        ("7", INVALID_REQUEST),
        (r#"{"id":1,"method":"ping"}"#, INVALID_REQUEST),
        (r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, INVALID_REQUEST),
        (r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#, INVALID_REQUEST),
        (r#"{"jsonrpc":"2.0","id":1,"method":7}"#, INVALID_REQUEST),
        (r#"{"jsonrpc":"2.0","id":1}"#, INVALID_REQUEST),
        (r#"{"jsonrpc":"2.0","result":{}}"#, INVALID_REQUEST),
    ] {
        assert_eq!(parsed(bad).err().map(|e| e.0), Some(code), "{bad}");
    }
}

fn route(servers: &[&str]) -> McpRoute {
    let mut decl = McpRouteDecl::new(sluice_core::ResourceKey::new("ns", "r"), "/mcp");
    decl.deny = vec!["*__secret*".into()];
    let policy = Arc::new(sluice_core::BackendPolicy::default());
    let servers = servers
        .iter()
        .map(|name| McpServer {
            name: name.to_string(),
            url: format!("http://{name}.invalid/mcp"),
            uri: format!("http://{name}.invalid/mcp").parse().unwrap(),
            credential: None,
            timeout: Duration::from_secs(1),
            client: UpstreamClient::for_backend(None, None, policy.clone()).unwrap(),
        })
        .collect();
    McpRoute { decl, label: "ns/r".into(), chain: vec![], servers }
}

fn targeted(route: &McpRoute, text: &str) -> Option<Result<(String, Value), (i64, String)>> {
    let mut message = parsed(text).unwrap();
    let method = message.method.clone().unwrap();
    let (server, _) = target(route, &mut message, &method)?;
    Some(server.map(|s| (s.name.clone(), message.value["params"].clone())))
}

#[test]
fn a_request_goes_to_the_server_its_name_says_without_the_prefix() {
    let route = route(&["weather", "files"]);
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"files__read__all","arguments":{}}}"#;
    let (server, params) = targeted(&route, call).unwrap().unwrap();
    assert_eq!((server.as_str(), &params["name"]), ("files", &json!("read__all")));
    let read = r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"weather+info://about"}}"#;
    let (server, params) = targeted(&route, read).unwrap().unwrap();
    assert_eq!((server.as_str(), &params["uri"]), ("weather", &json!("info://about")));
    let complete = r#"{"jsonrpc":"2.0","id":1,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"weather__greet"},"argument":{"name":"who","value":"a"}}}"#;
    let (server, params) = targeted(&route, complete).unwrap().unwrap();
    assert_eq!((server.as_str(), &params["ref"]["name"]), ("weather", &json!("greet")));
}

#[test]
fn unknown_denied_and_unrouted_requests_are_refused() {
    let route = route(&["weather"]);
    let call = |name: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{name}","arguments":{{}}}}}}"#)
    };
    for (name, code) in [("nope__x", INVALID_PARAMS), ("noprefix", INVALID_PARAMS), ("weather__secret_key", REFUSED)] {
        assert_eq!(targeted(&route, &call(name)).unwrap().unwrap_err().0, code, "{name}");
    }
    let no_params = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#;
    assert_eq!(targeted(&route, no_params).unwrap().unwrap_err().0, INVALID_PARAMS);
    assert!(targeted(&route, r#"{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage"}"#).is_none());
}
