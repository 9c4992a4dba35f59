//! Keys as a store shared by replicas (Redis) names them.
//!
//! `sluice:{<namespace>/<plugin>}:c:<window>:<bucket>:<key>` for a counter,
//! `sluice:{<namespace>/<plugin>}:e:<key>` for an entry. The namespace and
//! plugin are escaped: every byte but ASCII letters, digits, `.`, `-` and
//! `_` becomes `%XX`. So neither holds `/`, `{`, `}` or `:`, and a key reads
//! back one way only: the scope runs from the first `{` to the first `}`,
//! split at its one `/`; then the kind; for a counter the window (`f60`,
//! `s60`, `m`) and the bucket, neither holding `:`; and the rest, whatever
//! it holds, is the plugin's key. Two different scopes, kinds, windows,
//! buckets or keys never make the same string.
//!
//! The braces are a Redis Cluster hash tag: the cluster hashes only what is
//! between the first `{` and the first `}` after it, here the escaped scope
//! and nothing else, so all of one plugin's keys are in one slot and a
//! script may touch several of them at once.

use std::fmt::Write;

use crate::{Scope, Window};

/// What a key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// A counter: one bucket of one window.
    Counter { window: Window, bucket: u64 },
    /// An entry (a value with a TTL).
    Entry,
}

/// The key a shared store keeps `key` of `scope` under (module docs).
pub fn redis_key(scope: &Scope, kind: KeyKind, key: &str) -> String {
    let mut out = String::with_capacity(24 + scope.namespace.len() + scope.plugin.len() + key.len());
    out.push_str("sluice:{");
    escape(&mut out, &scope.namespace);
    out.push('/');
    escape(&mut out, &scope.plugin);
    out.push('}');
    // Writing to a String does not fail.
    let _ = match kind {
        KeyKind::Counter { window: Window::Fixed { seconds }, bucket } => write!(out, ":c:f{seconds}:{bucket}:"),
        KeyKind::Counter { window: Window::Sliding { seconds }, bucket } => write!(out, ":c:s{seconds}:{bucket}:"),
        KeyKind::Counter { window: Window::CalendarMonth, bucket } => write!(out, ":c:m:{bucket}:"),
        KeyKind::Entry => write!(out, ":e:"),
    };
    out.push_str(key);
    out
}

/// Appends `part` with every byte outside `[A-Za-z0-9._-]` as `%XX`.
fn escape(out: &mut String, part: &str) {
    for byte in part.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b'_') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;

    /// What Redis Cluster hashes: between the first `{` and the first `}`
    /// after it.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').unwrap();
        let close = open + 1 + key[open + 1..].find('}').unwrap();
        &key[open + 1..close]
    }

    /// Names meant to collide if the parts were joined naively.
    const NAMES: &[&str] =
        &["", "a", "b", "c", "a/b", "b/c", "a}b", "{a", "}", "{", ":", "a:b", "%", "%2F", "/", "%2F%2F", "é", "sluice"];

    fn kinds() -> Vec<KeyKind> {
        let mut kinds = vec![KeyKind::Entry];
        for bucket in [0, 1, 12, 60, u64::MAX] {
            for window in [Window::Fixed { seconds: 1 }, Window::Fixed { seconds: 12 }, Window::Fixed { seconds: 60 }] {
                kinds.push(KeyKind::Counter { window, bucket });
            }
            kinds.push(KeyKind::Counter { window: Window::Sliding { seconds: 1 }, bucket });
            kinds.push(KeyKind::Counter { window: Window::Sliding { seconds: 60 }, bucket });
            kinds.push(KeyKind::Counter { window: Window::CalendarMonth, bucket });
        }
        kinds
    }

    /// Keys that try to look like other parts of the layout.
    const KEYS: &[&str] =
        &["", "k", ":k", "k:", "1:k", "f60:1:k", "c:f1:1:k", "e:k", "}:e:k", "{x}", "a/b", "%3A", "1", "60:1"];

    #[test]
    fn the_layout_is_as_documented() {
        let scope = Scope::new("team-a", "quota.v1");
        assert_eq!(redis_key(&scope, KeyKind::Entry, "cache:42"), "sluice:{team-a/quota.v1}:e:cache:42");
        let day = KeyKind::Counter { window: Window::Fixed { seconds: 86_400 }, bucket: 19_797 };
        assert_eq!(redis_key(&scope, day, "alice"), "sluice:{team-a/quota.v1}:c:f86400:19797:alice");
        let sliding = KeyKind::Counter { window: Window::Sliding { seconds: 60 }, bucket: 7 };
        assert_eq!(redis_key(&scope, sliding, "k"), "sluice:{team-a/quota.v1}:c:s60:7:k");
        let month = KeyKind::Counter { window: Window::CalendarMonth, bucket: 648 };
        assert_eq!(redis_key(&scope, month, "k"), "sluice:{team-a/quota.v1}:c:m:648:k");
        let odd = Scope::new("a/b", "c}{:é");
        assert_eq!(redis_key(&odd, KeyKind::Entry, "}"), "sluice:{a%2Fb/c%7D%7B%3A%C3%A9}:e:}");
    }

    #[test]
    fn no_two_scopes_kinds_or_keys_share_a_key() {
        let kinds = kinds();
        let mut made: HashMap<String, (&str, &str, KeyKind, &str)> = HashMap::new();
        for namespace in NAMES {
            for plugin in NAMES {
                let scope = Scope::new(*namespace, *plugin);
                for kind in &kinds {
                    // A key may be in both lists: the same inputs make the same key.
                    for key in KEYS.iter().chain(NAMES) {
                        let inputs = (*namespace, *plugin, *kind, *key);
                        let redis = redis_key(&scope, *kind, key);
                        if let Some(earlier) = made.insert(redis.clone(), inputs) {
                            assert_eq!(earlier, inputs, "both make {redis}");
                        }
                    }
                }
            }
        }
        assert!(made.len() > 250_000, "{}", made.len());
    }

    #[test]
    fn the_hash_tag_is_the_scope_alone() {
        let kinds = kinds();
        let mut tags = HashSet::new();
        for namespace in NAMES {
            for plugin in NAMES {
                let scope = Scope::new(*namespace, *plugin);
                let tag = hash_tag(&redis_key(&scope, KeyKind::Entry, "")).to_owned();
                assert!(!tag.contains(['{', '}', ':']), "{tag}");
                assert_eq!(tag.matches('/').count(), 1, "{tag}");
                // Every key of the scope, whatever it holds, hashes the same.
                for kind in &kinds {
                    for key in KEYS.iter().chain(NAMES) {
                        assert_eq!(hash_tag(&redis_key(&scope, *kind, key)), tag);
                    }
                }
                tags.insert(tag);
            }
        }
        assert_eq!(tags.len(), NAMES.len() * NAMES.len());
    }
}
