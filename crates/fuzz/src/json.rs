//! Request and response JSON: the gateway reads a request's `model`
//! (`requested_model`), writes a backend's model over it (`rewrite_model`),
//! and reads `usage` from an upstream's response (`usage_in`).
//!
//! Inputs are token streams rendered as JSON that is mostly well formed:
//! objects and arrays nested up to a few hundred deep, the keys the gateway
//! looks for (also escaped), numbers at and past the integer limits, and
//! strings with escapes; then, sometimes, one byte changed or cut.

use bolero::TypeGenerator;
use bytes::Bytes;
use serde_json::Value;
use sluice_gateway::fuzzing::{model_by_serde, requested_model, rewrite_model};

use crate::pick;

/// A request or response body.
#[derive(Clone, Debug, TypeGenerator)]
pub enum Body {
    Json {
        #[generator(bolero::produce::<Vec<Token>>().with().len(0..48usize))]
        tokens: Vec<Token>,
        /// Whitespace between tokens.
        space: u8,
        mutation: Mutation,
    },
    Raw(Vec<u8>),
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Token {
    Object,
    Array,
    Close,
    Key(Key),
    Value(Scalar),
    /// Arrays nested this deep around `1`: past serde_json's recursion limit.
    Deep(#[generator(0..400u16)] u16),
}

#[derive(Clone, Debug, TypeGenerator)]
pub enum Key {
    Known(u8),
    Other(#[generator(bolero::produce::<String>().with().len(0..12usize))] String),
}

/// Keys the gateway reads, the ones around them, and look-alikes.
const KEYS: &[&str] = &[
    "model",
    "mod\\u0065l",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "messages",
    "stream",
    "prompt",
    "choices",
    "Model",
    "model ",
    "response",
    "input_tokens",
    "output_tokens",
];

#[derive(Clone, Debug, TypeGenerator)]
pub enum Scalar {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Literal(u8),
    Str(#[generator(bolero::produce::<String>().with().len(0..24usize))] String),
    Escaped(u8),
}

/// Numbers at and past what the parsers take.
const LITERALS: &[&str] = &[
    "4294967295",
    "4294967296",
    "-1",
    "-0",
    "18446744073709551616",
    "123456789012345678901234567890",
    "1e400",
    "-1e400",
    "1e-400",
    "1.5",
    "01",
    "+1",
    ".5",
    "NaN",
    "1E2",
];

/// String bodies with escapes, surrogates included.
const ESCAPED: &[&str] =
    &["\"\\ud800\"", "\"\\udc00\\ud800\"", "\"\\ud83d\\ude00\"", "\"\\u0000\"", "\"a\\\"b\"", "\"\\/\"", "\"\\x\""];

const SPACES: &[&str] = &["", " ", "\n", "\r\n\t", "  "];

/// One byte changed, cut or added after rendering.
#[derive(Clone, Debug, TypeGenerator)]
pub enum Mutation {
    None,
    Truncate(u16),
    Replace(u16, u8),
    Insert(u16, u8),
}

impl Body {
    pub fn render(&self) -> Vec<u8> {
        match self {
            Body::Raw(bytes) => bytes.clone(),
            Body::Json { tokens, space, mutation } => {
                let mut out = render(tokens, pick(SPACES, *space)).into_bytes();
                mutate(&mut out, mutation);
                out
            }
        }
    }
}

fn render(tokens: &[Token], space: &str) -> String {
    // For each open container: is it an object, and does the next item
    // need a comma first.
    let mut open: Vec<(bool, bool)> = Vec::new();
    let mut out = String::new();
    let mut key: Option<String> = None;
    for token in tokens {
        let value = match token {
            Token::Close => {
                if let Some((is_object, _)) = open.pop() {
                    out.push_str(space);
                    out.push(if is_object { '}' } else { ']' });
                }
                continue;
            }
            Token::Key(k) => {
                key = Some(match k {
                    Key::Known(i) => format!("\"{}\"", pick(KEYS, *i)),
                    Key::Other(s) => json_string(s),
                });
                continue;
            }
            Token::Object => "{".to_string(),
            Token::Array => "[".to_string(),
            Token::Value(scalar) => scalar_text(scalar),
            Token::Deep(depth) => {
                let depth = usize::from(*depth);
                format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
            }
        };
        match open.last_mut() {
            Some((is_object, needs_comma)) => {
                if *needs_comma {
                    out.push(',');
                }
                *needs_comma = true;
                out.push_str(space);
                if *is_object {
                    out.push_str(&key.take().unwrap_or_else(|| "\"k\"".to_string()));
                    out.push(':');
                    out.push_str(space);
                }
            }
            // A second top-level value is trailing garbage, on purpose.
            None if !out.is_empty() => out.push(' '),
            None => {}
        }
        out.push_str(&value);
        match token {
            Token::Object => open.push((true, false)),
            Token::Array => open.push((false, false)),
            _ => {}
        }
    }
    while let Some((is_object, _)) = open.pop() {
        out.push(if is_object { '}' } else { ']' });
    }
    out
}

fn scalar_text(scalar: &Scalar) -> String {
    match scalar {
        Scalar::Null => "null".into(),
        Scalar::Bool(b) => b.to_string(),
        Scalar::Int(i) => i.to_string(),
        Scalar::UInt(u) => u.to_string(),
        // `{:?}` keeps the fraction or exponent; NaN and inf are not JSON.
        Scalar::Float(f) => format!("{f:?}"),
        Scalar::Literal(i) => pick(LITERALS, *i).into(),
        Scalar::Str(s) => json_string(s),
        Scalar::Escaped(i) => pick(ESCAPED, *i).into(),
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

pub(crate) fn mutate(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let at = |i: u16, len: usize| usize::from(i) % (len + 1);
    match *mutation {
        Mutation::None => {}
        Mutation::Truncate(i) => bytes.truncate(at(i, bytes.len())),
        Mutation::Replace(i, b) => {
            if !bytes.is_empty() {
                let i = usize::from(i) % bytes.len();
                bytes[i] = b;
            }
        }
        Mutation::Insert(i, b) => {
            let i = at(i, bytes.len());
            bytes.insert(i, b);
        }
    }
}

/// A request body, and the model of the backend it is sent to.
#[derive(Clone, Debug, TypeGenerator)]
pub struct Request {
    pub body: Body,
    pub backend_model: Key,
}

/// Runs the JSON the gateway parses on a request body and checks what it
/// makes of it.
pub fn check_request(request: &Request) {
    let model = match &request.backend_model {
        Key::Known(i) => pick(KEYS, *i).to_string(),
        Key::Other(s) => s.clone(),
    };
    check_model(&request.body.render(), &model);
}

/// `requested_model` never panics, agrees with serde_json and finds a
/// non-empty model; a body it routes can be rewritten for any backend, and
/// the rewrite changes only the model.
pub fn check_model(bytes: &[u8], backend_model: &str) {
    let requested = requested_model(bytes);
    // The gateway's one pass routes exactly what serde_json routes.
    assert_eq!(requested, model_by_serde(bytes), "{}", String::from_utf8_lossy(bytes));
    let Ok(requested) = requested else { return };
    assert!(!requested.is_empty());
    let rewritten = rewrite_model(&Bytes::copy_from_slice(bytes), backend_model);
    let rewritten = rewritten.unwrap_or_else(|e| panic!("a routed body was not rewritten: {e:?}"));
    let mut before: Value = serde_json::from_slice(bytes).expect("a rewritten body parses");
    assert!(before.is_object(), "a body that is not a JSON object was routed: {before}");
    let mut after: Value = serde_json::from_slice(&rewritten).expect("the rewrite is JSON");
    assert_eq!(after["model"], backend_model, "{after}");
    if !backend_model.is_empty() {
        assert_eq!(requested_model(&rewritten).as_deref(), Ok(backend_model));
    }
    before.as_object_mut().expect("an object").remove("model");
    after.as_object_mut().expect("an object").remove("model");
    assert_eq!(after, before, "the rewrite changed more than the model");
}

/// Runs the JSON the gateway parses on a response body.
pub fn check(body: &Body) {
    check_usage(&body.render());
}

/// `usage_in` never panics, and the total it reports covers the parts.
pub fn check_usage(bytes: &[u8]) {
    if let Some((prompt, completion, total)) = sluice_gateway::fuzzing::usage_in(bytes) {
        assert!(total >= prompt && total >= completion, "usage total {total} < parts {prompt} + {completion}");
    }
}
