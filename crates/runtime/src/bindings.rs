wasmtime::component::bindgen!({
    path: "../../wit",
    world: "plugin",
    // Exports run guest code, which yields on epoch ticks; host imports are
    // quick and synchronous.
    exports: { default: async },
});
