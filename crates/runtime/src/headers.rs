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

/// Headers a plugin may not set or remove: they frame the message or
/// manage the connection, which is the gateway's business (a plugin that
/// set `transfer-encoding` or `content-length` could desynchronise the
/// upstream connection). Edits to them are ignored.
const NOT_EDITABLE: &[&str] = &["content-length", "host"];

/// The most headers, and header bytes (names and values), a plugin's edits
/// may leave on a request or response; edits that stay within them, or
/// shrink what the client sent, are applied. Without a bound a plugin could
/// grow the host's copy without limit, or past what a `HeaderMap` holds
/// (32 768 entries, after which it panics).
pub const MAX_HEADERS: usize = 512;
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

fn editable(name: &HeaderName) -> bool {
    !HOP_BY_HOP.contains(&name.as_str()) && !NOT_EDITABLE.contains(&name.as_str())
}

/// Whether a plugin's set of `name` is made; one that is not is noted.
fn settable(name: &HeaderName) -> bool {
    let editable = editable(name);
    if !editable {
        tracing::debug!(header = %name, "a plugin's edit of a framing or hop-by-hop header was ignored");
    }
    editable
}

/// A header name as a plugin gave it; an invalid one is the plugin's error.
fn plugin_name(name: &str) -> Result<HeaderName, String> {
    parse_name(name).ok_or_else(|| format!("invalid header name `{name}`"))
}

/// Slots in each thread's table of parsed header names.
const NAME_SLOTS: usize = 64;

/// The longest name the table keeps.
const MAX_REMEMBERED_NAME: usize = 64;

type Names = [Option<(Box<str>, HeaderName)>; NAME_SLOTS];

thread_local! {
    /// Header names as plugins wrote them, parsed: plugins name the same
    /// few headers on every request, and parsing one that is not a
    /// standard header allocates it anew. A name here is the one
    /// `HeaderName::from_bytes` made of exactly that text; each slot holds
    /// the latest of the names that hash to it.
    static NAMES: std::cell::RefCell<Names> = const { std::cell::RefCell::new([const { None }; NAME_SLOTS]) };
}

/// `HeaderName::from_bytes(name)`, remembered per thread.
pub(crate) fn parse_name(name: &str) -> Option<HeaderName> {
    let parse = || HeaderName::from_bytes(name.as_bytes()).ok();
    if name.len() > MAX_REMEMBERED_NAME {
        return parse();
    }
    // FNV-1a: names are short.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let slot = (hash >> 32) as usize % NAME_SLOTS;
    let found = NAMES.try_with(|names| {
        let mut names = names.try_borrow_mut().ok()?;
        if let Some((text, parsed)) = &names[slot]
            && **text == *name
        {
            return Some(Some(parsed.clone()));
        }
        let parsed = parse();
        if let Some(parsed) = &parsed {
            names[slot] = Some((name.into(), parsed.clone()));
        }
        Some(parsed)
    });
    // The table is out of reach only as the thread ends.
    found.ok().flatten().unwrap_or_else(parse)
}

/// Removes hop-by-hop headers, including any that `Connection` names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Every request and response passes here, most with `Connection:
    // keep-alive` or `close`: the names it lists are looked at one by one
    // only if one that is not hop-by-hop anyway is a header here. They are
    // matched where they stand, not copied and lower-cased first.
    let tokens = || {
        headers
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
    };
    let hop_by_hop = |token: &str| HOP_BY_HOP.iter().any(|name| token.eq_ignore_ascii_case(name));
    let listed = tokens().any(|token| !hop_by_hop(token) && headers.contains_key(token));
    let named = |name: &str| tokens().any(|token| token.eq_ignore_ascii_case(name));
    let drop: Vec<HeaderName> = headers
        .keys()
        .filter(|name| HOP_BY_HOP.contains(&name.as_str()) || (listed && named(name.as_str())))
        .cloned()
        .collect();
    for name in drop {
        headers.remove(name);
    }
}

/// Headers as (lower-case name, value) pairs, as plugins see them. The WIT
/// world carries strings: a value must be UTF-8 to be seen, and one that is
/// not must not travel on unseen (see [`not_utf8`]).
pub fn to_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            Some((name.as_str().to_string(), std::str::from_utf8(value.as_bytes()).ok()?.to_string()))
        })
        .collect()
}

/// The first header whose value plugins could not see, if any.
pub fn not_utf8(headers: &HeaderMap) -> Option<&HeaderName> {
    headers.iter().find(|(_, value)| !is_utf8(value.as_bytes())).map(|(name, _)| name)
}

/// Every request's and response's header values pass here: most are
/// ASCII, which costs less to check for than UTF-8 on short values.
fn is_utf8(bytes: &[u8]) -> bool {
    bytes.is_ascii() || std::str::from_utf8(bytes).is_ok()
}

/// Drops every value plugins could not see.
pub fn drop_not_utf8(headers: &mut HeaderMap) {
    while let Some(name) = not_utf8(headers).cloned() {
        let kept: Vec<HeaderValue> = headers.get_all(&name).iter().filter(|v| is_utf8(v.as_bytes())).cloned().collect();
        headers.remove(&name);
        for value in kept {
            headers.append(&name, value);
        }
    }
}

/// Applies a plugin's edits: removals first, then each set replaces all
/// values of its name. A name or value that is not valid HTTP is an error
/// the caller blames on the plugin; edits to hop-by-hop and framing headers
/// are ignored.
pub fn apply_edits(headers: &mut HeaderMap, set: &[(String, String)], remove: &[String]) -> Result<(), String> {
    // Everything is checked before anything changes: a refused edit must
    // leave the headers as they were, since under `failurePolicy: Open` the
    // exchange goes on without the plugin (found by the plugin_edits fuzz
    // target: removals applied, then a bad set refused).
    let removed = remove.iter().map(|name| plugin_name(name)).collect::<Result<Vec<_>, _>>()?;
    // A list, not a map: most edits set one header, and a map's allocation
    // and hashing cost more than the edit (callgrind, the bench chain).
    let mut fresh: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(set.len().min(MAX_HEADERS));
    for (name, value) in set {
        if fresh.len() >= MAX_HEADERS {
            return Err(format!("it set more than {MAX_HEADERS} headers"));
        }
        let name = plugin_name(name)?;
        let value = HeaderValue::from_str(value).map_err(|_| format!("invalid value for header `{name}`"))?;
        if !settable(&name) {
            continue;
        }
        // Several values of one name in one edit are all kept.
        fresh.push((name, value));
    }
    let removed: Vec<HeaderName> = removed.into_iter().filter(editable).collect();
    check_size(headers, &removed, &fresh)?;
    // Every removal before any append, so a name set twice keeps both.
    for name in removed.iter().chain(fresh.iter().map(|(name, _)| name)) {
        headers.remove(name);
    }
    for (name, value) in fresh {
        headers.append(name, value);
    }
    Ok(())
}

/// [`apply_edits`] with one set and nothing removed: most plugin calls make
/// one edit, and this one allocates no lists (and takes `value` as it is).
pub fn set_one(headers: &mut HeaderMap, name: &str, value: String) -> Result<(), String> {
    let name = plugin_name(name)?;
    let value = HeaderValue::from_maybe_shared(bytes::Bytes::from(value))
        .map_err(|_| format!("invalid value for header `{name}`"))?;
    if !settable(&name) {
        return Ok(());
    }
    let fresh = [(name, value)];
    check_size(headers, &[], &fresh)?;
    let [(name, value)] = fresh;
    headers.remove(&name);
    headers.append(name, value);
    Ok(())
}

/// [`apply_edits`] with one removal and nothing set. A removal cannot grow
/// the headers, so there are no bounds to check.
pub fn remove_one(headers: &mut HeaderMap, name: &str) -> Result<(), String> {
    let name = plugin_name(name)?;
    if editable(&name) {
        headers.remove(&name);
    }
    Ok(())
}

/// Refuses edits that would leave more than [`MAX_HEADERS`] headers or
/// [`MAX_HEADER_BYTES`], unless they leave less than there was.
fn check_size(headers: &HeaderMap, removed: &[HeaderName], fresh: &[(HeaderName, HeaderValue)]) -> Result<(), String> {
    let size = |name: &HeaderName, value: &HeaderValue| name.as_str().len() + value.len();
    let (count, bytes) = (headers.len(), headers.iter().map(|(n, v)| size(n, v)).sum::<usize>());
    let mut dropped = (0, 0);
    let names = || removed.iter().chain(fresh.iter().map(|(name, _)| name));
    for (i, name) in names().enumerate() {
        // Each name's values are dropped once, however often it is named.
        if names().take(i).any(|earlier| earlier == name) {
            continue;
        }
        for value in headers.get_all(name) {
            dropped = (dropped.0 + 1, dropped.1 + size(name, value));
        }
    }
    let added = (fresh.len(), fresh.iter().map(|(n, v)| size(n, v)).sum::<usize>());
    let after = (count - dropped.0 + added.0, bytes - dropped.1 + added.1);
    if after.0 > MAX_HEADERS && after.0 > count {
        return Err(format!("it would leave {} headers, more than {MAX_HEADERS}", after.0));
    }
    if after.1 > MAX_HEADER_BYTES && after.1 > bytes {
        return Err(format!("it would leave {} bytes of headers, more than {MAX_HEADER_BYTES}", after.1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table gives what parsing gives, for every name and in any order:
    /// names that share a slot, names that differ only in case, invalid
    /// and over-long ones, each asked for again after the others.
    #[test]
    fn remembered_names_are_the_parsed_names() {
        let mut names: Vec<String> = (0..300).map(|i| format!("x-header-{i}")).collect();
        names.extend(
            ["X-Team", "x-team", "authorization", "Authorization", "content-type", "x-sluice-consumer"]
                .map(String::from),
        );
        names.extend(["", "bad name", "x-é", "a:b", "\0"].map(String::from));
        names.push("x-".repeat(MAX_REMEMBERED_NAME));
        for round in 0..3 {
            for name in names.iter().rev().skip(round).chain(&names) {
                let expected = HeaderName::from_bytes(name.as_bytes()).ok();
                assert_eq!(parse_name(name), expected, "{name:?}");
            }
        }
        // While the table is in use, names are still parsed.
        NAMES.with_borrow_mut(|_| assert_eq!(parse_name("x-team"), Some(HeaderName::from_static("x-team"))));
    }

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

    /// A name set twice in one edit keeps both values and replaces the
    /// old ones, and removing it too changes nothing about that.
    #[test]
    fn a_name_set_twice_keeps_both_values() {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("old"));
        headers.append("x-b", HeaderValue::from_static("3"));
        let set = [("x-a".into(), "1".into()), ("x-b".into(), "2".into()), ("X-A".into(), "3".into())];
        apply_edits(&mut headers, &set, &["x-a".into()]).unwrap();
        assert_eq!(headers.get_all("x-a").iter().collect::<Vec<_>>(), vec!["1", "3"]);
        assert_eq!(headers.get_all("x-b").iter().collect::<Vec<_>>(), vec!["2"]);
        assert_eq!(headers.len(), 3);
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

        // Listed in a second `Connection`, after hop-by-hop names; `close`
        // is no header here.
        let mut headers = HeaderMap::new();
        headers.append("connection", HeaderValue::from_static("close"));
        headers.append("connection", HeaderValue::from_static("Keep-Alive,  x-hop ,"));
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert("x-team", HeaderValue::from_static("search"));
        headers.insert("te", HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.keys().map(|k| k.as_str()).collect::<Vec<_>>(), vec!["x-team"]);

        // Only hop-by-hop names listed: the rest stays.
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("keep-alive"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("close", HeaderValue::from_static("not listed as a header"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.keys().map(|k| k.as_str()).collect::<Vec<_>>(), vec!["close"]);
    }

    /// A plugin cannot edit framing or hop-by-hop headers (content-length,
    /// transfer-encoding, connection, upgrade, te, host): the gateway frames
    /// what it sends. Its other edits apply.
    #[test]
    fn framing_and_hop_by_hop_headers_cannot_be_edited() {
        let mut headers = HeaderMap::new();
        headers.insert("content-length", HeaderValue::from_static("10"));
        headers.insert("host", HeaderValue::from_static("api"));
        let set: Vec<(String, String)> =
            ["content-length", "transfer-encoding", "connection", "upgrade", "te", "host", "x-ok"]
                .iter()
                .map(|name| (name.to_string(), "1".to_string()))
                .collect();
        apply_edits(&mut headers, &set, &["content-length".into(), "host".into()]).unwrap();
        let mut names: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["content-length", "host", "x-ok"]);
        assert_eq!(headers["content-length"], "10");
        assert_eq!(headers["host"], "api");
    }

    /// Plugins see every UTF-8 header value, and values that are not UTF-8
    /// are found and dropped: what plugins see is what travels on.
    #[test]
    fn utf8_values_are_seen_and_others_are_found() {
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant", HeaderValue::from_bytes("bloqué".as_bytes()).unwrap());
        headers.append("x-raw", HeaderValue::from_bytes(b"ok").unwrap());
        headers.append("x-raw", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        assert!(to_pairs(&headers).contains(&("x-tenant".into(), "bloqué".into())));
        assert_eq!(not_utf8(&headers).map(|n| n.as_str()), Some("x-raw"));
        drop_not_utf8(&mut headers);
        assert_eq!(not_utf8(&headers), None);
        assert_eq!(headers.get_all("x-raw").iter().collect::<Vec<_>>(), vec!["ok"]);
    }

    /// Found by the plugin_edits fuzz target.
    #[test]
    fn a_refused_edit_changes_nothing() {
        let mut headers = HeaderMap::new();
        headers.insert("x-keep", HeaderValue::from_static("1"));
        let before = headers.clone();
        assert!(apply_edits(&mut headers, &[("".into(), "v".into())], &["x-keep".into()]).is_err());
        assert_eq!(headers, before);
    }

    #[test]
    fn invalid_names_and_values_are_refused() {
        let mut headers = HeaderMap::new();
        assert!(apply_edits(&mut headers, &[("bad name".into(), "v".into())], &[]).is_err());
        assert!(apply_edits(&mut headers, &[("x-ok".into(), "line\nbreak".into())], &[]).is_err());
    }

    /// The one-edit paths do exactly what `apply_edits` does with one edit:
    /// the same error or the same headers, in the same order.
    #[test]
    fn one_edit_paths_match_apply_edits() {
        let names = [
            "x-team",
            "X-Team",
            "x-new",
            "authorization",
            "content-type",
            "",
            "bad name",
            "x\u{e9}",
            "connection",
            "transfer-encoding",
            "content-length",
            "host",
            "keep-alive",
            "te",
        ];
        let values = ["search", "", "line\nbreak", "caf\u{e9}", " padded ", "\u{7f}"];
        let big = "v".repeat(MAX_HEADER_BYTES / 2);
        let mut starts = vec![HeaderMap::new()];
        let mut some = HeaderMap::new();
        some.append("x-team", HeaderValue::from_static("a"));
        some.append("content-type", HeaderValue::from_static("application/json"));
        some.append("x-team", HeaderValue::from_static("b"));
        some.append("authorization", HeaderValue::from_static("Bearer k"));
        for framing in ["content-length", "host", "connection", "te"] {
            some.append(framing, HeaderValue::from_static("10"));
        }
        starts.push(some);
        let mut full = HeaderMap::new();
        for i in 0..MAX_HEADERS {
            full.append(HeaderName::from_bytes(format!("x-{i}").as_bytes()).unwrap(), HeaderValue::from_static("v"));
        }
        full.append("x-team", HeaderValue::from_static("a"));
        starts.push(full);
        let mut heavy = HeaderMap::new();
        heavy.append("x-big", HeaderValue::from_str(&big).unwrap());
        heavy.append("x-team", HeaderValue::from_str(&big[..big.len() - 20]).unwrap());
        starts.push(heavy);
        let listed = |h: &HeaderMap| h.iter().map(|(n, v)| (n.clone(), v.clone())).collect::<Vec<_>>();
        let mut compared = 0;
        for start in &starts {
            for name in names {
                let (mut by_list, mut by_one) = (start.clone(), start.clone());
                let listed_result = apply_edits(&mut by_list, &[], &[name.to_string()]);
                assert_eq!(remove_one(&mut by_one, name), listed_result, "remove {name:?}");
                assert_eq!(listed(&by_one), listed(&by_list), "remove {name:?}");
                for value in values.iter().copied().chain([big.as_str()]) {
                    let (mut by_list, mut by_one) = (start.clone(), start.clone());
                    let listed_result = apply_edits(&mut by_list, &[(name.into(), value.into())], &[]);
                    assert_eq!(set_one(&mut by_one, name, value.into()), listed_result, "set {name:?}");
                    assert_eq!(listed(&by_one), listed(&by_list), "set {name:?}");
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, starts.len() * names.len() * (values.len() + 1));
    }

    #[test]
    fn edits_may_not_grow_headers_past_the_bounds_but_may_shrink_them() {
        let mut headers = HeaderMap::new();
        let many: Vec<(String, String)> = (0..MAX_HEADERS).map(|i| (format!("x-{i}"), "v".into())).collect();
        apply_edits(&mut headers, &many, &[]).unwrap();
        let error = apply_edits(&mut headers, &[("x-one-more".into(), "v".into())], &[]).unwrap_err();
        assert!(error.contains("more than 512"), "{error}");
        assert_eq!(headers.len(), MAX_HEADERS, "a refused edit changes nothing");
        // Replacing one keeps the count; removing is always allowed.
        apply_edits(&mut headers, &[("x-0".into(), "w".into())], &[]).unwrap();
        apply_edits(&mut headers, &[], &["x-1".into()]).unwrap();
        assert_eq!(headers.len(), MAX_HEADERS - 1);

        let mut headers = HeaderMap::new();
        let big = "v".repeat(MAX_HEADER_BYTES);
        assert!(apply_edits(&mut headers, &[("x-big".into(), big)], &[]).is_err());
        assert!(headers.is_empty());
    }
}
