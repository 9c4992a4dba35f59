//! The generated bindings of the two versions of the plugin world the
//! runtime serves: `sluice:plugin@0.3.3` (`wit/`), whose types are the
//! runtime's own, and `0.2.0` (`wit/v0.2/`, frozen), whose components keep
//! loading unchanged (`versions.rs` translates their calls). A component
//! built for 0.3.0, 0.3.1 or 0.3.2 links against 0.3.3 as it is: wasmtime
//! matches its imports and exports to the newest compatible version
//! (0.3.x), and each 0.3 version only added to the one before.

pub(crate) mod v3 {
    wasmtime::component::bindgen!({
        path: "../../wit",
        // The largest world: the host serves every import of every world.
        world: "stateful-plugin",
        // Exports run guest code, which yields on epoch ticks. Host imports
        // are quick and synchronous, except token counting, which runs on a
        // blocking thread and traps the guest when the plugin's deadline
        // passes, and state, which waits on the store within that deadline.
        // A request handle that is not in the store's table traps.
        imports: {
            "sluice:plugin/host.count-tokens": async | trappable,
            "sluice:plugin/state": async | trappable,
            default: trappable,
        },
        exports: { default: async },
        with: {
            "sluice:plugin/types.request": crate::request::PluginRequest,
            "sluice:plugin/state.reservation": crate::granted::Reservation,
        },
    });
}

pub(crate) mod v2 {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.2",
        world: "plugin",
        imports: { "sluice:plugin/host.count-tokens": async | trappable },
        exports: { default: async },
    });
}

pub use v3::sluice::plugin::types::{
    ChunkAction, Content, ContentPart, DirectResponse, Hooks, Message, RequestAction, Response, ResponseAction,
    ResponseEdits, ResponseSummary, Usage,
};
