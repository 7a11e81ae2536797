//! docs/rules.md defines every rule the code cites, and each rule names the
//! tests that would fail if it were broken. This test keeps the two true:
//! a rule cited in `src/` or `sql/` and defined nowhere fails it, and so
//! does a rule with no test or a test name that no longer exists.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const DOC: &str = "docs/rules.md";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A rule name: R1-R99, L1-L9, F1-F9 or S1-S9, as a whole word.
fn rule_names(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut found = BTreeSet::new();
    for (i, &b) in bytes.iter().enumerate() {
        if !matches!(b, b'R' | b'L' | b'F' | b'S') {
            continue;
        }
        let before_ok = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if !before_ok {
            continue;
        }
        let digits: String = bytes[i + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .map(|&c| c as char)
            .collect();
        if digits.is_empty() || digits.starts_with('0') || digits.len() > 2 {
            continue;
        }
        let end = i + 1 + digits.len();
        let after_ok =
            end >= bytes.len() || !(bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_');
        if !after_ok {
            continue;
        }
        let n: u32 = digits.parse().unwrap_or(0);
        let known = match b {
            b'R' => (1..=21).contains(&n),
            b'L' => (1..=6).contains(&n),
            b'S' => (1..=3).contains(&n),
            _ => (1..=5).contains(&n),
        };
        if known {
            found.insert(format!("{}{}", b as char, n));
        }
    }
    found
}

fn files_under(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, exts, out);
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| exts.contains(&e))
        {
            out.push(path);
        }
    }
}

/// A rule of the doc: the backquoted `module::test_name` entries of its
/// "Tests:" item, and whether it says "Status: not built yet".
#[derive(Default)]
struct Rule {
    tests: Vec<String>,
    unbuilt: bool,
}

/// The doc's rules, by their `### R5. Title` headings.
fn doc_rules() -> BTreeMap<String, Rule> {
    let text = fs::read_to_string(root().join(DOC)).unwrap_or_else(|e| panic!("{DOC}: {e}"));
    let mut rules: BTreeMap<String, Rule> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut in_tests = false;
    for line in text.lines() {
        if let Some(head) = line.strip_prefix("### ") {
            let name = head.split('.').next().unwrap_or("").trim().to_owned();
            assert!(
                rule_names(&name).contains(&name),
                "{DOC}: heading {line:?} does not start with a rule name"
            );
            assert!(
                rules.insert(name.clone(), Rule::default()).is_none(),
                "{DOC}: {name} is defined twice"
            );
            current = Some(name);
            in_tests = false;
            continue;
        }
        if line.starts_with("## ") {
            current = None;
            continue;
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with("- ") {
            in_tests = trimmed.starts_with("- Tests:");
            if trimmed.starts_with("- Status: not built yet")
                && let Some(rule) = &current
            {
                rules.entry(rule.clone()).or_default().unbuilt = true;
            }
        }
        if let (Some(rule), true) = (&current, in_tests) {
            let entry = rules.entry(rule.clone()).or_default();
            for (i, part) in line.split('`').enumerate() {
                if i % 2 == 1 && part.contains("::") {
                    entry.tests.push(part.to_owned());
                }
            }
        }
    }
    rules
}

/// Whether `tests/api/<module>.rs` (or `tests/components/<module>.rs`, or
/// `tests/<module>.rs`) has a test
/// function of that name: `fn name(` with a test attribute just above it.
fn test_exists(path: &str) -> Result<(), String> {
    let (module, name) = path
        .rsplit_once("::")
        .ok_or_else(|| format!("{path}: not module::name"))?;
    let module_path = module.replace("::", "/");
    let candidates = [
        root().join("tests/api").join(format!("{module_path}.rs")),
        root()
            .join("tests/components")
            .join(format!("{module_path}.rs")),
        root().join("tests").join(format!("{module_path}.rs")),
    ];
    let file = candidates
        .iter()
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{path}: no file tests/api/{module_path}.rs"))?;
    let text = fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let lines: Vec<&str> = text.lines().collect();
    let signature = format!("fn {name}(");
    let at = lines
        .iter()
        .position(|l| l.contains(&signature))
        .ok_or_else(|| format!("{path}: no function {name} in {}", file.display()))?;
    let above = &lines[at.saturating_sub(4)..at];
    if above
        .iter()
        .any(|l| l.trim_start().starts_with("#[tokio::test") || l.trim_start() == "#[test]")
    {
        Ok(())
    } else {
        Err(format!("{path}: {name} is not a test function"))
    }
}

#[test]
fn every_rule_the_code_cites_is_defined_in_the_rules_doc() {
    let defined = doc_rules();
    let mut cited_unbuilt = BTreeSet::new();
    let mut sources = Vec::new();
    files_under(&root().join("src"), &["rs"], &mut sources);
    files_under(&root().join("sql"), &["sql"], &mut sources);
    assert!(!sources.is_empty(), "no sources found under src/ and sql/");
    let mut undefined: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &sources {
        let text = fs::read_to_string(file).unwrap_or_default();
        for rule in rule_names(&text) {
            if defined.get(&rule).is_some_and(|r| r.unbuilt) {
                cited_unbuilt.insert(rule.clone());
            }
            if !defined.contains_key(&rule) {
                let shown = file
                    .strip_prefix(root())
                    .unwrap_or(file)
                    .display()
                    .to_string();
                undefined.entry(rule).or_default().insert(shown);
            }
        }
    }
    assert!(
        undefined.is_empty(),
        "rules cited but not defined in {DOC}: {undefined:?}"
    );
    assert!(
        cited_unbuilt.is_empty(),
        "rules the code cites but {DOC} says are not built yet (name their tests): {cited_unbuilt:?}"
    );
}

#[test]
fn every_rule_names_tests_that_exist() {
    let rules = doc_rules();
    for expected in ["R1", "R16", "L1", "L6", "F1", "F4", "S1", "S3"] {
        assert!(
            rules.contains_key(expected),
            "{DOC} does not define {expected}"
        );
    }
    let mut problems = Vec::new();
    for (rule, r) in &rules {
        if r.tests.is_empty() && !r.unbuilt {
            problems.push(format!("{rule} names no test"));
        }
        for t in &r.tests {
            if let Err(e) = test_exists(t) {
                problems.push(format!("{rule}: {e}"));
            }
        }
    }
    assert!(problems.is_empty(), "{DOC}:\n{}", problems.join("\n"));
}

#[test]
fn rule_names_are_read_as_whole_words() {
    let found = rule_names("R1 R13, (L3) F4: xR2 R0 R99 R5a L7 F1-F4 `R16`");
    let want: BTreeSet<String> = ["R1", "R13", "L3", "F4", "F1", "R16"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, want);
}
