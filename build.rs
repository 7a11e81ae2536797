//! Records the git commit the binary is built from, for
//! `poolkeeper_build_info` (`unknown` when built outside a git checkout).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=POOLKEEPER_GIT_COMMIT");
    let commit = std::env::var("POOLKEEPER_GIT_COMMIT").ok().or_else(|| {
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    });
    if let Some(c) = commit {
        println!("cargo:rustc-env=POOLKEEPER_GIT_COMMIT={c}");
    }
}
