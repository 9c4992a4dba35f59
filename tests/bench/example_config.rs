//! The config of a first-party plugin's `plugins/<name>/example.yaml`, for
//! the benches that measure a plugin as its example configures it.

use std::path::Path;

use sluice_api::Document;

/// The config of the first `GatewayPlugin` in the YAML file at `path`.
pub fn example_config(path: &Path) -> serde_json::Value {
    let yaml = std::fs::read_to_string(path).expect("the plugin's example.yaml");
    sluice_api::parse_documents(&yaml)
        .into_iter()
        .find_map(|doc| match doc {
            Ok(Document::Plugin(plugin)) => Some(plugin.spec.config.unwrap_or_default()),
            _ => None,
        })
        .expect("a GatewayPlugin in the example")
}
