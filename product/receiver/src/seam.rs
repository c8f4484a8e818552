//! The program's one seam for test builds: the only place in this crate where the feature
//! `seams` appears. Without the feature [`reach`] is an empty function and nothing of this
//! module is left in the build. With it, a test build (`test-tools/receiver-test-builds`, never
//! a release) may install, once per process, a hook that `consume` awaits at each [`Point`] of
//! a delivery's flow outside the Apply transaction (the core's seam has the points inside it,
//! the SDK's the stream's). The `receiver` binary has no barrier, flag or variable.

/// A point of one delivery's flow, outside the Apply transaction, where a test build may stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// After the apply answered (COMMIT confirmed, or a duplicate or stale verdict), before
    /// the handler returns and the SDK ACKs.
    AfterCommit,
}

/// Passes `point` for `key` (an event id); in a test build with a hook installed, waits for
/// it.
pub(crate) async fn reach(point: Point, key: &str) {
    #[cfg(feature = "seams")]
    if let Some(hook) = installed::HOOK.get() {
        hook(point, key.to_owned()).await;
    }
    #[cfg(not(feature = "seams"))]
    let _ = (point, key);
}

#[cfg(feature = "seams")]
pub use installed::*;

#[cfg(feature = "seams")]
mod installed {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::OnceLock;

    use super::Point;

    /// What the hook returns.
    pub type HookFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

    /// The hook: called with the point and the event id; the delivery waits for its future.
    pub type Hook = Box<dyn Fn(Point, String) -> HookFuture + Send + Sync>;

    pub(super) static HOOK: OnceLock<Hook> = OnceLock::new();

    /// Installs the hook for this process; a second install is refused.
    pub fn install_hook(hook: Hook) -> Result<(), &'static str> {
        HOOK.set(hook)
            .map_err(|_| "a barrier hook is already installed")
    }
}
