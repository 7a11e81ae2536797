//! Every relative link of README.md, docs/*.md and the top-level notes
//! points at a file that exists, and a `#fragment` into a Markdown file at
//! one of its headings: the README is a table of links into docs/, and a
//! moved or renamed page must not leave a dead one behind.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The Markdown files whose links are checked, relative to the crate root.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![
        PathBuf::from("README.md"),
        PathBuf::from("RELIABILITY.md"),
        PathBuf::from("SECURITY.md"),
    ];
    let mut under_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "md"))
                .filter_map(|p| p.strip_prefix(root).ok().map(Path::to_path_buf))
                .collect()
        })
        .unwrap_or_default();
    under_docs.sort();
    docs.extend(under_docs);
    docs
}

/// The text outside fenced code blocks: a shell comment or a JSON example
/// is not a link.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The targets of inline links `[text](target)` and images `![alt](target)`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        if !target.is_empty() && !target.contains(char::is_whitespace) {
            targets.push(target.to_owned());
        }
        rest = &rest[end..];
    }
    targets
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn broken_links(root: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    for doc in documents(root) {
        let Ok(text) = std::fs::read_to_string(root.join(&doc)) else {
            broken.push(format!("{}: cannot be read", doc.display()));
            continue;
        };
        let dir = doc.parent().unwrap_or(Path::new(""));
        for target in link_targets(&prose(&text)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() {
                doc.clone()
            } else {
                normalize(&dir.join(file))
            };
            let name = resolved.to_string_lossy().replace('\\', "/");
            let Ok(target_text) = std::fs::read_to_string(root.join(&resolved)) else {
                if !root.join(&resolved).exists() {
                    broken.push(format!("{}: {target}: no such file", doc.display()));
                }
                continue;
            };
            if let Some(fragment) = fragment
                && name.ends_with(".md")
                && !anchors(&target_text).contains(fragment)
            {
                broken.push(format!("{}: {target}: no such heading", doc.display()));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_of_the_docs_points_at_a_file_and_heading_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let broken = broken_links(root);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The checker finds what it claims: a missing file, a missing heading.
#[test]
fn the_link_checker_finds_a_missing_file_and_a_missing_heading() {
    let text = "see [a](gone.md) and [b](#nowhere) and [c](#here)\n\n## Here\n";
    let targets = link_targets(&prose(text));
    assert_eq!(targets, ["gone.md", "#nowhere", "#here"]);
    let headings = anchors(text);
    assert!(headings.contains("here"));
    assert!(!headings.contains("nowhere"));
    assert_eq!(
        anchor(" What the answers mean for the checkout"),
        "what-the-answers-mean-for-the-checkout"
    );
    assert_eq!(
        normalize(Path::new("docs/../RELIABILITY.md")),
        PathBuf::from("RELIABILITY.md")
    );
    let dir = std::env::temp_dir().join(format!("docs-links-{}", std::process::id()));
    let made = std::fs::create_dir_all(dir.join("docs")).and_then(|()| {
        std::fs::write(dir.join("README.md"), text)?;
        std::fs::write(dir.join("RELIABILITY.md"), "# R\n")?;
        std::fs::write(dir.join("SECURITY.md"), "# S\n")
    });
    assert!(made.is_ok(), "{made:?}");
    let broken = broken_links(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].contains("gone.md: no such file"), "{broken:?}");
    assert!(
        broken[1].contains("#nowhere: no such heading"),
        "{broken:?}"
    );
}
