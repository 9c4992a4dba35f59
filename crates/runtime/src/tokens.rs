//! Token counting for plugins, natively in the host: a guest-side BPE would
//! cost megabytes per plugin and milliseconds per instantiation.
//!
//! Its cost is bounded. BPE on one long run of letters without spaces is
//! super-linear (measured with random letters on one core: ~25 ms for
//! 0.1 MB, ~0.5-0.7 s for 1 MB, ~4-6 s for 4 MB; n^1.4 or so, not quadratic),
//! while prose costs ~0.15 s per MB. So:
//! - text is counted in chunks of at most 64 KiB, cut before a space that
//!   follows a printable ASCII character, where no BPE piece can span the cut
//!   (exact); a longer run without such a space is cut at a character
//!   boundary (off by about one token per cut). Counting is then linear,
//!   and it stops between chunks once the caller's deadline has passed;
//! - at most [`MAX_COUNTED_BYTES`] are counted; the tokens of the rest are
//!   estimated at the rate of the counted part.

use std::time::Instant;

use tiktoken_rs::CoreBPE;
use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};

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
    count_in_chunks(bpe_for(model), text, CHUNK_BYTES, deadline)
}

fn count_in_chunks(bpe: &CoreBPE, text: &str, chunk_bytes: usize, deadline: Option<Instant>) -> Option<u32> {
    let counted = &text[..text.floor_char_boundary(MAX_COUNTED_BYTES)];
    let mut tokens = 0u64;
    for chunk in chunks(counted, chunk_bytes) {
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return None;
        }
        tokens += bpe.encode_ordinary(chunk).len() as u64;
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

fn bpe_for(model: &str) -> &'static CoreBPE {
    match get_tokenizer(model) {
        Some(Tokenizer::O200kBase | Tokenizer::O200kHarmony) => tiktoken_rs::o200k_base_singleton(),
        _ => tiktoken_rs::cl100k_base_singleton(),
    }
}

/// Load both encodings now, so the first request does not pay for it.
/// Parsing o200k takes about 140 ms and cl100k about 50: side by side, a
/// plugin that counts tokens is ready in the time of the first.
pub fn warm_up() {
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let _ = tiktoken_rs::cl100k_base_singleton();
        });
        let _ = tiktoken_rs::o200k_base_singleton();
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn counts_with_the_model_family_encoding() {
        // Reference counts from OpenAI's tiktoken.
        assert_eq!(count_tokens("gpt-4", "hello world"), 2);
        assert_eq!(count_tokens("gpt-4o", "hello world"), 2);
        assert_eq!(count_tokens("gpt-4o-mini", ""), 0);
        let text = "Sluice trims context to fit the model's window.";
        assert!(count_tokens("llama3", text) > 5);
        assert_ne!(
            tiktoken_rs::cl100k_base_singleton().encode_ordinary("こんにちは世界、元気ですか"),
            tiktoken_rs::o200k_base_singleton().encode_ordinary("こんにちは世界、元気ですか"),
            "the two encodings differ, so choosing by model matters"
        );
    }

    /// Prose with punctuation, digits, runs of spaces, newlines, tabs and
    /// non-ASCII text: every kind of pre-tokenizer piece.
    fn mixed_text() -> String {
        let parts = [
            "The river's 12345 sluices   open at 6:30. ",
            "Don't stop!\n\n",
            "  indented\tcode = f(x, y);  ",
            "naïve café — 東京は晴れ。 ",
            "URL: https://example.com/a?b=c ",
            "ALLCAPS and MixedCase words ",
            "\r\n",
        ];
        (0..400).map(|i| parts[(i * 7) % parts.len()]).collect()
    }

    /// Plugins rely on it (context-trim skips counting when the bytes fit).
    #[test]
    fn never_more_tokens_than_bytes() {
        let texts = [mixed_text(), random_letters(5_000), "🦀 ".repeat(300), "\u{0}\u{7f}é".repeat(500)];
        for text in &texts {
            for end in [1, 2, 3, 64, text.len()] {
                let text = &text[..text.floor_char_boundary(end)];
                for model in ["gpt-4", "gpt-4o", "llama3"] {
                    let tokens = count_tokens(model, text) as usize;
                    assert!(tokens <= text.len(), "{model}: {tokens} tokens in {} bytes", text.len());
                }
            }
        }
    }

    #[test]
    fn counting_in_chunks_cut_before_spaces_is_exact() {
        let text = mixed_text();
        for bpe in [tiktoken_rs::cl100k_base_singleton(), tiktoken_rs::o200k_base_singleton()] {
            let whole = bpe.encode_ordinary(&text).len() as u32;
            for chunk in [16, 50, 100, 1000] {
                assert_eq!(count_in_chunks(bpe, &text, chunk, None), Some(whole), "chunks of {chunk} bytes");
            }
        }
    }

    #[test]
    fn chunks_cover_the_text_and_respect_their_size() {
        let text = format!("{}{}", "é".repeat(100), mixed_text());
        let pieces: Vec<&str> = chunks(&text, 33).collect();
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| !p.is_empty() && p.len() <= 33), "{pieces:?}");
        // A character longer than the chunk size still makes progress.
        assert_eq!(chunks("日本", 1).collect::<Vec<_>>(), ["日", "本"]);
    }

    fn random_letters(n: usize) -> String {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from(b'a' + (seed % 26) as u8)
            })
            .collect()
    }

    #[test]
    fn a_long_run_without_spaces_is_counted_closely() {
        let text = random_letters(300_000);
        let bpe = tiktoken_rs::cl100k_base_singleton();
        let whole = bpe.encode_ordinary(&text).len() as i64;
        let chunked = count_in_chunks(bpe, &text, CHUNK_BYTES, None).unwrap() as i64;
        // About one token per cut: five cuts.
        assert!((whole - chunked).abs() <= 10, "whole {whole}, in chunks {chunked}");
    }

    #[test]
    fn text_past_the_cap_is_estimated_not_counted() {
        let text = "word ".repeat(MAX_COUNTED_BYTES); // 5 MiB, one token per word
        warm_up();
        let started = Instant::now();
        let estimate = count_tokens("gpt-4", &text) as usize;
        // Exact would be MAX_COUNTED_BYTES; the estimate is within a token
        // per counted MiB of it.
        assert!(estimate.abs_diff(MAX_COUNTED_BYTES) <= 8, "{estimate}");
        let took = started.elapsed();
        let one_mib = Instant::now();
        count_tokens("gpt-4", &text[..MAX_COUNTED_BYTES]);
        // Counting 5 MiB costs what counting 1 MiB does (generous slack for
        // a shared machine).
        assert!(took < one_mib.elapsed() * 3 + Duration::from_millis(50), "{took:?}");
    }

    #[test]
    fn counting_stops_at_the_deadline() {
        let text = random_letters(MAX_COUNTED_BYTES);
        warm_up();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(20);
        assert_eq!(count_tokens_until("gpt-4", &text, Some(deadline)), None);
        // One 64 KiB chunk past the deadline at most.
        let took = started.elapsed();
        assert!(took < Duration::from_millis(250), "stopped after {took:?}");
        assert_eq!(count_tokens_until("gpt-4", "hello world", Some(Instant::now() + Duration::from_secs(5))), Some(2));
    }
}
