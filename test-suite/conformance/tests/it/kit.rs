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
