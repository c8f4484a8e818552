//! Which certificate authorities the SDK trusts for `https`/`wss`: the machine's own roots
//! (the system's trust store, as `rustls-native-certs` finds it) plus, when the user names one,
//! a PEM bundle of their own (`ORBIT_CA_FILE`, for a platform behind a private CA). Nothing is
//! compiled in: a machine that trusts nothing and names no file can reach no `https` platform,
//! and says so.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// Why the trust could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TrustError {
    /// The CA file cannot be read, or holds no usable certificate.
    #[error("{}: {problem}", path.display())]
    CaFile { path: PathBuf, problem: String },
    /// Neither the system nor a CA file gave a single root.
    #[error("no trusted certificate authority: the system's trust store is empty or missing and no CA file was named")]
    NoRoots,
}

/// The TLS client configuration every `https` request and `wss` stream of one [`Client`]
/// uses.
///
/// [`Client`]: crate::Client
#[derive(Debug, Clone)]
pub struct Trust {
    config: Arc<rustls::ClientConfig>,
    /// How many roots came from the system, and how many from the file.
    system_roots: usize,
    file_roots: usize,
}

impl Trust {
    /// The system's roots, plus every certificate in `ca_file` (a PEM bundle) when given.
    pub fn load(ca_file: Option<&Path>) -> Result<Trust, TrustError> {
        let mut roots = RootCertStore::empty();
        // Unreadable entries of the system store are skipped, as every TLS client does; only
        // an empty result matters, and it is reported below.
        let native = rustls_native_certs::load_native_certs();
        let (system_roots, _) = roots.add_parsable_certificates(native.certs);
        let mut file_roots = 0;
        if let Some(path) = ca_file {
            let problem = |problem: String| TrustError::CaFile {
                path: path.to_path_buf(),
                problem,
            };
            let certs = std::fs::read(path)
                .map_err(|e| problem(e.to_string()))
                .and_then(|pem| {
                    CertificateDer::pem_slice_iter(&pem)
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| problem(format!("not a PEM certificate bundle: {e}")))
                })?;
            if certs.is_empty() {
                return Err(problem("holds no PEM certificate".into()));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| problem(format!("holds a certificate rustls refuses: {e}")))?;
                file_roots += 1;
            }
        }
        if roots.is_empty() {
            return Err(TrustError::NoRoots);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|_| TrustError::NoRoots)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Trust {
            config: Arc::new(config),
            system_roots,
            file_roots,
        })
    }

    /// The rustls configuration: the HTTP client's and the stream's, and for any other client
    /// of the same platform (a test's own requests, say).
    pub fn config(&self) -> Arc<rustls::ClientConfig> {
        self.config.clone()
    }

    /// (roots from the system, roots from the CA file).
    pub fn roots(&self) -> (usize, usize) {
        (self.system_roots, self.file_roots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_must_hold_certificates() {
        let dir = std::env::temp_dir().join(format!("sdk-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        assert!(matches!(
            Trust::load(Some(&empty)),
            Err(TrustError::CaFile { ref problem, .. }) if problem == "holds no PEM certificate"
        ));
        let missing = dir.join("missing.pem");
        let e = Trust::load(Some(&missing)).unwrap_err();
        assert!(
            e.to_string().starts_with(&missing.display().to_string()),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
