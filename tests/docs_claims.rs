//! What the docs and comments cite exists, read from the text alone (no
//! database, no build):
//!
//! - every SQL function a document names (docs/*.md and the top-level
//!   notes, inline code only) is created in `sql/` or `migrations/`: a name
//!   `api_<words>`, or any name once dropped by a `DROP FUNCTION` there
//!   (a replaced function), must be a created function or a table;
//! - every Markdown file a comment or document cites (`<name>.md`) is in the
//!   repository (a path under `target/` is what a run writes, and is left
//!   out);
//! - no comment or document cites an issue number (`issue <n>`, or `#<n>` in
//!   a comment): the tracker is not part of the repository, and history goes
//!   in commit messages.
//!
//! Read: README.md and the other top-level notes, docs/, src/, tests/,
//! sql/, templates/, static/, benches/, scripts/ and deploy/; in Rust
//! sources only the comments (a string literal may name a file a test or a
//! run writes). Left out: `migrations/` and `tests/fixtures/` (the
//! migrations as they were applied, and copies of older ones: history by
//! nature, never edited once applied), and BENCHMARKS.md for the SQL
//! names (a measurement record: it names the functions a run measured,
//! in tables the bench writes and in its dated, hand-edited analysis).
//!
//! `DOCS_CLAIMS_ROOT` checks another tree instead of this crate (e.g. an
//! older commit's `git archive`), to see the checks fail on older text.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    std::env::var_os("DOCS_CLAIMS_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Files under `dir`, recursively, skipping build output, history and
/// binary assets.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        if p.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "fixtures" | "migrations") {
                walk(&p, out);
            }
        } else {
            out.push(p);
        }
    }
}

/// The top-level notes (README.md, SECURITY.md, ...) and docs/*.md.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = Vec::new();
    for dir in [root.to_path_buf(), root.join("docs")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "md") {
                docs.push(p);
            }
        }
    }
    docs.sort();
    docs
}

/// Every file whose comments or text are read (see the module comment).
fn sources(root: &Path) -> Vec<PathBuf> {
    let mut files = documents(root);
    files.push(root.join("build.rs"));
    for dir in [
        "src",
        "tests",
        "sql",
        "templates",
        "static",
        "benches",
        "scripts",
        "deploy",
    ] {
        walk(&root.join(dir), &mut files);
    }
    files.retain(|f| f.is_file());
    files
}

/// A Markdown text without its fenced code blocks.
fn without_fences(text: &str) -> String {
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

/// The inline code spans of a Markdown text (fenced blocks left out); a
/// span may run over a line break, as in a paragraph.
fn inline_code(text: &str) -> Vec<String> {
    without_fences(text)
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifiers of `text` with the character before and after each.
fn identifiers(text: &str) -> Vec<(Option<char>, String, Option<char>)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if is_ident(chars[i]) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            out.push((
                start.checked_sub(1).map(|b| chars[b]),
                chars[start..i].iter().collect(),
                chars.get(i).copied(),
            ));
        } else {
            i += 1;
        }
    }
    out
}

/// The names after `CREATE [OR REPLACE] <kind>` (lower case) in `sql`.
fn created(sql: &str, kind: &str) -> BTreeSet<String> {
    let words: Vec<String> = sql
        .split(|c: char| !(is_ident(c) || c == '.'))
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    let mut out = BTreeSet::new();
    for (i, w) in words.iter().enumerate() {
        if w != "create" {
            continue;
        }
        let mut j = i + 1;
        if words.get(j).is_some_and(|w| w == "or") {
            j += 2;
        }
        if words.get(j).is_some_and(|w| w == kind) {
            let mut k = j + 1;
            while words
                .get(k)
                .is_some_and(|w| matches!(w.as_str(), "if" | "not" | "exists" | "unlogged"))
            {
                k += 1;
            }
            if let Some(name) = words.get(k) {
                out.insert(name.rsplit('.').next().unwrap_or(name).to_owned());
            }
        }
    }
    out
}

/// The names after `DROP FUNCTION [IF EXISTS]` in `sql`.
fn dropped(sql: &str) -> BTreeSet<String> {
    let words: Vec<String> = sql
        .split(|c: char| !is_ident(c))
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    let mut out = BTreeSet::new();
    for (i, w) in words.iter().enumerate() {
        if w == "drop" && words.get(i + 1).is_some_and(|w| w == "function") {
            let mut k = i + 2;
            if words.get(k).is_some_and(|w| w == "if") {
                k += 2;
            }
            if let Some(name) = words.get(k) {
                out.insert(name.clone());
            }
        }
    }
    out
}

/// The SQL of `sql/` and `migrations/`, one text.
fn all_sql(root: &Path) -> String {
    let mut text = String::new();
    for dir in ["sql", "migrations"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            if f.extension().is_some_and(|x| x == "sql") {
                text.push_str(&std::fs::read_to_string(&f).unwrap_or_default());
                text.push('\n');
            }
        }
    }
    text
}

/// SQL functions the document `text` names that are not created in `sql`.
fn missing_functions(text: &str, sql: &str) -> BTreeSet<String> {
    let functions = created(sql, "function");
    let tables = created(sql, "table");
    let replaced = dropped(sql);
    let mut missing = BTreeSet::new();
    for span in inline_code(text) {
        for (before, name, after) in identifiers(&span) {
            // A path, a file name or a URL is not a function name.
            if before.is_some_and(|c| matches!(c, '/' | '.' | '-' | ':' | '$'))
                || after.is_some_and(|c| matches!(c, '.' | '/' | '-'))
            {
                continue;
            }
            let lower = name.to_ascii_lowercase();
            let cited = (lower.starts_with("api_") && lower.len() > 4) || replaced.contains(&lower);
            if cited && !functions.contains(&lower) && !tables.contains(&lower) {
                missing.insert(name);
            }
        }
    }
    missing
}

/// The comments of a source file, by its extension; a document's whole text.
fn comments(path: &Path, text: &str) -> String {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    let between = |open: &str, close: &str| -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find(open) {
            let after = &rest[start + open.len()..];
            let end = after.find(close).unwrap_or(after.len());
            out.push_str(&after[..end]);
            out.push('\n');
            rest = &after[end..];
        }
        out
    };
    let after_each_line = |marker: &str| -> String {
        text.lines()
            .filter_map(|l| l.find(marker).map(|i| &l[i + marker.len()..]))
            .collect::<Vec<_>>()
            .join("\n")
    };
    match ext.as_str() {
        "rs" => rust_comments(text),
        "js" => after_each_line("//") + &between("/*", "*/"),
        "css" => between("/*", "*/"),
        "sql" => after_each_line("--") + &between("/*", "*/"),
        "html" => between("<!--", "-->") + &between("{#", "#}"),
        "md" | "txt" => text.to_owned(),
        _ => after_each_line("#"),
    }
}

/// The comments of Rust source: `//` and `/* */`, string and char
/// literals left out.
fn rust_comments(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(c[i]);
                i += 1;
            }
            out.push('\n');
        } else if c[i] == '/' && next == Some('*') {
            while i < c.len() && !(c[i] == '*' && c.get(i + 1) == Some(&'/')) {
                out.push(c[i]);
                i += 1;
            }
            out.push('\n');
            i += 2;
        } else if c[i] == 'r'
            && (next == Some('"') || next == Some('#'))
            && !(i > 0 && is_ident(c[i - 1]))
        {
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            i = j + 1;
            while i < c.len() && !(c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')))
            {
                i += 1;
            }
            i += 1 + hashes;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c[i] == '\'' && (c.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A char literal ('x', '\n'); a lifetime ('a) is left as it is.
            i += 2;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The `<name>.md` files `text` cites (with their path as written).
fn cited_markdown(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices(".md") {
        let after = text[i + 3..].chars().next();
        if after.is_some_and(is_ident) {
            continue;
        }
        let start = text[..i]
            .rfind(|c: char| !(is_ident(c) || matches!(c, '/' | '.' | '-')))
            .map_or(0, |s| s + 1);
        let name = text[start..i + 3].trim_start_matches("./");
        if name.len() > 3 && !name.starts_with('.') {
            out.push(name.to_owned());
        }
    }
    out
}

/// Issue numbers in `text`: `issue <n>` / `issues <n>` anywhere, and
/// `#<n>` too when `text` is comments (not an HTML entity such as `&#39;`).
fn issue_numbers(text: &str, hashes: bool) -> Vec<String> {
    let mut out = Vec::new();
    let lower = text.to_ascii_lowercase();
    for (i, _) in lower.match_indices("issue") {
        if lower[..i].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let rest = lower[i + 5..].trim_start_matches('s');
        let rest = rest.strip_prefix(' ').unwrap_or("");
        let rest = rest.strip_prefix('#').unwrap_or(rest);
        if rest.starts_with(|c: char| c.is_ascii_digit()) {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            out.push(format!("issue {digits}"));
        }
    }
    if hashes {
        for (i, _) in text.match_indices('#') {
            let before = text[..i].chars().next_back();
            if before.is_some_and(|c| is_ident(c) || c == '&') {
                continue;
            }
            let digits: String = text[i + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let next = text[i + 1 + digits.len()..].chars().next();
            if !digits.is_empty() && !next.is_some_and(is_ident) {
                out.push(format!("#{digits}"));
            }
        }
    }
    out
}

/// Every file name in the repository (outside build output and `.git`).
fn file_names(root: &Path) -> BTreeSet<String> {
    fn all(dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.filter_map(Result::ok) {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "target" && name != ".git" {
                    all(&p, out);
                }
            } else {
                out.insert(name);
            }
        }
    }
    let mut out = BTreeSet::new();
    all(root, &mut out);
    out
}

fn relative(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

#[test]
fn every_sql_function_the_docs_name_exists() {
    let root = root();
    let sql = all_sql(&root);
    let mut faults = Vec::new();
    for doc in documents(&root) {
        if doc.file_name().is_some_and(|n| n == "BENCHMARKS.md") {
            continue;
        }
        let text = std::fs::read_to_string(&doc).unwrap_or_default();
        for name in missing_functions(&text, &sql) {
            faults.push(format!(
                "{}: `{name}` is no function or table of sql/ or migrations/",
                relative(&root, &doc)
            ));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

#[test]
fn no_comment_or_doc_cites_a_missing_file_or_an_issue() {
    let root = root();
    let names = file_names(&root);
    let mut faults = Vec::new();
    for file in sources(&root) {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue; // not text: an image
        };
        let read = comments(&file, &text);
        let is_doc = file.extension().is_some_and(|x| x == "md");
        for cited in cited_markdown(&read) {
            let base = cited.rsplit('/').next().unwrap_or(&cited);
            if !cited.starts_with("target/") && !names.contains(base) {
                faults.push(format!(
                    "{}: cites {cited}, which is not in the repository",
                    relative(&root, &file)
                ));
            }
        }
        for issue in issue_numbers(&read, !is_doc) {
            faults.push(format!(
                "{}: cites {issue}: say why in the text, history in the commit",
                relative(&root, &file)
            ));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

/// The readers find what they claim to find, on sentences the docs and
/// comments once held.
#[test]
fn the_checkers_find_what_they_claim() {
    let sql = "CREATE OR REPLACE FUNCTION api_reserve_order(p int) RETURNS int AS $$ $$;\n\
               DROP FUNCTION IF EXISTS api_reserve(bytea);\n\
               DROP FUNCTION IF EXISTS reserve_walk(int);\n\
               CREATE TABLE api_tokens (id int);";
    let doc = "`POST\n/api/v1/reservations` is `SELECT ... FROM api_reserve(...)`, \
               `api_reserve_order`, `api_tokens`, `reserve_walk` and `sql/api_callers.sql`\n\
               ```\nSELECT api_gone()\n```\n";
    assert_eq!(
        missing_functions(doc, sql).into_iter().collect::<Vec<_>>(),
        ["api_reserve", "reserve_walk"]
    );

    // The samples cite issue numbers, and so do the citations expected of
    // them, which this repository's own files may not: both live under
    // tests/fixtures/ (`.issues`: one per line), which the checkers leave out.
    let expected = |lines: &str| lines.lines().map(str::to_owned).collect::<Vec<_>>();
    let rust = include_str!("fixtures/docs_claims/comment.rs.txt");
    let read = comments(Path::new("x.rs"), rust);
    assert_eq!(cited_markdown(&read), ["NOTES.md"]);
    assert_eq!(
        issue_numbers(&read, true),
        expected(include_str!("fixtures/docs_claims/comment.rs.issues"))
    );
    let html = include_str!("fixtures/docs_claims/comment.html.txt");
    let read = comments(Path::new("x.html"), html);
    assert_eq!(cited_markdown(&read), ["docs/api.md"]);
    assert_eq!(
        issue_numbers(&read, true),
        expected(include_str!("fixtures/docs_claims/comment.html.issues"))
    );
    assert_eq!(
        issue_numbers("launchbadge/sqlx#179; Do not open a public issue", false),
        Vec::<String>::new()
    );
    let sql_comments = comments(
        Path::new("x.sql"),
        include_str!("fixtures/docs_claims/comment.sql.txt"),
    );
    assert_eq!(
        issue_numbers(&sql_comments, true),
        expected(include_str!("fixtures/docs_claims/comment.sql.issues"))
    );
}
