//! Per-backend TLS against an HTTPS upstream with a CA of its own: the
//! backend's CA bundle, the name it is verified against, and the gateway's
//! client certificate (mutual TLS); a bad `tls` block is refused and loses
//! nothing.

use std::time::Duration;

use serde_json::Value;
use sluice_tests::{ConfigDir, Echo, Gateway, TestCa, TlsOptions, TlsUpstream, documents, eventually};

/// Reloads are noticed by a filesystem watcher (or a 2 s poll).
const RELOAD: Duration = Duration::from_secs(10);

/// An AIModelRoute named after its one model, with one backend at `url`
/// and, unless empty, that backend's `tls` block. Relative paths in it are
/// relative to the YAML file.
fn route(name: &str, url: &str, tls: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: {name}\n\
         spec:\n  models: [{name}]\n  backends:\n    - url: {}\n",
        Value::from(url)
    );
    if !tls.is_empty() {
        yaml += "      tls:\n";
        for (key, value) in tls {
            yaml += &format!("        {key}: {}\n", Value::from(*value));
        }
    }
    yaml
}

/// The message of the 502 a chat to `model` is answered with; nothing may
/// reach the echo behind the upstream.
async fn refused(gateway: &Gateway, echo: &Echo, model: &str) -> String {
    let before = echo.script().requests();
    let reply = gateway.chat(model, &[]).await;
    let error = reply.assert_error(502, "upstream_unavailable");
    assert_eq!(echo.script().requests(), before, "{model}: a request got through: {error}");
    error["message"].as_str().expect("an error message").to_string()
}

/// A chat to `model` that the echo behind the upstream answered.
async fn served(gateway: &Gateway, echo: &Echo, model: &str) {
    let before = echo.script().requests();
    let echoed = gateway.chat(model, &[]).await.echoed();
    assert_eq!(echoed["model"], model, "{echoed}");
    assert_eq!(echoed["path"], "/v1/chat/completions", "{echoed}");
    assert_eq!(echo.script().requests(), before + 1, "{model}: the echo saw the request");
}

#[tokio::test]
async fn a_backend_signed_by_a_private_ca_is_trusted_through_its_ca_file_only() {
    let echo = Echo::start().await;
    let upstream = TlsUpstream::start(echo.addr(), TlsOptions::new(&["127.0.0.1"])).await;
    let dir = ConfigDir::new();
    upstream.write_ca(dir.path(), "ca.pem");
    TestCa::new("unrelated").write_pem(dir.path(), "other-ca.pem");
    let routes = [
        route("public-roots", &upstream.url(), &[]),
        route("private-ca", &upstream.url(), &[("caFile", "ca.pem")]),
        route("other-ca", &upstream.url(), &[("caFile", "other-ca.pem")]),
    ];
    dir.write("routes.yaml", &documents(&routes));
    let gateway = Gateway::start(&dir).await;

    // The public roots do not vouch for a private CA; nor does another CA.
    for model in ["public-roots", "other-ca"] {
        let message = refused(&gateway, &echo, model).await;
        assert!(message.contains("UnknownIssuer"), "{model}: {message}");
    }
    assert_eq!(upstream.handshakes(), 0, "a handshake with an untrusted certificate completed");
    // The gateway told the upstream why.
    let errors = upstream.wait_for_failed_handshakes(2).await;
    assert!(errors.iter().all(|e| e.contains("UnknownCA")), "{errors:?}");

    served(&gateway, &echo, "private-ca").await;
    assert!(upstream.handshakes() >= 1);
    // A second request goes over the pooled connection, or another one.
    served(&gateway, &echo, "private-ca").await;
}

#[tokio::test]
async fn an_upstream_offering_only_http1_is_spoken_to_in_http1() {
    let echo = Echo::start().await;
    let upstream = TlsUpstream::start(echo.addr(), TlsOptions::new(&["127.0.0.1"]).http1_only()).await;
    let dir = ConfigDir::new();
    upstream.write_ca(dir.path(), "ca.pem");
    dir.write("routes.yaml", &route("private-ca", &upstream.url(), &[("caFile", "ca.pem")]));
    let gateway = Gateway::start(&dir).await;

    served(&gateway, &echo, "private-ca").await;
    served(&gateway, &echo, "private-ca").await;
    let handshakes = upstream.completed();
    assert!(
        !handshakes.is_empty() && handshakes.iter().all(|h| h.alpn.as_deref() == Some("http/1.1")),
        "{handshakes:?}"
    );
}

#[tokio::test]
async fn server_name_is_sent_and_verified_instead_of_the_url_host() {
    let echo = Echo::start().await;
    let upstream = TlsUpstream::start(echo.addr(), TlsOptions::new(&["upstream.internal"])).await;
    let dir = ConfigDir::new();
    let ca = upstream.write_ca(dir.path(), "ca.pem");
    // An absolute caFile works too.
    let ca = ca.to_str().expect("a UTF-8 temp path");
    let routes = [
        route("by-address", &upstream.url(), &[("caFile", ca)]),
        route("by-name", &upstream.url(), &[("caFile", ca), ("serverName", "upstream.internal")]),
        route("wrong-name", &upstream.url(), &[("caFile", ca), ("serverName", "other.internal")]),
    ];
    dir.write("routes.yaml", &documents(&routes));
    let gateway = Gateway::start(&dir).await;

    let message = refused(&gateway, &echo, "by-address").await;
    assert!(message.contains("not valid for name") && message.contains("127.0.0.1"), "{message}");
    let message = refused(&gateway, &echo, "wrong-name").await;
    assert!(message.contains("not valid for name") && message.contains("other.internal"), "{message}");
    assert_eq!(upstream.handshakes(), 0);
    let errors = upstream.wait_for_failed_handshakes(2).await;
    assert!(errors.iter().all(|e| e.contains("BadCertificate")), "{errors:?}");

    served(&gateway, &echo, "by-name").await;
    let handshakes = upstream.completed();
    assert!(!handshakes.is_empty());
    for handshake in &handshakes {
        assert_eq!(handshake.server_name.as_deref(), Some("upstream.internal"), "the SNI sent: {handshake:?}");
        // Both offer h2: the echo behind the upstream is spoken to in h2.
        assert_eq!(handshake.alpn.as_deref(), Some("h2"), "{handshake:?}");
    }
}

#[tokio::test]
async fn an_upstream_that_requires_a_client_certificate_gets_the_right_one() {
    let echo = Echo::start().await;
    let upstream = TlsUpstream::start(echo.addr(), TlsOptions::new(&["127.0.0.1"]).require_client_cert()).await;
    let dir = ConfigDir::new();
    upstream.write_ca(dir.path(), "ca.pem");
    upstream.write_client_cert(dir.path(), "client.pem", "client-key.pem");
    upstream.write_unrelated_client_cert(dir.path(), "stranger.pem", "stranger-key.pem");
    let routes = [
        route("anonymous", &upstream.url(), &[("caFile", "ca.pem")]),
        route(
            "stranger",
            &upstream.url(),
            &[("caFile", "ca.pem"), ("certFile", "stranger.pem"), ("keyFile", "stranger-key.pem")],
        ),
        route(
            "known",
            &upstream.url(),
            &[("caFile", "ca.pem"), ("certFile", "client.pem"), ("keyFile", "client-key.pem")],
        ),
    ];
    dir.write("routes.yaml", &documents(&routes));
    let gateway = Gateway::start(&dir).await;

    // In TLS 1.3 the client learns of the refusal after its handshake, from
    // an alert that may or may not be read before the connection closes:
    // the gateway's message does not always name it. The upstream's does.
    refused(&gateway, &echo, "anonymous").await;
    let errors = upstream.wait_for_failed_handshakes(1).await;
    assert!(errors.iter().all(|e| e.contains("peer sent no certificates")), "{errors:?}");

    let failed = upstream.failed_handshakes();
    refused(&gateway, &echo, "stranger").await;
    let errors = upstream.wait_for_failed_handshakes(failed + 1).await;
    assert!(errors.last().is_some_and(|e| e.contains("UnknownIssuer")), "the upstream did not trust it: {errors:?}");
    assert_eq!(upstream.handshakes(), 0, "a handshake without the right client certificate completed");

    served(&gateway, &echo, "known").await;
    let handshakes = upstream.completed();
    assert!(!handshakes.is_empty() && handshakes.iter().all(|h| h.client_cert), "{handshakes:?}");
}

/// The `errors` of /admin/config, once one of them holds `text`.
async fn admin_error(gateway: &Gateway, text: &str) -> Value {
    eventually(&format!("/admin/config to report `{text}`"), RELOAD, async || {
        let errors = gateway.admin_config().await["errors"].clone();
        errors.as_array()?.iter().find(|e| e["message"].as_str().is_some_and(|m| m.contains(text))).cloned()
    })
    .await
}

#[tokio::test]
async fn a_bad_tls_block_is_refused_and_the_last_good_route_serves_on() {
    let echo = Echo::start().await;
    let upstream = TlsUpstream::start(echo.addr(), TlsOptions::new(&["127.0.0.1"])).await;
    let dir = ConfigDir::new();
    upstream.write_ca(dir.path(), "ca.pem");
    upstream.write_client_cert(dir.path(), "client.pem", "client-key.pem");
    dir.write("routes.yaml", &route("guarded", &upstream.url(), &[("caFile", "ca.pem")]));
    let gateway = Gateway::start(&dir).await;
    served(&gateway, &echo, "guarded").await;
    let routes_yaml = dir.file("routes.yaml").display().to_string();

    // Mistakes the YAML shows: the file is refused whole, the last good
    // config serves on.
    let plain_url = echo.url();
    let invalid = [
        (route("guarded", &plain_url, &[("caFile", "ca.pem")]), "sets `tls` but is not an https:// URL"),
        (
            route("guarded", &upstream.url(), &[("caFile", "ca.pem"), ("certFile", "client.pem")]),
            "tls.certFile and tls.keyFile go together",
        ),
    ];
    for (yaml, problem) in invalid {
        dir.write("routes.yaml", &yaml);
        let error = admin_error(&gateway, problem).await;
        assert_eq!(error["resource"], format!("file {routes_yaml}"), "{error}");
        assert!(error["message"].as_str().unwrap().contains("AIModelRoute default/guarded"), "{error}");
        served(&gateway, &echo, "guarded").await;
    }

    // A CA file that is not there shows only when the route is built: the
    // route keeps its last good version, and a new route is not served.
    let missing = dir.file("missing-ca.pem").display().to_string();
    let routes = [
        route("guarded", &upstream.url(), &[("caFile", "missing-ca.pem")]),
        route("fresh", &upstream.url(), &[("caFile", "missing-ca.pem")]),
    ];
    dir.write("routes.yaml", &documents(&routes));
    let error = admin_error(&gateway, "still serving its last good version").await;
    assert_eq!(error["resource"], "AIModelRoute default/guarded", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(&missing) && message.contains("No such file"), "{message}");
    served(&gateway, &echo, "guarded").await;
    gateway.chat("fresh", &[]).await.assert_error(404, "model_not_found");
    let errors = gateway.admin_config().await["errors"].clone();
    let fresh = errors.as_array().unwrap().iter().find(|e| e["resource"] == "AIModelRoute default/fresh");
    assert!(fresh.is_some_and(|e| e["message"].as_str().unwrap().contains(&missing)), "{errors}");
    assert!(gateway.wait_for_log(&missing).await, "the log names the missing file");

    // Fixed, it applies.
    dir.write("routes.yaml", &documents(&[route("fresh", &upstream.url(), &[("caFile", "ca.pem")])]));
    eventually("the fixed route to serve", RELOAD, async || {
        (gateway.chat("fresh", &[]).await.status == 200).then_some(())
    })
    .await;
    assert_eq!(gateway.admin_config().await["errors"], serde_json::json!([]));
}
