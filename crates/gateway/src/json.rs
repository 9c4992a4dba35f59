//! Reading one member out of a JSON document without building a tree of it,
//! refusing any object that names a member twice (`sluice_chat::check_members`),
//! and setting the `model` member of a body.

use bytes::Bytes;
use sluice_core::ApiError;

/// The body with its `model` set to `model`, every other byte as the
/// client (or the chain) wrote it.
pub(crate) fn rewrite_model(body: &Bytes, model: &str) -> Result<Bytes, ApiError> {
    // A plugin may have written the body: it must at least be JSON.
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map_err(|e| ApiError::internal(format!("the plugin chain left a body that is not JSON: {e}")))?;
    let model = serde_json::Value::from(model).to_string();
    Ok(sluice_chat::set_member(body, "model", &model).map_or_else(|| body.clone(), Bytes::from))
}

/// Any JSON value, checked as `serde_json::Value` checks it (every string
/// decoded, every number in range) and with no name twice in an object,
/// but not kept; with `KEEP`, a string is.
pub(crate) struct Checked<const KEEP: bool>(pub Option<String>);

impl<'de, const KEEP: bool> serde::Deserialize<'de> for Checked<KEEP> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Any<const KEEP: bool>;
        impl<'de, const KEEP: bool> serde::de::Visitor<'de> for Any<KEEP> {
            type Value = Checked<KEEP>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Checked<KEEP>, E> {
                Ok(Checked(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Checked<KEEP>, E> {
                Ok(Checked(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Checked<KEEP>, E> {
                Ok(Checked(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Checked<KEEP>, E> {
                Ok(Checked(None))
            }
            fn visit_str<E>(self, text: &str) -> Result<Checked<KEEP>, E> {
                Ok(Checked(KEEP.then(|| text.to_string())))
            }
            fn visit_unit<E>(self) -> Result<Checked<KEEP>, E> {
                Ok(Checked(None))
            }
            fn visit_none<E>(self) -> Result<Checked<KEEP>, E> {
                Ok(Checked(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked<KEEP>, A::Error> {
                while seq.next_element::<Checked<false>>()?.is_some() {}
                Ok(Checked(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked<KEEP>, A::Error> {
                sluice_chat::check_members(&mut map, |map, _| map.next_value::<Checked<false>>().map(drop))?;
                Ok(Checked(None))
            }
        }
        deserializer.deserialize_any(Any::<KEEP>)
    }
}
