//! The fuzz targets. Under `cargo test` each runs for a second on random
//! inputs (BOLERO_RANDOM_TEST_TIME_MS or BOLERO_RANDOM_ITERATIONS change
//! that); `cargo xtask fuzz` runs them coverage-guided with cargo-bolero.
//! A failure prints the input and a BOLERO_RANDOM_SEED that replays it.
//!
//! Below the targets: inputs fuzzing found or that pin a known edge, run
//! as plain tests.

use bolero::check;
use sluice_fuzz::{content, headers, json, oci, sse, yaml};

#[test]
fn request_json() {
    check!().with_type::<json::Request>().for_each(json::check_request);
}

#[test]
fn plugin_view_is_what_is_sent() {
    check!().with_type::<content::Chat>().for_each(content::check);
}

#[test]
fn response_json() {
    check!().with_type::<json::Body>().for_each(json::check);
}

#[test]
fn sse_stream() {
    check!().with_type::<sse::Stream>().for_each(sse::check);
}

#[test]
fn oci_manifest() {
    check!().with_type::<oci::Manifest>().for_each(oci::check_manifest);
}

#[test]
fn oci_layer() {
    check!().with_type::<oci::Layer>().for_each(oci::check_layer);
}

#[test]
fn oci_component() {
    check!().with_type::<oci::Component>().for_each(oci::check_component);
}

#[test]
fn yaml_config() {
    check!().with_type::<yaml::Stream>().for_each(yaml::check);
}

#[test]
fn plugin_edits() {
    check!().with_type::<headers::Edits>().for_each(headers::check);
}
