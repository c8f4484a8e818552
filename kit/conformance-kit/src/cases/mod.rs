//! The kit's cases, in groups; each returns a [`super::Verdict`] whose error names the rule.

mod corpus;
mod faults;
mod lifecycle;
mod liveness;
mod refusals;
mod schema;
mod store;
mod values;

pub(crate) use corpus::*;
pub(crate) use faults::*;
pub(crate) use lifecycle::*;
pub(crate) use liveness::*;
pub(crate) use refusals::*;
pub(crate) use schema::*;
pub(crate) use store::*;
pub(crate) use values::*;
