//! Test builds only (feature `fault-hooks`): a hook the store awaits at named points inside
//! the Apply transaction, so that a fault test can stop a real process there and kill it. No
//! build of the `receiver` program turns the feature on; without it this module, and every
//! call to it, does not exist.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The points inside the transaction where the store awaits the hook, in flow order:
/// `before_insert` (after `BEGIN`, before the inbox `INSERT`), `before_verdict` (after the
/// inbox `INSERT` met the dedup key, before the committed record's verdict is read) and
/// `before_commit` (after every write, before `COMMIT`).
pub const POINTS: &[&str] = &["before_insert", "before_verdict", "before_commit"];

/// Awaited with the point's name and the event id; the apply does nothing else until it
/// returns. The apply's time budget keeps running meanwhile.
#[derive(Clone)]
pub struct BarrierHook(pub Arc<dyn Fn(&'static str, String) -> HookFuture + Send + Sync>);

/// What a [`BarrierHook`] returns.
pub type HookFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

impl fmt::Debug for BarrierHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BarrierHook")
    }
}
