//! Just enough of server-sent events to find whole events in a byte stream,
//! read their `data`, and write an event back with new data.

use bytes::{Buf, Bytes, BytesMut};

/// Splits a byte stream into whole events, each ending with its blank line.
#[derive(Default)]
pub struct EventSplitter {
    pending: BytesMut,
    /// How far `pending` has been searched for an event end, so a long event
    /// arriving in many small frames is not rescanned from the start.
    scanned: usize,
}

impl EventSplitter {
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// The next complete event, terminator included.
    pub fn next_event(&mut self) -> Option<Bytes> {
        let from = self.scanned.saturating_sub(3);
        match event_end(&self.pending[from..]) {
            Some(end) => {
                self.scanned = 0;
                Some(self.pending.split_to(from + end).freeze())
            }
            None => {
                self.scanned = self.pending.len();
                None
            }
        }
    }

    /// What is left when the stream ends: an event missing its blank line.
    pub fn remainder(&mut self) -> Option<Bytes> {
        self.scanned = 0;
        let rest = self.pending.split().freeze();
        (!rest.iter().all(u8::is_ascii_whitespace)).then_some(rest)
    }

    pub fn buffered(&self) -> usize {
        self.pending.remaining()
    }
}

/// The end (exclusive) of the first `\n\n` or `\r\n\r\n` in `bytes`.
fn event_end(bytes: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\n' {
            if bytes.get(i + 1) == Some(&b'\n') {
                return Some(i + 2);
            }
            if bytes.get(i + 1..i + 3) == Some(b"\r\n") {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

/// The event's `data` lines joined by `\n`, as the SSE spec assembles them;
/// `None` for an event with no data (a comment or keep-alive).
pub fn data_of(event: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(event);
    let mut data: Option<String> = None;
    for line in text.lines() {
        let value = match line.strip_prefix("data") {
            Some("") => "",
            Some(rest) if let Some(value) = rest.strip_prefix(':') => value.strip_prefix(' ').unwrap_or(value),
            _ => continue,
        };
        match &mut data {
            Some(joined) => {
                joined.push('\n');
                joined.push_str(value);
            }
            None => data = Some(value.to_string()),
        }
    }
    data
}

/// `event` with its data replaced by `data`; its other fields (`event:`,
/// `id:`, comments) are kept.
pub fn with_data(event: &[u8], data: &str) -> Bytes {
    let text = String::from_utf8_lossy(event);
    let mut out = String::with_capacity(event.len() + data.len());
    for line in text.lines().filter(|line| !line.is_empty() && !line.starts_with("data")) {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&data_event(data));
    Bytes::from(out)
}

/// A whole event carrying only `data`.
pub fn data_event(data: &str) -> String {
    let mut out = String::with_capacity(data.len() + 8);
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(chunks: &[&[u8]]) -> Vec<Bytes> {
        let mut splitter = EventSplitter::default();
        let mut events = Vec::new();
        for chunk in chunks {
            splitter.push(chunk);
            while let Some(event) = splitter.next_event() {
                events.push(event);
            }
        }
        events.extend(splitter.remainder());
        events
    }

    #[test]
    fn splits_events_across_and_within_frames() {
        let events = split_all(&[b"data: a\n", b"\ndata: b\n\nda", b"ta: c\r\n\r", b"\n", b"data: tail"]);
        let events: Vec<_> = events.iter().map(|e| String::from_utf8_lossy(e).into_owned()).collect();
        assert_eq!(events, ["data: a\n\n", "data: b\n\n", "data: c\r\n\r\n", "data: tail"]);
    }

    #[test]
    fn a_trailing_blank_remainder_is_not_an_event() {
        assert_eq!(split_all(&[b"data: a\n\n", b"\n"]).len(), 1);
    }

    #[test]
    fn reads_data_lines() {
        assert_eq!(data_of(b"data: {\"a\":1}\n\n").as_deref(), Some("{\"a\":1}"));
        assert_eq!(data_of(b"event: x\ndata:one\ndata: two\n\n").as_deref(), Some("one\ntwo"));
        assert_eq!(data_of(b": keep-alive\n\n"), None);
        assert_eq!(data_of(b"database: no\n\n"), None);
    }

    #[test]
    fn rewrites_data_keeping_other_fields() {
        let event = with_data(b"id: 7\ndata: old\ndata: more\n\n", "new\nlines");
        assert_eq!(&event[..], b"id: 7\ndata: new\ndata: lines\n\n");
    }
}
