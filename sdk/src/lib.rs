//! The Orbit consumer SDK: wire types, an HTTP client for tasks, subscriptions, deliveries and
//! budgets, and the `EventConsumer` that receives deliveries over a WebSocket stream and ACKs
//! each one with its lease proof only after the handler succeeded.
//!
//! It sits at the left of the flow, before the receiver, and must never depend on a database
//! driver (`cargo tree -p orbit-sdk` shows no sqlx or mysql): the SDK knows no SQL.
//!
//! The crate is only the workspace member so far; the contract and the client are built with
//! the Orbit platform (see `docs/architecture.md`, "where to change what").
