//! The generated bindings of the two versions of the plugin world the
//! runtime serves: `sluice:plugin@0.3.0` (`wit/`), whose types are the
//! runtime's own, and `0.2.0` (`wit/v0.2/`, frozen), whose components keep
//! loading unchanged (`versions.rs` translates their calls).

pub(crate) mod v3 {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "plugin",
        // Exports run guest code, which yields on epoch ticks. Host imports
        // are quick and synchronous, except token counting: it runs on a
        // blocking thread and traps the guest when the plugin's deadline
        // passes. A request handle that is not in the store's table traps.
        imports: { "sluice:plugin/host.count-tokens": async | trappable, default: trappable },
        exports: { default: async },
        with: { "sluice:plugin/types.request": crate::request::PluginRequest },
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
