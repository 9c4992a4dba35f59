//! The rules of MCP routes' names (docs/mcp.md): paths, server names, and
//! the globs that allow and deny tools. The declaration itself is
//! [`crate::config::McpRouteDecl`].

/// What separates a server's name from its tool's (or prompt's) name in
/// the merged listing: `github__create_issue`.
pub const NAME_SEPARATOR: &str = "__";

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
        use crate::config::{McpRouteDecl, ResourceKey};
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
