//! No JSON object in a body names a member twice.
//!
//! JSON readers disagree on a duplicated key: serde_json's `Value` and most
//! upstreams keep the last value, this crate's scanners found the first,
//! and a strict serde struct (the plugin SDK's) refuses the object and so
//! reads no text from it. A plugin could then check one value while the
//! upstream reads another. Refusing such bodies, at any depth, before
//! anything reads them leaves every reader one value to pick.

use std::borrow::Cow;
use std::collections::HashSet;

use serde::de::{DeserializeSeed, Error, MapAccess, Visitor};

/// How a duplicate is worded: callers tell it from other errors by this
/// start (serde_json adds where it is).
pub const DUPLICATE_KEY: &str = "duplicate key ";

/// The message for a second `name` in one object.
pub fn duplicate_key(name: &str) -> String {
    format!("{DUPLICATE_KEY}{name:?}: a JSON object in the body names it twice")
}

/// Up to this many names, a new one is compared with each; past it, a set
/// keeps a huge object linear.
pub(crate) const LINEAR: usize = 16;

/// The member names seen so far in one object.
#[derive(Default)]
pub struct Names<'a> {
    names: Vec<Cow<'a, str>>,
    set: Option<HashSet<Cow<'a, str>>>,
}

impl<'a> Names<'a> {
    /// Adds `name`; false if the object had it already.
    pub fn insert(&mut self, name: Cow<'a, str>) -> bool {
        if let Some(set) = &mut self.set {
            return set.insert(name);
        }
        if self.names.contains(&name) {
            return false;
        }
        self.names.push(name);
        if self.names.len() > LINEAR {
            self.set = Some(self.names.drain(..).collect());
        }
        true
    }
}

/// A member name, borrowed from the text unless it has escapes.
pub struct Name<'de>(pub Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Name<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> Visitor<'de> for Text {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(text.to_owned())))
            }
            fn visit_string<E>(self, text: String) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(Text)
    }
}

/// The first name given twice in one object of `text` (JSON that serde_json
/// accepted), at any depth. For what plugins write, which may hold numbers
/// serde_json would not parse (`1e400`): its `IgnoredAny` check skips them,
/// a visitor could not.
pub(crate) fn first_duplicate(text: &[u8]) -> Option<String> {
    walk(text, 0)
}

/// serde_json's own nesting limit: JSON it accepted is no deeper.
const MAX_DEPTH: usize = 128;

fn walk(value: &[u8], depth: usize) -> Option<String> {
    if depth > MAX_DEPTH {
        return None;
    }
    let start = value.iter().position(|b| !b.is_ascii_whitespace())?;
    let value = &value[start..];
    match value.first()? {
        b'{' => {
            let members = crate::scan::members(value)?;
            let mut names = Names::default();
            for member in &members {
                if !names.insert(member.key.clone()) {
                    return Some(member.key.to_string());
                }
            }
            members.iter().find_map(|member| walk(&value[member.value.clone()], depth + 1))
        }
        b'[' => crate::scan::elements(value)?.into_iter().find_map(|span| walk(&value[span], depth + 1)),
        _ => None,
    }
}

/// Reads every member of `map`, each value by `value`, refusing a name
/// given twice; `value` is also how a caller keeps what it wants.
pub fn check_members<'de, A: MapAccess<'de>>(
    map: &mut A,
    mut value: impl FnMut(&mut A, &str) -> Result<(), A::Error>,
) -> Result<(), A::Error> {
    let mut names = Names::default();
    while let Some(Name(name)) = map.next_key_seed(NameSeed)? {
        if !names.insert(name.clone()) {
            return Err(A::Error::custom(duplicate_key(&name)));
        }
        value(map, &name)?;
    }
    Ok(())
}

struct NameSeed;

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Name<'de>;
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Name<'de>, D::Error> {
        serde::Deserialize::deserialize(deserializer)
    }
}
