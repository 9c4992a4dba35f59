//! Fuzz targets for the parsers Sluice runs on untrusted input: request and
//! response JSON, server-sent events from upstreams, OCI manifests and
//! image layers from registries, the YAML config, and plugins' header
//! edits; and a differential one, what plugins see of a request against
//! what is sent upstream.
//!
//! Each module has an input type that bolero generates (mostly-valid
//! structure, so random inputs get past the first syntax check, plus raw
//! bytes and mutations so they do not only) and a `check` that runs the
//! production functions on it and asserts their properties. The targets
//! themselves are the `#[test]`s in tests/fuzz.rs: `cargo test` runs each
//! for a second on random inputs; `cargo xtask fuzz` runs them long,
//! coverage-guided where it can.

pub mod content;
pub mod headers;
pub mod json;
pub mod oci;
pub mod sse;
pub mod yaml;

/// `items[index % len]`: a choice from a fixed pool, by a generated index.
fn pick<T: Copy>(items: &[T], index: u8) -> T {
    items[usize::from(index) % items.len()]
}
