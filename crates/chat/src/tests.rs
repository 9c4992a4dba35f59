use serde_json::{Value, json};

use super::*;

fn body(text: &str) -> ChatBody {
    ChatBody::new(Bytes::from(text.to_string()))
}

fn text(body: &mut ChatBody) -> String {
    String::from_utf8(body.bytes().to_vec()).unwrap()
}

fn value(body: &mut ChatBody) -> Value {
    serde_json::from_slice(&body.bytes()).unwrap()
}

/// Numbers past f64, odd whitespace and escapes: what a re-serialization
/// would change.
const ODD: &str = r#"{ "model" : "m", "n": 123456789012345678901234567890, "f": 7.509632777023061e-308,
  "messages": [ {"content": "be terse", "role": "system"} , {"role":"user","content":"hi \u00e9 \"x\" ]}", "name": "ann"},
  {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "n": 1.0e5}]} ], "stream" : true }"#;

#[test]
fn a_body_nobody_edits_is_returned_byte_for_byte() {
    let mut chat = body(ODD);
    assert_eq!(chat.message_count().unwrap(), 3);
    assert_eq!(chat.messages().unwrap().len(), 3);
    assert_eq!(chat.field("stream").as_deref(), Some("true"));
    assert!(!chat.is_edited());
    assert_eq!(text(&mut chat), ODD);
}

#[test]
fn escapes_at_the_edges_of_strings_are_read_as_serde_reads_them() {
    for text in [r#"\\"#, r#"\""#, r#"a\\\\"#, r#"\\\"q"#, r#"\u0022"#, "", r#"\/"#] {
        let json =
            format!(r#"{{"k\u0065y": "{text}", "messages": [{{"role": "user", "content": "{text}"}}], "z": 1}}"#);
        let expected: Value = serde_json::from_str(&json).unwrap();
        let mut chat = body(&json);
        assert_eq!(
            chat.messages().unwrap()[0].content,
            Content::Text(expected["messages"][0]["content"].as_str().unwrap().into())
        );
        assert_eq!(chat.field("z").as_deref(), Some("1"), "{json}");
        assert_eq!(
            chat.field("key").map(|v| serde_json::from_str::<Value>(&v).unwrap()),
            Some(expected["key"].clone())
        );
    }
}

#[test]
fn messages_are_read_with_their_content_and_other_members() {
    let mut chat = body(ODD);
    let messages = chat.messages().unwrap();
    assert_eq!(messages[0], Message::text("system", "be terse"));
    assert_eq!(messages[1].content, Content::Text("hi é \"x\" ]}".into()));
    assert_eq!(messages[1].extra, r#"{"name": "ann"}"#);
    assert_eq!(messages[2].content, Content::None);
    assert_eq!(messages[2].extra, r#"{"tool_calls": [{"id": "c1", "n": 1.0e5}]}"#);

    let mut parts = body(
        r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:x"}}, {"type": "text", "text": "t", "cache": 1}]}]}"#,
    );
    let Content::Parts(parts) = &parts.messages().unwrap()[0].content else { panic!("parts") };
    assert_eq!(parts[0], Part::Text("look".into()));
    assert_eq!(parts[1], Part::Other(r#"{"type": "image_url", "image_url": {"url": "data:x"}}"#.into()));
    assert!(
        matches!(&parts[2], Part::Other(json) if json.contains("cache")),
        "a text part with more members is kept whole"
    );
}

#[test]
fn what_is_not_a_chat_request_is_named() {
    let cases = [
        ("not json", "the body is not JSON"),
        ("[1]", "the body is not a JSON object"),
        (r#"{"model": "m"}"#, "the request has no `messages`"),
        (r#"{"messages": {}}"#, "`messages` must be an array"),
        (r#"{"messages": [1]}"#, "messages[0]: not an object"),
        (r#"{"messages": [{"content": "x"}]}"#, "messages[0]: no `role`"),
        (r#"{"messages": [{"role": "user"}, {"role": 7}]}"#, "messages[1]: `role` must be a string"),
        (
            r#"{"messages": [{"role": "user", "content": 7}]}"#,
            "messages[0]: `content` must be a string, an array or null",
        ),
        (r#"{"messages": [], "messages": []}"#, "the body is not JSON: duplicate key \"messages\""),
        (r#"{"messages": [{"role": "user", "role": "user"}]}"#, "the body is not JSON: duplicate key \"role\""),
    ];
    for (text, error) in cases {
        let mut chat = body(text);
        assert!(chat.message_count().unwrap_err().starts_with(error), "{text}: {error}");
        assert!(chat.messages().unwrap_err().starts_with(error), "{text}: {error}");
        assert_eq!(chat.bytes(), text, "a body that cannot be read is left alone");
    }
    assert_eq!(body(r#"{"messages": [{"role": "user"}]}"#).messages().unwrap()[0].content, Content::None);
}

#[test]
fn a_splice_rewrites_only_the_messages_it_touches() {
    let mut chat = body(ODD);
    chat.splice_messages(0, 0, vec![Message::text("system", "Answer in English.")]).unwrap();
    chat.splice_messages(3, 1, vec![]).unwrap();
    let len = chat.len();
    let out = text(&mut chat);
    assert_eq!(len, out.len(), "len() is the written length");
    // Untouched members and messages keep their bytes.
    for kept in [
        r#""n": 123456789012345678901234567890"#,
        r#""f": 7.509632777023061e-308"#,
        r#"{"content": "be terse", "role": "system"}"#,
        r#"{"role":"user","content":"hi \u00e9 \"x\" ]}", "name": "ann"}"#,
        r#""stream" : true"#,
    ] {
        assert!(out.contains(kept), "{kept} in {out}");
    }
    assert!(!out.contains("tool_calls"), "{out}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["messages"][0], json!({"role": "system", "content": "Answer in English."}));
    assert_eq!(out["messages"].as_array().unwrap().len(), 3);
    // Read again after writing: the edit is there.
    assert_eq!(chat.messages().unwrap()[0], Message::text("system", "Answer in English."));
}

#[test]
fn a_spliced_message_keeps_its_extra_members_and_parts() {
    let mut chat = body(r#"{"messages": []}"#);
    let message = Message {
        role: "user".into(),
        content: Content::Parts(vec![
            Part::Text("a".into()),
            Part::Other(r#"{"type":"image_url","image_url":{"url":"u"}}"#.into()),
        ]),
        extra: r#"{"name": "bo", "n": 1e400}"#.into(),
    };
    chat.splice_messages(0, 0, vec![message.clone()]).unwrap();
    let read = chat.messages().unwrap().remove(0);
    assert_eq!((&read.role, &read.content), (&message.role, &message.content));
    assert_eq!(read.extra, r#"{"name": "bo","n": 1e400}"#, "extra members keep their text");
    let bare = Message { extra: String::new(), ..Message::text("user", "x") };
    chat.splice_messages(0, 0, vec![bare]).unwrap();
    assert_eq!(chat.messages().unwrap()[0], Message::text("user", "x"), "an empty extra is {{}}");
}

#[test]
fn bad_edits_are_refused_and_change_nothing() {
    let mut chat = body(ODD);
    assert_eq!(chat.splice_messages(2, 2, vec![]).unwrap_err(), "messages 2..4 are past the end: there are 3");
    assert!(chat.splice_messages(u32::MAX, u32::MAX, vec![]).is_err());
    assert!(chat.set_content(3, Content::None).is_err());
    let bad = [
        Message { extra: "[]".into(), ..Message::text("user", "x") },
        Message { extra: "{".into(), ..Message::text("user", "x") },
        Message { extra: r#"{"role": "system"}"#.into(), ..Message::text("user", "x") },
        Message { content: Content::Parts(vec![Part::Other("nope".into())]), ..Message::text("user", "x") },
    ];
    for message in bad {
        assert!(chat.splice_messages(0, 0, vec![message.clone()]).is_err(), "{message:?}");
    }
    assert!(chat.set_field("model", Some(r#""x""#.into())).is_err());
    assert!(chat.set_field("t", Some("{".into())).is_err());
    assert!(!chat.is_edited());
    assert_eq!(text(&mut chat), ODD);
}

#[test]
fn content_is_replaced_in_place() {
    let mut chat = body(ODD);
    chat.set_content(1, Content::Text("[redacted]".into())).unwrap();
    let out = text(&mut chat);
    assert!(out.contains(r#"{"role":"user","content":"[redacted]", "name": "ann"}"#), "{out}");
}

#[test]
fn fields_are_read_set_added_and_removed() {
    // A body with a name twice is refused before plugins read it (see
    // `unique`); the one the gateway validated would not have one, but
    // the edits' rule for repeated names holds all the same.
    assert!(body(r#"{"model": "m", "t": 0.7, "messages": [], "t": 0.1}"#).field("t").is_none());
    let mut chat = ChatBody::validated(Bytes::from_static(br#"{"model": "m", "t": 0.7, "messages": [], "t": 0.1}"#));
    assert_eq!(chat.field("t").as_deref(), Some("0.1"), "the last one, as parsers read it");
    assert_eq!(chat.field("absent"), None);
    chat.set_field("t", Some("1".into())).unwrap();
    chat.set_field("max_tokens", Some("50".into())).unwrap();
    assert_eq!(chat.field("max_tokens").as_deref(), Some("50"));
    assert_eq!(text(&mut chat), r#"{"model": "m","t": 1,"messages": [],"t": 1,"max_tokens":50}"#);
    chat.set_field("t", None).unwrap();
    assert_eq!(value(&mut chat), json!({"model": "m", "messages": [], "max_tokens": 50}));
}

#[test]
fn messages_can_be_set_whole_or_created() {
    let mut chat = body(r#"{"model": "m", "messages": "a template reference", "t": 1}"#);
    assert!(chat.messages().is_err());
    chat.set_field("messages", Some(r#"[{"role": "user", "content": "rendered"}]"#.into())).unwrap();
    assert_eq!(chat.messages().unwrap(), vec![Message::text("user", "rendered")]);
    chat.splice_messages(0, 0, vec![Message::text("system", "s")]).unwrap();
    assert_eq!(
        text(&mut chat),
        r#"{"model": "m","messages": [{"role":"system","content":"s"},{"role": "user", "content": "rendered"}],"t": 1}"#
    );
    let mut none = body(r#"{"model": "m"}"#);
    none.set_field("messages", Some("[]".into())).unwrap();
    assert_eq!(none.message_count().unwrap(), 0);
}

#[test]
fn a_replaced_body_is_read_afresh() {
    let mut chat = body(ODD);
    chat.splice_messages(0, 3, vec![]).unwrap();
    chat.set_bytes(Bytes::from_static(br#"{"messages": [{"role": "user", "content": "new"}]}"#));
    assert!(!chat.is_edited());
    assert_eq!(chat.messages().unwrap(), vec![Message::text("user", "new")]);
    chat.set_bytes(Bytes::from_static(b"{"));
    assert!(chat.messages().unwrap_err().starts_with("the body is not JSON"));
}

/// Random edit sequences: the written body is always the JSON a parse,
/// edit and re-serialization would give, and `len` its length.
#[test]
fn random_edits_match_editing_the_parsed_value() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _ in 0..300 {
        let original = json!({"model": "m", "x": [1, {"y": "z"}], "messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": "u", "name": "n"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"}]}]});
        let mut expected = original.clone();
        let mut chat = ChatBody::validated(Bytes::from(serde_json::to_vec_pretty(&original).unwrap()));
        for step in 0..next(6) {
            let messages = expected["messages"].as_array_mut().unwrap();
            let count = messages.len() as u64;
            match next(4) {
                0 => {
                    let start = next(count + 1);
                    let delete = next(count - start + 1);
                    let text = format!("m{step}");
                    chat.splice_messages(start as u32, delete as u32, vec![Message::text("user", &text)]).unwrap();
                    let range = start as usize..(start + delete) as usize;
                    messages.splice(range, [json!({"role": "user", "content": text})]);
                }
                1 if count > 0 => {
                    let index = next(count);
                    chat.set_content(index as u32, Content::Text(format!("c{step}"))).unwrap();
                    messages[index as usize]["content"] = json!(format!("c{step}"));
                }
                2 => {
                    chat.set_field("x", Some(format!("{step}"))).unwrap();
                    expected["x"] = json!(step);
                }
                _ => {
                    chat.set_field("x", None).unwrap();
                    expected.as_object_mut().unwrap().remove("x");
                }
            }
            if next(3) == 0 {
                chat.bytes();
            }
        }
        let len = chat.len();
        let bytes = chat.bytes();
        assert_eq!(len, bytes.len());
        assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), expected);
    }
}

/// Bodies at the edges of JSON: what the one pass and serde_json must agree on.
const EDGES: &[&str] = &[
    r#"{"model":"m","messages":[]}"#,
    " \t\r\n{ \"model\" : \"m\" } \n",
    "{\u{c}\"model\":\"m\"}",
    r#"{"model":"m","x":1e400}"#,
    r#"{"model":"m","x":-1e400}"#,
    r#"{"model":"m","x":1e-400}"#,
    r#"{"model":"m","x":0e99999999999999999999}"#,
    r#"{"model":"m","x":123456789012345678901234567890}"#,
    r#"{"model":"m","x":18446744073709551616,"y":-9223372036854775809}"#,
    r#"{"model":"m","x":[-0,0.5,1E+2,2e-3,-1.5E2]}"#,
    r#"{"model":"m","x":01}"#,
    r#"{"model":"m","x":1.}"#,
    r#"{"model":"m","x":.5}"#,
    r#"{"model":"m","x":-}"#,
    r#"{"model":"m","x":1e}"#,
    r#"{"model":"m","x":+1}"#,
    r#"{"model":"m","x":"\ud800"}"#,
    r#"{"model":"m","x":"\ud800\udc00 \uDBFF\uDFFF"}"#,
    r#"{"model":"m","x":"\udc00"}"#,
    r#"{"model":"m","x":"\ud800\u0041"}"#,
    r#"{"model":"m","x":"\ud800x"}"#,
    r#"{"model":"m","x":"\x"}"#,
    r#"{"model":"m","x":"\u00E9\/\b\f\n\r\t\"\\"}"#,
    r#"{"model":"m","x":"\u00g9"}"#,
    "{\"model\":\"m\",\"x\":\"a\tb\"}",
    "{\"model\":\"m\",\"x\":\"a\nb\"}\n",
    // Past the first sixteen bytes of a string, which are searched inline.
    "{\"model\":\"m\",\"x\":\"0123456789abcdefghij\u{1}k\"}",
    r#"{"model":"m","x":"0123456789abcdefghij\"k\u00e9 0123456789abcdefghij","y":"0123456789abcdef"}"#,
    "{\n  \"model\": \"m\",\n  \"x\": \"a\u{1f}\"\n}\n",
    "{\"model\":\"m\",\"x\":\"a\u{7f}b\"}",
    "{\"model\":\"\u{e9}\u{1F600}\"}",
    r#"{"model":"m",}"#,
    r#"{"model":"m","x":[1,]}"#,
    r#"{"model":"m"} x"#,
    r#"{"model":"m"}{}"#,
    r#"{"model":"a","model":"b"}"#,
    r#"{"model":"a","model":7}"#,
    r#"{"model":7,"model":"a"}"#,
    r#"{"mod\u0065l":"x","m\u00e9":1}"#,
    r#"{"model":"\u00e9\"q"}"#,
    r#"{"model":""}"#,
    r#"{"model":null}"#,
    r#"{"x":1}"#,
    r#"[{"model":"m"}]"#,
    r#""model""#,
    r#"{"model":"m","x":tru}"#,
    r#"{"model":"m","x":[true,false,null,{},[],""]}"#,
    r#"{"model":"m","messages":{"role":"user"}}"#,
    r#"{"model":"m","messages":[1]}"#,
    r#"{"model":"m","messages":[{"role":"user","content":"a"}],"messages":[]}"#,
    r#"{"model":"m","messages":[{"role":1}]}"#,
    r#"{"model":"m","messages":[{"content":"x"}]}"#,
    r#"{"model":"m","messages":[{"role":"user","content":1},{"role":2}]}"#,
    r#"{"model":"m","messages":[{"r\u006fle":"user","content":[{"type":"text","text":"a"}]}]}"#,
    r#"{"model":"m","messages":[{"role":"user","content":null,"name":"n"}],"stream":true}"#,
];

/// How deep `value` nests containers.
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(members) => 1 + members.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The one pass accepts a body only if serde_json does, finds the model
/// serde_json finds, and reads members and messages as the passes it
/// replaces read them; it accepts every body serde_json does that has a
/// model and is not nested deep (those it leaves to serde_json). Checked on
/// the edge cases above and on thousands of random corruptions of them.
#[test]
fn one_pass_reads_a_body_exactly_as_serde_json_and_the_lazy_passes_do() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let deep = format!(r#"{{"model":"m","x":{}1{}}}"#, "[".repeat(100), "]".repeat(100));
    let mut bodies: Vec<Vec<u8>> = EDGES.iter().map(|b| b.as_bytes().to_vec()).collect();
    bodies.push(deep.into_bytes());
    // An integer past f64: serde_json refuses it.
    bodies.push(format!(r#"{{"model":"m","x":{}}}"#, "9".repeat(310)).into_bytes());
    bodies.push(ODD.as_bytes().to_vec());
    const BYTES: &[u8] = b"\"\\{}[],:0e-.+ u8dDnt\x0c\x00\x1f\x7f\xff\xc3\xa9";
    for _ in 0..20_000 {
        let mut body = bodies[next(EDGES.len() + 3)].clone();
        for _ in 0..1 + next(2) {
            let at = next(body.len() + 1);
            match next(4) {
                0 if at < body.len() => body[at] = BYTES[next(BYTES.len())],
                1 if at < body.len() => drop(body.remove(at)),
                2 => body.insert(at, BYTES[next(BYTES.len())]),
                _ => body.truncate(at),
            }
        }
        bodies.push(body);
    }
    let (mut both, mut neither) = (0, 0);
    for body in &bodies {
        let shown = String::from_utf8_lossy(body);
        // Less any body naming a member twice in an object: refused.
        let serde =
            serde_json::from_slice::<Value>(body).ok().filter(|_| crate::unique::first_duplicate(body).is_none());
        let routable = serde.as_ref().and_then(|v| Some((v.get("model")?.as_str()?.to_string(), depth(v))));
        let Some((mut chat, model)) = ChatBody::read(Bytes::from(body.clone())) else {
            let shallow = routable.as_ref().is_some_and(|(model, depth)| !model.is_empty() && *depth < 60);
            assert!(!shallow, "serde_json reads it, the one pass does not: {shown}");
            neither += usize::from(serde.is_none());
            continue;
        };
        both += 1;
        assert_eq!(routable.map(|(model, _)| model), Some(model.clone()), "{shown}");
        let mut lazy = ChatBody::validated(Bytes::from(body.clone()));
        assert_eq!(chat.messages(), lazy.messages(), "{shown}");
        for name in ["model", "messages", "x", "stream", "m\u{e9}", "n"] {
            assert_eq!(chat.field(name), lazy.field(name), "{name} in {shown}");
        }
        let written = chat.bytes();
        assert_eq!(written, &body[..]);
        assert!(chat.is_reading_of(&written));
        assert!(!chat.is_reading_of(&Bytes::from(body.clone())), "another copy of the same text");
    }
    // Both sides were exercised.
    assert!(both > 1_000 && neither > 5_000, "{both} read, {neither} refused by both");
}

/// A name twice in one object, at any depth and however spelled, leaves
/// the one pass unsure (the gateway then refuses the body with serde_json's
/// wording) and is refused by the check of what plugins write.
#[test]
fn a_name_given_twice_in_any_object_is_refused() {
    let wide: String = (0..40).map(|i| format!(r#""k{i}":{i},"#)).collect();
    for twice in [
        r#"{"model":"m","model":"m","messages":[]}"#.to_string(),
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}"#.into(),
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","te\u0078t":"b"}]}]}"#.into(),
        r#"{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}"#.into(),
        r#"{"model":"m","messages":[],"x":[{"a":{"b":1,"b":1}}]}"#.into(),
        format!(r#"{{{wide}"model":"m","messages":[],"k7":1}}"#),
    ] {
        assert!(ChatBody::read(Bytes::from(twice.clone())).is_none(), "{twice}");
        let error = check_json(twice.as_bytes()).unwrap_err().to_string();
        assert!(error.starts_with(crate::DUPLICATE_KEY), "{twice}: {error}");
    }
    // The same name in sibling or nested objects is fine, and so is an
    // object past the size where a set takes over.
    for fine in [
        r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}"#.to_string(),
        r#"{"model":"m","messages":[],"o":{"model":{"model":1}}}"#.into(),
        format!(r#"{{{wide}"model":"m","messages":[]}}"#),
    ] {
        assert!(ChatBody::read(Bytes::from(fine.clone())).is_some(), "{fine}");
        check_json(fine.as_bytes()).unwrap();
    }
    // What a plugin writes is held to the same rule.
    let mut chat = body(r#"{"model":"m","messages":[]}"#);
    assert!(chat.set_field("metadata", Some(r#"{"a":1,"a":2}"#.into())).unwrap_err().contains("duplicate key"));
    let message = Message { extra: r#"{"name":"a","name":"b"}"#.into(), ..Message::text("user", "x") };
    assert!(chat.splice_messages(0, 0, vec![message]).unwrap_err().contains("duplicate key"));
}

/// The text plugins read from each kind of part (the SDK's rule).
#[test]
fn a_parts_text_is_its_text_or_a_refusals_refusal() {
    let part = |json: &str| Part::Other(json.into());
    assert_eq!(Part::Text("a".into()).text().as_deref(), Some("a"));
    assert_eq!(part(r#"{"type":"text","text":"a","cache_control":{}}"#).text().as_deref(), Some("a"));
    assert_eq!(part(r#"{"type":"refusal","refusal":"no","text":"decoy"}"#).text().as_deref(), Some("no"));
    assert_eq!(part(r#"{"type":"input_text","text":"i"}"#).text().as_deref(), Some("i"));
    assert_eq!(part(r#"{"type":"image_url","image_url":{"url":"u"}}"#).text(), None);
    assert_eq!(part(r#"{"type":"text","text":5}"#).text(), None);
    let content = Content::Parts(vec![Part::Text("a".into()), part(r#"{"type":"refusal","refusal":"b"}"#)]);
    assert_eq!(content.texts(), ["a", "b"]);
}
