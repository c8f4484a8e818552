//! The kit's cases, in groups; each returns a [`super::Verdict`] whose error names the rule.

mod faults;
mod lifecycle;
mod schema;
mod store;

pub(crate) use faults::*;
pub(crate) use lifecycle::*;
pub(crate) use schema::*;
pub(crate) use store::*;
