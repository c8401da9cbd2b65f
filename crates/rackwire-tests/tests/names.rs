//! The environment variables rackwire's programs read are named once each: in
//! `rackwire::vars` (or, for a variable of a lower crate or a test's own, in one `const`),
//! never as a copy of the text where a program sets or reads one.

use std::path::{Path, PathBuf};

/// The Rust sources of the workspace: every crate's `src` and `tests`, and the bindings'.
fn sources(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for c in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        walk(&c.path().join("src"), &mut out);
        walk(&c.path().join("tests"), &mut out);
    }
    walk(&root.join("bindings/python/src"), &mut out);
    out
}

/// The string literals of `line` that are a variable's name and nothing else
/// (`"RACKWIRE_MH"`, not `"set RACKWIRE_MH"`).
fn bare_names(line: &str) -> Vec<&str> {
    line.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.strip_prefix("RACKWIRE_").is_some_and(|rest| {
                !rest.is_empty() && rest.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            })
        })
        .collect()
}

// Checks the rule over every source file: a line holding a variable's bare name must define
// a `const` (`const X: &str = "RACKWIRE_..."`), and no name is defined twice; it fails
// listing each offending file and line. That the scan is real: `rackwire::vars` defines
// every name in its list, and the scan finds those definitions (at least 25 files scanned
// hold code, and each name of `vars::ALL` is found defined exactly once).
#[test]
fn each_variable_is_named_once() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let files = sources(&root);
    assert!(files.len() > 25, "only {} sources found", files.len());
    let (mut copies, mut defined) = (Vec::new(), Vec::<(String, String)>::new());
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for name in bare_names(line) {
                let at = format!("{}:{}", f.strip_prefix(&root).unwrap_or(f).display(), i + 1);
                if line.contains("const ") && line.contains(": &str = ") {
                    defined.push((name.to_string(), at));
                } else {
                    copies.push(format!("{at}: {}", line.trim()));
                }
            }
        }
    }
    assert!(
        copies.is_empty(),
        "variable names written out instead of named (use rackwire::vars):\n{}",
        copies.join("\n")
    );
    for name in rackwire::vars::ALL {
        let places: Vec<_> = defined.iter().filter(|(n, _)| n == name).map(|(_, at)| at.as_str()).collect();
        assert_eq!(places.len(), 1, "{name} defined at {places:?}");
    }
    let mut names: Vec<_> = defined.iter().map(|(n, _)| n).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "a name defined twice: {defined:?}");
}
