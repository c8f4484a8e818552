//! The read-only operator tools: `receiver digest`, `inspect` and `retention`, as real
//! processes against real servers.

use std::process::Output;

use fixtures::{EventSpec, OrbitDev, ReceiverDb, QUEUE};
use futures_util::{SinkExt, StreamExt};
use result_inbox::Outcome;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

fn receiver(args: &[&str], env: &[(&str, String)], stdin: Option<&[u8]>) -> Output {
    fixtures::run_receiver(args, env, stdin)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Replaces values that change from run to run.
fn redact(s: &str, keys: &[&str]) -> String {
    s.lines()
        .map(|line| {
            line.split(' ')
                .map(|tok| match tok.split_once('=') {
                    Some((k, _)) if keys.contains(&k) => format!("{k}=[{k}]"),
                    _ => tok.to_owned(),
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const TIMES: &[&str] = &[
    "received_at",
    "created_at",
    "updated_at",
    "lease_expires_at",
];

#[test]
fn digest_agrees_with_every_canonical_vector() {
    let doc: Value =
        serde_json::from_str(include_str!("../../../../docs/canonical-v1.json")).unwrap();
    for v in doc["vectors"].as_array().unwrap() {
        let input: Vec<u8> = if let Some(s) = v.get("input") {
            s.as_str().unwrap().as_bytes().to_vec()
        } else if let Some(h) = v.get("input_hex") {
            let h = h.as_str().unwrap();
            (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
                .collect()
        } else {
            let mut out = Vec::new();
            for part in v["input_parts"].as_array().unwrap() {
                for _ in 0..part[1].as_u64().unwrap() {
                    out.extend_from_slice(part[0].as_str().unwrap().as_bytes());
                }
            }
            out
        };
        let out = receiver(&["digest"], &[], Some(&input));
        let stdout = text(&out.stdout);
        let name = v["name"].as_str().unwrap();
        match v.get("error") {
            Some(kind) => {
                assert_eq!(out.status.code(), Some(3), "{name}");
                assert_eq!(
                    stdout,
                    format!("rejected={}\n", kind.as_str().unwrap()),
                    "{name}"
                );
            }
            None => {
                assert!(out.status.success(), "{name}: {}", text(&out.stderr));
                assert_eq!(
                    stdout,
                    format!(
                        "canonical={}\nsha256={}\n",
                        v["canonical"].as_str().unwrap(),
                        v["sha256"].as_str().unwrap()
                    ),
                    "{name}"
                );
            }
        }
    }
}

/// What `inspect` needs without the platform: the database and the queue.
fn local_env(rdb: &ReceiverDb) -> Vec<(&'static str, String)> {
    vec![
        (
            "ORBIT_RECEIVER_DSN",
            rdb.db.runtime_url().expose().to_owned(),
        ),
        ("ORBIT_QUEUE_ID", QUEUE.to_owned()),
    ]
}

#[tokio::test]
async fn digest_agrees_with_what_the_store_wrote_and_inspect_tells_each_case() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let env = local_env(&rdb);

    let applied = EventSpec::succeeded(
        "evt-applied",
        "task-i",
        3,
        r#"{"secret":"RESULT-BODY-XYZ","n":1.50}"#,
    );
    let stale = EventSpec::succeeded("evt-stale", "task-i", 2, r#"{"secret":"RESULT-BODY-XYZ"}"#);
    assert_eq!(
        store.apply(&applied.event()).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        store.apply(&applied.event()).await.unwrap(),
        Outcome::Duplicate { applied: true }
    );
    assert_eq!(store.apply(&stale.event()).await.unwrap(), Outcome::Stale);

    // digest --queue gives the digest the store wrote.
    let out = receiver(
        &["digest", "--queue", QUEUE],
        &[],
        Some(applied.json().as_bytes()),
    );
    let sha = text(&out.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .trim_start_matches("sha256=")
        .to_owned();
    let record = store
        .inbox_record(applied.event().id())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sha, record.digest.to_hex());
    let mut wrong_queue = applied.clone();
    wrong_queue.queue = "other".into();
    let out = receiver(
        &["digest", "--queue", QUEUE],
        &[],
        Some(wrong_queue.json().as_bytes()),
    );
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(3), "rejected=queue_mismatch\n".to_owned())
    );

    let conflict_file =
        std::env::temp_dir().join(format!("inspect-conflict-{}.json", std::process::id()));
    let mut other = applied.clone();
    other.result = Some(r#"{"secret":"OTHER"}"#.into());
    std::fs::write(&conflict_file, other.json()).unwrap();
    let conflict_path = conflict_file.display().to_string();

    let mut all = String::new();
    for (name, args) in [
        (
            "applied (and delivered twice)",
            vec!["inspect", "--event-id", "evt-applied"],
        ),
        ("stale", vec!["inspect", "--event-id", "evt-stale"]),
        ("never received", vec!["inspect", "--event-id", "evt-never"]),
        ("by task", vec!["inspect", "--task-id", "task-i"]),
        (
            "conflict",
            vec![
                "inspect",
                "--event-id",
                "evt-applied",
                "--compare",
                conflict_path.as_str(),
            ],
        ),
    ] {
        let out = receiver(&args, &env, None);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(
            !stdout.contains("RESULT-BODY-XYZ"),
            "a result body without --show-event"
        );
        all.push_str(&format!("## {name}\n{}\n", redact(&stdout, TIMES)));
    }
    insta::assert_snapshot!(all);

    let out = receiver(
        &[
            "inspect",
            "--event-id",
            "evt-applied",
            "--show-event",
            "--json",
        ],
        &env,
        None,
    );
    let v: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(v["verdict"], "applied");
    assert!(v["inbox"][0]["event"]
        .as_str()
        .unwrap()
        .contains("RESULT-BODY-XYZ"));
    assert_eq!(v["view"]["applied_events"], 1);

    let out = receiver(
        &["retention"],
        &[(
            "ORBIT_RECEIVER_DSN",
            rdb.db.runtime_url().expose().to_owned(),
        )],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    insta::assert_snapshot!(redact(&text(&out.stdout), &["oldest", "newest"]));
    let out = receiver(&["retention", "--help"], &[], None);
    assert!(text(&out.stdout).contains("deletes nothing"));

    assert!(!text(&out.stdout).contains(rdb.db.runtime.password.expose()));
    std::fs::remove_file(conflict_file).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_an_expired_delivery_and_survives_the_platform_going_down() {
    let mut orbit = OrbitDev::start(&["--lease-seconds", "1", "--max-attempts", "1"]).await;
    orbit.init_receiver().await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .unwrap();
    let task = client.submit_task(QUEUE, None).await.unwrap();
    client.cancel_task(&task.id).await.unwrap();

    // A consumer that takes the delivery and never ACKs: one lease, then EXPIRED.
    let mut req = format!("ws://{}/v1/subscriptions/{}/stream", orbit.addr, sub.id)
        .into_client_request()
        .unwrap();
    let token = orbit.credentials().token.expose().to_owned();
    req.headers_mut()
        .insert("Authorization", format!("Bearer {token}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    ws.send(Message::Text(r#"{"type":"credit","credit":1}"#.into()))
        .await
        .unwrap();
    let mut proof = String::new();
    while let Some(Ok(m)) = ws.next().await {
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            if v["type"] == "delivery" {
                proof = v["proof"].as_str().unwrap().to_owned();
                break;
            }
        }
    }
    fixtures::eventually(
        std::time::Duration::from_secs(10),
        "the delivery to be EXPIRED",
        || async {
            client
                .list_deliveries(&sub.id, &Default::default())
                .await
                .unwrap()[0]
                .state
                == "EXPIRED"
        },
    )
    .await;

    let mut env = orbit.receiver_env();
    env.push(("ORBIT_SUBSCRIPTION_ID", sub.id.to_string()));
    let out = receiver(&["inspect", "--task-id", &task.id], &env, None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(!stdout.contains(&proof) && !stdout.contains(&token));
    let expired = redact(
        &stdout,
        &[TIMES, &["delivery_id", "event_id", "task_id"]].concat(),
    );
    assert!(
        expired.ends_with("verdict=expired (attempts 1 of 1; add budget after fixing the cause)"),
        "{expired}"
    );

    orbit.kill();
    let out = receiver(&["inspect", "--task-id", &task.id], &env, None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let down = redact(
        &text(&out.stdout),
        &[TIMES, &["delivery_id", "event_id", "task_id"]].concat(),
    );
    assert!(down.contains("platform: unavailable ("), "{down}");
    let down: String = down
        .lines()
        .map(|l| {
            if l.starts_with("platform: unavailable") {
                "platform: unavailable ([reason]); the database side above is complete"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    insta::assert_snapshot!(format!("## expired\n{expired}\n## platform down\n{down}\n"));
}

/// A task id spelled inside another task's result does not put that event into the task's
/// report: only the envelope's `task_id` counts (issue 16, item 1).
#[tokio::test]
async fn inspect_by_task_lists_only_that_task_s_own_events() {
    let rdb = ReceiverDb::new().await;
    let store = rdb.store().await;
    let env = local_env(&rdb);
    let own = EventSpec::cancelled("evt-own", "task-b", 2);
    let intruder = EventSpec::succeeded(
        "evt-intruder",
        "task-a",
        3,
        r#"{"task_id":"task-b","note":"spelled inside a result"}"#,
    );
    for e in [&own, &intruder] {
        assert_eq!(store.apply(&e.event()).await.unwrap(), Outcome::Applied);
    }
    for args in [
        &["inspect", "--task-id", "task-b"][..],
        &["inspect", "--task-id", "task-b", "--json"][..],
    ] {
        let out = receiver(args, &env, None);
        let stdout = text(&out.stdout);
        assert!(stdout.contains("evt-own"), "{stdout}");
        assert!(!stdout.contains("evt-intruder"), "{args:?}: {stdout}");
    }
    let out = receiver(&["inspect", "--task-id", "task-a"], &env, None);
    assert!(text(&out.stdout).contains("evt-intruder"));
}
