//! Token counting for plugins, natively in the host: a guest-side BPE would
//! cost megabytes per plugin and milliseconds per instantiation.

use tiktoken_rs::CoreBPE;
use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};

/// Tokens in `text` as `model` would count them. Models tiktoken does not
/// know (llama, mistral, …) are counted with cl100k, a close approximation
/// for budgeting.
pub fn count_tokens(model: &str, text: &str) -> u32 {
    let n = bpe_for(model).encode_ordinary(text).len();
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn bpe_for(model: &str) -> &'static CoreBPE {
    match get_tokenizer(model) {
        Some(Tokenizer::O200kBase | Tokenizer::O200kHarmony) => tiktoken_rs::o200k_base_singleton(),
        _ => tiktoken_rs::cl100k_base_singleton(),
    }
}

/// Load both encodings now, so the first request does not pay for it.
pub fn warm_up() {
    let _ = tiktoken_rs::o200k_base_singleton();
    let _ = tiktoken_rs::cl100k_base_singleton();
}

#[cfg(test)]
mod tests {
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
}
