//! Identities that must not be mixed up: the consumer name, the queue, the event and the task.
//!
//! Each is validated once, in its constructor; holding one is proof of its shape. All of them
//! compare byte for byte, as their columns do (`VARBINARY`), so `evt-A` and `evt-a` are two
//! different events.

use std::fmt;

pub use platform_id::{IdentityError, MAX_ID_BYTES};

/// The longest consumer name (`VARBINARY(64)`).
pub const MAX_CONSUMER_NAME: usize = 64;

/// The consumer name used when `RECEIVER_NAME` is not set.
pub const DEFAULT_CONSUMER_NAME: &str = "task-result-view";

platform_id::platform_id!(
    /// An Orbit queue id, e.g. `inbox-demo`.
    QueueId
);
platform_id::platform_id!(
    /// An Orbit event id, unique per delivered event.
    EventId
);
platform_id::platform_id!(
    /// An Orbit task id.
    TaskId
);

/// The fixed purpose of a receiver (`RECEIVER_NAME`): at most 64 ASCII characters, first a
/// letter or digit, then letters, digits, `.`, `_` or `-`. Every instance, restart and
/// scale-out of one purpose uses the same name; a new name is a new, empty view.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ConsumerName(String);

impl ConsumerName {
    /// Validates `s` against the `RECEIVER_NAME` rules.
    pub fn new(s: impl Into<String>) -> Result<Self, IdentityError> {
        let s = s.into();
        if s.is_empty() {
            return Err(IdentityError::Empty);
        }
        if s.len() > MAX_CONSUMER_NAME {
            return Err(IdentityError::TooLong(s.len(), MAX_CONSUMER_NAME));
        }
        let mut bytes = s.bytes();
        let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
        let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !(first_ok && rest_ok) {
            return Err(IdentityError::Charset);
        }
        Ok(ConsumerName(s))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for ConsumerName {
    fn default() -> Self {
        ConsumerName(DEFAULT_CONSUMER_NAME.to_owned())
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConsumerName({:?})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_names() {
        for good in ["task-result-view", "a", "0.b_c-d", &"x".repeat(64)] {
            assert!(ConsumerName::new(good).is_ok(), "{good}");
        }
        assert_eq!(ConsumerName::new(""), Err(IdentityError::Empty));
        assert_eq!(
            ConsumerName::new("x".repeat(65)),
            Err(IdentityError::TooLong(65, 64))
        );
        for bad in ["-a", ".a", "_a", "a b", "a/b", "é", "a\n"] {
            assert_eq!(ConsumerName::new(bad), Err(IdentityError::Charset), "{bad}");
        }
        assert_eq!(ConsumerName::default().as_str(), "task-result-view");
    }
}
