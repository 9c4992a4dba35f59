//! Hot reload: edits to the config dir apply while serving, a broken file
//! keeps the last good config, and no request fails across a swap.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, chat_body, eventually};

/// Reloads are noticed by a filesystem watcher (or a 2 s poll): a few
/// seconds is plenty, even on a busy machine.
const RELOAD: Duration = Duration::from_secs(10);

fn add_header(value: &str) -> String {
    Plugin::new("add-header", "add-header").config(json!({"header": "x-team", "value": value})).yaml()
}

/// The `x-team` header the upstream received for a chat to `model`.
async fn team(gateway: &Gateway, model: &str) -> Value {
    gateway.chat(model, &[]).await.echoed()["headers"]["x-team"].clone()
}

#[tokio::test]
async fn edits_apply_and_a_broken_file_keeps_the_last_good_config() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    dir.write("plugin.yaml", &add_header("one"));
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["add-header"]).yaml());
    let gateway = Gateway::start(&dir).await;
    assert_eq!(team(&gateway, "gpt-test").await, "one");

    dir.write("plugin.yaml", &add_header("two"));
    eventually("the new header value to be served", RELOAD, async || {
        (team(&gateway, "gpt-test").await == "two").then_some(())
    })
    .await;

    dir.write("broken.yaml", "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nspec: [\n");
    let broken = dir.file("broken.yaml").display().to_string();
    let errors = eventually("/admin/config to report broken.yaml", RELOAD, async || {
        let errors = gateway.admin_config().await["errors"].clone();
        errors.to_string().contains(&broken).then_some(errors)
    })
    .await;
    assert_eq!(errors.as_array().unwrap().len(), 1, "only the broken file is reported: {errors}");
    assert!(gateway.wait_for_log(&broken).await, "the log names the broken file");
    assert_eq!(team(&gateway, "gpt-test").await, "two", "the last good config serves on");

    // While any file is broken, nothing from the directory applies.
    dir.write("plugin.yaml", &add_header("three"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(team(&gateway, "gpt-test").await, "two", "an edit applied while another file was broken");

    dir.write("broken.yaml", &Route::new("extra", &["extra"], &echo.url()).plugins(&["add-header"]).yaml());
    eventually("the fixed file to apply", RELOAD, async || {
        let reply = gateway.chat("extra", &[]).await;
        (reply.status == 200).then_some(())
    })
    .await;
    assert_eq!(team(&gateway, "extra").await, "three");
    assert_eq!(team(&gateway, "gpt-test").await, "three");
    assert_eq!(gateway.admin_config().await["errors"], json!([]));
}

#[tokio::test]
async fn no_request_fails_while_the_config_changes() {
    const CLIENTS: usize = 4;
    const REWRITES: usize = 20;
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let extra = Route::new("extra", &["extra"], &echo.url()).plugins(&["add-header"]).yaml();
    dir.write("plugin.yaml", &add_header("blue"));
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["add-header"]).yaml());
    let gateway = Gateway::start(&dir).await;
    let first_generation = gateway.admin_config().await["generation"].as_u64().unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let url = gateway.url("/v1/chat/completions");
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (client, url, stop) = (gateway.client().clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let reply = client.post(&url, chat_body("gpt-test").to_string(), &[]).await;
                    let team = (reply.status == 200).then(|| reply.echoed()["headers"]["x-team"].clone());
                    outcomes.push((reply.status, team, reply.text()));
                }
                outcomes
            })
        })
        .collect();

    // Swap the header value and add or remove a second route, over and over.
    for rewrite in 0..REWRITES {
        if rewrite % 2 == 0 {
            dir.write("plugin.yaml", &add_header("green"));
            dir.write("extra.yaml", &extra);
        } else {
            dir.write("plugin.yaml", &add_header("blue"));
            dir.remove("extra.yaml");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);

    let mut seen = BTreeSet::new();
    let mut requests = 0;
    for client in clients {
        for (status, team, body) in client.await.expect("a client task panicked") {
            assert_eq!(status, 200, "a request failed during reloads: {body}");
            let team = team.unwrap();
            assert!(team == "blue" || team == "green", "unexpected x-team {team}");
            seen.insert(team.as_str().unwrap().to_string());
            requests += 1;
        }
    }
    assert!(requests >= 2 * REWRITES, "only {requests} requests were sent during {REWRITES} rewrites");
    assert_eq!(seen.len(), 2, "the reloads did not show while requests ran: only saw {seen:?}");

    // The last rewrite set blue and removed the extra route.
    eventually("the last rewrite to apply", RELOAD, async || {
        (team(&gateway, "gpt-test").await == "blue" && gateway.chat("extra", &[]).await.status == 404).then_some(())
    })
    .await;
    let admin = gateway.admin_config().await;
    assert!(admin["generation"].as_u64().unwrap() > first_generation + 1, "{admin}");
    assert_eq!(admin["errors"], json!([]), "{admin}");
}
