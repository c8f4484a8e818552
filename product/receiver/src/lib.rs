//! The receiver program: `init`, `demo`, `consume` and the operator tools, built on the
//! [`result_inbox`] core (canonical form, events, the Apply transaction, schema) and the Orbit
//! SDK (deliveries, ACKs).
//!
//! The flow runs one way: the SDK hands a delivery's bytes to [`delivery`], which validates
//! them and calls the core's `Store::apply`; the classification it returns decides whether
//! the SDK may ACK; under load [`group`] gathers ready deliveries into one transaction, each
//! keeping its own answer and ACK. [`config`] reads the environment, once, for every command; [`consume`] and
//! [`demo`] wire the SDK to the store; [`inspect`] reads, never writes; [`prune`] deletes old
//! inbox rows, as an account of its own.
//!
//! What this crate must never do: ACK an event whose transaction did not commit, print a
//! token, a password, a result body or a lease proof, or read the environment outside
//! [`config`].

pub mod cli;
pub mod config;
pub mod consume;
pub mod delivery;
pub mod demo;
pub mod group;
pub mod inspect;
pub mod metrics;
pub mod outage;
pub mod program;
pub mod progress;
pub mod prune;
pub mod reconcile;
pub mod seam;
