//! Certificates for the TLS tests (`tls_listener`, `tls_upstream`, `tls_config`): made with
//! rcgen, written in a directory of their own per test.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::RootCertStore;

use crate::support::files::TempDir;

// --- Certificates ----------------------------------------------------------------------------

/// A directory of PEM files for one test, removed when dropped.
pub struct Dir(pub TempDir);

impl Dir {
    pub fn new() -> Dir {
        Dir(TempDir::new("tls"))
    }

    /// Writes `name` at once (a rename, as Kubernetes and certbot swap files) and returns its
    /// path as the configuration wants it.
    pub fn write(&self, name: &str, contents: &str) -> String {
        let path = self.0.path().join(name);
        let tmp = self.0.path().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, contents).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path.to_str().unwrap().to_string()
    }
}

/// A certificate authority.
pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    cert: rcgen::Certificate,
}

/// A certificate with its key.
pub struct Leaf {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { params, key, cert }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        roots
    }

    fn issue(&self, purpose: ExtendedKeyUsagePurpose, not_after: (i32, u8, u8)) -> Leaf {
        self.issue_for(&["localhost", "127.0.0.1"], purpose, not_after)
    }

    pub fn issue_for(
        &self,
        names: &[&str],
        purpose: ExtendedKeyUsagePurpose,
        not_after: (i32, u8, u8),
    ) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        params.extended_key_usages = vec![purpose];
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = KeyPair::generate().unwrap();
        let cert = params
            .signed_by(&key, &Issuer::from_params(&self.params, &self.key))
            .unwrap();
        Leaf { cert, key }
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn server(&self) -> Leaf {
        self.server_until((2040, 1, 1))
    }

    pub fn server_until(&self, not_after: (i32, u8, u8)) -> Leaf {
        self.issue(ExtendedKeyUsagePurpose::ServerAuth, not_after)
    }

    /// A client certificate.
    pub fn client(&self) -> Leaf {
        self.issue(ExtendedKeyUsagePurpose::ClientAuth, (2040, 1, 1))
    }
}

impl Leaf {
    pub fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()))
    }

    /// Writes `NAME.crt` and `NAME.key`; returns their paths.
    pub fn write(&self, dir: &Dir, name: &str) -> (String, String) {
        (
            dir.write(&format!("{name}.crt"), &self.cert.pem()),
            dir.write(&format!("{name}.key"), &self.key.serialize_pem()),
        )
    }
}

/// holdfast's listener certificate files, from `ca`.
pub fn listener_files(dir: &Dir, ca: &Ca) -> (String, String) {
    ca.server().write(dir, "listener")
}

pub fn ca_file(dir: &Dir, ca: &Ca) -> String {
    dir.write("ca.crt", &ca.pem())
}

pub fn series(name: &str, reason: &str) -> String {
    format!("{name}{{reason=\"{reason}\"}}")
}
