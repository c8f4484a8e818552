//! The Orbit consumer SDK: the wire contract (re-exported from `orbit-wire`), an HTTP [`Client`] for tasks, subscriptions, deliveries
//! and budgets, [`Credentials`], and the [`EventConsumer`] that receives deliveries over a
//! WebSocket stream and ACKs each one with its lease proof only after the handler succeeded.
//!
//! It sits at the left of the flow, before the receiver, and must never depend on a database
//! driver (`cargo tree -p orbit-sdk` shows no sqlx or mysql): the SDK knows no SQL. It never
//! prints a token or a lease proof. The contract it speaks is `docs/orbit-protocol.md`.

pub mod client;
pub mod consumer;
mod link;
pub mod seam;
pub mod trust;

/// The protocol's contract, from the crate both sides share.
pub use orbit_wire as wire;
pub use orbit_wire::credentials;

pub use client::{Client, DeliveryFilter, SdkError, TransportError};
pub use consumer::{
    ConsumerEvent, CreditGate, Delivery, EventConsumer, HandlerError, Release, Running, Summary,
};
pub use credentials::{Credentials, CredentialsError, Token};
pub use link::{StreamError, MAX_MESSAGE_BYTES};
pub use orbit_wire::{DeliveryId, SubscriptionId};
pub use trust::{Trust, TrustError};
pub use wire::AckResult;
