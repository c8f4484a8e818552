//! Network addresses as the programs of this workspace read them, once: the authority of a URL
//! (`[user[:password]@]host[:port]`), whether a host is loopback, and the percent-encoding of
//! one URL component. The receiver's DSN (`result-inbox`), the SDK's platform address and
//! testdb's server address all read their authority here.
//!
//! [`tls::TlsProblem`] says why a TLS handshake failed, and [`reach::Unreachable`] why a
//! connection could not be made, in the same words for both.
//!
//! What this crate must never do: connect anywhere, resolve a name, or keep a password it was
//! given (an [`Authority`] borrows the caller's text, which the caller keeps secret).

pub mod reach;
pub mod tls;

/// Why an authority cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorityError {
    /// Nothing where the host belongs.
    NoHost,
    /// A port that is not a number from 1 to 65535.
    BadPort,
}

/// The authority of a URL: who, where, and on which port. Borrows the URL's text.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Authority<'a> {
    userinfo: Option<&'a str>,
    /// `host[:port]` as written.
    hostport: &'a str,
    host: &'a str,
    port: Option<u16>,
}

/// Leaves the password out.
impl std::fmt::Debug for Authority<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("user", &self.user())
            .field("host", &self.host)
            .field("port", &self.port)
            .finish()
    }
}

/// `after_scheme` (a URL with its `scheme://` taken off) split into its authority and what
/// follows it: the path, query or fragment, from the first `/`, `?` or `#`.
pub fn split_authority(after_scheme: &str) -> (&str, &str) {
    after_scheme.split_at(
        after_scheme
            .find(['/', '?', '#'])
            .unwrap_or(after_scheme.len()),
    )
}

impl<'a> Authority<'a> {
    /// Reads `authority`: the user information ends at its last `@`; an IPv6 host is written in
    /// brackets (`[::1]:3306`).
    pub fn parse(authority: &'a str) -> Result<Authority<'a>, AuthorityError> {
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, authority),
        };
        let (host, port) = if hostport.starts_with('[') {
            match hostport.split_once(']') {
                Some((v6, after)) => (&hostport[..v6.len() + 1], after.strip_prefix(':')),
                None => (hostport, None),
            }
        } else {
            match hostport.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(AuthorityError::NoHost);
        }
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(p) if p > 0 => Some(p),
                _ => return Err(AuthorityError::BadPort),
            },
        };
        Ok(Authority {
            userinfo,
            hostport,
            host,
            port,
        })
    }

    /// The host as written (an IPv6 address keeps its brackets), without the port.
    pub fn host(&self) -> &'a str {
        self.host
    }

    /// `host[:port]` as written, without the user information.
    pub fn host_and_port(&self) -> &'a str {
        self.hostport
    }

    /// The port, when one is written.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether the authority names a user (`…@`).
    pub fn has_userinfo(&self) -> bool {
        self.userinfo.is_some()
    }

    /// The user, as written (still percent-encoded).
    pub fn user(&self) -> Option<&'a str> {
        self.userinfo
            .map(|u| u.split_once(':').map_or(u, |(user, _)| user))
    }

    /// The password, as written (still percent-encoded).
    pub fn password(&self) -> Option<&'a str> {
        self.userinfo
            .and_then(|u| u.split_once(':'))
            .map(|(_, password)| password)
    }

    /// Whether the host is this machine: `localhost` or a loopback address.
    pub fn is_loopback(&self) -> bool {
        is_loopback(self.host)
    }
}

/// Whether `host` (an IPv6 address with or without brackets) is `localhost` or a loopback
/// address. Names other than `localhost` are not resolved: they count as remote.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Everything but RFC 3986's unreserved characters (`A-Z a-z 0-9 - _ . ~`) is encoded.
const COMPONENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `text` percent-encoded for one URL component: a path segment, a query value, a user name or
/// a password.
pub fn encode_component(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, COMPONENT).to_string()
}

/// Decodes one percent-encoded URL component (`%2F` to `/`); `None` when the result is not
/// UTF-8.
pub fn decode_component(text: &str) -> Option<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authority_is_read_into_user_host_and_port() {
        let a = Authority::parse("us%40er:p@ss:word@db.example:3307").unwrap();
        assert_eq!(
            (a.user(), a.password(), a.host(), a.port()),
            (Some("us%40er"), Some("p@ss:word"), "db.example", Some(3307))
        );
        assert!(!a.is_loopback());
        assert_eq!(a.host_and_port(), "db.example:3307");
        let v6 = Authority::parse("[::1]:3306").unwrap();
        assert_eq!(
            (v6.host(), v6.port(), v6.user()),
            ("[::1]", Some(3306), None)
        );
        assert!(v6.is_loopback());
        assert!(Authority::parse("localhost").unwrap().is_loopback());
        assert!(Authority::parse("127.0.0.2:1").unwrap().is_loopback());
        assert!(!Authority::parse("local.host").unwrap().is_loopback());
    }

    #[test]
    fn a_missing_host_or_a_bad_port_is_refused() {
        assert_eq!(Authority::parse("").unwrap_err(), AuthorityError::NoHost);
        assert_eq!(
            Authority::parse("u:p@").unwrap_err(),
            AuthorityError::NoHost
        );
        assert_eq!(
            Authority::parse(":3306").unwrap_err(),
            AuthorityError::NoHost
        );
        for bad in ["h:0", "h:65536", "h:x", "h:", "[::1]:99999"] {
            assert_eq!(
                Authority::parse(bad).unwrap_err(),
                AuthorityError::BadPort,
                "{bad}"
            );
        }
    }

    #[test]
    fn the_authority_ends_at_the_path_query_or_fragment() {
        assert_eq!(split_authority("h:1/db?x=1"), ("h:1", "/db?x=1"));
        assert_eq!(split_authority("h?x"), ("h", "?x"));
        assert_eq!(split_authority("h"), ("h", ""));
    }

    #[test]
    fn a_component_keeps_only_unreserved_characters() {
        assert_eq!(encode_component("a-b_c.d~e"), "a-b_c.d~e");
        assert_eq!(encode_component("p@ss/w:rd é"), "p%40ss%2Fw%3Ard%20%C3%A9");
    }

    #[test]
    fn debug_leaves_the_password_out() {
        let a = Authority::parse("user:s3cret@h").unwrap();
        assert!(!format!("{a:?}").contains("s3cret"));
    }
}
