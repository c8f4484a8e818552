//! Waiting for a condition that a real process or server makes true, with a bound and a
//! message.

/// Waits up to `timeout` for `check` to hold, polling every 50 ms; panics naming `what`.
pub async fn eventually<F, Fut>(timeout: std::time::Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "waited {timeout:?} for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
