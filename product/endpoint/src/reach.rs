//! Why a connection could not be made, in plain words. The database driver and the HTTP client
//! each wrap the operating system's error in chains of their own ("error sending request:
//! client error (Connect): tcp connect error: Connection refused (os error 111)");
//! [`Unreachable::find`] digs out what happened, so that the receiver's database and the
//! SDK's platform report it the same way, in one clause, with no library's words.

use std::error::Error;
use std::io::ErrorKind;

/// What stopped a connection from being made, or broke it before the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unreachable {
    /// Nothing listens on the port (the host answered with a reset).
    Refused,
    /// No answer in time: a stopped host, a firewall that drops, or a wrong address.
    TimedOut,
    /// The host name does not resolve.
    HostUnknown,
    /// No route to the host or its network.
    NoRoute,
    /// The peer closed or reset the connection before it answered.
    Closed,
}

impl Unreachable {
    /// What stopped `e` or any error it wraps, if it was the connection itself.
    pub fn find(e: &(dyn Error + 'static)) -> Option<Unreachable> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if let Some(u) = Self::of_kind(io.kind()) {
                    return Some(u);
                }
                // An io::Error's `source()` skips the error it wraps: look at that one too.
                if let Some(u) = io.get_ref().and_then(|inner| Self::find(inner)) {
                    return Some(u);
                }
            }
            // Name resolution failures arrive as text inside the clients' own errors.
            let text = e.to_string();
            if text.contains("failed to lookup address")
                || text.contains("Name or service not known")
                || text.contains("dns error")
            {
                return Some(Unreachable::HostUnknown);
            }
            next = e.source();
        }
        None
    }

    /// The kind an operating system error of `kind` is, if it is one of these.
    pub fn of_kind(kind: ErrorKind) -> Option<Unreachable> {
        match kind {
            ErrorKind::ConnectionRefused => Some(Unreachable::Refused),
            ErrorKind::TimedOut | ErrorKind::WouldBlock => Some(Unreachable::TimedOut),
            ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => {
                Some(Unreachable::NoRoute)
            }
            ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
            | ErrorKind::NotConnected => Some(Unreachable::Closed),
            _ => None,
        }
    }

    /// One clause, without what to check (each caller names its own setting).
    pub fn describe(self) -> &'static str {
        match self {
            Unreachable::Refused => "connection refused: nothing listens on that port",
            Unreachable::TimedOut => {
                "timed out: no answer (a stopped host, a firewall, or a wrong address)"
            }
            Unreachable::HostUnknown => "the host name does not resolve",
            Unreachable::NoRoute => "no route to the host",
            Unreachable::Closed => "the connection was closed before the server answered",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(std::io::Error);
    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("client error (Connect)")
        }
    }
    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_cause_is_found_through_chains_and_io_errors_that_wrap_others() {
        let refused = std::io::Error::new(ErrorKind::ConnectionRefused, "os error 111");
        assert_eq!(
            Unreachable::find(&Wrapper(refused)),
            Some(Unreachable::Refused)
        );
        let inner = std::io::Error::new(ErrorKind::TimedOut, "t");
        let outer = std::io::Error::other(inner);
        assert_eq!(Unreachable::find(&outer), Some(Unreachable::TimedOut));
        let dns = std::io::Error::other(
            "failed to lookup address information: Name or service not known",
        );
        assert_eq!(Unreachable::find(&dns), Some(Unreachable::HostUnknown));
        let other = std::io::Error::new(ErrorKind::PermissionDenied, "p");
        assert_eq!(Unreachable::find(&other), None);
    }
}
