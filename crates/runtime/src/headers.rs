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
mod tests;
