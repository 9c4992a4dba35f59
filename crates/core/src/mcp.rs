//! An MCP route: Model Context Protocol servers behind one path of the
//! gateway, their tools, prompts and resources merged under each server's
//! name, with a plugin chain on every call (docs/mcp.md).

use std::time::Duration;

use crate::config::{ApiKeySource, ResourceKey};
use crate::routing::BackendTls;

/// What separates a server's name from its tool's (or prompt's) name in
/// the merged listing: `github__create_issue`.
pub const NAME_SEPARATOR: &str = "__";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpRouteDecl {
    pub key: ResourceKey,
    /// Where the route is served on the data plane listener: an absolute
    /// path, e.g. `/mcp/tools`.
    pub path: String,
    /// The upstream MCP servers, at least one, names unique.
    pub servers: Vec<McpServerDecl>,
    /// Globs over the prefixed names (`github__*`): a tool is listed and
    /// callable if it matches some `allow` (or `allow` is empty) and no
    /// `deny`.
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// The plugin chain, in order; plugins live in the route's namespace.
    pub plugins: Vec<ResourceKey>,
    pub limits: McpLimits,
    /// Published as Protected Resource Metadata (RFC 9728), and named in
    /// the `WWW-Authenticate` of a 401, when present.
    pub authorization: Option<McpAuthorization>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpServerDecl {
    /// A DNS label: it prefixes the server's tools, prompts and resources.
    pub name: String,
    /// The server's Streamable HTTP endpoint, e.g. `http://10.0.0.7:8000/mcp`.
    pub url: String,
    /// Sent as `Authorization: Bearer <key>`.
    pub api_key: Option<ApiKeySource>,
    /// How long a request may wait for the server's response head.
    pub timeout: Duration,
    pub tls: Option<BackendTls>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpLimits {
    /// The largest JSON-RPC message accepted from a client or a server
    /// (one SSE event's data, or one JSON body).
    pub max_message_bytes: usize,
    /// The most tools (prompts, resources) one merged listing holds; past
    /// it, a server's listing is cut and the cut is logged.
    pub max_tools: usize,
    /// Server-to-client streams one session may hold open at once (GET
    /// streams and POST responses streamed as SSE).
    pub max_streams_per_session: usize,
    /// A stream on which a server sends nothing for this long is ended.
    pub stream_idle_timeout: Duration,
    /// A session id is honoured this long after it was minted.
    pub session_ttl: Duration,
}

impl Default for McpLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: 4 * 1024 * 1024,
            max_tools: 1024,
            max_streams_per_session: 8,
            stream_idle_timeout: Duration::from_secs(300),
            session_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct McpAuthorization {
    /// The authorization servers' issuer URLs.
    pub authorization_servers: Vec<String>,
    /// The scopes a client may ask for.
    pub scopes: Vec<String>,
    /// The resource identifier clients name in their token requests; the
    /// route's URL on the listener (scheme and host from the request) when
    /// absent.
    pub resource: Option<String>,
}

impl McpRouteDecl {
    pub const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_secs(60);

    /// A route at `path` with every default and no servers.
    pub fn new(key: ResourceKey, path: impl Into<String>) -> Self {
        Self {
            key,
            path: path.into(),
            servers: vec![],
            allow: vec![],
            deny: vec![],
            plugins: vec![],
            limits: McpLimits::default(),
            authorization: None,
        }
    }

    /// Whether the prefixed tool `name` may be listed and called.
    pub fn allows(&self, name: &str) -> bool {
        (self.allow.is_empty() || self.allow.iter().any(|glob| glob_match(glob, name)))
            && !self.deny.iter().any(|glob| glob_match(glob, name))
    }

    /// What is wrong with the declaration, if anything: the checks every
    /// config source makes.
    pub fn check(&self) -> Result<(), String> {
        check_path(&self.path)?;
        if self.servers.is_empty() {
            return Err("an MCP route needs at least one server".into());
        }
        let mut names = std::collections::HashSet::new();
        for server in &self.servers {
            check_server_name(&server.name)?;
            if !names.insert(server.name.as_str()) {
                return Err(format!("server name `{}` is used twice", server.name));
            }
            if !(server.url.starts_with("http://") || server.url.starts_with("https://")) {
                return Err(format!("server `{}`: url must be http:// or https://", server.name));
            }
        }
        Ok(())
    }
}

/// A route's path: absolute, plain (no query, no `..`, no `//`), and not
/// one the gateway serves itself.
pub fn check_path(path: &str) -> Result<(), String> {
    let plain = path.len() > 1
        && path.len() <= 256
        && path.starts_with('/')
        && !path.ends_with('/')
        && path.split('/').skip(1).all(|segment| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
        });
    if !plain {
        return Err(format!(
            "path `{path}` must be absolute, without a trailing slash, of segments of letters, digits and `-._~`"
        ));
    }
    if path == "/v1" || path.starts_with("/v1/") || path.starts_with("/.well-known/") {
        return Err(format!("path `{path}` is the gateway's own (under /v1 or /.well-known)"));
    }
    Ok(())
}

/// A server's name: a DNS label (lower case letters, digits and `-`, 1 to
/// 63 long, starting with a letter), so that `<name>__<tool>` splits at
/// the first `__` and nowhere else.
pub fn check_server_name(name: &str) -> Result<(), String> {
    let label = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if label { Ok(()) } else { Err(format!("server name `{name}` must be a DNS label (a-z, 0-9, `-`)")) }
}

/// `*` matches any run of characters (none included), every other
/// character itself. Hand-written: one wildcard is all tool globs need,
/// and a glob crate would bring path semantics (`/`, `**`) they must not
/// have. Linear in `name` for one `*`, at worst quadratic for several.
pub fn glob_match(glob: &str, name: &str) -> bool {
    let mut parts = glob.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_written() {
        for (glob, name, expected) in [
            ("*", "anything__at_all", true),
            ("*", "", true),
            ("github__*", "github__create_issue", true),
            ("github__*", "gitlab__create_issue", false),
            ("*__delete_*", "github__delete_repo", true),
            ("*__delete_*", "github__create_repo", false),
            ("weather__get", "weather__get", true),
            ("weather__get", "weather__get_forecast", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(glob_match(glob, name), expected, "{glob} ~ {name}");
        }
    }

    #[test]
    fn allow_then_deny() {
        let mut route = McpRouteDecl::new(ResourceKey::new("ns", "r"), "/mcp");
        assert!(route.allows("any__tool"), "no lists: everything");
        route.allow = vec!["weather__*".into()];
        route.deny = vec!["weather__delete*".into()];
        assert!(route.allows("weather__get"));
        assert!(!route.allows("weather__delete_city"));
        assert!(!route.allows("files__read"));
    }

    #[test]
    fn paths_and_names_are_checked() {
        for good in ["/mcp", "/mcp/github", "/a-b/c.d/e_f~"] {
            assert!(check_path(good).is_ok(), "{good}");
        }
        for bad in ["", "/", "mcp", "/mcp/", "/a//b", "/a/../b", "/a?x", "/v1/mcp", "/v1", "/.well-known/x", "/ä"] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        for good in ["github", "a", "files-2"] {
            assert!(check_server_name(good).is_ok(), "{good}");
        }
        for bad in ["", "GitHub", "2fa", "a_b", "a__b", "x-", &"a".repeat(64)] {
            assert!(check_server_name(bad).is_err(), "{bad}");
        }
    }
}
