//! The library's `crate::` import graph has no cycle: vocabulary modules (element types, masks, errors)
//! sit below the ops, the ops below the harness (`testkit`), and nothing below names what is above it.
//!
//! A node is a module of src/ cut to two levels (`prefill`, `prefill::sm90`, `testkit::cases`); an edge
//! a → b is a `crate::b…` path written in a's files (imports and inline paths, comments left out). Edges
//! between a module and its own parent or child (a parent re-exporting its children, a child using its
//! parent's items) are one module's inside and do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The module path of a source file under src/ (`None`: the crate root, a binary). An `include!`d file
/// (bindgen's output) counts as a module of its own, which `node` folds into its includer's.
fn module_of(rel: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.first().is_some_and(|p| p == "bin") || parts == ["lib.rs"] {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// The source with `//` comments (doc comments included) removed, string literals kept out of the way.
fn code_only(source: &str) -> String {
    source.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

/// Every path that follows `crate::` in `code`, brace groups expanded (`crate::{a::{b, c}, d}`).
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while let Some(at) = code[i..].find("crate::") {
        let start = i + at;
        let before = start.checked_sub(1).map(|p| bytes[p] as char);
        i = start + "crate::".len();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `fused_crate::`, `$crate::`
        }
        i = parse_tree(code, i, &mut Vec::new(), &mut out);
    }
    out
}

/// Parses a use-tree at `i` with `prefix` before it; returns where it ends.
fn parse_tree(code: &str, mut i: usize, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let b = code.as_bytes();
    let skip_ws = |mut i: usize| {
        while i < b.len() && (b[i] as char).is_whitespace() {
            i += 1;
        }
        i
    };
    let depth = prefix.len();
    loop {
        i = skip_ws(i);
        if i < b.len() && b[i] == b'{' {
            i += 1;
            loop {
                i = skip_ws(i);
                if i >= b.len() || b[i] == b'}' {
                    break;
                }
                i = parse_tree(code, i, prefix, out);
                i = skip_ws(i);
                if i < b.len() && b[i] == b',' {
                    i += 1;
                }
            }
            prefix.truncate(depth);
            return i + 1;
        }
        let s = i;
        while i < b.len() && ((b[i] as char).is_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if s == i {
            break; // `*` or the end of the path
        }
        prefix.push(code[s..i].to_string());
        if code[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    if prefix.len() > depth {
        out.push(prefix.clone());
    }
    prefix.truncate(depth);
    // `as name`, `*`: nothing more to record
    while i < b.len() && !matches!(b[i], b',' | b'}' | b';' | b')' | b'>' | b'(' | b'\n') {
        if code[i..].starts_with("::") || b[i] == b'{' {
            break;
        }
        i += 1;
    }
    i
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn node(path: &[String]) -> String {
    path.iter().take(2).cloned().collect::<Vec<_>>().join("::")
}

/// `a` is `b`, or one is the other's ancestor.
fn related(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
}

/// The import graph: node → the nodes it names.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> =
        files.iter().filter_map(|f| module_of(f.strip_prefix(src).unwrap())).map(|m| node(&m)).collect();
    let aliases = root_aliases(&std::fs::read_to_string(src.join("lib.rs")).unwrap(), &modules);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let Some(m) = module_of(f.strip_prefix(src).unwrap()) else { continue };
        let from = node(&m);
        let code = code_only(&std::fs::read_to_string(f).unwrap());
        for mut p in crate_paths(&code) {
            if let Some(full) = aliases.get(&p[0]) {
                p.splice(0..1, full.iter().cloned());
            }
            // The longest prefix (of at most two segments) that is a module; an item of the root is none.
            let to = [node(&p), p[0].clone()].into_iter().find(|n| modules.contains(n));
            if let Some(to) = to.filter(|t| !related(&from, t)) {
                g.entry(from.clone()).or_default().insert(to);
            }
        }
        g.entry(from).or_default();
    }
    g
}

/// The crate root's re-exported modules (`pub use runtime::{device, emu};` makes `crate::device` name
/// `runtime::device`): short name → full path.
fn root_aliases(lib: &str, modules: &BTreeSet<String>) -> BTreeMap<String, Vec<String>> {
    let mut aliases = BTreeMap::new();
    for line in code_only(lib).lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ").or_else(|| line.trim().strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        for p in crate_paths(&format!("crate::{rest}")) {
            if p.len() == 2 && modules.contains(&p.join("::")) {
                aliases.insert(p[1].clone(), p.clone());
            }
        }
    }
    aliases
}

/// A cycle of `g`, if it has one (depth-first search).
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_crate_import_graph_has_no_cycle() {
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(g.contains_key("prefill") && g["prefill"].contains("mask"), "the graph misses edges: {g:?}");
    assert!(g["prefill"].contains("runtime::launch"), "re-exported modules resolve: {g:?}");
    if let Some(cycle) = find_cycle(&g) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_product_does_not_name_the_testkit() {
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for (from, to) in &g {
        if !from.starts_with("testkit") {
            assert!(to.iter().all(|t| !t.starts_with("testkit")), "{from} names the testkit: {to:?}");
        }
    }
}

#[test]
fn the_parser_reads_use_trees_and_finds_a_cycle() {
    let paths = crate_paths("use crate::{a::{b, c as d}, e::*};\nlet x = crate::f::g(1); // crate::h\n");
    let paths: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(paths, ["a::b", "a::c", "e", "f::g", "h"]);
    assert_eq!(crate_paths(&code_only("x // crate::h")), Vec::<Vec<String>>::new());
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in [("dtype", "fp8"), ("fp8", "tensor"), ("tensor", "dtype")] {
        g.entry(a.into()).or_default().insert(b.into());
    }
    assert_eq!(find_cycle(&g).unwrap(), ["dtype", "fp8", "tensor", "dtype"]);
    g.get_mut("tensor").unwrap().clear();
    assert_eq!(find_cycle(&g), None);
}
