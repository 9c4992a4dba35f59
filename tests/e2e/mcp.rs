//! The MCP gateway through the official MCP Python SDK: its client against
//! the real gateway, in front of two servers written with the SDK's own
//! `MCPServer`, in both eras: its default mode (which probes `server/discover`
//! and, as both servers speak it, stays at 2026-07-28, with no session) and
//! the handshake (`initialize`, 2025-11-25, a session).

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{
    ConfigDir, Gateway, McpClientOptions, McpServer, McpServerOptions, Options, Plugin, documents, mcp_client,
    try_mcp_client,
};

/// An MCP route at `/mcp` over `servers`, with `extra` spec lines.
fn route_yaml(name: &str, path: &str, servers: &[(&str, &McpServer)], extra: &str) -> String {
    let servers: Vec<String> =
        servers.iter().map(|(name, s)| format!("    - {{name: {name}, url: \"{}\"}}", s.url())).collect();
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: MCPRoute\nmetadata: {{name: {name}}}\nspec:\n  path: {path}\n  servers:\n{}\n{extra}",
        servers.join("\n")
    )
}

struct Setup {
    weather: McpServer,
    files: McpServer,
    /// Where `files` writes a line per cancelled call.
    cancel_log: std::path::PathBuf,
    gateway: Gateway,
    _dir: ConfigDir,
}

/// Two servers, `weather` and `files`, behind one route, `files__big`
/// denied, and `plugins` in its chain.
async fn setup(plugins: &[Plugin], extra: &str, options: Options) -> Setup {
    let weather = McpServer::start("weather").await;
    let cancel_log = tempfile::NamedTempFile::new().unwrap().into_temp_path().keep().unwrap();
    let files = McpServer::start_with(
        "files",
        McpServerOptions {
            env: vec![("MCP_CANCEL_LOG".into(), cancel_log.display().to_string())],
            ..Default::default()
        },
    )
    .await;
    let dir = ConfigDir::new();
    let mut docs: Vec<String> = plugins.iter().map(Plugin::yaml).collect();
    let mut spec = String::from("  tools:\n    deny: [\"files__big\"]\n");
    if !plugins.is_empty() {
        let names: Vec<String> = plugins.iter().map(|p| format!("{{name: {}}}", p.name())).collect();
        spec.push_str(&format!("  plugins: [{}]\n", names.join(", ")));
    }
    spec.push_str(extra);
    docs.push(route_yaml("tools", "/mcp", &[("weather", &weather), ("files", &files)], &spec));
    dir.write("mcp.yaml", &documents(&docs));
    let gateway = Gateway::start_with(&dir, options).await;
    Setup { weather, files, cancel_log, gateway, _dir: dir }
}

fn text_of(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text content: {result}"))
}

/// The SDK's two eras: its default (2026-07-28 when the route offers it)
/// and the handshake, with the revision each ends up on.
const ERAS: [(Option<&str>, &str); 2] = [(None, "2026-07-28"), (Some("legacy"), "2025-11-25")];

async fn client_in(gateway: &Gateway, era: Option<&str>, args: &[&str]) -> Value {
    let options = McpClientOptions { protocol: era.map(String::from), ..Default::default() };
    let result = mcp_client(&gateway.url("/mcp"), args, &options).await;
    let expected = ERAS.iter().find(|(e, _)| *e == era).map(|(_, v)| *v).unwrap_or_default();
    assert_eq!(result["protocol"], expected, "{era:?}: {result}");
    result
}

#[tokio::test]
async fn the_sdk_sees_two_servers_as_one_and_calls_a_tool_on_each() {
    let setup = setup(&[], "", Options::default()).await;
    for (era, _) in ERAS {
        let listed = client_in(&setup.gateway, era, &["list"]).await;
        assert_eq!(listed["server"]["name"], "sluice");
        let tools: Vec<&str> = listed["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        for tool in ["weather__echo", "weather__count", "files__echo", "files__add", "weather__big"] {
            assert!(tools.contains(&tool), "{era:?}: {tool} not in {tools:?}");
        }
        assert!(!tools.contains(&"files__big"), "{era:?}: a denied tool is listed: {tools:?}");
        assert!(listed["capabilities"]["tools"].is_object(), "{listed}");

        let echoed = client_in(&setup.gateway, era, &["call", "weather__echo", r#"{"text":"hi"}"#]).await;
        assert_eq!(text_of(&echoed), "weather:hi");
        let added = client_in(&setup.gateway, era, &["call", "files__add", r#"{"a":2,"b":31337}"#]).await;
        assert_eq!(added["structured"]["result"], 31339, "{added}");

        // Refused by the route's deny list, and unknown: JSON-RPC errors the
        // SDK raises, neither reaching a server.
        let denied = client_in(&setup.gateway, era, &["call", "files__big", r#"{"kib":1}"#]).await;
        assert_eq!(denied["error"]["code"], -32001, "{denied}");
        assert!(denied["error"]["message"].as_str().unwrap().contains("not allowed"), "{denied}");
        let unknown = client_in(&setup.gateway, era, &["call", "nobody__echo", r#"{"text":"x"}"#]).await;
        assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
        // A server's own JSON-RPC error reaches the client as it was.
        let fail = r#"{"code":-32042,"message":"no such city"}"#;
        let failed = client_in(&setup.gateway, era, &["call", "weather__fail", fail]).await;
        assert_eq!(failed["error"], json!({"code": -32042, "message": "no such city"}));
    }

    // The access log names the tool, never its arguments; the metrics
    // count the calls by server, tool and result.
    let log = setup.gateway.log();
    let line = log
        .lines()
        .find(|l| l.contains("sluice::access") && l.contains(r#"tool="files__add""#))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains(r#"mcp_method="tools/call""#) && !line.contains("31337"), "{line}");
    let metrics = setup.gateway.client().get(&setup.gateway.admin_url("/metrics")).await.text();
    for series in [
        r#"sluice_mcp_calls_total{route="default/tools",server="files",tool="files__add",consumer="",result="ok"} 2"#,
        r#"sluice_mcp_calls_total{route="default/tools",server="weather",tool="weather__fail",consumer="",result="error"} 2"#,
    ] {
        assert!(metrics.contains(series), "{series} not in\n{metrics}");
    }
}

#[tokio::test]
async fn a_pinned_older_revision_is_spoken_too() {
    let setup = setup(&[], "", Options::default()).await;
    for version in ["2025-06-18", "2025-03-26", "2024-11-05"] {
        let options = McpClientOptions { protocol: Some(version.into()), ..Default::default() };
        let whoami = mcp_client(&setup.gateway.url("/mcp"), &["call", "weather__whoami", "{}"], &options).await;
        assert_eq!(whoami["protocol"], version, "{whoami}");
        let seen: Value = serde_json::from_str(text_of(&whoami)).unwrap();
        // The server negotiated what the client asked for, through the gateway.
        assert_eq!(seen["protocol"], version, "{seen}");
    }
}

#[tokio::test]
async fn progress_logs_and_cancellation_stream_through() {
    let setup = setup(&[], "", Options::default()).await;
    for (i, (era, _)) in ERAS.into_iter().enumerate() {
        let counted = client_in(&setup.gateway, era, &["progress", "weather__count", r#"{"n":4,"delay_ms":30}"#]).await;
        let progress: Vec<f64> =
            counted["progress"].as_array().unwrap().iter().map(|p| p[0].as_f64().unwrap()).collect();
        assert_eq!(progress, [1.0, 2.0, 3.0, 4.0], "{counted}");
        assert_eq!(counted["logs"][0]["data"], "weather counting to 4", "{counted}");
        assert_eq!(text_of(&counted["result"]), "weather counted 4");

        let args =
            ["cancel", "files__sleep", r#"{"seconds":30}"#, "300", "--then", "files__echo", r#"{"text":"after"}"#];
        let cancelled = client_in(&setup.gateway, era, &args).await;
        assert_eq!(cancelled["cancelled"], true, "{cancelled}");
        assert_eq!(text_of(&cancelled["then"]), "files:after", "the client goes on after a cancel");
        // The cancel reached the server, which stopped the call: in a
        // session as `notifications/cancelled`, at 2026-07-28 as the
        // request's connection closing.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&setup.cancel_log).unwrap_or_default().lines().count() != i + 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "{era:?}: the server never saw the cancel: {}",
                setup.files.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A request a server makes of the client (sampling) comes back to it
/// through the gateway: its id is tagged with the server, and the client's
/// answer goes to that server alone. At 2026-07-28 a server has no
/// channel for such requests: its own JSON-RPC error reaches the client.
#[tokio::test]
async fn a_servers_sampling_request_reaches_the_client_and_its_answer_the_server() {
    let setup = setup(&[], "", Options::default()).await;
    let url = setup.gateway.url("/mcp");
    let ask = ["call", "files__ask", r#"{"question":"ready?"}"#, "--sampling-reply", "yes"];
    let legacy = McpClientOptions { protocol: Some("legacy".into()), ..Default::default() };
    let heard = mcp_client(&url, &ask, &legacy).await;
    assert_eq!(text_of(&heard), "files heard yes", "{heard}");
    let modern = mcp_client(&url, &ask, &McpClientOptions::default()).await;
    assert_eq!(modern["error"]["code"], -32600, "{modern}");
    assert!(modern["error"]["message"].as_str().unwrap().contains("sampling/createMessage"), "{modern}");
    let _ = &setup.weather;
}

#[tokio::test]
async fn prompts_and_resources_are_merged_and_routed_by_their_prefix() {
    let setup = setup(&[], "", Options::default()).await;
    for (era, _) in ERAS {
        let prompts = client_in(&setup.gateway, era, &["prompts"]).await;
        let names: Vec<&str> =
            prompts["prompts"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["weather__greet", "files__greet"], "{prompts}");
        assert_eq!(prompts["get"]["messages"][0]["content"]["text"], "weather greets world", "{prompts}");

        let resources = client_in(&setup.gateway, era, &["resources"]).await;
        let uris: Vec<&str> =
            resources["resources"].as_array().unwrap().iter().map(|r| r["uri"].as_str().unwrap()).collect();
        assert_eq!(uris, ["weather+info://about", "files+info://about"], "{resources}");
        assert_eq!(resources["templates"][1]["uriTemplate"], "files+info://item/{id}", "{resources}");
        let read = &resources["read"]["contents"][0];
        assert_eq!((&read["uri"], &read["text"]), (&json!("weather+info://about"), &json!("about weather")));
    }
}

/// The upstream session each call of a `sequence` reached, by server.
fn sessions_seen(results: &Value) -> Vec<(String, String)> {
    results["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{results}"))
        .iter()
        .map(|result| {
            let seen: Value = serde_json::from_str(text_of(result)).unwrap();
            (seen["server"].as_str().unwrap().to_string(), seen["session"].as_str().unwrap().to_string())
        })
        .collect()
}

const WHOAMI_BOTH: &str = r#"[{"call": "weather__whoami", "args": {}}, {"call": "files__whoami", "args": {}},
    {"call": "weather__whoami", "args": {}}, {"call": "files__whoami", "args": {}}]"#;

#[tokio::test]
async fn a_session_continues_on_any_gateway_sharing_the_key_and_across_a_restart() {
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), "# the first seals\nAAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n").unwrap();
    let with_keys =
        Options { args: vec!["--mcp-session-keys".into(), keys.path().display().to_string()], ..Default::default() };
    let setup = setup(&[], "", with_keys.clone()).await;
    let other = Gateway::start_with(&setup._dir, with_keys.clone()).await;

    // Every request of the SDK alternates between the two gateways: the
    // session opened on one is continued on the other, each server seeing
    // one session of its own throughout.
    let options = McpClientOptions {
        alternate: Some(other.url("/mcp")),
        stdin: Some(WHOAMI_BOTH.into()),
        protocol: Some("legacy".into()),
        ..Default::default()
    };
    let results = mcp_client(&setup.gateway.url("/mcp"), &["sequence", "--trace"], &options).await;
    let hosts: std::collections::HashSet<String> =
        results["http"].as_array().unwrap().iter().map(|h| h["url"].as_str().unwrap_or_default().to_string()).collect();
    assert!(hosts.len() >= 2, "the requests did not alternate: {hosts:?}");
    let seen = sessions_seen(&results);
    assert_eq!(seen[0], seen[2], "weather saw two sessions: {seen:?}");
    assert_eq!(seen[1], seen[3], "files saw two sessions: {seen:?}");

    // A session handed to a gateway started after it was opened, with the
    // same key: it goes on, in the same upstream sessions.
    let out = tempfile::NamedTempFile::new().unwrap();
    let out_path = out.path().display().to_string();
    client_in(&setup.gateway, Some("legacy"), &["session-out", &out_path]).await;
    let session = std::fs::read_to_string(out.path()).unwrap();
    drop(other);
    let restarted = Gateway::start_with(&setup._dir, with_keys).await;
    let options =
        McpClientOptions { stdin: Some(WHOAMI_BOTH.into()), protocol: Some("legacy".into()), ..Default::default() };
    let before = sessions_seen(
        &mcp_client(&setup.gateway.url("/mcp"), &["sequence", "--session-id", session.trim()], &options).await,
    );
    let after = sessions_seen(
        &mcp_client(&restarted.url("/mcp"), &["sequence", "--session-id", session.trim()], &options).await,
    );
    assert_eq!(before, after, "the restarted gateway reached other upstream sessions");

    // A gateway with another key does not know the session: 404, on which
    // the spec has the client start again.
    let stranger = Gateway::start(&setup._dir).await;
    let reply = stranger
        .post(
            "/mcp",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            &[("content-type", "application/json"), ("mcp-session-id", session.trim())],
        )
        .await;
    assert_eq!(reply.status, 404, "{}", reply.text());
    assert_eq!(reply.json()["error"]["code"], -32600);
}

#[tokio::test]
async fn a_restarted_server_gets_a_new_session_and_the_client_notices_nothing() {
    let mut setup = setup(&[], "", Options::default()).await;
    let out = tempfile::NamedTempFile::new().unwrap();
    let out_path = out.path().display().to_string();
    client_in(&setup.gateway, Some("legacy"), &["session-out", &out_path]).await;
    let session = std::fs::read_to_string(out.path()).unwrap();
    let options =
        McpClientOptions { stdin: Some(WHOAMI_BOTH.into()), protocol: Some("legacy".into()), ..Default::default() };
    let url = setup.gateway.url("/mcp");
    let before = sessions_seen(&mcp_client(&url, &["sequence", "--session-id", session.trim()], &options).await);

    setup.weather.restart().await;
    let after = sessions_seen(&mcp_client(&url, &["sequence", "--session-id", session.trim()], &options).await);
    assert_eq!(after[1], before[1], "files, not restarted, kept its session");
    assert_ne!(after[0], before[0], "weather forgot the session: a new one was opened for it");
    assert!(setup.gateway.log().contains("forgot the session"), "{}", setup.gateway.log());
}

/// The secret the test's authorization server signs tokens with (HS256).
const JWT_SECRET: &[u8] = b"an MCP e2e shared secret, 32 bytes or more";

/// API keys and JWTs: the JWTs an authorization server issues for this
/// route (its audience), as an MCP client gets them after OAuth.
fn auth_plugin() -> Plugin {
    use base64::Engine;
    use sha2::{Digest, Sha256};
    let digest: String = Sha256::digest(b"sk-mcp-e2e").iter().map(|b| format!("{b:02x}")).collect();
    let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(JWT_SECRET);
    Plugin::new("auth", "auth").auth_phase().config(json!({
        "apiKeys": [{"consumer": "alice", "sha256": digest}],
        "jwt": {"jwks": {"keys": [{"kty": "oct", "kid": "idp-1", "k": k}]},
            "issuer": "https://idp.example", "audience": "mcp-tools"}
    }))
}

/// A token from the test's authorization server, for `sub`, expiring
/// `expires_in` seconds from now (negative: already expired).
fn jwt(sub: &str, expires_in: i64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let claims = json!({"sub": sub, "iss": "https://idp.example", "aud": "mcp-tools", "exp": now + expires_in});
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("idp-1".into());
    jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET)).unwrap()
}

const AUTHORIZATION: &str =
    "  authorization:\n    authorizationServers: [\"https://idp.example\"]\n    scopes: [\"tools.read\"]\n";

#[tokio::test]
async fn the_auth_plugin_guards_every_message_and_points_clients_at_the_metadata() {
    let setup = setup(&[auth_plugin()], AUTHORIZATION, Options::default()).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}});
    let reply = setup.gateway.post("/mcp", initialize.to_string(), &[("content-type", "application/json")]).await;
    assert_eq!(reply.status, 401, "{}", reply.text());
    let metadata_url = setup.gateway.url("/.well-known/oauth-protected-resource/mcp");
    let challenge = reply.header("www-authenticate").unwrap();
    assert!(challenge.starts_with("Bearer "), "{challenge}");
    assert!(challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")), "{challenge}");

    // RFC 9728's metadata, where the challenge said.
    let metadata = setup.gateway.client().get(&metadata_url).await;
    assert_eq!(metadata.status, 200);
    assert_eq!(
        metadata.json(),
        json!({"resource": setup.gateway.url("/mcp"), "authorization_servers": ["https://idp.example"],
            "bearer_methods_supported": ["header"], "scopes_supported": ["tools.read"], "resource_name": "default/tools"})
    );

    // Without the key the SDK cannot connect; with it, everything works,
    // and the server never sees the client's credential.
    assert!(try_mcp_client(&setup.gateway.url("/mcp"), &["list"], &McpClientOptions::default()).await.is_err());
    let keyed =
        McpClientOptions { headers: vec![("Authorization".into(), "Bearer sk-mcp-e2e".into())], ..Default::default() };
    let headers = mcp_client(&setup.gateway.url("/mcp"), &["call", "weather__headers", "{}"], &keyed).await;
    let seen: Value = serde_json::from_str(text_of(&headers)).unwrap();
    assert!(seen.get("authorization").is_none(), "the client's credential reached the server: {seen}");
    assert_eq!(seen["x-sluice-consumer"], "key:alice", "{seen}");
    let metrics = setup.gateway.client().get(&setup.gateway.admin_url("/metrics")).await.text();
    let series = r#"sluice_mcp_calls_total{route="default/tools",server="weather",tool="weather__headers",consumer="key:alice",result="ok"} 1"#;
    assert!(metrics.contains(series), "{metrics}");

    // A JWT from the authorization server, validated by the auth plugin, in
    // both eras; an expired one is refused with the challenge the spec asks.
    for (era, _) in ERAS {
        let bearer = McpClientOptions {
            headers: vec![("Authorization".into(), format!("Bearer {}", jwt("bob", 300)))],
            protocol: era.map(String::from),
            ..Default::default()
        };
        let headers = mcp_client(&setup.gateway.url("/mcp"), &["call", "files__headers", "{}"], &bearer).await;
        let seen: Value = serde_json::from_str(text_of(&headers)).unwrap();
        assert_eq!(seen["x-sluice-consumer"], "jwt:bob", "{era:?}: {seen}");
        assert!(seen.get("authorization").is_none(), "the token reached the server: {seen}");
    }
    let expired = format!("Bearer {}", jwt("bob", -600));
    let reply = setup
        .gateway
        .post("/mcp", initialize.to_string(), &[("content-type", "application/json"), ("authorization", &expired)])
        .await;
    assert_eq!(reply.status, 401, "{}", reply.text());
    let challenge = reply.header("www-authenticate").unwrap();
    assert!(challenge.contains("invalid_token") && challenge.contains("resource_metadata="), "{challenge}");
}

#[tokio::test]
async fn requests_outside_a_session_are_refused_in_json_rpc_shape() {
    let setup = setup(&[], "", Options::default()).await;
    let post = |body: &'static str, headers: Vec<(&'static str, &'static str)>| {
        let gateway = &setup.gateway;
        async move {
            let mut all = vec![("content-type", "application/json")];
            all.extend(headers);
            gateway.post("/mcp", body, &all).await
        }
    };
    let list = r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#;
    let missing = post(list, vec![]).await;
    assert_eq!((missing.status.as_u16(), missing.json()["error"]["code"].clone()), (400, json!(-32600)));
    let forged =
        post(list, vec![("mcp-session-id", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")]).await;
    assert_eq!(forged.status, 404, "{}", forged.text());
    let batch = post(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, vec![]).await;
    assert_eq!(batch.json()["error"]["code"], -32600, "{}", batch.text());
    let broken = post("{", vec![]).await;
    assert_eq!(broken.json()["error"]["code"], -32700, "{}", broken.text());
    // 2026-07-28: the headers must agree with the body, and a revision
    // nobody speaks is named as such, with those the gateway speaks.
    let discover = r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{
        "io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
    let mismatch = post(discover, vec![("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list")]).await;
    assert_eq!((mismatch.status.as_u16(), mismatch.json()["error"]["code"].clone()), (400, json!(-32020)));
    let discovered =
        post(discover, vec![("mcp-protocol-version", "2026-07-28"), ("mcp-method", "server/discover")]).await;
    assert_eq!(discovered.json()["result"]["supportedVersions"], json!(["2026-07-28"]), "{}", discovered.text());
    let future = post(discover, vec![("mcp-protocol-version", "2099-01-01"), ("mcp-method", "server/discover")]).await;
    assert_eq!(future.status, 400);
    assert_eq!(future.json()["error"]["code"], -32022, "{}", future.text());
    assert!(future.json()["error"]["data"]["supported"].as_array().unwrap().contains(&json!("2025-11-25")));
    let ping = post(r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#, vec![]).await;
    assert_eq!(ping.json(), json!({"jsonrpc": "2.0", "id": "p", "result": {}}));
}

#[tokio::test]
async fn mcp_policy_allows_tools_per_consumer_and_forces_arguments() {
    use sha2::{Digest, Sha256};
    let key = |text: &str| -> String { Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect() };
    let auth = Plugin::new("auth", "auth").auth_phase().config(json!({"apiKeys": [
        {"consumer": "alice", "sha256": key("sk-alice")}, {"consumer": "bob", "sha256": key("sk-bob")}]}));
    let policy = Plugin::new("mcp-policy", "mcp-policy").config(json!({
        "rules": [
            {"consumers": ["key:alice"], "allow": ["weather__*"], "deny": ["weather__fail"]},
            {"consumers": ["key:bob"], "allow": ["files__*"]}
        ],
        "arguments": {"files__echo": {"text": "forced"}}
    }));
    let setup = setup(&[auth, policy], "", Options::default()).await;
    let as_user = |key: &str| McpClientOptions {
        headers: vec![("Authorization".into(), format!("Bearer {key}"))],
        ..Default::default()
    };
    let url = setup.gateway.url("/mcp");
    for (era, _) in ERAS {
        let with = |key: &str| McpClientOptions { protocol: era.map(String::from), ..as_user(key) };
        let allowed = mcp_client(&url, &["call", "weather__echo", r#"{"text":"hi"}"#], &with("sk-alice")).await;
        assert_eq!(text_of(&allowed), "weather:hi", "{era:?}");
        // Refused by the plugin: the SDK raises the plugin's message.
        for (key, tool) in [("sk-alice", "files__echo"), ("sk-alice", "weather__fail"), ("sk-bob", "weather__echo")] {
            let refused = mcp_client(&url, &["call", tool, r#"{"text":"x","code":1,"message":"m"}"#], &with(key)).await;
            assert_eq!(refused["error"]["code"], -32001, "{era:?} {key} {tool}: {refused}");
            let message = refused["error"]["message"].as_str().unwrap();
            assert!(message.contains(&format!("tool `{tool}` is not allowed")), "{message}");
        }
        // Its arguments replace the client's, in the message the server gets.
        let forced = mcp_client(&url, &["call", "files__echo", r#"{"text":"mine"}"#], &with("sk-bob")).await;
        assert_eq!(text_of(&forced), "files:forced", "{era:?}: {forced}");
    }
    let metrics = setup.gateway.client().get(&setup.gateway.admin_url("/metrics")).await.text();
    let series = r#"sluice_mcp_calls_total{route="default/tools",server="files",tool="files__echo",consumer="key:bob",result="ok"} 2"#;
    assert!(metrics.contains(series), "{metrics}");
}

/// The data of each SSE event in a body, as JSON.
fn events_in(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
            (!data.is_empty()).then(|| serde_json::from_str(&data.join("\n")).unwrap())
        })
        .collect()
}

#[tokio::test]
async fn response_hooks_see_each_answer_and_its_end() {
    let probe = Plugin::new("probe", "probe").config(json!({"body": true}));
    let setup = setup(&[probe], "", Options::default()).await;
    let json_type = ("content-type", "application/json");
    let accept = ("accept", "application/json, text/event-stream");
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}});
    let opened = setup.gateway.post("/mcp", initialize.to_string(), &[json_type, accept]).await;
    let session = opened.header("mcp-session-id").unwrap_or_else(|| panic!("{}", opened.text())).to_string();
    let in_session = [json_type, accept, ("mcp-session-id", &session), ("mcp-protocol-version", "2025-11-25")];
    // The server answers a call as an SSE stream: progress, then the answer,
    // which the probe's response-body hook marks; the progress passes as sent.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "weather__count", "arguments": {"n": 2, "delay_ms": 1}, "_meta": {"progressToken": "t"}}});
    let reply = setup.gateway.post("/mcp", call.to_string(), &in_session).await;
    assert_eq!(reply.header("content-type"), Some("text/event-stream"), "{}", reply.text());
    let events = events_in(&reply.text());
    let answer = events.last().unwrap();
    assert_eq!((&answer["id"], &answer["probe"]), (&json!(2), &json!("seen")), "{events:?}");
    assert_eq!(answer["result"]["content"][0]["text"], "weather counted 2");
    let progress: Vec<&Value> = events.iter().filter(|e| e["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 2, "{events:?}");
    assert!(progress.iter().all(|e| e.get("probe").is_none()), "{events:?}");
    // Its response-end hook ran once the answer went out.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !setup.gateway.log().contains("probe: response ended") {
        assert!(std::time::Instant::now() < deadline, "{}", setup.gateway.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A route's author may lower the operator's caps, not raise them: a route
/// asking for 5000 tools a listing gets the gateway's 3.
#[tokio::test]
async fn a_routes_limits_stay_within_the_gateways_caps() {
    let capped = Options { args: vec!["--mcp-max-tools".into(), "3".into()], ..Default::default() };
    let setup = setup(&[], "  limits: {maxTools: 5000}\n", capped).await;
    let listed = client_in(&setup.gateway, Some("legacy"), &["list"]).await;
    assert_eq!(listed["tools"].as_array().unwrap().len(), 3, "{listed}");
    assert!(setup.gateway.log().contains("an MCP listing was cut at its limit"), "{}", setup.gateway.log());
}

/// A tool call is a span of the GenAI conventions at a real OpenTelemetry
/// Collector: `execute_tool <tool>`, with the tool and the MCP method.
#[tokio::test]
async fn a_tool_call_is_an_execute_tool_span_at_a_real_collector() {
    let collector = sluice_tests::Collector::start().await;
    let args = ["--otlp-endpoint", &collector.endpoint_grpc(), "--otlp-protocol", "grpc"].map(String::from).to_vec();
    let setup = setup(&[], "", Options { args, ..Default::default() }).await;
    let trace = "5".repeat(32);
    let traceparent = format!("00-{trace}-{}-01", "6".repeat(16));
    let options = McpClientOptions { headers: vec![("traceparent".into(), traceparent)], ..Default::default() };
    let echoed =
        mcp_client(&setup.gateway.url("/mcp"), &["call", "weather__echo", r#"{"text":"traced"}"#], &options).await;
    assert_eq!(text_of(&echoed), "weather:traced");
    let spans = collector
        .wait_for_spans(|spans| spans.iter().any(|s| s.name == "execute_tool weather__echo"), Duration::from_secs(30))
        .await;
    let span = spans.iter().find(|s| s.name == "execute_tool weather__echo").unwrap();
    assert_eq!((span.kind, span.trace_id.as_str()), (2, trace.as_str()), "{span:#?}");
    assert_eq!(span.attributes["gen_ai.operation.name"], "execute_tool", "{span:#?}");
    assert_eq!(span.attributes["gen_ai.tool.name"], "weather__echo", "{span:#?}");
    assert_eq!(span.attributes["mcp.method.name"], "tools/call", "{span:#?}");
    assert!(!format!("{span:?}").contains("traced"), "the arguments reached a span: {span:#?}");
}
