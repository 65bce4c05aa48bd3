//! Records the commit the campaign code was built from, so every `campaign.json` names the code
//! that produced it (a report's run description cites it).

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FAULTLINE_COMMIT={commit}");
    // A new commit or checkout moves HEAD's log; rebuild then so the hash stays true.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/logs/HEAD");
        println!("cargo:rerun-if-changed={dir}/HEAD");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
