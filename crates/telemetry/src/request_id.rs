//! Request ids: the client's `x-request-id` when it is a sensible one,
//! else a new one, unique across replicas and cheap to make.

use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The header that carries it, in and out.
pub const HEADER: &str = "x-request-id";

/// The longest id taken from a client; a longer one is replaced.
pub const MAX_LEN: usize = 128;

/// The client's id if it is 1 to [`MAX_LEN`] visible ASCII characters (it
/// goes into logs, spans and the upstream's headers as it is), else a new one.
pub fn request_id(from_client: Option<&[u8]>) -> Arc<str> {
    match from_client {
        Some(id) if (1..=MAX_LEN).contains(&id.len()) && id.iter().all(|b| b.is_ascii_graphic()) => {
            // Checked ASCII just above.
            Arc::from(std::str::from_utf8(id).unwrap_or_default())
        }
        _ => generate(),
    }
}

/// 32 hex digits: 64 random bits fixed per process, then a counter.
fn generate() -> Arc<str> {
    static PREFIX: LazyLock<u64> = LazyLock::new(crate::context::random_u64);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Written by hand: `format!` was a measurable share of a plain proxied
    // request.
    let mut id = [0u8; 32];
    id[..16].copy_from_slice(&hex(*PREFIX));
    id[16..].copy_from_slice(&hex(NEXT.fetch_add(1, Ordering::Relaxed)));
    Arc::from(std::str::from_utf8(&id).unwrap_or_default())
}

/// `value` as 16 lower-case hex digits.
fn hex(value: u64) -> [u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    std::array::from_fn(|i| DIGITS[(value >> (60 - 4 * i) & 0xf) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_sensible_client_ids_and_replaces_the_rest() {
        assert_eq!(&*request_id(Some(b"abc-123_X")), "abc-123_X");
        for bad in [&b""[..], b"has space", b"line\nbreak", "é".as_bytes(), &[b'a'; MAX_LEN + 1]] {
            let id = request_id(Some(bad));
            assert_eq!(id.len(), 32, "{bad:?} gave {id}");
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_ne!(request_id(None), request_id(None));
        assert_eq!(&hex(0x0123_4567_89ab_cdef), b"0123456789abcdef");
        assert_eq!(&hex(u64::MAX - 1), format!("{:016x}", u64::MAX - 1).as_bytes());
    }
}
