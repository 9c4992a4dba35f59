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

pub fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.contains(&name)
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
    fn invalid_names_and_values_are_refused() {
        let mut headers = HeaderMap::new();
        assert!(apply_edits(&mut headers, &[("bad name".into(), "v".into())], &[]).is_err());
        assert!(apply_edits(&mut headers, &[("x-ok".into(), "line\nbreak".into())], &[]).is_err());
    }
}
