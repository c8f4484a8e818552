//! A private certificate authority made for one run: its certificate, server certificates it
//! signs for the names a test asks for, one client certificate, and a second, unrelated CA for
//! tests that must see a server refused.
//!
//! Every file is written into a directory the caller owns (a server's directory, or the run's
//! scratch directory), so it goes when that directory goes. Keys are ECDSA P-256, which both
//! MariaDB's OpenSSL and rustls accept.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::error::Error;

/// A certificate and its private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA of this run, and the files it has written so far.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate: what a client names to trust this run's servers (`ssl-ca`,
    /// `ORBIT_CA_FILE`).
    pub ca: PathBuf,
    /// A CA that signed nothing here: trusting it alone must fail every handshake.
    pub other_ca: PathBuf,
    /// A client certificate signed by the CA (for accounts that `REQUIRE X509`).
    pub client: CertFiles,
}

fn rcgen_error(what: &str) -> impl FnOnce(rcgen::Error) -> Error + '_ {
    move |e| Error::Config(format!("cannot make {what}: {e}"))
}

fn ca_params(name: &str) -> Result<CertificateParams, Error> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error(name))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

impl Pki {
    /// A fresh CA, the other CA and a client certificate, written into `dir` (created if
    /// missing).
    pub fn generate(dir: &Path) -> Result<Pki, Error> {
        fs::create_dir_all(dir).map_err(Error::io(format!("cannot create {}", dir.display())))?;
        let key = KeyPair::generate().map_err(rcgen_error("the CA's key"))?;
        let params = ca_params("result-inbox test CA")?;
        let ca_cert = params
            .self_signed(&key)
            .map_err(rcgen_error("the CA certificate"))?;
        let ca = dir.join("ca.pem");
        write(&ca, &ca_cert.pem())?;
        let issuer = Issuer::new(params, key);

        let other_key = KeyPair::generate().map_err(rcgen_error("the other CA's key"))?;
        let other_cert = ca_params("result-inbox unrelated CA")?
            .self_signed(&other_key)
            .map_err(rcgen_error("the other CA certificate"))?;
        let other_ca = dir.join("other-ca.pem");
        write(&other_ca, &other_cert.pem())?;

        let mut pki = Pki {
            dir: dir.to_path_buf(),
            issuer,
            ca,
            other_ca,
            client: CertFiles {
                cert: PathBuf::new(),
                key: PathBuf::new(),
            },
        };
        pki.client = pki.sign("client", &[], ExtendedKeyUsagePurpose::ClientAuth)?;
        Ok(pki)
    }

    /// A server certificate for `names` (host names or IP addresses), signed by the CA and
    /// written as `<file>-cert.pem` and `<file>-key.pem`.
    pub fn server(&self, file: &str, names: &[&str]) -> Result<CertFiles, Error> {
        self.sign(file, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn sign(
        &self,
        file: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<CertFiles, Error> {
        let what = format!("the {file} certificate");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).map_err(rcgen_error(&what))?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("result-inbox test {file}"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().map_err(rcgen_error(&what))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rcgen_error(&what))?;
        let files = CertFiles {
            cert: self.dir.join(format!("{file}-cert.pem")),
            key: self.dir.join(format!("{file}-key.pem")),
        };
        write(&files.cert, &cert.pem())?;
        write(&files.key, &key.serialize_pem())?;
        Ok(files)
    }
}

fn write(path: &Path, pem: &str) -> Result<(), Error> {
    fs::write(path, pem).map_err(Error::io(format!("cannot write {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_signs_servers_and_a_client_into_its_directory() {
        let dir = crate::cleanup::scratch_dir().unwrap().join("pki-unit");
        let pki = Pki::generate(&dir).unwrap();
        let server = pki.server("db", &["localhost", "127.0.0.1"]).unwrap();
        for path in [
            &pki.ca,
            &pki.other_ca,
            &pki.client.cert,
            &pki.client.key,
            &server.cert,
            &server.key,
        ] {
            let text = fs::read_to_string(path).unwrap();
            assert!(text.starts_with("-----BEGIN "), "{}", path.display());
            assert!(path.starts_with(&dir));
        }
        assert_ne!(fs::read(&pki.ca).unwrap(), fs::read(&pki.other_ca).unwrap());
        let _ = fs::remove_dir_all(&dir);
    }
}
