//! Cases on what a receiver must refuse or resend: an event it cannot accept, a configuration
//! it cannot run with, and an ACK whose answer was lost.

use std::time::Duration;

use crate::world::*;
use crate::*;
use fixtures::{poll, QUEUE};

/// The budget and lease of `refused-event`: the poison delivery is EXPIRED within seconds.
const POISON_BUDGET: u32 = 2;

pub(crate) async fn refused_event(ctx: Ctx) -> Verdict {
    let mut w = World::start_with(&ctx, 2, POISON_BUDGET).await;
    let p = w.running().await?;
    // A result the canonical form refuses (a member named twice), past the platform's own
    // check of results, as a platform that does not validate them would send it.
    let task = w
        .client
        .submit_task(QUEUE, None)
        .await
        .expect("task submitted");
    let body =
        serde_json::value::RawValue::from_string(r#"{"n":1,"n":2}"#.into()).expect("raw JSON");
    w.fault(serde_json::json!({"fault": "skip-next-result-check"}));
    w.client
        .report_task(&task.id, "SUCCEEDED", Some(&body))
        .await
        .expect("result reported");
    let key = w.wait_event_of(&task.id, "task.succeeded").await;
    let ids = w.deliveries_of(&key).await;
    // A good event after it: the receiver is alive and taking deliveries.
    w.cancelled_and_acked("R-STORE-7").await?;
    // Every attempt of the poison delivery refused: EXPIRED once its budget is spent.
    let d = w.settled(&ids[0], Duration::from_secs(30)).await;
    ensure!(
        d.state != "LEASED" && d.state != "PENDING",
        "R-CANON-3: the delivery of event {key} (a result with a member named twice) is still {} after {} attempt(s) of a budget of {POISON_BUDGET}, 30 s after it was made",
        d.state,
        d.attempts
    );
    ensure!(
        d.state == "EXPIRED",
        "R-CANON-3: event {key} carries a result with a member named twice, which the canonical form refuses; its delivery was {} at attempt {} instead of refused until its budget ran out (docs/receiver-contract.md, \"A delivery you refuse\")",
        d.state,
        d.attempts
    );
    let rows = w.inbox(&key).await;
    ensure!(
        rows.is_empty(),
        "R-STORE-1: event {key} was refused, yet the inbox holds {} row(s) of it",
        rows.len()
    );
    // Where an operator looks: the receiver's own output names the event it refuses.
    let out = p.output();
    ensure!(
        out.contains(&key),
        "R-CLI-4: the receiver refused event {key} without naming it in its output (an operator must be able to find what never applies; docs/receiver-contract.md, \"The output the kit reads\"): {}",
        last_lines(&w, &out)
    );
    Ok(format!(
        "event {key} refused at each of its {} attempts, EXPIRED, no inbox row, named in the output",
        d.attempts
    ))
}

pub(crate) async fn lost_ack_reply(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, 5).await;
    let _p = w.running().await?;
    // The next ACK is recorded and its answer never sent: the stream closes instead.
    w.fault(serde_json::json!({"fault": "drop-next-ack-reply"}));
    let (_, key) = w.cancelled_task().await;
    let ids = w.deliveries_of(&key).await;
    w.acked(&ids, Duration::from_secs(20), "R-SDK-2").await?;
    // The receiver cannot know that its ACK landed: it must send it again, with the same
    // proof, once it has reconnected; the platform then answers already_acked.
    let again = w
        .or_ended(poll(
            Duration::from_secs(15),
            Duration::from_millis(200),
            || async {
                (w.orbit
                    .metric("orbit_acks_total{result=\"already_acked\"}")
                    .unwrap_or(0)
                    > 0)
                .then_some(())
            },
        ))
        .await?;
    let d = w.delivery(&ids[0]).await;
    ensure!(
        again.is_some(),
        "R-SDK-2: the ACK of delivery {} (event {key}) was recorded but its answer lost; the receiver never sent it again with the same proof (no already_acked answer within 15 s; {} refused)",
        d.id,
        w.orbit.metric("orbit_acks_total{result=\"refused\"}").unwrap_or(0)
    );
    ensure!(
        d.attempts == 1,
        "R-SDK-2: delivery {} was leased {} times: its first ACK had landed",
        d.id,
        d.attempts
    );
    let rows = w.inbox(&key).await;
    ensure!(
        rows.len() == 1,
        "R-STORE-4: event {key} has {} inbox rows",
        rows.len()
    );
    Ok("the ACK sent again with the same proof after its answer was lost: already_acked, one attempt".into())
}

/// Each bad value, the variable it is in: consume must exit non-zero with a line naming the
/// variable, and take nothing.
pub(crate) async fn config_errors(ctx: Ctx) -> Verdict {
    let mut w = World::start(&ctx, SHORT_LEASE).await;
    w.init().await?;
    let (_, key) = w.cancelled_task().await;
    let id = w.deliveries_of(&key).await[0].clone();
    let dsn = w.dsn.expose().to_owned();
    let without_database = dsn
        .rsplit_once('/')
        .map(|(head, _)| head.to_owned())
        .expect("a DSN with a database");
    let bad = [
        ("RECEIVER_NAME", "bad name!".to_owned()),
        ("RECEIVER_NAME", "x".repeat(65)),
        ("ORBIT_RECEIVER_DSN", without_database),
        ("ORBIT_SUBSCRIPTION_ID", String::new()),
    ];
    let mut seen = Vec::new();
    for (var, value) in bad {
        let mut env = w.env(&w.dsn.clone());
        env.retain(|(k, _)| *k != var);
        if !value.is_empty() {
            env.push((var, value.clone()));
        }
        let shown = if var == "ORBIT_RECEIVER_DSN" {
            "a DSN without a database".to_owned()
        } else if value.is_empty() {
            "unset".to_owned()
        } else {
            format!("{value:?}")
        };
        let mut p = w.spawn("consume", &env);
        let status = p.wait_within(Duration::from_secs(10)).await;
        let out = p.output();
        if status.is_none() {
            p.signal(nix::sys::signal::Signal::SIGKILL).ok();
        }
        ensure!(
            status.is_some_and(|s| !s.success()),
            "R-CLI-5: consume with {var} {shown} must exit non-zero at once; it {}",
            status.map_or("was still running after 10 s".into(), |s| format!(
                "exited {s}"
            ))
        );
        ensure!(
            out.lines().any(|l| l.contains(var)),
            "R-CLI-5: consume with {var} {shown} exited without a line naming {var} (docs/receiver-contract.md, \"The output the kit reads\"): {}",
            last_lines(&w, &out)
        );
        seen.push(format!("{var} {shown}"));
    }
    let d = w.delivery(&id).await;
    ensure!(
        d.attempts == 0,
        "R-CLI-5: a consume that refused its configuration leased delivery {} ({} attempt(s))",
        d.id,
        d.attempts
    );
    Ok(format!(
        "refused, each naming its variable: {}",
        seen.join("; ")
    ))
}

pub(crate) async fn foreign_events(ctx: Ctx) -> Verdict {
    let mut w = World::start_with(&ctx, 2, POISON_BUDGET).await;
    let _p = w.running().await?;
    let (task, key) = w.cancelled_and_acked("R-STORE-7").await?;
    let before = w.view(&task).await;
    let next = before.as_ref().map_or(1, |v| v.version + 1);
    // Delivered on this subscription, but naming another queue, or a type no receiver knows;
    // otherwise good events, a version above the view's (only the queue or the type is wrong).
    let forged = [
        (
            "another queue",
            serde_json::json!({"task_version": next, "queue_id": "kit-other-queue"}),
        ),
        (
            "an unknown type",
            serde_json::json!({"task_version": next, "type": "task.exploded"}),
        ),
    ];
    let made: Vec<_> = forged
        .into_iter()
        .map(|(what, changes)| {
            let (id, deliveries) = w.forge_with(&key, changes);
            (what, id, deliveries)
        })
        .collect();
    for (what, id, deliveries) in &made {
        let d = w.settled(&deliveries[0], Duration::from_secs(30)).await;
        ensure!(
            d.state == "EXPIRED",
            "R-CANON-1: event {id}, which names {what}, must be refused at every attempt; its delivery was {} at attempt {}",
            d.state,
            d.attempts
        );
        let rows = w.inbox(id).await;
        ensure!(
            rows.is_empty(),
            "R-CANON-1: event {id}, which names {what}, was refused yet has {} inbox row(s)",
            rows.len()
        );
    }
    let after = w.view(&task).await;
    ensure!(
        after == before,
        "R-CANON-1: refused events changed task {task}'s view: {before:?} became {after:?}"
    );
    Ok("an event naming another queue and one of an unknown type: each refused until EXPIRED, no inbox row, the view unchanged".into())
}

/// One event for each refusal of the event around the form that the platform can carry
/// (docs/canonical-json.md, "The event around the form"; a missing or foreign namespace or
/// queue, or an unknown type, is never delivered to the subscription, and `foreign-events`
/// covers the last two), and three the form itself refuses. Each built from a good event by
/// one change.
fn malformed(w: &World) -> Vec<(&'static str, Body)> {
    let good = |n: usize| {
        w.event(
            &format!("malformed-{n}"),
            &format!("malformed-task-{n}"),
            1,
            "task.started",
        )
    };
    let long = "x".repeat(129);
    vec![
        ("no id", good(0).without("id")),
        ("an id that is a number", good(1).with("id", "7")),
        ("an id of 129 bytes", good(2).with_text("id", &long)),
        (
            "an id with a control character",
            good(3).with_text("id", "malformed-\u{1}3"),
        ),
        (
            "a task id with a control character",
            good(5).with_text("task_id", "task\u{7f}5"),
        ),
        ("no occurred_at", good(6).without("occurred_at")),
        ("no task_version", good(7).without("task_version")),
        ("task_version 1.0", good(8).with("task_version", "1.0")),
        ("task_version 1e0", good(9).with("task_version", "1e0")),
        ("task_version 2E+1", good(10).with("task_version", "2E+1")),
        ("task_version -1", good(11).with("task_version", "-1")),
        ("task_version 0", good(12).with("task_version", "0")),
        (
            "task_version 2^64",
            good(13).with("task_version", "18446744073709551616"),
        ),
        (
            "task_version as a string",
            good(14).with("task_version", "\"1\""),
        ),
        ("no state", good(15).without("state")),
        ("a state that is a number", good(16).with("state", "5")),
        (
            "a state its type does not allow",
            good(17).with_text("state", "SUCCEEDED"),
        ),
        (
            "a result on a state that allows none",
            good(18).with("result", r#"{"n":1}"#),
        ),
        (
            "an occurred_at that is no timestamp",
            good(19).with_text("occurred_at", "yesterday"),
        ),
        (
            "a lone surrogate in a string",
            good(20).with("id", r#""malformed-\ud800""#),
        ),
        (
            "a member named twice",
            good(21).with("state", r#""RUNNING","state":"RUNNING""#),
        ),
    ]
}

pub(crate) async fn malformed_events(ctx: Ctx) -> Verdict {
    let mut w = World::start_with(&ctx, 2, POISON_BUDGET).await;
    let p = w.running().await?;
    let sent: Vec<(&str, String, Vec<orbit_sdk::DeliveryId>)> = malformed(&w)
        .into_iter()
        .map(|(what, body)| {
            let (_, ids) = w.send(&body);
            let id = body_id(&body);
            (what, id, ids)
        })
        .collect();
    // A good event after them: the receiver is alive and taking deliveries.
    w.cancelled_and_acked("R-STORE-7").await?;
    let mut expired = 0;
    for (what, id, ids) in &sent {
        ensure!(
            !ids.is_empty(),
            "{}: the platform delivered no copy of the event with {what}",
            crate::report::NOT_RUN
        );
        let d = w.settled(&ids[0], Duration::from_secs(30)).await;
        ensure!(
            d.state == "EXPIRED",
            "R-CANON-3: the event with {what} (id {id:?}) was {} after {} attempt(s) of a budget of {POISON_BUDGET}; it must be refused at every attempt and never ACKed (docs/canonical-json.md, \"The event around the form\"; docs/receiver-contract.md, \"A delivery you refuse\")",
            d.state,
            d.attempts
        );
        expired += 1;
    }
    let mut recorded = Vec::new();
    for (what, id, _) in &sent {
        if !id.is_empty() && !w.inbox(id).await.is_empty() {
            recorded.push(*what);
        }
    }
    ensure!(
        recorded.is_empty(),
        "R-STORE-1: refused events were recorded in the inbox: the ones with {}",
        recorded.join(", ")
    );
    // Where an operator looks: the output names each refused event whose id is printable.
    let out = p.output();
    let unnamed: Vec<&str> = sent
        .iter()
        .filter(|(_, id, _)| {
            id.len() <= 128 && id.starts_with("malformed-") && !id.chars().any(char::is_control)
        })
        .filter(|(_, id, _)| !out.contains(id.as_str()))
        .map(|(what, _, _)| *what)
        .collect();
    ensure!(
        unnamed.is_empty(),
        "R-CLI-4: the receiver refused events without naming their ids in its output (an operator must find what never applies): the ones with {}",
        unnamed.join(", ")
    );
    Ok(format!(
        "{expired} malformed events (versions 1.0, 1e0, 2E+1, -1, 0, 2^64 and \"1\" among them): each refused until EXPIRED, none recorded, each printable id named"
    ))
}

/// The id a body's `id` member holds when it is a string; empty otherwise.
fn body_id(body: &Body) -> String {
    body.member("id")
        .and_then(|raw| serde_json::from_str::<String>(raw).ok())
        .unwrap_or_default()
}
