//! Reading resources from YAML text, as `kubectl apply -f` would.

use serde::Deserialize;

use crate::{AIModelRoute, API_VERSION, GatewayPlugin, MCPRoute};

/// One resource from a YAML stream.
#[derive(Clone, Debug)]
pub enum Document {
    Plugin(GatewayPlugin),
    Route(AIModelRoute),
    McpRoute(MCPRoute),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("document {index}: {message}")]
pub struct DocumentError {
    /// Position in the stream, from 1.
    pub index: usize,
    pub message: String,
}

/// Every document in a (multi-document) YAML stream. Empty documents are
/// skipped; each bad one is an error of its own, so the caller can name it.
pub fn parse_documents(text: &str) -> Vec<Result<Document, DocumentError>> {
    let mut out = Vec::new();
    for (i, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let err = |message: String| DocumentError { index, message };
        let value = match serde_json::Value::deserialize(de) {
            Ok(serde_json::Value::Null) => continue,
            Ok(value) => value,
            Err(e) => {
                out.push(Err(err(e.to_string())));
                // The YAML stream itself is broken: nothing after this point can be trusted.
                break;
            }
        };
        out.push(parse_value(value).map_err(err));
    }
    out
}

fn parse_value(value: serde_json::Value) -> Result<Document, String> {
    let api_version = value.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default();
    let kind = value.get("kind").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    if api_version != API_VERSION {
        return Err(format!("apiVersion must be {API_VERSION}, got `{api_version}`"));
    }
    let named = |name: Option<&String>| match name {
        Some(n) if !n.is_empty() => Ok(()),
        _ => Err(format!("{kind} has no metadata.name")),
    };
    match kind.as_str() {
        "GatewayPlugin" => {
            let plugin: GatewayPlugin = serde_json::from_value(value).map_err(|e| format!("GatewayPlugin: {e}"))?;
            named(plugin.metadata.name.as_ref())?;
            Ok(Document::Plugin(plugin))
        }
        "AIModelRoute" => {
            let route: AIModelRoute = serde_json::from_value(value).map_err(|e| format!("AIModelRoute: {e}"))?;
            named(route.metadata.name.as_ref())?;
            Ok(Document::Route(route))
        }
        "MCPRoute" => {
            let route: MCPRoute = serde_json::from_value(value).map_err(|e| format!("MCPRoute: {e}"))?;
            named(route.metadata.name.as_ref())?;
            Ok(Document::McpRoute(route))
        }
        other => Err(format!("unknown kind `{other}` (expected GatewayPlugin, AIModelRoute or MCPRoute)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const BOTH: &str = r#"
apiVersion: sluice.dev/v1alpha1
kind: GatewayPlugin
metadata: {name: add-header}
spec:
  source: {file: plugins/add-header.wasm}
  config: {header: x-team, value: search}
  failurePolicy: Open
  timeoutMs: 20
---
apiVersion: sluice.dev/v1alpha1
kind: AIModelRoute
metadata: {name: chat, namespace: team}
spec:
  models: [gpt-4o-mini]
  backends: [{url: "http://127.0.0.1:9000/v1/", model: llama3}]
  plugins: [{name: add-header}]
"#;

    #[test]
    fn reads_both_kinds_into_decls() {
        let docs: Vec<_> = parse_documents(BOTH).into_iter().map(Result::unwrap).collect();
        let [Document::Plugin(plugin), Document::Route(route)] = docs.as_slice() else { panic!("{docs:?}") };
        let plugin = plugin.decl(Path::new("/etc/sluice")).unwrap();
        assert_eq!(plugin.key.to_string(), "default/add-header");
        assert_eq!(plugin.source, sluice_core::PluginSource::File("/etc/sluice/plugins/add-header.wasm".into()));
        assert_eq!(plugin.failure_policy, sluice_core::FailurePolicy::Open);
        assert_eq!(plugin.timeout.as_millis(), 20);
        assert_eq!(plugin.config["header"], "x-team");
        let route = route.decl(Path::new("/etc/sluice")).unwrap();
        assert_eq!(route.plugins[0].to_string(), "team/add-header");
        assert_eq!(route.backends[0].url, "http://127.0.0.1:9000/v1");
        assert_eq!(route.backends[0].model.as_deref(), Some("llama3"));
    }

    #[test]
    fn a_typo_in_a_field_is_an_error_not_a_silent_default() {
        let text = BOTH.replace("failurePolicy", "failurPolicy");
        let docs = parse_documents(&text);
        let err = docs[0].as_ref().unwrap_err();
        assert_eq!(err.index, 1);
        assert!(err.message.contains("failurPolicy"), "{}", err.message);
        assert!(docs[1].is_ok());
    }

    #[test]
    fn wrong_api_version_and_kind_are_named() {
        let docs = parse_documents("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n");
        assert!(docs[0].as_ref().unwrap_err().message.contains("apiVersion"));
        let docs = parse_documents("apiVersion: sluice.dev/v1alpha1\nkind: Pod\nmetadata: {name: x}\n");
        assert!(docs[0].as_ref().unwrap_err().message.contains("unknown kind `Pod`"));
    }

    #[test]
    fn broken_yaml_is_an_error() {
        let docs = parse_documents("apiVersion: [unclosed\n");
        assert!(docs[0].is_err());
    }

    #[test]
    fn bad_sha256_pin_is_refused() {
        let text = BOTH.replace("failurePolicy: Open", "sha256: ABC");
        let Ok(Document::Plugin(plugin)) = &parse_documents(&text)[0] else { panic!() };
        assert!(plugin.decl(Path::new("/")).unwrap_err().contains("sha256"));
    }
}
