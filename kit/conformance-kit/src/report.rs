//! What a kit run reports and how it ends: the expectations file (cases known to fail for this
//! receiver), each case's outcome and whether it fails the run, the JSON report, the report
//! paths checked before the first case, and what the kit cannot verify.

use std::path::Path;

use super::Level;

/// What the kit cannot see, said in every report: its verdict comes from the platform, the
/// two tables, and the receiver's exit status and output only.
pub const CANNOT_VERIFY: &[&str] = &[
    "the isolation level and the statements the receiver uses: only their effects (rows, views, ACKs) are seen",
    "ACK after COMMIT between the points the kit holds or cuts: each delivery is checked against the rows at the end, not at the instant of its ACK",
    "behaviour under loads, concurrencies, outages or fault timings other than the cases'",
    "secrets the receiver writes anywhere but its standard output and error",
    "TLS, and a platform other than orbit-dev",
];

/// How the message of a case that could not run begins: a tool, a privilege or a server the
/// case needs was missing, or the kit itself failed. Such a case is reported as not run, never
/// as passed, and fails the run unless `--expect` declares it.
pub const NOT_RUN: &str = "the kit could not run the case";

/// A case known to fail for this receiver, or declared not to run here, and why (one line of
/// `--expect FILE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub case: String,
    pub reason: String,
}

/// Reads an expectations file: one case per line, `CASE: REASON` (or `CASE REASON`; the reason is required),
/// `#` comments and blank lines ignored. Every case must be one of `names`, once.
pub fn parse_expectations(text: &str, names: &[&str]) -> Result<Vec<Expected>, String> {
    let mut out: Vec<Expected> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `case: reason`, as the help shows it; `case reason` is read the same.
        let (case, reason) = line
            .split_once(|c: char| c == ':' || c.is_whitespace())
            .map(|(c, r)| (c, r.trim_start_matches(':').trim()))
            .unwrap_or((line, ""));
        let at = n + 1;
        if !names.contains(&case) {
            return Err(format!(
                "line {at}: no case {case:?}; cases: {}",
                names.join(", ")
            ));
        }
        if reason.is_empty() {
            return Err(format!(
                "line {at}: {case} needs a reason after the case name"
            ));
        }
        if out.iter().any(|e| e.case == case) {
            return Err(format!("line {at}: {case} is listed twice"));
        }
        out.push(Expected {
            case: case.to_owned(),
            reason: reason.to_owned(),
        });
    }
    Ok(out)
}

/// A case's outcome against the expectations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed,
    /// Failed, as the expectations file says it does.
    ExpectedFailure,
    /// Passed although the expectations file says it fails: the file is out of date.
    UnexpectedPass,
    /// Could not run ([`NOT_RUN`]): never a pass; it fails the run.
    NotRun,
    /// Could not run, as the expectations file declares, with its reason.
    DeclaredNotRun,
}

impl Outcome {
    pub fn of(passed: bool, expected_to_fail: bool) -> Outcome {
        Outcome::judged(passed, false, expected_to_fail)
    }

    /// The outcome of a case that passed, or could not run, or neither, against whether the
    /// expectations file names it.
    pub fn judged(passed: bool, not_run: bool, declared: bool) -> Outcome {
        if not_run && !passed {
            return if declared {
                Outcome::DeclaredNotRun
            } else {
                Outcome::NotRun
            };
        }
        match (passed, declared) {
            (true, false) => Outcome::Passed,
            (false, false) => Outcome::Failed,
            (false, true) => Outcome::ExpectedFailure,
            (true, true) => Outcome::UnexpectedPass,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed => "FAILED",
            Outcome::ExpectedFailure => "expected-failure",
            Outcome::UnexpectedPass => "unexpected-pass",
            Outcome::NotRun => "NOT-RUN",
            Outcome::DeclaredNotRun => "not-run-declared",
        }
    }

    /// Whether this outcome fails the run: a MUST that failed, a SHOULD that failed under
    /// `--strict`, or any change from the expectations (an unexpected pass too, so that the
    /// file is kept true).
    pub fn fails_run(self, level: Level, strict: bool) -> bool {
        match self {
            Outcome::Passed | Outcome::ExpectedFailure | Outcome::DeclaredNotRun => false,
            Outcome::UnexpectedPass | Outcome::NotRun => true,
            Outcome::Failed => level == Level::Must || strict,
        }
    }
}

/// Makes a report's directory and checks the file can be written, before the first case runs.
pub fn prepare(path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot make {}'s directory: {e}", path.display()))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// One case in a report.
#[derive(Debug)]
pub struct CaseResult<'a> {
    pub name: &'a str,
    pub rules: &'a str,
    pub level: Level,
    pub seconds: f64,
    pub verdict: &'a Result<String, String>,
    pub expected: Option<&'a str>,
}

impl CaseResult<'_> {
    pub fn outcome(&self) -> Outcome {
        let not_run = matches!(self.verdict, Err(why) if why.starts_with(NOT_RUN));
        Outcome::judged(self.verdict.is_ok(), not_run, self.expected.is_some())
    }

    /// The outcome's name in a certificate: lowercase.
    pub fn verdict_name(&self) -> String {
        self.outcome().as_str().to_ascii_lowercase()
    }
}

/// The run as JSON: the kit's version, the receiver's command line, the seed, whether SHOULD
/// cases count, each case (rules, level, outcome, seconds, message, the expectation's
/// reason), and what the kit cannot verify.
pub fn json(
    receiver: &str,
    seed: u64,
    strict: bool,
    seconds: f64,
    cases: &[CaseResult<'_>],
) -> serde_json::Value {
    let failed_run = cases.iter().any(|c| c.outcome().fails_run(c.level, strict));
    serde_json::json!({
        "kit": "result-inbox conformance kit",
        "kit_version": env!("CARGO_PKG_VERSION"),
        "contract_version": super::CONTRACT_VERSION,
        "receiver": receiver,
        "seed": seed,
        "strict": strict,
        "seconds": (seconds * 10.0).round() / 10.0,
        "passed": !failed_run,
        "cases": cases.iter().map(|c| serde_json::json!({
            "name": c.name,
            "rules": c.rules.split_whitespace().collect::<Vec<_>>(),
            "level": c.level.as_str(),
            "result": c.outcome().as_str(),
            "fails_run": c.outcome().fails_run(c.level, strict),
            "seconds": (c.seconds * 10.0).round() / 10.0,
            "message": match c.verdict { Ok(m) | Err(m) => m },
            "expected_failure_reason": c.expected,
        })).collect::<Vec<_>>(),
        "cannot_verify": CANNOT_VERIFY,
    })
}

/// What a certificate says of the run besides its cases: who judged what, where.
#[derive(Debug)]
pub struct Facts<'a> {
    /// The receiver's command line, as given to `--receiver`.
    pub receiver: &'a str,
    /// The first line `CMD --version` printed, when it printed one and exited 0.
    pub receiver_version: Option<&'a str>,
    /// The SHA-256 of the kit's own binary.
    pub kit_sha256: &'a str,
    /// The database server the cases' databases were on (`SELECT VERSION()`'s text).
    pub database_server: &'a str,
    pub seed: u64,
    /// When the run started, RFC 3339 UTC.
    pub started_at: &'a str,
    /// Where it ran: the kernel, the CPUs, `--jobs`, and the database server's settings that
    /// the cases' timings and verdicts depend on.
    pub environment: serde_json::Value,
    /// The kit build's own mutant matrix ([`MutantMatrix`]), when one was made for this binary.
    pub mutant_matrix: Option<serde_json::Value>,
    /// Every case the expectations file declares, with its reason.
    pub declared: &'a [Expected],
    /// How many cases the kit has: a run of fewer is not complete.
    pub cases_total: usize,
}

/// The version of the certificate's format (docs/certificate.schema.json).
pub const CERTIFICATE_VERSION: u32 = 2;

/// A certificate of the run: one JSON document a team can publish beside its receiver
/// (docs/conformance-kit.md, "A certificate"; its schema is docs/certificate.schema.json). It
/// states the kit that judged (version, contract, the binary's SHA-256), the receiver it
/// judged (command, version line), the database and the seed, every case's verdict, and the
/// run's verdict both plain and under `--strict`.
pub fn certificate(facts: &Facts<'_>, seconds: f64, cases: &[CaseResult<'_>]) -> serde_json::Value {
    let verdict = |strict: bool| {
        if cases.iter().any(|c| c.outcome().fails_run(c.level, strict)) {
            "fail"
        } else {
            "pass"
        }
    };
    serde_json::json!({
        "certificate_version": CERTIFICATE_VERSION,
        "kit": {
            "name": "result-inbox conformance kit",
            "version": env!("CARGO_PKG_VERSION"),
            "contract_version": super::CONTRACT_VERSION,
            "sha256": facts.kit_sha256,
        },
        "receiver": {
            "command": facts.receiver,
            "version": facts.receiver_version,
        },
        "database": { "server": facts.database_server },
        "environment": facts.environment,
        "mutant_matrix": facts.mutant_matrix,
        "complete": cases.len() == facts.cases_total
            && !cases.iter().any(|c| matches!(c.outcome(), Outcome::NotRun | Outcome::DeclaredNotRun)),
        "cases_total": facts.cases_total,
        "declared": facts.declared.iter().map(|e| serde_json::json!({
            "case": e.case,
            "reason": e.reason,
        })).collect::<Vec<_>>(),
        "not_run": cases.iter().filter(|c| matches!(c.outcome(), Outcome::NotRun | Outcome::DeclaredNotRun)).map(|c| serde_json::json!({
            "case": c.name,
            "why": match c.verdict { Ok(m) | Err(m) => m },
            "declared": c.expected,
        })).collect::<Vec<_>>(),
        "seed": facts.seed,
        "started_at": facts.started_at,
        "seconds": (seconds * 10.0).round() / 10.0,
        "cases": cases.iter().map(|c| serde_json::json!({
            "name": c.name,
            "level": c.level.as_str(),
            "rules": c.rules.split_whitespace().collect::<Vec<_>>(),
            "verdict": c.verdict_name(),
            "seconds": (c.seconds * 10.0).round() / 10.0,
            "message": match c.verdict { Ok(m) | Err(m) => m },
        })).collect::<Vec<_>>(),
        "verdict": { "plain": verdict(false), "strict": verdict(true) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expectations_file_names_known_cases_each_with_a_reason() {
        let names = ["schema", "utc", "sigterm"];
        let ok = parse_expectations(
            "# known\n\nutc:   our server keeps local time  \nsigterm\tpauses on stop\n",
            &names,
        )
        .unwrap();
        assert_eq!(
            ok,
            vec![
                Expected {
                    case: "utc".into(),
                    reason: "our server keeps local time".into()
                },
                Expected {
                    case: "sigterm".into(),
                    reason: "pauses on stop".into()
                },
            ]
        );
        let err = |t: &str| parse_expectations(t, &names).unwrap_err();
        assert!(err("nope why").starts_with("line 1: no case \"nope\"; cases: schema, utc"));
        assert_eq!(
            err("# c\nutc"),
            "line 2: utc needs a reason after the case name"
        );
        assert_eq!(err("utc a\nutc: b"), "line 2: utc is listed twice");
        assert_eq!(
            err("utc:"),
            "line 1: utc needs a reason after the case name"
        );
    }

    #[test]
    fn a_run_fails_on_a_must_a_strict_should_or_any_change_from_the_expectations() {
        use Level::*;
        use Outcome::*;
        assert!(!Passed.fails_run(Must, false));
        assert!(Failed.fails_run(Must, false));
        assert!(!Failed.fails_run(Should, false));
        assert!(Failed.fails_run(Should, true));
        assert!(!ExpectedFailure.fails_run(Must, true));
        assert!(UnexpectedPass.fails_run(Should, false));
        assert_eq!(Outcome::of(false, true), ExpectedFailure);
        assert_eq!(Outcome::of(true, true), UnexpectedPass);
        // A case not run is never a pass, at any level, unless declared with a reason.
        assert!(NotRun.fails_run(Should, false));
        assert!(NotRun.fails_run(Must, false));
        assert!(!DeclaredNotRun.fails_run(Must, true));
        assert_eq!(Outcome::judged(false, true, false), NotRun);
        assert_eq!(Outcome::judged(false, true, true), DeclaredNotRun);
        assert_eq!(Outcome::judged(true, true, false), Passed);
    }

    /// A certificate records every declared case and every case not run, and is complete only
    /// when every case of the kit ran.
    #[test]
    fn a_certificate_names_what_was_declared_and_what_did_not_run() {
        let not_run: Result<String, String> = Err(format!(
            "{NOT_RUN}: a local server of the case's own: no MySQL server found"
        ));
        let ok: Result<String, String> = Ok("fine".into());
        let cases = [
            CaseResult {
                name: "utc",
                rules: "R-SCHEMA-6",
                level: Level::Must,
                seconds: 0.1,
                verdict: &not_run,
                expected: Some("no local server in our CI"),
            },
            CaseResult {
                name: "duplicate",
                rules: "R-STORE-4",
                level: Level::Must,
                seconds: 0.5,
                verdict: &ok,
                expected: None,
            },
        ];
        let declared = [Expected {
            case: "utc".into(),
            reason: "no local server in our CI".into(),
        }];
        let facts = Facts {
            receiver: "r",
            receiver_version: None,
            kit_sha256: "ab",
            database_server: "10.11",
            seed: 1,
            started_at: "2026-12-07T00:00:00Z",
            environment: serde_json::json!({}),
            mutant_matrix: None,
            declared: &declared,
            cases_total: 2,
        };
        let c = certificate(&facts, 1.0, &cases);
        assert_eq!(c["cases"][0]["verdict"], "not-run-declared");
        assert_eq!(c["not_run"][0]["case"], "utc");
        assert_eq!(c["not_run"][0]["declared"], "no local server in our CI");
        assert_eq!(c["declared"][0]["reason"], "no local server in our CI");
        assert_eq!(
            c["complete"], false,
            "a declared case not run is still not run"
        );
        assert_eq!(c["verdict"]["plain"], "pass");
        let undeclared = [CaseResult {
            expected: None,
            ..cases[0]
        }];
        let c = certificate(
            &Facts {
                declared: &[],
                ..facts
            },
            1.0,
            &undeclared,
        );
        assert_eq!(c["cases"][0]["verdict"], "not-run");
        assert_eq!(c["verdict"]["plain"], "fail", "a skip is never a pass");
    }

    #[test]
    fn a_report_path_gets_its_directory_and_an_unwritable_one_is_refused_before_the_run() {
        let dir = std::env::temp_dir().join(format!("kit-report-{}", std::process::id()));
        let file = dir.join("a/b/report.json");
        prepare(&file).unwrap();
        assert!(file.is_file());
        std::fs::write(dir.join("plain"), "").unwrap();
        let err = prepare(&dir.join("plain/report.xml")).unwrap_err();
        assert!(err.starts_with("cannot make "), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_json_report_carries_levels_outcomes_and_what_the_kit_cannot_verify() {
        let (ok, bad): (Result<String, String>, Result<String, String>) =
            (Ok("fine".into()), Err("R-STORE-9: 3 EXPIRED".into()));
        let cases = [
            CaseResult {
                name: "first-receipt",
                rules: "R-STORE-5 R-STORE-7",
                level: Level::Must,
                seconds: 1.23,
                verdict: &ok,
                expected: None,
            },
            CaseResult {
                name: "database-restart",
                rules: "R-STORE-9",
                level: Level::Should,
                seconds: 20.0,
                verdict: &bad,
                expected: None,
            },
        ];
        let j = json("./recv", 7, false, 21.26, &cases);
        assert_eq!(
            j["passed"], true,
            "a failed SHOULD alone passes without --strict"
        );
        assert_eq!(j["cases"][0]["rules"][1], "R-STORE-7");
        assert_eq!(j["cases"][1]["level"], "SHOULD");
        assert_eq!(j["cases"][1]["result"], "FAILED");
        assert_eq!(j["cases"][1]["message"], "R-STORE-9: 3 EXPIRED");
        assert_eq!(j["seconds"], 21.3);
        assert!(!j["cannot_verify"].as_array().unwrap().is_empty());
        assert_eq!(json("./recv", 7, true, 1.0, &cases)["passed"], false);
    }
}
