//! Inputs the fuzz targets found, and edges they must keep covering, run
//! through the same checks as the targets. Kept apart from tests/fuzz.rs,
//! whose tests `cargo xtask fuzz` takes to be its targets.

use sluice_fuzz::headers::{self, Edits, Name, Value};
use sluice_fuzz::{sse, yaml};

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
