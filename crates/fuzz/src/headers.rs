//! Plugins' header edits: the headers plugins see (`to_pairs`), the
//! hop-by-hop headers the gateway strips, and the edits it applies, which
//! must never touch a framing or hop-by-hop header.

use bolero::TypeGenerator;
use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_gateway::fuzzing::{apply_edits, remove_one, set_one, strip_hop_by_hop, to_pairs};

use crate::pick;

/// A request's headers and one plugin's edits to them.
#[derive(Clone, Debug, TypeGenerator)]
pub struct Edits {
    #[generator(bolero::produce::<Vec<(Name, Value)>>().with().len(0..10usize))]
    pub headers: Vec<(Name, Value)>,
    #[generator(bolero::produce::<Vec<(Name, Value)>>().with().len(0..6usize))]
    pub set: Vec<(Name, Value)>,
    #[generator(bolero::produce::<Vec<Name>>().with().len(0..4usize))]
    pub remove: Vec<Name>,
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Name {
    Known(u8),
    Other(#[generator(bolero::produce::<String>().with().len(0..12usize))] String),
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Value {
    Known(u8),
    Other(#[generator(bolero::produce::<String>().with().len(0..12usize))] String),
    Bytes(#[generator(bolero::produce::<Vec<u8>>().with().len(0..12usize))] Vec<u8>),
}

/// The hop-by-hop headers, stripped before plugins see a message.
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

/// Headers the gateway owns, which a plugin may not edit: the hop-by-hop
/// ones, and the framing and routing it sets itself.
fn protected(name: &str) -> bool {
    HOP_BY_HOP.contains(&name) || matches!(name, "content-length" | "host")
}

const NAMES: &[&str] = &[
    "content-length",
    "Content-Length",
    "host",
    "HOST",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "authorization",
    "x-a",
    "X-A",
    "x-trace",
    "bad name",
    "",
    ":path",
    "x\n",
];

const VALUES: &[&str] = &[
    "1",
    "0",
    "chunked",
    "close",
    "keep-alive, X-Trace",
    "x-a,x-b, authorization",
    "upgrade",
    "bloqué",
    "",
    " padded ",
    "a\r\nb",
    "\u{7f}",
    "\t",
];

fn name_text(name: &Name) -> String {
    match name {
        Name::Known(i) => pick(NAMES, *i).to_string(),
        Name::Other(s) => s.clone(),
    }
}

fn value_bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::Known(i) => pick(VALUES, *i).as_bytes().to_vec(),
        Value::Other(s) => s.as_bytes().to_vec(),
        Value::Bytes(b) => b.clone(),
    }
}

/// Every value of every name, in order: what "unchanged" compares.
fn values_of(headers: &HeaderMap, name: &str) -> Vec<Vec<u8>> {
    headers.get_all(name).iter().map(|v| v.as_bytes().to_vec()).collect()
}

fn names(headers: &HeaderMap) -> Vec<String> {
    headers.keys().map(|k| k.as_str().to_string()).collect()
}

impl Edits {
    /// The request's headers, those that are valid HTTP.
    fn header_map(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name_text(name).as_bytes()), HeaderValue::from_bytes(&value_bytes(value)))
            {
                headers.append(name, value);
            }
        }
        headers
    }

    /// The edits as a plugin hands them over: strings.
    fn edits(&self) -> (Vec<(String, String)>, Vec<String>) {
        let set = self
            .set
            .iter()
            .map(|(n, v)| (name_text(n), String::from_utf8_lossy(&value_bytes(v)).into_owned()))
            .collect();
        (set, self.remove.iter().map(name_text).collect())
    }
}

pub fn check(input: &Edits) {
    let original = input.header_map();

    // Stripping: no hop-by-hop header is left, nor any a Connection header
    // named; everything else is untouched.
    let mut stripped = original.clone();
    strip_hop_by_hop(&mut stripped);
    let named: Vec<String> = original
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    for name in names(&original) {
        let gone = HOP_BY_HOP.contains(&name.as_str()) || named.contains(&name);
        let expected = if gone { Vec::new() } else { values_of(&original, &name) };
        assert_eq!(values_of(&stripped, &name), expected, "after stripping, {name}");
    }

    // What plugins see: every value that is UTF-8, in order, lower-case names.
    let pairs = to_pairs(&stripped);
    let seen: Vec<(String, String)> = stripped
        .iter()
        .filter_map(|(n, v)| Some((n.as_str().to_string(), String::from_utf8(v.as_bytes().to_vec()).ok()?)))
        .collect();
    assert_eq!(pairs, seen);
    assert!(pairs.iter().all(|(n, _)| n.chars().all(|c| !c.is_ascii_uppercase())));

    // A plugin writing back what it saw is a valid edit.
    for (name, value) in &pairs {
        let mut copy = stripped.clone();
        let result = apply_edits(&mut copy, &[(name.clone(), value.clone())], &[]);
        assert!(result.is_ok(), "writing back {name}: {value:?}: {result:?}");
    }

    // The edits: valid ones apply, and never to a protected header.
    let (set, remove) = input.edits();
    // A plugin's one-edit calls do what the same edit as a list does.
    let listed = |h: &HeaderMap| h.iter().map(|(n, v)| (n.clone(), v.clone())).collect::<Vec<_>>();
    for (name, value) in &set {
        let (mut by_list, mut by_one) = (stripped.clone(), stripped.clone());
        let result = apply_edits(&mut by_list, &[(name.clone(), value.clone())], &[]);
        assert_eq!(set_one(&mut by_one, name, value.clone()), result, "set {name:?}");
        assert_eq!(listed(&by_one), listed(&by_list), "set {name:?}");
    }
    for name in &remove {
        let (mut by_list, mut by_one) = (stripped.clone(), stripped.clone());
        let result = apply_edits(&mut by_list, &[], std::slice::from_ref(name));
        assert_eq!(remove_one(&mut by_one, name), result, "remove {name:?}");
        assert_eq!(listed(&by_one), listed(&by_list), "remove {name:?}");
    }
    let mut edited = stripped.clone();
    let result = apply_edits(&mut edited, &set, &remove);
    let valid = remove.iter().all(|n| HeaderName::from_bytes(n.as_bytes()).is_ok())
        && set.iter().all(|(n, v)| HeaderName::from_bytes(n.as_bytes()).is_ok() && HeaderValue::from_str(v).is_ok());
    assert_eq!(result.is_ok(), valid, "{result:?}");
    if result.is_err() {
        // A refused edit is refused whole: the caller may go on without the
        // plugin (failurePolicy: Open), so none of it may have applied.
        assert_eq!(edited, stripped, "a refused edit changed the headers");
        return;
    }
    let lower = |n: &str| n.to_ascii_lowercase();
    let mut all_names = names(&stripped);
    all_names.extend(names(&edited));
    for name in all_names {
        let after = values_of(&edited, &name);
        if protected(&name) {
            assert_eq!(after, values_of(&stripped, &name), "a plugin edited {name}");
            continue;
        }
        let set_values: Vec<Vec<u8>> =
            set.iter().filter(|(n, _)| lower(n) == name).map(|(_, v)| v.as_bytes().to_vec()).collect();
        let expected = if !set_values.is_empty() {
            set_values
        } else if remove.iter().any(|n| lower(n) == name) {
            Vec::new()
        } else {
            values_of(&stripped, &name)
        };
        assert_eq!(after, expected, "after the edit, {name}");
    }
}
