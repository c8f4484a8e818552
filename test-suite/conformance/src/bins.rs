//! The workspace's binaries a test runs, and how it starts them: with a bare environment,
//! tied to the test process.

use std::path::PathBuf;

/// The variable `make integration` marks every process of one run with; its leftover check
/// finds processes by it.
pub const RUN_MARKER: &str = "RESULT_INBOX_RUN";

/// A command for `bin` with an empty environment, except the run marker (kept so that the
/// leftover check still sees the process).
pub fn bare_command(bin: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin);
    bare(&mut cmd);
    cmd
}

/// Empties `cmd`'s environment but for the run's marker, as [`bare_command`] does (for a
/// command made elsewhere, e.g. to run in a network namespace).
pub fn bare(cmd: &mut std::process::Command) {
    cmd.env_clear();
    #[allow(clippy::disallowed_methods)] // the harness's own marker
    if let Some(marker) = std::env::var_os(RUN_MARKER) {
        cmd.env(RUN_MARKER, marker);
    }
}

/// Every file (anything but a directory) below `dir`: what a run left behind there. Empty
/// directories do not count; a missing `dir` has none.
pub fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// Spawns `cmd` tied to this test process (it dies with it, see `testdb::spawn_tied`).
pub fn spawn(cmd: std::process::Command) -> std::process::Child {
    let program = cmd.get_program().to_string_lossy().into_owned();
    testdb::spawn_tied(cmd).unwrap_or_else(|e| panic!("cannot start {program}: {e}"))
}

/// `target/<profile>`, where the binaries of this workspace sit beside this test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // A test binary lives in target/<profile>/deps/, a harness binary in target/<profile>/.
    let mut dir = exe.parent().expect("target/<profile>/…");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().expect("target/<profile>");
    }
    dir.to_path_buf()
}

/// `path` under `target/<profile>`, which must exist: `build` says how to make it.
fn built(path: &str, build: &str) -> PathBuf {
    let bin = profile_dir().join(path);
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `{build}` (`make build` does)",
        bin.display()
    );
    bin
}

/// A release tarball of `target/dist` (`make dist`, `make kit-dist`) whose name is `prefix`, a
/// version, and `-x86_64-linux.tar.gz`.
pub fn dist_tarball(prefix: &str) -> PathBuf {
    let dist = profile_dir().join("../dist");
    std::fs::read_dir(&dist)
        .unwrap_or_else(|e| panic!("{}: {e}: make dist kit-dist first", dist.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.strip_prefix(prefix)
                .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
                && name.ends_with("-x86_64-linux.tar.gz")
        })
        .unwrap_or_else(|| {
            panic!(
                "no {prefix}<version>-x86_64-linux.tar.gz in {}: make dist kit-dist",
                dist.display()
            )
        })
}

/// A binary of this workspace (`target/<profile>/<name>`).
pub fn workspace_bin(name: &str) -> PathBuf {
    built(name, "cargo build --workspace --bins")
}

/// An example of this workspace (`target/<profile>/examples/<name>`).
pub fn workspace_example(name: &str) -> PathBuf {
    built(
        &format!("examples/{name}"),
        "cargo build --workspace --examples",
    )
}

/// The `receiver` binary.
pub fn receiver_bin() -> PathBuf {
    workspace_bin("receiver")
}

/// Runs `receiver ARGS` with only `env` (and what [`bare_command`] keeps), `stdin` written to
/// it and closed; its exit and output.
pub fn run_receiver(
    args: &[&str],
    env: &[(&str, String)],
    stdin: Option<&[u8]>,
) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = bare_command(&receiver_bin())
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("receiver runs");
    let mut input = child.stdin.take().expect("a piped stdin");
    if let Some(bytes) = stdin {
        input.write_all(bytes).expect("stdin written");
    }
    drop(input);
    child.wait_with_output().expect("receiver ends")
}
