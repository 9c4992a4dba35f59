//! Finding where members and elements of JSON text begin and end, and
//! replacing one member in place, every other byte left as the client wrote
//! it: re-serializing a parsed value would change number text (an integer
//! past u64 becomes a rounded float, some floats move by an ulp), which the
//! upstream must not see (found by fuzzing).

use std::borrow::Cow;
use std::ops::Range;

/// `object` (a valid JSON object, as serde_json parsed it) with the value of
/// every top-level member named `key` replaced by `value` (valid JSON), or
/// `key: value` added first if there is none. `None` if `object` is not an
/// object.
pub fn set_member(object: &[u8], key: &str, value: &str) -> Option<Vec<u8>> {
    let spans: Vec<Range<usize>> =
        members(object)?.into_iter().filter(|member| member.key == key).map(|member| member.value).collect();
    let mut out = Vec::with_capacity(object.len() + value.len());
    if spans.is_empty() {
        let open = object.iter().position(|&b| b == b'{')?;
        let member = serde_json::to_string(key).ok()? + ":" + value;
        let empty = object[open + 1..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
        out.extend_from_slice(&object[..=open]);
        out.extend_from_slice(member.as_bytes());
        if !empty {
            out.push(b',');
        }
        out.extend_from_slice(&object[open + 1..]);
        return Some(out);
    }
    let mut from = 0;
    for span in spans {
        out.extend_from_slice(&object[from..span.start]);
        out.extend_from_slice(value.as_bytes());
        from = span.end;
    }
    out.extend_from_slice(&object[from..]);
    Some(out)
}

/// A member of an object: its name decoded (borrowed from the text unless
/// it has escapes: a chat body has a dozen names, read on every request),
/// and where its name (quotes included) and its value are.
pub(crate) struct Member<'a> {
    pub key: Cow<'a, str>,
    pub key_span: Range<usize>,
    pub value: Range<usize>,
}

/// The members of `object` (valid JSON), in order; `None` if it is not an object.
pub(crate) fn members(object: &[u8]) -> Option<Vec<Member<'_>>> {
    let mut scan = Scan { text: object, at: 0 };
    scan.ws();
    scan.members()
}

/// An element of an array: where it is, and its members if it is an object.
pub(crate) type Element<'a> = (Range<usize>, Option<Vec<Member<'a>>>);

/// Where each element of `array` (valid JSON) is, with its members if it
/// is an object, found in the same pass; `None` if it is not an array.
pub(crate) fn elements_with_members(array: &[u8]) -> Option<Vec<Element<'_>>> {
    Scan { text: array, at: 0 }.array(|scan| {
        let start = scan.at;
        let members = if scan.peek()? == b'{' { Some(scan.members()?) } else { scan.value().map(|()| None)? };
        Some((start..scan.at, members))
    })
}

/// A string (a member name, say), quotes included, decoded: by serde only
/// if it has escapes.
pub(crate) fn decode_string(quoted: &[u8]) -> Option<Cow<'_, str>> {
    let inner = quoted.get(1..quoted.len().checked_sub(1)?)?;
    if inner.contains(&b'\\') {
        return serde_json::from_slice::<String>(quoted).ok().map(Cow::Owned);
    }
    std::str::from_utf8(inner).ok().map(Cow::Borrowed)
}

/// Where each element of `array` (valid JSON) is; `None` if it is not an array.
pub(crate) fn elements(array: &[u8]) -> Option<Vec<Range<usize>>> {
    Scan { text: array, at: 0 }.array(|scan| {
        let start = scan.at;
        scan.value()?;
        Some(start..scan.at)
    })
}

/// A cursor over JSON text that serde_json has already accepted, so it
/// only needs to find where things end, not check them.
struct Scan<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    /// What `element` makes of each element of the array at the cursor (it
    /// must read the element whole); the cursor ends past the array.
    fn array<T>(&mut self, mut element: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        self.ws();
        self.expect(b'[')?;
        let mut elements = Vec::new();
        self.ws();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(elements);
        }
        loop {
            self.ws();
            elements.push(element(self)?);
            self.ws();
            match self.next()? {
                b',' => continue,
                b']' => return Some(elements),
                _ => return None,
            }
        }
    }

    /// The members of the object at the cursor, spans within the whole
    /// text; the cursor ends past it.
    fn members(&mut self) -> Option<Vec<Member<'a>>> {
        self.expect(b'{')?;
        let mut members = Vec::new();
        self.ws();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(members);
        }
        loop {
            self.ws();
            let key_span = self.string()?;
            let key = decode_string(&self.text[key_span.clone()])?;
            self.ws();
            self.expect(b':')?;
            self.ws();
            let start = self.at;
            self.value()?;
            members.push(Member { key, key_span, value: start..self.at });
            self.ws();
            match self.next()? {
                b',' => continue,
                b'}' => return Some(members),
                _ => return None,
            }
        }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// A string, quotes included.
    fn string(&mut self) -> Option<Range<usize>> {
        let start = self.at;
        self.expect(b'"')?;
        // Message text is most of a chat body: jump to the next quote or
        // backslash rather than stepping byte by byte.
        loop {
            let rest = self.text.get(self.at..)?;
            let found = memchr::memchr2(b'"', b'\\', rest)?;
            self.at += found + 1;
            if rest[found] == b'"' {
                return Some(start..self.at);
            }
            self.at += 1;
        }
    }

    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            // A number, true, false or null: up to the next delimiter.
            _ => {
                while self.peek().is_some_and(|b| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace()) {
                    self.at += 1;
                }
                Some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(object: &str, value: &str) -> String {
        String::from_utf8(set_member(object.as_bytes(), "model", value).unwrap()).unwrap()
    }

    #[test]
    fn only_the_member_changes_and_numbers_keep_their_text() {
        let body = r#"{ "model" : "a", "x": 123456789012345678901234567890, "y": 7.509632777023061e-308,
            "n": {"model": "inner", "s": "}\"]"}, "l": [1, {"model": 2}] }"#;
        let out = set(body, r#""b""#);
        assert_eq!(out, body.replacen(r#""a""#, r#""b""#, 1));
    }

    #[test]
    fn escaped_and_repeated_keys_are_all_replaced_and_a_missing_one_is_added() {
        assert_eq!(set(r#"{"mod\u0065l":"a","model":"c"}"#, r#""b""#), r#"{"mod\u0065l":"b","model":"b"}"#);
        assert_eq!(set(r#"{"x":1}"#, r#""b""#), r#"{"model":"b","x":1}"#);
        assert_eq!(set(r#"{ }"#, r#""b""#), r#"{"model":"b" }"#);
        assert_eq!(set_member(b"[1]", "model", r#""b""#), None);
    }

    #[test]
    fn the_result_is_what_serde_reads_with_the_member_set() {
        for body in [r#"{"model":"a","t":0.7,"m":[{"role":"user","content":"hi \"x\" {"}]}"#, r#"{"a":null,"b":true}"#]
        {
            let out = set(body, r#""new""#);
            let mut expected: serde_json::Value = serde_json::from_str(body).unwrap();
            expected["model"] = "new".into();
            assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap(), expected, "{out}");
        }
    }
}
