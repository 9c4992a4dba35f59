//! Routing decisions (`request.set-model`, `request.set-backend`) through
//! the real gateway, made by the `caller` test plugin from its request
//! headers: a model of the same route, a model of another route of the
//! namespace (whose own chain, backends and name then apply), a backend by
//! name, and each decision a plugin may not make.

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{Backend, ConfigDir, Echo, Gateway, Options, Plugin, Reply, Route, documents, eventually};

async fn chat(gateway: &Gateway, model: &str, id: &str, headers: &[(&str, &str)]) -> Reply {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "route me"}]});
    let mut all = vec![("x-request-id", id)];
    all.extend_from_slice(headers);
    gateway.post("/v1/chat/completions", body.to_string(), &all).await
}

/// The access log line of the request with id `id`, once written.
async fn access_line(gateway: &Gateway, id: &str) -> Value {
    eventually("the access log line", Duration::from_secs(5), async || {
        gateway
            .log()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|line| line["target"] == "sluice::access" && line["request_id"] == id)
    })
    .await
}

#[tokio::test]
async fn a_plugin_routes_within_its_namespace_as_if_the_client_had_asked() {
    let first = Echo::start().await;
    let second = Echo::start().await;
    // The caller imports outbound HTTP, so it needs a grant, though it calls
    // nothing here.
    let grant = json!({"destinations": [{"url": "http://127.0.0.1:9"}]});
    let router = Plugin::new("router", "caller").egress(grant.clone()).yaml();
    let auth_router = Plugin::new("auth-router", "caller").egress(grant).auth_phase().yaml();
    let tag = Plugin::new("tag", "add-header")
        .config(json!({"header": "x-tagged", "value": "1", "responseHeader": {"name": "x-small-route", "value": "1"}}))
        .yaml();
    let routes = [
        Route::new("router", &["auto", "auto-alt"], &first.url()).plugins(&["router"]).yaml(),
        Route::new("small", &["small"], &first.url())
            .backends(vec![Backend::new(&first.url()).name("one"), Backend::new(&second.url()).name("two")])
            .plugins(&["tag"])
            .yaml(),
        Route::new("auth-router", &["guarded"], &first.url()).plugins(&["auth-router"]).yaml(),
    ];
    let dir = ConfigDir::new();
    dir.write("plugins.yaml", &documents(&[router, auth_router, tag]));
    dir.write("routes.yaml", &documents(&routes));
    let options = Options { env: vec![("SLUICE_LOG_FORMAT".into(), "json".into())], ..Options::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    eventually("three routes", Duration::from_secs(60), async || {
        (gateway.admin_config().await["routes"].as_array()?.len() == 3).then_some(())
    })
    .await;

    // Untouched, `auto` goes to its own route as it came.
    let reply = chat(&gateway, "auto", "plain", &[]).await;
    assert_eq!(reply.echoed()["model"], "auto");

    // Another model of the same route: the upstream is asked for it, and
    // the access log names both.
    let reply = chat(&gateway, "auto", "same-route", &[("x-route-model", "auto-alt")]).await;
    assert_eq!(reply.echoed()["model"], "auto-alt");
    let line = access_line(&gateway, "same-route").await;
    assert_eq!(
        (&line["route"], &line["model"], &line["requested_model"]),
        (&json!("default/router"), &json!("auto-alt"), &json!("auto")),
        "{line}"
    );

    // A model of another route of the namespace: that route's chain runs
    // (its plugin tags the request and the response) and its backends serve.
    let reply = chat(&gateway, "auto", "other-route", &[("x-route-model", "small")]).await;
    let echoed = reply.echoed();
    assert_eq!((&echoed["model"], &echoed["headers"]["x-tagged"]), (&json!("small"), &json!("1")), "{echoed}");
    assert_eq!(reply.header("x-small-route"), Some("1"));
    let line = access_line(&gateway, "other-route").await;
    assert_eq!(
        (&line["route"], &line["model"], &line["requested_model"]),
        (&json!("default/small"), &json!("small"), &json!("auto")),
        "{line}"
    );

    // A backend by name, on that route: always the one chosen.
    let before = (first.script().requests(), second.script().requests());
    for i in 0..4 {
        let reply =
            chat(&gateway, "auto", &format!("backend-{i}"), &[("x-route-model", "small"), ("x-route-backend", "two")])
                .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let after = (first.script().requests(), second.script().requests());
    assert_eq!((after.0 - before.0, after.1 - before.1), (0, 4), "requests per backend");

    // Decisions a plugin may not make fail it (failurePolicy: Closed): a
    // model nobody in the namespace serves, a backend its route does not
    // name, and any decision in the auth phase, which runs before routing.
    let refused = [
        ("auto", vec![("x-route-model", "no-such-model")], "which no route of namespace `default` serves"),
        ("auto", vec![("x-route-backend", "two")], "which route default/router does not name"),
        ("guarded", vec![("x-route-model", "small")], "in the auth phase"),
    ];
    for (model, headers, why) in refused {
        let reply = chat(&gateway, model, "refused", &headers).await;
        let error = reply.assert_error(500, "plugin_failed");
        assert!(error["message"].as_str().unwrap().contains(why), "{headers:?}: {error}");
    }
    assert_eq!(second.script().requests(), after.1, "a refused decision reached a backend");
}
