//! The crate's modules depend on each other one way only: no module imports another that
//! imports it back, directly or through others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Identifiers in `s` that follow `crate::` (one path segment), and those inside
/// `use crate::{...}` groups (which may span lines).
fn crate_refs(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            out.extend(group[..end].split(|c: char| !c.is_alphanumeric() && c != '_').map(str::to_string));
        } else {
            let end = rest.find(|c: char| !c.is_alphanumeric() && c != '_').unwrap_or(rest.len());
            out.push(rest[..end].to_string());
        }
    }
    out.retain(|w| !w.is_empty());
    out
}

/// A module's code without comments (doc links are not imports) and without its tests.
fn code_of(src: &str) -> String {
    let src = src.split("#[cfg(test)]").next().unwrap_or("");
    src.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

// Checks the layering rule of the crate (fabric → transports → access, operations and
// synchronisation, never back): it builds the graph of which module names which (through
// `crate::module` paths and through the names lib.rs re-exports), then looks for a module
// that can reach itself. It fails, naming the modules, as soon as two modules import each
// other in a circle.
#[test]
fn no_module_imports_one_that_imports_it_back() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "rs") && name != "lib" {
            modules.insert(name, std::fs::read_to_string(&path).unwrap());
        } else if path.join("mod.rs").is_file() {
            // A module in a folder: its files together (each without its tests).
            let mut code = String::new();
            for f in std::fs::read_dir(&path).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|e| e == "rs") {
                    code.push_str(&code_of(&std::fs::read_to_string(&f).unwrap()));
                    code.push('\n');
                }
            }
            modules.insert(name, code);
        }
    }
    assert!(modules.len() >= 10, "found the crate's modules: {:?}", modules.keys());
    // Names that lib.rs re-exports, by the module they come from.
    let lib = std::fs::read_to_string(dir.join("lib.rs")).unwrap();
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for line in lib.lines().filter(|l| l.starts_with("pub use ")) {
        let path = line.trim_start_matches("pub use ").trim_end_matches(';');
        let Some((module, names)) = path.split_once("::") else { continue };
        if !modules.contains_key(module) {
            continue;
        }
        for n in names.split(|c: char| !c.is_alphanumeric() && c != '_').filter(|n| !n.is_empty()) {
            owner.insert(n.to_string(), module.to_string());
        }
    }
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (m, src) in &modules {
        let deps = graph.entry(m.as_str()).or_default();
        for r in crate_refs(&code_of(src)) {
            let target = if modules.contains_key(&r) {
                modules.get_key_value(&r).map(|(k, _)| k.as_str())
            } else {
                owner.get(&r).map(String::as_str)
            };
            if let Some(t) = target.filter(|t| *t != m) {
                deps.insert(t);
            }
        }
    }
    let mut circular = Vec::new();
    for &start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&str> = graph[start].iter().copied().collect();
        while let Some(x) = stack.pop() {
            if seen.insert(x) {
                stack.extend(graph.get(x).into_iter().flatten().copied());
            }
        }
        if seen.contains(start) {
            circular.push(format!("{start} -> {:?}", graph[start]));
        }
    }
    assert!(circular.is_empty(), "modules in a circle of imports:\n{}", circular.join("\n"));
    // The graph is not empty: the fabric does name the transports.
    assert!(graph["fabric"].contains("shm") && graph["fabric"].contains("edge"), "{:?}", graph["fabric"]);
}
