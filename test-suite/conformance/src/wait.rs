//! Waiting for a condition that a real process or server makes true: every wait of the suites
//! and the kit goes through [`poll`] (or [`poll_blocking`] off the runtime), with a bound, and
//! says what it waited for when the bound is reached.

use std::future::Future;
use std::time::{Duration, Instant};

/// Looks with `check` every `every` until it finds something (`Some`), for at most `within`
/// (one last look is made at the end); what it found, or `None` once the time is up. A check
/// that must stop the wait early with a failure returns `Some(Err(…))`.
pub async fn poll<T, Fut>(
    within: Duration,
    every: Duration,
    mut check: impl FnMut() -> Fut,
) -> Option<T>
where
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return Some(found);
        }
        if Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// [`poll`] for a caller outside the async runtime: the thread sleeps between looks.
pub fn poll_blocking<T>(
    within: Duration,
    every: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Option<T> {
    let end = Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Waits up to `timeout` for `check` to hold, looking every 50 ms; panics naming `what`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let held = poll(timeout, Duration::from_millis(50), || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await;
    assert!(held.is_some(), "waited {timeout:?} for {what}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_poll_returns_what_it_found_or_none_after_its_bound() {
        let mut looks = 0;
        let found = poll(Duration::from_secs(5), Duration::from_millis(1), || {
            looks += 1;
            let n = looks;
            async move { (n == 3).then_some(n) }
        })
        .await;
        assert_eq!(found, Some(3));
        let started = Instant::now();
        let none: Option<()> = poll(
            Duration::from_millis(50),
            Duration::from_millis(5),
            || async { None },
        )
        .await;
        assert_eq!(none, None);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn a_blocking_poll_stops_at_the_first_find() {
        let mut n = 0;
        let found = poll_blocking(Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            (n == 2).then_some("two")
        });
        assert_eq!((found, n), (Some("two"), 2));
    }
}
