//! The Orbit contract: the SDK against a real `orbit-dev` process on a real MySQL server, and
//! raw HTTP/WebSocket contract tests that do not go through the SDK's types.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fixtures::{cancelled_task, eventually, http_raw, OrbitDev, QUEUE};
use futures_util::{SinkExt, StreamExt};
use orbit_sdk::{
    AckResult, Client, ConsumerEvent, DeliveryFilter, DeliveryId, EventConsumer, SubscriptionId,
};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

async fn deliveries(client: &Client, sub: &SubscriptionId) -> Vec<orbit_sdk::wire::DeliveryInfo> {
    client
        .list_deliveries(sub, &DeliveryFilter::default())
        .await
        .unwrap()
}

/// A platform started with `args`, its client, and a subscription to `task.cancelled`.
async fn subscribed(args: &[&str]) -> (OrbitDev, Client, orbit_sdk::wire::Subscription) {
    let orbit = OrbitDev::start(args).await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .unwrap();
    (orbit, client, sub)
}

/// Waits until orbit-dev reports that its stream holds deliveries back for the reason
/// `what` (its "subscription …: <what>" line): the positive signal before an absence check.
async fn wait_for_hold(orbit: &OrbitDev, what: &str) {
    eventually(
        Duration::from_secs(10),
        &format!("orbit-dev to report \"{what}\""),
        || {
            let seen = orbit.log().contains(what);
            async move { seen }
        },
    )
    .await;
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn raw_stream(orbit: &OrbitDev, sub: &str) -> Ws {
    let mut req = format!("ws://{}/v1/subscriptions/{sub}/stream", orbit.addr)
        .into_client_request()
        .unwrap();
    let token = orbit.credentials().token.expose().to_owned();
    req.headers_mut()
        .insert("Authorization", format!("Bearer {token}").parse().unwrap());
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

async fn send_raw(ws: &mut Ws, v: Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

async fn next_raw(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a message within 10 s")
            .expect("stream open")
            .unwrap();
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            if v["type"] != "heartbeat" {
                return v;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_redelivers_with_a_new_proof_and_acks_are_checked() {
    let (orbit, client, sub) = subscribed(&["--lease-seconds", "1"]).await;
    assert_eq!(sub.id.len(), 32);
    cancelled_task(&client).await;

    let mut ws = raw_stream(&orbit, &sub.id).await;
    send_raw(&mut ws, json!({"type": "credit", "credit": 1})).await;
    let first = next_raw(&mut ws).await;
    assert_eq!(first["type"], "delivery");
    assert_eq!(first["attempt"], 1);
    let id = first["delivery_id"].as_str().unwrap().to_owned();
    let old_proof = first["proof"].as_str().unwrap().to_owned();
    // Never returned by the management API.
    let listed = serde_json::to_string(&deliveries(&client, &sub.id).await).unwrap();
    assert!(!listed.contains(&old_proof));

    // No ACK: after the one-second lease it comes back as attempt 2 with a new proof.
    send_raw(&mut ws, json!({"type": "credit", "credit": 1})).await;
    let second = next_raw(&mut ws).await;
    assert_eq!(second["delivery_id"], json!(id));
    assert_eq!(second["attempt"], 2);
    let proof = second["proof"].as_str().unwrap().to_owned();
    assert_ne!(proof, old_proof);

    send_raw(
        &mut ws,
        json!({"type": "ack", "delivery_id": id, "proof": old_proof}),
    )
    .await;
    let refused = next_raw(&mut ws).await;
    assert_eq!(refused["type"], "ack_result");
    assert_eq!(refused["result"], "refused");
    send_raw(
        &mut ws,
        json!({"type": "ack", "delivery_id": id, "proof": proof}),
    )
    .await;
    assert_eq!(next_raw(&mut ws).await["result"], "acked");
    send_raw(
        &mut ws,
        json!({"type": "ack", "delivery_id": id, "proof": proof}),
    )
    .await;
    assert_eq!(next_raw(&mut ws).await["result"], "already_acked");

    let d = client
        .get_delivery(&DeliveryId::new(id.as_str()).unwrap())
        .await
        .unwrap();
    assert_eq!((d.state.as_str(), d.attempts), ("ACKED", 2));
}

/// A lease the client hands back ends at once and costs no attempt; only the current lease's
/// proof can hand it back, and the next lease has a new proof.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_goes_back_pending_without_spending_an_attempt() {
    let (orbit, client, sub) = subscribed(&["--lease-seconds", "60"]).await;
    cancelled_task(&client).await;
    let mut ws = raw_stream(&orbit, &sub.id).await;
    send_raw(&mut ws, json!({"type": "credit", "credit": 1})).await;
    let first = next_raw(&mut ws).await;
    let id = first["delivery_id"].as_str().unwrap().to_owned();
    let proof = first["proof"].as_str().unwrap().to_owned();
    let delivery_id = DeliveryId::new(id.as_str()).unwrap();

    // Another proof changes nothing. (Releases are recorded before the ACKs read with them,
    // so the answer to an ACK sent after it shows it was recorded.)
    send_raw(
        &mut ws,
        json!({"type": "release", "delivery_id": id, "proof": "f".repeat(64)}),
    )
    .await;
    send_raw(
        &mut ws,
        json!({"type": "ack", "delivery_id": "nope", "proof": "x"}),
    )
    .await;
    assert_eq!(next_raw(&mut ws).await["result"], "refused");
    let d = client.get_delivery(&delivery_id).await.unwrap();
    assert_eq!((d.state.as_str(), d.attempts), ("LEASED", 1));

    send_raw(
        &mut ws,
        json!({"type": "release", "delivery_id": id, "proof": proof}),
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the delivery back to PENDING",
        || {
            let client = client.clone();
            let delivery_id = delivery_id.clone();
            async move {
                let d = client.get_delivery(&delivery_id).await.unwrap();
                d.state == "PENDING" && d.attempts == 0 && d.lease_expires_at.is_none()
            }
        },
    )
    .await;
    let (_, metrics) = http_raw(&orbit.addr, "GET", "/metrics", None, None);
    assert!(
        metrics.contains("orbit_leases_released_total 1"),
        "{metrics}"
    );

    // Leased again well before the 60 s lease would have run out: attempt 1, a new proof.
    send_raw(&mut ws, json!({"type": "credit", "credit": 1})).await;
    let again = next_raw(&mut ws).await;
    assert_eq!(again["delivery_id"], json!(id));
    assert_eq!(again["attempt"], 1);
    let new_proof = again["proof"].as_str().unwrap().to_owned();
    assert_ne!(new_proof, proof);
    send_raw(
        &mut ws,
        json!({"type": "ack", "delivery_id": id, "proof": proof}),
    )
    .await;
    assert_eq!(
        next_raw(&mut ws).await["result"],
        "refused",
        "the released lease's proof"
    );
    send_raw(
        &mut ws,
        json!({"type": "ack", "delivery_id": id, "proof": new_proof}),
    )
    .await;
    assert_eq!(next_raw(&mut ws).await["result"], "acked");
}

/// `orbit_ack_turns_total` from orbit-dev's `/metrics`.
fn ack_turns(orbit: &OrbitDev) -> u64 {
    orbit
        .metric("orbit_ack_turns_total")
        .expect("orbit_ack_turns_total in orbit-dev's /metrics")
}

/// Two streams of one subscription, the window smaller than their credit, and ACKs sent with
/// more credit in one burst, so that one turn (one transaction) records the ACKs and leases
/// again: no delivery is leased to both, the window is never exceeded (the turn counts the
/// leases its own ACKs ended), and each ACK gets the answer it would get alone, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_read_together_are_answered_as_alone_and_two_streams_share_the_window() {
    let (orbit, client, sub) = subscribed(&["--window", "8", "--lease-seconds", "60"]).await;
    for _ in 0..12 {
        cancelled_task(&client).await;
    }
    let mut leased: HashMap<String, String> = HashMap::new();
    let mut take = |v: &Value| {
        let id = v["delivery_id"].as_str().unwrap().to_owned();
        let proof = v["proof"].as_str().unwrap().to_owned();
        assert!(
            leased.insert(id.clone(), proof.clone()).is_none(),
            "{id} leased twice"
        );
        (id, proof)
    };
    // Six to stream a, then two to stream b: the window (8) is full, 4 pending.
    let mut a = raw_stream(&orbit, &sub.id).await;
    send_raw(&mut a, json!({"type": "credit", "credit": 6})).await;
    let mut on_a = Vec::new();
    for _ in 0..6 {
        on_a.push(take(&next_raw(&mut a).await));
    }
    let mut b = raw_stream(&orbit, &sub.id).await;
    send_raw(&mut b, json!({"type": "credit", "credit": 6})).await;
    let on_b = [take(&next_raw(&mut b).await), take(&next_raw(&mut b).await)];
    wait_for_hold(
        &orbit,
        "window full (8 of 8 leased or expired); holding 4 pending",
    )
    .await;

    // One burst on stream a: 5 more credit and ACKs, with repeats and refusals, one of them for
    // a delivery stream b holds (any stream of the subscription may ACK with the proof).
    let (own1, own2, theirs) = (&on_a[0], &on_a[1], &on_b[0]);
    let burst = [
        (own1.0.clone(), own1.1.clone(), "acked"),
        (own1.0.clone(), own1.1.clone(), "already_acked"),
        (own2.0.clone(), "0".repeat(64), "refused"),
        ("nope".to_owned(), "0".repeat(64), "refused"),
        (own2.0.clone(), own2.1.clone(), "acked"),
        (theirs.0.clone(), theirs.1.clone(), "acked"),
        (own2.0.clone(), own1.1.clone(), "refused"),
    ];
    let turns_before = ack_turns(&orbit);
    let frames = std::iter::once(json!({"type": "credit", "credit": 5})).chain(
        burst
            .iter()
            .map(|(id, proof, _)| json!({"type": "ack", "delivery_id": id, "proof": proof})),
    );
    for f in frames {
        a.feed(Message::Text(f.to_string().into())).await.unwrap();
    }
    a.flush().await.unwrap();
    let mut answers = Vec::new();
    while answers.len() < burst.len() {
        let v = next_raw(&mut a).await;
        match v["type"].as_str() {
            Some("ack_result") => answers.push(v),
            _ => {
                take(&v);
            }
        }
    }
    for (i, ((id, _, expected), answer)) in burst.iter().zip(&answers).enumerate() {
        assert_eq!(answer["delivery_id"], json!(id), "answer {i} in order");
        assert_eq!(answer["result"], json!(expected), "answer {i}: {answer}");
    }
    let turns = ack_turns(&orbit) - turns_before;
    assert!(
        turns < burst.len() as u64,
        "{} ACKs sent in one write were recorded in {turns} transactions",
        burst.len()
    );
    // Three leases ended, so three more are leased, not the 4 pending nor the 5 credit: the
    // window is full again with one pending.
    wait_for_hold(
        &orbit,
        "window full (8 of 8 leased or expired); holding 1 pending",
    )
    .await;
    let states: Vec<String> = deliveries(&client, &sub.id)
        .await
        .into_iter()
        .map(|d| d.state)
        .collect();
    let count = |s: &str| states.iter().filter(|x| *x == s).count();
    assert_eq!(
        (count("ACKED"), count("LEASED"), count("PENDING")),
        (3, 8, 1),
        "{states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ack_reply_is_reported_again_with_the_same_proof() {
    let (orbit, client, sub) = subscribed(&["--enable-fault-api"]).await;
    let (status, _) = http_raw(
        &orbit.addr,
        "POST",
        "/v1/_faults",
        None,
        Some(&json!({"fault": "drop-next-ack-reply"})),
    );
    assert_eq!(status, 200);
    cancelled_task(&client).await;

    let consumer = EventConsumer::new(client.clone(), sub.id.clone())
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .start(|_d| async { Ok::<(), String>(()) });
    let mut events = consumer.events();
    let answer = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if let Ok(ConsumerEvent::Ack { result, .. }) = events.recv().await {
                return result;
            }
        }
    })
    .await
    .expect("the re-reported ACK is answered");
    // The platform recorded the first ACK; the repeat, with the same proof, is recognised.
    assert_eq!(answer, AckResult::AlreadyAcked);
    let d = &deliveries(&client, &sub.id).await[0];
    assert_eq!((d.state.as_str(), d.attempts), ("ACKED", 1));
    consumer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_expires_and_occupies_the_window_until_budget_is_added() {
    let orbit = OrbitDev::start(&[
        "--lease-seconds",
        "1",
        "--max-attempts",
        "2",
        "--window",
        "1",
    ])
    .await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .unwrap();
    let first_task = cancelled_task(&client).await;
    let fail_first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let consumer = {
        let (fail_first, seen) = (fail_first.clone(), seen.clone());
        EventConsumer::new(client.clone(), sub.id.clone()).start(move |d| {
            let fail = fail_first.load(Ordering::SeqCst) && d.event_json().contains(&first_task);
            seen.lock().unwrap().push(d.event_json().to_owned());
            async move {
                if fail {
                    Err("the business update failed")
                } else {
                    Ok(())
                }
            }
        })
    };
    let c = client.clone();
    let s = sub.id.clone();
    eventually(
        Duration::from_secs(15),
        "the first delivery to expire",
        || {
            let (c, s) = (c.clone(), s.clone());
            async move { deliveries(&c, &s).await[0].state == "EXPIRED" }
        },
    )
    .await;
    let expired = deliveries(&client, &sub.id).await[0].clone();
    assert_eq!(expired.attempts, 2);

    // The EXPIRED delivery fills the window of 1: a second event is not delivered, and the
    // platform says so.
    cancelled_task(&client).await;
    wait_for_hold(
        &orbit,
        "window full (1 of 1 leased or expired); holding 1 pending",
    )
    .await;
    let all = deliveries(&client, &sub.id).await;
    assert_eq!(all[1].state, "PENDING", "{all:?}");
    assert_eq!(all[1].attempts, 0);

    fail_first.store(false, Ordering::SeqCst);
    let d = client.add_budget(&expired.id, 1).await.unwrap();
    // PENDING again, and possibly leased already by the time the answer is read back.
    assert!(matches!(d.state.as_str(), "PENDING" | "LEASED"), "{d:?}");
    assert_eq!(d.budget, 3);
    eventually(
        Duration::from_secs(15),
        "both deliveries to be ACKED",
        || {
            let (c, s) = (c.clone(), s.clone());
            async move { deliveries(&c, &s).await.iter().all(|d| d.state == "ACKED") }
        },
    )
    .await;
    let all = deliveries(&client, &sub.id).await;
    assert_eq!(all[0].attempts, 3);
    assert_eq!(all[1].attempts, 1);
    let e = client.add_budget(&expired.id, 1).await.unwrap_err();
    assert_eq!(e.code(), Some("not_expired"));
    let e = client.add_budget(&expired.id, 11).await.unwrap_err();
    assert_eq!(e.status(), Some(422));
    consumer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_deliveries_and_resume_releases_the_backlog() {
    let (orbit, client, sub) = subscribed(&[]).await;
    for _ in 0..3 {
        cancelled_task(&client).await;
    }
    assert!(!client.pause_subscription(&sub.id).await.unwrap().enabled);
    let handled = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let handled = handled.clone();
        EventConsumer::new(client.clone(), sub.id.clone()).start(move |_d| {
            handled.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), String>(()) }
        })
    };
    wait_for_hold(&orbit, "paused; holding 3 pending").await;
    assert_eq!(handled.load(Ordering::SeqCst), 0, "nothing while paused");
    assert!(client.resume_subscription(&sub.id).await.unwrap().enabled);
    let c = client.clone();
    let s = sub.id.clone();
    eventually(Duration::from_secs(15), "the backlog to be ACKED", || {
        let (c, s) = (c.clone(), s.clone());
        async move {
            let all = deliveries(&c, &s).await;
            all.len() == 3 && all.iter().all(|d| d.state == "ACKED")
        }
    })
    .await;
    assert_eq!(handled.load(Ordering::SeqCst), 3);
    consumer.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_scopes_queues_and_tokens() {
    let orbit = OrbitDev::start(&[]).await;
    let client = orbit.client();
    let token = orbit.credentials().token.expose().to_owned();
    let mut bodies = Vec::new();
    for _ in 0..64 {
        client
            .create_subscription(QUEUE, &["task.cancelled"])
            .await
            .unwrap();
    }
    let e = client
        .create_subscription(QUEUE, &["task.cancelled"])
        .await
        .unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(409), Some("subscription_limit"))
    );
    assert!(e.to_string().contains("64"), "{e}");

    // A task-only credential from a second bootstrap (no --event-access).
    let task_only = orbit.credentials_file.with_file_name("tasks.json");
    let printed = fixtures::bootstrap(
        orbit.db.platform_url().expose(),
        "other-queue",
        false,
        &task_only,
    )
    .unwrap();
    assert!(printed.contains("credentials written to"), "{printed}");
    assert!(
        !printed.contains("orb_"),
        "bootstrap never prints the token: {printed}"
    );
    let other = orbit_sdk::Credentials::load(&task_only).unwrap();
    // A second bootstrap to the same file refuses and keeps it (the old token stays valid on
    // the platform, and would be lost); --force replaces it; a missing directory is refused.
    let again = fixtures::bootstrap(
        orbit.db.platform_url().expose(),
        "other-queue",
        false,
        &task_only,
    )
    .unwrap_err();
    assert!(again.contains("exists: refusing to overwrite"), "{again}");
    assert_eq!(
        orbit_sdk::Credentials::load(&task_only)
            .unwrap()
            .token
            .expose(),
        other.token.expose()
    );
    let mut force = std::process::Command::new(fixtures::workspace_bin("orbit-dev"));
    let forced = force
        .args(["bootstrap", "--application", "a", "--namespace", "default"])
        .args(["--environment", "development", "--queue", "other-queue"])
        .arg("--output")
        .arg(&task_only)
        .arg("--force")
        .env("ORBIT_MYSQL_DSN", orbit.db.platform_url().expose())
        .output()
        .unwrap();
    assert!(forced.status.success(), "{forced:?}");
    assert_ne!(
        orbit_sdk::Credentials::load(&task_only)
            .unwrap()
            .token
            .expose(),
        other.token.expose()
    );
    let nowhere = task_only.with_file_name("no-such-dir").join("c.json");
    let mut cmd = std::process::Command::new(fixtures::workspace_bin("orbit-dev"));
    let refused = cmd
        .args(["bootstrap", "--application", "a", "--namespace", "default"])
        .args(["--environment", "development", "--queue", "q", "--output"])
        .arg(&nowhere)
        .env("ORBIT_MYSQL_DSN", orbit.db.platform_url().expose())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("does not exist"));
    assert!(
        !nowhere.parent().unwrap().exists(),
        "no directory was created"
    );
    // A non-UTF-8 argument is one line and exit 2, not a panic.
    let mut cmd = std::process::Command::new(fixtures::workspace_bin("orbit-dev"));
    let bad = cmd
        .args(["bootstrap", "--queue"])
        .arg(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"q\xff"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(stderr.trim(), "orbit-dev: argument 3 is not valid UTF-8");
    let (status, body) = http_raw(
        &orbit.addr,
        "POST",
        "/v1/subscriptions",
        Some(other.token.expose()),
        Some(&json!({"queue_id": "other-queue", "event_types": ["task.cancelled"]})),
    );
    assert_eq!(status, 403);
    assert!(
        body.contains("missing_scope") && body.contains("events:manage"),
        "{body}"
    );
    bodies.push(body);
    // Queue not bound: the first credential asks for other-queue.
    let (status, body) = http_raw(
        &orbit.addr,
        "POST",
        "/v1/queues/other-queue/tasks",
        Some(&token),
        Some(&json!({})),
    );
    assert_eq!(status, 403);
    assert!(body.contains("queue_not_bound"), "{body}");
    bodies.push(body);
    let (status, body) = http_raw(
        &orbit.addr,
        "GET",
        "/v1/credential",
        Some("orb_wrong"),
        None,
    );
    assert_eq!(status, 401);
    bodies.push(body);
    let (status, body) = http_raw(&orbit.addr, "GET", "/v1/credential", None, None);
    assert_eq!(status, 401);
    bodies.push(body);
    let (status, body) = http_raw(&orbit.addr, "GET", "/v1/credential", Some(&token), None);
    assert_eq!(status, 200);
    bodies.push(body);
    let (status, body) = http_raw(
        &orbit.addr,
        "POST",
        "/v1/subscriptions",
        Some(&token),
        Some(&json!({"queue": 1})),
    );
    assert_eq!(status, 422);
    assert!(body.contains("invalid_request"), "{body}");
    bodies.push(body);
    // Without --enable-fault-api the fault endpoint does not exist.
    let (status, _) = http_raw(
        &orbit.addr,
        "POST",
        "/v1/_faults",
        Some(&token),
        Some(&json!({"fault": "drop-next-ack-reply"})),
    );
    assert_eq!(status, 404);
    for b in &bodies {
        assert!(
            !b.contains(&token) && !b.contains(other.token.expose()),
            "a body shows a token: {b}"
        );
        let v: Value = serde_json::from_str(b).unwrap();
        if !v["error"].is_null() {
            assert!(
                v["error"]["code"].is_string() && v["error"]["message"].is_string(),
                "{b}"
            );
        }
    }
    assert!(!format!("{client:?}").contains(&token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_handlers_hold_at_most_the_concurrency_and_shutdown_meets_its_deadline() {
    let (orbit, client, sub) = subscribed(&[]).await;
    for _ in 0..10 {
        cancelled_task(&client).await;
    }
    let started = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let started = started.clone();
        EventConsumer::new(client.clone(), sub.id.clone())
            .concurrency(4)
            .start(move |_d| {
                started.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok::<(), String>(())
                }
            })
    };
    let s2 = started.clone();
    eventually(Duration::from_secs(10), "four handlers to start", || {
        let s2 = s2.clone();
        async move { s2.load(Ordering::SeqCst) == 4 }
    })
    .await;
    // The platform holds the other six back because the consumer gave no more credit.
    wait_for_hold(&orbit, "the client has no credit; holding 6 pending").await;
    let leased = client
        .list_deliveries(
            &sub.id,
            &DeliveryFilter {
                state: Some("LEASED".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 4);
    assert_eq!(started.load(Ordering::SeqCst), 4);
    let t = Instant::now();
    let summary = consumer.shutdown(Duration::from_secs(2)).await;
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(summary.cancelled_handlers, 4);
    let acked = client
        .list_deliveries(
            &sub.id,
            &DeliveryFilter {
                state: Some("ACKED".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(acked.is_empty(), "cancelled handlers are not ACKed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_platform_comes_back_and_nothing_is_lost_or_acked_twice() {
    let (mut orbit, client, sub) = subscribed(&["--lease-seconds", "2"]).await;
    for _ in 0..5 {
        cancelled_task(&client).await;
    }
    let acks: Arc<Mutex<HashMap<String, Vec<AckResult>>>> = Arc::default();
    // Handlers hold until the platform is down, so deliveries are surely in flight at the kill.
    let (release, released) = tokio::sync::watch::channel(false);
    let started = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let started = started.clone();
        EventConsumer::new(client.clone(), sub.id.clone())
            .backoff(Duration::from_millis(50), Duration::from_millis(300))
            .start(move |_d| {
                started.fetch_add(1, Ordering::SeqCst);
                let mut released = released.clone();
                async move {
                    let _ = released.wait_for(|r| *r).await;
                    Ok::<(), String>(())
                }
            })
    };
    let mut events = consumer.events();
    let recorder = {
        let acks = acks.clone();
        tokio::spawn(async move {
            while let Ok(e) = events.recv().await {
                if let ConsumerEvent::Ack {
                    delivery_id,
                    result,
                    ..
                } = e
                {
                    acks.lock()
                        .unwrap()
                        .entry(delivery_id.into_string())
                        .or_default()
                        .push(result);
                }
            }
        })
    };
    let s2 = started.clone();
    eventually(Duration::from_secs(10), "handlers to be running", || {
        let n = s2.load(Ordering::SeqCst);
        async move { n >= 1 }
    })
    .await;
    let mut disconnected = consumer.events();
    orbit.kill();
    // Their ACKs go out while the platform is down; the consumer must keep them.
    release.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !matches!(
            disconnected.recv().await,
            Ok(ConsumerEvent::Disconnected { .. }) | Err(_)
        ) {}
    })
    .await
    .expect("the consumer notices the platform is gone");
    orbit.restart();
    for _ in 0..5 {
        cancelled_task(&client).await;
    }
    let c = client.clone();
    let s = sub.id.clone();
    eventually(
        Duration::from_secs(30),
        "all ten deliveries to be ACKED",
        || {
            let (c, s) = (c.clone(), s.clone());
            async move {
                let all = deliveries(&c, &s).await;
                all.len() == 10 && all.iter().all(|d| d.state == "ACKED")
            }
        },
    )
    .await;
    consumer.shutdown(Duration::from_secs(5)).await;
    recorder.abort();
    let acks = acks.lock().unwrap();
    for (id, results) in acks.iter() {
        let acked = results.iter().filter(|r| **r == AckResult::Acked).count();
        assert!(acked <= 1, "{id} was ACKed {acked} times: {results:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_integer_result_reaches_the_handler_with_its_exact_text() {
    let orbit = OrbitDev::start(&[]).await;
    let client = orbit.client();
    let token = orbit.credentials().token.expose().to_owned();
    let sub = client
        .create_subscription(QUEUE, &["task.succeeded", "task.needs_review"])
        .await
        .unwrap();
    // Raw HTTP with the body as text, not the SDK's types (nor serde_json's Value, which
    // would round the big integer), so the two sides cannot be wrong the same way.
    let result = r#"{"total": 123456789012345678901234567890, "price": 1.50, "neg": -0}"#;
    let raw_body = format!(r#"{{"state":"NEEDS_REVIEW","result":{result}}}"#);
    let task2 = client.submit_task(QUEUE, None).await.unwrap();
    let reply = raw_post(
        &orbit.addr,
        &format!("/v1/tasks/{}/report", task2.id),
        &token,
        &raw_body,
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("123456789012345678901234567890"), "{reply}");

    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let consumer = {
        let seen = seen.clone();
        EventConsumer::new(client.clone(), sub.id.clone()).start(move |d| {
            seen.lock().unwrap().push(d.event_json().to_owned());
            async { Ok::<(), String>(()) }
        })
    };
    let s2 = seen.clone();
    eventually(Duration::from_secs(10), "the needs-review event", || {
        let s2 = s2.clone();
        async move {
            s2.lock()
                .unwrap()
                .iter()
                .any(|e| e.contains("NEEDS_REVIEW"))
        }
    })
    .await;
    let event = seen
        .lock()
        .unwrap()
        .iter()
        .find(|e| e.contains("NEEDS_REVIEW"))
        .cloned()
        .unwrap();
    assert!(
        event.contains(
            r#""result":{"total": 123456789012345678901234567890, "price": 1.50, "neg": -0}"#
        ),
        "{event}"
    );
    assert!(event.contains(r#""type":"task.needs_review""#), "{event}");
    assert!(
        event.contains(&format!(r#""task_id":"{}""#, task2.id)),
        "{event}"
    );
    consumer.shutdown(Duration::from_secs(5)).await;
}

/// POSTs `body` verbatim (no JSON round trip in the test either); the raw reply.
fn raw_post(addr: &str, path: &str, token: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

/// The contract's edges (issue 16, item 6): a list limit outside 1..=10000 is refused, not
/// silently clamped, and a binary frame closes the stream instead of being ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_range_limit_is_refused_and_a_binary_frame_closes_the_stream() {
    let (orbit, _client, sub) = subscribed(&[]).await;
    let token = orbit.credentials().token.expose().to_owned();
    for limit in ["0", "10001"] {
        let (status, body) = http_raw(
            &orbit.addr,
            "GET",
            &format!("/v1/subscriptions/{}/deliveries?limit={limit}", sub.id),
            Some(&token),
            None,
        );
        assert_eq!(status, 422, "limit={limit}: {body}");
        assert!(body.contains("limit must be between 1 and 10000"), "{body}");
    }
    let (status, _) = http_raw(
        &orbit.addr,
        "GET",
        &format!("/v1/subscriptions/{}/deliveries?limit=10000", sub.id),
        Some(&token),
        None,
    );
    assert_eq!(status, 200);

    let mut ws = raw_stream(&orbit, &sub.id).await;
    ws.send(Message::Binary(vec![1, 2, 3].into()))
        .await
        .unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert_eq!(
        closed,
        Ok(true),
        "the stream stayed open after a binary frame"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_no_receiver_could_accept_is_refused_at_the_report_by_its_rule() {
    let orbit = OrbitDev::start(&[]).await;
    let client = orbit.client();
    let sub = client
        .create_subscription(QUEUE, &["task.succeeded"])
        .await
        .unwrap();
    let deep = format!("{}1{}", "[".repeat(128), "]".repeat(128));
    for (result, kind) in [
        (r#"{"a":1,"a":2}"#.to_owned(), "duplicate_key"),
        (r#"{"s":"\ud800"}"#.to_owned(), "lone_surrogate"),
        (deep, "too_deep"),
    ] {
        let task = client.submit_task(QUEUE, None).await.unwrap();
        let raw = serde_json::value::RawValue::from_string(result).unwrap();
        let e = client
            .report_task(&task.id, "SUCCEEDED", Some(&raw))
            .await
            .unwrap_err();
        assert_eq!(
            (e.status(), e.code()),
            (Some(422), Some("invalid_result")),
            "{kind}"
        );
        assert!(e.to_string().contains(kind), "{kind}: {e}");
        // Nothing happened: the task is as it was and no event was emitted.
        assert_eq!(client.get_task(&task.id).await.unwrap().state, "PENDING");
    }
    // One level less deep is fine (the result sits at depth 2 of the event).
    let task = client.submit_task(QUEUE, None).await.unwrap();
    let fine = format!("{}1{}", "[".repeat(127), "]".repeat(127));
    let raw = serde_json::value::RawValue::from_string(fine).unwrap();
    client
        .report_task(&task.id, "SUCCEEDED", Some(&raw))
        .await
        .unwrap();
    let all = client
        .list_deliveries(&sub.id, &Default::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "only the acceptable result was emitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discarded_delivery_frees_its_slot_of_the_window_and_never_comes_again() {
    let (orbit, client, sub) = subscribed(&[
        "--lease-seconds",
        "1",
        "--max-attempts",
        "1",
        "--window",
        "1",
    ])
    .await;
    let never = cancelled_task(&client).await;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let consumer = {
        let seen = seen.clone();
        EventConsumer::new(client.clone(), sub.id.clone()).start(move |d| {
            let refuse = d.event_json().contains(&never);
            seen.lock().unwrap().push(d.delivery_id.to_string());
            async move {
                if refuse {
                    Err("refused every time")
                } else {
                    Ok(())
                }
            }
        })
    };
    let (c, s) = (client.clone(), sub.id.clone());
    eventually(Duration::from_secs(15), "the delivery to expire", || {
        let (c, s) = (c.clone(), s.clone());
        async move { deliveries(&c, &s).await[0].state == "EXPIRED" }
    })
    .await;
    let stuck = deliveries(&client, &sub.id).await[0].clone();
    cancelled_task(&client).await;
    wait_for_hold(
        &orbit,
        "window full (1 of 1 leased or expired); holding 1 pending",
    )
    .await;
    // Only an EXPIRED delivery can be discarded.
    let pending = deliveries(&client, &sub.id).await[1].clone();
    let e = client.discard_delivery(&pending.id).await.unwrap_err();
    assert_eq!(e.code(), Some("not_expired"));
    let d = client.discard_delivery(&stuck.id).await.unwrap();
    assert_eq!(d.state, "DISCARDED");
    let (c, s) = (client.clone(), sub.id.clone());
    eventually(Duration::from_secs(15), "the next delivery ACKED", || {
        let (c, s) = (c.clone(), s.clone());
        async move { deliveries(&c, &s).await[1].state == "ACKED" }
    })
    .await;
    consumer.shutdown(Duration::from_secs(5)).await;
    let all = deliveries(&client, &sub.id).await;
    assert_eq!(all[0].state, "DISCARDED");
    assert_eq!(all[0].attempts, 1, "never leased again");
    assert_eq!(
        seen.lock()
            .unwrap()
            .iter()
            .filter(|id| stuck.id == **id)
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_at_the_edges_is_the_documented_json() {
    let (orbit, client, sub) = subscribed(&[]).await;
    let token = orbit.credentials().token.expose().to_owned();
    let is_error = |body: &str, code: &str| {
        let v: serde_json::Value =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"));
        v["error"]["code"] == code && v["error"]["message"].is_string()
    };
    // A body over the limit: 413, not 422.
    let task = client.submit_task(QUEUE, None).await.unwrap();
    let big = json!({"state": "SUCCEEDED", "result": "x".repeat(700 * 1024)});
    let (status, body) = http_raw(
        &orbit.addr,
        "POST",
        &format!("/v1/tasks/{}/report", task.id),
        Some(&token),
        Some(&big),
    );
    assert_eq!(status, 413);
    assert!(is_error(&body, "body_too_large"), "{body}");
    // A malformed query string.
    let (status, body) = http_raw(
        &orbit.addr,
        "GET",
        &format!("/v1/subscriptions/{}/deliveries?limit=many", sub.id),
        Some(&token),
        None,
    );
    assert_eq!(status, 422);
    assert!(is_error(&body, "invalid_request"), "{body}");
    // A method the endpoint does not take.
    let (status, body) = http_raw(&orbit.addr, "DELETE", "/v1/credential", Some(&token), None);
    assert_eq!(status, 405);
    assert!(is_error(&body, "method_not_allowed"), "{body}");
    // A request target and headers over their limits.
    let long = format!("/v1/tasks/{}", "t".repeat(10 * 1024));
    let (status, body) = http_raw(&orbit.addr, "GET", &long, Some(&token), None);
    assert_eq!(status, 414);
    assert!(is_error(&body, "uri_too_long"), "{body}");
    let huge_token = "h".repeat(20 * 1024);
    let (status, body) = http_raw(
        &orbit.addr,
        "GET",
        "/v1/credential",
        Some(&huge_token),
        None,
    );
    assert_eq!(status, 431);
    assert!(is_error(&body, "headers_too_large"), "{body}");

    // Another namespace's delivery answers exactly as a delivery that does not exist.
    cancelled_task(&client).await;
    let mine = deliveries(&client, &sub.id).await[0].id.clone();
    let other_file = testdb::scratch_dir()
        .unwrap()
        .join(format!("other-ns-{}.json", std::process::id()));
    let out = std::process::Command::new(fixtures::workspace_bin("orbit-dev"))
        .args([
            "bootstrap",
            "--application",
            "other",
            "--namespace",
            "elsewhere",
            "--environment",
            "development",
            "--queue",
            "elsewhere-queue",
            "--event-access",
            "--output",
        ])
        .arg(&other_file)
        .env("ORBIT_MYSQL_DSN", orbit.db.platform_url().expose())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stranger = orbit_sdk::Credentials::load(&other_file).unwrap().token;
    let (foreign_status, foreign) = http_raw(
        &orbit.addr,
        "GET",
        &format!("/v1/deliveries/{mine}"),
        Some(stranger.expose()),
        None,
    );
    let (unknown_status, unknown) = http_raw(
        &orbit.addr,
        "GET",
        "/v1/deliveries/0123456789abcdef0123456789abcdef",
        Some(stranger.expose()),
        None,
    );
    assert_eq!((foreign_status, unknown_status), (404, 404));
    assert_eq!(foreign, unknown, "one answer for both");
    assert!(foreign.contains("no such delivery"), "{foreign}");
}

/// Whether the server closes `stream` within `within` (a read returns end of file or an error),
/// and what it sent before closing.
fn closed_within(stream: &mut std::net::TcpStream, within: Duration) -> (bool, String) {
    use std::io::Read;
    stream.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (true, String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (true, String::from_utf8_lossy(&got).into_owned())
            }
            Err(_) => return (false, String::from_utf8_lossy(&got).into_owned()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_cut_off_and_connections_are_limited() {
    use std::io::Write;
    let orbit = OrbitDev::start(&[
        "--header-timeout-seconds",
        "1",
        "--body-timeout-seconds",
        "1",
        "--max-connections",
        "3",
    ])
    .await;
    let token = orbit.credentials().token.expose().to_owned();
    // A head that never ends: closed after the header timeout.
    let mut trickle = std::net::TcpStream::connect(&orbit.addr).unwrap();
    trickle
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    let started = Instant::now();
    let (closed, _) = closed_within(&mut trickle, Duration::from_secs(5));
    assert!(closed, "a partial head was not cut off");
    assert!(started.elapsed() < Duration::from_secs(4));
    // A body that stalls: 408 with the documented error after the body timeout.
    let mut stall = std::net::TcpStream::connect(&orbit.addr).unwrap();
    write!(
        stall,
        "POST /v1/subscriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{{\"queue\":"
    )
    .unwrap();
    let (closed, reply) = closed_within(&mut stall, Duration::from_secs(5));
    assert!(closed, "a stalled body was not cut off");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains(r#""code":"body_timeout""#), "{reply}");

    // Three connections at most: with three held open, a fourth is not served until one of
    // them goes.
    let orbit =
        OrbitDev::start(&["--header-timeout-seconds", "60", "--max-connections", "3"]).await;
    let mut held: Vec<std::net::TcpStream> = (0..3)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&orbit.addr).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut fourth = std::net::TcpStream::connect(&orbit.addr).unwrap();
    fourth
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (answered, reply) = closed_within(&mut fourth, Duration::from_secs(1));
    assert!(
        !answered && reply.is_empty(),
        "served past the limit: {reply}"
    );
    held.pop();
    let (answered, reply) = closed_within(&mut fourth, Duration::from_secs(5));
    assert!(answered, "not served after a slot was freed");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

/// The platform's error code for a call that should fail.
fn api_error<T: std::fmt::Debug>(r: Result<T, orbit_sdk::SdkError>) -> (u16, String) {
    match r {
        Err(orbit_sdk::SdkError::Api { status, code, .. }) => (status, code),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The deliveries ACKED in a window of time, page by page with a cursor, and a redelivery: an
/// ACKED delivery goes back to PENDING with a fresh budget and its ACK forgotten, is leased
/// again with a new proof (the old one refused) and the same event text, and is listed again
/// once ACKED anew; a delivery that is not ACKED, and every malformed window, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_deliveries_list_by_time_in_pages_and_one_is_redelivered_with_a_new_proof() {
    let (orbit, client, sub) = subscribed(&["--lease-seconds", "60"]).await;
    for _ in 0..5 {
        cancelled_task(&client).await;
    }
    let mut ws = raw_stream(&orbit, &sub.id).await;
    send_raw(&mut ws, json!({"type": "credit", "credit": 5})).await;
    let mut first = HashMap::new();
    for _ in 0..5 {
        let d = next_raw(&mut ws).await;
        first.insert(d["delivery_id"].as_str().unwrap().to_owned(), d);
    }
    // One ACK at a time, each answered before the next: five ACK times.
    for (id, d) in &first {
        send_raw(
            &mut ws,
            json!({"type": "ack", "delivery_id": id, "proof": d["proof"]}),
        )
        .await;
        assert_eq!(next_raw(&mut ws).await["result"], "acked");
    }
    let since = "2000-01-01T00:00:00Z";
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = client
            .list_acked(&sub.id, since, None, after.as_deref(), 2)
            .await
            .unwrap();
        pages.push(page.deliveries.len());
        let next = page.next.clone();
        for d in &page.deliveries {
            assert_eq!(d.state, "ACKED");
            assert!(d.acked_at.is_some(), "{d:?}");
            assert!(first.contains_key(d.id.as_str()), "{d:?}");
        }
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(pages, [2, 2, 1]);
    let all = client
        .list_acked(&sub.id, since, None, None, 10)
        .await
        .unwrap();
    assert!(all.next.is_none());
    let times: Vec<String> = all
        .deliveries
        .iter()
        .map(|d| d.acked_at.clone().unwrap())
        .collect();
    assert_eq!(times.len(), 5);
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // A window that ends at the fourth ACK holds the ones ACKED before it.
    let until = times[3].clone();
    let early = client
        .list_acked(&sub.id, since, Some(&until), None, 10)
        .await
        .unwrap();
    assert_eq!(
        early.deliveries.len(),
        times.iter().filter(|t| **t < until).count()
    );
    // Malformed windows.
    for (s, u, a, limit) in [
        ("yesterday", None, None, 10),
        (since, Some(since), None, 10),
        (since, Some("1999-01-01T00:00:00Z"), None, 10),
        (since, None, Some("not-a-cursor"), 10),
        (since, None, None, 0),
    ] {
        assert_eq!(
            api_error(client.list_acked(&sub.id, s, u, a, limit).await),
            (422, "invalid_request".to_owned()),
            "{s} {u:?} {a:?} {limit}"
        );
    }
    // The first delivery redelivered with a budget of 2: PENDING, its ACK forgotten.
    let d0 = all.deliveries[0].clone();
    let again = client.redeliver(&d0.id, Some(2)).await.unwrap();
    assert_eq!(
        (
            again.state.as_str(),
            again.budget,
            again.acked_at.as_deref()
        ),
        ("PENDING", d0.attempts + 2, None)
    );
    assert_eq!(
        api_error(client.redeliver(&d0.id, None).await),
        (409, "not_acked".to_owned())
    );
    assert_eq!(
        client
            .list_acked(&sub.id, since, None, None, 10)
            .await
            .unwrap()
            .deliveries
            .len(),
        4
    );
    send_raw(&mut ws, json!({"type": "credit", "credit": 1})).await;
    let redelivered = next_raw(&mut ws).await;
    let before = &first[d0.id.as_str()];
    assert_eq!(redelivered["delivery_id"], before["delivery_id"]);
    assert_eq!(redelivered["attempt"], json!(d0.attempts + 1));
    assert_ne!(redelivered["proof"], before["proof"]);
    assert_eq!(
        redelivered["event"], before["event"],
        "the event never changes"
    );
    send_raw(
        &mut ws,
        json!({"type": "ack", "delivery_id": d0.id.as_str(), "proof": before["proof"]}),
    )
    .await;
    assert_eq!(next_raw(&mut ws).await["result"], "refused");
    send_raw(
        &mut ws,
        json!({"type": "ack", "delivery_id": d0.id.as_str(), "proof": redelivered["proof"]}),
    )
    .await;
    assert_eq!(next_raw(&mut ws).await["result"], "acked");
    let last = client
        .list_acked(&sub.id, since, None, None, 10)
        .await
        .unwrap();
    assert_eq!(last.deliveries.len(), 5);
    assert_eq!(
        last.deliveries[4].id, d0.id,
        "listed again, as the newest ACK"
    );
    assert_eq!(orbit.metric("orbit_redelivered_total"), Some(1));
}
