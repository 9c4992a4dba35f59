//! The WASI a plugin gets. The WIT grants plugins nothing but the host
//! interface, yet guests built by Rust's std, wasi-libc, componentize-py or
//! componentize-js import WASI just to start. So:
//! - the interfaces those runtimes touch at start (`GRANTED`) are linked
//!   with wasmtime-wasi over an empty context: no preopened directories, no
//!   environment, stdin empty, stdout and stderr discarded, no network;
//! - `wasi:http` is linked for real too, but a component that imports its
//!   outgoing handler is served only with a grant (`spec.egress`), and its
//!   requests go through the grant's send hook (`egress.rs`): the one
//!   pollable that can block is an outbound call's, bounded by the hook's
//!   deadline;
//! - sleeping traps: `wasi:clocks/monotonic-clock`'s `subscribe-*` would
//!   let a guest wait for nothing, holding its instance;
//! - every other WASI interface a component imports (sockets, …) is
//!   linked as functions that trap, so such a component still loads.
//!
//! Each call into the guest also has a wall-clock timeout (see `plugin.rs`),
//! which ends a call waiting in the host at its deadline.

use std::sync::OnceLock;
use std::time::Instant;

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker, ResourceType};
use wasmtime::{Engine, Result};

use crate::host::PluginState;

/// WASI interfaces linked for real (over an empty context).
const GRANTED: &[&str] = &["wasi:io/", "wasi:clocks/", "wasi:random/", "wasi:cli/", "wasi:filesystem/", "wasi:http/"];

/// Outbound HTTP: linked for real, and served only to a plugin whose
/// GatewayPlugin grants it (`spec.egress`), whose send hook then checks
/// every request against the grant (`egress.rs`).
pub(crate) const OUTGOING_HANDLER: &str = "wasi:http/outgoing-handler@";

const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@";

/// What every plugin is linked with, before [`restrict`].
pub(crate) fn base_linker(engine: &Engine) -> Result<Linker<PluginState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    Ok(linker)
}

/// `base` as `component` gets it: its imports of WASI interfaces that are
/// not granted, and the monotonic clock's sleeps, trap. A definition at the
/// exact name a component imports wins over wasmtime-wasi's version of it.
pub(crate) fn restrict(base: &Linker<PluginState>, component: &Component) -> Result<Linker<PluginState>> {
    let mut linker = base.clone();
    linker.allow_shadowing(true);
    let engine = component.engine().clone();
    let stubbed = |name: &str| name.starts_with("wasi:") && !GRANTED.iter().any(|granted| name.starts_with(granted));
    // Resources that linked interfaces define and stubbed ones `use` (e.g.
    // `pollable`) keep their real type.
    let linked_resources: Vec<ResourceType> = component
        .component_type()
        .imports(&engine)
        .filter(|(name, _)| !stubbed(name))
        .filter_map(|(_, import)| match import.ty {
            ComponentItem::ComponentInstance(instance) => Some(instance),
            _ => None,
        })
        .flat_map(|instance| {
            instance
                .exports(&engine)
                .filter_map(|(_, export)| match export.ty {
                    ComponentItem::Resource(ty) => Some(ty),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    for (name, import) in component.component_type().imports(&engine) {
        let ComponentItem::ComponentInstance(instance) = import.ty else {
            continue;
        };
        if name.starts_with(MONOTONIC_CLOCK) {
            link_clock_without_sleep(&mut linker, name)?;
            continue;
        }
        if !stubbed(name) {
            continue;
        }
        let mut stub = linker.instance(name)?;
        for (item, export) in instance.exports(&engine) {
            match export.ty {
                ComponentItem::ComponentFunc(_) => {
                    let what = format!("{name}#{item}");
                    stub.func_new(item, move |_, _, _, _| {
                        Err(wasmtime::Error::msg(format!("{what} is not granted to plugins")))
                    })?;
                }
                ComponentItem::Resource(ty) if !linked_resources.contains(&ty) => {
                    stub.resource(item, ResourceType::host::<NotGranted>(), |_, _| Ok(()))?
                }
                _ => {}
            }
        }
    }
    Ok(linker)
}

/// The resources of an interface that is not granted: none can be made.
struct NotGranted;

/// The monotonic clock, without `subscribe-duration` and
/// `subscribe-instant`: the ways to sleep.
fn link_clock_without_sleep(linker: &mut Linker<PluginState>, name: &str) -> Result<()> {
    static START: OnceLock<Instant> = OnceLock::new();
    let mut clock = linker.instance(name)?;
    clock.func_wrap("now", |_, (): ()| Ok((START.get_or_init(Instant::now).elapsed().as_nanos() as u64,)))?;
    clock.func_wrap("resolution", |_, (): ()| Ok((1u64,)))?;
    for sleep in ["subscribe-duration", "subscribe-instant"] {
        clock.func_new(sleep, |_, _, _, _| {
            Err(wasmtime::Error::msg("sleeping is not granted to plugins: a plugin call must not wait"))
        })?;
    }
    Ok(())
}
