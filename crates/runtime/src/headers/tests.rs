use super::*;

/// The table gives what parsing gives, for every name and in any order:
/// names that share a slot, names that differ only in case, invalid
/// and over-long ones, each asked for again after the others.
#[test]
fn remembered_names_are_the_parsed_names() {
    let mut names: Vec<String> = (0..300).map(|i| format!("x-header-{i}")).collect();
    names.extend(
        ["X-Team", "x-team", "authorization", "Authorization", "content-type", "x-sluice-consumer"].map(String::from),
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
