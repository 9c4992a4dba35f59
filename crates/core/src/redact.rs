//! Cutting values out of messages: errors about config must never carry
//! config values (a Secret may have put them there) into logs, status,
//! Events or the admin view.

/// Values to cut out of every message about a resource (the Secret values
/// its declaration holds, or all of its config's strings): a plugin that
/// rejects its config, or a load error, may quote them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactions(Vec<String>);

impl std::fmt::Debug for Redactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactions({} values)", self.0.len())
    }
}

impl Redactions {
    /// Shorter values would cut ordinary words out of messages.
    const MIN_LEN: usize = 4;
    const MARK: &str = "[redacted]";

    /// `value` as it is, and as Rust and JSON would quote it in a message.
    pub fn add(&mut self, value: &str) {
        let debug = format!("{value:?}");
        let json = serde_json::to_string(value).unwrap_or_default();
        for form in [value, value.trim(), unquote(&debug), unquote(&json)] {
            if form.len() >= Self::MIN_LEN && !self.0.iter().any(|v| v == form) {
                self.0.push(form.to_string());
            }
        }
        // Longest first, so a value that holds another is cut whole.
        self.0.sort_by_key(|v| std::cmp::Reverse(v.len()));
    }

    /// Every string in a JSON value (not the keys: those are field names).
    pub fn add_strings(&mut self, value: &serde_json::Value) {
        match value {
            serde_json::Value::String(text) => self.add(text),
            serde_json::Value::Array(items) => items.iter().for_each(|v| self.add_strings(v)),
            serde_json::Value::Object(map) => map.values().for_each(|v| self.add_strings(v)),
            _ => {}
        }
    }

    /// `message` with every value replaced by `[redacted]`.
    pub fn apply(&self, message: &str) -> String {
        let mut message = message.to_string();
        for value in &self.0 {
            if message.contains(value.as_str()) {
                message = message.replace(value.as_str(), Self::MARK);
            }
        }
        message
    }
}

fn unquote(quoted: &str) -> &str {
    quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"')).unwrap_or(quoted)
}
