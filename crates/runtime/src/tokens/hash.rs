//! Where a token's bytes live in the rank table: shared by build.rs, which
//! lays the table out, and by the lookups, which must agree with it.
//!
//! The table has a power of two of `u32` slots, at most about 40% full,
//! probed linearly from a home slot. A slot is [`EMPTY`] or a token's rank
//! in its low [`RANK_BITS`] bits under a tag of its hash, which skips most
//! byte comparisons with other tokens.

/// Bits of a slot holding the rank: o200k has 199,998 ordinary tokens.
pub const RANK_BITS: u32 = 18;

pub const RANK_MASK: u32 = (1 << RANK_BITS) - 1;

/// A free slot. Its rank bits would be `RANK_MASK`, not a valid rank.
pub const EMPTY: u32 = u32::MAX;

/// A 64-bit hash of `bytes`, all bits mixed: the home slot comes from
/// the high bits, the tag from the low ones.
pub fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0xf135_7aea_2e62_a9c5;
    let mut h = bytes.len() as u64;
    let (words, tail) = bytes.as_chunks::<8>();
    for word in words {
        h = (h ^ u64::from_le_bytes(*word)).wrapping_mul(K);
    }
    if !tail.is_empty() {
        h = (h ^ short(tail)).wrapping_mul(K);
    }
    // The finalizer of MurmurHash3.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// 1 to 7 `bytes` in a word, without a loop or a copy. Every byte is
/// read at least once, so tails of one length differ in their words.
fn short(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    if n >= 4 {
        let first = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let last = u32::from_le_bytes([bytes[n - 4], bytes[n - 3], bytes[n - 2], bytes[n - 1]]);
        u64::from(first) | (u64::from(last) << 32)
    } else {
        u64::from(bytes[0]) | (u64::from(bytes[n / 2]) << 8) | (u64::from(bytes[n - 1]) << 16)
    }
}

/// The first slot to probe in a table of `1 << bits` slots.
pub fn home(hash: u64, bits: u32) -> usize {
    (hash >> (64 - bits)) as usize
}

/// The slot of the token of `rank` whose bytes hash to `hash`.
pub fn slot(hash: u64, rank: u32) -> u32 {
    ((hash as u32) << RANK_BITS) | rank
}

/// Whether `slot` may hold the token whose bytes hash to `hash`.
pub fn tag_matches(slot: u32, hash: u64) -> bool {
    (slot ^ self::slot(hash, 0)) >> RANK_BITS == 0
}
