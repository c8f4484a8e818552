//! The `receiver` program's test builds, never released: `receiver-faults` (fault barriers at
//! named points of a delivery's flow, for the fault regressions) and `receiver-mutant` (one
//! rule broken on purpose, for the conformance kit's proof that it notices). Each is the
//! program itself ([`receiver::program`]) with what this crate installs through the product's
//! seams: the core's (`result_inbox::seam`), the program's (`receiver::seam`) and the SDK's
//! (`orbit_sdk::seam`). The names of the barriers and mutants are `seam_names`'.
//!
//! Built by `make fault-build` and `make mutant-build` (`cargo build -p receiver-test-builds`),
//! never by a build of the workspace's programs, so the seams' feature never reaches the
//! `receiver` binary.

pub mod barriers;
pub mod frames;
pub mod mutants;
pub mod store_mutants;
