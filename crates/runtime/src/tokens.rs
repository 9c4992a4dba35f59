//! Token counting for plugins, natively in the host: a guest-side BPE would
//! cost megabytes per plugin and milliseconds per instantiation.
//!
//! The BPE is our own and only counts ([`bpe`]): tiktoken's pre-tokenizer
//! and merge loop over cl100k's and o200k's ranks, which build.rs takes
//! from tiktoken-rs and lays out for the binary to embed. Counts equal
//! tiktoken's; loading is compiling two regexes (a few ms), and the tables
//! stay in read-only data (6 MiB for both, paged in as used) rather than
//! tens of MiB of heap.
//!
//! Its cost is bounded. BPE on one long run of letters without spaces is
//! super-linear (measured with random letters on one core: ~25 ms for
//! 0.1 MB, ~0.5-0.7 s for 1 MB, ~4-6 s for 4 MB; n^1.4 or so, not quadratic),
//! while prose costs ~20 ms per MB. So:
//! - text is counted in chunks of at most 64 KiB, cut before a space that
//!   follows a printable ASCII character, where no BPE piece can span the cut
//!   (exact); a longer run without such a space is cut at a character
//!   boundary (off by about one token per cut). Counting is then linear,
//!   and it stops between chunks once the caller's deadline has passed;
//! - at most [`MAX_COUNTED_BYTES`] are counted; the tokens of the rest are
//!   estimated at the rate of the counted part.

mod bpe;
mod hash;

use std::time::Instant;

use bpe::{CL100K_BASE, Encoding, O200K_BASE};

/// Text past this many bytes is not counted but estimated.
pub const MAX_COUNTED_BYTES: usize = 1 << 20;

/// The most text encoded in one go.
const CHUNK_BYTES: usize = 64 << 10;

/// Tokens in `text` as `model` would count them. Models tiktoken does not
/// know (llama, mistral, …) are counted with cl100k, a close approximation
/// for budgeting. Past [`MAX_COUNTED_BYTES`], an estimate.
pub fn count_tokens(model: &str, text: &str) -> u32 {
    count_tokens_until(model, text, None).unwrap_or(u32::MAX)
}

/// [`count_tokens`], or `None` once `deadline` has passed.
pub fn count_tokens_until(model: &str, text: &str, deadline: Option<Instant>) -> Option<u32> {
    count_in_chunks(encoding_for(model), text, CHUNK_BYTES, deadline)
}

fn count_in_chunks(encoding: &Encoding, text: &str, chunk_bytes: usize, deadline: Option<Instant>) -> Option<u32> {
    let counted = &text[..text.floor_char_boundary(MAX_COUNTED_BYTES)];
    let mut tokens = 0u64;
    for chunk in chunks(counted, chunk_bytes) {
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return None;
        }
        tokens += encoding.count(chunk) as u64;
    }
    if !counted.is_empty() && counted.len() < text.len() {
        // At most 2^20 tokens times at most 2^32 bytes: no overflow.
        tokens = tokens * text.len() as u64 / counted.len() as u64;
    }
    Some(u32::try_from(tokens).unwrap_or(u32::MAX))
}

/// `text` in pieces of at most `max` bytes (or one character, if longer).
fn chunks(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (chunk, tail) = rest.split_at(cut_point(rest, max));
        rest = tail;
        Some(chunk)
    })
}

/// Where a chunk of at most `max` bytes of `text` ends: before the last
/// space that follows a printable ASCII character, since neither cl100k's
/// nor o200k's pre-tokenizer joins the two in one piece; else at the last
/// character boundary.
fn cut_point(text: &str, max: usize) -> usize {
    if text.len() <= max {
        return text.len();
    }
    let bytes = text.as_bytes();
    let exact = (1..=max).rev().find(|&i| bytes[i] == b' ' && bytes[i - 1].is_ascii_graphic());
    // A character longer than `max` is one chunk of its own.
    exact.unwrap_or_else(|| text.floor_char_boundary(max).max(text.ceil_char_boundary(1)))
}

/// The encoding of `model`'s family: tiktoken's table of models (as of
/// tiktoken-rs 0.12), of which only the o200k ones matter here.
fn encoding_for(model: &str) -> &'static Encoding {
    const MODELS: [&str; 6] = ["o1", "o3", "o4-mini", "gpt-5", "gpt-4.1", "gpt-4o"];
    const PREFIXES: [&str; 10] =
        ["o1-", "o3-", "o4-mini-", "gpt-5", "gpt-4.5-", "gpt-4.1-", "chatgpt-4o-", "gpt-4o-", "gpt-oss-", "codex-mini"];
    // A fine-tuned model, `ft:<base>:<org>:...`, counts as its base.
    let model = model.strip_prefix("ft:").map_or(model, |rest| rest.split(':').next().unwrap_or(rest));
    if MODELS.contains(&model) || PREFIXES.iter().any(|prefix| model.starts_with(prefix)) {
        &O200K_BASE
    } else {
        &CL100K_BASE
    }
}

/// Compile both pre-tokenizers now, so the first request does not pay for
/// it. The ranks need no loading: they are in the binary.
pub fn warm_up() {
    CL100K_BASE.warm_up();
    O200K_BASE.warm_up();
}

#[cfg(test)]
mod tests;
