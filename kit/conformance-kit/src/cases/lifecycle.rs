//! Cases on how the program starts and stops, and what it prints: the queue check at start,
//! SIGTERM, and no secrets in the output.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use commit_proxy::{Action, RuleSpec};
use nix::sys::signal::Signal;

use crate::world::*;
use crate::*;
use fixtures::{poll, QUEUE};

pub(crate) async fn queue_mismatch(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    w.init().await?;
    // The same credentials, naming another queue: the token can read the subscription, so
    // only the receiver's own comparison of the two queues can refuse.
    let other = other_queue_credentials(&w.orbit.credentials_file, OTHER_QUEUE)?;
    let (_, key) = w.cancelled_task().await;
    let id = w.deliveries_of(&key).await[0].clone();
    let mut env = w.env(&w.dsn.clone());
    for (k, v) in &mut env {
        if *k == "ORBIT_CREDENTIALS_FILE" {
            *v = other.display().to_string();
        }
    }
    let mut p = w.spawn("consume", &env);
    // Watched every 200 ms until it exits (20 s at most): any delivery taken meanwhile fails.
    let watched = poll(Duration::from_secs(20), Duration::from_millis(200), || {
        let exited = p.try_wait();
        let (w, id, key) = (&w, &id, &key);
        async move {
            let d = w.delivery(id).await;
            if d.attempts != 0 || !w.inbox(key).await.is_empty() {
                return Some(Err(format!(
                    "R-CLI-3: consume for queue {OTHER_QUEUE} on a subscription of {QUEUE} took its events (delivery {} after {} attempt(s)) instead of refusing to start",
                    d.state, d.attempts
                )));
            }
            exited.map(Ok)
        }
    })
    .await;
    let status = watched.transpose()?;
    ensure!(
        status.is_some_and(|s| !s.success()),
        "R-CLI-3: consume for queue {OTHER_QUEUE} on a subscription of {QUEUE} must refuse to start; it {}",
        status.map_or("was still running after 20 s".into(), |s| format!("exited {s}"))
    );
    Ok(format!(
        "refused ({}), nothing taken",
        status.map(|s| s.to_string()).unwrap_or_default()
    ))
}

/// The queue `queue-mismatch` configures the receiver for.
const OTHER_QUEUE: &str = "kit-other-queue";

/// A copy of the credentials file `from` whose `queue_id` is `queue` (mode 0600, beside it).
fn other_queue_credentials(from: &std::path::Path, queue: &str) -> Result<PathBuf, String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let text = std::fs::read_to_string(from)
        .map_err(|e| format!("the kit cannot read {}: {e}", from.display()))?;
    let mut credentials: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("the kit cannot parse {}: {e}", from.display()))?;
    credentials["queue_id"] = queue.into();
    let to = from.with_file_name(format!("{queue}.credentials.json"));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&to)
        .and_then(|mut f| f.write_all(credentials.to_string().as_bytes()))
        .map_err(|e| format!("the kit cannot write {}: {e}", to.display()))?;
    Ok(to)
}

pub(crate) async fn sigterm(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let mut p = w.running().await?;
    let (_, key) = w.cancelled_task().await;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(30),
        "R-STORE-7",
    )
    .await?;
    for _ in 0..4 {
        fixtures::cancelled_task(&w.client).await;
    }
    let started = Instant::now();
    let _ = p.signal(Signal::SIGTERM);
    let status = p.wait_within(Duration::from_secs(10)).await;
    ensure!(
        status.is_some(),
        "R-CLI-3: consume was still running 10 s after SIGTERM"
    );
    let sub = w
        .client
        .get_subscription(&w.sub)
        .await
        .expect("subscription read");
    ensure!(
        sub.enabled,
        "R-CLI-3: consume paused the shared subscription on SIGTERM"
    );
    // The shell's status says little here: the signal to the group may end it first.
    Ok(format!(
        "every process of the command line ended {:.1} s after SIGTERM; the subscription still enabled",
        started.elapsed().as_secs_f64()
    ))
}

/// How long `sigterm-mid-apply` holds each of the first COMMITs before the server sees it.
const HELD_COMMIT_MS: u64 = 3000;

pub(crate) async fn sigterm_mid_apply(ctx: Ctx) -> Verdict {
    // A lease long enough for an apply budget past the held COMMIT (5 s of 6).
    let mut w = World::start(&ctx, 6).await;
    let proxy = w.behind_proxy().await;
    let mut p = w.running().await?;
    let rule = proxy
        .arm(
            RuleSpec::new(Action::HoldRequest {
                delay_ms: HELD_COMMIT_MS,
            })
            .times(2),
        )
        .expect("the rule arms");
    let mut events = Vec::new();
    for _ in 0..2 {
        let (_, key) = w.cancelled_task().await;
        events.push(key);
    }
    w.or_ended(rule.fired_within(Duration::from_secs(20)))
        .await?
        .ok_or("R-STORE-7: the receiver sent no COMMIT through its DSN within 20 s")?;
    let mut deliveries = Vec::new();
    for key in &events {
        for id in w.deliveries_of(key).await {
            deliveries.push((key.clone(), id));
        }
    }
    // SIGTERM while the COMMIT is held: from now on, any delivery seen ACKed must have its
    // row committed (read after the delivery, so a right receiver's row is always there).
    let signalled = Instant::now();
    let _ = p.signal(Signal::SIGTERM);
    let mut exited = None;
    // Until the held COMMIT has reached the server and a second more has passed with consume
    // gone (an ACK it sent is recorded by then), or 10 s past the hold.
    let settled = Duration::from_millis(HELD_COMMIT_MS + 1000);
    while signalled.elapsed() < Duration::from_millis(10_000 + HELD_COMMIT_MS)
        && !(exited.is_some() && signalled.elapsed() > settled)
    {
        for (key, id) in &deliveries {
            if w.delivery(id).await.state == "ACKED" {
                ensure!(
                    !w.inbox(key).await.is_empty(),
                    "R-STORE-7: delivery {id} (event {key}) was ACKed after SIGTERM while its COMMIT had not reached the server (held by the proxy): on a signal, ACK only what committed, and leave the rest to come back (docs/receiver-contract.md, \"Stopping\")"
                );
            }
        }
        if exited.is_none() {
            if let Some(status) = p.wait_within(Duration::from_millis(50)).await {
                exited = Some((status, signalled.elapsed()));
            }
        }
    }
    let took = exited
        .map(|(_, took)| took)
        .filter(|took| *took <= Duration::from_secs(10))
        .ok_or("R-CLI-3: consume was still running 10 s after SIGTERM")?;
    // What was not committed comes back, and is applied once.
    let _q = w.consume();
    let ids: Vec<_> = deliveries.iter().map(|(_, id)| id.clone()).collect();
    w.acked(
        &ids,
        Duration::from_secs(40),
        "R-STORE-7 (a delivery not ACKed at SIGTERM comes back after its lease and is applied or resolved)",
    )
    .await?;
    let mut attempts = Vec::new();
    for (key, id) in &deliveries {
        let rows = w.inbox(key).await.len();
        ensure!(
            rows == 1,
            "R-STORE-4: event {key} has {rows} inbox rows after SIGTERM and a redelivery"
        );
        attempts.push(w.delivery(id).await.attempts.to_string());
    }
    Ok(format!(
        "SIGTERM while a COMMIT was held: no ACK without its committed row; consume ended in {:.1} s; every delivery ACKed afterwards (attempts {})",
        took.as_secs_f64(),
        attempts.join(", ")
    ))
}

pub(crate) async fn no_secrets(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    let proxy = w.behind_proxy().await;
    // A lost COMMIT reply, a refused event and a refused ACK make the receiver report errors.
    let rule = proxy
        .arm(RuleSpec::new(Action::DropCommitOk).once())
        .expect("the rule arms");
    let mut p = w.running().await?;
    let (_, key) = w.cancelled_task().await;
    let _ = w
        .or_ended(rule.fired_within(Duration::from_secs(20)))
        .await?;
    w.acked(
        &w.deliveries_of(&key).await,
        Duration::from_secs(40),
        "R-STORE-8",
    )
    .await?;
    let _ = w.forge(&key, true, None);
    w.fault(serde_json::json!({"fault": "refuse-next-ack"}));
    let (_, refused_ack) = w.cancelled_task().await;
    w.acked(
        &w.deliveries_of(&refused_ack).await,
        Duration::from_secs(20),
        "R-SDK-2 (a delivery whose ACK was refused comes back after its lease)",
    )
    .await?;
    // A conflict whose results carry markers: the receiver's line for the conflict names the
    // event, never a result, the stored one or the incoming one.
    let marker = |n: u64| format!("kit-result-marker-{:016x}", ctx.seed.rotate_left(7) ^ n);
    let (stored, incoming) = (marker(1), marker(2));
    w.markers.extend([stored.clone(), incoming.clone()]);
    let id = format!("marked-{:016x}", ctx.seed);
    let task = format!("marked-task-{:016x}", ctx.seed);
    let result = |m: &str| format!(r#"{{"note":"{m}","n":1}}"#);
    let original = w
        .event(&id, &task, 1, "task.succeeded")
        .with("result", result(&stored));
    let (key, ids) = w.send(&original);
    w.acked(&ids, Duration::from_secs(20), "R-STORE-7").await?;
    let (_, conflicting) = w.send(&original.with("result", result(&incoming)));
    let tried = w
        .or_ended(poll(
            Duration::from_secs(20),
            Duration::from_millis(200),
            || async {
                let d = w.delivery(&conflicting[0]).await;
                (d.attempts >= 2).then_some(d)
            },
        ))
        .await?;
    ensure!(
        tried.as_ref().is_some_and(|d| d.state != "ACKED"),
        "R-STORE-4: the event with the id of applied event {key} and another result was {} (a conflict is never ACKed)",
        tried.map_or("never tried twice within 20 s".into(), |d| format!(
            "{} at attempt {}",
            d.state, d.attempts
        ))
    );
    let _ = p.signal(Signal::SIGTERM);
    let _ = p.wait_within(Duration::from_secs(10)).await;
    // The errors a start meets: a wrong database password (which must not be printed either)
    // and a subscription the platform does not know.
    let wrong = format!("Wrong-{:016x}-pw", ctx.seed ^ 0x5EC2E7);
    w.extra_secrets.push(wrong.clone());
    let mut env = w.env(&w.dsn.clone());
    for (k, v) in &mut env {
        if *k == "ORBIT_RECEIVER_DSN" {
            *v = v.replacen(w.db().runtime.password.expose(), &wrong, 1);
        }
    }
    let mut bad_password = w.spawn("consume", &env);
    let mut env = w.env(&w.dsn.clone());
    for (k, v) in &mut env {
        if *k == "ORBIT_SUBSCRIPTION_ID" {
            *v = "0123456789abcdef0123456789abcdef".into();
        }
    }
    let mut unknown = w.spawn("consume", &env);
    for proc in [&mut bad_password, &mut unknown] {
        if proc.wait_within(Duration::from_secs(5)).await.is_none() {
            let _ = proc.signal(Signal::SIGTERM);
            let _ = proc.wait_within(Duration::from_secs(10)).await;
        }
    }
    let mut secrets = w.secrets();
    secrets.extend(w.result_bodies().await);
    let proofs = w.proof_hashes().await;
    let mut scanned = 0;
    for log in &w.logs {
        let out = std::fs::read_to_string(log).unwrap_or_default();
        scanned += out.len();
        if let Some(leak) = leak_in(&out, &secrets, &proofs) {
            return Err(format!("{leak} (in its output {})", log.display()));
        }
    }
    Ok(format!(
        "{} bytes of output over {} runs (a lost COMMIT reply, a conflict, a refused ACK, a conflict between two results with markers, a wrong database password and an unknown subscription included): no token, password, lease proof or result body; every other case's output is read the same way",
        scanned,
        w.logs.len()
    ))
}
