//! Why a TLS handshake failed, in words a user can act on. The database driver and the HTTP
//! and WebSocket clients each wrap rustls's error in their own; [`TlsProblem::find`] digs it
//! out of any of them, so that the receiver's DSN and the SDK's platform address report the
//! same problem the same way.

use std::error::Error;

use rustls::{AlertDescription, CertificateError};

/// What was wrong with a TLS connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TlsProblem {
    /// The server's certificate is not signed by a CA the client trusts.
    UntrustedCertificate,
    /// The server's certificate does not name the host the client connected to.
    NameMismatch,
    /// The server's certificate has expired or is not valid yet.
    Expired,
    /// The server refused the client's certificate, or wanted one and got none.
    ClientCertificateRefused,
    /// The server does not offer TLS at all.
    NoTls,
    /// The server accepts only TLS connections, and this one was plain.
    Required,
    /// The handshake failed otherwise.
    Handshake,
}

impl TlsProblem {
    /// The problem behind `e` or any error it wraps, if it is a TLS one.
    pub fn find(e: &(dyn Error + 'static)) -> Option<TlsProblem> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(r) = e.downcast_ref::<rustls::Error>() {
                return Some(Self::of(r));
            }
            // An io::Error's `source()` skips the error it wraps: look at that one too.
            if let Some(inner) = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                if let Some(p) = Self::find(inner) {
                    return Some(p);
                }
            }
            next = e.source();
        }
        None
    }

    /// The problem a rustls error describes.
    pub fn of(e: &rustls::Error) -> TlsProblem {
        use CertificateError as C;
        match e {
            rustls::Error::InvalidCertificate(c) => match c {
                C::UnknownIssuer | C::BadSignature => TlsProblem::UntrustedCertificate,
                C::NotValidForName | C::NotValidForNameContext { .. } => TlsProblem::NameMismatch,
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. } => TlsProblem::Expired,
                _ => TlsProblem::Handshake,
            },
            rustls::Error::AlertReceived(
                AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateUnknown
                | AlertDescription::CertificateRequired
                | AlertDescription::AccessDenied,
            ) => TlsProblem::ClientCertificateRefused,
            _ => TlsProblem::Handshake,
        }
    }

    /// One clause, without what the user should check (each caller names its own setting).
    pub fn describe(self) -> &'static str {
        match self {
            TlsProblem::UntrustedCertificate => {
                "the server's certificate is not signed by a CA this client trusts"
            }
            TlsProblem::NameMismatch => {
                "the server's certificate does not name the host connected to"
            }
            TlsProblem::Expired => "the server's certificate has expired or is not valid yet",
            TlsProblem::ClientCertificateRefused => {
                "the server refused the client certificate (or wanted one and got none)"
            }
            TlsProblem::NoTls => "the server does not offer TLS",
            TlsProblem::Required => "the server accepts only TLS connections",
            TlsProblem::Handshake => "the TLS handshake failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rustls_error_is_found_inside_io_errors_and_chains() {
        let untrusted = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, untrusted);
        assert_eq!(
            TlsProblem::find(&io),
            Some(TlsProblem::UntrustedCertificate)
        );
        let name = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        assert_eq!(TlsProblem::find(&name), Some(TlsProblem::NameMismatch));
        let refused = rustls::Error::AlertReceived(AlertDescription::CertificateRequired);
        assert_eq!(
            TlsProblem::find(&std::io::Error::other(refused)),
            Some(TlsProblem::ClientCertificateRefused)
        );
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(TlsProblem::find(&plain), None);
    }
}
