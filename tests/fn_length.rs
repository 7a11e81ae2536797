//! No function of `src/` is longer than `MAX_LINES` lines, from the line
//! of its `fn` to its closing brace: a longer one is split into named
//! steps. The functions are found in the source text (comments, string and
//! char literals skipped), so a test function inside `src/` counts too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 100;

/// Known offenders that another branch is rewriting (the reservation
/// contract: the reserve handler, the allocator, the reservation rows):
/// listed so this test passes meanwhile, each with its file. Empty it once
/// that work is merged; an entry that is no longer too long fails the test,
/// so the list cannot outlive its reason.
const BEING_FIXED_ELSEWHERE: &[(&str, &str)] = &[];

#[test]
fn no_function_in_src_is_longer_than_the_limit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut too_long = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable source");
        let rel = file
            .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")))
            .expect("under the manifest dir")
            .to_string_lossy()
            .replace('\\', "/");
        for f in functions(&text) {
            if f.lines > MAX_LINES {
                too_long.insert((rel.clone(), f.name), (f.line, f.lines));
            }
        }
    }
    let mut failures = Vec::new();
    for ((file, name), (line, lines)) in &too_long {
        if !BEING_FIXED_ELSEWHERE.contains(&(file.as_str(), name.as_str())) {
            failures.push(format!("{file}:{line}: fn {name} is {lines} lines"));
        }
    }
    for (file, name) in BEING_FIXED_ELSEWHERE {
        if !too_long.contains_key(&(file.to_string(), name.to_string())) {
            failures.push(format!(
                "{file}: fn {name} is allowed to be long but is not (any more): \
                 remove it from BEING_FIXED_ELSEWHERE"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "functions over {MAX_LINES} lines (split them into named steps):\n{}",
        failures.join("\n")
    );
}

/// The reader finds functions, their names and lengths, and is not fooled
/// by braces in strings, chars and comments.
#[test]
fn the_reader_measures_functions() {
    let text = r####"
/// A doc comment with fn fake() { and a brace.
pub(crate) async fn first(a: &str) -> Result<(), E> {
    let s = "}}} fn inner_str() {";
    let r = r#"{ "#;
    let c = '{';
    // }
    /* } fn commented() { */
    Ok(())
}

trait T {
    fn declared(&self);
    fn provided(&self) -> u8 {
        let b = b'}';
        1
    }
}
"####;
    let found: Vec<(String, usize, usize)> = functions(text)
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    assert_eq!(
        found,
        vec![("first".into(), 3, 8), ("provided".into(), 14, 4)]
    );
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("readable dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

struct Function {
    name: String,
    /// The line of its `fn`, from 1.
    line: usize,
    /// From the `fn` line to the closing brace's, both included.
    lines: usize,
}

/// The source with comments and string, byte and char literals blanked
/// (newlines kept, so that lines still count).
fn blank(text: &str) -> Vec<char> {
    let c: Vec<char> = text.chars().collect();
    let mut out = c.clone();
    let mut i = 0;
    let wipe = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in out.iter_mut().take(to.min(c.len())).skip(from) {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        let prev_ident = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        if ch == '/' && next == Some('/') {
            let start = i;
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
            wipe(&mut out, start, i);
        } else if ch == '/' && next == Some('*') {
            let start = i;
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            wipe(&mut out, start, i);
        } else if !prev_ident && (ch == 'r' || (ch == 'b' && next == Some('r'))) && {
            let mut j = if ch == 'b' { i + 2 } else { i + 1 };
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"') && (j > i + 1 || ch == 'r')
        } {
            // A raw string: r"...", r#"..."#, br"...".
            let start = i;
            i += if ch == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            wipe(&mut out, start, i);
        } else if ch == '"' {
            let start = i;
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            wipe(&mut out, start, i);
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let start = i;
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                wipe(&mut out, start, i);
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
                wipe(&mut out, start, i);
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Every function with a body: `fn name` then, before any `;`, its `{`,
/// and the brace that closes it.
fn functions(text: &str) -> Vec<Function> {
    let c = blank(text);
    let line_at = |i: usize| c[..i].iter().filter(|ch| **ch == '\n').count() + 1;
    let is_ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i + 2 < c.len() {
        let starts_fn = c[i] == 'f'
            && c[i + 1] == 'n'
            && c[i + 2].is_whitespace()
            && (i == 0 || !is_ident(c[i - 1]));
        if !starts_fn {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        while j < c.len() && c[j].is_whitespace() {
            j += 1;
        }
        let name_start = j;
        while j < c.len() && is_ident(c[j]) {
            j += 1;
        }
        if j == name_start {
            // `fn $name` in a macro, or `fn(` a pointer type.
            i += 2;
            continue;
        }
        let name: String = c[name_start..j].iter().collect();
        while j < c.len() && c[j] != '{' && c[j] != ';' {
            j += 1;
        }
        if j >= c.len() || c[j] == ';' {
            i = j;
            continue;
        }
        let open = j;
        let mut depth = 0usize;
        while j < c.len() {
            match c[j] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        let line = line_at(i);
        out.push(Function {
            name,
            line,
            lines: line_at(j.min(c.len() - 1)) - line + 1,
        });
        // Functions inside this one are measured too.
        i = open + 1;
    }
    out
}
