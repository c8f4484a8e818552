//! Test builds only (feature `mutants`, binary `receiver-mutant`): the receiver with one rule
//! broken, chosen by `RECEIVER_MUTANT` (`result_inbox::mutants`), so that the conformance kit
//! can prove each of its cases can fail. Built by `make mutant-build`, never released.

use std::sync::OnceLock;

pub use result_inbox::mutants::Mutant;

/// The mutant `RECEIVER_MUTANT` names; unset means none. A bad value is fatal: a kit run
/// against a misspelt mutant would prove nothing.
pub fn active() -> Option<Mutant> {
    static ACTIVE: OnceLock<Option<Mutant>> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        #[allow(clippy::disallowed_methods)] // a test build's own switch, not configuration
        let name = std::env::var("RECEIVER_MUTANT").unwrap_or_default();
        if name.is_empty() {
            return None;
        }
        match Mutant::parse(&name) {
            Some(m) => {
                eprintln!("receiver-mutant: breaking one rule on purpose: {m}");
                Some(m)
            }
            None => {
                let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
                eprintln!(
                    "receiver-mutant: RECEIVER_MUTANT={name:?} is not one of {}",
                    names.join(", ")
                );
                std::process::exit(2);
            }
        }
    })
}

/// Whether `m` is the active mutant.
pub fn is(m: Mutant) -> bool {
    active() == Some(m)
}
