//! The module graph is a ladder: each module of `src/` sits on a
//! rung, imports only from its own rung or the rungs below, and no two
//! modules import each other, even through others; nor do two of the
//! crate's top modules (a folder with its files counts as one). The graph is drawn from
//! the source text: `use` trees and paths that start with `crate::`,
//! `super::`, `self::` or a child module's name, each pointing at the
//! deepest module (file) it names. Comments and string literals are skipped.
//! docs/architecture.md, "Source tree", says the same ladder in prose.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The rungs, bottom first. A module of `src/` that is on no rung fails the
/// test: put it on one here and in docs/architecture.md, "Source tree".
const RUNGS: &[(&str, &[&str])] = &[
    (
        "bottom: the database handle, settings, domain types, errors, metrics",
        &[
            "db",
            "db::connect",
            "db::definitions",
            "db::errors",
            "db::handle",
            "db::incarnation",
            "db::lock_order",
            "db::migrations",
            "db::read_only",
            "domain",
            "embedded_pg",
            "error",
            "forecast",
            "metrics",
            "metrics::global",
            "metrics::http",
            "metrics::process",
            "metrics::refusals",
            "metrics::snapshot",
            "settings",
            "telemetry",
        ],
    ),
    (
        "rules: what the product decides, over the bottom",
        &[
            "activity",
            "allocator",
            "audit",
            "capacity",
            "demand",
            "healing",
            "holds",
            "inventory",
            "lease",
            "orgs",
            "planning",
            "reservations",
            "reservations::orders",
            "reservations::reads",
            "reservations::rows",
            "reservations::services",
            "reservations::transitions",
            "sso",
            "staff",
            "tokens",
            "webhooks::delivery",
            "webhooks::outbox",
            "webhooks::registration",
            "webhooks::signatures",
            "webhooks::urls",
        ],
    ),
    (
        "workers: background loops over the rules",
        &["sweep", "webhooks", "webhooks::worker"],
    ),
    (
        "pages: HTTP over the rules and workers' reads",
        &[
            "api",
            "api::caller",
            "api::capacity",
            "api::json",
            "api::machines",
            "api::openapi",
            "api::planning",
            "api::reservations",
            "api::schemas",
            "api::services",
            "api::webhook",
            "api::write",
            "dashboard",
            "dashboard::admin",
            "dashboard::assets",
            "dashboard::csrf",
            "dashboard::csv",
            "dashboard::demand",
            "dashboard::error",
            "dashboard::gate",
            "dashboard::input",
            "dashboard::jobs",
            "dashboard::layout",
            "dashboard::login",
            "dashboard::machines",
            "dashboard::org_settings",
            "dashboard::outcome",
            "dashboard::overview",
            "dashboard::planning",
            "dashboard::reasons",
            "dashboard::reservations",
            "dashboard::reservations::actions",
            "dashboard::reservations::detail",
            "dashboard::reservations::list",
            "dashboard::search",
            "dashboard::session",
            "dashboard::sso",
            "dashboard::status_changes",
            "dashboard::throttle",
            "dashboard::view",
            "dashboard::why_not",
            "head",
            "ops",
            "security_headers",
        ],
    ),
    (
        "top: the app, the server, the command line, the demo",
        &["cli", "demo", "serve", "startup"],
    ),
];

#[test]
fn module_graph_has_no_cycle() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "modules import each other in a circle: {}",
            cycle.join(" -> ")
        );
    }
}

/// A folder is one part: `db::migrations` importing `definitions` while
/// `definitions` imports `db::errors` is no circle of files, but `db` and
/// `definitions` import each other.
#[test]
fn top_modules_do_not_import_each_other() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    if let Some(cycle) = find_cycle(&top_modules(&graph)) {
        panic!(
            "top modules (a folder with its files is one) import each other in a circle: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn module_graph_is_a_ladder() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let mut rung_of = BTreeMap::new();
    for (i, (_, modules)) in RUNGS.iter().enumerate() {
        for m in *modules {
            assert!(
                rung_of.insert(m.to_string(), i).is_none(),
                "{m} is on two rungs"
            );
        }
    }
    let mut faults = Vec::new();
    for m in graph.keys() {
        if !rung_of.contains_key(m) {
            faults.push(format!("{m} is on no rung (tests/module_graph.rs RUNGS)"));
        }
    }
    for m in rung_of.keys() {
        if !graph.contains_key(m) {
            faults.push(format!("{m} is on a rung but is no module of src/"));
        }
    }
    for (from, tos) in &graph {
        for to in tos {
            if let (Some(&a), Some(&b)) = (rung_of.get(from), rung_of.get(to))
                && b > a
            {
                faults.push(format!(
                    "{from} ({}) imports {to} ({}): upward",
                    RUNGS[a].0, RUNGS[b].0
                ));
            }
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

/// The graph sees what it claims to see: circles it must refuse, drawn
/// from small sources, are found.
#[test]
fn the_graph_reader_sees_imports() {
    let files = [
        ("db", "use crate::lease::Timings;\nfn f() {}"),
        (
            "lease",
            "// use crate::db::Db;\nfn f() { let s = \"crate::db\"; crate::metrics::x(); }",
        ),
        (
            "metrics",
            "use crate::{demand::{RefusalLabels, X}, settings};",
        ),
        ("demand", "pub fn f() -> crate::db::Db { todo!() }"),
        ("settings", ""),
        ("dashboard", "pub mod csrf;\npub use csrf::Token;"),
        (
            "dashboard::csrf",
            "use super::session::Staff;\nmod tests { use super::same; }",
        ),
        ("dashboard::session", "fn f() { super::csrf::check() }"),
    ];
    let known: BTreeSet<String> = files.iter().map(|(m, _)| m.to_string()).collect();
    let graph: BTreeMap<String, BTreeSet<String>> = files
        .iter()
        .map(|(m, text)| (m.to_string(), imports(m, text, &known)))
        .collect();
    let edges = |m: &str| graph[m].iter().cloned().collect::<Vec<_>>();
    assert_eq!(edges("db"), ["lease"]);
    assert_eq!(edges("lease"), ["metrics"]);
    assert_eq!(edges("metrics"), ["demand", "settings"]);
    assert_eq!(edges("demand"), ["db"]);
    assert_eq!(edges("dashboard"), ["dashboard::csrf"]);
    assert_eq!(edges("dashboard::csrf"), ["dashboard::session"]);
    assert_eq!(edges("dashboard::session"), ["dashboard::csrf"]);
    let cycle = find_cycle(&graph).expect("a circle");
    assert!(cycle.len() > 2, "{cycle:?}");

    // A circle between a folder and a file that no file closes: found
    // only by the graph of top modules.
    let files = [
        ("db", "pub use migrations::*;"),
        ("db::migrations", "fn f() { crate::definitions::apply() }"),
        ("db::errors", ""),
        ("definitions", "fn f() { crate::db::errors::sqlstate() }"),
    ];
    let known: BTreeSet<String> = files.iter().map(|(m, _)| m.to_string()).collect();
    let graph: BTreeMap<String, BTreeSet<String>> = files
        .iter()
        .map(|(m, text)| (m.to_string(), imports(m, text, &known)))
        .collect();
    assert_eq!(find_cycle(&graph), None);
    assert_eq!(
        find_cycle(&top_modules(&graph)),
        Some(vec![
            "db".to_owned(),
            "definitions".to_owned(),
            "db".to_owned()
        ])
    );
}

/// The graph of the crate's top modules: each module counted as the top
/// module it is in, imports within one left out.
fn top_modules(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_owned();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in graph {
        let edges = out.entry(top(from)).or_default();
        edges.extend(tos.iter().map(|t| top(t)).filter(|t| *t != top(from)));
    }
    out
}

/// Every module of `src/` (one per file; `lib.rs` and `main.rs` are the
/// crate roots and stand outside) with the modules it imports.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("under src");
        let mut segments: Vec<String> = rel
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        let last = segments.pop().expect("a file name");
        if segments.is_empty() && (last == "lib.rs" || last == "main.rs") {
            continue;
        }
        if last != "mod.rs" {
            segments.push(last.trim_end_matches(".rs").to_string());
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        modules.insert(segments.join("::"), text);
    }
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(m, text)| (m.clone(), imports(m, text, &known)))
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
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

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Path, // ::
    Open,
    Close,
    Comma,
    Semi,
    Other,
}

/// Rust source as tokens, without comments, string and char literals.
fn tokens(text: &str) -> Vec<Tok> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
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
        } else if ch == 'r' && (next == Some('#') || next == Some('"')) && {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"')
        } {
            let mut hashes = 0;
            i += 1;
            while c[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            'raw: while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break 'raw;
                }
                i += 1;
            }
            out.push(Tok::Other);
        } else if ch == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(Tok::Other);
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
            out.push(Tok::Other);
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(c[start..i].iter().collect()));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Other);
        } else {
            i += 1;
            out.push(match ch {
                ':' if next == Some(':') => {
                    i += 1;
                    Tok::Path
                }
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                ';' => Tok::Semi,
                c if c.is_whitespace() => continue,
                _ => Tok::Other,
            });
        }
    }
    out
}

/// The modules (of `known`) that `module`'s source imports, itself left out.
fn imports(module: &str, text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let toks = tokens(text);
    let file: Vec<String> = module.split("::").map(String::from).collect();
    let mut found = BTreeSet::new();
    // Inline modules (`mod tests { ... }`) the cursor is in, with the brace
    // depth at which each closes.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let here: Vec<String> = file
            .iter()
            .cloned()
            .chain(inline.iter().map(|(m, _)| m.clone()))
            .collect();
        match &toks[i] {
            Tok::Open => {
                depth += 1;
                i += 1;
            }
            Tok::Close => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open)) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth + 1));
                }
                i += 1;
            }
            Tok::Ident(kw) if kw == "use" => {
                let mut paths = Vec::new();
                i = use_tree(&toks, i + 1, Vec::new(), &mut paths);
                for p in paths {
                    resolve(&here, inline.len(), &p, known, &mut found);
                }
            }
            Tok::Ident(first) if i == 0 || toks[i - 1] != Tok::Path => {
                let mut path = vec![first.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::Path) {
                    match toks.get(j + 1) {
                        Some(Tok::Ident(s)) => path.push(s.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                if path.len() > 1 {
                    resolve(&here, inline.len(), &path, known, &mut found);
                }
                i = j.max(i + 1);
            }
            _ => i += 1,
        }
    }
    found.remove(module);
    found
}

/// Reads a use tree from `i` (after `use` or inside braces) into full
/// paths; returns where it stopped (past the `;` at top level).
fn use_tree(toks: &[Tok], mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.clone();
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(s) => path.push(s.clone()),
            Tok::Path => {}
            Tok::Open => {
                i = use_tree(toks, i + 1, path.clone(), out);
                path = prefix.clone();
                continue;
            }
            Tok::Comma => {
                if path.len() > prefix.len() {
                    out.push(std::mem::replace(&mut path, prefix.clone()));
                }
            }
            Tok::Close => {
                if path.len() > prefix.len() {
                    out.push(path);
                }
                return i + 1;
            }
            Tok::Semi => {
                if path.len() > prefix.len() {
                    out.push(path);
                }
                return i + 1;
            }
            Tok::Other => {} // `*`, `as` names are idents: harmless
        }
        i += 1;
    }
    i
}

/// Adds the deepest known module that `path`, written in module `here`
/// (`inline` of whose last segments are inline modules), names.
fn resolve(
    here: &[String],
    inline: usize,
    path: &[String],
    known: &BTreeSet<String>,
    found: &mut BTreeSet<String>,
) {
    let mut abs: Vec<String> = match path[0].as_str() {
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => here.to_vec(),
        _ if inline == 0 => here.to_vec(), // a child module's name, maybe
        _ => return,
    };
    let mut rest = path;
    if rest[0] == "crate" || rest[0] == "self" {
        rest = &rest[1..];
    }
    while rest.first().is_some_and(|s| s == "super") {
        abs.pop();
        rest = &rest[1..];
    }
    abs.extend(rest.iter().cloned());
    let deepest = (1..=abs.len())
        .rev()
        .map(|n| abs[..n].join("::"))
        .find(|m| known.contains(m));
    // A bare name (not `crate::`/`super::`) counts only when it is a child.
    let child_named = path[0] != "crate" && path[0] != "self" && path[0] != "super";
    if let Some(m) = deepest
        && (!child_named || m.split("::").count() > here.len())
    {
        found.insert(m);
    }
}

/// One circle of the graph, if any, as its modules in order.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // 0 unseen, 1 on the current path, 2 done.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for n in graph.get(m).into_iter().flatten() {
            match state.get(n.as_str()).copied().unwrap_or(0) {
                1 => {
                    let start = stack.iter().position(|s| s == n).expect("on the path");
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(n.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(n, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        if state.get(m.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(m, graph, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// Prints the graph: `cargo test --test module_graph print -- --ignored --nocapture`.
#[test]
#[ignore]
fn print() {
    let graph = module_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for (m, tos) in &graph {
        println!(
            "{m} -> {}",
            tos.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
}
