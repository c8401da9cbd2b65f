//! Every crate's modules depend on each other one way only: no module imports another that
//! imports it back, directly or through others; and each names what it takes from its parent.

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

/// A crate's modules (files of `src`, a folder module's files together), each without its
/// comments and tests.
fn modules_of(dir: &Path) -> BTreeMap<String, String> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            modules.insert(name, code_of(&std::fs::read_to_string(&path).unwrap()));
        } else if path.join("mod.rs").is_file() {
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
    modules
}

/// Which module names which in the crate whose sources are in `dir` (through `crate::module`
/// paths and through the names its lib.rs re-exports).
fn graph_of(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules_of(dir);
    let lib = std::fs::read_to_string(dir.join("lib.rs")).unwrap_or_default();
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
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, src) in &modules {
        let deps = graph.entry(m.clone()).or_default();
        for r in crate_refs(src) {
            let target = if modules.contains_key(&r) { Some(r.clone()) } else { owner.get(&r).cloned() };
            if let Some(t) = target.filter(|t| t != m) {
                deps.insert(t);
            }
        }
    }
    graph
}

/// The modules of `graph` that can reach themselves, each with what it names.
fn circular(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out = Vec::new();
    for start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&String> = graph[start].iter().collect();
        while let Some(x) = stack.pop() {
            if seen.insert(x) {
                stack.extend(graph.get(x).into_iter().flatten());
            }
        }
        if seen.contains(start) {
            out.push(format!("{start} -> {:?}", graph[start]));
        }
    }
    out
}

// Checks the layering rule in every crate of the workspace (crates/*, the Python bindings):
// for each it builds the graph of which module names which, then looks for a module that can
// reach itself; it fails naming the crate and the modules in a circle. That the graphs are
// real: the fabric crate's fabric module names the transports, and the crates have 100
// modules between them.
#[test]
fn no_module_imports_one_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut dirs: Vec<_> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .filter(|d| d.is_dir())
        .collect();
    dirs.push(root.join("bindings/python/src"));
    let (mut found, mut modules) = (Vec::new(), 0);
    for dir in &dirs {
        let graph = graph_of(dir);
        modules += graph.len();
        let c = circular(&graph);
        if !c.is_empty() {
            found.push(format!("{}:\n  {}", dir.display(), c.join("\n  ")));
        }
        if dir.ends_with("crates/rackwire/src") {
            assert!(graph["fabric"].contains("shm") && graph["fabric"].contains("edge"), "{:?}", graph["fabric"]);
        }
    }
    assert!(modules >= 100, "found {modules} modules in {} crates", dirs.len());
    assert!(found.is_empty(), "modules in a circle of imports:\n{}", found.join("\n"));
}

/// Every `.rs` file under `dir`, at any depth.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

// Checks that a module says what it takes from its parent: no `use super::*;` in any crate's
// code outside its tests (a test module's own file, `tests.rs`, or what follows `#[cfg(test)]`),
// found by reading every source file of the workspace (crates/*, the Python bindings); it fails
// naming each file that still has one. That the scan is real: it reads over 150 files.
#[test]
fn modules_name_what_they_take_from_their_parent() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for e in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = e.unwrap().path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    sources(&root.join("bindings/python/src"), &mut files);
    let glob: Vec<String> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "tests.rs"))
        .filter(|f| code_of(&std::fs::read_to_string(f).unwrap()).lines().any(|l| l.trim() == "use super::*;"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(files.len() > 150, "read {} files", files.len());
    assert!(glob.is_empty(), "`use super::*;` outside tests in:\n{}", glob.join("\n"));
}
