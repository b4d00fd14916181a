//! The documentation's links: every relative link in the README, the
//! guide's pages (`src/guide/`), the studies beside the benches and the
//! other Markdown pages of the repository resolves to a file, and every
//! `#anchor` to a heading of its page; every link into this crate's pages
//! on docs.rs names the front page or a page of the guide that exists, and
//! a heading on it. Intra-doc links (`crate::...`) are rustdoc's to check
//! (`RUSTDOCFLAGS="-D warnings" cargo doc`), except their anchors into the
//! guide's pages, which rustdoc leaves alone and this test checks.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Where the guide and the front page are published.
const DOCS_RS: &str = "https://docs.rs/tower-circuit-breaker/latest/tower_circuit_breaker/";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Markdown pages under `dir`, its subfolders included (build output
/// left out).
fn markdown_under(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if !path.ends_with("target") {
                markdown_under(&path, found);
            }
        } else if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
}

/// Every page checked: the README, the CHANGELOG, the guide's pages, the
/// studies and the other pages beside the benches, examples and tests.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    for dir in ["src/guide", "benches", "docs", "examples", "tests"] {
        if root.join(dir).is_dir() {
            markdown_under(&root.join(dir), &mut pages);
        }
    }
    pages
}

/// The page's lines outside fenced code blocks: what Markdown renders as
/// text, links and headings.
fn outside_fences(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence {
            lines.push(line);
        }
    }
    lines
}

/// `line` with the text of each code span (between runs of as many
/// backticks) replaced by spaces.
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        let close = (i + run..chars.len()).find(|&j| {
            chars[j..].iter().take_while(|&&c| c == '`').count() == run
                && (j == 0 || chars[j - 1] != '`')
        });
        match close {
            Some(j) => {
                for c in &mut out[i + run..j] {
                    *c = ' ';
                }
                i = j + run;
            }
            None => i += run,
        }
    }
    out.into_iter().collect()
}

/// A heading's anchor as GitHub makes it (and rustdoc, for these
/// headings): lower case, spaces to hyphens, other punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c == ' ' {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of a Markdown page's headings; a repeated heading gets
/// `-1`, `-2`... as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in outside_fences(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let mut anchor = base.clone();
        let mut n = 0;
        while found.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        found.insert(anchor);
    }
    found
}

/// The anchors of the crate's front page: the headings of `src/lib.rs`'s
/// `//!` block.
fn front_page_anchors() -> BTreeSet<String> {
    let lib = read(&root().join("src/lib.rs"));
    let doc: Vec<&str> = lib
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .map(|line| {
            line.trim_start_matches("//!")
                .strip_prefix(' ')
                .unwrap_or("")
        })
        .collect();
    anchors(&doc.join("\n"))
}

/// The destinations of a line's links: inline links and images
/// (`[text](dest)`, `![alt](dest)`) and reference definitions
/// (`[label]: dest`).
fn destinations(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        if let Some((_, dest)) = trimmed.split_once("]: ") {
            found.push(dest.split_whitespace().next().unwrap_or("").to_string());
        }
    }
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0;
        let end = after.char_indices().find(|&(_, c)| match c {
            '(' => {
                depth += 1;
                false
            }
            ')' if depth == 0 => true,
            ')' => {
                depth -= 1;
                false
            }
            _ => false,
        });
        let Some((end, _)) = end else { break };
        let dest = after[..end].split_whitespace().next().unwrap_or("");
        found.push(dest.trim_matches(|c| c == '<' || c == '>').to_string());
        rest = &after[end..];
    }
    found
}

/// What checking one link found wrong, if anything.
fn check(page: &Path, dest: &str) -> Option<String> {
    if dest.is_empty() {
        return Some("an empty link".to_string());
    }
    if let Some(rest) = dest.strip_prefix(DOCS_RS) {
        return check_docs_rs(rest);
    }
    if dest.contains("://") || dest.starts_with("mailto:") {
        return None; // another site's
    }
    if dest.contains("::") {
        return check_intra_doc(dest);
    }
    let (path, anchor) = match dest.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (dest, None),
    };
    let target = if path.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().expect("a page's folder").join(path)
    };
    if !target.exists() {
        return Some(format!("{} does not exist", target.display()));
    }
    let anchor = anchor?;
    if target.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "#{anchor} into {}, which has no headings",
            target.display()
        ));
    }
    if anchors(&read(&target)).contains(anchor) {
        None
    } else {
        Some(format!("no heading #{anchor} in {}", target.display()))
    }
}

/// A link into the crate's docs.rs pages: the front page, or a guide page.
fn check_docs_rs(rest: &str) -> Option<String> {
    let (path, anchor) = match rest.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (rest, None),
    };
    let headings = match path.trim_end_matches("index.html").trim_end_matches('/') {
        "" => front_page_anchors(),
        "guide" => BTreeSet::new(),
        guide_page => match guide_page.strip_prefix("guide/") {
            Some(name) => {
                let file = root().join("src/guide").join(format!("{name}.md"));
                if !file.exists() {
                    return Some(format!("no guide page {name} ({})", file.display()));
                }
                anchors(&read(&file))
            }
            None => {
                return Some(format!(
                    "docs.rs page {path}: not the front page or the guide"
                ))
            }
        },
    };
    match anchor {
        Some(anchor) if !headings.contains(anchor) => {
            Some(format!("no heading #{anchor} on docs.rs page {path}"))
        }
        _ => None,
    }
}

/// An intra-doc link: rustdoc resolves the path; an anchor into a guide
/// page (`crate::guide::stack#the-order`) must name one of its headings.
fn check_intra_doc(dest: &str) -> Option<String> {
    let (path, anchor) = dest.split_once('#')?;
    let page = path.strip_prefix("crate::guide::")?;
    let file = root().join("src/guide").join(format!("{page}.md"));
    if !file.exists() {
        return Some(format!("no guide page {page}"));
    }
    if anchors(&read(&file)).contains(anchor) {
        None
    } else {
        Some(format!("no heading #{anchor} on the guide page {page}"))
    }
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    let mut readme_links = 0;
    for page in pages() {
        let text = read(&page);
        for line in outside_fences(&text) {
            // A link written inside a code span is code, not a link.
            for dest in destinations(&without_code_spans(line)) {
                checked += 1;
                if page.ends_with("README.md") && page.parent() == Some(root.as_path()) {
                    readme_links += 1;
                }
                if let Some(problem) = check(&page, &dest) {
                    let name = page.strip_prefix(&root).unwrap_or(&page);
                    broken.push(format!("{}: ({dest}): {problem}", name.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // The README sends a reader to the guide's pages, the studies and the
    // examples: a parser that found none would check nothing.
    assert!(
        readme_links >= 20,
        "{readme_links} links found in the README"
    );
    assert!(checked >= 150, "{checked} links found in all");
}

/// The Rust files under `dir`, its subfolders included.
fn rust_under(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_under(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn anchors_from_the_api_docs_into_the_front_page_and_the_guide_resolve() {
    let root = root();
    let front_page = front_page_anchors();
    let mut files = Vec::new();
    rust_under(&root.join("src"), &mut files);
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in files {
        let text = read(&file);
        for line in text.lines() {
            let doc = line.trim_start();
            if !(doc.starts_with("///") || doc.starts_with("//!")) {
                continue;
            }
            for dest in destinations(&without_code_spans(doc)) {
                let problem = if let Some(anchor) = dest.strip_prefix("crate#") {
                    checked += 1;
                    (!front_page.contains(anchor))
                        .then(|| format!("no heading #{anchor} on the front page"))
                } else if dest.starts_with("crate::guide::") && dest.contains('#') {
                    checked += 1;
                    check_intra_doc(&dest)
                } else {
                    None
                };
                if let Some(problem) = problem {
                    let name = file.strip_prefix(&root).unwrap_or(&file);
                    broken.push(format!("{}: ({dest}): {problem}", name.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked >= 2, "{checked} anchors found in the API docs");
}

#[test]
fn every_guide_page_is_part_of_the_guide() {
    let guide = root().join("src/guide");
    let module = read(&guide.join("mod.rs"));
    let mut pages = 0;
    for entry in fs::read_dir(&guide).expect("src/guide") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages += 1;
            let name = path.file_name().and_then(|n| n.to_str()).expect("a name");
            let include = format!("#[doc = include_str!(\"{name}\")]");
            assert!(
                module.contains(&include),
                "{name} is not in src/guide/mod.rs"
            );
        }
    }
    assert!(pages >= 10, "{pages} guide pages");
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(slug(" Why tokio's clock"), "why-tokios-clock");
    assert_eq!(
        slug(" The model router: a streaming, keyed, failed-over gateway"),
        "the-model-router-a-streaming-keyed-failed-over-gateway"
    );
    assert_eq!(slug(" tonic `Channel`"), "tonic-channel");
    let page = "# Limits\n\n```text\n# not a heading\n```\n\n## Limits\n";
    let found = anchors(page);
    assert!(
        found.contains("limits") && found.contains("limits-1"),
        "{found:?}"
    );
    assert!(!found.contains("not-a-heading"));
    assert_eq!(
        destinations("see [a](b.md#c), ![d](e.png) and `[f](g)`"),
        vec!["b.md#c", "e.png", "g"]
    );
    assert!(destinations(&without_code_spans("see `[f](g)` only")).is_empty());
}
