//! Records the git commit the build comes from, for `--version`. `RESULT_INBOX_COMMIT`, when set,
//! names it (a build from a source tarball has no `.git`); otherwise `git rev-parse` in the
//! checkout; otherwise `unknown`. Rebuilt when HEAD moves, so the line never names an old commit.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=RESULT_INBOX_COMMIT");
    #[allow(clippy::disallowed_methods)] // a build script's input, not the receiver's configuration
    let given = std::env::var("RESULT_INBOX_COMMIT")
        .ok()
        .filter(|c| !c.is_empty());
    let commit = given.or_else(|| {
        // Watch what moves when a commit is made or checked out: HEAD, the branch it names,
        // and the packed refs. Only files that exist (a missing one would rebuild every time).
        if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
            let dir = std::path::PathBuf::from(dir);
            let mut watched = vec![dir.join("HEAD"), dir.join("packed-refs")];
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watched.push(dir.join(branch));
            }
            for path in watched.iter().filter(|p| p.is_file()) {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
        git(&["rev-parse", "--short=12", "HEAD"])
    });
    println!(
        "cargo:rustc-env=RESULT_INBOX_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
