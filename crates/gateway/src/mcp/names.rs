//! How several servers appear as one: each server's tools and prompts are
//! named `<server>__<name>`, its resources `<server>+<uri>` (a server name
//! is a DNS label, so `weather+info://about` is still a URI, its scheme
//! `weather+info`), and requests a server makes of the client carry ids
//! tagged with the server, so the client's answer finds its way back.

use serde_json::{Map, Value};
use sluice_core::mcp::NAME_SEPARATOR;

/// What a listing method lists, and the member naming each item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    Tools,
    Prompts,
    Resources,
    ResourceTemplates,
}

impl Listing {
    pub fn of(method: &str) -> Option<Listing> {
        Some(match method {
            "tools/list" => Listing::Tools,
            "prompts/list" => Listing::Prompts,
            "resources/list" => Listing::Resources,
            "resources/templates/list" => Listing::ResourceTemplates,
            _ => return None,
        })
    }

    /// The result's member holding the items.
    pub fn member(self) -> &'static str {
        match self {
            Listing::Tools => "tools",
            Listing::Prompts => "prompts",
            Listing::Resources => "resources",
            Listing::ResourceTemplates => "resourceTemplates",
        }
    }
}

pub fn prefixed(server: &str, name: &str) -> String {
    format!("{server}{NAME_SEPARATOR}{name}")
}

/// `(server, name)` of a prefixed name; a server name holds no `__`, so
/// the first one separates.
pub fn split_name(prefixed: &str) -> Option<(&str, &str)> {
    prefixed.split_once(NAME_SEPARATOR).filter(|(server, name)| !server.is_empty() && !name.is_empty())
}

pub fn prefixed_uri(server: &str, uri: &str) -> String {
    format!("{server}+{uri}")
}

pub fn split_uri(prefixed: &str) -> Option<(&str, &str)> {
    prefixed.split_once('+').filter(|(server, uri)| !server.is_empty() && !uri.is_empty())
}

/// Renames one listed item as the merged listing shows it.
pub fn rename_item(listing: Listing, server: &str, item: &mut Value) {
    let Some(item) = item.as_object_mut() else { return };
    if let Some(Value::String(name)) = item.get_mut("name") {
        *name = prefixed(server, name);
    }
    let uri_member = match listing {
        Listing::Resources => "uri",
        Listing::ResourceTemplates => "uriTemplate",
        Listing::Tools | Listing::Prompts => return,
    };
    if let Some(Value::String(uri)) = item.get_mut(uri_member) {
        *uri = prefixed_uri(server, uri);
    }
}

/// The `uri` members of a result's `contents` (resources/read) or of a
/// `notifications/resources/updated`, as the client knows them.
pub fn rename_uris(server: &str, value: &mut Value) {
    if let Some(Value::String(uri)) = value.get_mut("uri") {
        *uri = prefixed_uri(server, uri);
    }
    if let Some(Value::Array(contents)) = value.get_mut("contents") {
        for content in contents {
            rename_uris(server, content);
        }
    }
}

/// The prefix on the id of a request a server sends the client.
const TAG: &str = "sluice~";

/// The id the client sees on a request from `server`: the original id as
/// JSON, behind the server's name.
pub fn tag_id(server: &str, id: &Value) -> Value {
    Value::String(format!("{TAG}{server}~{id}"))
}

/// The server and original id of an id [`tag_id`] made.
pub fn untag_id(id: &Value) -> Option<(&str, Value)> {
    let (server, original) = id.as_str()?.strip_prefix(TAG)?.split_once('~')?;
    let original: Value = serde_json::from_str(original).ok()?;
    matches!(original, Value::String(_) | Value::Number(_)).then_some((server, original))
}

/// Merges the servers' `initialize` capabilities: a capability is offered
/// if any server offers it, and its flags (`listChanged`, `subscribe`) if
/// any server sets them. What a gateway cannot carry across servers as one
/// (tasks, experimental ones) is left out.
pub fn merge_capabilities<'a>(each: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut merged = Map::new();
    for capabilities in each {
        let Some(capabilities) = capabilities.as_object() else { continue };
        for name in ["tools", "prompts", "resources", "logging", "completions"] {
            let Some(offered) = capabilities.get(name).and_then(Value::as_object) else { continue };
            let entry = merged.entry(name).or_insert_with(|| Value::Object(Map::new()));
            let Some(entry) = entry.as_object_mut() else { continue };
            for flag in ["listChanged", "subscribe"] {
                if offered.get(flag) == Some(&Value::Bool(true)) {
                    entry.insert(flag.into(), Value::Bool(true));
                }
            }
        }
    }
    Value::Object(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_and_uris_split_where_they_were_joined() {
        assert_eq!(split_name(&prefixed("weather", "get__forecast")), Some(("weather", "get__forecast")));
        assert_eq!(split_name("no-prefix"), None);
        assert_eq!(split_name("__x"), None);
        assert_eq!(split_name("x__"), None);
        assert_eq!(split_uri(&prefixed_uri("files", "file:///a+b")), Some(("files", "file:///a+b")));
        assert_eq!(split_uri("plain://x"), None);
    }

    #[test]
    fn listed_items_are_renamed() {
        let mut tool = json!({"name": "get", "inputSchema": {}});
        rename_item(Listing::Tools, "w", &mut tool);
        assert_eq!(tool["name"], "w__get");
        let mut resource = json!({"name": "about", "uri": "info://about"});
        rename_item(Listing::Resources, "w", &mut resource);
        assert_eq!(resource, json!({"name": "w__about", "uri": "w+info://about"}));
        let mut template = json!({"name": "item", "uriTemplate": "info://item/{id}"});
        rename_item(Listing::ResourceTemplates, "w", &mut template);
        assert_eq!(template["uriTemplate"], "w+info://item/{id}");
        let mut read = json!({"contents": [{"uri": "info://about", "text": "x"}]});
        rename_uris("w", &mut read);
        assert_eq!(read["contents"][0]["uri"], "w+info://about");
    }

    #[test]
    fn tagged_ids_come_back_to_their_server() {
        for id in [json!(7), json!("abc~def"), json!(-1)] {
            let tagged = tag_id("files", &id);
            assert_eq!(untag_id(&tagged), Some(("files", id)));
        }
        assert_eq!(untag_id(&json!(7)), None);
        assert_eq!(untag_id(&json!("sluice~files~{\"a\":1}")), None, "ids are strings or numbers");
        assert_eq!(untag_id(&json!("other")), None);
    }

    #[test]
    fn capabilities_merge_as_a_union() {
        let a = json!({"tools": {"listChanged": true}, "experimental": {"x": {}}});
        let b = json!({"tools": {}, "resources": {"subscribe": true}, "tasks": {}});
        assert_eq!(
            merge_capabilities([&a, &b]),
            json!({"tools": {"listChanged": true}, "resources": {"subscribe": true}})
        );
    }
}
