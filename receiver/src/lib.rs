//! The result inbox: turn a delivered task event into one committed transaction in the
//! receiver's own MySQL database, so that the SDK may ACK it.
//!
//! The flow runs one way, through these modules:
//! [`canonical`] (strict JSON → canonical bytes + SHA-256) → [`event`] (a validated
//! [`event::TaskEvent`]) → [`store`] (the Apply transaction: inbox row + task view, one READ
//! COMMITTED transaction) → an [`store::Outcome`] the caller may ACK, or an
//! [`store::ApplyError`] it must not. [`schema`] creates the two tables once; [`config`] reads
//! the environment.
//!
//! What this crate must never do: ACK anything (it does not know the platform), connect to the
//! platform's database, print a result body, a password or a lease proof, or treat a COMMIT
//! without an answer as a success.

pub mod canonical;
pub mod config;
pub mod consume;
pub mod delivery;
pub mod demo;
pub mod event;
#[cfg(feature = "fault-barriers")]
pub mod fault;
pub mod identity;
pub mod inspect;
pub mod schema;
pub mod store;
mod timestamp;

pub use canonical::{canonicalize, Digest};
pub use event::{Rejection, TaskEvent, TaskState};
pub use identity::{ConsumerName, EventId, QueueId, TaskId};
pub use store::{ApplyError, BusinessWrite, Outcome, Store, StoreOptions};
