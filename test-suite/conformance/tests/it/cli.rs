//! The real `receiver` binary: `init` and its refusals (R-SCHEMA-5, R-SCHEMA-6, R-CLI-5); and the
//! kit's own command line against a receiver that exits.

use std::process::Output;
use std::time::{Duration, Instant};

use fixtures::{bare_command, receiver_bin, ReceiverDb};
use sqlx::{Connection, Row};

fn receiver(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = bare_command(&receiver_bin());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("receiver runs")
}

/// The receiver tables and their creation times, as one comparable string.
async fn structure(admin: &mut sqlx::MySqlConnection) -> (i64, String) {
    let row = sqlx::query(
        "SELECT COUNT(*), CAST(GROUP_CONCAT(table_name, '@', create_time ORDER BY table_name) AS CHAR) \
         FROM information_schema.tables WHERE table_schema = DATABASE()",
    )
    .fetch_one(admin)
    .await
    .unwrap();
    (row.try_get(0).unwrap(), row.try_get(1).unwrap())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn init_creates_the_schema_once_and_refuses_a_second_time() {
    let db = ReceiverDb::provisioned().await;
    let url = db.init_url().expose().to_owned();

    let first = receiver(&["init"], &[("ORBIT_RECEIVER_DSN", &url)]);
    assert_eq!(text(&first.stderr), "");
    assert_eq!(
        text(&first.stdout),
        "receiver_schema_initialized=true foreign_keys=0\nschema_version=2\n"
    );
    assert!(first.status.success());

    let mut admin = sqlx::MySqlConnection::connect(&format!(
        "{}/{}",
        testdb::Server::shared().unwrap().admin_url().expose(),
        db.receiver_db
    ))
    .await
    .unwrap();
    let before = structure(&mut admin).await;
    // The two tables, the schema's ledger and its lock.
    assert_eq!(before.0, 4);

    let second = receiver(&["init"], &[("ORBIT_RECEIVER_DSN", &url)]);
    assert_eq!(second.status.code(), Some(1));
    assert_eq!(text(&second.stdout), "");
    let err = text(&second.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("receiver init: the receiver schema already exists in database"),
        "{err}"
    );
    assert!(err.contains("receiver_inbox, receiver_task_views"), "{err}");
    assert!(!err.contains(db.init.password.expose()), "{err}");
    assert_eq!(structure(&mut admin).await, before);
}

#[test]
fn a_dsn_without_a_database_is_refused_before_connecting() {
    // Port 1 on loopback has nothing listening: any connection attempt would fail differently.
    let started = Instant::now();
    let out = receiver(
        &["init"],
        &[(
            "ORBIT_RECEIVER_DSN",
            "mysql://receiver_init:s3cret@127.0.0.1:1",
        )],
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(
        err,
        "receiver init: ORBIT_RECEIVER_DSN names no database: use mysql://user:password@host:port/<database>\n"
    );
    assert!(!err.contains("s3cret"));
}

#[test]
fn missing_configuration_and_commands_are_one_clear_line() {
    let out = receiver(&["init"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with("receiver init: ORBIT_RECEIVER_DSN is not set"),
        "{}",
        text(&out.stderr)
    );
    let out = receiver(&["launch"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "receiver: unknown command `launch`; the commands are init, migrate, demo, consume, digest, inspect, retention, prune, reconcile, help (`receiver --help`)\n"
    );
}

#[tokio::test]
async fn an_unknown_database_gets_a_clear_error() {
    let db = ReceiverDb::provisioned().await;
    let url = db
        .init_url()
        .expose()
        .replace(&db.receiver_db, "no_such_receiver_db");
    let out = receiver(&["init"], &[("ORBIT_RECEIVER_DSN", &url)]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("database `no_such_receiver_db` at ")
            && err.contains(" does not exist or this account cannot use it"),
        "{err}"
    );
    assert!(!err.contains(db.init.password.expose()), "{err}");
}

#[tokio::test]
async fn a_wrong_password_is_named_without_echoing_it() {
    let db = ReceiverDb::provisioned().await;
    let url = db
        .init_url()
        .expose()
        .replace(db.init.password.expose(), "not-the-password-x9");
    let out = receiver(&["init"], &[("ORBIT_RECEIVER_DSN", &url)]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(
        err,
        format!(
            "receiver init: cannot connect to the receiver database: access denied for account `{}` at {}: the server refused its password, or the account may not connect from this host (mysql 1045, SQLSTATE 28000); check ORBIT_RECEIVER_DSN\n",
            db.init.user,
            db.address()
        )
    );
    assert!(!err.contains("not-the-password-x9"));
}

#[test]
fn help_texts() {
    let mut all = String::new();
    for args in [
        &["help"][..],
        &["init", "--help"],
        &["migrate", "--help"],
        &["demo", "--help"],
        &["consume", "--help"],
        &["digest", "--help"],
        &["inspect", "--help"],
        &["retention", "--help"],
        &["prune", "--help"],
        &["reconcile", "--help"],
    ] {
        let out = receiver(args, &[]);
        assert!(out.status.success());
        all.push_str(&format!(
            "$ receiver {}\n{}\n",
            args.join(" "),
            text(&out.stdout)
        ));
    }
    insta::assert_snapshot!(all);
}

#[test]
fn every_configuration_error_is_one_line_naming_the_variable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("receiver-config-{}", std::process::id()));
    let good = dir.join("good.json");
    let open = dir.join("open.json");
    std::fs::create_dir_all(&dir).unwrap();
    for path in [&good, &open] {
        orbit_sdk::Credentials {
            token: orbit_sdk::Token::new("orb_token_never_shown"),
            application: "a".into(),
            namespace: "default".into(),
            environment: "development".into(),
            queue_id: "inbox-demo".into(),
            scopes: vec![],
        }
        .write(path, true)
        .unwrap();
    }
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let good = good.display().to_string();
    let open = open.display().to_string();
    let dsn = "mysql://u:pw_never_shown@127.0.0.1:1/r";
    let url = "http://127.0.0.1:1";
    let sub = "0123456789abcdef0123456789abcdef";
    let long_name = "x".repeat(65);
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("init", vec![]),
        ("init", vec![("ORBIT_RECEIVER_DSN", "postgres://x/y")]),
        (
            "init",
            vec![(
                "ORBIT_RECEIVER_DSN",
                "mysql://u:pw_never_shown@db.example.com:3306/r",
            )],
        ),
        ("demo", vec![]),
        (
            "demo",
            vec![
                ("ORBIT_URL", "http://orbit.example.com"),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_RECEIVER_DSN", dsn),
            ],
        ),
        (
            "demo",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &open),
                ("ORBIT_RECEIVER_DSN", dsn),
            ],
        ),
        (
            "demo",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_TOKEN", ""),
                ("ORBIT_RECEIVER_DSN", dsn),
            ],
        ),
        (
            "demo",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_QUEUE_ID", "bad\tqueue"),
                ("ORBIT_RECEIVER_DSN", dsn),
            ],
        ),
        (
            "demo",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_RECEIVER_DSN", dsn),
                ("RECEIVER_NAME", "-starts-with-dash"),
            ],
        ),
        (
            "demo",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_RECEIVER_DSN", dsn),
                ("RECEIVER_NAME", ""),
            ],
        ),
        (
            "demo",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_RECEIVER_DSN", dsn),
                ("RECEIVER_LOG_FORMAT", "xml"),
            ],
        ),
        (
            "consume",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_RECEIVER_DSN", dsn),
            ],
        ),
        (
            "consume",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_RECEIVER_DSN", dsn),
                ("ORBIT_SUBSCRIPTION_ID", "short"),
            ],
        ),
        (
            "consume",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_TOKEN", "t"),
                ("ORBIT_QUEUE_ID", "q"),
                ("ORBIT_RECEIVER_DSN", dsn),
                ("ORBIT_SUBSCRIPTION_ID", sub),
                ("RECEIVER_NAME", &long_name),
            ],
        ),
        // Issue 16 item 5: each of these passed the check before and failed later.
        (
            "init",
            vec![(
                "ORBIT_RECEIVER_DSN",
                "mysql://u:pw_never_shown@127.0.0.1:99999/r",
            )],
        ),
        (
            "init",
            vec![(
                "ORBIT_RECEIVER_DSN",
                "mysql://u:pw_never_shown@127.0.0.1:1/r?pool_size=9",
            )],
        ),
        (
            "init",
            vec![(
                "ORBIT_RECEIVER_DSN",
                "mysql://u:pw_never_shown@127.0.0.1:1/r?ssl-mode=strict",
            )],
        ),
        (
            "init",
            vec![(
                "ORBIT_RECEIVER_DSN",
                "mysql://u:pw_never_shown@127.0.0.1:1/r?time-zone=%2B08:00",
            )],
        ),
        (
            "demo",
            vec![
                ("ORBIT_URL", "http://127.0.0.1:1/v1"),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_RECEIVER_DSN", dsn),
            ],
        ),
        (
            "demo",
            vec![
                ("ORBIT_URL", "http://127.0.0.1:99999"),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_RECEIVER_DSN", dsn),
            ],
        ),
        (
            "demo",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_TOKEN", "orb_token_never_shown\n"),
                ("ORBIT_RECEIVER_DSN", dsn),
            ],
        ),
        (
            "consume",
            vec![
                ("ORBIT_URL", url),
                ("ORBIT_CREDENTIALS_FILE", &good),
                ("ORBIT_RECEIVER_DSN", dsn),
                ("ORBIT_SUBSCRIPTION_ID", sub),
                ("RECEIVER_APPLY_TIMEOUT", "5"),
                ("RECEIVER_CONCURRENCY", "0"),
                ("RECEIVER_REQUIRE_REPLICA_ACK", "yes"),
            ],
        ),
    ];
    let mut all = String::new();
    for (cmd, env) in cases {
        let out = receiver(&[cmd], &env);
        assert_eq!(out.status.code(), Some(2), "{cmd} {env:?}");
        let err = text(&out.stderr);
        assert!(
            !err.contains("pw_never_shown") && !err.contains("orb_token_never_shown"),
            "{err}"
        );
        for line in err.lines() {
            assert!(line.starts_with(&format!("receiver {cmd}: ")), "{line}");
        }
        let shown: Vec<String> = env
            .iter()
            .map(|(k, v)| {
                let v = if v.contains(dir.to_str().unwrap()) {
                    "[file]".to_owned()
                } else {
                    v.replace("pw_never_shown", "***")
                        .replace("orb_token_never_shown", "***")
                        .replace('\n', "\\n")
                };
                format!("{k}={v}")
            })
            .collect();
        all.push_str(&format!(
            "$ {} receiver {cmd}\n{}\n",
            shown.join(" "),
            err.replace(dir.to_str().unwrap(), "[dir]")
        ));
    }
    insta::assert_snapshot!(all);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn the_init_line() {
    let db = ReceiverDb::provisioned().await;
    let out = receiver(&["init"], &[("ORBIT_RECEIVER_DSN", db.init_url().expose())]);
    insta::assert_snapshot!(text(&out.stdout));
}

/// A file of `len` bytes that takes no disk (a hole), mode 0600.
fn sparse_file(name: &str, len: u64) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = testdb::scratch_dir().unwrap().join(name);
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(len).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// `receiver ARGS` with at most 256 MiB of address space: a command that read a 2 GB file whole
/// could not allocate it and would abort instead of answering.
fn receiver_in_256_mib(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut script = String::from("ulimit -v 262144; exec \"$0\"");
    for i in 1..=args.len() {
        script.push_str(&format!(" \"${i}\""));
    }
    let mut cmd = bare_command(std::path::Path::new("/bin/sh"));
    cmd.arg("-c").arg(script).arg(receiver_bin()).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("sh runs")
}

#[test]
fn reads_are_bounded_and_only_of_regular_files() {
    let scratch = testdb::scratch_dir().unwrap();
    let fifo = scratch.join("event.fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let fifo_s = fifo.display().to_string();
    let started = Instant::now();
    // Not a regular file: refused at once, nothing opened (a FIFO would block the open).
    for (path, what) in [
        (fifo_s.as_str(), "a named pipe"),
        ("/dev/zero", "a device"),
        ("/tmp", "a directory"),
    ] {
        let out = receiver(&["digest", path], &[]);
        assert_eq!(out.status.code(), Some(1), "{path}");
        assert_eq!(
            text(&out.stderr),
            format!("receiver digest: cannot read {path}: it is {what}, not a regular file\n")
        );
    }
    // A 2 GB file is refused as too large after reading one byte more than an event may have.
    let huge = sparse_file("huge.json", 2 << 30);
    let out = receiver_in_256_mib(&["digest", &huge.display().to_string()], &[]);
    assert_eq!(
        text(&out.stdout),
        "rejected=too_large\n",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "a refused event, not a usage error"
    );
    // `inspect --compare` reads the same way, before it connects anywhere.
    let env = [
        ("ORBIT_RECEIVER_DSN", "mysql://u:p@127.0.0.1:1/db"),
        ("ORBIT_QUEUE_ID", "inbox-demo"),
    ];
    let out = receiver(
        &["inspect", "--event-id", "e", "--compare", "/dev/zero"],
        &env,
    );
    assert_eq!(
        text(&out.stderr),
        "receiver inspect: cannot read /dev/zero: it is a device, not a regular file\n"
    );
    let out = receiver_in_256_mib(
        &[
            "inspect",
            "--event-id",
            "e",
            "--compare",
            &huge.display().to_string(),
        ],
        &env,
    );
    assert_eq!(
        text(&out.stderr),
        "receiver inspect: the event in ".to_owned()
            + &huge.display().to_string()
            + " is rejected: too_large: 524289 bytes is over the limit of 524288 bytes\n"
    );
    // A credentials file: a FIFO is refused, not waited on; a huge one is refused unread.
    let big_credentials = sparse_file("huge.credentials", 300 << 20);
    for (file, problem) in [
        (fifo_s.clone(), "not a regular file".to_owned()),
        (
            big_credentials.display().to_string(),
            "larger than 65536 bytes, which no credentials file is".to_owned(),
        ),
    ] {
        let out = receiver_in_256_mib(
            &["inspect", "--event-id", "e"],
            &[
                ("ORBIT_RECEIVER_DSN", "mysql://u:p@127.0.0.1:1/db"),
                ("ORBIT_CREDENTIALS_FILE", &file),
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{file}");
        assert!(
            text(&out.stderr).contains(&format!(
                "ORBIT_CREDENTIALS_FILE cannot read credentials file {file}: {problem}"
            )),
            "{}",
            text(&out.stderr)
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "nothing waited on a pipe"
    );
}

#[test]
fn a_variable_that_is_not_utf8_is_named_not_read_lossily() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"inbox\xff");
    for (name, cmd) in [
        ("ORBIT_QUEUE_ID", "demo"),
        ("ORBIT_URL", "demo"),
        ("ORBIT_RECEIVER_DSN", "init"),
    ] {
        let mut c = bare_command(&receiver_bin());
        c.arg(cmd)
            .env("ORBIT_URL", "http://127.0.0.1:1")
            .env("ORBIT_TOKEN", "t")
            .env("ORBIT_QUEUE_ID", "q")
            .env("ORBIT_RECEIVER_DSN", "mysql://u:p@127.0.0.1:1/r")
            .env(name, bad);
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert_eq!(
            text(&out.stderr),
            format!("receiver {cmd}: {name} is not valid UTF-8\n"),
            "{name}"
        );
    }
}

/// The kit's `first-receipt`, run as a user would, against our receiver behind a shell
/// wrapper that runs `line` first: the scratch directory (failed cases' output under `logs/`)
/// and the kit's exit and output.
fn kit_first_receipt_with(name: &str, line: &str) -> (std::path::PathBuf, std::process::Output) {
    kit_case_with(name, "first-receipt", line)
}

/// The kit's `case` against our receiver behind a wrapper that runs `line` first.
fn kit_case_with(name: &str, case: &str, line: &str) -> (std::path::PathBuf, std::process::Output) {
    let dir = testdb::scratch_dir().unwrap().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let wrapper = dir.join("receiver.sh");
    std::fs::write(
        &wrapper,
        format!("{line}\nexec {} \"$@\"\n", receiver_bin().display()),
    )
    .unwrap();
    let out = kit_run(
        &format!("sh {}", wrapper.display()),
        &["--only", case],
        &dir.join("logs"),
    );
    (dir, out)
}

/// `conformance run --receiver RECEIVER ARGS --keep-logs LOGS`, as a user runs it (PATH only).
fn kit_run(receiver: &str, args: &[&str], logs: &std::path::Path) -> std::process::Output {
    bare_command(&fixtures::workspace_bin("conformance"))
        .env("PATH", "/usr/bin:/bin")
        .args(["run", "--receiver", receiver])
        .args(args)
        .arg("--keep-logs")
        .arg(logs)
        .output()
        .expect("the kit runs")
}

/// The kit, run as a user would, against a receiver whose `consume` prints a line and exits 7
/// at once: the case fails within seconds naming the exit, its status and the line (not a
/// 30 s time-out blamed on R-STORE-7), and the receiver's output is kept where the message says.
#[test]
fn the_kit_blames_a_consume_that_exits_for_its_exit_and_keeps_its_output() {
    let started = Instant::now();
    let (dir, out) = kit_first_receipt_with(
        "kit-exits",
        "if [ \"$1\" = consume ]; then echo 'consume: giving up at once'; exit 7; fi",
    );
    let keep = dir.join("logs");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let failed = stdout
        .lines()
        .find(|l| l.starts_with("conformance: first-receipt: FAILED"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        failed.contains("R-CLI-3: consume exited by itself (exit status: 7)")
            && failed.contains("consume: giving up at once")
            && failed.contains(&keep.join("first-receipt").display().to_string()),
        "{failed}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "{:?}",
        started.elapsed()
    );
    let kept: Vec<String> = std::fs::read_dir(keep.join("first-receipt"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(kept.iter().any(|f| f.ends_with("-consume.log")), "{kept:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The kit reads every line a receiver prints in every case, not only in `no-secrets`: a
/// receiver whose `consume` prints its DSN (password included) and then works fails
/// `first-receipt`, naming the rule and the kind of secret and never repeating it.
#[test]
fn the_kit_fails_any_case_whose_receiver_printed_a_secret() {
    let (dir, out) = kit_first_receipt_with(
        "kit-leaks",
        "if [ \"$1\" = consume ]; then echo \"connecting to $ORBIT_RECEIVER_DSN\" >&2; fi",
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    let failed = stdout
        .lines()
        .find(|l| l.starts_with("conformance: first-receipt: FAILED"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        failed.contains("R-STORE-11: the receiver printed a database password (in its output receiver-2-consume.log)"),
        "{failed}"
    );
    assert!(!stdout.contains("connecting to mysql://"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A receiver whose `init` also makes a third table, as a migration tool would make its own
/// version table: the kit's `schema` case checks the two receiver tables only, and passes
/// (docs/receiver-contract.md, "The schema the kit checks"). Before that rule was written, the
/// case refused any third table.
#[test]
fn the_kit_accepts_a_receiver_database_holding_a_third_unrelated_table() {
    let receiver = receiver_bin().display().to_string();
    let line = format!(
        r#"if [ "$1" = init ]; then
  {receiver} init || exit $?
  rest=${{ORBIT_RECEIVER_DSN#*://}}; account=${{rest%%@*}}; rest=${{rest#*@}}
  address=${{rest%%/*}}; database=${{rest#*/}}; database=${{database%%\?*}}
  mariadb --protocol=tcp -h "${{address%:*}}" -P "${{address##*:}}" -u "${{account%%:*}}" -p"${{account#*:}}" "$database" \
    -e 'CREATE TABLE schema_migrations (version BIGINT NOT NULL PRIMARY KEY, applied_at DATETIME NOT NULL)' || exit 9
  echo 'migrations: schema_migrations made'
  exit 0
fi"#
    );
    let (dir, out) = kit_case_with("kit-third-table", "schema", &line);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("schema ") && l.contains("passed")),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Lost data fails a plain run whichever case finds it: `database-restart` is a SHOULD case
/// (R-STORE-9), and a receiver that ACKs before its COMMIT (the `ack-before-commit` mutant)
/// loses the events its database never got. The case's ledger finds them; the failure names
/// R-STORE-7 first, takes its level (MUST) and fails the run without `--strict`.
#[test]
fn a_should_case_that_finds_lost_data_fails_a_plain_run() {
    let dir = testdb::scratch_dir().unwrap().join("kit-lost-data");
    std::fs::create_dir_all(&dir).unwrap();
    let mutant = fixtures::workspace_bin("receiver-mutant");
    let out = kit_run(
        &format!("env RECEIVER_MUTANT=ack-before-commit {}", mutant.display()),
        &["--only", "database-restart"],
        &dir.join("logs"),
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a plain run must fail: {stdout}"
    );
    let failed = stdout
        .lines()
        .find(|l| l.starts_with("FAILED database-restart"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        failed.starts_with(
            "FAILED database-restart [MUST] (a MUST rule, found by a SHOULD case: it fails the run without --strict): R-STORE-7: the ledger found "
        ),
        "{failed}"
    );
    assert!(
        failed.contains("ACKED without a committed inbox row"),
        "{failed}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--certificate FILE`: one JSON document, valid against docs/certificate.schema.json (checked
/// with Python's `jsonschema`), that names the kit that judged by its binary's SHA-256, our
/// receiver by its `--version` line, the server, the seed, each case and both verdicts.
#[test]
fn a_certificate_states_who_judged_what_and_matches_its_schema() {
    let dir = testdb::scratch_dir().unwrap().join("kit-certificate");
    std::fs::create_dir_all(&dir).unwrap();
    let certificate = dir.join("out/cert.json");
    let kit = fixtures::workspace_bin("conformance");
    let cert = certificate.display().to_string();
    // The kit build's mutant matrix, beside its binary, as `make kit` and the tarball keep it.
    let matrix = kit.with_file_name("mutant-matrix.json");
    let made = bare_command(&kit)
        .env("PATH", "/usr/bin:/bin")
        .args(["mutants", "--receiver-mutant"])
        .arg(fixtures::workspace_bin("receiver-mutant"))
        .args(["--only", "prints-token", "--seed", "3", "--matrix"])
        .arg(&matrix)
        .output()
        .unwrap();
    assert_eq!(made.status.code(), Some(0), "{}", text(&made.stdout));
    let out = kit_run(
        &receiver_bin().display().to_string(),
        &[
            "--only",
            "schema,duplicate",
            "--seed",
            "7",
            "--certificate",
            &cert,
        ],
        &dir.join("logs"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let schema =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/certificate.schema.json");
    let valid = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, jsonschema; jsonschema.Draft202012Validator(json.load(open(sys.argv[1]))).validate(json.load(open(sys.argv[2]))); print('valid')",
        ])
        .arg(&schema)
        .arg(&certificate)
        .output()
        .expect("python3 runs");
    assert_eq!(text(&valid.stdout), "valid\n", "{}", text(&valid.stderr));
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&certificate).unwrap()).unwrap();
    let sha = std::process::Command::new("sha256sum")
        .arg(&kit)
        .output()
        .unwrap();
    let sha = text(&sha.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(c["kit"]["sha256"], sha.as_str());
    assert_eq!(c["kit"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(c["kit"]["contract_version"], about::CONTRACT_VERSION);
    assert_eq!(
        c["receiver"]["command"],
        receiver_bin().display().to_string()
    );
    let line = receiver(&["--version"], &[]);
    assert_eq!(
        c["receiver"]["version"],
        text(&line.stdout).trim_end(),
        "the receiver's own --version line"
    );
    assert!(text(&line.stdout).starts_with("receiver 0.1.0 (commit "));
    assert!(
        c["database"]["server"]
            .as_str()
            .unwrap()
            .contains("MariaDB"),
        "{}",
        c["database"]
    );
    assert_eq!(c["seed"], 7);
    assert_eq!(c["certificate_version"], 2);
    assert_eq!(c["mutant_matrix"]["kit_sha256"], sha.as_str());
    assert_eq!(c["mutant_matrix"]["mutants"][0]["mutant"], "prints-token");
    assert_eq!(c["mutant_matrix"]["mutants"][0]["case"], "no-secrets");
    assert_eq!(c["mutant_matrix"]["mutants"][0]["caught"], 1);
    assert!(c["environment"]["cpus"].as_u64().unwrap() >= 1);
    assert_eq!(c["environment"]["jobs"], 1);
    assert!(c["environment"]["kernel"].as_str().unwrap().len() > 1);
    assert!(
        c["environment"]["database_settings"]["version"]
            .as_str()
            .unwrap()
            .contains("MariaDB"),
        "{}",
        c["environment"]
    );
    assert_eq!(
        c["environment"]["database_settings"]["innodb_rollback_on_timeout"],
        "OFF"
    );
    assert_eq!(c["complete"], false, "a run with --only is not complete");
    assert_eq!(c["cases_total"], conformance_kit::cases().len());
    assert_eq!(c["not_run"], serde_json::json!([]));
    let cases: Vec<&str> = c["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(cases, ["schema", "duplicate"]);
    assert!(c["cases"]
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["verdict"] == "passed"));
    assert_eq!(c["verdict"]["plain"], "pass");
    assert_eq!(c["verdict"]["strict"], "pass");
    // A receiver with no --version is not at fault: null.
    let script = dir.join("plain.sh");
    std::fs::write(
        &script,
        format!(
            "[ \"$1\" = --version ] && exit 2\nexec {} \"$@\"\n",
            receiver_bin().display()
        ),
    )
    .unwrap();
    let out = kit_run(
        &format!("sh {}", script.display()),
        &["--only", "duplicate", "--certificate", &cert],
        &dir.join("logs"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&certificate).unwrap()).unwrap();
    assert!(c["receiver"]["version"].is_null(), "{}", c["receiver"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
