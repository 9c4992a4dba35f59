//! Reading a body as the gateway receives it, in one pass: checking that it
//! is JSON, and finding what routing and plugins need (the top-level
//! members, the last `model`, the messages). Three passes did this before
//! (serde_json's check, then the top level, then the messages), a seventh
//! of a plugin chain's work on a 2 KB chat.
//!
//! The pass only ever accepts what serde_json accepts, less any object that
//! names a member twice ([`crate::unique`]). Where it is unsure (anything
//! it refuses, nesting deeper than [`MAX_DEPTH`]), it says `None` and the
//! caller asks serde_json, which also words the error.

use std::borrow::Cow;
use std::collections::HashSet;
use std::ops::Range;

use crate::scan::{Member, decode_string};
use crate::unique::LINEAR;

/// What one pass found in a JSON object.
pub(crate) struct Read<'a> {
    pub members: Vec<Member<'a>>,
    /// The last member `model`'s value if it is a string, quotes included.
    pub model: Option<Range<usize>>,
    /// The elements of the one `messages` array, or why there are none to
    /// read, worded as [`crate::read_messages`] words it.
    pub messages: Result<Vec<Range<usize>>, String>,
}

/// A string's first bytes, searched inline; the rest with memchr.
const SHORT: usize = 16;

/// Deeper than this, serde_json decides (its own limit is 128).
const MAX_DEPTH: usize = 64;

/// `text` read, if it is a JSON object as serde_json reads one.
pub(crate) fn read(text: &[u8]) -> Option<Read<'_>> {
    // Strings must be UTF-8 and nothing outside them may be other than
    // ASCII: one check of the whole text covers both, and is fast.
    let str = simdutf8::basic::from_utf8(text).ok()?;
    let mut cursor = Cursor { text, str, at: 0, names: Vec::with_capacity(16) };
    cursor.ws();
    let read = cursor.top()?;
    cursor.ws();
    (cursor.at == text.len()).then_some(read)
}

struct Cursor<'a> {
    text: &'a [u8],
    /// `text`, known to be UTF-8.
    str: &'a str,
    at: usize,
    /// The names of the objects open at the cursor, to find one given
    /// twice: one stack for all, so an object costs no allocation.
    names: Vec<Cow<'a, str>>,
}

impl<'a> Cursor<'a> {
    fn top(&mut self) -> Option<Read<'a>> {
        // Room for a chat request's members without growing.
        let mut members = Vec::with_capacity(8);
        let mut model = None;
        let mut messages = None;
        let mut named_messages = 0usize;
        self.object(1, |cursor, key_span, key| {
            let start = cursor.at;
            if key == crate::MESSAGES {
                named_messages += 1;
                messages = Some(cursor.messages()?);
            } else {
                cursor.value(1)?;
            }
            if key == "model" {
                model = (cursor.text.get(start) == Some(&b'"')).then_some(start..cursor.at);
            }
            members.push(Member { key, key_span, value: start..cursor.at });
            Some(())
        })?;
        let messages = match (named_messages, messages) {
            (1, Some(messages)) => messages,
            (0, _) => Err(crate::NO_MESSAGES.into()),
            _ => Err(crate::TWO_MESSAGES.into()),
        };
        Some(Read { members, model, messages })
    }

    /// The value of `messages`, checked as `read_messages` checks it: the
    /// first message that is not one is the error.
    fn messages(&mut self) -> Option<Result<Vec<Range<usize>>, String>> {
        if self.peek()? != b'[' {
            self.value(1)?;
            return Some(Err(crate::NOT_AN_ARRAY.into()));
        }
        let mut spans = Vec::with_capacity(16);
        let mut error = None;
        // One list for every message's members: they are checked and dropped.
        let mut members = Vec::with_capacity(4);
        self.array(2, |cursor| {
            let start = cursor.at;
            members.clear();
            let object = cursor.peek()? == b'{';
            if object {
                cursor.object(3, |cursor, key_span, key| {
                    let value = cursor.at;
                    cursor.value(3)?;
                    members.push(Member { key, key_span, value: value..cursor.at });
                    Some(())
                })?;
            } else {
                cursor.value(2)?;
            }
            if error.is_none() {
                let checked = crate::check_message(cursor.text, object.then_some(&members[..]), spans.len());
                error = checked.err();
            }
            spans.push(start..cursor.at);
            Some(())
        })?;
        Some(error.map_or(Ok(spans), Err))
    }

    /// A member's name (`span` has its quotes), decoded; borrowed unless it
    /// has escapes.
    fn name(&self, span: Range<usize>) -> Option<Cow<'a, str>> {
        let inner = self.str.get(span.start + 1..span.end.checked_sub(1)?)?;
        if inner.contains('\\') { decode_string(&self.text[span]) } else { Some(Cow::Borrowed(inner)) }
    }

    /// The object at the cursor, each member's value read by `member` (the
    /// cursor at the value, the name's span given).
    /// A name given twice makes the pass unsure: serde_json's check
    /// refuses it, and words the error.
    fn object(
        &mut self,
        depth: usize,
        mut member: impl FnMut(&mut Self, Range<usize>, Cow<'a, str>) -> Option<()>,
    ) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.expect(b'{')?;
        self.ws();
        if self.eat(b'}') {
            return Some(());
        }
        // This object's names are on the shared stack from `base` (an
        // object inside pushes above them and takes its own off), or in a
        // set once there are many.
        let base = self.names.len();
        let mut set: Option<HashSet<Cow<'a, str>>> = None;
        loop {
            let key = self.string()?;
            let name = self.name(key.clone())?;
            let fresh = match &mut set {
                Some(set) => set.insert(name.clone()),
                None if self.names[base..].contains(&name) => false,
                None => {
                    self.names.push(name.clone());
                    if self.names.len() - base > LINEAR {
                        set = Some(self.names.drain(base..).collect());
                    }
                    true
                }
            };
            if !fresh {
                return None;
            }
            self.ws();
            self.expect(b':')?;
            self.ws();
            member(self, key, name)?;
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b'}' => {
                    self.names.truncate(base);
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The array at the cursor, each element read by `element`.
    fn array(&mut self, depth: usize, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.expect(b'[')?;
        self.ws();
        if self.eat(b']') {
            return Some(());
        }
        loop {
            element(self)?;
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b']' => return Some(()),
                _ => return None,
            }
        }
    }

    /// Any value, `depth` deep in the containers around it.
    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => self.object(depth + 1, |cursor, _, _| cursor.value(depth + 1)),
            b'[' => self.array(depth + 1, |cursor| cursor.value(depth + 1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.text.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// A number, as JSON spells one, within serde_json's range (it refuses
    /// what overflows an f64, such as `1e400`).
    fn number(&mut self) -> Option<()> {
        let start = self.at;
        self.eat(b'-');
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let mut integer = true;
        if self.eat(b'.') {
            integer = false;
            self.digit()?;
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            integer = false;
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.digit()?;
            self.digits();
        }
        // Eighteen digits are within any integer type serde_json reads;
        // for anything else, its own number parser decides.
        let text = &self.text[start..self.at];
        let within = (integer && text.len() <= 18) || serde_json::from_slice::<f64>(text).is_ok_and(f64::is_finite);
        within.then_some(())
    }

    fn digit(&mut self) -> Option<()> {
        self.peek().is_some_and(|b| b.is_ascii_digit()).then(|| self.at += 1)
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }

    /// A string, quotes included: no control characters, escapes as JSON
    /// has them, surrogates paired (serde_json refuses a lone one in a
    /// string). The text is UTF-8 already.
    fn string(&mut self) -> Option<Range<usize>> {
        let start = self.at;
        self.expect(b'"')?;
        loop {
            // Most strings are short (names, roles), and eight bytes at a
            // time inline beats a call. Past that (message text), two
            // vectorised passes do: memchr, then a fold without early exit
            // for control characters.
            let rest = self.text.get(self.at..)?;
            let head = rest.get(..SHORT).unwrap_or(rest);
            let mut run = plain_run(head);
            if run == SHORT {
                let long = &rest[SHORT..];
                let end = memchr::memchr2(b'"', b'\\', long).unwrap_or(long.len());
                if long[..end].iter().fold(false, |found, &b| found | (b < 0x20)) {
                    return None;
                }
                run += end;
            }
            self.at += run;
            match self.next()? {
                b'"' => return Some(start..self.at),
                b'\\' => self.escape()?,
                _ => return None,
            }
        }
    }

    /// What follows a backslash.
    fn escape(&mut self) -> Option<()> {
        match self.next()? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(()),
            b'u' => match self.hex4()? {
                0xD800..=0xDBFF => {
                    self.expect(b'\\')?;
                    self.expect(b'u')?;
                    (0xDC00..=0xDFFF).contains(&self.hex4()?).then_some(())
                }
                0xDC00..=0xDFFF => None,
                _ => Some(()),
            },
            _ => None,
        }
    }

    fn hex4(&mut self) -> Option<u16> {
        let digits = std::str::from_utf8(self.text.get(self.at..self.at + 4)?).ok()?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.at += 4;
        u16::from_str_radix(digits, 16).ok()
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        self.at += usize::from(found);
        found
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.eat(byte).then_some(())
    }

    /// JSON's whitespace: not form feed, which `is_ascii_whitespace` takes.
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
    }
}

/// How many bytes of `text` go by before a quote, a backslash or a control
/// character (all of it if none does). Message text is most of a chat
/// body, so this looks at eight bytes at a time.
fn plain_run(text: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte of `x` below `n` (n <= 0x80) sets its high bit here. Borrows
    // only run upward, so the lowest byte flagged is a true one.
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGH;
    let mut chunks = text.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let Ok(bytes) = <[u8; 8]>::try_from(chunk) else { break };
        let word = u64::from_le_bytes(bytes);
        let found =
            below(word ^ (ONES * u64::from(b'"')), 1) | below(word ^ (ONES * u64::from(b'\\')), 1) | below(word, 0x20);
        if found != 0 {
            return offset + (found.trailing_zeros() / 8) as usize;
        }
        offset += 8;
    }
    let rest = &text[offset..];
    offset + rest.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20).unwrap_or(rest.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_run_ends_at_the_first_quote_backslash_or_control_character() {
        // Every position in and past a word, every kind of end, and bytes
        // that look like ends to a careless bit trick (0x80+, 0x20, 0x21).
        for len in 0..20 {
            for end in [None, Some(b'"'), Some(b'\\'), Some(0x00), Some(0x1f), Some(b'\n')] {
                for at in 0..=len {
                    let mut text: Vec<u8> = (0..len).map(|i| [b'a', 0x80, 0xff, 0x20, 0x21, b'!'][i % 6]).collect();
                    if let Some(end) = end
                        && at < len
                    {
                        text[at] = end;
                        // A later end must not hide the first.
                        if at + 3 < len {
                            text[at + 3] = b'"';
                        }
                    }
                    let naive = text.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20).unwrap_or(text.len());
                    assert_eq!(plain_run(&text), naive, "{text:?}");
                }
            }
        }
    }
}
