//! A BPE that only counts: tiktoken's pre-tokenizer and merge loop over
//! rank tables that build.rs lays out and the binary embeds. No decoder,
//! no token vectors, nothing parsed at start-up and nothing on the heap
//! but the two pre-tokenizer regexes.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::LazyLock;

use regex::Regex;

use super::hash;

type Rank = u32;

/// tiktoken's cl100k_base pattern, but for its lookahead (see
/// [`Encoding::pieces`]) and possessive quantifiers, which the regex crate
/// lacks. Possessive or greedy, each matches the same here: what follows
/// them can never match what they gave back.
const CL100K_PATTERN: &str = concat!(
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s+$|\s*[\r\n]|\s+",
);

/// tiktoken's o200k_base pattern, but for its lookahead.
const O200K_PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+",
);

pub static CL100K_BASE: Encoding = Encoding {
    ranks: Ranks::new(
        include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.bytes")),
        include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.offsets")),
        include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.table")),
    ),
    pattern: LazyLock::new(|| compile(CL100K_PATTERN)),
};

pub static O200K_BASE: Encoding = Encoding {
    ranks: Ranks::new(
        include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.bytes")),
        include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.offsets")),
        include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.table")),
    ),
    pattern: LazyLock::new(|| compile(O200K_PATTERN)),
};

fn compile(pattern: &str) -> Regex {
    // A constant pattern, compiled by the tests.
    Regex::new(pattern).expect("a valid pre-tokenizer pattern")
}

pub struct Encoding {
    ranks: Ranks,
    pattern: LazyLock<Regex>,
}

impl Encoding {
    /// Compiles the pre-tokenizer now rather than on first use.
    pub fn warm_up(&self) {
        LazyLock::force(&self.pattern);
    }

    /// Tokens in `text`: tiktoken's `encode_ordinary(text).len()`.
    pub fn count(&self, text: &str) -> usize {
        let mut parts = Vec::new();
        self.pieces(text).map(|piece| self.count_piece(piece.as_bytes(), &mut parts)).sum()
    }

    /// The pre-tokenizer's pieces of `text`. tiktoken's patterns end in
    /// `\s+(?!\S)|\s`: a run of two whitespace characters or more followed
    /// by a non-space leaves its last one to the next piece (` word`). Ours
    /// end in `\s+`, and that character is given back here.
    pub fn pieces<'t>(&self, text: &'t str) -> impl Iterator<Item = &'t str> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let found = self.pattern.find_at(text, at)?;
            let mut end = found.end();
            let mut chars = found.as_str().chars();
            // Only a match of that `\s+` ends in whitespace other than a
            // newline (`\s+$` in cl100k's does too, at the end of text).
            if end < text.len()
                && let Some(last) = chars.next_back()
                && last.is_whitespace()
                && !matches!(last, '\r' | '\n')
                && !chars.as_str().is_empty()
            {
                end -= last.len_utf8();
            }
            at = end;
            // Every alternative matches a character at least: never stuck.
            (end > found.start()).then(|| &text[found.start()..end])
        })
    }

    /// Tokens in one piece: tiktoken's `byte_pair_encode(piece).len()`.
    fn count_piece(&self, piece: &[u8], parts: &mut Vec<(usize, Rank)>) -> usize {
        if piece.is_empty() {
            0
        } else if piece.len() == 1 || self.ranks.get(piece).is_some() {
            // Every byte is a token.
            1
        } else if piece.len() < 100 {
            self.merge(piece, parts)
        } else {
            self.merge_large(piece)
        }
    }

    fn rank(&self, bytes: &[u8]) -> Rank {
        self.ranks.get(bytes).unwrap_or(Rank::MAX)
    }

    /// tiktoken's `_byte_pair_merge`, counting the parts: O(n·m) for n
    /// bytes and m merges, fast for short pieces. `parts` holds
    /// (start, rank of the pair starting there).
    fn merge(&self, piece: &[u8], parts: &mut Vec<(usize, Rank)>) -> usize {
        parts.clear();
        let mut min_rank = (Rank::MAX, usize::MAX);
        for i in 0..piece.len() - 1 {
            let rank = self.rank(&piece[i..i + 2]);
            if rank < min_rank.0 {
                min_rank = (rank, i);
            }
            parts.push((i, rank));
        }
        parts.push((piece.len() - 1, Rank::MAX));
        parts.push((piece.len(), Rank::MAX));

        // The rank of part `i` merged with the next, once that one has
        // absorbed the part after it (not yet removed: hence `i + 3`).
        let rank_after_merge = |parts: &[(usize, Rank)], i: usize| {
            if i + 3 < parts.len() { self.rank(&piece[parts[i].0..parts[i + 3].0]) } else { Rank::MAX }
        };
        while min_rank.0 != Rank::MAX {
            let i = min_rank.1;
            if i > 0 {
                parts[i - 1].1 = rank_after_merge(parts, i - 1);
            }
            parts[i].1 = rank_after_merge(parts, i);
            parts.remove(i + 1);

            min_rank = (Rank::MAX, usize::MAX);
            for (i, &(_, rank)) in parts[..parts.len() - 1].iter().enumerate() {
                if rank < min_rank.0 {
                    min_rank = (rank, i);
                }
            }
        }
        parts.len() - 1
    }

    /// tiktoken's `_byte_pair_merge_large`, counting the tokens: the same
    /// merges in O(m log n), with a heap of candidate merges.
    fn merge_large(&self, piece: &[u8]) -> usize {
        // The token starting at byte i (if one does) ends at `end`, follows
        // the one at `prev`, and would merge with the next into
        // `i..next_end` at `next_rank`.
        struct State {
            prev: usize,
            end: usize,
            next_end: usize,
            next_rank: Rank,
        }
        let mut state = Vec::with_capacity(piece.len());
        state.push(State { prev: usize::MAX, end: 1, next_end: 2, next_rank: Rank::MAX });
        let mut heap = BinaryHeap::with_capacity(piece.len());
        for i in 0..piece.len() - 1 {
            if let Some(rank) = self.ranks.get(&piece[i..i + 2]) {
                heap.push(Merge { start: i, rank });
                state[i].next_rank = rank;
            }
            state.push(State { prev: i, end: i + 2, next_end: i + 3, next_rank: Rank::MAX });
        }

        let potential_merge = |state: &mut [State], heap: &mut BinaryHeap<Merge>, start: usize, next_end: usize| {
            state[start].next_end = next_end;
            state[start].next_rank = Rank::MAX;
            if next_end <= piece.len()
                && let Some(rank) = self.ranks.get(&piece[start..next_end])
            {
                heap.push(Merge { start, rank });
                state[start].next_rank = rank;
            }
        };

        while let Some(left) = heap.pop() {
            if left.rank == Rank::MAX {
                break;
            }
            if left.rank != state[left.start].next_rank {
                continue; // This merge was invalidated.
            }
            let left_start = left.start;
            let right_start = state[left_start].end;
            let right_end = state[left_start].next_end;
            let right_next_end = state[right_start].next_end;

            state[left_start].end = right_end;
            potential_merge(&mut state, &mut heap, left_start, right_next_end);
            if right_end < state.len() {
                state[right_end].prev = left_start;
            }
            if left_start > 0 {
                let prev_start = state[left_start].prev;
                potential_merge(&mut state, &mut heap, prev_start, right_end);
            }
            state[right_start].next_rank = Rank::MAX;
        }

        let mut tokens = 0;
        let mut i = 0;
        while i < state.len() {
            tokens += 1;
            i = state[i].end;
        }
        tokens
    }
}

/// A candidate merge in [`Encoding::merge_large`]'s heap: lowest rank
/// first, then leftmost.
#[derive(PartialEq, Eq)]
struct Merge {
    start: usize,
    rank: Rank,
}

impl Ord for Merge {
    fn cmp(&self, other: &Self) -> Ordering {
        other.rank.cmp(&self.rank).then_with(|| other.start.cmp(&self.start))
    }
}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The rank of each token's bytes, in the binary's read-only data. See
/// build.rs for the layout.
struct Ranks {
    bytes: &'static [u8],
    offsets: &'static [[u8; 4]],
    table: &'static [[u8; 4]],
}

impl Ranks {
    const fn new(bytes: &'static [u8], offsets: &'static [u8], table: &'static [u8]) -> Self {
        Self { bytes, offsets: offsets.as_chunks().0, table: table.as_chunks().0 }
    }

    fn get(&self, bytes: &[u8]) -> Option<Rank> {
        let hash = hash::hash(bytes);
        let mask = self.table.len() - 1; // a power of two
        let mut i = hash::home(hash, self.table.len().trailing_zeros());
        loop {
            let slot = u32::from_le_bytes(self.table[i]);
            if slot == hash::EMPTY {
                return None;
            }
            let rank = slot & hash::RANK_MASK;
            if hash::tag_matches(slot, hash) && self.token(rank) == bytes {
                return Some(rank);
            }
            // Never all full: build.rs leaves most slots empty.
            i = (i + 1) & mask;
        }
    }

    fn token(&self, rank: Rank) -> &'static [u8] {
        let offset = |rank: usize| self.offsets.get(rank).map_or(0, |o| u32::from_le_bytes(*o) as usize);
        let rank = rank as usize;
        self.bytes.get(offset(rank)..offset(rank + 1)).unwrap_or_default()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.offsets.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_is_found_at_its_rank() {
        // tiktoken-rs is the reference: these are its tables, laid out anew.
        for (ours, theirs) in
            [(&CL100K_BASE, tiktoken_rs::cl100k_base_singleton()), (&O200K_BASE, tiktoken_rs::o200k_base_singleton())]
        {
            assert!(ours.ranks.len() > 100_000, "{}", ours.ranks.len());
            for rank in 0..ours.ranks.len() as Rank {
                let token = theirs.decode_bytes(&[rank]).unwrap();
                assert_eq!(ours.ranks.token(rank), token);
                assert_eq!(ours.ranks.get(&token), Some(rank), "{token:?}");
            }
            assert!(theirs.decode_bytes(&[ours.ranks.len() as Rank]).is_err(), "no ordinary token past ours");
            for not_a_token in [&b""[..], b"\xff\xfe\xfd", b"sluice sluice sluice sluice"] {
                assert_eq!(ours.ranks.get(not_a_token), None);
            }
        }
    }
}
