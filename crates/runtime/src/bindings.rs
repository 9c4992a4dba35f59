wasmtime::component::bindgen!({
    path: "../../wit",
    world: "plugin",
    // Exports run guest code, which yields on epoch ticks. Host imports are
    // quick and synchronous, except token counting: it runs on a blocking
    // thread and traps the guest when the plugin's deadline passes.
    imports: { "sluice:plugin/host.count-tokens": async | trappable },
    exports: { default: async },
});
