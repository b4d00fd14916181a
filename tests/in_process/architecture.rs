//! The crate's rooms, and the one direction its imports run: the breaker
//! core (`src/breaker/`) and the pure rooms (`src/policy/`,
//! `src/classify/`) name nothing above them. Layers, services, registries,
//! probes, metrics and stores build on the core; the core knows them only
//! through the ports and hooks it defines.

use std::fs;
use std::path::{Path, PathBuf};

/// Each room, and the top-level modules its code may name.
const ROOMS: &[(&str, &[&str])] = &[
    (
        "src/breaker",
        &[
            "breaker", "config", "policy", "error", "events", "millis", "sync", "outcome",
        ],
    ),
    ("src/policy", &["policy", "error", "millis", "outcome"]),
    ("src/classify", &["classify", "outcome", "error", "millis"]),
];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// How deep in the module tree a source file is: `src/breaker/mod.rs` and
/// `src/breaker.rs` are 1, `src/breaker/state.rs` is 2.
fn depth(file: &Path, src: &Path) -> usize {
    let relative = file.strip_prefix(src).unwrap_or(file);
    let parts = relative.components().count();
    if relative.ends_with("mod.rs") {
        parts - 1
    } else {
        parts
    }
}

/// The top-level modules a line of code names through `crate::`, grouped
/// imports (`crate::{a, b::c}`) included, or through enough `super::` to
/// reach the crate's root from a file `depth` deep.
fn named_modules_at(line: &str, depth: usize) -> Vec<String> {
    let mut names = named_modules(line);
    let escape = "super::".repeat(depth);
    let mut rest = line;
    while let Some(at) = rest.find(&escape) {
        rest = rest[at..].trim_start_matches("super::");
        names.push(
            rest.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect(),
        );
    }
    names
}

/// The top-level modules a line of code names through `crate::`, grouped
/// imports (`crate::{a, b::c}`) included.
fn named_modules(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
        } else {
            names.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    names
}

/// Whether a line is code, rather than a comment or documentation (whose
/// links may name any room).
fn is_code(line: &str) -> bool {
    let line = line.trim_start();
    !(line.starts_with("//") || line.starts_with("/*") || line.starts_with('*'))
}

#[test]
fn the_core_and_the_pure_rooms_name_nothing_above_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut breaches = Vec::new();
    for (room, allowed) in ROOMS {
        let mut files = Vec::new();
        let dir = root.join(room);
        rust_files(&dir, &mut files);
        let as_file = root.join(format!("{room}.rs"));
        if as_file.exists() {
            files.push(as_file);
        }
        assert!(!files.is_empty(), "{room}: no source found");
        for file in files {
            let text = fs::read_to_string(&file).expect("a readable source file");
            let depth = depth(&file, &root.join("src"));
            for (n, line) in text.lines().enumerate().filter(|(_, l)| is_code(l)) {
                for name in named_modules_at(line, depth) {
                    if !allowed.contains(&name.as_str()) {
                        breaches.push(format!(
                            "{}:{}: names `crate::{name}`: {}",
                            file.strip_prefix(root).unwrap_or(&file).display(),
                            n + 1,
                            line.trim()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        breaches.is_empty(),
        "imports running up from a lower room:\n{}",
        breaches.join("\n")
    );
}

#[test]
fn the_check_sees_every_way_of_naming_a_module() {
    assert_eq!(named_modules("use crate::store::redis::Link;"), ["store"]);
    assert_eq!(
        named_modules("use crate::{layer::X, events::State};"),
        ["layer", "events"]
    );
    assert_eq!(
        named_modules("        crate::metrics::created(&name);"),
        ["metrics"]
    );
    assert_eq!(
        named_modules_at("use super::super::layer::X;", 2),
        ["layer"]
    );
    assert!(named_modules_at("use super::state::Word;", 2).is_empty());
    let src = Path::new("src");
    assert_eq!(depth(Path::new("src/breaker/mod.rs"), src), 1);
    assert_eq!(depth(Path::new("src/breaker/shared/record.rs"), src), 3);
    assert!(!is_code("    /// see [`X`](crate::layer::X)"));
    assert!(is_code("    let x = crate::probe::prober();"));
}
