//! No import cycles between the files of a crate: when two files import
//! from each other, neither can be read (or changed) without the other, and
//! the split between them is not a real one.
//!
//! A file's imports are the modules its `use` declarations and `crate::…`
//! / `super::…` paths name, resolved to the longest path that is a module
//! file of the same crate. Two kinds are left out on purpose: the crate
//! root (lib.rs or main.rs declares the modules and holds the helpers every
//! file shares), and test modules at the end of a file (from its first
//! `#[cfg(test)]` on), whose `use super::*` names the file itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The source trees to check, each a crate's `src` directory.
const ROOTS: &[&str] = &["crates", "plugins"];

/// Checks the repository (the current directory).
pub fn check() -> Result<()> {
    check_in(Path::new("."))
}

fn check_in(repo: &Path) -> Result<()> {
    let mut crates = Vec::new();
    for root in ROOTS {
        find_crates(&repo.join(root), &mut crates)?;
    }
    crates.sort();
    let mut problems = Vec::new();
    let mut files = 0;
    for src in &crates {
        let modules = read_crate(src)?;
        files += modules.len();
        for cycle in cycles_in(&modules) {
            let shown: Vec<String> = cycle.iter().map(|m| module_file(src, m, &modules)).collect();
            problems.push(shown.join(" <-> "));
        }
    }
    if !problems.is_empty() {
        bail!("import cycles between files (see crates/xtask/src/cycles.rs):\n  {}", problems.join("\n  "));
    }
    println!("no import cycles among the {files} files of {} crates", crates.len());
    Ok(())
}

/// Every `src` directory under `dir` that sits beside a Cargo.toml.
fn find_crates(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
        out.push(dir.join("src"));
    }
    for entry in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() && !matches!(name, "target" | "node_modules" | "src") && !name.starts_with('.') {
            find_crates(&path, out)?;
        }
    }
    Ok(())
}

/// The crate's files by module path ("" for the root, "a::b" for
/// src/a/b.rs or src/a/b/mod.rs), with their text up to the tests.
fn read_crate(src: &Path) -> Result<BTreeMap<String, String>> {
    let mut modules = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                // src/bin/*.rs are crates of their own.
                if path != src.join("bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src)?.with_extension("");
            let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|last| last == "mod") {
                parts.pop();
            }
            if parts == ["main"] && src.join("lib.rs").exists() {
                // A binary beside a library imports it by name, not by file.
                continue;
            }
            if parts == ["lib"] || parts == ["main"] {
                parts.clear();
            }
            let text = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let code = text.split("#[cfg(test)]").next().unwrap_or_default().to_string();
            modules.insert(parts.join("::"), code);
        }
    }
    Ok(modules)
}

fn module_file(src: &Path, module: &str, modules: &BTreeMap<String, String>) -> String {
    let base = src.join(module.replace("::", "/"));
    let has_children = modules.keys().any(|m| m.starts_with(&format!("{module}::")));
    let file =
        if has_children && base.join("mod.rs").exists() { base.join("mod.rs") } else { base.with_extension("rs") };
    file.display().to_string()
}

/// The groups of files (module paths) that import each other, directly or
/// not: the strongly connected components with more than one file.
fn cycles_in(modules: &BTreeMap<String, String>) -> Vec<Vec<String>> {
    let edges: BTreeMap<&str, BTreeSet<String>> =
        modules.iter().map(|(module, code)| (module.as_str(), imports(module, code, modules))).collect();
    let mut cycles = Vec::new();
    let mut seen = BTreeSet::new();
    for start in modules.keys() {
        if seen.contains(start) {
            continue;
        }
        // The component of `start`: what it reaches that also reaches it.
        let reached = reachable(start, &edges);
        let component: Vec<String> = reached.iter().filter(|m| reachable(m, &edges).contains(start)).cloned().collect();
        seen.extend(component.iter().cloned());
        if component.len() > 1 {
            cycles.push(component);
        }
    }
    cycles
}

fn reachable(start: &str, edges: &BTreeMap<&str, BTreeSet<String>>) -> BTreeSet<String> {
    let mut reached = BTreeSet::from([start.to_string()]);
    let mut todo = vec![start.to_string()];
    while let Some(module) = todo.pop() {
        for next in edges.get(module.as_str()).into_iter().flatten() {
            if reached.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    reached
}

/// The other non-root files of the crate that `module`'s code imports.
fn imports(module: &str, code: &str, modules: &BTreeMap<String, String>) -> BTreeSet<String> {
    let here: Vec<&str> = if module.is_empty() { Vec::new() } else { module.split("::").collect() };
    let mut found = BTreeSet::new();
    for path in paths(code) {
        let mut absolute: Vec<&str> = match path.first().copied() {
            Some("crate") => Vec::new(),
            Some("self") => here.clone(),
            Some("super") => here[..here.len().saturating_sub(1)].to_vec(),
            // A child module named without `self::` (`use child::Item;`).
            Some(first) if modules.contains_key(&join(&here, first)) => here.clone(),
            _ => continue,
        };
        let mut rest = &path[..];
        if matches!(rest.first().copied(), Some("crate" | "self" | "super")) {
            rest = &rest[1..];
        }
        while rest.first() == Some(&"super") {
            absolute.pop();
            rest = &rest[1..];
        }
        absolute.extend(rest.iter().copied().filter(|s| *s != "self"));
        // The longest prefix that is a module file.
        let target = (0..=absolute.len()).rev().map(|n| absolute[..n].join("::")).find(|m| modules.contains_key(m));
        if let Some(target) = target
            && !target.is_empty()
            && target != module
        {
            found.insert(target);
        }
    }
    found
}

fn join(here: &[&str], name: &str) -> String {
    here.iter().copied().chain([name]).collect::<Vec<_>>().join("::")
}

/// Every path the code names in a `use` declaration (one per leaf of a use
/// tree) and every `crate::…`/`super::…` path elsewhere. Comments are
/// skipped (`//` to the end of the line), so prose cannot add an import.
fn paths(code: &str) -> Vec<Vec<&str>> {
    let mut out = Vec::new();
    let mut pending_use: Option<usize> = None;
    let mut offset = 0;
    for line in code.split_inclusive('\n') {
        let code_part = &line[..line.find("//").unwrap_or(line.len())];
        let start = offset;
        offset += line.len();
        let trimmed = code_part.trim_start();
        let declaration = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|keyword| trimmed.strip_prefix(keyword));
        if let Some(tree) = declaration.filter(|_| pending_use.is_none()) {
            let tree_start = start + (code_part.len() - tree.len());
            pending_use = Some(tree_start);
        }
        if let Some(tree_start) = pending_use {
            if let Some(end) = code_part.find(';') {
                pending_use = None;
                use_tree(&code[tree_start..start + end], Vec::new(), &mut out);
            }
            continue;
        }
        for keyword in ["crate::", "super::"] {
            let mut from = 0;
            while let Some(found) = code_part[from..].find(keyword) {
                let at = from + found;
                let word_start = at == 0 || !is_ident(code_part.as_bytes()[at - 1]);
                let rest = &code_part[at..];
                let len = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
                if word_start {
                    out.push(rest[..len].split("::").filter(|s| !s.is_empty()).collect());
                }
                from = at + len.max(1);
            }
        }
    }
    out
}

/// The leaves of a use tree such as `a::{b, c::{self, D}}`, each with the
/// path leading to it.
fn use_tree<'a>(tree: &'a str, prefix: Vec<&'a str>, out: &mut Vec<Vec<&'a str>>) {
    let tree = tree.trim();
    if tree.is_empty() {
        // After a trailing comma.
        return;
    }
    match tree.find('{') {
        Some(open) => {
            let mut path = prefix;
            path.extend(tree[..open].split("::").map(str::trim).filter(|s| !s.is_empty()));
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            for part in split_top_level(inner) {
                use_tree(part, path.clone(), out);
            }
        }
        None => {
            let leaf = tree.split(" as ").next().unwrap_or_default();
            let mut path = prefix;
            path.extend(leaf.split("::").map(str::trim).filter(|s| !s.is_empty() && *s != "*"));
            if !path.is_empty() {
                out.push(path);
            }
        }
    }
}

/// `inner` split at the commas outside braces.
fn split_top_level(inner: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files.iter().map(|(m, code)| (m.to_string(), code.to_string())).collect()
    }

    #[test]
    fn this_repository_has_no_import_cycles() {
        check_in(&crate::repo_root()).unwrap();
    }

    #[test]
    fn two_files_that_import_each_other_are_a_cycle() {
        let modules = crate_of(&[
            ("", "mod proxy; mod response; pub use proxy::handle;"),
            ("proxy", "use crate::response::{self, Exchange};"),
            ("response", "use crate::{body::Body, proxy::apply_failure_policy};"),
            ("body", "pub struct Body;"),
        ]);
        assert_eq!(cycles_in(&modules), vec![vec!["proxy".to_string(), "response".to_string()]]);
    }

    #[test]
    fn a_cycle_through_several_files_and_relative_paths_is_found() {
        let modules = crate_of(&[
            ("", ""),
            ("registry", "mod pull;\npub use pull::pull;"),
            ("registry::pull", "use super::transport::get;"),
            ("registry::transport", "fn f() { crate::registry::Client::new(); }"),
        ]);
        let cycles = cycles_in(&modules);
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0], ["registry", "registry::pull", "registry::transport"]);
    }

    #[test]
    fn the_root_external_crates_and_one_way_imports_are_not_cycles() {
        let modules = crate_of(&[
            ("", "mod a; mod b; pub fn helper() {} use a::A;"),
            ("a", "use crate::helper; use crate::b::B; use std::sync::Arc; use serde::{Deserialize, Serialize};"),
            ("b", "use crate::helper; pub struct B;"),
        ]);
        assert!(cycles_in(&modules).is_empty());
    }

    #[test]
    fn multi_line_uses_are_read_and_comments_are_not() {
        let code =
            "// use crate::z::X;\nuse crate::{\n    a::A,\n    b::B,\n};\nfn f() { super::c::g(); } // crate::y\n";
        let found: Vec<String> = paths(code).iter().map(|p| p.join("::")).collect();
        assert_eq!(found, ["crate::a::A", "crate::b::B", "super::c::g"]);
    }

    #[test]
    fn use_trees_are_read_leaf_by_leaf() {
        let mut out = Vec::new();
        use_tree("crate::{chain::{self, Filtered}, gateway::Gateway as G, *}", Vec::new(), &mut out);
        assert_eq!(
            out,
            vec![
                vec!["crate", "chain", "self"],
                vec!["crate", "chain", "Filtered"],
                vec!["crate", "gateway", "Gateway"],
                vec!["crate"]
            ]
        );
    }
}
