//! The first-party plugins that the runtime's and gateway's unit tests load,
//! built from `plugins/` by this crate's build script, so that `cargo test`
//! works from a fresh clone with only rustup's `wasm32-unknown-unknown` and
//! `wasm32-wasip2` targets: no `cargo xtask plugins`, no apt, Python or npm.

include!(concat!(env!("OUT_DIR"), "/programs.rs"));

/// The component built from `plugins/<package>` (or `plugins/testing/<package>`).
///
/// # Panics
/// If the build script does not build that package: add it to `build.rs`.
pub fn path(package: &str) -> &'static str {
    PROGRAMS
        .iter()
        .find(|(name, _)| *name == package)
        .map(|(_, path)| *path)
        .unwrap_or_else(|| panic!("sluice-test-programs does not build `{package}`: add it to its build.rs"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_program_is_a_component() {
        for (package, path) in super::PROGRAMS {
            let bytes = std::fs::read(path).unwrap();
            // The component model's preamble: magic, version 0x0d, layer 1.
            assert_eq!(&bytes[..8], b"\0asm\x0d\0\x01\0", "{package} is not a component");
        }
        assert_eq!(super::path("deny"), super::PROGRAMS.iter().find(|(p, _)| *p == "deny").unwrap().1);
    }
}
