//! Lost COMMIT replies (R-STORE-8, R-FAULT-3): a real proxy between the real `Store` and a real
//! server drops the server's real OK to COMMIT, or the COMMIT itself, or answers it with an
//! error; the store must tell an unknown outcome from a definite one, and a re-apply must
//! resolve it by identity.

use std::time::Duration;

use commit_proxy::{Action, On, RuleSpec};
use fixtures::{EventSpec, ReceiverDb};
use result_inbox::StorageKind;
use result_inbox::{ApplyError, Outcome, TaskId};

/// A receiver database, a proxy in front of its server, a store connected through the proxy,
/// and a `task.cancelled` event to apply.
async fn behind_proxy(
    event: &str,
    task: &str,
) -> (
    ReceiverDb,
    commit_proxy::Proxy,
    result_inbox::Store,
    result_inbox::TaskEvent,
) {
    let rdb = ReceiverDb::new().await;
    let proxy = rdb.proxy().await;
    let proxied = rdb.store_via(proxy.local_addr()).await;
    let event = EventSpec::cancelled(event, task, 1).event();
    (rdb, proxy, proxied, event)
}

fn task(id: &str) -> TaskId {
    TaskId::new(id).unwrap()
}

#[tokio::test]
async fn a_dropped_commit_ok_is_unconfirmed_then_resolved_as_a_duplicate() {
    let (rdb, proxy, proxied, event) = behind_proxy("evt-lost", "task-lost").await;

    let rule = proxy
        .arm(RuleSpec::new(Action::DropCommitOk).once())
        .unwrap();
    match proxied.apply(&event).await {
        Err(e @ ApplyError::CommitUnconfirmed) => {
            assert_eq!(e.kind(), "commit_unconfirmed");
            assert!(e.is_retryable());
        }
        other => panic!("wanted commit_unconfirmed, got {other:?}"),
    }

    // Ground truth from the proxy: the server answered OK and ended the transaction.
    let fired = rule
        .fired_within(Duration::from_secs(5))
        .await
        .expect("the rule fired");
    assert_eq!(fired.reply, "ok");
    assert_eq!(fired.statement, "commit");
    assert!(fired.in_transaction_before);
    assert_eq!(fired.in_transaction_after, Some(false));
    assert!(fired.server_thread_id > 0);

    // Another connection, not through the proxy, sees it all committed.
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_inbox WHERE applied = 1")
            .await,
        1
    );
    assert_eq!(
        rdb.scalar("SELECT CAST(SUM(applied_events) AS SIGNED) FROM receiver_task_views")
            .await,
        1
    );

    // A new Store with the same identity finds the duplicate and updates nothing twice.
    let fresh = rdb.store().await;
    assert_eq!(
        fresh.apply(&event).await.unwrap(),
        Outcome::Duplicate { applied: true }
    );
    let view = fresh.view(&task("task-lost")).await.unwrap().unwrap();
    assert_eq!(view.applied_events, 1);
    let info = rule.info().unwrap();
    assert_eq!((info.hits, info.fired, info.remaining), (1, 1, Some(0)));
}

#[tokio::test]
async fn a_swallowed_commit_is_unconfirmed_and_the_reapply_applies_once() {
    let (rdb, proxy, proxied, event) = behind_proxy("evt-swallowed", "task-swallowed").await;

    let rule = proxy
        .arm(RuleSpec::new(Action::DropCommitRequest).once())
        .unwrap();
    assert!(matches!(
        proxied.apply(&event).await,
        Err(ApplyError::CommitUnconfirmed)
    ));
    let fired = rule.fired_within(Duration::from_secs(5)).await.unwrap();
    assert_eq!(fired.reply, "none", "the server never saw the COMMIT");

    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 0);
    assert_eq!(
        rdb.scalar("SELECT COUNT(*) FROM receiver_task_views").await,
        0
    );

    // The re-apply goes through the inbox INSERT, which waits while the server still holds
    // the abandoned transaction, then applies it once.
    let fresh = rdb.store().await;
    assert_eq!(fresh.apply(&event).await.unwrap(), Outcome::Applied);
    assert_eq!(
        fresh.apply(&event).await.unwrap(),
        Outcome::Duplicate { applied: true }
    );
    let view = fresh.view(&task("task-swallowed")).await.unwrap().unwrap();
    assert_eq!(view.applied_events, 1);
}

fn injected(number: u16) -> Action {
    Action::Error {
        number,
        sqlstate: None,
        message: None,
    }
}

/// Galera reports a certification failure as 1213 in reply to COMMIT: a definite rollback,
/// which the apply restarts itself instead of handing it to the platform.
#[tokio::test]
async fn an_error_reply_to_commit_armed_twice_is_retried_inside_the_apply() {
    let (rdb, proxy, proxied, event) = behind_proxy("evt-deadlock", "task-deadlock").await;
    let rule = proxy.arm(RuleSpec::new(injected(1213)).times(2)).unwrap();
    let applied = proxied
        .apply_until(&event, &result_inbox::store::NoWrite, None)
        .await;
    assert_eq!(applied.result.unwrap(), Outcome::Applied);
    assert_eq!(applied.retries, 2);
    // Counted as certification failures (1213 in reply to COMMIT), not as deadlocks.
    let reasons = applied.reasons;
    assert_eq!(
        reasons.count(result_inbox::RetryReason::Certification),
        2,
        "{reasons:?}"
    );
    assert_eq!(rule.firings().len(), 2);
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 1);
    assert_eq!(
        rdb.scalar("SELECT CAST(SUM(applied_events) AS SIGNED) FROM receiver_task_views")
            .await,
        1
    );
}

#[tokio::test]
async fn an_error_reply_to_every_commit_is_a_definite_retryable_failure_once_the_budget_is_spent() {
    let (rdb, proxy, _, event) = behind_proxy("evt-deadlock2", "task-deadlock2").await;
    let proxied = rdb
        .store_via_with(proxy.local_addr(), Duration::from_millis(800))
        .await;
    let rule = proxy.arm(RuleSpec::new(injected(1213))).unwrap();
    let applied = proxied
        .apply_until(&event, &result_inbox::store::NoWrite, None)
        .await;
    match applied.result {
        Err(ApplyError::Storage(e)) => {
            assert_eq!(e.kind(), StorageKind::Deadlock);
            assert_eq!(e.number(), Some(1213));
            assert!(e.is_retryable());
        }
        other => panic!("wanted a definite deadlock error, got {other:?}"),
    }
    assert!(applied.retries >= 2, "retried {} times", applied.retries);
    assert_eq!(rule.firings().len() as u32, applied.retries + 1);
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 0);

    // Disarmed, the same store applies the event on the next try.
    proxy.disarm(rule.id());
    assert_eq!(proxied.apply(&event).await.unwrap(), Outcome::Applied);
}

/// The server commits; its answer comes after the budget: unknown, never a success.
#[tokio::test]
async fn a_commit_reply_delayed_past_the_budget_is_unconfirmed() {
    let (rdb, proxy, _, event) = behind_proxy("evt-slow-ok", "task-slow-ok").await;
    let proxied = rdb
        .store_via_with(proxy.local_addr(), Duration::from_millis(600))
        .await;
    let rule = proxy
        .arm(RuleSpec::new(Action::Delay { delay_ms: 2_000 }).once())
        .unwrap();
    let applied = proxied
        .apply_until(&event, &result_inbox::store::NoWrite, None)
        .await;
    assert!(
        matches!(applied.result, Err(ApplyError::CommitUnconfirmed)),
        "{:?}",
        applied.result
    );
    assert_eq!(applied.retries, 0, "an unknown COMMIT is never retried");
    rule.fired_within(Duration::from_secs(5)).await.unwrap();
    // It did commit; the re-apply says so by identity.
    let fresh = rdb.store().await;
    assert_eq!(
        fresh.apply(&event).await.unwrap(),
        Outcome::Duplicate { applied: true }
    );
}

/// A connection that breaks before COMMIT was sent cannot have committed anything: a
/// retryable unavailable error, restarted inside the apply, never `CommitUnconfirmed`.
#[tokio::test]
async fn a_connection_dropped_before_commit_is_retryable_and_never_unconfirmed() {
    let (rdb, proxy, _, event) = behind_proxy("evt-cut", "task-cut").await;
    let proxied = rdb
        .store_via_with(proxy.local_addr(), Duration::from_millis(800))
        .await;
    let cut_insert = || {
        let mut spec = RuleSpec::new(Action::Reset).on(On::Any);
        spec.contains = Some("INSERT INTO receiver_inbox".to_owned());
        spec
    };

    // Once: the apply retries on a new connection and applies.
    let once = proxy.arm(cut_insert().once()).unwrap();
    let applied = proxied
        .apply_until(&event, &result_inbox::store::NoWrite, None)
        .await;
    assert_eq!(applied.result.unwrap(), Outcome::Applied);
    assert_eq!(applied.retries, 1);
    assert_eq!(once.firings().len(), 1);

    // Every time: what reaches the caller is a retryable unavailable error, or, when the
    // budget runs out while a new connection is still being made (slower through a
    // container's published port), the budget's timeout; never an unconfirmed commit.
    let other = EventSpec::cancelled("evt-cut2", "task-cut2", 1).event();
    let always = proxy.arm(cut_insert()).unwrap();
    let applied = proxied
        .apply_until(&other, &result_inbox::store::NoWrite, None)
        .await;
    match applied.result {
        Err(ApplyError::Storage(e)) => {
            assert_eq!(e.kind(), StorageKind::Unavailable);
            assert!(e.is_retryable());
        }
        Err(ApplyError::Timeout(budget)) => assert_eq!(budget, Duration::from_millis(800)),
        other => {
            panic!("wanted a retryable unavailable error or the budget's timeout, got {other:?}")
        }
    }
    assert!(applied.retries >= 1);
    proxy.disarm(always.id());
    assert_eq!(rdb.scalar("SELECT COUNT(*) FROM receiver_inbox").await, 1);
}

#[tokio::test]
async fn a_reset_at_commit_is_unconfirmed_and_commits_nothing() {
    let (rdb, proxy, proxied, event) = behind_proxy("evt-reset", "task-reset").await;
    proxy.arm(RuleSpec::new(Action::Reset).once()).unwrap();
    assert!(matches!(
        proxied.apply(&event).await,
        Err(ApplyError::CommitUnconfirmed)
    ));
    let fresh = rdb.store().await;
    assert_eq!(fresh.apply(&event).await.unwrap(), Outcome::Applied);
}
