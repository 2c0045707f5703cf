//! Records the commit holdfast is built from, for `holdfast_build_info` and `--version`
//! readers: `git rev-parse`, else `HOLDFAST_COMMIT` from the environment (a container build
//! without `.git`), else `unknown`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=HOLDFAST_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let from_git = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let commit = from_git
        .or_else(|| std::env::var("HOLDFAST_COMMIT").ok())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=HOLDFAST_COMMIT={commit}");
}
