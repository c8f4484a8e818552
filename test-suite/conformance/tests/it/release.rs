//! What a user installs and follows (R-OPS-4): the install (`make install` and the release
//! package's `install.sh`, with `PREFIX` and `DESTDIR`), the release package, and the shell
//! blocks of docs/operations.md ("From nothing to a running receiver") and of the kit's
//! QUICKSTART.md, run as written.
//!
//! The blocks run for real on a clean Debian container, from the release package, in
//! `make integration-containers` (the ignored test below); here they are checked to be there,
//! in order, and to parse.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use fixtures::docs::{marked_blocks, script};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("release-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `bash -n`: the script parses.
fn parses(what: &str, text: &str) {
    let dir = scratch("parse");
    let file = dir.join("script.sh");
    std::fs::write(&file, text).unwrap();
    let out = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        out.status.success(),
        "{what} does not parse: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn install_sh_puts_every_file_below_destdir_and_prefix_and_the_units_name_prefix() {
    let dir = scratch("install");
    let stage = dir.join("stage");
    let out = Command::new(repo().join("scripts/dist"))
        .arg("stage")
        .arg(&stage)
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/dist stage (make release first): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = dir.join("root");
    let out = Command::new(stage.join("install.sh"))
        .env("PREFIX", "/opt/result-inbox")
        .env("DESTDIR", &root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let prefix = root.join("opt/result-inbox");
    for file in [
        "bin/receiver",
        "lib/systemd/system/receiver-consume.service",
        "lib/systemd/system/receiver-prune.service",
        "lib/systemd/system/receiver-prune.timer",
        "lib/systemd/system/receiver-reconcile-audit.service",
        "lib/systemd/system/receiver-reconcile-audit.timer",
        "share/result-inbox/schema/schema.sql",
        "share/result-inbox/schema/grants.sql",
        "share/result-inbox/prometheus/receiver-alerts.yml",
        "share/result-inbox/grafana/receiver-dashboard.json",
        "share/doc/result-inbox/README.md",
        "share/doc/result-inbox/CHANGELOG.md",
        "share/doc/result-inbox/docs/operations.md",
    ] {
        assert!(prefix.join(file).is_file(), "{file} is not installed");
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(prefix.join("bin/receiver"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    // Nothing outside DESTDIR, nothing left of the placeholder, and every unit names the
    // binary and a page that are installed where PREFIX says.
    assert_eq!(
        std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>(),
        ["opt"]
    );
    for unit in std::fs::read_dir(prefix.join("lib/systemd/system")).unwrap() {
        let unit = unit.unwrap().path();
        let text = read(&unit);
        assert!(!text.contains("@PREFIX@"), "{}", unit.display());
        assert!(
            !text.contains("/usr/local"),
            "{} names /usr/local",
            unit.display()
        );
        for line in text.lines() {
            if let Some(doc) = line.strip_prefix("Documentation=file://") {
                let installed = root.join(doc.trim_start_matches('/'));
                assert!(
                    installed.is_file(),
                    "{}: {doc} is not installed",
                    unit.display()
                );
            }
            if line.starts_with("ExecStart=") {
                assert!(line.contains("/opt/result-inbox/bin/receiver"), "{line}");
            }
        }
    }
    let version = Command::new(prefix.join("bin/receiver"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("receiver "));
    // A relative PREFIX is refused in one line, and installs nothing.
    let out = Command::new(stage.join("install.sh"))
        .env("PREFIX", "opt/x")
        .env("DESTDIR", dir.join("other"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PREFIX must be an absolute path"));
    assert!(!dir.join("other").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_walkthrough_and_the_quickstart_are_marked_in_order_and_parse() {
    let operations = read(&repo().join("docs/operations.md"));
    let blocks = marked_blocks(&operations, "walkthrough");
    // Every step of "From nothing to a running receiver", in order.
    let steps = [
        "install.sh",
        "CREATE USER 'receiver_prune'",
        "receiver init",
        "receiver migrate --dry-run",
        "orbit-dev bootstrap",
        "/v1/subscriptions",
        "receiver.env",
        "receiver consume",
        "/readyz",
        "prune --older-than 30d --dry-run",
        "reconcile --since",
    ];
    assert_eq!(blocks.len(), steps.len(), "one marked block a step");
    for (block, step) in blocks.iter().zip(steps) {
        assert!(block.contains(step), "the block for {step:?} is:\n{block}");
    }
    parses("the walkthrough", &script(&operations, "walkthrough"));
    let quickstart = read(&repo().join("deploy/kit/QUICKSTART.md"));
    for mark in ["quickstart", "quickstart-image"] {
        assert_eq!(marked_blocks(&quickstart, mark).len(), 1, "{mark}");
        parses(mark, &script(&quickstart, mark));
    }
}

/// docs/operations.md's walkthrough, every marked block in order, as root on a clean Debian 12
/// container (`WALKTHROUGH_IMAGE`: Debian's base, `mariadb-server` and `curl`, nothing else),
/// with no network, from the release package and the kit's package. The only step before the
/// blocks is what Debian's package does on a machine with an init system: make the datadir and
/// start the server.
#[test]
#[ignore = "needs our container engine and both packages: make integration-containers runs it"]
fn the_walkthrough_runs_from_the_release_package_on_a_clean_debian() {
    #[allow(clippy::disallowed_methods)] // set by scripts/containers run
    let image = std::env::var("WALKTHROUGH_IMAGE").expect("WALKTHROUGH_IMAGE names the image");
    #[allow(clippy::disallowed_methods)] // set by scripts/containers run
    let engine = std::env::var("DOCKER_HOST").expect("DOCKER_HOST names the engine");
    let release = fixtures::bins::dist_tarball("result-inbox-");
    let kit = fixtures::bins::dist_tarball("result-inbox-kit-");
    // The package matches its checksum, as a user would check it.
    let sums = read(&repo().join("target/dist/SHA256SUMS"));
    let name = release.file_name().unwrap().to_string_lossy().into_owned();
    let out = Command::new("sha256sum").arg(&release).output().unwrap();
    let sum = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert!(
        sums.lines().any(|l| l == format!("{sum}  {name}")),
        "SHA256SUMS has no line for {name} with {sum}:\n{sums}"
    );

    let dir = scratch("walkthrough");
    let operations = read(&repo().join("docs/operations.md"));
    let prelude = "set -euo pipefail\n\
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql > /tmp/install-db.log 2>&1\n\
        /etc/init.d/mariadb start > /tmp/mariadb-start.log 2>&1\n\
        cd /root && cp /dist/*.tar.gz .\n";
    std::fs::write(
        dir.join("walkthrough.sh"),
        format!("{prelude}{}", script(&operations, "walkthrough")),
    )
    .unwrap();
    let started = Instant::now();
    let out = Command::new("docker")
        .args(["-H", &engine, "run", "--rm", "--network", "none", "-v"])
        .arg(format!("{}:/dist/{name}:ro", release.display()))
        .arg("-v")
        .arg(format!(
            "{}:/dist/{}:ro",
            kit.display(),
            kit.file_name().unwrap().to_string_lossy()
        ))
        .arg("-v")
        .arg(format!(
            "{}:/walkthrough.sh:ro",
            dir.join("walkthrough.sh").display()
        ))
        .args(["--entrypoint", "bash", &image, "/walkthrough.sh"])
        .stdin(Stdio::null())
        .output()
        .expect("docker runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the walkthrough failed:\n{stdout}\n{stderr}"
    );
    for expected in [
        "receiver 0.1.0 (commit ",
        "receiver_schema_initialized=true foreign_keys=0",
        "subscription ",
        "receiver_database_up 1",
        "verdict=applied (view at v2",
        "dry_run rows=",
        "reconcile window=",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} not in:\n{stdout}\n{stderr}"
        );
    }
    // Nothing in what it printed is a secret: no token, and no password of the accounts.
    assert!(!stdout.contains("orb_"), "a token was printed:\n{stdout}");
    fixtures::note(
        "release",
        format_args!(
            "the walkthrough ran from the release package on a clean Debian container in {:.0} s",
            started.elapsed().as_secs_f64()
        ),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `make install` itself, as the README's readers run it: below a `DESTDIR`, with the default
/// `PREFIX`, the binary and the units land where the walkthrough says.
#[test]
fn make_install_honours_destdir_with_the_default_prefix() {
    let dir = scratch("make-install");
    // As a person's shell runs it: PATH and HOME only. The variables cargo gives the programs
    // it runs (this test's runner is one) would make the nested cargo rebuild the release
    // binary, as if for another configuration.
    let mut make = Command::new("make");
    make.env_clear();
    #[allow(clippy::disallowed_methods)] // the test hands its own PATH and HOME on
    for var in ["PATH", "HOME", "RUSTUP_HOME", "CARGO_HOME"] {
        if let Some(value) = std::env::var_os(var) {
            make.env(var, value);
        }
    }
    let out = make
        .args(["-s", "install"])
        .arg(format!("DESTDIR={}", dir.display()))
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "make install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for file in [
        "usr/local/bin/receiver",
        "usr/local/lib/systemd/system/receiver-consume.service",
        "usr/local/share/result-inbox/schema/grants.sql",
        "usr/local/share/doc/result-inbox/docs/operations.md",
    ] {
        assert!(dir.join(file).is_file(), "{file} is not installed");
    }
    let unit = read(&dir.join("usr/local/lib/systemd/system/receiver-consume.service"));
    assert!(
        unit.contains("exec /usr/local/bin/receiver consume"),
        "{unit}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
