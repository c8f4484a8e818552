//! One wrapper for every secret in the workspace: bearer tokens, lease proofs, database
//! passwords and the URLs that carry them.
//!
//! A [`Secret`] prints as `***` through both `Debug` and `Display`, so a struct that holds
//! one can derive `Debug` and a log line or error that formats one shows nothing. The text
//! comes out only through [`Secret::expose`], which a reader can grep for: each call site is
//! where the secret leaves for the wire (an Authorization header, an ACK, a driver's
//! connection options).
//!
//! It has no dependencies beyond optional serde, so every crate can use it, the inbox core
//! included. It does not zero its memory on drop: the threat it answers is output (logs,
//! errors, panics), not a memory dump.
//!
//! What this crate must never do: print a secret's text through a formatting trait, or gain a
//! dependency that the crates below the receiver could not take.

use std::fmt;

/// A secret string. Formats as `***`; [`Secret::expose`] gives the text.
#[derive(Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Secret(String);

/// What a secret prints as, whatever it holds.
pub const MASK: &str = "***";

impl Secret {
    /// Wraps `text`.
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret text, for the one place it must go (a header, a frame, a driver).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is empty (an empty password, say); says nothing else about it.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Secret {
        Secret(text)
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Secret {
        Secret(text.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    #[allow(dead_code)] // read through Debug only
    struct Holder {
        user: &'static str,
        password: Secret,
    }

    #[test]
    fn no_formatting_shows_the_text() {
        let s = Secret::new("s3cret-value");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(format!("{s:#?}"), "***");
        let h = Holder {
            user: "u",
            password: s.clone(),
        };
        let shown = format!("{h:?} {h:#?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("password: ***"), "{shown}");
        assert_eq!(s.expose(), "s3cret-value");
    }
}
