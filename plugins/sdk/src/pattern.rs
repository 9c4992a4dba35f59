//! Model name patterns for per-model config: `gpt-4o` (exact), `gpt-4o*`
//! (prefix), `*-mini` or `llama-*-instruct` (glob), `*` (anything).

use serde::{Deserialize, Deserializer};

/// A model name, or a glob where `*` matches any run of characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPattern(String);

impl ModelPattern {
    pub fn new(pattern: &str) -> ModelPattern {
        ModelPattern(pattern.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, model: &str) -> bool {
        glob_match(self.0.as_bytes(), model.as_bytes())
    }

    /// How specific the pattern is: an exact name beats every glob, and a
    /// glob with more literal characters beats one with fewer.
    fn specificity(&self) -> usize {
        if self.0.contains('*') { self.0.bytes().filter(|&b| b != b'*').count() } else { usize::MAX }
    }

    /// The value of the most specific pattern matching `model`; ties go to
    /// the first listed.
    pub fn best_match<'a, T>(entries: impl IntoIterator<Item = (&'a ModelPattern, T)>, model: &str) -> Option<T> {
        let mut best: Option<(usize, T)> = None;
        for (pattern, value) in entries {
            if pattern.matches(model) && best.as_ref().is_none_or(|(s, _)| pattern.specificity() > *s) {
                best = Some((pattern.specificity(), value));
            }
        }
        best.map(|(_, value)| value)
    }
}

impl<'de> Deserialize<'de> for ModelPattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ModelPattern, D::Error> {
        let pattern = String::deserialize(deserializer)?;
        if pattern.is_empty() {
            return Err(serde::de::Error::custom("a model pattern cannot be empty"));
        }
        Ok(ModelPattern(pattern))
    }
}

/// Iterative glob match with `*` only: linear in practice, no recursion.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where the last `*` was, and the text position it currently covers up to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            // Let the last `*` swallow one more character.
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_expected() {
        let cases = [
            ("gpt-4o", "gpt-4o", true),
            ("gpt-4o", "gpt-4o-mini", false),
            ("gpt-4o*", "gpt-4o-mini", true),
            ("gpt-4o*", "gpt-4", false),
            ("*-mini", "gpt-4o-mini", true),
            ("llama-*-instruct", "llama-3.1-8b-instruct", true),
            ("llama-*-instruct", "llama-3.1-8b", false),
            ("*", "", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
        ];
        for (pattern, model, expected) in cases {
            assert_eq!(ModelPattern::new(pattern).matches(model), expected, "{pattern} vs {model}");
        }
    }

    #[test]
    fn the_most_specific_pattern_wins() {
        let entries = [
            (ModelPattern::new("*"), 1),
            (ModelPattern::new("gpt-4o*"), 2),
            (ModelPattern::new("gpt-4o-mini"), 3),
            (ModelPattern::new("gpt-*"), 4),
        ];
        let best = |model| ModelPattern::best_match(entries.iter().map(|(p, v)| (p, *v)), model);
        assert_eq!(best("gpt-4o-mini"), Some(3));
        assert_eq!(best("gpt-4o-2024"), Some(2));
        assert_eq!(best("gpt-3.5"), Some(4));
        assert_eq!(best("llama"), Some(1));
        let none: [(ModelPattern, i32); 0] = [];
        assert_eq!(ModelPattern::best_match(none.iter().map(|(p, v)| (p, *v)), "x"), None);
    }
}
