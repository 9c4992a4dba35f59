//! The committed CRDs and example YAML must match the Rust types.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn committed_crds_match_the_types() {
    let path = repo_root().join("crds/sluice.dev.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = sluice_api::crds_yaml();
    if committed != generated {
        panic!(
            "{} is out of date with crates/api; regenerate with `cargo run -p sluice -- crds > crds/sluice.dev.yaml`",
            path.display()
        );
    }
}

#[test]
fn every_yaml_under_deploy_deserializes() {
    let mut files = Vec::new();
    collect_yaml(&repo_root().join("deploy"), &mut files);
    assert!(!files.is_empty(), "no YAML found under deploy/");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let docs = sluice_api::parse_documents(&text);
        assert!(!docs.is_empty(), "{} holds no documents", file.display());
        for doc in docs {
            let doc = doc.unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let dir = file.parent().unwrap();
            match doc {
                sluice_api::Document::Plugin(p) => {
                    drop(p.decl(dir).unwrap_or_else(|e| panic!("{}: {e}", file.display())))
                }
                sluice_api::Document::Route(r) => {
                    drop(r.decl(dir).unwrap_or_else(|e| panic!("{}: {e}", file.display())))
                }
            }
        }
    }
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_yaml(&path, out);
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(path);
        }
    }
}
