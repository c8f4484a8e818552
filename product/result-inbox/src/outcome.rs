//! What an apply did: the success every caller matches on, held apart from the store that
//! produces it and the errors that carry it (an unreplicated commit still names its outcome).

/// What an apply did. Every variant is a success: the event is safely recorded and may be
/// ACKed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// First receipt, and it advanced the view.
    Applied,
    /// First receipt of an older version: recorded with `applied = false`, view untouched.
    Stale,
    /// Already recorded with the same content. `applied` is what the ORIGINAL transaction did;
    /// nothing ran again.
    Duplicate { applied: bool },
}

impl Outcome {
    /// The stable lowercase name: `applied`, `stale` or `duplicate`.
    pub fn kind(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Stale => "stale",
            Outcome::Duplicate { .. } => "duplicate",
        }
    }
}
