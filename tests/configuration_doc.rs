//! The configuration is declared once (`settings::VARIABLES`): the table of
//! docs/configuration.md and `poolkeeper --help` / `serve --help` must list
//! exactly those variables, with the same defaults.

use std::path::PathBuf;
use std::process::Command;

use poolkeeper::settings::VARIABLES;

/// The rows of the first table under "## Environment": (name, default).
fn documented() -> Vec<(String, String)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let section = text
        .split("## Environment")
        .nth(1)
        .expect("docs/configuration.md has an Environment section");
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let plain = |c: &str| c.replace('`', "");
            (plain(cells[1]), plain(cells[2]))
        })
        .collect()
}

#[test]
fn the_documented_configuration_is_the_declared_one() {
    let declared: Vec<(String, String)> = VARIABLES
        .iter()
        .map(|v| (v.name.to_owned(), v.default_text().to_owned()))
        .collect();
    assert_eq!(
        documented(),
        declared,
        "docs/configuration.md's table and settings::VARIABLES differ (names, order or defaults)"
    );
}

#[test]
fn help_lists_every_variable() {
    for args in [&["--help"][..], &["serve", "--help"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_poolkeeper"))
            .args(args)
            .output()
            .expect("run poolkeeper");
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        for v in VARIABLES {
            assert!(
                text.contains(v.name) && text.contains(v.default_text()),
                "`poolkeeper {}` does not list {} (default {})",
                args.join(" "),
                v.name,
                v.default_text()
            );
        }
    }
}
