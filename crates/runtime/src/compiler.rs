//! Compiling components without keeping the compiler's scratch memory.
//!
//! Cranelift keeps one context per compile thread for as long as its engine
//! lives, each grown to the largest function it has compiled: heaptrack on
//! `cargo bench -p sluice-tests --bench plugins` found 11 MiB of them live
//! after the small plugins and 33 MiB after a regex guard, 90% of the
//! process's heap, and the serving engine lives as long as the process. So
//! each compile runs in an engine of its own, dropped when it is done, and
//! the serving engine loads the compiled artifact as it loads one from the
//! cache. A new engine costs microseconds (debug build: 4 µs once the host
//! is probed) beside a compile's tens to hundreds of milliseconds.

// Calls that need `unsafe`, each block with a SAFETY: comment saying why
// it is sound (clippy::undocumented_unsafe_blocks checks there is one).
#![allow(unsafe_code)]

use wasmtime::component::Component;
use wasmtime::{Config, Engine};

/// Compiles for the serving engine, in engines of its own.
pub(crate) struct Compiler {
    /// The serving engine's configuration, but for how instances are
    /// allocated (no pool), which compiled code does not depend on.
    config: Config,
}

impl Compiler {
    pub fn new(config: Config) -> Self {
        Self { config }
    }

    /// The compiled artifact of `bytes`, as `Component::serialize` writes it.
    pub fn precompile(&self, bytes: &[u8]) -> wasmtime::Result<Vec<u8>> {
        Engine::new(&self.config)?.precompile_component(bytes)
    }

    /// `bytes` compiled, loaded into `engine`, whose configuration this
    /// compiler was made with.
    pub fn compile(&self, engine: &Engine, bytes: &[u8]) -> wasmtime::Result<Component> {
        let artifact = self.precompile(bytes)?;
        load(engine, &artifact)
    }
}

/// Loads an artifact [`Compiler::precompile`] made just now. A mismatch
/// with `engine` is an error, not undefined behaviour: wasmtime checks the
/// artifact's target, flags and tunables against the engine's.
pub(crate) fn load(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: the artifact was made in this process by Cranelift, from a
    // component wasmtime validated, not read from anywhere.
    unsafe { Component::deserialize(engine, artifact) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::built_plugin;

    #[test]
    fn compiles_for_the_serving_engine_and_refuses_another() {
        let mut config = Config::new();
        config.epoch_interruption(true);
        let compiler = Compiler::new(config.clone());
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(Default::default()));
        let serving = Engine::new(&config).unwrap();
        let component = compiler.compile(&serving, &built_plugin("add-header")).unwrap();
        assert!(component.component_type().exports(&serving).any(|(name, _)| name.starts_with("sluice:plugin/")));
        // Compiled without epoch checks, it would run past every deadline:
        // the serving engine refuses it.
        let other = Engine::new(&Config::new()).unwrap();
        let error = compiler.compile(&other, &built_plugin("add-header")).unwrap_err();
        assert!(format!("{error:#}").contains("epoch"), "{error:#}");
    }
}
