//! Inputs the fuzz targets found, and edges they must keep covering, run
//! through the same checks as the targets. Kept apart from tests/fuzz.rs,
//! whose tests `cargo xtask fuzz` takes to be its targets.

use sluice_fuzz::headers::{self, Edits, Name, Value};
use sluice_fuzz::{content, sse, yaml};

fn name(s: &str) -> Name {
    Name::Other(s.into())
}

fn value(s: &str) -> Value {
    Value::Other(s.into())
}

/// Found by plugin_edits: removals were applied before a later name was
/// found invalid, so a plugin skipped under `failurePolicy: Open` had
/// still removed `authorization`.
#[test]
fn a_refused_edit_changes_nothing() {
    headers::check(&Edits {
        headers: vec![(name("authorization"), value("Bearer client"))],
        set: vec![(name("bad name"), value("v"))],
        remove: vec![name("authorization")],
    });
}

/// Found by plugin_edits: of several values a plugin set for one name,
/// only the first was kept.
#[test]
fn every_value_set_for_a_name_is_kept() {
    headers::check(&Edits {
        headers: vec![],
        set: vec![(name("x-a"), value("1")), (name("X-A"), value("2"))],
        remove: vec![],
    });
}

/// Framing and hop-by-hop headers stay as the gateway set them, whatever
/// the plugin sets or removes.
#[test]
fn protected_headers_are_not_edited() {
    headers::check(&Edits {
        headers: vec![(name("content-length"), value("10")), (name("host"), value("api"))],
        set: vec![
            (name("Content-Length"), value("0")),
            (name("transfer-encoding"), value("chunked")),
            (name("host"), value("evil")),
        ],
        remove: vec![name("content-length"), name("host")],
    });
}

const ROUTE: &str = "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {name: r}\n";

/// Found by yaml_config: a backend URL of just `http://` passed the check,
/// then had its slashes trimmed to `http:`.
#[test]
fn a_backend_url_without_a_host_is_refused() {
    yaml::check_text(&format!("{ROUTE}spec: {{models: [m], backends: [{{url: 'http://'}}]}}\n"));
}

/// Found by yaml_config: `timeoutMs: 0` (which the CRD refuses) gave a
/// route that times out every request at once.
#[test]
fn a_route_timeout_is_never_zero() {
    yaml::check_text(&format!("{ROUTE}spec: {{models: [m], backends: [{{url: 'http://h'}}], timeoutMs: 0}}\n"));
}

/// Aliases that expand a billion-fold, and nesting past any recursion
/// limit, are refused rather than expanded or followed.
#[test]
fn yaml_bombs_are_refused() {
    let mut laughs = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for (prev, next) in ('a'..'j').zip('b'..='j') {
        laughs.push_str(&format!("{next}: &{next} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
    }
    for text in [laughs, "[".repeat(100_000), "a: ".repeat(100_000)] {
        let started = std::time::Instant::now();
        assert!(sluice_api::parse_documents(&text).iter().all(Result::is_err));
        yaml::check_text(&text);
        assert!(started.elapsed().as_secs() < 5, "took {:?}", started.elapsed());
    }
}

/// A terminator split across frames, and an event whose data a plugin
/// rewrites, through the target's checks.
#[test]
fn sse_edges() {
    use sse::Piece::{Byte, Known, Text};
    sse::check(&sse::Stream {
        // data: a \n \r\n  ... "\n" then "\r\n" across a frame boundary.
        pieces: vec![Known(0), Text("a".into()), Known(8), Known(9), Known(1), Byte(b'b'), Known(10), Known(8)],
        frames: vec![1, 0, 2, 3],
        new_data: vec![Text("x".into()), Known(8), Known(8), Text("y".into())],
    });
}

/// Found by request_json: bodies `requested_model` routes but
/// `rewrite_model` cannot parse again, so a route with a backend model
/// answered them with a 500.
#[test]
fn a_routed_body_can_be_rewritten() {
    for body in [r#"{"model":"m","x":1e400}"#, r#"{"model":"m","x":"\ud800"}"#] {
        sluice_fuzz::json::check_model(body.as_bytes(), "backend-model");
    }
}

/// Found by request_json: a JSON array was routed by its first element,
/// as if it were `{"model": ...}`.
#[test]
fn only_an_object_is_routed() {
    sluice_fuzz::json::check_model(br#"["gpt-4o-mini"]"#, "backend-model");
}

/// Found by request_json: the rewrite sent the upstream other numbers than
/// the client's: an integer past u64 as a rounded float, and a float an
/// ulp off (serde_json's default float parsing is not exact).
#[test]
fn the_rewrite_keeps_numbers_as_written() {
    for number in ["123456789012345678901234567890", "7.509632777023061e-308"] {
        let body = bytes::Bytes::from(format!(r#"{{"model":"m","x":{number}}}"#));
        let rewritten = sluice_gateway::fuzzing::rewrite_model(&body, "backend-model").expect("rewritten");
        let text = String::from_utf8_lossy(&rewritten);
        assert!(text.contains(number), "{text}");
    }
}

/// The bodies plugin_view_is_what_is_sent starts from, and the two ways
/// plugins and upstreams read content differently (docs/security.md, P2): a
/// duplicated `text` (the SDK's strict parse read no text, an upstream the
/// last value) and a `refusal` part (sent to Anthropic as text, unseen by
/// the SDK's text view). Each runs the target's check: the first is now
/// refused before routing, the second before the translation sends it.
#[test]
fn what_plugins_see_is_what_is_sent() {
    for body in [
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"ok","text":"deny me"}]}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"ok","te\u0078t":"deny me"}]}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"ok","content":"deny me"}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"refusal","refusal":"deny me"}]}]}"#,
        r#"{"model":"m","messages":[{"role":"assistant","content":[{"type":"refusal","refusal":"no","text":"x"}]}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","cache_control":{}}]}]}"#,
        r#"{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"s"}]},{"role":"user","content":"u"},{"role":"tool","tool_call_id":"t","content":[{"type":"text","text":"r"}]}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"input_text","text":"i"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}"#,
    ] {
        content::check_body(body.as_bytes());
    }
    // The duplicates never reach a reader at all.
    for body in [
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"ok","text":"deny me"}]}]}"#,
        r#"{"model":"m","messages":[],"x":{"a":1,"\u0061":2}}"#,
    ] {
        let refused = sluice_gateway::fuzzing::requested_model(body.as_bytes());
        assert_eq!(refused, Err((400, "duplicate_key")), "{body}");
    }
}
