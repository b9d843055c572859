//! The engine's files depend on each other in one direction only: a helper actor never
//! names the session, the session never names the engine. Checked on the source text, so a
//! new circular `use` fails here rather than in a reviewer's head.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name of a source file (`session/restore.rs` belongs to `session`).
fn module_of(path: &Path, src: &Path) -> String {
    let relative = path.strip_prefix(src).unwrap_or(path);
    let first = relative
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_owned()
}

/// The modules `text` names as `crate::<module>` outside comments.
fn named_modules(text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if known.contains(&name) {
                named.insert(name);
            }
        }
    }
    named
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        panic!("cannot read {}", dir.display());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn engine_modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let known: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(f, &src))
        .filter(|m| m != "lib")
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file, &src);
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let mut named = named_modules(&text, &known);
        named.remove(&module);
        edges.entry(module).or_default().extend(named);
    }
    // Depth-first search for a back edge; reports the cycle it finds.
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for module in edges.keys() {
        let cycle = visit(module, &edges, &mut Vec::new(), &mut done);
        assert!(
            cycle.is_none(),
            "circular imports: {}",
            cycle.unwrap_or_default().join(" -> ")
        );
    }
    // The graph is not empty (the scan found the imports it checks).
    assert!(edges.get("session").is_some_and(|d| d.contains("runner")));
}
