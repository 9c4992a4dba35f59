//! The request's calls that look a name up, read straight from the guest's
//! memory.
//!
//! The generated bindings lift every `string` argument into a new `String`:
//! with the chain's three plugins that was 18 of a request's 120
//! allocations, all for names that are only looked up. These definitions
//! shadow the generated ones for the same functions and do the same thing
//! through the same [`PluginRequest`] methods; a name is copied out of the
//! guest's memory onto the stack (the store's memory and its data cannot be
//! borrowed at once), and only a value that is kept becomes a `String`.

// Calls that need `unsafe`, each block with a SAFETY: comment saying why
// it is sound (clippy::undocumented_unsafe_blocks checks there is one).
#![allow(unsafe_code)]

use std::borrow::Cow;

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, WasmStr};

use crate::host::PluginState;
use crate::request::PluginRequest;

/// The interface whose `request` methods these are: the version the
/// bindings serve (`wit/plugin.wit`), to which components built for earlier
/// 0.3 versions link too. Any other name would define a second instance
/// beside the bindings' one, without the `request` resource.
const TYPES: &str = "sluice:plugin/types@0.3.3";

/// Names up to this long are copied onto the stack; longer ones (which are
/// rare and may be invalid) onto the heap.
const INLINE: usize = 128;

/// Defines these calls over the generated ones, which must be in `linker`
/// already.
pub(crate) fn add_to_linker(linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(TYPES)?;
    types.func_wrap("[method]request.header", lookup(|request, name| request.header(name)))?;
    types.func_wrap("[method]request.field", lookup(|request, name| request.body.field(name)))?;
    types.func_wrap("[method]request.remove-header", |mut store: Cx<'_>, (this, name): (This, WasmStr)| {
        let name = Name::copy(&name, &store)?;
        store.data_mut().request(&this)?.remove_header(name.as_str());
        Ok(())
    })?;
    types.func_wrap("[method]request.set-header", set(PluginRequest::set_header))?;
    types.func_wrap("[method]request.set-response-header", set(PluginRequest::set_response_header))?;
    linker.allow_shadowing(false);
    Ok(())
}

/// What the calls are given: the store, and the request the guest names.
type Cx<'a> = StoreContextMut<'a, PluginState>;
type This = Resource<PluginRequest>;

/// A call `(this, name) -> option<string>` that looks `name` up.
fn lookup(
    find: impl Fn(&mut PluginRequest, &str) -> Option<String> + Send + Sync + 'static,
) -> impl Fn(Cx<'_>, (This, WasmStr)) -> wasmtime::Result<(Option<String>,)> + Send + Sync + 'static {
    move |mut store, (this, name)| {
        let name = Name::copy(&name, &store)?;
        Ok((find(store.data_mut().request(&this)?, name.as_str()),))
    }
}

/// A call `(this, name, value)` that keeps `value` under `name`.
fn set(
    edit: impl Fn(&mut PluginRequest, &str, String) + Send + Sync + 'static,
) -> impl Fn(Cx<'_>, (This, WasmStr, WasmStr)) -> wasmtime::Result<()> + Send + Sync + 'static {
    move |mut store, (this, name, value)| {
        let (name, value) = (Name::copy(&name, &store)?, value.to_str(&store)?.into_owned());
        edit(store.data_mut().request(&this)?, name.as_str(), value);
        Ok(())
    }
}

/// A guest's string, copied out of its memory: on the stack when short.
enum Name {
    Inline([u8; INLINE], usize),
    Heap(String),
}

impl Name {
    fn copy(text: &WasmStr, store: &Cx<'_>) -> wasmtime::Result<Name> {
        // Validated as UTF-8 (or transcoded) by `to_str`.
        Ok(match text.to_str(store)? {
            Cow::Borrowed(text) if text.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                Name::Inline(bytes, text.len())
            }
            text => Name::Heap(text.into_owned()),
        })
    }

    fn as_str(&self) -> &str {
        match self {
            // SAFETY: the bytes were copied whole from a `str` (`copy`), so
            // they are UTF-8; checking them again cost as much as the copy.
            Name::Inline(bytes, len) => unsafe { std::str::from_utf8_unchecked(&bytes[..*len]) },
            Name::Heap(text) => text,
        }
    }
}

#[cfg(test)]
mod tests {
    /// These calls shadow the bindings' only at the version the bindings
    /// serve: at any other, every 0.3 component would fail to link.
    #[test]
    fn the_shadowed_interface_is_the_wit_version() {
        let wit = include_str!("../../../wit/plugin.wit");
        let version = wit.lines().find_map(|line| line.strip_prefix("package sluice:plugin@")).unwrap();
        assert_eq!(super::TYPES, format!("sluice:plugin/types@{}", version.trim_end_matches(';')));
    }
}
