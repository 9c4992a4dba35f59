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
        count_tokens("gpt-4", "こんにちは世界、元気ですか"),
        count_tokens("gpt-4o", "こんにちは世界、元気ですか"),
        "the two encodings differ, so choosing by model matters"
    );
}

#[test]
fn models_map_to_tiktokens_encodings() {
    use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};
    let models = concat!(
        "gpt-4|gpt-4-0314|gpt-4-32k|gpt-4o|gpt-4o-mini|gpt-4o-2024-05-13|chatgpt-4o-latest|gpt-4.1|gpt-4.1-mini|",
        "gpt-4.5-preview|gpt-5|gpt-5-mini|gpt-5.2-codex|gpt-6|o1|o1-mini|o1-preview|o3|o3-mini|o4-mini|o4-mini-high|",
        "o4|gpt-oss-20b|gpt-oss|codex-mini-latest|gpt-3.5-turbo|gpt-35-turbo-16k|text-embedding-3-small|davinci|gpt2|",
        "ft:gpt-4o:acme::abc123|ft:gpt-4o-mini-2024-07-18:acme|ft:gpt-3.5-turbo:acme|ft:|ft:ft:gpt-4o|",
        "llama3|mistral-large|claude-3-opus||GPT-4O| gpt-4o",
    );
    for model in models.split('|') {
        let o200k = matches!(get_tokenizer(model), Some(Tokenizer::O200kBase | Tokenizer::O200kHarmony));
        assert_eq!(std::ptr::eq(encoding_for(model), &O200K_BASE), o200k, "{model}");
    }
}

/// tiktoken-rs's count of `text`, the reference.
fn tiktoken_count(encoding: &Encoding, text: &str) -> usize {
    let theirs = if std::ptr::eq(encoding, &O200K_BASE) {
        tiktoken_rs::o200k_base_singleton()
    } else {
        tiktoken_rs::cl100k_base_singleton()
    };
    theirs.encode_ordinary(text).len()
}

/// tiktoken-rs's pre-tokenizer pieces of `text`, the reference.
fn tiktoken_pieces<'t>(encoding: &Encoding, text: &'t str) -> Vec<&'t str> {
    use std::sync::LazyLock;
    // Not exported by tiktoken-rs; copied from its `cl100k_base()`.
    const CL100K: &str = concat!(
        r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+",
        r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
    );
    static THEIRS: LazyLock<[fancy_regex::Regex; 2]> = LazyLock::new(|| {
        [CL100K, tiktoken_rs::O200K_BASE_PAT_STR].map(|pattern| fancy_regex::Regex::new(pattern).unwrap())
    });
    let regex = &THEIRS[usize::from(std::ptr::eq(encoding, &O200K_BASE))];
    regex.find_iter(text).map(|piece| piece.unwrap().as_str()).collect()
}

fn assert_counts_like_tiktoken(text: &str) {
    for encoding in [&CL100K_BASE, &O200K_BASE] {
        let name = if std::ptr::eq(encoding, &O200K_BASE) { "o200k" } else { "cl100k" };
        let pieces: Vec<&str> = encoding.pieces(text).collect();
        assert_eq!(pieces, tiktoken_pieces(encoding, text), "{name}: pieces of {text:?}");
        assert_eq!(encoding.count(text), tiktoken_count(encoding, text), "{name}: tokens in {text:?}");
    }
}

#[test]
fn counts_like_tiktoken_on_varied_text() {
    let texts = [
        mixed_text(),
        random_letters(5_000),
        random_letters(150).to_uppercase(), // a piece over 100 bytes: the heap merge
        "naïve café — 東京は晴れ。 Ünïcödé ÀÉÎÕÜ Straße ΑΒΓ αβγ Привет мир".into(),
        "안녕하세요 세계 مرحبا بالعالم नमस्ते दुनिया สวัสดีชาวโลก עברית".into(),
        "🦀 ".repeat(300),
        "🦀🦀🦀👨‍👩‍👧‍👦🏳️‍🌈🇫🇷👍🏽 ok👌!".into(),
        "a  b   c    d\t\t e \n\n  \r\n   f   ".into(),
        " \u{a0}\u{3000}x\u{2028}y \u{85} z\u{b}\u{c}\u{1680} ".into(),
        "    ".into(),
        "\n\n\n \r\r\n\t".into(),
        "end   ".into(),
        "1234567890 3.14159 1,000,000 -42 0x1F 2024-06-01 ١٢٣٤٥ Ⅻ ½ 99999999".into(),
        "fn main() {\n    let x: Vec<u8> = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n".into(),
        r#"{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}"#.into(),
        "I'll you've they're He'S WE'RE it's 'tis don't O'Neil rock'n'roll ''".into(),
        "XMLHttpRequest getElementById ABCdef camelCase snake_case SCREAMING_CASE ǅemal ʰa".into(),
        "\u{0}\u{7f}é".repeat(500),
        "=".repeat(200),
        "!?".repeat(120) + "\n\n",
        "e\u{301}\u{301}\u{301} a\u{fe0f} \u{200b}\u{200d} x".into(),
        String::new(),
    ];
    for text in &texts {
        assert_counts_like_tiktoken(text);
    }
}

#[test]
fn counts_like_tiktoken_on_random_strings() {
    // Letters of each case and script, marks, digits of several kinds,
    // every kind of whitespace, apostrophes, punctuation, emoji.
    let alphabet: Vec<char> = concat!(
        "aeszAEZ07  \t\n\r'''st.,!-/_éÉßǅʰ\u{301}東京の한ب٣Ⅻ½",
        "\u{a0}\u{3000}\u{2028}\u{85}\u{b}\u{200b}\u{200d}🦀👍\u{1f3fb}\u{fe0f}\u{0}\u{7f}"
    )
    .chars()
    .collect();
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    for i in 0..3_000 {
        // Mostly short strings; some long, from a few letters, so that
        // pieces run past 100 bytes.
        let (len, letters) = if i % 20 == 0 { (100 + next(300), 6) } else { (next(40), alphabet.len()) };
        let text: String = (0..len).map(|_| alphabet[next(letters)]).collect();
        assert_counts_like_tiktoken(&text);
    }
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
    for encoding in [&CL100K_BASE, &O200K_BASE] {
        let whole = tiktoken_count(encoding, &text) as u32;
        for chunk in [16, 50, 100, 1000] {
            assert_eq!(count_in_chunks(encoding, &text, chunk, None), Some(whole), "chunks of {chunk} bytes");
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
    let whole = tiktoken_count(&CL100K_BASE, &text) as i64;
    let chunked = count_in_chunks(&CL100K_BASE, &text, CHUNK_BYTES, None).unwrap() as i64;
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
