//! The conformance kit's own verdicts: what a case finds is charged to that case, whatever
//! runs beside it (`--jobs`), and a run at eight jobs judges as a run at one.

use conformance_kit::runner::{at_most, run_case};
use conformance_kit::{cases, rule_named, Case, Ctx};
use fixtures::receiver_bin;

/// The cases of the attribution run: twelve quick ones, so that eight run at once and the
/// others start while the first end.
const CASES: &[&str] = &[
    "schema",
    "first-receipt",
    "duplicate",
    "stale-version",
    "same-version-other-id",
    "needs-review",
    "exact-numbers",
    "scopes",
    "utc",
    "queue-mismatch",
    "sigterm",
    "no-secrets",
];

/// The case whose receiver prints its database password, and the one whose `consume` exits
/// at once; in every other case the receiver is ours, unchanged.
const LEAKS_IN: &str = "duplicate";
const EXITS_IN: &str = "stale-version";

/// A receiver command line that runs `line` first, then our receiver.
fn wrapped(dir: &std::path::Path, name: &str, line: &str) -> String {
    let wrapper = dir.join(format!("{name}.sh"));
    std::fs::write(
        &wrapper,
        format!("{line}\nexec {} \"$@\"\n", receiver_bin().display()),
    )
    .unwrap();
    format!("sh {}", wrapper.display())
}

/// Each case's verdict, reduced to what a report publishes: passed, or the rule its failure
/// names first (and its message, to show when it differs).
fn verdicts(selected: &[(Case, String)], jobs: usize, seed: u64) -> Vec<(bool, String, String)> {
    at_most(selected, jobs, |runtime, (case, receiver)| {
        let ctx = Ctx::new(receiver.clone(), seed, None);
        match run_case(runtime, case, ctx) {
            Ok(saw) => (true, String::new(), saw),
            Err(why) => (false, rule_named(&why).unwrap_or("").to_owned(), why),
        }
    })
}

/// A receiver that prints a secret in exactly one case's world and exits early in exactly one
/// other, run with eight cases at once: each finding fails its own case under its own rule,
/// every other case passes, and the verdicts equal those of one case at a time with the same
/// seed. Before the findings were held by each case's context, they were process-wide: a
/// case that ended first could take another's leak or exit, and the case where it happened
/// could have it cleared by another's start.
#[test]
fn each_finding_is_charged_to_its_own_case_at_eight_jobs_as_at_one() {
    let dir = testdb::scratch_dir().unwrap().join("kit-attribution");
    std::fs::create_dir_all(&dir).unwrap();
    let plain = receiver_bin().display().to_string();
    let leaky = wrapped(
        &dir,
        "leaky",
        "if [ \"$1\" = consume ]; then echo \"connecting to $ORBIT_RECEIVER_DSN\" >&2; fi",
    );
    let exits = wrapped(
        &dir,
        "exits",
        "if [ \"$1\" = consume ]; then echo 'consume: giving up'; exit 7; fi",
    );
    let selected: Vec<(Case, String)> = cases()
        .into_iter()
        .filter(|c| CASES.contains(&c.name))
        .map(|c| {
            let receiver = match c.name {
                LEAKS_IN => leaky.clone(),
                EXITS_IN => exits.clone(),
                _ => plain.clone(),
            };
            (c, receiver)
        })
        .collect();
    assert_eq!(selected.len(), CASES.len(), "every case of the list exists");
    conformance_kit::quiet_panics();
    let seed = 58;
    let at_eight = verdicts(&selected, 8, seed);
    for ((case, _), (passed, rule, why)) in selected.iter().zip(&at_eight) {
        match case.name {
            LEAKS_IN => assert!(
                !passed
                    && rule == "R-STORE-11"
                    && why.starts_with("R-STORE-11: the receiver printed a database password"),
                "{}: the leak is this case's: {why}",
                case.name
            ),
            EXITS_IN => assert!(
                !passed && why.starts_with("R-CLI-3: consume exited by itself (exit status: 7)"),
                "{}: the exit is this case's: {why}",
                case.name
            ),
            _ => assert!(
                passed,
                "{}: nothing of this case's own failed, yet: {why}",
                case.name
            ),
        }
    }
    let at_one = verdicts(&selected, 1, seed);
    for ((case, _), (eight, one)) in selected.iter().zip(at_eight.iter().zip(&at_one)) {
        assert_eq!(
            (eight.0, &eight.1),
            (one.0, &one.1),
            "{}: at 8 jobs {}; at 1 job {}",
            case.name,
            eight.2,
            one.2
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The kit given a server of the team's own (`--database`, as a CI's service database): the
/// cases run there and pass, a case that stops its server still starts one of its own, and the
/// kit creates nothing on the given server but the databases and users its help names
/// (`orbit_test_*`, `orbit_receiver_test_*`, `rit_*`), read back from the server's own log of
/// every statement, and leaves none of them behind.
#[tokio::test(flavor = "multi_thread")]
async fn the_kit_on_a_given_database_creates_only_what_it_documents() {
    use sqlx::Connection;
    let server = testdb::Server::local().unwrap();
    let admin = server.admin_url();
    let mut c = sqlx::MySqlConnection::connect(admin.expose())
        .await
        .unwrap();
    let before = names(&mut c).await;
    for set in [
        "SET GLOBAL log_output = 'TABLE'",
        "TRUNCATE mysql.general_log",
        "SET GLOBAL general_log = ON",
    ] {
        sqlx::query(set).execute(&mut c).await.unwrap();
    }
    let dir = testdb::scratch_dir().unwrap().join("kit-given-database");
    std::fs::create_dir_all(&dir).unwrap();
    let out = fixtures::bare_command(&fixtures::workspace_bin("conformance"))
        .env("PATH", "/usr/bin:/bin:/usr/sbin")
        .env("CONFORMANCE_DATABASE", admin.expose())
        .args(["run", "--receiver"])
        .arg(receiver_bin())
        .args([
            "--only",
            "schema,duplicate,utc",
            "--jobs",
            "3",
            "--keep-logs",
        ])
        .arg(dir.join("logs"))
        .output()
        .unwrap();
    sqlx::query("SET GLOBAL general_log = OFF")
        .execute(&mut c)
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("(existing server at "), "{stdout}");
    assert!(!stdout.contains(admin.expose()), "the URL is never printed");
    let created: Vec<(String,)> = sqlx::query_as(
        "SELECT CAST(argument AS CHAR) FROM mysql.general_log \
         WHERE command_type = 'Query' AND (argument LIKE 'CREATE DATABASE%' OR argument LIKE 'CREATE USER%')",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert!(!created.is_empty(), "the cases made their databases here");
    for (statement,) in &created {
        let named = statement
            .split(['`', '\'', ' '])
            .filter(|w| !w.is_empty())
            .nth(2)
            .unwrap_or_default()
            .to_owned();
        let named = if named == "IF" {
            statement
                .split(['`', '\'', ' '])
                .filter(|w| !w.is_empty())
                .nth(5)
                .unwrap_or_default()
                .to_owned()
        } else {
            named
        };
        assert!(
            ["orbit_test_", "orbit_receiver_test_", "rit_"]
                .iter()
                .any(|p| named.starts_with(p)),
            "the kit created {named:?} ({statement})"
        );
    }
    assert_eq!(names(&mut c).await, before, "nothing is left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The databases and users a server holds.
async fn names(c: &mut sqlx::MySqlConnection) -> Vec<String> {
    let mut out: Vec<(String,)> = sqlx::query_as(
        "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
         UNION ALL SELECT CAST(CONCAT(user, '@', host) AS CHAR) FROM mysql.user",
    )
    .fetch_all(&mut *c)
    .await
    .unwrap();
    out.sort();
    out.into_iter().map(|(n,)| n).collect()
}
