//! The result inbox core: turn a delivered task event into one committed transaction in the
//! receiver's own MySQL database, so that whoever delivered it may ACK it.
//!
//! The flow runs one way, through these modules:
//! [`canonical`] (strict JSON → canonical bytes + SHA-256) → [`event`] (a validated
//! [`event::TaskEvent`]) → [`store`] (the Apply transaction: inbox row + task view, one READ
//! COMMITTED transaction, plus any [`BusinessWrite`] of the caller's) → an [`Outcome`] the
//! caller may ACK, or an [`ApplyError`] ([`error`]) it must not. [`schema`] creates the two
//! tables once; [`dsn`] checks the database's address before anything connects.
//!
//! This crate is what a service embeds to keep its own inbox (see `examples/embed.rs`). It
//! knows no platform: no SDK, HTTP or WebSocket crate is in its dependency tree (`make check`
//! asserts it), and it reads no environment variable.
//!
//! What this crate must never do: ACK anything, connect to the platform's database, print a
//! result body or a password, or treat a COMMIT without an answer as a success.

pub use canonical_form as canonical;
pub mod connect;
pub mod ddl;
pub mod dsn;
pub mod durability;
pub mod error;
pub mod event;
pub mod group;
pub mod identity;
pub mod ledger;
pub mod migrate;
pub mod outcome;
mod pool;
pub mod prune;
pub mod schema;
pub mod seam;
pub mod statements;
pub mod store;
pub mod version;
mod work;

pub use canonical::{canonicalize, Digest};
pub use dsn::{Dsn, DsnError};
pub use error::{ApplyError, Conflict, StorageError, StorageKind};
pub use event::{Rejected, Rejection, TaskEvent, TaskState};
pub use group::{Fallback, GroupApplied, Member, GROUP_MAX_BYTES, GROUP_MAX_EVENTS};
pub use identity::{ConsumerName, EventId, QueueId, TaskId};
pub use outcome::Outcome;
pub use store::{
    Applied, BusinessWrite, HealthProbe, Receipt, Retries, RetryReason, Store, StoreOptions,
    WriteFuture, APPLY_TIMEOUT,
};
