//! Headers as plugins see them, and the edits they make.

use http::{HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one hop, not the message; never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes hop-by-hop headers, including any that `Connection` names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .collect();
    let drop: Vec<HeaderName> = headers
        .keys()
        .filter(|name| HOP_BY_HOP.contains(&name.as_str()) || named.iter().any(|n| n == name.as_str()))
        .cloned()
        .collect();
    for name in drop {
        headers.remove(name);
    }
}

/// Headers as (lower-case name, value) pairs. Values that are not UTF-8 are
/// left out: the WIT world carries strings.
pub fn to_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str().to_string(), value.to_str().ok()?.to_string())))
        .collect()
}

/// Applies a plugin's edits: removals first, then each set replaces all
/// values of its name. A name or value that is not valid HTTP is an error
/// the caller blames on the plugin.
pub fn apply_edits(headers: &mut HeaderMap, set: &[(String, String)], remove: &[String]) -> Result<(), String> {
    for name in remove {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("invalid header name `{name}`"))?;
        headers.remove(name);
    }
    let mut fresh = HeaderMap::new();
    for (name, value) in set {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("invalid header name `{name}`"))?;
        let value = HeaderValue::from_str(value).map_err(|_| format!("invalid value for header `{name}`"))?;
        // Several values of one name in one edit are all kept.
        fresh.append(name, value);
    }
    for name in fresh.keys() {
        headers.remove(name);
    }
    for (name, value) in fresh {
        if let Some(name) = name {
            headers.append(name, value);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replaces_every_value_and_remove_drops() {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        headers.append("x-b", HeaderValue::from_static("3"));
        apply_edits(&mut headers, &[("x-a".into(), "9".into())], &["x-b".into()]).unwrap();
        assert_eq!(headers.get_all("x-a").iter().collect::<Vec<_>>(), vec!["9"]);
        assert!(headers.get("x-b").is_none());
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_stripped() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("keep-alive, X-Trace"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-trace", HeaderValue::from_static("1"));
        headers.insert("x-team", HeaderValue::from_static("search"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.keys().map(|k| k.as_str()).collect::<Vec<_>>(), vec!["x-team"]);
    }

    #[test]
    fn invalid_names_and_values_are_refused() {
        let mut headers = HeaderMap::new();
        assert!(apply_edits(&mut headers, &[("bad name".into(), "v".into())], &[]).is_err());
        assert!(apply_edits(&mut headers, &[("x-ok".into(), "line\nbreak".into())], &[]).is_err());
    }
}
