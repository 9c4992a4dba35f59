//! The request path: plugin edits, direct responses, client errors, model
//! rewrite and API keys, streaming, and h2c.

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{Backend, Client, ConfigDir, Echo, Gateway, Options, Plugin, Route, chat_body, documents};

#[tokio::test]
async fn plugin_edits_reach_the_upstream_and_the_client() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let system = json!([{"role": "system", "content": "set by add-header"}]);
    let plugin = Plugin::new("add-header", "add-header").config(json!({
        "header": "x-team",
        "value": "search",
        "setBody": {"messages": system},
        "responseHeader": {"name": "x-sluice-plugin", "value": "add-header"},
    }));
    let route = Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["add-header"]);
    dir.write("config.yaml", &documents(&[plugin.yaml(), route.yaml()]));
    let gateway = Gateway::start(&dir).await;

    let reply = gateway.chat("gpt-test", &[("x-team", "set-by-client")]).await;
    let echoed = reply.echoed();
    assert_eq!(echoed["headers"]["x-team"], "search", "the plugin's header replaces the client's: {echoed}");
    assert_eq!(echoed["messages"], system, "the plugin's body edit reached the upstream: {echoed}");
    assert_eq!(echoed["model"], "gpt-test");
    assert_eq!(echoed["path"], "/v1/chat/completions");
    assert_eq!(reply.header("x-sluice-plugin"), Some("add-header"), "the response-head hook ran");
}

#[tokio::test]
async fn the_chain_runs_in_order_and_response_hooks_in_reverse() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let marker = |name: &str| {
        Plugin::new(name, "add-header").config(json!({
            "header": "x-order",
            "value": name,
            "responseHeader": {"name": "x-order-reply", "value": name},
        }))
    };
    // The same two plugins, chained both ways: the order is the route's,
    // not the plugins' names'.
    let forward = Route::new("forward", &["forward"], &echo.url()).plugins(&["first", "second"]);
    let backward = Route::new("backward", &["backward"], &echo.url()).plugins(&["second", "first"]);
    dir.write("plugins.yaml", &documents(&[marker("first").yaml(), marker("second").yaml()]));
    dir.write("routes.yaml", &documents(&[forward.yaml(), backward.yaml()]));
    let gateway = Gateway::start(&dir).await;

    for (model, last, first) in [("forward", "second", "first"), ("backward", "first", "second")] {
        let reply = gateway.chat(model, &[]).await;
        // Each plugin replaces the header: the upstream sees the last one's.
        assert_eq!(reply.echoed()["headers"]["x-order"], last, "{model}: request hooks run in chain order");
        // Response headers unwind the chain: the first plugin has the last word.
        assert_eq!(reply.header("x-order-reply"), Some(first), "{model}: response hooks run in reverse");
    }
}

#[tokio::test]
async fn a_plugin_can_answer_directly() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let deny = Plugin::new("deny", "deny")
        .config(json!({"header": "x-tenant", "values": ["blocked"], "models": ["denied-model"]}));
    let route = Route::new("chat", &["gpt-test", "denied-model"], &echo.url()).plugins(&["deny"]);
    dir.write("config.yaml", &documents(&[deny.yaml(), route.yaml()]));
    let gateway = Gateway::start(&dir).await;

    let denied = gateway.chat("gpt-test", &[("x-tenant", "blocked")]).await;
    let error = denied.assert_error(403, "request_denied");
    assert_eq!(error["type"], "permission_error");
    assert_eq!(error["message"], "request denied by policy");
    assert_eq!(denied.header("content-type"), Some("application/json"));
    gateway.chat("denied-model", &[]).await.assert_error(403, "request_denied");

    let allowed = gateway.chat("gpt-test", &[("x-tenant", "ok")]).await;
    assert_eq!(allowed.echoed()["headers"]["x-tenant"], "ok");
}

#[tokio::test]
async fn bad_requests_get_openai_shaped_errors() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let chat = Route::new("chat", &["gpt-test", "gpt-test-mini"], &echo.url());
    let embed = Route::new("embed", &["embed-test"], &echo.url());
    dir.write("routes.yaml", &documents(&[chat.yaml(), embed.yaml()]));
    let limit = 1024;
    let gateway = Gateway::start_with(&dir, Options { max_body_bytes: Some(limit), ..Options::default() }).await;

    let error = gateway.chat("no-such-model", &[]).await.assert_error(404, "model_not_found");
    assert!(error["message"].as_str().unwrap().contains("no-such-model"), "{error}");
    let error =
        gateway.post("/v1/chat/completions", r#"{"model": "gpt-te"#, &[]).await.assert_error(400, "invalid_json");
    assert_eq!(error["type"], "invalid_request_error");
    for body in [json!({"messages": []}), json!({"model": 7, "messages": []}), json!({"model": ""})] {
        let error =
            gateway.post("/v1/chat/completions", body.to_string(), &[]).await.assert_error(400, "missing_model");
        assert_eq!(error["type"], "invalid_request_error", "{body}: {error}");
        assert!(error["message"].as_str().unwrap().contains("model"), "{body}: {error}");
    }

    // Over the limit, declared up front or found while reading a chunked body.
    let oversized = padded_chat_body(2 * limit);
    let reply = gateway.post("/v1/chat/completions", oversized.clone(), &[]).await;
    reply.assert_error(413, "request_too_large");
    let halves = vec![oversized[..limit].to_vec().into(), oversized[limit..].to_vec().into()];
    let reply = gateway.client().post_chunked(&gateway.url("/v1/chat/completions"), halves, &[]).await;
    reply.assert_error(413, "request_too_large");
    // A chunked body within the limit is served.
    let fits = padded_chat_body(limit / 2);
    let halves = vec![fits[..10].to_vec().into(), fits[10..].to_vec().into()];
    let reply = gateway.client().post_chunked(&gateway.url("/v1/chat/completions"), halves, &[]).await;
    assert_eq!(reply.echoed()["model"], "gpt-test");

    let models = gateway.get("/v1/models").await;
    assert_eq!(models.status, 200, "{}", models.text());
    let models = models.json();
    assert_eq!(models["object"], "list");
    let mut ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["embed-test", "gpt-test", "gpt-test-mini"]);

    gateway.get("/v1/nowhere").await.assert_error(404, "not_found");
    gateway.post("/v2/chat/completions", chat_body("gpt-test").to_string(), &[]).await.assert_error(404, "not_found");
    gateway.get("/v1/chat/completions").await.assert_error(405, "method_not_allowed");
}

/// A chat request for `gpt-test` of exactly `len` bytes.
fn padded_chat_body(len: usize) -> Vec<u8> {
    let empty = json!({"model": "gpt-test", "messages": [{"role": "user", "content": ""}]}).to_string();
    let content = "x".repeat(len - empty.len());
    let body = json!({"model": "gpt-test", "messages": [{"role": "user", "content": content}]}).to_string();
    assert_eq!(body.len(), len);
    body.into_bytes()
}

#[tokio::test]
async fn backends_rewrite_the_model_and_carry_the_api_key() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let backend = Backend::new(&echo.url()).model("upstream-model").api_key_env("E2E_BACKEND_KEY");
    let route = Route::new("chat", &["gpt-test"], &echo.url()).backends(vec![backend]);
    dir.write("route.yaml", &route.yaml());
    let secret = "sk-e2e-not-for-clients";
    let env = vec![("E2E_BACKEND_KEY".to_string(), secret.to_string())];
    let gateway = Gateway::start_with(&dir, Options { env, ..Options::default() }).await;

    let reply = gateway.chat("gpt-test", &[("authorization", "Bearer client-token")]).await;
    let echoed = reply.echoed();
    assert_eq!(echoed["model"], "upstream-model", "the upstream sees the backend's model: {echoed}");
    assert_eq!(echoed["headers"]["authorization"], format!("Bearer {secret}"), "the client's key is replaced");
    assert_eq!(reply.json()["model"], "upstream-model");

    // The key is used, never shown.
    let admin = gateway.admin_config().await;
    assert_eq!(admin["routes"][0]["backends"][0]["apiKey"], true, "{admin}");
    assert!(!admin.to_string().contains(secret), "/admin/config shows the API key: {admin}");
    assert!(!gateway.log().contains(secret), "the log shows the API key");
}

#[tokio::test]
async fn server_sent_events_stream_through_unbuffered() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).yaml());
    let gateway = Gateway::start(&dir).await;

    let mut body = chat_body("gpt-test");
    body["stream"] = true.into();
    // Five content chunks, 200 ms apart: about a second from first to last.
    let knobs = [("x-echo-chunks", "5"), ("x-echo-chunk-delay-ms", "200")];
    let url = gateway.url("/v1/chat/completions");
    let streamed = gateway.client().post_streaming(&url, body.to_string(), &knobs).await;
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.headers.get("content-type").unwrap(), "text/event-stream");

    let events = streamed.events();
    let (first_at, _) = events.first().expect("at least one event");
    let (done_at, done) = events.last().unwrap();
    assert_eq!(done, "[DONE]");
    let spread = *done_at - *first_at;
    assert!(
        spread >= Duration::from_millis(600),
        "the first event arrived only {spread:?} before [DONE]: the stream was buffered"
    );

    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, data)| serde_json::from_str(data).unwrap_or_else(|e| panic!("event is not JSON ({e}): {data}")))
        .collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"), "{chunks:?}");
    let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    let echoed: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("streamed content ({e}): {content}"));
    assert_eq!(echoed["messages"], chat_body("gpt-test")["messages"]);
}

/// `--worker-threads 1` serves on a current-thread runtime: plugins,
/// streams, concurrent requests and a reload all on the one thread.
#[tokio::test]
async fn one_worker_thread_serves_plugins_streams_and_reloads() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let add_header =
        |value: &str| Plugin::new("add-header", "add-header").config(json!({"header": "x-team", "value": value}));
    dir.write("plugin.yaml", &add_header("one").yaml());
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["add-header"]).yaml());
    let options = Options { args: vec!["--worker-threads".into(), "1".into()], ..Default::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    let threads = gateway.thread_names();
    // Blocking work (compiling, snapshots) has threads of its own either way.
    assert!(threads.iter().all(|name| name != "sluice-worker"), "a worker pool was started: {threads:?}");

    let mut body = chat_body("gpt-test");
    body["stream"] = true.into();
    let knobs = [("x-echo-chunks", "5"), ("x-echo-chunk-delay-ms", "100")];
    let url = gateway.url("/v1/chat/completions");
    let stream = gateway.client().post_streaming(&url, body.to_string(), &knobs);
    let chats = futures_util::future::join_all((0..20).map(|_| gateway.chat("gpt-test", &[])));
    let (streamed, replies) = tokio::join!(stream, chats);
    assert_eq!(streamed.events().last().map(|(_, data)| data.as_str()), Some("[DONE]"));
    for reply in replies {
        assert_eq!(reply.echoed()["headers"]["x-team"], "one");
    }

    dir.write("plugin.yaml", &add_header("two").yaml());
    sluice_tests::eventually("the reloaded plugin to be served", Duration::from_secs(10), async || {
        (gateway.chat("gpt-test", &[]).await.echoed()["headers"]["x-team"] == "two").then_some(())
    })
    .await;
}

#[tokio::test]
async fn h2c_prior_knowledge_is_served() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let plugin = Plugin::new("add-header", "add-header").config(json!({"header": "x-team", "value": "h2"}));
    let route = Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["add-header"]);
    dir.write("config.yaml", &documents(&[plugin.yaml(), route.yaml()]));
    let gateway = Gateway::start(&dir).await;

    let h2c = Client::h2c();
    let url = gateway.url("/v1/chat/completions");
    let reply = h2c.post(&url, chat_body("gpt-test").to_string(), &[]).await;
    assert_eq!(reply.version, hyper::Version::HTTP_2);
    let echoed = reply.echoed();
    assert_eq!(echoed["headers"]["x-team"], "h2");
    assert_eq!(echoed["model"], "gpt-test");
    h2c.post(&url, chat_body("nope").to_string(), &[]).await.assert_error(404, "model_not_found");
}

#[tokio::test]
async fn shutdown_drains_in_flight_streams() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).yaml());
    let mut gateway = Gateway::start(&dir).await;

    let mut body = chat_body("gpt-test");
    body["stream"] = true.into();
    // About a second of streaming, with SIGTERM arriving early in it.
    let knobs = [("x-echo-chunks", "5"), ("x-echo-chunk-delay-ms", "200")];
    let url = gateway.url("/v1/chat/completions");
    let client = gateway.client().clone();
    let in_flight = tokio::spawn(async move { client.post_streaming(&url, body.to_string(), &knobs).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gateway.terminate();

    let streamed = in_flight.await.unwrap();
    assert_eq!(streamed.status, 200);
    let events = streamed.events();
    assert_eq!(events.last().map(|(_, data)| data.as_str()), Some("[DONE]"), "the stream was cut: {events:?}");
    let status = gateway.wait_exit(Duration::from_secs(10)).await.expect("the gateway exits after draining");
    assert!(status.success(), "exit status {status}");
    assert!(gateway.log().contains("draining"), "{}", gateway.log());
}

/// The auth phase guards a protected model, but no plugin runs for
/// `/v1/models` or for a model no route serves (docs/security.md, T1).
/// Those requests name no route's model, so they belong to no namespace,
/// and running every route's auth chain on them showed one tenant's
/// credentials to another tenant's plugins. So an unknown model is a plain
/// 404 whoever asks (model names can be found by probing, as with OpenAI's
/// own API: docs/security.md), and the listing names only models whose
/// routes have no auth plugin, with or without a key.
#[tokio::test]
async fn the_auth_phase_guards_its_models_and_no_plugin_runs_for_a_listing_or_an_unknown_model() {
    use sha2::Digest;
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let key = "sk-enumeration-test";
    let hash = hex::encode(sha2::Sha256::digest(key));
    let auth =
        Plugin::new("auth", "auth").auth_phase().config(json!({"apiKeys": [{"consumer": "svc", "sha256": hash}]}));
    let routes = [
        Route::new("private", &["secret-model"], &echo.url()).plugins(&["auth"]),
        Route::new("public", &["open-model"], &echo.url()),
    ];
    dir.write("plugins.yaml", &auth.yaml());
    dir.write("routes.yaml", &documents(&routes.map(|r| r.yaml())));
    let gateway = Gateway::start(&dir).await;
    let listed = |reply: sluice_tests::Reply| -> Vec<String> {
        assert_eq!(reply.status, 200, "{}", reply.text());
        let mut ids: Vec<String> =
            reply.json()["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
        ids.sort();
        ids
    };

    // No credentials.
    assert_eq!(listed(gateway.get("/v1/models").await), ["open-model"], "a protected model was listed");
    let protected = gateway.chat("secret-model", &[]).await;
    assert_eq!(protected.status, 401, "{}", protected.text());
    gateway.chat("no-such-model", &[]).await.assert_error(404, "model_not_found");
    assert_eq!(gateway.chat("open-model", &[]).await.status, 200);

    // With the key: the protected model is served, still not listed (the
    // listing runs no plugin), and an unknown model is the same 404.
    let bearer = format!("Bearer {key}");
    let with_key = [("authorization", bearer.as_str())];
    let reply = gateway.client().send(
        hyper::Request::get(gateway.url("/v1/models"))
            .header("authorization", &bearer)
            .body(sluice_tests::empty())
            .unwrap(),
    );
    assert_eq!(listed(reply.await), ["open-model"]);
    assert_eq!(gateway.chat("secret-model", &with_key).await.status, 200);
    gateway.chat("no-such-model", &with_key).await.assert_error(404, "model_not_found");
}

/// The kubelet's probes get a listener of their own (`--probes`) that
/// serves /healthz and /readyz and nothing else, so the admin listener,
/// with the config view, can stay on loopback (docs/security.md, C4).
#[tokio::test]
async fn the_probes_listener_serves_the_probes_and_not_the_config() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    dir.write("routes.yaml", &Route::new("chat", &["m"], &echo.url()).yaml());
    let probes = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let options = Options { args: vec!["--probes".into(), probes.to_string()], ..Default::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    let client = gateway.client();
    assert_eq!(client.get(&format!("http://{probes}/readyz")).await.status, 200);
    assert_eq!(client.get(&format!("http://{probes}/healthz")).await.status, 200);
    assert_eq!(client.get(&format!("http://{probes}/admin/config")).await.status, 404);
    assert!(gateway.admin_config().await["routes"].is_array(), "the admin listener still has the config view");
}
