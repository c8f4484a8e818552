//! The platform's identities that a caller must not mix up: a [`SubscriptionId`] cannot be
//! passed where a [`DeliveryId`] is meant. Both are opaque text the platform issues (a
//! subscription's is 32 characters); they read as `&str` and print as themselves, because
//! neither is a secret.

use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

macro_rules! platform_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id `text` names.
            pub fn new(text: impl Into<String>) -> $name {
                $name(text.into())
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

        impl Deref for $name {
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

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> $name {
                $name(text)
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> $name {
                $name(text.to_owned())
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
    };
}

platform_id!(
    /// A subscription's id.
    SubscriptionId
);
platform_id!(
    /// A delivery's id: one event for one subscription, over all its attempts.
    DeliveryId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_its_text_on_the_wire_and_in_print() {
        let id = DeliveryId::new("d-1");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"d-1\"");
        assert_eq!(serde_json::from_str::<DeliveryId>("\"d-1\"").unwrap(), id);
        assert_eq!(format!("{id} {id:?}"), "d-1 \"d-1\"");
        assert_eq!(id, "d-1");
    }
}
