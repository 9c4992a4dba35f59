//! Checks that bytes are a valid WebAssembly component, and lists what it
//! imports and exports.

use serde::Serialize;
use wasmparser::{Encoding, Parser, Payload, Validator, WasmFeatures};

use crate::error::OciError;

/// The top-level imports and exports of a component, by name
/// (`wasi:io/streams@0.2.0`, `sluice:plugin/filter@0.1.0`, …).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ComponentInfo {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// Validates `bytes` as a component. A core module or anything else is
/// refused with a message that says which it was.
pub fn inspect_component(bytes: &[u8]) -> Result<ComponentInfo, OciError> {
    if Parser::is_core_wasm(bytes) {
        return Err(OciError::NotAComponent(
            "this is a core WebAssembly module; build a component (e.g. cargo build --target wasm32-wasip2, or \
             wasm-tools component new)"
                .into(),
        ));
    }
    if !Parser::is_component(bytes) {
        let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Err(OciError::NotAComponent(format!(
            "no WebAssembly component header (first bytes: {})",
            if head.is_empty() { "none, the file is empty".to_string() } else { head.join(" ") }
        )));
    }
    // Full validation, so a truncated or corrupt component is refused here
    // rather than when the gateway compiles it.
    Validator::new_with_features(WasmFeatures::all())
        .validate_all(bytes)
        .map_err(|e| OciError::NotAComponent(format!("invalid component: {e}")))?;

    let mut info = ComponentInfo::default();
    // Nested modules and components report their own sections; only the
    // outermost component's imports and exports describe the plugin.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| OciError::NotAComponent(e.to_string()))?;
        match payload {
            Payload::Version { encoding, .. } => {
                depth += 1;
                debug_assert!(depth > 1 || encoding == Encoding::Component);
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| OciError::NotAComponent(e.to_string()))?;
                    info.imports.push(import.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| OciError::NotAComponent(e.to_string()))?;
                    info.exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(info)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wasm_encoder::{
        Component, ComponentExportKind, ComponentExportSection, ComponentImportSection, ComponentTypeRef, ModuleSection,
    };

    /// A tiny valid component: two imported instances (one re-exported) and
    /// a nested core module, whose own export must not be listed.
    pub(crate) fn tiny_component() -> Vec<u8> {
        let mut module = wasm_encoder::Module::new();
        let mut memories = wasm_encoder::MemorySection::new();
        memories.memory(wasm_encoder::MemoryType {
            minimum: 1,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        module.section(&memories);
        let mut module_exports = wasm_encoder::ExportSection::new();
        module_exports.export("inner-memory", wasm_encoder::ExportKind::Memory, 0);
        module.section(&module_exports);

        let mut component = Component::new();
        component.section(&ModuleSection(&module));
        let mut types = wasm_encoder::ComponentTypeSection::new();
        types.instance(&wasm_encoder::InstanceType::new());
        component.section(&types);
        let mut imports = ComponentImportSection::new();
        imports.import("wasi:io/streams@0.2.0", ComponentTypeRef::Instance(0));
        imports.import("sluice:plugin/host@0.1.0", ComponentTypeRef::Instance(0));
        component.section(&imports);
        let mut exports = ComponentExportSection::new();
        exports.export("sluice:plugin/filter@0.1.0", ComponentExportKind::Instance, 0, None);
        component.section(&exports);
        component.finish()
    }

    #[test]
    fn lists_top_level_imports_and_exports() {
        let info = inspect_component(&tiny_component()).unwrap();
        assert_eq!(info.imports, ["wasi:io/streams@0.2.0", "sluice:plugin/host@0.1.0"]);
        assert_eq!(info.exports, ["sluice:plugin/filter@0.1.0"]);
    }

    #[test]
    fn refuses_a_core_module() {
        let module = wasm_encoder::Module::new().finish();
        let err = inspect_component(&module).unwrap_err();
        assert!(err.to_string().contains("core WebAssembly module"), "{err}");
    }

    #[test]
    fn refuses_garbage_and_empty_files() {
        let err = inspect_component(b"#!/bin/sh\necho hi\n").unwrap_err();
        assert!(matches!(err, OciError::NotAComponent(_)));
        assert!(err.to_string().contains("23 21 2f 62"), "{err}");
        assert!(inspect_component(b"").unwrap_err().to_string().contains("empty"));
    }

    #[test]
    fn refuses_a_truncated_component() {
        let component = tiny_component();
        let err = inspect_component(&component[..component.len() - 3]).unwrap_err();
        assert!(err.to_string().contains("invalid component"), "{err}");
    }
}
