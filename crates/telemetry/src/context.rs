//! The W3C trace context a request carries (`traceparent`), and the ids
//! of its spans: plain data, whatever the tracer does with it.

use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The W3C trace context of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    /// The gateway's server span.
    pub span_id: [u8; 8],
    /// The client's span, if it sent a `traceparent`.
    pub parent_span_id: Option<[u8; 8]>,
    pub sampled: bool,
}

impl TraceContext {
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The `traceparent` for a child span `span_id` of this request.
    pub fn traceparent(&self, span_id: [u8; 8]) -> String {
        format!("00-{}-{}-{:02x}", hex(&self.trace_id), hex(&span_id), u8::from(self.sampled))
    }
}

/// A `traceparent` header of version 00: trace id, parent id, sampled flag.
/// Anything else (all-zero ids, other lengths, upper-case hex) is not one.
pub fn parse_traceparent(value: &[u8]) -> Option<([u8; 16], [u8; 8], bool)> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let mut parts = text.split('-');
    let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four parts; a later version may add more.
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let trace_id: [u8; 16] = unhex(trace)?;
    let parent: [u8; 8] = unhex(parent)?;
    let [flags]: [u8; 1] = unhex(flags)?;
    if trace_id == [0; 16] || parent == [0; 8] {
        return None;
    }
    Some((trace_id, parent, flags & 1 == 1))
}

fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != N * 2 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[i * 2..i * 2 + 2], 16).ok()?;
    }
    Some(out)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Random enough for ids, and cheap: a per-process random key hashing a
/// counter.
pub(crate) fn random_u64() -> u64 {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    KEY.get_or_init(RandomState::new).hash_one(NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn new_span_id() -> [u8; 8] {
    loop {
        let id = random_u64().to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

pub(crate) fn new_trace_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&random_u64().to_be_bytes());
    id[8..].copy_from_slice(&new_span_id());
    id
}
