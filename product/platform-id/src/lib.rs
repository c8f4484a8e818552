//! The platform's identities as types that cannot be mixed up: a queue id is not an event id, a
//! subscription id is not a delivery id. One macro, [`platform_id!`], makes each of them, so every
//! platform id is held to the same rule: 1 to 128 bytes of UTF-8 with no control character,
//! compared byte for byte (`evt-A` and `evt-a` are two ids), as the inbox's `VARBINARY(128)`
//! columns compare them.
//!
//! An id is validated where it is made ([`new`](SubscriptionId) returns a `Result`) and where it
//! is read from outside: deserializing refuses what `new` refuses. Holding one is proof of its
//! shape. None is a secret, so each prints as its text.
//!
//! The inbox core makes the queue, event and task ids; the wire contract the subscription and
//! delivery ids. This crate knows neither, only the rule.

/// The longest platform id (`VARBINARY(128)` in the inbox's schema).
pub const MAX_ID_BYTES: usize = 128;

/// Why a string is not a valid identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("is empty")]
    Empty,
    #[error("is {0} bytes long, over the limit of {1}")]
    TooLong(usize, usize),
    #[error("contains a control character")]
    Control,
    #[error("must be ASCII letters, digits, '.', '_' or '-', starting with a letter or digit")]
    Charset,
}

/// Checks `s` against the platform id rule with `max` bytes.
pub fn check_id(s: &str, max: usize) -> Result<(), IdentityError> {
    if s.is_empty() {
        return Err(IdentityError::Empty);
    }
    if s.len() > max {
        return Err(IdentityError::TooLong(s.len(), max));
    }
    if s.chars().any(char::is_control) {
        return Err(IdentityError::Control);
    }
    Ok(())
}

#[doc(hidden)]
pub use serde as __serde;

/// Makes a platform id type: a validated `String` that reads as `&str`, prints as its text,
/// compares with text, and (de)serializes as a JSON string, refusing an invalid one.
#[macro_export]
macro_rules! platform_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Validates `text`: 1 to 128 bytes of UTF-8 with no control characters.
            pub fn new(text: impl Into<String>) -> Result<$name, $crate::IdentityError> {
                let text = text.into();
                $crate::check_id(&text, $crate::MAX_ID_BYTES)?;
                Ok($name(text))
            }

            /// The id's text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id's text, owned.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl ::std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = $crate::IdentityError;
            fn try_from(text: String) -> Result<$name, $crate::IdentityError> {
                $name::new(text)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = $crate::IdentityError;
            fn try_from(text: &str) -> Result<$name, $crate::IdentityError> {
                $name::new(text)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl $crate::__serde::Serialize for $name {
            fn serialize<S: $crate::__serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> $crate::__serde::Deserialize<'de> for $name {
            fn deserialize<D: $crate::__serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                let text = <String as $crate::__serde::Deserialize>::deserialize(d)?;
                $name::new(text).map_err(|e| {
                    <D::Error as $crate::__serde::de::Error>::custom(format_args!(
                        "{} {e}",
                        stringify!($name)
                    ))
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    platform_id!(
        /// An id for the tests.
        SampleId
    );

    #[test]
    fn an_id_holds_the_rule_when_made_and_when_read() {
        assert!(SampleId::new("evt-é").is_ok());
        assert!(SampleId::new("x".repeat(128)).is_ok());
        assert_eq!(
            SampleId::new("x".repeat(129)),
            Err(IdentityError::TooLong(129, 128))
        );
        assert_eq!(SampleId::new(""), Err(IdentityError::Empty));
        assert_eq!(SampleId::new("a\u{0}b"), Err(IdentityError::Control));
        assert_ne!(
            SampleId::new("id-A").unwrap(),
            SampleId::new("id-a").unwrap()
        );

        let id = SampleId::new("d-1").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"d-1\"");
        assert_eq!(serde_json::from_str::<SampleId>("\"d-1\"").unwrap(), id);
        assert_eq!(format!("{id} {id:?}"), "d-1 SampleId(\"d-1\")");
        assert_eq!(id, "d-1");
        assert_eq!(id.as_str(), id.clone().into_string());
        let refused = serde_json::from_str::<SampleId>("\"\"").unwrap_err();
        assert!(
            refused.to_string().starts_with("SampleId is empty"),
            "{refused}"
        );
        assert!(serde_json::from_str::<SampleId>("\"a\\u0000\"").is_err());
    }
}
