//! Where a message goes: routed to one server by the prefix of the name
//! it carries, or merged from every server (listings), in a session or at
//! 2026-07-28 ([`Via`]).

use std::collections::BTreeMap;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::jsonrpc::{INVALID_PARAMS, Message, REFUSED, rpc_result};
use super::names::{self, Listing};
use super::session::Record;
use super::stream;
use super::upstream::{self, Failure};
use crate::body::Body;
use crate::snapshot::{McpRoute, McpServer};

/// The server a request goes to, or the JSON-RPC error refusing it.
pub type Routed<'a> = Result<&'a McpServer, (i64, String)>;

/// The server a request is for, and how its answer is renamed: by the
/// prefix of its tool or prompt name, or of its resource URI, which is
/// taken off for the server. `None` for a method not routed by name.
pub fn target<'a>(route: &'a McpRoute, message: &mut Message, method: &str) -> Option<(Routed<'a>, stream::Rename)> {
    let (member, rename) = match method {
        "tools/call" | "prompts/get" => ("name", stream::Rename::None),
        "resources/read" => ("uri", stream::Rename::Uris),
        "resources/subscribe" | "resources/unsubscribe" => ("uri", stream::Rename::None),
        "completion/complete" => return Some((complete_target(route, message), stream::Rename::None)),
        _ => return None,
    };
    let Some(params) = message.params_mut() else {
        return Some((Err((INVALID_PARAMS, format!("{method} needs params"))), rename));
    };
    let Some(Value::String(name)) = params.get(member) else {
        return Some((Err((INVALID_PARAMS, format!("{method} needs a string `{member}`"))), rename));
    };
    let split = if member == "uri" { names::split_uri(name) } else { names::split_name(name) };
    let unknown =
        || (INVALID_PARAMS, format!("unknown {}: `{name}`", if member == "uri" { "resource" } else { "name" }));
    let Some((server, unprefixed)) = split else { return Some((Err(unknown()), rename)) };
    let Some(found) = route.server(server) else { return Some((Err(unknown()), rename)) };
    if method == "tools/call" && !route.decl.allows(name) {
        let why = format!("tool `{name}` is not allowed on this route");
        return Some((Err((REFUSED, why)), rename));
    }
    let unprefixed = unprefixed.to_string();
    params.insert(member.into(), Value::String(unprefixed));
    Some((Ok(found), rename))
}

/// `completion/complete` names a prompt or a resource in its `ref`.
fn complete_target<'a>(route: &'a McpRoute, message: &mut Message) -> Result<&'a McpServer, (i64, String)> {
    let bad = || (INVALID_PARAMS, "completion/complete needs a `ref` naming a prompt or a resource".to_string());
    let reference =
        message.params_mut().and_then(|p| p.get_mut("ref")).and_then(Value::as_object_mut).ok_or_else(bad)?;
    type Split = fn(&str) -> Option<(&str, &str)>;
    let (member, split): (&str, Split) = match reference.get("type").and_then(Value::as_str) {
        Some("ref/prompt") => ("name", names::split_name),
        Some("ref/resource") => ("uri", names::split_uri),
        _ => return Err(bad()),
    };
    let name = reference.get(member).and_then(Value::as_str).ok_or_else(bad)?.to_string();
    let (server, unprefixed) = split(&name).ok_or_else(bad)?;
    let server = route.server(server).ok_or_else(bad)?;
    reference.insert(member.into(), Value::String(unprefixed.into()));
    Ok(server)
}

/// A listing merged from every server of the session: each server's pages
/// read through (the client gets one page), items renamed, tools filtered
/// by the route's lists, and at most `max_tools` items in all.
/// How requests reach a server: in the client's session (the handshake
/// era), or each standing alone with the client's `_meta` (2026-07-28).
#[derive(Clone, Copy)]
pub enum Via<'a> {
    Session { record: &'a Record, passed_on: &'a HeaderMap },
    Modern { meta: &'a Value, headers: &'a HeaderMap },
}

pub async fn list(
    route: &McpRoute,
    via: Via<'_>,
    message: &Message,
    listing: Listing,
    limit: usize,
) -> http::Response<Body> {
    let id = message.id.clone().unwrap_or(Value::Null);
    let max = route.decl.limits.max_tools;
    let method = message.method.clone().unwrap_or_default();
    let listed = route.servers.iter().map(|server| {
        let method = method.clone();
        async move { (server, list_one(server, via, &method, listing, limit, max).await) }
    });
    let mut items = Vec::new();
    for (server, listed) in futures_util::future::join_all(listed).await {
        match listed {
            Ok(listed) => {
                for mut item in listed {
                    names::rename_item(listing, &server.name, &mut item);
                    let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
                    if listing == Listing::Tools && !route.decl.allows(name) {
                        continue;
                    }
                    if items.len() == max {
                        tracing::warn!(route = %route.label, server = %server.name, max, "an MCP listing was cut at its limit");
                        break;
                    }
                    items.push(item);
                }
            }
            // One server down leaves its items out, not the listing.
            Err(error) => tracing::warn!(route = %route.label, %error, "an MCP server's listing is left out"),
        }
    }
    let mut result = Map::new();
    result.insert(listing.member().into(), Value::Array(items));
    if let Via::Modern { .. } = via {
        // 2026-07-28's result fields. A listing merged from several servers
        // is nobody's to cache: private, for no time.
        result.insert("cacheScope".into(), json!("private"));
        result.insert("ttlMs".into(), json!(0));
        result.insert("resultType".into(), json!("complete"));
    }
    rpc_result(id, Value::Object(result))
}

/// Every page of one server's listing: at most `max` well-formed items
/// and 64 pages, all within the server's timeout (a server paging slowly,
/// or trickling keep-alives, is cut there, not per page; what it listed by
/// then is kept). Items are read as raw text and parsed only if kept, so a
/// huge page costs its bytes, not a tree of them; an item that is not an
/// object naming itself is left out.
async fn list_one(
    server: &McpServer,
    via: Via<'_>,
    method: &str,
    listing: Listing,
    limit: usize,
    max: usize,
) -> Result<Vec<Value>, Failure> {
    let mut items = Vec::new();
    let pages = list_pages(server, via, method, listing, limit, max, &mut items);
    let timed_out = || Failure::Timeout { server: server.name.clone(), after: server.timeout };
    match tokio::time::timeout(server.timeout, pages).await {
        Ok(listed) => listed.map(|()| items),
        Err(_) if items.is_empty() => Err(timed_out()),
        Err(_) => {
            tracing::warn!(server = %server.name, listed = items.len(), "{}; its listing is cut there", timed_out());
            Ok(items)
        }
    }
}

async fn list_pages(
    server: &McpServer,
    via: Via<'_>,
    method: &str,
    listing: Listing,
    limit: usize,
    max: usize,
    items: &mut Vec<Value>,
) -> Result<(), Failure> {
    let mut cursor: Option<Value> = None;
    let mut left_out = 0usize;
    for page in 0..64 {
        let id = json!(format!("sluice-list-{page}"));
        let response = match via {
            Via::Session { record, passed_on } => {
                let params = match &cursor {
                    Some(cursor) => json!({"cursor": cursor}),
                    None => json!({}),
                };
                let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
                upstream::post_in_session(server, record, Bytes::from(request.to_string()), passed_on, limit).await?.0
            }
            Via::Modern { meta, headers } => {
                let request = list_request(&id, method, meta, cursor.as_ref());
                upstream::post(server, None, request, headers).await?
            }
        };
        let text = upstream::answer(&server.name, response, &id, limit, server.timeout).await?;
        let malformed = |why: String| Failure::Malformed { server: server.name.clone(), why };
        let answer: upstream::Envelope =
            serde_json::from_str(&text).map_err(|e| malformed(format!("its answer is not JSON-RPC: {e}")))?;
        if let Some(error) = answer.error {
            let error: String = error.get().chars().take(200).collect();
            return Err(malformed(format!("it refused {method}: {error}")));
        }
        let result = answer.result.ok_or_else(|| malformed("no result".into()))?;
        // Each member left as raw text.
        let page: BTreeMap<String, &RawValue> = serde_json::from_str(result.get())
            .map_err(|e| malformed(format!("its {method} result is not a listing: {e}")))?;
        let member = page.get(listing.member()).copied();
        let raw: Vec<&RawValue> = member
            .map(|m| serde_json::from_str(m.get()))
            .transpose()
            .ok()
            .flatten()
            .ok_or_else(|| malformed(format!("its {method} result has no `{}` list", listing.member())))?;
        for item in raw {
            if items.len() >= max {
                break;
            }
            match serde_json::from_str::<Value>(item.get()) {
                Ok(item) if well_formed(listing, &item) => items.push(item),
                _ => left_out += 1,
            }
        }
        cursor =
            page.get("nextCursor").and_then(|c| serde_json::from_str::<Value>(c.get()).ok()).filter(Value::is_string);
        if cursor.is_none() || items.len() >= max {
            break;
        }
    }
    if left_out > 0 {
        tracing::warn!(server = %server.name, left_out, "an MCP server listed items that are not well formed; left out");
    }
    Ok(())
}

/// An item a client can use: an object with a string `name`, and for a
/// resource its `uri` (a template its `uriTemplate`).
fn well_formed(listing: Listing, item: &Value) -> bool {
    let text = |member: &str| item.get(member).is_some_and(Value::is_string);
    text("name")
        && match listing {
            Listing::Resources => text("uri"),
            Listing::ResourceTemplates => text("uriTemplate"),
            Listing::Tools | Listing::Prompts => true,
        }
}

/// A listing's request to one server at this revision.
pub fn list_request(id: &Value, method: &str, meta: &Value, cursor: Option<&Value>) -> Bytes {
    let mut params = json!({"_meta": meta});
    if let Some(cursor) = cursor {
        params["cursor"] = cursor.clone();
    }
    Bytes::from(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string())
}
