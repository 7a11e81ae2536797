//! Records the git commit the binary is built from, for
//! `poolkeeper_build_info` (`unknown` when built outside a git checkout).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=POOLKEEPER_GIT_COMMIT");
    // A commit or checkout moves HEAD and appends to its log.
    for path in ["HEAD", "logs/HEAD"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    let commit = std::env::var("POOLKEEPER_GIT_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    if let Some(c) = commit {
        println!("cargo:rustc-env=POOLKEEPER_GIT_COMMIT={c}");
    }
}

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}
